"""The attack table (docs/security.md): every attack against a real broker process.

Each attack must be refused with a precise error, counted in the broker's
metrics, and leave every other client's data and connection intact: the
``bystander`` fixture holds a subscription and a stored message across all of
them and checks both afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.errors import (
    BadRequest,
    ErrorCode,
    InvalidPayload,
    NotAuthenticated,
    NotAuthorized,
    PendingApproval,
    SchemaMismatch,
)
from minou.protocol import frames as f

from ..conftest import RawPeer, client_key, signed_hello, wait_until

BROKER_ID = "sec-broker"
CONFIG = f"""
broker_id = "{BROKER_ID}"

[[rules]]
client = "billing-*"
read = ["orders/*", "!invoice/*"]
write = ["invoice/v1/*"]

[[rules]]
client = "shop-*"
read = ["calm/*"]
write = ["orders/v1/*", "calm/v1/*"]

[[rules]]
client = "stranger-*"
read = ["orders/*"]
accept = false

[channels."orders/v1".schema]
type = "object"
required = ["customer", "total"]
additionalProperties = false
[channels."orders/v1".schema.properties.customer]
type = "string"
[channels."orders/v1".schema.properties.total]
type = "number"
minimum = 0
"""


@pytest.fixture
def secure(broker_factory, tmp_path):
    cfg = tmp_path / "secure.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


def _kw(broker, client_id: str, **extra: Any) -> dict[str, Any]:
    return {"client_id": client_id, "key": str(client_key(client_id)), "reconnect": False,
            "request_timeout": 5, **extra}


def connect(broker, client_id: str, **extra: Any) -> minou.SyncClient:
    return minou.connect_sync(broker.url, **_kw(broker, client_id, **extra))


def admin(broker) -> minou.SyncClient:
    return minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False))


@pytest.fixture
def bystander(secure):
    """A well-behaved client with a stored message and a live subscription."""
    client = connect(secure, "shop-bystander", reconnect=True)  # survives a restart test
    client.send("calm/v1/1", {"n": 1})
    sub = client.consume("calm/v1/1", group="calm")
    yield client, sub
    msg = sub.get(timeout=5)
    assert msg.payload == {"n": 1}, "the bystander's message is gone"
    assert msg.ack()
    client.send("calm/v1/1", {"n": 2})
    assert sub.get(timeout=5).payload == {"n": 2}, "the bystander's subscription is broken"
    client.close()


def auth_failures(broker) -> dict[str, int]:
    with admin(broker) as a:
        return a.admin("status")["auth"]["failures"]


def refused(broker) -> dict[str, int]:
    with admin(broker) as a:
        return a.admin("status")["counters"]["refused"]


def hello_refused(broker, hello: f.Hello) -> f.Error:
    """Send one HELLO on a raw connection; return the fatal error it gets."""
    peer = RawPeer(broker.url)
    try:
        peer.write(f.encode(hello))
        frame = peer.read()
        assert isinstance(frame, f.Error), frame
        assert frame.fatal and frame.code in (ErrorCode.NOT_AUTHENTICATED,
                                              ErrorCode.PENDING_APPROVAL), frame
        assert peer.closed_by_peer()
        return frame
    finally:
        peer.close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(client_id: str, **over: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": client_id, "aud": BROKER_ID, "iat": now, "exp": now + 60,
            "jti": os.urandom(8).hex(), **over}


def _hello(client_id: str, token: str | None, **kw: Any) -> f.Hello:
    pem = keyfiles.public_pem(keyfiles.load_private(client_key(client_id))).decode()
    return f.Hello(client_id, 1, token, None, kw.pop("public_key", pem), **kw)


def _register(broker, client_id: str) -> None:
    with connect(broker, client_id):
        pass


# ----------------------------------------------------------------- identity
def test_no_token_gets_a_challenge_then_is_refused(secure, bystander):
    peer = RawPeer(secure.url)
    peer.write(f.encode(f.Hello("billing-1")))
    challenge = peer.read()
    assert isinstance(challenge, f.Error) and not challenge.fatal
    assert challenge.code == ErrorCode.NOT_AUTHENTICATED
    assert challenge.detail["broker_id"] == BROKER_ID  # the audience to sign for
    peer.write(f.encode(f.Hello("billing-1")))
    final = peer.read()
    assert final.fatal and "requires a token" in final.message
    assert peer.closed_by_peer()
    peer.close()
    # The client library says what is missing.
    with pytest.raises(NotAuthenticated, match="requires a key"):
        minou.connect_sync(secure.url, client_id="billing-1", reconnect=False)
    assert refused(secure)["not_authenticated"] >= 1


def test_frames_before_authentication_are_refused(secure, bystander):
    peer = RawPeer(secure.url)
    peer.write(f.encode(f.Hello("billing-1")))
    assert isinstance(peer.read(), f.Error)  # the challenge
    peer.write(f.encode(f.Publish(1, [f.Send("invoice/v1/1", b"{}")])))
    err = peer.read()
    assert err.fatal and "expected HELLO first" in err.message
    peer.close()


def test_garbage_token(secure, bystander):
    err = hello_refused(secure, _hello("billing-1", "not-a.jwt.at-all"))
    assert "not a JWT" in err.message or "refused" in err.message
    assert auth_failures(secure).get("token", 0) >= 1


def test_alg_none(secure, bystander):
    _register(secure, "billing-1")
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    token = f"{header}.{_b64(json.dumps(_claims('billing-1')).encode())}."
    err = hello_refused(secure, _hello("billing-1", token))
    assert "'none' is refused" in err.message


def test_hs256_signed_with_the_public_key_as_secret(secure, bystander):
    _register(secure, "billing-1")
    pem = keyfiles.public_pem(keyfiles.load_private(client_key("billing-1")))
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64(json.dumps(_claims("billing-1")).encode())
    sig = _b64(hmac.new(pem, f"{header}.{body}".encode(), hashlib.sha256).digest())
    err = hello_refused(secure, _hello("billing-1", f"{header}.{body}.{sig}"))
    assert "'HS256' is refused" in err.message and "EdDSA" in err.message


def test_token_signed_by_another_clients_key(secure, bystander):
    _register(secure, "billing-1")
    other = keyfiles.load_private(client_key("billing-2"))
    token = make_token("billing-1", other, BROKER_ID)
    err = hello_refused(secure, _hello("billing-1", token))
    assert "signature does not match the key registered for 'billing-1'" in err.message
    # Presenting the other key as billing-1's is refused too: the key is bound to the id.
    err = hello_refused(secure, _hello("billing-1", token,
                                       public_key=keyfiles.public_pem(other).decode()))
    assert "registered with key" in err.message
    assert auth_failures(secure).get("other_key", 0) >= 1


@pytest.mark.parametrize(("when", "audience", "expected"), [
    (-3600, BROKER_ID, "token expired"),
    (+3600, BROKER_ID, "not valid yet"),
    (0, "another-broker", "for another broker"),
])
def test_expired_future_and_wrong_audience_tokens(secure, bystander, when, audience, expected):
    _register(secure, "billing-1")
    key = keyfiles.load_private(client_key("billing-1"))
    token = make_token("billing-1", key, audience, now=time.time() + when)
    err = hello_refused(secure, _hello("billing-1", token))
    assert expected in err.message


def _welcomed_token(broker) -> str:
    """A token billing-1 has just opened a native connection with (then closed)."""
    token = make_token("billing-1", keyfiles.load_private(client_key("billing-1")), BROKER_ID)
    peer = RawPeer(broker.url)
    try:
        peer.write(f.encode(_hello("billing-1", token)))
        assert isinstance(peer.read(), f.Welcome)
    finally:
        peer.close()
    return token


def test_replayed_token(secure, bystander):
    token = _welcomed_token(secure)
    err = hello_refused(secure, _hello("billing-1", token))
    assert "replayed" in err.message


def test_replayed_token_after_a_crash(secure, bystander):
    # The welcome comes once the token's id is stored, so even kill -9 right after it
    # does not make the captured token usable again.
    token = _welcomed_token(secure)
    secure.kill()
    secure.start()
    err = hello_refused(secure, _hello("billing-1", token))
    assert "replayed" in err.message
    # A fresh token still works.
    with connect(secure, "billing-1") as client:
        assert client.admin("whoami")["client_id"] == "billing-1"


def test_a_group_name_is_no_way_around_the_rules(secure, bystander):
    with connect(secure, "billing-1") as billing:
        billing.consume("orders/v1/*", group="shared")  # the group now reads orders
    with connect(secure, "shop-1") as shop:
        # shop-* may not read orders/*: joining the group would hand it orders.
        with pytest.raises(NotAuthorized, match="group 'shared' also reads 'orders/v1/\\*'"):
            shop.consume("calm/v1/*", group="shared")
        shop.consume("calm/v1/*", group="calm-workers")
        # Nor may anyone widen a group past what its members may read.
        with admin(secure) as a, pytest.raises(NotAuthorized, match="member, client 'shop-1'"):
            a.consume("orders/v1/*", group="calm-workers")


def test_nothing_is_answered_before_the_welcome(secure, bystander):
    # Frames sent right behind the HELLO wait until the token's id is stored and the
    # WELCOME is out.
    key = keyfiles.load_private(client_key("billing-1"))
    peer = RawPeer(secure.url)
    try:
        peer.write(f.encode(_hello("billing-1", make_token("billing-1", key, BROKER_ID)))
                   + f.encode(f.Ping(7)) + f.encode(f.Offsets(8, ["orders/v1/*"])))
        kinds = [type(peer.read()).__name__ for _ in range(3)]
    finally:
        peer.close()
    assert kinds == ["Welcome", "Pong", "Result"]


def test_a_native_hello_token_is_no_http_bearer(secure, bystander):
    token = _welcomed_token(secure)
    r = httpx.get(f"{secure.http}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401 and "opened a native connection" in r.text
    fresh = make_token("billing-1", keyfiles.load_private(client_key("billing-1")),
                       BROKER_ID)  # a token made for HTTP works
    assert httpx.get(f"{secure.http}/v1/whoami",
                     headers={"Authorization": f"Bearer {fresh}"}).status_code == 200


def test_oversized_token(secure, bystander):
    err = hello_refused(secure, _hello("billing-1", "x" * 5000))
    assert "5000 bytes, the limit is 4096" in err.message


def test_claiming_the_admin_id_with_another_key(secure, bystander):
    err = hello_refused(secure, signed_hello("admin", audience=BROKER_ID))
    assert "registered with key" in err.message


def test_pending_client_waits_until_an_admin_approves(secure, bystander):
    with pytest.raises(PendingApproval, match="waits for an admin's approval") as info:
        connect(secure, "stranger-1")
    assert info.value.detail["fingerprint"].startswith("SHA256:")
    # Still pending on the next try; an admin sees it and approves it.
    with pytest.raises(PendingApproval):
        connect(secure, "stranger-1")
    with admin(secure) as a:
        listed = {c["client_id"]: c for c in a.admin("clients.list")["clients"]}
        assert listed["stranger-1"]["status"] == "pending"
        a.admin("clients.approve", client_id="stranger-1")
    with connect(secure, "stranger-1") as c:
        assert c.admin("whoami")["client_id"] == "stranger-1"
    assert auth_failures(secure)["pending"] >= 2


def test_wait_for_approval_connects_once_approved(secure, bystander):
    import threading

    def approve_soon() -> None:
        time.sleep(0.5)
        with admin(secure) as a:
            wait_until(lambda: "stranger-2" in {
                c["client_id"] for c in a.admin("clients.list")["clients"]}, 5)
            a.admin("clients.approve", client_id="stranger-2")

    t = threading.Thread(target=approve_soon)
    t.start()
    with connect(secure, "stranger-2", wait_for_approval=10) as c:
        assert c.admin("whoami")["client_id"] == "stranger-2"
    t.join()


def test_revoked_client_is_cut_and_refused(secure, bystander):
    victim = connect(secure, "billing-3")
    sub = victim.consume("orders/v1/*", group="b3")
    with admin(secure) as a:
        result = a.admin("clients.revoke", client_id="billing-3")
        assert result["status"] == "revoked" and result["connections_closed"] == 1
    wait_until(lambda: not victim._client.connected, 5, what="the revoked client cut")
    with pytest.raises(NotAuthenticated, match="revoked"):
        connect(secure, "billing-3")
    assert auth_failures(secure)["revoked"] >= 1
    del sub
    victim.close()


def test_rotated_key_replaces_the_old_one(secure, bystander, tmp_path):
    _register(secure, "billing-4")
    new_key = keyfiles.generate()
    new_path, _ = keyfiles.save(new_key, tmp_path, "billing-4")
    with admin(secure) as a:
        a.admin("clients.rotate", client_id="billing-4",
                public_key=keyfiles.public_pem(new_key).decode())
    with pytest.raises(NotAuthenticated, match="registered with key"):
        connect(secure, "billing-4")
    with minou.connect_sync(secure.url, client_id="billing-4", key=str(new_path),
                            reconnect=False) as c:
        assert c.admin("whoami")["fingerprint"] == keyfiles.fingerprint(new_key)


def test_admin_operations_refuse_non_admins(secure, bystander):
    with connect(secure, "billing-1") as c:
        for op, args in (("clients.approve", {"client_id": "stranger-9"}),
                         ("clients.revoke", {"client_id": "shop-bystander"}),
                         ("reload", {}), ("status", {}), ("list", {})):
            with pytest.raises(NotAuthorized, match="needs an admin identity"):
                c.admin(op, **args)
        assert c.admin("whoami")["admin"] is False


# -------------------------------------------------------------------- rules
def test_writing_to_a_forbidden_channel(secure, bystander):
    with connect(secure, "billing-1") as c:
        with pytest.raises(NotAuthorized, match=r"may not write to 'orders/v1/1' "
                                                r"\(write allowed: invoice/v1/\*\)"):
            c.send("orders/v1/1", {"customer": "x", "total": 1})
        assert c.send("invoice/v1/1", {"ok": True}).seq == 1  # its own rules still work
    with admin(secure) as a:
        rows = a.admin("list", channel="orders/v1/1")["channels"]
        assert not rows or rows[0]["depth"] == 0
    assert refused(secure)["not_authorized"] >= 1


def test_broadcasting_into_a_forbidden_pattern(secure, bystander):
    with connect(secure, "billing-1") as c, \
            pytest.raises(NotAuthorized, match="may not write to 'calm/v1/\\*'"):
        c.send("calm/v1/*", {"n": 99})


def test_reading_a_forbidden_channel(secure, bystander):
    with connect(secure, "shop-1") as c:
        with pytest.raises(NotAuthorized, match="may not read 'orders/v1/\\*'"):
            c.consume("orders/v1/*")
        with pytest.raises(NotAuthorized, match="may not read"):
            c.read("orders/v1/1")
        with pytest.raises(NotAuthorized, match="may not read"):
            c.listen("invoice/v1/shop-1")


def test_wildcard_listening_on_an_exclusive_channel(secure, bystander):
    with connect(secure, "billing-1") as c:
        with pytest.raises(NotAuthorized, match=r"exclusive.*not a wildcard"):
            c.listen("invoice/v1/*")
        with pytest.raises(NotAuthorized, match="exclusive"):
            c.listen("invoice/*")


def test_second_client_on_a_reserved_channel_even_after_a_restart(secure, bystander):
    owner = connect(secure, "billing-1")
    sub = owner.listen("invoice/v1/b1", start="oldest")
    with connect(secure, "billing-2") as thief:
        with pytest.raises(NotAuthorized, match="reserved by client 'billing-1'"):
            thief.listen("invoice/v1/b1")
        with pytest.raises(NotAuthorized, match="reserved by client 'billing-1'"):
            thief.consume("invoice/v1/b1")
        with pytest.raises(NotAuthorized, match="reserved by client 'billing-1'"):
            thief.read("invoice/v1/b1")
        thief.send("invoice/v1/b1", {"invoice": 7})  # writing to the mailbox is fine
    assert sub.get(timeout=5).payload == {"invoice": 7}
    owner.close()
    secure.stop()
    secure.start()
    with connect(secure, "billing-2") as thief, \
            pytest.raises(NotAuthorized, match="reserved by client 'billing-1'"):
        thief.listen("invoice/v1/b1")
    with admin(secure) as a:
        assert a.admin("clients.list")["reservations"] == {"invoice/v1/b1": "billing-1"}
        a.admin("reservations.release", channel="invoice/v1/b1")
    with connect(secure, "billing-2") as c2:
        c2.listen("invoice/v1/b1")  # released: the next reader claims it


def test_settling_another_clients_delivery(secure, bystander):
    with connect(secure, "shop-1") as shop:
        shop.send("calm/v1/2", {"n": 1})
    holder = connect(secure, "shop-2")
    msg = holder.consume("calm/v1/2", group="g2").get(timeout=5)
    peer = RawPeer(secure.url)
    peer.write(f.encode(signed_hello("shop-3", audience=BROKER_ID)))
    assert isinstance(peer.read(), f.Welcome)
    peer.write(f.encode(f.Ack(5, [msg.tag])))
    settled = peer.read()
    assert isinstance(settled, f.Settled)
    assert settled.failed and settled.failed[0][1] == ErrorCode.UNKNOWN_DELIVERY
    peer.close()
    assert msg.ack() is True  # still the holder's to settle
    holder.close()


# ------------------------------------------------------------------ schemas
@pytest.mark.parametrize(("payload", "path", "reason"), [
    ({"customer": 5, "total": 1}, "$.customer", "must be string"),
    ({"customer": "ada"}, "$", "total"),
    ({"customer": "ada", "total": -1}, "$.total", "bigger than or equal to 0"),
    ({"customer": "ada", "total": 1, "extra": True}, "$", "extra"),
    ("just a string", "$", "must be object"),
])
def test_schema_violations_are_refused_with_the_failing_path(secure, bystander, payload, path,
                                                             reason):
    with connect(secure, "shop-1") as c:
        with pytest.raises(SchemaMismatch) as info:
            c.send("orders/v1/9", payload)
        assert info.value.code == ErrorCode.SCHEMA_MISMATCH
        assert f"schema of orders/v1: {path}" in info.value.message
        assert reason in info.value.message
        assert c.send("orders/v1/9", {"customer": "ada", "total": 2}).seq == 1
    with admin(secure) as a:
        st = a.admin("status")
        assert st["schemas"]["refused"]["orders/v1"] == 1
        assert st["counters"]["refused"]["schema_mismatch"] == 1
        rows = a.admin("list", channel="orders/v1/9")["channels"]
        assert rows[0]["depth"] == 1  # only the valid one is stored


def test_raw_payloads_are_refused_on_a_schema_channel(secure, bystander):
    with connect(secure, "shop-1") as c, \
            pytest.raises(InvalidPayload, match="raw payloads are refused"):
        c.send("orders/v1/9", b"\x00\x01")


# ------------------------------------------------------------- broker token
def test_broker_token_is_required_when_configured(broker_factory, tmp_path):
    cfg = tmp_path / "token.toml"
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret-s3cret-s3cret\n")
    cfg.write_text('[auth]\nbroker_token_file = "secret.txt"\n'
                   '[[rules]]\nclient = "*"\nread = ["*"]\nwrite = ["*"]\n')
    broker = broker_factory.make(config=cfg).start()
    with pytest.raises(NotAuthenticated, match="requires the broker token"):
        minou.connect_sync(broker.url, **_kw(broker, "app-1"))
    with pytest.raises(NotAuthenticated, match="does not match"):
        minou.connect_sync(broker.url, **_kw(broker, "app-1", broker_token="wrong-wrong-wrong"))
    with minou.connect_sync(broker.url, **_kw(broker, "app-1",
                                              broker_token="s3cret-s3cret-s3cret")) as c:
        assert c.send("a/v1/1", {"x": 1}).seq == 1
    with minou.connect_sync(broker.url, **broker.admin_auth(
            broker_token="s3cret-s3cret-s3cret")) as a:
        failures = a.admin("status")["auth"]["failures"]
    assert failures["broker_token_required"] == 1 and failures["bad_broker_token"] == 1


def test_token_mode_needs_only_the_broker_token(broker_factory, tmp_path):
    cfg = tmp_path / "token-only.toml"
    cfg.write_text('[auth]\nmode = "token"\nbroker_token = "0123456789abcdef0123"\n')
    broker = broker_factory.make(config=cfg).start()
    with minou.connect_sync(broker.url, client_id="script", broker_token="0123456789abcdef0123",
                            reconnect=False) as c:
        assert c.send("a/v1/1", {"x": 1}).seq == 1
        assert c.admin("whoami")["method"] == "broker_token"
    with pytest.raises(NotAuthenticated):
        minou.connect_sync(broker.url, client_id="script", reconnect=False)


def test_development_mode_is_loopback_only(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "minou", "start", "--dev", "--host", "0.0.0.0",
                          "--data", str(tmp_path / "d")], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "loopback only" in out.stderr


# ------------------------------------------------------------ second round: identities
def test_listing_a_squatted_id_as_admin_needs_an_approval(secure, bystander):
    """A stranger registers billing-ops through the billing-* rule; the operator later
    lists billing-ops in auth.admins and reloads: the stranger's key is not promoted
    (live connection or new one) until an admin approves it as an admin's."""
    squatter = connect(secure, "billing-ops")
    assert squatter.admin("whoami")["admin"] is False
    cfg = Path(secure.config.parent / f"{secure.data_dir.name}-config.toml")
    cfg = secure.config if "[[rules]]" in secure.config.read_text() else cfg
    cfg.write_text(cfg.read_text() + '\n[auth]\nadmins = ["admin", "billing-ops"]\n')
    with admin(secure) as a:
        assert "admins" in a.admin("reload")["changed"]
        listed = {c["client_id"]: c for c in a.admin("clients.list")["clients"]}
        assert listed["billing-ops"]["admin"] is False
        assert listed["billing-ops"]["admin_pending"] is True
    for client in (squatter, connect(secure, "billing-ops")):
        with pytest.raises(NotAuthorized, match="needs an admin identity"):
            client.admin("status")
    with admin(secure) as a:
        approved = a.admin("clients.approve", client_id="billing-ops")
        assert approved["admin"] is True and "approved as admin" in approved["note"]
    assert squatter.admin("whoami")["admin"] is True  # the live connection, at once
    squatter.close()


@pytest.mark.sqlite_only
def test_strangers_cannot_fill_the_replay_guard(secure, bystander):
    """Unapproved clients' token ids are never stored: 24 pending HELLOs leave the guard
    (and the used_tokens table) as it was, and the admin still gets in."""
    before = secure_guard_size(secure)
    for i in range(15):
        with pytest.raises(PendingApproval):
            connect(secure, f"stranger-{i}")
    for _ in range(9):
        with pytest.raises(PendingApproval):
            connect(secure, "stranger-0")
    assert secure_guard_size(secure) == before + 1  # only the admin's own probe
    with admin(secure) as a:
        assert a.admin("whoami")["admin"] is True


def test_one_address_cannot_register_pending_clients_without_bound(secure, bystander):
    from minou.limits import MAX_PENDING_PER_ADDRESS

    for i in range(MAX_PENDING_PER_ADDRESS):
        with pytest.raises(PendingApproval):
            connect(secure, f"stranger-flood-{i}")
    with pytest.raises(NotAuthenticated,
                       match=r"registered from 127\.0\.0\.1 already wait") as info:
        connect(secure, "stranger-flood-more")
    assert not isinstance(info.value, PendingApproval)
    with admin(secure) as a:
        ids = {c["client_id"] for c in a.admin("clients.list")["clients"]}
    assert "stranger-flood-more" not in ids
    assert auth_failures(secure).get("too_many_pending", 0) >= 1


def test_one_address_cannot_register_auto_accepted_clients_without_bound(secure, bystander):
    """The "billing-*" rule auto-accepts: a stranger with fresh key pairs registered one
    active client per HELLO (600/s, ~10 KB each, kept). 100 new ids a minute from one
    address (the bystander was the first), then a precise refusal, logged and counted;
    an id registered before connects as before."""
    from minou.limits import REGISTRATIONS_PER_ADDRESS

    limit, window = REGISTRATIONS_PER_ADDRESS
    for i in range(limit - 1):
        connect(secure, f"billing-flood-{i}").close()
    with pytest.raises(NotAuthenticated,
                       match=rf"^{limit} new clients were registered from 127\.0\.0\.1 "
                             rf"within {window:g} s; new ones from there are refused") as info:
        connect(secure, "billing-flood-more")
    assert not isinstance(info.value, PendingApproval)
    with connect(secure, "billing-flood-0") as again:
        assert again.admin("whoami")["client_id"] == "billing-flood-0"
    with admin(secure) as a:
        ids = {c["client_id"] for c in a.admin("clients.list")["clients"]}
    assert "billing-flood-more" not in ids and "billing-flood-0" in ids
    assert auth_failures(secure)["too_many_registrations"] == 1
    assert refused(secure)["not_authenticated"] >= 1
    wait_until(lambda: "[too_many_registrations]" in secure.output, what="the log line")


def test_one_small_request_cannot_make_the_broker_do_unbounded_work(broker_factory):
    """Long keys, a broadcast over too many bytes, too many patterns or positions in one
    request: each refused with its named limit; the connection and a bystander go on."""
    from minou.limits import (
        MAX_BROADCAST_BYTES,
        MAX_KEY_LENGTH,
        MAX_PATTERNS_PER_REQUEST,
        MAX_POSITION_CHANNELS,
    )

    b = broker_factory.make().start()
    with b.connect_sync("amp-1") as c:
        for kw in ({"dedup": "d" * (MAX_KEY_LENGTH + 1)}, {"key": "k" * (MAX_KEY_LENGTH + 1)}):
            with pytest.raises(BadRequest, match=f"the limit is {MAX_KEY_LENGTH}"):
                c.send("amp/v1/1", {"n": 1}, **kw)
        ids = MAX_BROADCAST_BYTES // (1 << 20) + 1
        c.send_many([(f"amp/v1/{i}", {"i": i}) for i in range(ids)])
        sub = c.consume("amp/v1/*", group="readers")  # every id now has a reader
        big = "x" * ((1 << 20) - 2)  # a 1 MiB JSON string
        with pytest.raises(BadRequest, match=r"would store \d+ copies .* MiB per broadcast"):
            c.send("amp/v1/*", big)
        with pytest.raises(BadRequest, match="patterns in one OFFSETS request"):
            c.offsets([f"amp/v1/{i}" for i in range(MAX_PATTERNS_PER_REQUEST + 1)])
        with pytest.raises(BadRequest, match="channels in one POSITION request"):
            c.set_position("readers", {f"amp/v1/{i}": 1
                                       for i in range(MAX_POSITION_CHANNELS + 1)})
        assert sub.get(timeout=5).payload == {"i": 0}  # the connection goes on
        assert c.send("amp/v1/0", {"ok": 1}).seq == 2
    with minou.connect_sync(b.url, **b.admin_auth()) as a:
        refused_ = a.admin("status")["counters"]["refused"]
    assert refused_["bad_request"] >= 5


def secure_guard_size(broker) -> int:
    import sqlite3

    with admin(broker):
        pass
    db = sqlite3.connect(broker.data_dir / "minou.db")
    try:
        return db.execute("SELECT count(*) FROM used_tokens").fetchone()[0]
    finally:
        db.close()


def test_attack_table_in_the_docs_lists_every_attack():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    this = "test_attack_table_in_the_docs_lists_every_attack"
    names = [n for n in globals() if n.startswith("test_") and n != this]
    missing = [n for n in names if n not in doc]
    assert not missing, f"docs/security.md does not list: {missing}"
