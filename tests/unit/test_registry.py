"""The key registry: first contact registers the presented key (pending, or active when a rule
auto-accepts it), and from then on only that key proves the client id. Real keys, real tokens."""

from __future__ import annotations

import warnings
from collections import Counter

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from minou.auth import keys
from minou.auth import registry as registry_module
from minou.auth.registry import (
    ACTIVE,
    PENDING,
    REVOKED,
    ClientRecord,
    Identity,
    Registry,
    decode_record,
    encode_record,
)
from minou.auth.rules import Rules
from minou.auth.tokens import make_token
from minou.errors import ErrorCode, NotAuthenticated, PendingApproval

AUD = "broker-1"
NOW = 1_800_000_000.0
ADMINS = frozenset({"admin"})
NO_RULES = Rules.parse(None).accepts  # returns None: the registry decides (pending)
ACCEPT_ALL = Rules.parse([{"client": "*"}]).accepts  # returns True for every id
_PRESENT_OWN = object()


def pem(key) -> str:
    return keys.public_pem(key).decode()


def login(registry: Registry, client_id: str, key, *, present: object = _PRESENT_OWN,
          accepts=NO_RULES, admins: frozenset[str] = ADMINS, now: float = NOW) -> Identity:
    """One HELLO: a fresh token signed by ``key``, presenting ``present`` (default: key's own
    public PEM; None: no public key)."""
    public = pem(key) if present is _PRESENT_OWN else present
    token = make_token(client_id, key, AUD, now=now)
    return registry.authenticate(client_id=client_id, token=token, public_key=public,  # type: ignore[arg-type]
                                 audience=AUD, admins=admins, accepts=accepts, now=now)


def refused(registry: Registry, client_id: str, key, **kw) -> NotAuthenticated:
    """The NotAuthenticated (not PendingApproval) a login raises."""
    with pytest.raises(NotAuthenticated) as info:
        login(registry, client_id, key, **kw)
    assert type(info.value) is NotAuthenticated, info.value
    return info.value


def pending(registry: Registry, client_id: str, key, **kw) -> PendingApproval:
    with pytest.raises(PendingApproval) as info:
        login(registry, client_id, key, **kw)
    return info.value


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


# --- first contact ----------------------------------------------------------------------------


def test_first_contact_without_rules_waits_for_approval_then_works():
    reg, key = Registry(), keys.generate()
    err = pending(reg, "billing-1", key)
    assert err.code is ErrorCode.PENDING_APPROVAL
    assert err.detail == {"why": "pending", "fingerprint": keys.fingerprint(key)}
    assert "minou clients approve billing-1" in str(err)

    record = reg.records["billing-1"]
    assert (record.status, record.fingerprint, record.algorithm) == (
        PENDING, keys.fingerprint(key), "EdDSA")
    assert record.public_key == pem(key).strip() and record.note == "first connection"
    assert record.created_at == record.updated_at == NOW
    assert reg.take_changes() == {"billing-1": record}
    assert reg.take_changes() == {}  # drained

    # Asking again changes nothing: still pending, nothing new to persist.
    again = pending(reg, "billing-1", key, now=NOW + 1)
    assert again.detail["why"] == "pending" and "waits for an admin" in str(again)
    assert reg.records["billing-1"].status == PENDING and reg.take_changes() == {}

    approved = reg.approve("billing-1", by="admin", now=NOW + 2)
    assert approved.status == ACTIVE and approved.note == "approved by admin"
    assert reg.take_changes() == {"billing-1": approved}
    assert login(reg, "billing-1", key, now=NOW + 3) == Identity(
        "billing-1", False, keys.fingerprint(key), "key")
    # Once registered, the public key need not be presented again.
    assert login(reg, "billing-1", key, present=None, now=NOW + 4).client_id == "billing-1"


def test_another_key_for_a_pending_id_is_refused():
    reg, key, intruder = Registry(), keys.generate(), keys.generate()
    pending(reg, "billing-1", key)
    reg.take_changes()
    err = refused(reg, "billing-1", intruder)
    assert "registered with key " + keys.fingerprint(key) in str(err)
    assert keys.fingerprint(intruder) in str(err)
    assert err.detail["why"] == "other_key"
    assert reg.records["billing-1"].fingerprint == keys.fingerprint(key)
    assert reg.take_changes() == {}


def test_a_matching_rule_auto_accepts_a_new_client():
    reg, key = Registry(), keys.generate()
    rules = Rules.parse([{"client": "billing-*"}, {"client": "shop-*", "accept": False}])
    identity = login(reg, "billing-1", key, accepts=rules.accepts)
    assert identity == Identity("billing-1", False, keys.fingerprint(key))
    record = reg.records["billing-1"]
    assert record.status == ACTIVE and "auto-accept" in record.note
    assert reg.take_changes() == {"billing-1": record}
    # accept = false (accepts -> False) and no matching rule both leave the client pending.
    pending(reg, "shop-1", keys.generate(), accepts=rules.accepts)
    pending(reg, "other-1", keys.generate(), accepts=rules.accepts)
    assert {r.client_id: r.status for r in reg.records.values()} == {
        "billing-1": ACTIVE, "shop-1": PENDING, "other-1": PENDING}


def test_an_admin_id_is_never_auto_accepted():
    reg, key = Registry(), keys.generate()
    # client = "*" must not let whoever comes first claim the admin's name.
    err = pending(reg, "admin", key, accepts=ACCEPT_ALL)
    assert err.detail["why"] == "pending" and reg.records["admin"].status == PENDING
    reg.approve("admin", by="operator", admins=ADMINS)
    assert login(reg, "admin", key, accepts=ACCEPT_ALL, now=NOW + 1) == Identity(
        "admin", True, keys.fingerprint(key))
    # The same rule does accept an ordinary id at once.
    assert login(reg, "billing-1", keys.generate(), accepts=ACCEPT_ALL).admin is False


@pytest.mark.parametrize("accepts", [NO_RULES, ACCEPT_ALL], ids=["no-rules", "accept-all"])
def test_unproven_first_contacts_record_nothing(accepts):
    reg, key = Registry(), keys.generate()
    err = refused(reg, "billing-1", key, present=None, accepts=accepts)
    assert err.detail["why"] == "unknown_client" and "present its public key" in str(err)
    # A token signed by another key than the one presented: the presenter does not hold the
    # private key, so it must not be able to register (or park a pending record).
    err = refused(reg, "billing-1", keys.generate(), present=pem(key), accepts=accepts)
    assert "signature does not match" in str(err)
    assert reg.records == {} and reg.take_changes() == {}
    assert login(reg, "billing-1", key, accepts=ACCEPT_ALL).client_id == "billing-1"


# --- admin actions ----------------------------------------------------------------------------


def test_revoked_is_refused_until_approved_again():
    reg, key = Registry(), keys.generate()
    login(reg, "billing-1", key, accepts=ACCEPT_ALL)
    revoked = reg.revoke("billing-1", by="admin", now=NOW + 1)
    assert revoked.status == REVOKED and reg.take_changes() == {"billing-1": revoked}
    err = refused(reg, "billing-1", key, now=NOW + 2)
    assert err.detail["why"] == "revoked" and "is revoked" in str(err)
    err = refused(reg, "billing-1", key, present=None, now=NOW + 2)
    assert err.detail["why"] == "revoked"
    reg.approve("billing-1", by="admin", now=NOW + 3)
    assert login(reg, "billing-1", key, now=NOW + 4).client_id == "billing-1"


def test_rotate_replaces_the_key_and_forget_lets_the_id_register_afresh():
    reg, old, new = Registry(), keys.generate(), keys.generate()
    login(reg, "billing-1", old, accepts=ACCEPT_ALL)
    login(reg, "billing-1", old, present=None)  # the parsed old key is now cached
    rotated = reg.rotate("billing-1", pem(new), by="admin", now=NOW + 1)
    assert rotated.fingerprint == keys.fingerprint(new) and rotated.note == "key rotated by admin"
    assert reg.take_changes() == {"billing-1": rotated}
    assert refused(reg, "billing-1", old, now=NOW + 2).detail["why"] == "other_key"
    # Without presenting a key the old token is checked against the new key (no stale cache).
    assert "signature does not match" in str(refused(reg, "billing-1", old, present=None,
                                                     now=NOW + 2))
    assert login(reg, "billing-1", new, now=NOW + 3).fingerprint == keys.fingerprint(new)

    forgotten = reg.forget("billing-1")
    assert forgotten.fingerprint == keys.fingerprint(new)
    assert "billing-1" not in reg.records and reg.take_changes() == {"billing-1": None}
    third = keys.generate()
    assert login(reg, "billing-1", third, accepts=ACCEPT_ALL, now=NOW + 4).fingerprint == \
        keys.fingerprint(third)
    with pytest.raises(KeyError, match="no client 'nobody'"):
        reg.forget("nobody")


def test_pending_clients_are_bounded(monkeypatch):
    monkeypatch.setattr(registry_module, "MAX_PENDING_CLIENTS", 3)
    rules = Rules.parse([{"client": "billing-*"}, {"client": "shop-*", "accept": False}])
    reg = Registry()
    for n in range(3):
        pending(reg, f"shop-{n}", keys.generate(), accepts=rules.accepts)
    reg.take_changes()
    err = refused(reg, "shop-3", keys.generate(), accepts=rules.accepts)
    assert err.detail["why"] == "too_many_pending" and "3 clients already wait" in str(err)
    assert "shop-3" not in reg.records and reg.take_changes() == {}
    # An admin id is never auto-accepted, so it counts against the bound too.
    assert refused(reg, "admin", keys.generate(), accepts=ACCEPT_ALL).detail["why"] == \
        "too_many_pending"
    # An auto-accepted client adds no pending record: it still gets in.
    assert login(reg, "billing-1", keys.generate(), accepts=rules.accepts).admin is False
    # Once an admin decides, there is room again.
    reg.approve("shop-0", by="admin")
    pending(reg, "shop-3", keys.generate(), accepts=rules.accepts)


def test_failures_are_counted_by_why():
    reg, key = Registry(), keys.generate()
    pending(reg, "billing-1", key)  # pending
    pending(reg, "billing-1", key)  # pending
    reg.approve("billing-1", by="admin")
    login(reg, "billing-1", key)  # success: not counted
    refused(reg, "billing-1", keys.generate())  # other_key
    refused(reg, "billing-1", keys.generate(), present=None)  # token (bad signature)
    refused(reg, "stranger", keys.generate(), present=None)  # unknown_client
    reg.revoke("billing-1", by="admin")
    refused(reg, "billing-1", key)  # revoked
    assert reg.failures == Counter(pending=2, other_key=1, token=1, unknown_client=1, revoked=1)


def test_last_seen_is_kept_in_memory_only():
    reg, key = Registry(), keys.generate()
    login(reg, "billing-1", key, accepts=ACCEPT_ALL)
    assert reg.records["billing-1"].last_seen == NOW
    reg.take_changes()
    login(reg, "billing-1", key, now=NOW + 30)
    assert reg.records["billing-1"].last_seen == NOW + 30
    # last_seen is informational (minou clients list): a disk write per connection would cost
    # more than it is worth, so a successful login produces no change to persist; the value is
    # saved with the record's next real change (approve, revoke, rotate).
    assert reg.take_changes() == {}
    revoked = reg.revoke("billing-1", by="admin", now=NOW + 40)
    assert reg.take_changes()["billing-1"].last_seen == NOW + 30 == revoked.last_seen


# --- persistence ------------------------------------------------------------------------------


def test_records_round_trip_and_a_restarted_registry_keeps_its_decisions():
    reg = Registry()
    billing, shop, gone = keys.generate(), keys.generate(), keys.generate()
    login(reg, "billing-1", billing, accepts=ACCEPT_ALL)
    pending(reg, "shop-1", shop)
    login(reg, "gone-1", gone, accepts=ACCEPT_ALL)
    reg.revoke("gone-1", by="admin", now=NOW + 1)
    blobs = {cid: encode_record(r) for cid, r in reg.take_changes().items() if r is not None}
    assert set(blobs) == {"billing-1", "shop-1", "gone-1"}
    for cid, blob in blobs.items():
        decoded = decode_record(blob)
        assert isinstance(decoded, ClientRecord) and decoded == reg.records[cid]
    assert decode_record(blobs["gone-1"]).note == "revoked by admin"

    restarted = Registry(decode_record(b) for b in blobs.values())
    assert restarted.listing() == reg.listing()
    intruder = keys.generate()
    assert refused(restarted, "billing-1", intruder).detail["why"] == "other_key"
    assert "signature does not match" in str(refused(restarted, "billing-1", intruder,
                                                     present=None))
    assert login(restarted, "billing-1", billing, present=None).fingerprint == \
        keys.fingerprint(billing)
    assert pending(restarted, "shop-1", shop).detail["why"] == "pending"
    assert refused(restarted, "gone-1", gone).detail["why"] == "revoked"
    assert restarted.take_changes() == {}


# --- key types --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["ES256", "RS256"])
def test_p256_and_rsa_clients_register_and_authenticate(algorithm, rsa_key):
    key = ec.generate_private_key(ec.SECP256R1()) if algorithm == "ES256" else rsa_key
    reg = Registry()
    pending(reg, "billing-1", key)
    record = reg.records["billing-1"]
    assert record.algorithm == algorithm and record.fingerprint == keys.fingerprint(key)
    reg.approve("billing-1", by="admin")
    assert login(reg, "billing-1", key, present=None, now=NOW + 1) == Identity(
        "billing-1", False, keys.fingerprint(key))
    # The algorithm follows the registered key: an Ed25519-signed token is refused unchecked.
    err = refused(reg, "billing-1", keys.generate(), present=None)
    assert "algorithm 'EdDSA' is refused" in str(err) and algorithm in str(err)


def test_weak_and_unsupported_keys_are_refused_at_first_contact():
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    with warnings.catch_warnings():  # PyJWT warns about 1024-bit keys; we want the token anyway
        warnings.simplefilter("ignore")
        token = jwt.encode({"iss": "billing-1", "aud": AUD, "iat": int(NOW),
                            "exp": int(NOW) + 60, "jti": "x"}, weak, algorithm="RS256")
    reg = Registry()
    with pytest.raises(NotAuthenticated, match="RSA keys must have at least 2048 bits"):
        reg.authenticate(client_id="billing-1", token=token, public_key=pem(weak),
                         audience=AUD, admins=ADMINS, accepts=ACCEPT_ALL, now=NOW)
    p384 = ec.generate_private_key(ec.SECP384R1())
    with pytest.raises(NotAuthenticated, match="EC keys must use P-256, not secp384r1"):
        reg.authenticate(client_id="billing-1", token=token, public_key=pem(p384),
                         audience=AUD, admins=ADMINS, accepts=ACCEPT_ALL, now=NOW)
    assert reg.records == {} and reg.take_changes() == {}


def test_oversized_and_garbage_public_keys_are_refused():
    reg, key = Registry(), keys.generate()
    body = "A" * 5000
    huge = f"-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n"
    err = refused(reg, "billing-1", key, present=huge, accepts=ACCEPT_ALL)
    assert f"public key is {len(huge)} bytes; the limit is 4096" in str(err)
    err = refused(reg, "billing-1", key, present="-----BEGIN PUBLIC KEY-----\nnope\n"
                  "-----END PUBLIC KEY-----\n", accepts=ACCEPT_ALL)
    assert "public key refused: not a PEM public key" in str(err)
    err = refused(reg, "billing-1", key, present="not a key at all", accepts=ACCEPT_ALL)
    assert "public key refused" in str(err)
    assert reg.records == {} and reg.take_changes() == {}
    # A garbage key presented by a registered client is refused as well (not a crash).
    login(reg, "billing-1", key, accepts=ACCEPT_ALL)
    assert "public key refused" in str(refused(reg, "billing-1", key, present="garbage"))


def test_the_same_key_in_another_pem_encoding_is_the_same_key(rsa_key):
    """A client whose first HELLO carried its RSA key as PKCS#1 ("BEGIN RSA PUBLIC KEY",
    accepted by load_pem_public_key) and a later one as SubjectPublicKeyInfo is refused as
    "registered with key X, not X" (same fingerprint twice): keys are compared, not their text."""
    reg = Registry()
    pkcs1 = rsa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.PKCS1).decode()
    login(reg, "billing-1", rsa_key, present=pkcs1, accepts=ACCEPT_ALL)
    assert login(reg, "billing-1", rsa_key, now=NOW + 1).client_id == "billing-1"


# ------------------------------------------------------------ admin rights need approval
def test_listing_a_squatted_id_as_admin_promotes_nobody_until_approved():
    reg, stranger = Registry(), keys.generate()
    billing = Rules.parse([{"client": "billing-*"}]).accepts
    # A stranger registers billing-ops through the auto-accepting rule ...
    assert login(reg, "billing-ops", stranger, accepts=billing).admin is False
    # ... then the operator lists billing-ops as an admin: no promotion by itself.
    admins = frozenset({"admin", "billing-ops"})
    assert login(reg, "billing-ops", stranger, accepts=billing, admins=admins,
                 now=NOW + 1).admin is False
    assert reg.admin_pending("billing-ops", admins) and not reg.is_admin("billing-ops", admins)
    reg.approve("billing-ops", by="operator", admins=admins)  # the explicit step
    assert login(reg, "billing-ops", stranger, accepts=billing, admins=admins,
                 now=NOW + 2).admin is True
    assert "approved as admin" in reg.records["billing-ops"].note
    # A revocation takes the approval away; re-approving without listing it gives none.
    reg.revoke("billing-ops", by="operator")
    reg.approve("billing-ops", by="operator")
    assert not reg.is_admin("billing-ops", admins)


def test_records_of_older_versions_keep_their_admin_rights():
    key, other = keys.generate(), keys.generate()
    old = [ClientRecord(client_id=cid, public_key=pem(k), fingerprint="", algorithm="EdDSA",
                        status=ACTIVE, created_at=NOW, updated_at=NOW)
           for cid, k in (("admin", key), ("app-1", other))]
    assert all(r.admin_approved is None for r in old)
    reg = Registry(old, admins=ADMINS)
    assert reg.is_admin("admin", ADMINS) and not reg.is_admin("app-1", ADMINS)
    # The answer is saved, so a later reload listing app-1 does not make it admin.
    saved = reg.take_changes()
    assert saved["admin"].admin_approved is True and saved["app-1"].admin_approved is False
    assert not reg.is_admin("app-1", frozenset({"admin", "app-1"}))


# ------------------------------------------------------------ the replay guard
def test_strangers_leave_nothing_in_the_replay_guard():
    reg = Registry()
    for i in range(50):
        pending(reg, f"stranger-{i}", keys.generate())
    assert len(reg.replay) == 0 and reg.replay.take_new() == []
    # An active client's token is remembered.
    login(reg, "app-1", keys.generate(), accepts=ACCEPT_ALL)
    assert len(reg.replay) == 1


def test_one_client_cannot_fill_the_replay_guard_and_admins_pass_a_full_one():
    from minou.auth.tokens import ReplayGuard

    guard = ReplayGuard(capacity=10, per_client=3)
    for i in range(3):
        guard.check_and_remember(f"a{i}", NOW + 60, NOW, client="app-1")
    with pytest.raises(NotAuthenticated, match="opened 3 connections"):
        guard.check_and_remember("a3", NOW + 60, NOW, client="app-1")
    for i in range(7):
        guard.check_and_remember(f"b{i}", NOW + 60, NOW, client=f"c{i}")
    with pytest.raises(NotAuthenticated, match="try again in a minute"):
        guard.check_and_remember("x", NOW + 60, NOW, client="latecomer")
    guard.check_and_remember("adm", NOW + 60, NOW, client="admin", privileged=True)
    # Expired ids leave, and their client's count with them.
    guard.check_and_remember("a4", NOW + 200, NOW + 61, client="app-1")
    assert len(guard) == 1


def test_one_address_registers_a_bounded_number_of_pending_clients():
    from minou.limits import MAX_PENDING_PER_ADDRESS

    reg = Registry()

    def hello(cid: str, address: str) -> None:
        key = keys.generate()
        reg.authenticate(client_id=cid, token=make_token(cid, key, AUD, now=NOW),
                         public_key=pem(key), audience=AUD, admins=ADMINS, accepts=NO_RULES,
                         now=NOW, address=address)

    for i in range(MAX_PENDING_PER_ADDRESS):
        with pytest.raises(PendingApproval):
            hello(f"s-{i}", "10.0.0.9")
    with pytest.raises(NotAuthenticated, match=r"registered from 10\.0\.0\.9 already wait") as info:
        hello("s-more", "10.0.0.9")
    assert not isinstance(info.value, PendingApproval)
    assert "s-more" not in reg.records
    with pytest.raises(PendingApproval):
        hello("elsewhere", "10.0.0.10")  # another address is not affected
    reg.approve("s-0", by="op")  # a decision frees a place
    with pytest.raises(PendingApproval):
        hello("s-later", "10.0.0.9")


def hello_from(reg: Registry, cid: str, address: str, *, key=None, accepts=ACCEPT_ALL,
               now: float = NOW, max_clients: int = 100_000) -> Identity:
    """One HELLO from ``address`` with a fresh token (and a fresh key unless given)."""
    key = key or keys.generate()
    return reg.authenticate(client_id=cid, token=make_token(cid, key, AUD, now=now),
                            public_key=pem(key), audience=AUD, admins=ADMINS, accepts=accepts,
                            now=now, address=address, max_clients=max_clients)


def test_one_address_registers_auto_accepted_clients_at_a_bounded_rate():
    """An auto-accepting rule made one active client per HELLO, as fast as a socket could
    send them: 100 new ids a minute per address, then refused precisely (nothing recorded,
    nothing in the replay guard); registered ids, other addresses, and the same address
    a window later go on."""
    from minou.limits import REGISTRATIONS_PER_ADDRESS

    limit, window = REGISTRATIONS_PER_ADDRESS
    reg = Registry()
    first = keys.generate()
    hello_from(reg, "billing-0", "10.0.0.9", key=first)
    for i in range(1, limit):
        hello_from(reg, f"billing-{i}", "10.0.0.9", now=NOW + i / limit)
    reg.take_changes()
    guarded = len(reg.replay)
    with pytest.raises(NotAuthenticated) as info:
        hello_from(reg, "billing-more", "10.0.0.9", now=NOW + 1)
    err = info.value
    assert type(err) is NotAuthenticated and err.detail["why"] == "too_many_registrations"
    assert str(err) == (f"{limit} new clients were registered from 10.0.0.9 within "
                        f"{window:g} s; new ones from there are refused for the rest of that "
                        "time, registered ones connect as before")
    assert reg.failures["too_many_registrations"] == 1
    assert "billing-more" not in reg.records and reg.take_changes() == {}
    assert len(reg.replay) == guarded
    # A registered client from the same address, another address's new one: not affected.
    assert hello_from(reg, "billing-0", "10.0.0.9", key=first, now=NOW + 1).client_id == \
        "billing-0"
    assert hello_from(reg, "billing-other", "10.0.0.10", now=NOW + 1).client_id == \
        "billing-other"
    # A pending registration is bounded apart (MAX_PENDING_PER_ADDRESS), not by this rate.
    with pytest.raises(PendingApproval):
        hello_from(reg, "shop-1", "10.0.0.9", accepts=NO_RULES, now=NOW + 1)
    # The next window: room again.
    assert hello_from(reg, "billing-more", "10.0.0.9", now=NOW + window).client_id == \
        "billing-more"


def test_registrations_from_too_many_addresses_at_once_are_refused_by_what_they_met():
    """The per-address windows are bounded in number (MAX_ATTEMPT_KEYS): past it a new
    address is refused too, and the error says it was the number of addresses."""
    from minou.auth.attempts import AttemptLimiter

    reg = Registry()
    reg._registrations = AttemptLimiter(20, 60.0, max_keys=2)
    hello_from(reg, "billing-a", "10.0.0.1")
    hello_from(reg, "billing-b", "10.0.0.2")
    with pytest.raises(NotAuthenticated, match=r"registering from 2 addresses within 60 s"):
        hello_from(reg, "billing-c", "10.0.0.3")
    assert hello_from(reg, "billing-c", "10.0.0.3", now=NOW + 60).client_id == "billing-c"


def test_registered_clients_are_bounded_broker_wide():
    """Past max_clients records (any status) a new id is refused, auto-accepted or not;
    those registered go on connecting; forgetting one, or a higher bound, makes room."""
    rules = Rules.parse([{"client": "billing-*"}])
    reg = Registry()
    key = keys.generate()
    hello_from(reg, "billing-1", "10.0.0.1", key=key, accepts=rules.accepts, max_clients=3)
    hello_from(reg, "billing-2", "10.0.0.2", accepts=rules.accepts, max_clients=3)
    with pytest.raises(PendingApproval):
        hello_from(reg, "shop-1", "10.0.0.3", accepts=rules.accepts, max_clients=3)
    reg.revoke("billing-2", by="op")  # a revoked record is kept, and counts
    reg.take_changes()
    for cid in ("billing-3", "shop-2", "admin"):  # auto-accepted, pending, an admin's id
        with pytest.raises(NotAuthenticated) as info:
            hello_from(reg, cid, "10.0.0.4", accepts=rules.accepts, max_clients=3)
        err = info.value
        assert type(err) is NotAuthenticated and err.detail == {
            "why": "too_many_clients", "limit": 3}
        assert "the broker holds 3 clients and the limit is 3 (max_clients)" in str(err)
        assert cid not in reg.records
    assert reg.take_changes() == {} and reg.failures["too_many_clients"] == 3
    assert hello_from(reg, "billing-1", "10.0.0.1", key=key, accepts=rules.accepts,
                      max_clients=3).client_id == "billing-1"
    assert hello_from(reg, "billing-3", "10.0.0.4", accepts=rules.accepts,
                      max_clients=4).client_id == "billing-3"
    reg.forget("billing-2")
    assert hello_from(reg, "billing-4", "10.0.0.4", accepts=rules.accepts,
                      max_clients=4).client_id == "billing-4"
    assert reg.register("admin", pem(keys.generate()), note="the broker's own key")


def test_a_pending_client_asking_too_often_is_refused_for_a_while():
    from minou.limits import PENDING_ATTEMPTS

    reg, key = Registry(), keys.generate()
    pending(reg, "eager", key)
    for i in range(PENDING_ATTEMPTS[0]):  # after the registration itself
        pending(reg, "eager", key, now=NOW + i * 0.01)
    with pytest.raises(NotAuthenticated, match="asked 10 times") as info:
        login(reg, "eager", key, now=NOW + 0.5)
    assert info.value.detail["why"] == "too_many_attempts"
    pending(reg, "eager", key, now=NOW + PENDING_ATTEMPTS[1] + 1)


@pytest.mark.parametrize("client_id", ["eu-1\x00", "eu-1\u202e", "eu-1 ", "eu-x\nINFO forged",
                                       "eu-a/b", "eu-../../x", "x" * 201])
def test_a_new_client_id_must_be_printable_without_spaces_or_slashes(client_id: str) -> None:
    reg = Registry()
    exc = refused(reg, client_id, keys.generate(), accepts=ACCEPT_ALL)
    assert exc.detail == {"why": "client_id"} and "client id" in exc.message
    assert reg.records == {} and reg.failures["client_id"] == 1
    with pytest.raises(NotAuthenticated):
        reg.register(client_id, pem(keys.generate()), note="by hand")
    # Letters beyond ASCII are names too.
    assert login(reg, "kundé-1", keys.generate(), accepts=ACCEPT_ALL).client_id == "kundé-1"
