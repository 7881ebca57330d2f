"""auth.credentials without a broker: limits, expiry, ownership and what is stored."""

from __future__ import annotations

import pytest

from minou.auth import credentials as creds
from minou.auth.credentials import Credentials, decode_credential, encode_credential
from minou.auth.registry import ACTIVE, ClientRecord
from minou.errors import BadRequest, NotAuthenticated, NotFound


def owner(client_id: str = "job", fingerprint: str = "SHA256:AA") -> ClientRecord:
    return ClientRecord(client_id=client_id, public_key="", fingerprint=fingerprint,
                        algorithm="EdDSA", status=ACTIVE, created_at=0.0, updated_at=0.0)


def test_the_secret_is_never_stored_and_records_round_trip() -> None:
    store = Credentials()
    secret, record = store.issue(owner(), ttl=60, purpose="p", now=1000.0)
    blob = encode_credential(record)
    assert secret.split(".")[2].encode() not in blob
    again = Credentials([decode_credential(blob)])
    assert again.verify(secret, {"job": owner()}, now=1001.0).id == record.id
    assert store.take_changes() == {record.id: record}


def test_a_client_holds_a_bounded_number_and_expired_ones_make_room(monkeypatch) -> None:
    monkeypatch.setattr(creds, "MAX_CREDENTIALS_PER_CLIENT", 3)
    store = Credentials()
    for _ in range(3):
        store.issue(owner(), ttl=10, now=0.0)
    with pytest.raises(BadRequest, match="holds 3 unexpired credentials") as refused:
        store.issue(owner(), ttl=10, now=1.0)
    assert refused.value.detail["why"] == "too_many_credentials"
    store.issue(owner("other"), ttl=10, now=1.0)  # another client is not held back
    store.issue(owner(), ttl=10, now=10.0)  # the first three expired at 10
    assert len(store) == 2


def test_the_whole_broker_is_bounded_too(monkeypatch) -> None:
    monkeypatch.setattr(creds, "MAX_CREDENTIALS", 2)
    store = Credentials()
    store.issue(owner("a"), ttl=10, now=0.0)
    store.issue(owner("b"), ttl=10, now=0.0)
    with pytest.raises(BadRequest, match="the broker holds 2"):
        store.issue(owner("c"), ttl=10, now=0.0)


@pytest.mark.parametrize("ttl", [0, 0.5, -1, float("nan"), float("inf"), 8 * 86400, True, "60"])
def test_ttl_out_of_range_is_refused(ttl: object) -> None:
    with pytest.raises(BadRequest, match="ttl must be"):
        Credentials().issue(owner(), ttl=ttl, now=0.0)  # type: ignore[arg-type]


def test_verification_names_what_failed() -> None:
    store = Credentials()
    secret, record = store.issue(owner(), ttl=10, now=0.0)
    owners = {"job": owner()}
    with pytest.raises(NotAuthenticated, match="expired") as expired:
        store.verify(secret, owners, now=10.0)
    assert expired.value.detail["why"] == "credential_expired"
    with pytest.raises(NotAuthenticated, match="rotated"):
        store.verify(secret, {"job": owner(fingerprint="SHA256:BB")}, now=1.0)
    with pytest.raises(NotAuthenticated, match="revoked"):
        store.verify(secret, {}, now=1.0)
    gone = owner()
    gone.status = "pending"
    with pytest.raises(NotAuthenticated, match="pending"):
        store.verify(secret, {"job": gone}, now=1.0)
    assert store.renew(record.id, client_id="job", ttl=100, now=5.0).expires_at == 105.0
    assert store.renew(record.id, client_id="job", ttl=1, now=6.0).expires_at == 105.0
    with pytest.raises(NotFound, match="no credential"):
        store.renew(record.id, client_id="other", ttl=100, now=5.0)
    assert store.revoke_client("job") == [record.id]
    assert store.take_changes()[record.id] is None


def test_an_expired_credential_is_named_expired_for_an_hour_then_forgotten() -> None:
    store = Credentials()
    secret, _ = store.issue(owner(), ttl=10, now=0.0)
    store.expire(100.0)
    with pytest.raises(NotAuthenticated, match="expired 90 s ago"):
        store.verify(secret, {"job": owner()}, now=100.0)
    assert store.listing(now=100.0) == [] and store.live(100.0) == 0
    store.expire(10.0 + creds.EXPIRED_KEPT_S)
    with pytest.raises(NotAuthenticated, match="unknown"):
        store.verify(secret, {"job": owner()}, now=10.0 + creds.EXPIRED_KEPT_S)


def test_lapsed_names_each_expired_credential_once_and_never_a_renewed_one() -> None:
    store = Credentials()
    _, short = store.issue(owner(), ttl=10, now=0.0)
    _, renewed = store.issue(owner(), ttl=10, now=0.0)
    _, dropped = store.issue(owner(), ttl=5, now=0.0)
    store.renew(renewed.id, client_id="job", ttl=100, now=5.0)
    store.expire(20.0, kept=0.0)  # forgotten before anyone asked: still its end
    assert store.lapsed(4.0) == set()
    assert store.lapsed(20.0) == {short.id, dropped.id}
    assert store.lapsed(30.0) == set()  # once
    assert store.lapsed(105.0) == {renewed.id}
    loaded = Credentials([decode_credential(encode_credential(short))])  # at a restart
    assert loaded.lapsed(11.0) == {short.id}


def test_refresh_names_the_credentials_gone_from_storage_once_sure() -> None:
    here = Credentials()
    _, mine = here.issue(owner(), ttl=60, now=0.0)
    here.take_changes()  # stored
    _, other = Credentials().issue(owner(), ttl=60, now=0.0)  # another broker's
    assert here.refresh([mine, other]) == set()
    assert here.refresh([other]) == set()  # missing once: maybe still being written
    assert here.refresh([other]) == {mine.id}  # twice: revoked there
    assert mine.id not in here.records and other.id in here.records
