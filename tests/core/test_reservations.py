"""Reading and naming (core, no I/O): one check of rules and reservations under every
read, dead letters with their channel, unambiguous listener keys (and the migration of
older ones), message ids that name one channel, writer ids that belong to a client."""

from __future__ import annotations

from pathlib import Path

import pytest

from minou.auth.rules import Rules
from minou.core.broker import LISTEN_KEYS_META, Broker, Session
from minou.core.writes import WriteBatch
from minou.errors import BadRequest, ErrorCode, NotAuthorized, UnknownDelivery
from minou.names import LEGACY_LISTEN_PREFIX, listen_group_key, migrate_listen_key
from minou.storage.base import Snapshot
from minou.storage.memory import MemoryStorage
from minou.storage.sqlite import SQLiteStorage

from .helpers import Harness, send

RULES = Rules.parse([
    {"client": "*", "read": ["orders/*", "!invoice/*", "_dead/invoice/*"]},
    {"client": "audit", "read": ["*"]},
])


def session(client_id: str, *, admin: bool = False) -> Session:
    return Session(client_id, access=RULES.for_client(client_id), admin=admin)


def harness() -> Harness:
    h = Harness()
    h.broker.rules = RULES
    return h


READS = {
    "listen": lambda h, s, ch: h.subscribe(s, kind="listen", patterns=ch),
    "consume": lambda h, s, ch: h.subscribe(s, patterns=ch),
    "add_id": lambda h, s, ch: (h.subscribe(s, 7, patterns="orders/v1/*", group="o"),
                                h.broker.add_pattern(s, 7, ch, h.now)),
    "range read": lambda h, s, ch: h.broker.check_read(s, ch),  # what app.read_range calls
    "offsets": lambda h, s, ch: h.broker.offsets(s, [ch]),
    "position": lambda h, s, ch: h.broker.set_position(s, "p", {ch: 1}, h.now),
    "dead letters": lambda h, s, ch: h.subscribe(s, patterns="_dead/" + ch),
}


@pytest.mark.parametrize("route", list(READS))
def test_every_read_claims_and_then_refuses_the_others(route: str) -> None:
    h = harness()
    first, second = session("first"), session("second")
    READS[route](h, first, "invoice/v1/1")
    assert h.broker.reservations == {"invoice/v1/1": "first"}
    assert h.broker.take_writes().reservations == {"invoice/v1/1": "first"}  # durable
    for name, read in READS.items():
        with pytest.raises(NotAuthorized, match="reserved by client 'first'"):
            read(h, second, "invoice/v1/1")
        assert h.broker.reservations == {"invoice/v1/1": "first"}, name
    assert h.broker.read_refusals["invoice/v1/1"][1] == "second"


def test_a_refused_read_claims_nothing_and_admins_claim_nothing() -> None:
    h = harness()
    with pytest.raises(NotAuthorized):
        h.subscribe(session("c"), patterns=["invoice/v1/1", "secret/v1/1"])
    with pytest.raises(BadRequest):
        h.subscribe(session("c"), patterns="invoice/v1/1", prefetch=-1)
    h.subscribe(session("root", admin=True), patterns="invoice/v1/1")
    assert h.broker.reservations == {}


def test_dead_letters_follow_their_channel() -> None:
    h = harness()
    owner, audit = session("owner"), session("audit")
    h.subscribe(owner, patterns="invoice/v1/1")
    message = "'_dead/invoice/v1/1' \\(the dead letters of 'invoice/v1/1'\\) is reserved"
    with pytest.raises(NotAuthorized, match=message):
        h.subscribe(audit, patterns="_dead/invoice/v1/1")
    with pytest.raises(NotAuthorized, match="dead letters of !invoice"):
        h.subscribe(audit, patterns="_dead/invoice/v1/*")
    h.subscribe(owner, 2, patterns="_dead/invoice/v1/1")
    assert h.broker.may_read(owner, "_dead/invoice/v1/1")
    assert not h.broker.may_read(audit, "_dead/invoice/v1/1")


def test_an_exclusive_channel_is_not_positioned_into_a_shared_group() -> None:
    h = harness()
    h.subscribe(session("other"), patterns="orders/v1/*", group="g")
    with pytest.raises(NotAuthorized, match="member, client 'other'"):
        h.broker.set_position(session("me"), "g", {"invoice/v1/1": 1}, h.now)
    assert h.broker.reservations == {}


def test_a_durable_listener_is_checked_again_when_joined() -> None:
    h = harness()
    me = session("me")
    h.subscribe(me, kind="listen", patterns="invoice/v1/1", name="n")
    h.broker.unsubscribe(me, 1, h.now)
    h.broker.release("invoice/v1/1")
    h.subscribe(session("thief"), kind="listen", patterns="invoice/v1/1")  # claims it
    # Joining the listener by another of its patterns still reads invoice/v1/1.
    with pytest.raises(NotAuthorized, match="listener 'n' also reads 'invoice/v1/1'"):
        h.subscribe(me, kind="listen", patterns="orders/v1/1", name="n")


def test_release_waits_for_live_readers_to_go() -> None:
    h = harness()
    owner = session("owner")
    h.subscribe(owner, patterns="invoice/v1/1")
    with pytest.raises(BadRequest, match="still read by client 'owner'"):
        h.broker.release("invoice/v1/1")
    h.disconnect(owner)
    assert h.broker.release("invoice/v1/1") == "owner"


def test_offsets_through_a_wildcard_hide_exclusive_channels() -> None:
    h = Harness()  # no rules: the wildcard is allowed, the filter still applies
    h.broker.reservations = {"invoice/v1/1": "owner"}
    h.publish(send("invoice/v1/1", 1), send("invoice/v1/2", 2))
    assert set(h.broker.offsets(Session("x"), ["invoice/v1/*"])) == {"invoice/v1/2"}
    assert set(h.broker.offsets(Session("owner"), ["invoice/v1/*"])) == {
        "invoice/v1/1", "invoice/v1/2"}


# -------------------------------------------------------------------- names
def test_listener_keys_cannot_collide() -> None:
    pairs = [("team", "x:feed"), ("team:x", "feed"), ("a%3Ab", "n"), ("a:b", "n"),
             ("a", "b:n"), ("a:b:", "n")]
    keys = [listen_group_key(c, n) for c, n in pairs]
    assert len(set(keys)) == len(keys)
    assert listen_group_key("app-1", "orders/v1/*") == "listen:app-1:orders/v1/*"  # unchanged


@pytest.mark.parametrize(("registered", "want"), [
    ({"a:b"}, "listen:a%3Ab:n"),  # one registered id could have made it
    ({"a"}, "listen:a:b:n"),
    (set(), "listen:a:b:n"),  # none: what the old version gave "a"
    ({"a", "a:b"}, LEGACY_LISTEN_PREFIX + "a:b:n"),  # both: nobody's
])
def test_older_listener_keys_migrate_by_the_registered_ids(registered: set[str],
                                                           want: str) -> None:
    colon = [c for c in registered if ":" in c]
    assert migrate_listen_key("listen:a:b:n", registered, colon) == want
    assert migrate_listen_key("consume:a:b", registered, colon) == "consume:a:b"


def test_the_migration_renames_stored_listeners_once(tmp_path: Path) -> None:
    storage = SQLiteStorage(tmp_path)
    try:
        storage.open(0.0)
        h = Harness(storage=storage)
        h.subscribe(Session("a:b"), kind="listen", patterns="orders/v1/*", name="n")
        h.publish(send("orders/v1/1", 1), commit=False)
        batch = h.broker.take_writes()
        # As an older version stored it: the unescaped key, no marker.
        batch.group_defs = {"listen:a:b:n": h.broker.groups["listen:a%3Ab:n"].definition()}
        batch.group_states = {("listen:a:b:n", k[1]): v for k, v in batch.group_states.items()}
        storage.apply(batch)
        broker = Broker()
        broker.restore(storage.open(1.0), 1.0)
        assert "listen:a:b:n" in broker.groups
        assert broker.migrate_listen_keys({"a:b"}) == {"listen:a:b:n": "listen:a%3Ab:n"}
        storage.apply(broker.take_writes())
        again = Broker()
        snap = storage.open(2.0)
        assert snap.meta[LISTEN_KEYS_META] == "escaped"
        again.restore(snap, 2.0)
        assert set(again.groups) == {"listen:a%3Ab:n"}
        assert again.groups["listen:a%3Ab:n"].gcs["orders/v1/1"] is not None
        # The marker is stored: later starts rename nothing, whoever registers.
        assert again.migrate_listen_keys({"a:b", "a"}) == {}
    finally:
        storage.close()


def test_a_message_id_whose_hash_two_channels_share_names_neither() -> None:
    h = Harness()
    one = h.publish(send("orders/v1/1", 1))[0]
    h.publish(send("orders/v1/2", 2))
    assert h.broker.find_message(one.id) == (h.broker.channels["orders/v1/1"], 1)
    forged = h.broker.channels["orders/v1/2"]  # as if someone had found a collision
    forged.id_hash = h.broker.channels["orders/v1/1"].id_hash
    h.broker.state.ids.by_hash[forged.id_hash].append(forged.name)
    with pytest.raises(UnknownDelivery, match="ambiguous"):
        h.broker.find_message(one.id)


def test_fences_stored_without_an_owner_go_to_the_first_committer() -> None:
    broker = Broker()
    broker.restore(Snapshot(fences=[("job", "out/v1/1", 5)]), 0.0)  # an older version's
    h = Harness(broker=broker)
    first, second = Session("first"), Session("second")
    broker.stage(first, "t", [send("out/v1/1", 1)], h.now)
    result = broker.commit_txns(first, "job", 5, ["t"], h.now)
    assert result["discarded"] == 1  # the old fence still holds: a replay
    assert broker.take_writes().writers == {"job": "first"}
    broker.stage(second, "t", [send("out/v1/1", 2)], h.now)
    with pytest.raises(NotAuthorized, match="writer id 'job' belongs to client 'first'"):
        broker.commit_txns(second, "job", 2**62, ["t"], h.now)
    assert broker.transactions.fences == {("job", "out/v1/1"): 5}  # not moved
    assert broker.release_writer("job", drop_fences=True) == "first"
    assert broker.transactions.fences == {} and broker.transactions.writers == {}
    assert broker.commit_txns(second, "job", 1, ["t"], h.now)["published"] == 1


# ------------------------------------------------- reservations over time
def restart(h: Harness) -> Harness:
    """Stop ``h`` (its uncommitted batch is lost) and start again on its storage."""
    assert isinstance(h.storage, MemoryStorage)
    h.storage.close()
    storage = MemoryStorage(h.storage.name)
    broker = Broker()
    broker.rules = RULES
    broker.restore(storage.open(h.now + 1.0), h.now + 1.0)
    return Harness(broker=broker, storage=storage, now=h.now + 1.0)


def test_a_reservation_and_its_release_survive_a_restart() -> None:
    h = harness()
    owner, other = session("owner"), session("other")
    h.broker.check_read(owner, "invoice/v1/1")
    h.broker.check_read(owner, "invoice/v1/2")
    h.commit()
    h = restart(h)
    # Still the owner's: the others are refused, the owner reads (and claims nothing new).
    with pytest.raises(NotAuthorized) as refused:
        h.broker.check_read(other, "_dead/invoice/v1/1")
    assert refused.value.detail == {"channel": "_dead/invoice/v1/1", "owner": "owner"}
    h.broker.check_read(owner, "invoice/v1/1")
    assert h.broker.take_writes().reservations == {}
    # Released, and the release made durable: the next reader claims it, even after a
    # restart; the other reservation stays.
    assert h.broker.release("invoice/v1/1") == "owner"
    h.commit()
    h = restart(h)
    assert h.broker.reservations == {"invoice/v1/2": "owner"}
    h.broker.check_read(other, "invoice/v1/1")
    assert h.broker.reservations == {"invoice/v1/1": "other", "invoice/v1/2": "owner"}


def test_release_of_a_free_channel_changes_nothing() -> None:
    h = harness()
    h.subscribe(session("reader"), patterns="orders/v1/1")  # not exclusive: no reservation
    assert h.broker.release("orders/v1/1") is None  # a live reader does not matter
    assert h.broker.release("invoice/v1/1") is None
    assert h.broker.take_writes().reservations == {}


def test_release_waits_for_a_live_reader_of_the_dead_letters_but_not_for_an_admin() -> None:
    h = harness()
    owner = session("owner")
    h.subscribe(owner, patterns="_dead/invoice/v1/1")  # claims the channel too
    h.subscribe(session("root", admin=True), patterns="invoice/v1/1")
    with pytest.raises(BadRequest) as refused:
        h.broker.release("invoice/v1/1")
    assert refused.value.detail == {"channel": "invoice/v1/1", "client": "owner"}
    assert h.broker.reservations == {"invoice/v1/1": "owner"}
    h.broker.unsubscribe(owner, 1, h.now)
    assert h.broker.release("invoice/v1/1") == "owner"  # the admin still reads: fine
    assert h.broker.take_writes().reservations == {"invoice/v1/1": None}


def test_the_receipt_check_is_the_read_check_without_claiming() -> None:
    """What a receipt asks (server/http_api.py): may this client read the channel?"""
    h = harness()
    owner, other = session("owner"), session("other")
    assert h.broker.read_refusal(other, "invoice/v1/1") is None  # free: anyone may
    assert h.broker.reservations == {}  # and asking claims nothing
    h.broker.check_read(owner, "invoice/v1/1")
    refusal = h.broker.read_refusal(other, "invoice/v1/1")
    assert refusal is not None and refusal.code == ErrorCode.NOT_AUTHORIZED
    assert refusal.detail == {"channel": "invoice/v1/1", "owner": "owner"}
    assert h.broker.read_refusal(owner, "invoice/v1/1") is None
    assert h.broker.read_refusal(session("root", admin=True), "invoice/v1/1") is None
    by_rules = h.broker.read_refusal(other, "secret/v1/1")
    assert by_rules is not None and by_rules.code == ErrorCode.NOT_AUTHORIZED
    assert h.broker.read_refusals == {}  # asking is not a refused read


def test_a_migrated_listener_keeps_its_place_and_the_other_groups_theirs() -> None:
    storage = MemoryStorage("migrate")
    MemoryStorage.forget("migrate")
    storage = MemoryStorage("migrate")
    storage.open(0.0)
    h = Harness(storage=storage)
    s = Session("a:b")
    sub = h.subscribe(s, kind="listen", patterns="orders/v1/*", name="n", prefetch=10)
    h.subscribe(Session("c"), patterns="orders/v1/1", group="g")
    h.publish(send("orders/v1/1", 1), send("orders/v1/1", 2))
    h.ack(s, h.take(sub)[:1])  # the listener has settled message 1
    h.commit()
    # As an older version stored it: the unescaped key, no marker.
    grp = h.broker.groups["listen:a%3Ab:n"]
    batch = WriteBatch()
    batch.group_defs = {"listen:a%3Ab:n": None, "listen:a:b:n": grp.definition()}
    batch.group_states = {("listen:a%3Ab:n", "orders/v1/1"): None,
                          ("listen:a:b:n", "orders/v1/1"): grp.gcs["orders/v1/1"].durable_state()}
    storage.apply(batch)
    h = restart(h)
    assert h.broker.migrate_listen_keys({"a:b"}) == {"listen:a:b:n": "listen:a%3Ab:n"}
    assert h.broker.migrate_listen_keys({"a:b", "a"}) == {}  # once: asking again renames none
    assert set(h.broker.groups) == {"listen:a%3Ab:n", "consume:g"}
    assert h.broker.groups["listen:a%3Ab:n"].key == "listen:a%3Ab:n"
    h.commit()
    h = restart(h)
    s = Session("a:b")
    sub = h.subscribe(s, kind="listen", patterns="orders/v1/*", name="n", prefetch=10)
    got = h.take(sub)
    assert [d.seq for d in got] == [2]  # 1 was settled before the migration
    h.ack(s, got)
    h.commit()
    h = restart(h)
    sub = h.subscribe(Session("a:b"), kind="listen", patterns="orders/v1/*", name="n")
    assert h.take(sub) == []  # settled under the new key too
