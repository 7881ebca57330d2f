"""Queues that come and go while the broker runs (core/ownership.py, Restorer.adopt).

A rich stored state over three queues (groups spanning them, acks, delayed retries,
priorities, dead letters, dedup keys, numbered producers, Spark fences) is built by a
real engine over a memory storage. Then:

* restoring it whole, and restoring its shared part then adopting each queue (in any
  order), build the same memory;
* releasing a queue forgets all of it and nothing else; adopting what storage holds
  then gives it back as stored, and it serves as before;
* what a release leaves behind never answers for the queue again (dedup, producers,
  delivery tags).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from minou.auth.rules import ALLOW_ALL
from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions, Msg
from minou.core.ownership import QueueBusy, batch_touches
from minou.core.snapshot import Snapshot, queue_of, queue_part, shared_part
from minou.core.writes import WriteBatch
from minou.storage.memory import MemoryStorage

from .helpers import Harness, payloads, send, seqs

QUEUES = ("orders/v1", "prices/v2", "audit/v1")
CHANNELS = ("orders/v1/1", "orders/v1/2", "prices/v2/eu", "audit/v1/x")
DEDUP = [(c, f"k{i}") for c in CHANNELS for i in range(3)]
_names = itertools.count()


def _options(key: str) -> ChannelOptions:
    return ChannelOptions(requeue_limit=1) if key == "audit/v1" else ChannelOptions()


def _store() -> MemoryStorage:
    name = f"ownership-{next(_names)}"
    MemoryStorage.forget(name)
    st = MemoryStorage(name)
    st.open(0.0)
    return st


def _built() -> Harness:
    """A stored state that touches every part a queue owns."""
    h = Harness(storage=_store(), channel_options=_options)
    a, b, p = Session("a"), Session("b"), Session("p", producer_id="00000000000000aa")
    wide = h.subscribe(a, 1, patterns=["orders/*", "prices/*", "audit/*"], group="wide",
                       prefetch=50)
    narrow = h.subscribe(b, 1, patterns="orders/v1/*", group="narrow", prefetch=50)
    h.subscribe(b, 2, kind="listen", patterns="prices/v2/*", name="ticker")
    for c in CHANNELS:
        h.publish(*(send(c, i, dedup=f"k{i}") for i in range(3)))
    h.publish(send("orders/v1/1", "urgent", priority=5),
              send("prices/v2/eu", "later", delay=500.0))
    h.engine.publish([send(c, f"n{c}", pseq=1) for c in CHANNELS], ALLOW_ALL,
                     lambda *_: None, session=p, publisher=h)
    h.commit()
    got = h.take(wide)
    h.ack(a, [d for d in got if d.seq % 2 == 0 and d.channel != "audit/v1/x"])
    h.nack(a, [d for d in got if d.seq == 1 and d.channel == "orders/v1/2"], delay=100.0)
    h.nack(a, [d for d in got if d.channel == "audit/v1/x"][:1])  # limit 1: dead letter
    h.ack(b, h.take(narrow)[:2])
    w = Session("spark")
    h.broker.stage(w, "t", [send("orders/v1/2", "txn"), send("audit/v1/x", "txn")], h.now)
    h.broker.commit_txns(w, "job", 7, ["t"], h.now)
    h.disconnect(a)
    h.disconnect(b)
    h.commit()
    h.commit()
    return h


def _fingerprint(b: Broker, now: float) -> dict[str, Any]:
    """What memory holds, in a form two brokers can be compared by."""
    st = b.state
    groups = {}
    for key, g in st.groups.items():
        gcs = {name: (gc.cursor, gc.floor, sorted({*gc.acked, *gc.acked_runs}),
                      sorted(gc.attempts.items()), sorted(gc.delayed), sorted(gc.front),
                      sorted(gc.back), sorted(gc.prio), sorted(gc.sched), sorted(gc.skip))
               for name, gc in g.gcs.items()}
        groups[key] = (g.kind, [p.text for p in g.patterns], gcs)
    return {
        "channels": {n: (lg.first_seq, lg.end, lg.next_seq, lg.count, sorted(lg.gone),
                         sorted(lg.special.items()), len(lg.states))
                     for n, lg in st.channels.items()},
        "groups": groups,
        "timed": sorted((gc.group.key, gc.log.name) for gc in st.timed),
        "dirty": sorted((gc.group.key, gc.log.name) for gc in st.dirty),
        "producers": sorted(s.row() for s in st.producers.states.values()),
        "fences": dict(st.transactions.fences),
        "writers": dict(st.transactions.writers),
        "dedup": {k: st.dedup.get(*k, now) for k in DEDUP},
        "ids": {n: b.find_message(b.new_id(lg, 1)) is not None for n, lg in st.channels.items()},
    }


def _whole(snap: Snapshot, now: float) -> Broker:
    b = Broker(channel_options=_options)
    b.restore(snap, now)
    return b


@pytest.fixture(scope="module")
def stored() -> tuple[Snapshot, float]:
    h = _built()
    now = h.now + 1.0
    return h.storage.open(now), now


def test_the_stored_state_is_rich_enough_to_mean_something(stored) -> None:
    snap, now = stored
    assert {queue_of(c.name) for c in snap.channels} == set(QUEUES)
    assert any(c.name.startswith("_dead/audit/v1/") for c in snap.channels)
    assert snap.specials and snap.dedup and snap.producers and snap.fences
    assert {g for g, *_ in snap.group_states} == {"consume:wide", "consume:narrow",
                                                   "listen:b:ticker"}
    fp = _fingerprint(_whole(snap, now), now)
    assert any(gc[4] for gc in fp["groups"]["consume:wide"][2].values())  # a delayed retry
    assert fp["timed"]


@pytest.mark.parametrize("order", list(itertools.permutations(QUEUES)))
def test_shared_part_then_each_queue_adopted_is_the_whole_restore(stored, order) -> None:
    snap, now = stored
    b = Broker(channel_options=_options)
    b.restore(shared_part(snap), now)
    assert b.channels == {}
    for q in order:
        new = b.adopt(queue_part(snap, q), now)
        assert {queue_of(lg.name) for lg in new} == {q}
    assert _fingerprint(b, now) == _fingerprint(_whole(snap, now), now)


@pytest.mark.parametrize("queue", QUEUES)
def test_a_release_forgets_that_queue_alone(stored, queue) -> None:
    snap, now = stored
    b = _whole(snap, now)
    others = Broker(channel_options=_options)
    others.restore(shared_part(snap), now)
    for q in QUEUES:
        if q != queue:
            others.adopt(queue_part(snap, q), now)
    assert queue in b.held_queues()
    b.release_queue(queue, now)
    assert queue not in b.held_queues()
    assert b.held_queues() == set(QUEUES) - {queue}
    assert _fingerprint(b, now) == _fingerprint(others, now)


@pytest.mark.parametrize("queue", QUEUES)
def test_released_then_adopted_again_is_as_stored(stored, queue) -> None:
    snap, now = stored
    b = _whole(snap, now)
    b.release_queue(queue, now)
    b.adopt(queue_part(snap, queue), now)
    assert _fingerprint(b, now) == _fingerprint(_whole(snap, now), now)


def test_a_queue_with_uncommitted_writes_cannot_be_released() -> None:
    h = _built()
    h.publish(send("orders/v1/1", "pending"), commit=False)
    with pytest.raises(QueueBusy, match="orders/v1"):
        h.broker.release_queue("orders/v1", h.now)
    h.broker.release_queue("prices/v2", h.now)  # another queue is free to go
    h.commit()
    h.broker.release_queue("orders/v1", h.now)
    assert h.broker.held_queues() == {"audit/v1"}


def test_deliveries_of_a_released_queue_settle_nothing_and_credit_comes_back() -> None:
    h = _built()
    a = Session("a2")
    sub = h.subscribe(a, 1, patterns=["orders/*", "prices/*"], group="fresh", prefetch=3)
    got = h.take(sub)
    assert len(got) == 3 and sub.credit == 0
    ours = [d for d in got if d.channel.startswith("orders/")]
    assert ours  # the round robin over channels reached orders/ first
    h.commit()
    assert h.broker.release_queue("orders/v1", h.now) == len(ours)
    assert sub.credit == len(ours)
    refused = h.ack(a, ours)
    assert [code for _, code, _ in refused] and len(refused) == len(ours)
    more = h.take(sub)
    assert more and all(d.channel.startswith("prices/") for d in more)


def test_after_a_release_nothing_of_that_queue_answers_for_it() -> None:
    """Dedup keys and producer sequences are the new owner's to answer: a broker that
    got the queue back must not find its own older entries (the owner in between may
    have stored other messages under them)."""
    h = _built()
    now = h.now
    key = ("orders/v1/1", "k1")
    assert h.broker.dedup.get(*key, now) is not None
    p = Session("p", producer_id="00000000000000aa")
    h.engine.publish([send("orders/v1/1", "n2", pseq=2)], ALLOW_ALL, lambda *_: None,
                     session=p, publisher=h)
    h.commit()
    known = p.producer_states["orders/v1/1"]
    h.broker.release_queue("orders/v1", now)
    assert h.broker.dedup.get(*key, now) is None
    assert h.broker.producers.states.get(known.key) is None
    # The queue comes back with nothing stored for the key or the producer (another
    # owner's window let them go): this broker answers as storage says, not as it
    # remembered.
    bare = queue_part(h.storage.open(now), "orders/v1")
    bare.dedup, bare.producers = [], []
    h.broker.adopt(bare, now)
    assert h.broker.dedup.get(*key, now) is None
    (o,) = h.publish(send("orders/v1/1", "again", dedup="k1"))
    assert not o.duplicate
    h.engine.publish([send("orders/v1/1", "n5", pseq=5)], ALLOW_ALL, lambda *_: None,
                     session=p, publisher=h)
    h.commit()
    state = h.broker.producers.states[known.key]
    assert state is not known and state.last == 5  # started afresh, not from 2


def test_a_released_bucket_no_longer_counts_against_the_kv_bounds() -> None:
    """Buckets are one queue (_kv/v1) that spread brokers hand on: the revisions and
    keys a broker no longer holds must not count against MAX_KV_REVISIONS_TOTAL and
    MAX_KV_KEY_BYTES (else each hand-over and adoption counted them once more)."""
    h = _built()
    h.publish(send("_kv/v1/config", 1, key="limit"), send("_kv/v1/config", 2, key="limit"),
              send("_kv/v1/flags", True, key="dark-mode"))
    h.commit()
    count = h.broker.state.kv_count
    assert count.total == 2
    snap = h.storage.open(h.now)
    for _ in range(2):
        h.broker.release_queue("_kv/v1", h.now)
        assert count.total == 0 and count.key_bytes == 0
        h.broker.adopt(queue_part(snap, "_kv/v1"), h.now)
        for name in ("_kv/v1/config", "_kv/v1/flags"):
            log = h.broker.channels[name]
            h.broker.index_bucket(name, h.storage.read_range(name, log.first_seq, log.end,
                                                             100))
        assert count.total == 2 and count.key_bytes == len("limit") + len("dark-mode")


def test_an_adopted_queue_serves_its_groups_members_at_once() -> None:
    h = _built()
    snap = h.storage.open(h.now)
    h.broker.release_queue("orders/v1", h.now)
    c = Session("c")
    sub = h.subscribe(c, 1, patterns=["orders/*"], group="narrow", prefetch=100)
    assert h.take(sub) == []  # nothing of orders/v1 is here
    h.broker.adopt(queue_part(snap, "orders/v1"), h.now)
    got = h.take(sub)
    assert got and {d.channel for d in got} <= {"orders/v1/1", "orders/v1/2"}
    first = [d for d in got if d.channel == "orders/v1/1"]
    assert payloads(first)[0] == "urgent"  # its priority restored with the queue
    assert seqs(first)[0] > seqs(first)[1]


def test_adopting_a_queue_held_already_is_refused(stored) -> None:
    snap, now = stored
    b = _whole(snap, now)
    with pytest.raises(ValueError, match="held already"):
        b.adopt(queue_part(snap, "orders/v1"), now)


def test_a_frozen_queue_delivers_nothing_more_until_thawed_and_counts_what_is_out() -> None:
    h = _built()
    a = Session("a3")
    sub = h.subscribe(a, 1, patterns=["orders/*", "prices/*"], group="fresh2", prefetch=2)
    first = h.take(sub)
    out = [d for d in first if d.channel.startswith("orders/")]
    assert h.broker.freeze_queue("orders/v1") == len(out)
    h.ack(a, first)
    assert h.broker.freeze_queue("orders/v1") == 0  # settled: nothing is out any more
    got = []
    while more := h.take(sub):
        got += more
        h.ack(a, more)
    assert got and all(d.channel.startswith("prices/") for d in got)
    h.broker.freeze_queue("orders/v1", False)
    thawed = h.take(sub)
    assert thawed and all(d.channel.startswith("orders/") for d in thawed)


# What a release must wait for: every kind of write a batch can hold of the queue (and
# none of another queue's holds it back).
def _batch_with(kind: str, channel: str) -> WriteBatch:
    b = WriteBatch()
    if kind == "messages":
        b.messages.append(Msg(channel, 1, "id", b"x"))
    elif kind == "deletes":
        b.deletes.append((channel, 1))
    elif kind == "truncates":
        b.truncates[channel] = 5
    elif kind == "channels":
        b.channels[channel] = 1
    elif kind == "group_states":
        b.group_states[("g", channel)] = None
    elif kind == "dedup":
        b.dedup.append((channel, "k", 1.0, 1, "id"))
    elif kind == "fences":
        b.fences[("writer", channel)] = 3
    elif kind == "producers":
        b.producers[("client", "producer", channel)] = None
    return b


@pytest.mark.parametrize("kind", ["messages", "deletes", "truncates", "channels",
                                  "group_states", "dedup", "fences", "producers"])
def test_a_batch_touches_a_queue_through_each_kind_of_write_and_only_its_own(kind) -> None:
    ours, theirs = {"orders/v1/1", "_dead/orders/v1/1"}, {"prices/v2/eu"}
    for channel in sorted(ours):
        assert batch_touches(_batch_with(kind, channel), ours), (kind, channel)
        assert not batch_touches(_batch_with(kind, channel), theirs), (kind, channel)
    assert not batch_touches(WriteBatch(), ours)


def test_an_unsettled_ack_or_a_producer_state_not_yet_stored_holds_a_release() -> None:
    h = _built()
    a = Session("a4")
    sub = h.subscribe(a, 1, patterns=["orders/*", "prices/*"], group="fresh3", prefetch=50)
    got = h.take(sub)
    h.commit()
    # An ack staged, not committed: the group's state of that channel is dirty.
    h.ack(a, [d for d in got if d.channel == "orders/v1/1"][:1])
    assert h.broker.queue_pending("orders/v1")
    assert not h.broker.queue_pending("prices/v2")
    with pytest.raises(QueueBusy):
        h.broker.release_queue("orders/v1", h.now)
    h.commit()
    assert not h.broker.queue_pending("orders/v1")
    # A producer's state not yet written (its sequence came with a publish since
    # committed, and it is dirty again) holds the queue of its channel only.
    p = Session("p5", producer_id="00000000000000bb")
    h.engine.publish([send("audit/v1/x", "n", pseq=1)], ALLOW_ALL, lambda *_: None,
                     session=p, publisher=h)
    assert h.broker.queue_pending("audit/v1") and not h.broker.queue_pending("prices/v2")
    h.commit()
    assert not h.broker.queue_pending("audit/v1")
    # ... or dropped as idle, its row's deletion not yet written (a queue no producer
    # numbered its publishes to has nothing to wait for).
    h.publish(send("spare/v1/1", "plain"))
    assert h.broker.producers.expire(h.now + 10 * 86400.0) >= 1
    assert h.broker.queue_pending("audit/v1") and not h.broker.queue_pending("spare/v1")
    h.commit()
    assert not h.broker.queue_pending("audit/v1")
    assert not h.broker.queue_pending("nothing/v9")  # a queue memory does not hold
    h.broker.release_queue("audit/v1", h.now)


def test_a_queue_whose_groups_have_nothing_to_deliver_is_released_too() -> None:
    h = Harness(storage=_store())
    a = Session("idle")
    sub = h.subscribe(a, 1, patterns="orders/v1/*", group="g", prefetch=10)
    h.publish(send("orders/v1/1", 1))
    h.ack(a, h.take(sub))
    h.commit()
    assert h.take(sub) == []  # its group channel is idle: nothing ready
    assert h.broker.release_queue("orders/v1", h.now) == 0
    assert h.broker.held_queues() == set()


def test_adopted_queues_bring_the_groups_another_broker_made_since_this_one_started(
        stored) -> None:
    """The shared part was read before other brokers' readers made the groups: each
    adopted queue's part defines them, and memory ends as a whole restore's."""
    snap, now = stored
    b = Broker(channel_options=_options)
    b.restore(dataclasses.replace(shared_part(snap), groups=[]), now)
    assert b.state.groups == {}
    for q in QUEUES:
        b.adopt(queue_part(snap, q), now)
    assert _fingerprint(b, now) == _fingerprint(_whole(snap, now), now)


def test_a_queue_released_adopted_and_released_again_answers_for_none_of_its_keys(
        stored) -> None:
    snap, now = stored
    b = _whole(snap, now)
    key = ("orders/v1/1", "k1")
    for _ in range(2):
        b.release_queue("orders/v1", now)
        assert b.dedup.get(*key, now) is None
        b.adopt(queue_part(snap, "orders/v1"), now)
        assert b.dedup.get(*key, now) is not None  # as stored, once more
    b.release_queue("orders/v1", now)
    assert b.dedup.get(*key, now) is None


def test_a_message_id_of_an_adopted_queue_is_found_again() -> None:
    h = _built()
    (o,) = h.publish(send("orders/v1/1", "by id"))
    assert h.broker.find_message(o.id) is not None  # every channel's hash is known now
    snap = h.storage.open(h.now)
    h.broker.release_queue("orders/v1", h.now)
    assert h.broker.find_message(o.id) is None
    h.broker.adopt(queue_part(snap, "orders/v1"), h.now)
    found = h.broker.find_message(o.id)
    assert found is not None and found[0].name == "orders/v1/1"
    # A broker that started with no queue and looked an id up before adopting one
    b = Broker(channel_options=_options)
    b.restore(shared_part(snap), h.now)
    assert b.find_message(o.id) is None
    b.adopt(queue_part(snap, "orders/v1"), h.now)
    found = b.find_message(o.id)
    assert found is not None and found[0].name == "orders/v1/1"


def test_the_shared_part_and_the_queue_parts_hold_every_stored_row_once() -> None:
    """What ``Storage.open_shared`` and ``open_queue`` hand over (queues spread over
    brokers): each stored row goes to the queue its channel belongs to (a dead-letter
    channel's to its source queue), or to the shared part if it names no one queue (a
    pattern's dedup keys, clients, tokens, staged transactions...); group definitions go
    to both (a queue's group states are read through them)."""
    from minou.core.group import GroupDef
    from minou.core.snapshot import ChannelRecord
    from minou.core.stream_ids import point_key

    chans = ["orders/v1/1", "_dead/orders/v1/1", "Xp/v1/X", "orders/v2/1"]
    groups = [GroupDef("consume:g", "consume", ["orders/*"])]
    snap = Snapshot(
        channels=[ChannelRecord(c, 2, 1, 1) for c in chans],
        specials=[(c, 1, 5, None) for c in chans],
        groups=groups,
        group_states=[("consume:g", c, 1, b"") for c in chans],
        dedup=[(c, "k", 9.0, 1, "id") for c in [*chans, "orders/v1/*", "orders/v1/>"]],
        clients=[b"client"], credentials=[b"credential"], reservations={"orders/v1/1": "c"},
        fences=[("w", c, 3) for c in chans], writers={"w": "c"},
        meta={**{point_key(c, 1): "1-0" for c in chans}, "listen_keys": "2"},
        used_tokens=[("jti", 9.0)],
        producers=[("p", 0, c, 1) for c in chans],
        staged=[("c", "t", 0, [], 1.0)],
    )
    queues = {queue_of(c) for c in chans}
    assert queues == {"orders/v1", "Xp/v1", "orders/v2"}
    assert queue_of("orders/v1/*") is None and queue_of("_dead/orders/v1/>") is None
    parts = [shared_part(snap)] + [queue_part(snap, q) for q in sorted(queues)]
    for f in dataclasses.fields(Snapshot):
        whole = getattr(snap, f.name)
        got = [getattr(p, f.name) for p in parts]
        if f.name == "groups":
            assert all(g == groups for g in got)
        elif isinstance(whole, dict):
            merged: dict[str, str] = {}
            for g in got:
                assert not merged.keys() & g.keys(), f.name
                merged.update(g)
            assert merged == whole, f.name
        else:
            assert sorted(map(repr, (x for g in got for x in g))) == sorted(map(repr, whole)), \
                f.name
    orders = queue_part(snap, "orders/v1")
    assert [c.name for c in orders.channels] == ["orders/v1/1", "_dead/orders/v1/1"]
    assert list(orders.meta) == [point_key("orders/v1/1", 1), point_key("_dead/orders/v1/1", 1)]
    assert [d[0] for d in shared_part(snap).dedup] == ["orders/v1/*", "orders/v1/>"]


def test_a_released_queues_delayed_messages_leave_the_broker_wide_bound(monkeypatch) -> None:
    """Priority and delayed messages are bounded over every channel of a broker: a
    queue released takes its own with it, and the room they held is free again."""
    from minou.core import state as state_mod
    from minou.errors import QueueFull

    monkeypatch.setattr(state_mod, "MAX_SCHEDULED_MESSAGES", 3)
    h = Harness(storage=_store())
    h.publish(send("orders/v1/1", 1, delay=500.0), send("orders/v1/1", 2, priority=5))
    with pytest.raises(QueueFull):
        h.broker.state.check_scheduled_room(2)
    h.broker.release_queue("orders/v1", h.now)
    outs = h.publish(*(send("prices/v2/eu", i, delay=500.0) for i in range(3)))
    assert [o.code for o in outs] == [0, 0, 0]
    (over,) = h.publish(send("prices/v2/eu", 9, delay=500.0))
    assert over.code != 0
