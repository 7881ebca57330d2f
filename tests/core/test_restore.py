"""Restart: every batch goes to a real storage (SQLite, and its memory twin), then a
fresh Broker restores from it.

After a restore no message body is in memory, so the first deliveries go through the
NeedLoad -> engine.Load -> storage.read_range -> engine.loaded round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from minou.auth.rules import Rules
from minou.core.broker import Broker, Session
from minou.core.group import Group, GroupDef
from minou.core.log import ChannelOptions
from minou.errors import BadRequest, NotAuthorized
from minou.protocol.frames import Send
from minou.server import engine
from minou.storage.base import ChannelRecord, Snapshot, Storage
from minou.storage.memory import MemoryStorage
from minou.storage.sqlite import SQLiteStorage

from .helpers import Harness, js, payloads, send, seqs

CH = "orders/v1/1"
_opened: list[Storage] = []
_kind = ["sqlite"]


@pytest.fixture(autouse=True, params=["sqlite", "memory"])
def _backend(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs on both backends, restarting on the same place."""
    _kind[0] = request.param
    yield
    while _opened:
        _opened.pop().close()


def _new(path: Path) -> Storage:
    st: Storage = SQLiteStorage(path) if _kind[0] == "sqlite" else MemoryStorage(str(path))
    _opened.append(st)
    return st


def _storage(path: Path) -> Storage:
    if _kind[0] == "memory":
        MemoryStorage.forget(str(path))
    st = _new(path)
    st.open(0.0)
    return st


def _restart(h: Harness, path: Path, *, after: float = 1.0, **broker_kw) -> Harness:
    """Drop ``h`` (as a crash would: the uncommitted batch is lost) and restore."""
    assert h.storage is not None
    h.storage.close()
    now = h.now + after
    st = _new(path)
    broker = Broker(**broker_kw)
    broker.restore(st.open(now), now)
    return Harness(broker=broker, storage=st, now=now)


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(storage=_storage(tmp_path))


def test_unsettled_come_back_acked_do_not_and_bodies_load_from_storage(
    h: Harness, tmp_path: Path
) -> None:
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4, 5])
    got = h.take(sub)
    assert seqs(got) == [1, 2, 3, 4, 5]
    h.ack(a, [got[0], got[1], got[3]])
    h.commit()

    h2 = _restart(h, tmp_path)
    log = h2.broker.channels[CH]
    assert (log.first_seq, log.end, log.next_seq) == (3, 6, 6)  # 1 and 2 were truncated
    b = Session("b")
    sub2 = h2.subscribe(b, patterns=CH, group="g", prefetch=10)
    out, loads = h2.broker.pump(h2.now)
    assert out == {}
    assert [(need.log.name, need.seq) for need in loads] == [(CH, 3)]
    assert h2.broker.pump(h2.now) == ({}, [])  # one load in flight per channel
    h2.serve_load(engine.Load(CH, loads[0].seq, loads[0].log.cache_lo))
    out, loads = h2.broker.pump(h2.now)
    assert loads == []
    again = out[sub2]
    assert [(d.seq, d.attempts) for d in again] == [(3, 2), (5, 2)]
    assert payloads(again) == [3, 5]
    assert h2.ack(b, again) == []
    (o,) = h2.publish(send(CH, 6))
    assert o.seq == 6  # seqs are never reused
    assert seqs(h2.take(sub2)) == [6]


def test_a_backlog_read_back_in_pages_cut_at_their_byte_bound_is_delivered_whole(
        h: Harness, tmp_path: Path) -> None:
    """Pages stop at ``read_bytes`` (the server's STORAGE_READ_BYTES), short of their
    message limit: the next page starts after the last message read, not at the end of
    the range asked for."""
    h.publish_values(CH, ["x" * 1000 for _ in range(5)])
    h2 = _restart(h, tmp_path)
    h2.read_bytes = 2500  # two or three of these messages a page
    sub = h2.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert seqs(h2.take(sub)) == [1, 2, 3, 4, 5]
    assert len(h2.loads) > 1 and h2.loads[0].from_seq == 1


def test_messages_published_before_any_reader_survive(h: Harness, tmp_path: Path) -> None:
    h.publish(send(CH, "a", headers={"k": "v"}, key="key-1"), send(CH, "b"))
    h.publish(send(CH, "lost"), commit=False)  # never committed: not confirmed, not kept
    h2 = _restart(h, tmp_path)
    assert h2.broker.channels[CH].count == 2
    sub = h2.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    got = h2.take(sub)
    assert payloads(got) == ["a", "b"]
    assert (got[0].headers, got[0].key) == ({"k": "v"}, "key-1")
    assert len(h2.loads) == 1
    (o,) = h2.publish(send(CH, "c"))
    assert o.seq == 3


def test_group_cursor_survives_without_a_member(h: Harness, tmp_path: Path) -> None:
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2, 3, 4])
    h.ack(a, h.take(sub))
    h.disconnect(a)
    h.commit()
    h2 = _restart(h, tmp_path)
    assert h2.broker.groups["consume:g"].members == []
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert seqs(h2.take(sub2)) == [3, 4]


def test_attempts_survive(h: Harness, tmp_path: Path) -> None:
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1])
    for _ in range(3):
        h.nack(a, h.take(sub))
    h.commit()
    h2 = _restart(h, tmp_path)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g")
    (d,) = h2.take(sub2)
    assert (d.seq, d.attempts) == (1, 4)


def test_a_crash_never_brings_back_a_lower_attempt_count_than_a_reader_saw(
    h: Harness, tmp_path: Path
) -> None:
    """Each nack here comes before the commit storing the count it answers (the
    writer is slower than the reader): the message waits for that commit before it goes
    out again, so what a crash finds is never more than one delivery behind."""
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1])
    seen = 0
    for _ in range(3):
        got = h.take(sub)
        if not got:
            h.commit()  # the count is stored: now it goes out again
            got = h.take(sub)
        (d,) = got
        seen = max(seen, d.attempts)
        h.engine.settle(a, "nack", [d.tag], None)
    assert seen == 3
    h2 = _restart(h, tmp_path)  # the commit storing attempt 3 never happened
    (d,) = h2.take(h2.subscribe(Session("b"), patterns=CH, group="g"))
    assert d.attempts >= seen


def test_requeue_limit_counts_attempts_from_before_the_restart(
    h: Harness, tmp_path: Path
) -> None:
    opts = {"channel_options": lambda key: ChannelOptions(requeue_limit=2)}
    h.broker = Broker(**opts)
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g")
    h.publish_values(CH, [1])
    for _ in range(2):
        h.nack(a, h.take(sub))
    h.commit()
    h2 = _restart(h, tmp_path, **opts)
    b = Session("b")
    sub2 = h2.subscribe(b, patterns=CH, group="g")
    (d,) = h2.take(sub2)
    assert d.attempts == 3
    h2.nack(b, [d])
    assert h2.take(sub2) == []
    assert h2.broker.counters.dead_lettered == 1


def test_delayed_retry_survives_and_waits_for_its_time(h: Harness, tmp_path: Path) -> None:
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    d1, d2 = h.take(sub)
    h.nack(a, [d1], delay=100.0)
    h.ack(a, [d2])
    h.commit()
    h2 = _restart(h, tmp_path, after=10.0)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert h2.pump() == {}  # neither the delayed seq 1 nor the acked seq 2
    h2.tick(89.9)
    assert h2.pump() == {}
    h2.tick(0.1)
    got = h2.take(sub2)
    assert [(d.seq, d.attempts) for d in got] == [(1, 2)]


def test_a_restored_delayed_retry_waits_for_its_time_when_the_floor_reaches_it(
        h: Harness, tmp_path: Path) -> None:
    """After the restart the group settles everything below the delayed retry, so its
    floor moves up to it: the retry still comes out at its time, once."""
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4])
    got = h.take(sub)
    h.nack(a, [got[2]], delay=100.0)  # 3 delayed; 1, 2 and 4 unsettled
    h.commit()
    h2 = _restart(h, tmp_path)
    b = Session("b")
    sub2 = h2.subscribe(b, patterns=CH, group="g", prefetch=1)
    for seq in (1, 2, 4):
        (d,) = h2.take(sub2)
        assert d.seq == seq
        h2.ack(b, [d])
        h2.commit()
    h2.tick(98.0)
    assert h2.take(sub2) == []
    h2.tick(1.0)
    (d,) = h2.take(sub2)
    assert (d.seq, d.attempts) == (3, 2)
    h2.ack(b, [d])
    h2.tick(100.0)
    assert h2.take(sub2) == []
    # Past the retry, the floor leaves it behind; the cursor goes on reading
    h2.commit()
    h2.publish_values(CH, [5])
    assert [d.seq for d in h2.take(sub2)] == [5]


def test_a_priority_message_nacked_with_a_delay_waits_for_its_time_after_a_restart(
        h: Harness, tmp_path: Path) -> None:
    """A priority (or publish-delayed) message is queued again from the channel's
    specials at a restart; its retry delay still holds, and it comes out once."""
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "urgent", priority=5), send(CH, "later", delay=5.0), send(CH, "x"))
    h.tick(5.0)
    got = h.take(sub)
    assert payloads(got) == ["urgent", "later", "x"]
    h.nack(a, got[:2], delay=50.0)
    h.ack(a, got[2:])
    h.commit()
    h2 = _restart(h, tmp_path)
    b = Session("b")
    sub2 = h2.subscribe(b, patterns=CH, group="g", prefetch=10)
    assert h2.take(sub2) == []
    h2.tick(48.5)
    assert h2.take(sub2) == []
    h2.tick(0.5)
    again = h2.take(sub2)
    assert [(d.seq, d.attempts) for d in again] == [(1, 2), (2, 2)]
    h2.ack(b, again)
    h2.tick(100.0)
    assert h2.take(sub2) == []


def test_publish_time_delay_survives(h: Harness, tmp_path: Path) -> None:
    h.subscribe(Session("a"), patterns=CH, group="g")
    h.publish(send(CH, "later", delay=100.0))
    h2 = _restart(h, tmp_path, after=10.0)
    sub = h2.subscribe(Session("b"), patterns=CH, group="g")
    assert h2.pump() == {}
    h2.tick(90.0)
    assert payloads(h2.take(sub)) == ["later"]


def test_priorities_survive(h: Harness, tmp_path: Path) -> None:
    h.publish(send(CH, "low"), send(CH, "high", priority=9), send(CH, "mid", priority=4))
    h2 = _restart(h, tmp_path)
    sub = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert payloads(h2.take(sub)) == ["high", "mid", "low"]


def test_durable_listener_survives_and_gets_its_backlog(h: Harness, tmp_path: Path) -> None:
    s = Session("svc")
    sub = h.subscribe(s, kind="listen", patterns="orders/v1/*", name="audit", prefetch=10)
    h.publish_values(CH, [1])
    h.ack(s, h.take(sub))
    h.disconnect(s)
    h.publish_values(CH, [2])
    h.publish_values("orders/v1/2", [3])  # a channel created while the listener was away
    h.commit()
    h2 = _restart(h, tmp_path)
    s2 = Session("svc")
    sub2 = h2.subscribe(s2, kind="listen", patterns="orders/v1/*", name="audit", prefetch=10)
    assert sorted(payloads(h2.take(sub2))) == [2, 3]
    stranger = h2.subscribe(Session("other"), kind="listen", patterns="orders/v1/*",
                            prefetch=10)
    assert h2.take(stranger) == []


def test_dedup_survives(h: Harness, tmp_path: Path) -> None:
    (first,) = h.publish(send(CH, 1, dedup="k"))
    h2 = _restart(h, tmp_path, after=5.0)
    (again,) = h2.publish(send(CH, 2, dedup="k"))
    assert (again.duplicate, again.seq, again.id) == (True, first.seq, first.id)
    h3 = _restart(h2, tmp_path, after=h2.broker.dedup_window)
    (late,) = h3.publish(send(CH, 3, dedup="k"))
    assert (late.duplicate, late.seq) == (False, 2)


def test_dead_letters_survive(h: Harness, tmp_path: Path) -> None:
    h.broker = Broker(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g")
    h.publish_values(CH, ["poison"])
    h.nack(a, h.take(sub))
    h.commit()
    h2 = _restart(h, tmp_path)
    reader = h2.subscribe(Session("ops"), patterns="_dead/orders/v1/1", group="ops")
    (d,) = h2.take(reader)
    assert payloads([d]) == ["poison"]
    assert d.headers is not None and d.headers["x-dead-reason"] == "requeue_limit"


def test_ttl_expiry_of_a_loaded_message_after_restore_dead_letters_it(
    h: Harness, tmp_path: Path
) -> None:
    h.publish(send(CH, "short", ttl=5.0), send(CH, "keep"))
    h2 = _restart(h, tmp_path, after=10.0)
    sub = h2.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert payloads(h2.take(sub)) == ["keep"]
    assert h2.broker.counters.expired == 1
    dead = [m for m in h2.commit().messages if m.channel == "_dead/orders/v1/1"]
    assert [m.headers["x-dead-reason"] for m in dead if m.headers] == ["ttl"]


def test_ttl_expiry_from_the_storage_scan_after_restore_dead_letters_it(
    h: Harness, tmp_path: Path
) -> None:
    # Regression: expire() got (channel, seq) only and could not dead-letter a body that
    # was in storage alone (every body, after a restart).
    h.subscribe(Session("a"), patterns=CH, group="g")
    h.publish(send(CH, "short", ttl=5.0), send(CH, "keep"))
    h2 = _restart(h, tmp_path, after=10.0)
    assert h2.storage is not None
    expired = h2.storage.expired(h2.now, 100)
    assert [(m.channel, m.seq, m.data) for m in expired] == [(CH, 1, b'"short"')]
    assert h2.broker.expire(expired, h2.now) == 1
    batch = h2.commit()
    assert (CH, 1) in batch.deletes
    assert h2.broker.counters.dead_lettered == 1
    dead = [m for m in batch.messages if m.channel == "_dead/orders/v1/1"]
    assert [m.headers["x-dead-reason"] for m in dead if m.headers] == ["ttl"]
    assert [m.data for m in dead] == [b'"short"']
    assert h2.broker.expire(expired, h2.now) == 0  # a second scan finds it gone


def test_depth_stays_right_when_truncating_across_a_deleted_seq_after_restore(
    h: Harness, tmp_path: Path
) -> None:
    # Regression: restore did not know the holes, so truncation subtracted them twice.
    h.publish(send(CH, 1), send(CH, 2, ttl=1.0), send(CH, 3))
    h.advance(1.0)
    assert h.broker.expire([(CH, 2)], h.now) == 1
    h.commit()
    h2 = _restart(h, tmp_path)
    log = h2.broker.channels[CH]
    assert log.count == 2
    s = Session("c")
    sub = h2.subscribe(s, patterns=CH, group="g", prefetch=10)
    got = h2.take(sub)
    assert seqs(got) == [1, 3]
    h2.ack(s, got)
    assert h2.commit().truncates == {CH: 4}
    assert log.count == 0


def test_a_delivery_unsettled_at_a_crash_counts_as_an_attempt(
    h: Harness, tmp_path: Path
) -> None:
    # Regression: deliveries did not dirty the group state, so attempts restarted at 1.
    sub = h.subscribe(Session("a"), patterns=CH, group="g")
    h.publish_values(CH, [1])
    (d,) = h.take(sub)
    assert d.attempts == 1
    h.commit()  # the adapter commits whatever is pending; the broker then crashes
    h2 = _restart(h, tmp_path)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g")
    (again,) = h2.take(sub2)
    assert again.attempts == 2


# ------------------------------------------------- bodies evicted from memory
def test_bodies_over_the_cache_budget_are_evicted_and_read_back(tmp_path: Path) -> None:
    st = _storage(tmp_path)
    h = Harness(storage=st, cache_budget=4_000)
    h.publish_values(CH, [f"m{i}" for i in range(40)])
    log = h.broker.channels[CH]
    h.tick(0.0)
    assert log.cache_bytes <= 4_000
    assert log.cache_lo > 1  # the oldest bodies are now in storage only
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=100)
    got = h.take(sub)
    assert seqs(got) == list(range(1, 41))
    assert payloads(got) == [f"m{i}" for i in range(40)]
    assert h.loads and h.loads[0].from_seq == 1


def test_retention_truncates_only_what_is_settled_and_old_enough(tmp_path: Path) -> None:
    st = _storage(tmp_path)
    h = Harness(storage=st, channel_options=lambda key: ChannelOptions(retention=60.0))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=100)
    h.publish_values(CH, [1, 2, 3])
    h.advance(50.0)
    h.publish_values(CH, [4, 5, 6])
    got = h.take(sub)
    h.ack(s, got[:5])  # seq 6 stays unsettled
    h.commit()
    assert h.broker.channels[CH].count == 6  # retention: acked messages stay for now
    assert h.broker.retention_candidates() == [(CH, 6)]
    h.advance(20.0)  # seqs 1-3 are 70 s old, 4-6 are 20 s old
    first = st.retained_until(CH, 6, h.now - 60.0)
    assert first == 4
    h.broker.truncate(CH, first)
    batch = h.commit()
    assert batch.truncates == {CH: 4}
    assert h.broker.channels[CH].count == 3
    replay = h.subscribe(Session("r"), kind="listen", patterns=CH, start="oldest", prefetch=10)
    assert seqs(h.take(replay)) == [4, 5, 6]
    assert [m.seq for m in st.read_range(CH, 1, 100, 100)] == [4, 5, 6]
    assert st.retained_until(CH, 6, 0.0) is None
    assert st.retained_until("orders/v1/none", 6, h.now) is None


def test_messages_dropped_before_their_commit_are_not_stored(h: Harness, tmp_path: Path) -> None:
    opts = {"channel_options": lambda key: ChannelOptions(max_items=2, overflow="drop_oldest")}
    h.broker = Broker(**opts)
    h.publish_values(CH, [1, 2, 3, 4])
    assert h.storage is not None
    assert [m.seq for m in h.storage.read_range(CH, 1, 100, 100)] == [3, 4]
    h2 = _restart(h, tmp_path, **opts)
    log = h2.broker.channels[CH]
    assert (log.count, log.end) == (2, 5)
    sub = h2.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert payloads(h2.take(sub)) == [3, 4]
    (o,) = h2.publish(send(CH, 5))
    assert o.seq == 5 and h2.broker.counters.dropped == 1
    assert payloads(h2.take(sub)) == [5]


def test_writers_fences_reservations_producers_and_staged_txns_survive(
    h: Harness, tmp_path: Path
) -> None:
    rules = Rules.parse([{"client": "*", "read": ["orders/*", "!invoice/*"],
                          "write": ["*"]}])
    spark, other = Session("spark"), Session("other", access=rules.for_client("other"))
    app = Session("app", producer_id="00000000000000aa")
    h.broker.rules = rules
    h.broker.check_read(Session("owner", access=rules.for_client("owner")), "invoice/v1/1")
    numbered = [Send(CH, js(i), pseq=i) for i in (1, 2)]
    first, _ = h.broker.publish(numbered, h.now, session=app)
    h.broker.stage(spark, "t1", [send("out/v1/1", "b5")], h.now)
    assert h.broker.commit_txns(spark, "job", 5, ["t1"], h.now, "run-1")["published"] == 1
    h.broker.stage(spark, "t2", [send("out/v1/1", "b6")], h.now)  # staged, not committed
    h.commit()

    h2 = _restart(h, tmp_path)
    h2.broker.rules = rules
    # The reservation: another client is refused, told whose it is.
    with pytest.raises(NotAuthorized) as refused:
        h2.broker.check_read(other, "invoice/v1/1")
    assert refused.value.detail["owner"] == "owner"
    # The producer's numbering: a resend is the same message, the next one is new.
    again, _ = h2.broker.publish([Send(CH, js(2), pseq=2), Send(CH, js(3), pseq=3)],
                                 h2.now, session=app)
    assert (again[0].duplicate, again[0].seq) == (True, first[1].seq)
    assert (again[1].duplicate, again[1].seq) == (False, 3)
    # The writer's owner, its lineage and its fence (batch 5 of out/v1/1).
    h2.broker.stage(other, "x", [send("out/v1/1", "squat")], h2.now)
    with pytest.raises(NotAuthorized):
        h2.broker.commit_txns(other, "job", 9, ["x"], h2.now)
    with pytest.raises(BadRequest) as bound:
        h2.broker.commit_txns(spark, "job", 6, ["t2"], h2.now, "run-2")
    assert bound.value.detail["bound"] == "run-1"
    h2.broker.stage(spark, "t3", [send("out/v1/1", "b5 again")], h2.now)
    assert h2.broker.commit_txns(spark, "job", 5, ["t3"], h2.now, "run-1")["discarded"] == 1
    # The staged transaction commits after the restart.
    assert h2.broker.commit_txns(spark, "job", 6, ["t2"], h2.now, "run-1")["published"] == 1
    h2.commit()
    reader = h2.subscribe(Session("r"), patterns="out/v1/1", group="r", prefetch=10)
    assert payloads(h2.take(reader)) == ["b5", "b6"]


def test_acked_sets_and_cursors_above_the_floor_survive(h: Harness, tmp_path: Path) -> None:
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4, 5, 6])
    got = h.take(sub)
    h.ack(a, [got[1], got[3]])  # 2 and 4 acked, 1 unsettled: the floor stays at 1
    h.nack(a, [got[2]], delay=50.0)  # 3 delayed
    h.commit()
    h2 = _restart(h, tmp_path)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert [(d.seq, d.attempts) for d in h2.take(sub2)] == [(1, 2), (5, 2), (6, 2)]
    h2.tick(50.0)
    assert [(d.seq, d.attempts) for d in h2.take(sub2)] == [(3, 2)]


def test_a_group_reads_from_the_start_a_channel_it_has_no_stored_state_for() -> None:
    """Storage may hold a channel a group matches without a state of that group for it
    (created after the group's last save): the group reads it from its first seq. State
    rows of a group or channel storage no longer has are left out."""
    snap = Snapshot(
        channels=[ChannelRecord(CH, next_seq=6, first_seq=2, count=4),
                  ChannelRecord("orders/v1/2", next_seq=3, first_seq=1, count=2)],
        specials=[(CH, 5, 0, 1_000.0 + 30.0)],  # seq 5 is delayed until T0 + 30
        groups=[GroupDef("consume:g", "consume", ("orders/v1/*",))],
        group_states=[("consume:gone", CH, 1, b""), ("consume:g", "orders/v1/9", 1, b""),
                      ("consume:g", "orders/v1/2", 2, b"")],
    )
    broker = Broker()
    broker.restore(snap, 1_000.0)
    grp = broker.groups["consume:g"]
    assert set(grp.gcs) == {CH, "orders/v1/2"} and "consume:gone" not in broker.groups
    stats = broker.group_stats(grp, 1_000.0)
    assert (stats["channels"], stats["lag"], stats["waiting"]) == (2, 4 + 1, 4 + 1)
    assert [gc.group.key for gc in broker.channels[CH].states] == ["consume:g"]
    broker.tick(1_000.0 + 30.0)  # the delayed seq 5 comes due with its timer
    assert grp.gcs[CH] in grp.ready


def test_an_adopted_queue_is_read_from_its_start_by_the_groups_with_no_state_for_it(
) -> None:
    """A queue another broker held, adopted while running: a group this broker knows
    that has no stored state for its channels (it was made while the other held them)
    reads them from their first seq, and a message delayed by its publisher still
    waits for its time."""
    group = GroupDef("consume:g", "consume", ("orders/v1/*",))
    broker = Broker()
    broker.restore(Snapshot(groups=[group]), 1_000.0)
    broker.adopt(Snapshot(
        channels=[ChannelRecord(CH, next_seq=6, first_seq=2, count=4)],
        specials=[(CH, 5, 0, 1_000.0 + 30.0)],  # seq 5 is delayed until T0 + 30
        groups=[group]), 1_000.0)
    grp = broker.groups["consume:g"]
    gc = grp.gcs[CH]
    assert (gc.floor, gc.cursor) == (2, 2)
    assert gc.sched == [(1_000.0 + 30.0, 5)] and gc.prio == []  # not due yet
    stats = broker.group_stats(grp, 1_000.0)
    assert (stats["channels"], stats["lag"]) == (1, 4)


@pytest.mark.parametrize("adopted", [False, True])
def test_a_channel_restored_or_adopted_is_idle_from_then_not_before(adopted: bool) -> None:
    """Idle expiry counts a channel's idle time from the restart (or from when its queue
    was adopted): nothing in memory says how long it was idle before."""
    def options(key: str) -> ChannelOptions:
        return ChannelOptions(expire_idle=60.0) if key.startswith("tmp/") else ChannelOptions()

    snap = Snapshot(channels=[ChannelRecord("tmp/v1/a", next_seq=3, first_seq=1, count=2),
                              ChannelRecord("keep/v1/a", next_seq=3, first_seq=1, count=2)])
    broker = Broker(channel_options=options)
    if adopted:
        broker.restore(Snapshot(), 500.0)
        broker.adopt(snap, 1_000.0)
    else:
        broker.restore(snap, 1_000.0)
    assert broker.channel_stats(broker.channels["tmp/v1/a"], 1_000.0)["active_at"] == 1_000.0
    assert broker.tick(1_000.0 + 59.0) == []
    assert broker.tick(1_000.0 + 60.0) == [("tmp/v1/a", 2)]
    assert list(broker.channels) == ["keep/v1/a"]


def test_a_restore_finds_the_groups_of_each_channel_by_its_name(monkeypatch) -> None:
    """A restore attaches each group to the channels it reads but has no state for by
    looking the groups up by the channel's name: trying every group against every
    channel was 2e9 checks at each start at the bounds (20,000 groups, 100,000
    channels). 400 channels, a group reading each and two reading them all: each
    channel is attached to its three, in the groups' order, and no group is tried
    against a channel (old code: 402 x 400 = 160,800 tries)."""
    channels = [f"orders/v1/{i}" for i in range(400)]
    defs = [GroupDef(f"consume:one{i}", "consume", (ch,)) for i, ch in enumerate(channels)]
    defs.insert(100, GroupDef("consume:all", "consume", ("orders/v1/*",)))
    defs.append(GroupDef("consume:every", "consume", ("orders/*", "other/v1/*")))
    snap = Snapshot(channels=[ChannelRecord(ch, next_seq=3, first_seq=1, count=2)
                              for ch in [*channels, "other/v2/x"]], groups=defs)
    tried = [0]
    real = Group.matches_keys

    def counted(self: Group, keys: list[str]) -> bool:
        tried[0] += 1
        return real(self, keys)

    monkeypatch.setattr(Group, "matches_keys", counted)
    broker = Broker()
    broker.restore(snap, 1_000.0)
    assert tried[0] < len(channels)
    for i, ch in enumerate(channels):
        mine = [f"consume:one{i}", "consume:all"]
        assert [gc.group.key for gc in broker.channels[ch].states] == \
            (mine if i < 100 else mine[::-1]) + ["consume:every"]
    assert broker.channels["other/v2/x"].states == []
    assert len(broker.groups["consume:all"].gcs) == 400
    assert [*broker.groups["consume:every"].gcs] == channels  # in the channels' order


def test_explicit_stream_ids_survive_and_points_no_message_needs_are_dropped(
    h: Harness, tmp_path: Path
) -> None:
    """core/stream_ids.py: a publish naming its Redis stream id keeps it after a restart;
    the points below the first live message but the last are dropped from storage."""
    from minou.core.stream_ids import ID_HEADER, point_key

    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    outs = h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}), send(CH, 2),
                     send(CH, 3, headers={ID_HEADER: "200-5"}), send(CH, 4),
                     send(CH, 5, headers={ID_HEADER: "150-0"}),  # not above the top
                     resp_door=True)
    assert [o.code == 0 for o in outs] == [True, True, True, True, False]
    assert "equal or smaller than the target stream top" in outs[4].error
    ids = h.broker.channels[CH].stream_ids
    assert ids is not None and [ids.text(s) for s in (1, 2, 3, 4)] == [
        b"100-0", b"100-1", b"200-5", b"200-6"]
    got = h.take(sub)
    assert got[0].headers == {ID_HEADER: "100-0"} and got[1].headers is None
    h.ack(a, got[:3])  # 1-3 go: the point at 3 still numbers 4, the one at 1 goes
    batch = h.commit()
    assert h.broker.channels[CH].first_seq == 4
    assert list(h.broker.channels[CH].stream_ids.seqs) == [3]  # pruned as they go
    assert batch.meta == {point_key(CH, 1): None}
    h2 = _restart(h, tmp_path)
    ids = h2.broker.channels[CH].stream_ids
    assert ids is not None and list(ids.seqs) == [3] and ids.text(4) == b"200-6"
    assert ids.text(5) == b"200-7"  # what '*' gives next
    h2.commit()  # the dropped point's row goes with this batch
    assert h2.storage is not None
    h2.storage.close()
    st = _new(tmp_path)
    snap = st.open(h2.now + 1)
    assert [k for k in snap.meta if k.startswith("resp-id/")] == [point_key(CH, 3)]
    broker = Broker()
    broker.restore(snap, h2.now + 1)
    h3 = Harness(broker=broker, storage=st, now=h2.now + 1)
    outs = h3.publish(send(CH, 6, headers={ID_HEADER: "200-6"}), send(CH, 7), resp_door=True)
    assert "equal or smaller" in outs[0].error and outs[1].code == 0
    assert h3.broker.channels[CH].stream_ids.text(outs[1].seq) == b"200-7"
    # Through any other door the header is an ordinary one (a copied message keeps it)
    (out,) = h3.publish(send(CH, 8, headers={ID_HEADER: "1-0"}))
    assert out.code == 0 and h3.broker.channels[CH].stream_ids.text(out.seq) == b"200-8"


def test_stored_points_no_message_needs_are_dropped_at_start(h: Harness,
                                                             tmp_path: Path) -> None:
    """Rows of points below the first live message (but the last) and of seqs never
    stored go at start; a channel left with none has no id table."""
    from minou.core.stream_ids import ID_HEADER, point_key
    from minou.core.writes import WriteBatch

    other = "orders/v1/2"
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}), send(CH, 2, headers={ID_HEADER:
              "200-0"}), send(other, 3), resp_door=True)
    h.commit()
    assert h.storage is not None
    h.storage.apply(WriteBatch(meta={point_key(CH, 9): "900-0", point_key(other, 1): "1-5",
                                     point_key(other, 2): "2-0",
                                     point_key("aaa/v1/gone", 1): "7-0"}))
    h.storage.apply(WriteBatch(truncates={CH: 2}, channels={CH: 3}))
    h2 = _restart(h, tmp_path)
    ids = h2.broker.channels[CH].stream_ids
    assert ids is not None and list(ids.seqs) == [2] and ids.text(3) == b"200-1"
    assert h2.broker.channels[other].stream_ids is not None  # 1-5 at seq 1
    dropped = {k for k, v in h2.broker.state.batch.meta.items() if v is None}
    assert dropped == {point_key(CH, 9), point_key(CH, 1), point_key(other, 2)}
    assert h2.broker.channels[other].stream_ids.text(1) == b"1-5"
    h3 = _restart(h2, tmp_path)  # with only a never-stored point: no table at all
    assert h3.broker.channels[other].stream_ids is not None
    h3.storage.apply(WriteBatch(meta={point_key(other, 1): None, point_key(other, 5): "9-0"}))
    h4 = _restart(h3, tmp_path)
    assert h4.broker.channels[other].stream_ids is None


def test_messages_with_a_priority_or_a_delay_are_bounded_and_counted_over_restarts(
        h: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each one is held in memory until taken: MAX_SCHEDULED_MESSAGES bounds them over
    every channel, precisely, per message; taken ones give their room back, and a
    restart counts those still waiting."""
    import minou.core.state as state_module

    monkeypatch.setattr(state_module, "MAX_SCHEDULED_MESSAGES", 3)
    a = Session("a")
    sub = h.subscribe(a, patterns="orders/v1/*", group="g", prefetch=10)
    h.publish(send(CH, "p", priority=2), send("orders/v1/2", "d", delay=5.0),
              send(CH, "plain"))
    out = h.publish(send(CH, "p2", priority=1), send("orders/v1/3", "d2", delay=1.0),
                    send(CH, "plain2"))
    assert [o.seq for o in out] == [3, 0, 4]
    assert "3 messages with a priority or a delay wait already" in out[1].error
    assert h.broker.state.special_count.total == 3
    h2 = _restart(h, tmp_path)
    assert h2.broker.state.special_count.total == 3  # counted again from storage
    b = Session("b")
    sub = h2.subscribe(b, patterns="orders/v1/*", group="g", prefetch=10)
    got = h2.take(sub)  # the delayed one is not due yet: still held
    assert sorted(d.seq for d in got if d.channel == CH) == [1, 2, 3, 4]
    h2.ack(b, [d for d in got if d.channel == CH])
    h2.commit()  # settled below the floor: no longer held
    assert h2.broker.state.special_count.total == 1
    assert h2.publish(send(CH, "p3", priority=1))[0].seq > 0
