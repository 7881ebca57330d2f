"""A group's reading of one channel (core/group.py ``GroupChannel``) as readers and
operators see it: what holds back truncation, where a returned delivery goes, when a
delayed one comes back, and the ``waiting`` count of group stats."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.broker import Session
from minou.core.group import NeedLoad

from .helpers import Harness, consumer, payloads, send, seqs

CH = "orders/v1/1"


def _truncated_to(h: Harness) -> int | None:
    """Where the next commit truncates the channel (None: not at all)."""
    return h.commit().truncates.get(CH)


def _ack_all(h: Harness, s: Session, sub: Any) -> list[int]:
    got = h.take(sub)
    h.ack(s, got)
    return seqs(got)


# ------------------------------------------------------- the floor of a group
def test_a_publish_delayed_message_holds_the_floor_until_it_is_delivered_and_acked() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "later", delay=10.0), send(CH, "a"), send(CH, "b"))
    assert _ack_all(h, s, sub) == [2, 3]
    assert _truncated_to(h) is None  # seq 1 is still due
    log = h.broker.channels[CH]
    assert (log.count, log.first_seq) == (3, 1)
    h.tick(9.0)
    assert _truncated_to(h) is None
    h.tick(1.0)
    assert _ack_all(h, s, sub) == [1]
    assert _truncated_to(h) == 4
    assert log.count == 0


def test_a_message_nacked_with_a_delay_holds_the_floor_until_it_is_redelivered() -> None:
    h, s, sub = consumer(CH, [1, 2, 3], prefetch=1)
    (d1,) = h.take(sub)
    h.nack(s, [d1], delay=30.0)
    assert _ack_all(h, s, sub) == [2]
    assert _ack_all(h, s, sub) == [3]
    assert _truncated_to(h) is None
    assert h.broker.channels[CH].count == 3
    h.tick(29.0)
    assert h.pump() == {}
    assert _truncated_to(h) is None
    h.tick(1.0)
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 2)
    h.ack(s, [again])
    assert _truncated_to(h) == 4


def test_truncation_stops_at_a_delayed_message_between_settled_ones() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "a"), send(CH, "later", delay=5.0), send(CH, "b"))
    assert _ack_all(h, s, sub) == [1, 3]
    assert _truncated_to(h) == 2  # up to, not past, the delayed one
    h.commit()
    h.tick(5.0)
    assert payloads(h.take(sub)) == ["later"]


def test_a_message_in_the_front_or_back_queue_holds_the_floor() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4], prefetch=2)
    d1, d2 = h.take(sub)
    h.nack(s, [d1], front=False)
    h.nack(s, [d2], front=True)
    got = h.take(sub)
    assert seqs(got) == [2, 3]
    h.ack(s, got)
    assert _truncated_to(h) is None  # 1 waits at the back
    got = h.take(sub)
    assert seqs(got) == [4, 1]
    h.ack(s, got)
    assert _truncated_to(h) == 5


def test_a_delayed_message_expired_before_a_group_came_does_not_hold_its_floor() -> None:
    """Past its TTL before it was due, a delayed message is deleted with its timing:
    a group made afterwards does not wait for its time before the channel truncates."""
    h = Harness()
    h.publish(send(CH, "x"), send(CH, "later", delay=100.0, ttl=1.0), send(CH, "y"))
    h.advance(2.0)
    assert h.broker.expire([(CH, 2)], h.now) == 1  # what the storage scan found
    h.commit()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", start="oldest", prefetch=10)
    assert _ack_all(h, s, sub) == [1, 3]
    assert _truncated_to(h) == 4


def test_a_delayed_message_at_the_truncation_point_keeps_its_time_for_a_new_group() -> None:
    """The channel truncates up to the delayed message holding the floor; a group made
    then still gets it when due, not at once."""
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "a"), send(CH, "later", delay=10.0), send(CH, "b"))
    assert _ack_all(h, s, sub) == [1, 3]
    assert _truncated_to(h) == 2
    late = h.subscribe(Session("d"), patterns=CH, group="g2", start="oldest", prefetch=10)
    assert payloads(h.take(late)) == ["b"]
    h.tick(9.0)
    assert h.take(late) == []
    h.tick(1.0)
    assert payloads(h.take(late)) == ["later"]


# ----------------------------------------------------- where returns go
def test_nack_to_the_back_while_a_later_publish_is_uncommitted_is_not_dropped() -> None:
    h, s, sub = consumer(CH, [1, 2], prefetch=1)
    (d1,) = h.take(sub)
    h.store_attempts()
    h.publish(send(CH, 3), commit=False)  # seq 3 assigned, not visible yet
    h.nack(s, [d1], front=False)
    assert _ack_all(h, s, sub) == [2]  # what was queued before the nack comes first
    assert _ack_all(h, s, sub) == [1]
    assert h.commit().truncates.get(CH) == 3  # 3 is stored now: 1 and 2 are settled
    assert _ack_all(h, s, sub) == [3]
    assert h.pump() == {}
    assert h.broker.counters.acked == 3


def test_an_expired_lease_is_redelivered_first_not_behind_newer_messages() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4], prefetch=2, lease=10.0)
    _, d2 = h.take(sub)
    h.ack(s, [d2])
    (d3,) = h.take(sub)
    h.ack(s, [d3])
    h.tick(10.0)  # d1's lease runs out while 4 waits
    assert h.broker.counters.lease_expired == 1
    got = h.take(sub)
    assert [(d.seq, d.attempts) for d in got] == [(1, 2), (4, 1)]


def test_expired_leases_come_back_in_seq_order_ahead_of_the_rest() -> None:
    h, _, sub = consumer(CH, [1, 2, 3, 4, 5], prefetch=3, lease=10.0)
    assert seqs(h.take(sub)) == [1, 2, 3]
    h.tick(10.0)
    assert seqs(h.take(sub)) == [1, 2, 3]


# ------------------------------------------------------------ leases
def test_a_lease_extended_twice_expires_at_the_later_time() -> None:
    h, s, sub = consumer(CH, [1], lease=5.0)
    (d,) = h.take(sub)
    h.advance(1.0)
    assert h.extend(s, [d], 10.0) == []  # until T0 + 11
    h.advance(1.0)
    assert h.extend(s, [d], 20.0) == []  # until T0 + 22
    h.tick(9.5)  # past the first extension
    assert h.broker.counters.lease_expired == 0
    h.tick(10.4)  # T0 + 21.9
    assert h.broker.counters.lease_expired == 0
    assert h.pump() == {}
    h.tick(0.1)
    assert h.broker.counters.lease_expired == 1
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 2)


def test_the_holder_of_a_twice_extended_lease_can_ack_it_before_the_later_time() -> None:
    h, s, sub = consumer(CH, [1], lease=5.0)
    (d,) = h.take(sub)
    assert h.extend(s, [d], 10.0) == []
    assert h.extend(s, [d], 30.0) == []
    h.tick(20.0)  # past the lease and the first extension
    assert h.ack(s, [d]) == []
    assert (h.broker.counters.acked, h.broker.counters.lease_expired) == (1, 0)
    h.tick(20.0)
    assert h.broker.counters.lease_expired == 0
    assert h.pump() == {}


def test_extend_reaches_the_lease_of_a_listener_too() -> None:
    h = Harness()
    s = Session("svc")
    sub = h.subscribe(s, kind="listen", patterns=CH, lease=5.0)
    h.publish_values(CH, [1])
    (d,) = h.take(sub)
    h.extend(s, [d], 60.0)
    h.tick(59.0)
    assert h.ack(s, [d]) == []


# ------------------------------------------------------------ delays
def test_a_half_second_nack_delay_is_not_redelivered_early() -> None:
    h, s, sub = consumer(CH, [1])
    (d,) = h.take(sub)
    h.nack(s, [d], delay=0.5)
    assert h.pump() == {}
    h.tick(0.0)
    assert h.pump() == {}
    h.tick(0.49)
    assert h.pump() == {}
    h.tick(0.01)
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 2)


def test_a_nack_without_delay_is_redelivered_at_once() -> None:
    h, s, sub = consumer(CH, [1])
    (d,) = h.take(sub)
    h.nack(s, [d], delay=0.0, front=False)
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 2)


def test_delayed_messages_come_out_in_priority_order_once_due() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "d-p1", delay=5.0, priority=1), send(CH, "d-p0", delay=5.0),
              send(CH, "d-p9", delay=5.0, priority=9), send(CH, "d-p5", delay=3.0,
                                                             priority=5))
    assert h.pump() == {}
    h.tick(5.0)
    got = h.take(sub)
    assert payloads(got) == ["d-p9", "d-p5", "d-p1", "d-p0"]
    assert [d.priority for d in got] == [9, 5, 1, 0]


def test_a_due_delayed_message_waits_for_a_higher_priority_one_published_later() -> None:
    h, s, sub = consumer(CH, ["busy"], prefetch=1)
    (busy,) = h.take(sub)
    h.publish(send(CH, "d-p2", delay=1.0, priority=2), send(CH, "p7", priority=7))
    h.tick(1.0)
    h.ack(s, [busy])
    order = []
    for _ in range(2):
        (d,) = h.take(sub)
        order.append(payloads([d])[0])
        h.ack(s, [d])
    assert order == ["p7", "d-p2"]


# ------------------------------------------------------------ advancing
def test_setting_a_position_forgets_returned_and_unsettled_deliveries_below_it() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4, 5, 6], prefetch=10)
    got = h.take(sub)
    assert seqs(got) == [1, 2, 3, 4, 5, 6]
    h.nack(s, got[0:1], delay=30.0)
    h.nack(s, got[1:2], front=True)
    h.nack(s, got[2:3], front=False)
    # 4 is still out, 5 and 6 too
    assert h.broker.set_position(s, "g", {CH: 5}, h.now) == {CH: 0}
    assert sub.unsettled == 2  # the lease of 4 was forgotten: its credit is back
    ack4 = h.ack(s, got[3:4])
    assert [code for _, code, _ in ack4] != [] and len(ack4) == 1
    assert h.ack(s, got[4:]) == []
    assert _truncated_to(h) == 7
    h.tick(30.0)  # the delayed retry of 1 went with its position
    assert h.pump() == {}
    assert h.broker.group_stats(sub.group, h.now)["waiting"] == 0


def test_setting_a_position_forgets_priority_and_delayed_messages_below_it() -> None:
    h = Harness()
    h.publish(send(CH, "p", priority=5), send(CH, "d", delay=10.0), send(CH, "a"),
              send(CH, "q", priority=5), send(CH, "e", delay=10.0))
    s = Session("c")
    h.broker.set_position(s, "g", {CH: 3}, h.now)
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["q", "a"]
    h.tick(10.0)
    assert payloads(h.take(sub)) == ["e"]


# ------------------------------------------------------ waiting, as stats show it
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 3), st.sampled_from([0, 0, 4]),
                  st.sampled_from([None, None, 2.0])),
        st.tuples(st.just("take")),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("nack"), st.integers(0, 5), st.sampled_from(["front", "back",
                                                                          "delay"])),
        st.tuples(st.just("expire"), st.integers(1, 12)),
        st.tuples(st.just("tick"), st.sampled_from([1.0, 3.0, 11.0])),
        st.tuples(st.just("commit")),
    ),
    max_size=14,
)


@settings(derandomize=True, max_examples=25, deadline=None)
@given(ops=_OPS)
def test_waiting_counts_stored_messages_neither_out_nor_settled(ops: list) -> None:
    """Group stats' ``waiting`` is the number of stored messages of the group that are
    neither delivered-and-unsettled nor settled (new, returned or delayed ones), and the
    oldest waiting seq is the lowest of them."""
    from minou.core.maintenance import oldest_waiting

    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=4, lease=5.0)
    published: set[int] = set()
    settled: set[int] = set()
    removed: set[int] = set()
    out: dict[int, Any] = {}  # seq -> its current delivery
    for op in ops:
        if op[0] == "publish":
            _, n, prio, delay = op
            for outcome in h.publish(*(send(CH, i, priority=prio, delay=delay)
                                       for i in range(n))):
                published.add(outcome.seq)
        elif op[0] == "take":
            for d in h.take(sub):
                out[d.seq] = d
        elif op[0] in ("ack", "nack") and out:
            seq = sorted(out)[op[1] % len(out)]
            d = out.pop(seq)
            if op[0] == "ack":
                assert h.ack(s, [d]) == []
                settled.add(seq)
            else:
                how = op[2]
                h.nack(s, [d], front=how == "front", delay=3.0 if how == "delay" else 0.0)
        elif op[0] == "expire":
            if h.broker.expire([(CH, op[1])], h.now):
                removed.add(op[1])
        elif op[0] == "tick":
            h.tick(op[1])
            expired = [seq for seq, d in out.items() if seq not in settled
                       and sub.session.leases.get(d.tag) is None]
            for seq in expired:
                del out[seq]
        elif op[0] == "commit":
            h.commit()
        waiting = published - settled - removed - set(out)
        assert h.broker.group_stats(sub.group, h.now)["waiting"] == len(waiting)
        log = h.broker.channels.get(CH)
        if log is not None:
            assert oldest_waiting(h.broker, log, "consume:g") == min(waiting, default=None)


def _restarted(h: Harness) -> Harness:
    """The broker restarted from its storage (what was committed survives)."""
    from minou.core.broker import Broker
    from minou.storage.memory import MemoryStorage

    h.storage.close()
    st = MemoryStorage(h.storage.name)
    broker = Broker()
    broker.restore(st.open(h.now), h.now)
    return Harness(broker=broker, storage=st, now=h.now)


@pytest.mark.parametrize("how", ["front", "back", "delay", "out"])
def test_a_position_keeps_the_state_of_the_message_at_it(how: str) -> None:
    """Everything *below* a position is settled; the message at it keeps its state (a
    retry stays a retry, a delay stays a delay)."""
    h, s, sub = consumer(CH, [1, 2, 3, 4], prefetch=10)
    got = h.take(sub)
    if how != "out":
        h.nack(s, got[2:3], front=how == "front", delay=5.0 if how == "delay" else 0.0)
    h.broker.set_position(s, "g", {CH: 3}, h.now)
    assert h.ack(s, got[3:]) == []
    if how == "out":
        h.nack(s, got[2:3])
    elif how == "delay":
        assert h.pump() == {}
        h.tick(5.0)
    assert [(d.seq, d.attempts) for d in h.take(sub)] == [(3, 2)]


def test_a_position_keeps_a_priority_or_publish_delayed_message_at_it() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish(send(CH, 1))
    assert seqs(h.take(sub)) == [1]
    h.publish(send(CH, 2), send(CH, "p", priority=5), send(CH, "d", delay=5.0),
              send(CH, 5))
    h.broker.set_position(s, "g", {CH: 3}, h.now)  # 1 (out) and 2 are settled
    assert payloads(h.take(sub)) == ["p"]
    h.broker.set_position(s, "g", {CH: 4}, h.now)  # p is settled, d is due later
    (d5,) = h.take(sub)
    assert payloads([d5]) == [5]
    h.ack(s, [d5])
    assert h.pump() == {}
    h.tick(5.0)
    assert payloads(h.take(sub)) == ["d"]


def test_a_position_at_a_message_acked_out_of_order_does_not_count_it_as_waiting() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish(send(CH, 1), send(CH, 2), send(CH, "p", priority=5))
    (p,) = h.take(sub)  # the priority message comes first
    h.ack(s, [p])
    h.broker.set_position(s, "g", {CH: 3}, h.now)
    assert h.broker.group_stats(sub.group, h.now)["waiting"] == 0
    assert h.pump() == {}


def test_a_position_after_a_restart_keeps_a_delayed_retry_at_it_delayed() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4], prefetch=10)
    got = h.take(sub)
    h.nack(s, got[1:3], delay=30.0)  # 2 and 3: the floor stays at 2
    h.ack(s, got[:1] + got[3:])
    h.commit()
    h = _restarted(h)
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.broker.set_position(s, "g", {CH: 3}, h.now)
    assert h.pump() == {}  # not before its delay
    h.tick(30.0)
    assert [(d.seq, d.attempts) for d in h.take(sub)] == [(3, 2)]


def _waiting(h: Harness, sub: Any) -> tuple[int, int | None]:
    from minou.core.maintenance import oldest_waiting

    log = h.broker.channels[CH]
    return (h.broker.group_stats(sub.group, h.now)["waiting"],
            oldest_waiting(h.broker, log, sub.group.key))


def test_waiting_leaves_out_expired_messages_wherever_they_are() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4, 5, 6], prefetch=2)
    d1, d2 = h.take(sub)
    assert _waiting(h, sub) == (4, 3)
    h.broker.expire([(CH, 3)], h.now)  # the next one the cursor would read
    assert _waiting(h, sub) == (3, 4)
    h.broker.expire([(CH, 1)], h.now)  # out to a reader, and the head of the log
    assert _waiting(h, sub) == (3, 4)
    h.broker.expire([(CH, 2)], h.now)  # out to a reader
    assert _waiting(h, sub) == (3, 4)
    h.ack(s, [d1, d2])
    assert _waiting(h, sub) == (3, 4)
    assert seqs(h.take(sub)) == [4, 5]
    assert _waiting(h, sub) == (1, 6)


def test_waiting_leaves_out_messages_acked_ahead_of_the_cursor() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish(send(CH, 1), send(CH, 2))
    (d1,) = h.take(sub)
    h.publish(send(CH, "p", priority=5), send(CH, 4))
    assert _waiting(h, sub) == (3, 2)
    h.ack(s, [d1])
    (p,) = h.take(sub)
    assert p.seq == 3
    assert _waiting(h, sub) == (2, 2)
    h.ack(s, [p])
    assert _waiting(h, sub) == (2, 2)
    (d2,) = h.take(sub)
    h.ack(s, [d2])
    assert _waiting(h, sub) == (1, 4)
    (d4,) = h.take(sub)
    assert _waiting(h, sub) == (0, None)
    h.ack(s, [d4])
    assert _waiting(h, sub) == (0, None)


def test_waiting_leaves_out_an_expired_message_right_at_the_groups_floor() -> None:
    h = Harness()
    s = Session("c")
    h.broker.set_position(Session("other"), "held", {CH: 1}, h.now)  # keeps the log
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1, 2, 3, 4])
    h.ack(s, h.take(sub))
    h.commit()
    h.broker.expire([(CH, 2)], h.now)  # where g reads next; the log still starts at 1
    assert h.broker.channels[CH].first_seq == 1
    assert _waiting(h, sub) == (2, 3)


def test_two_delayed_messages_due_together_hold_the_floor_for_a_busy_reader() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish(send(CH, "d1", delay=5.0), send(CH, "d2", delay=5.0), send(CH, 3),
              send(CH, 4))
    for _ in range(2):
        h.ack(s, h.take(sub))  # 3 and 4: the cursor is past the delayed ones
    h.tick(5.0)
    (d1,) = h.take(sub)
    h.ack(s, [d1])
    assert _truncated_to(h) == 2  # d2 waits (ready, with no credit): not past it
    assert payloads(h.take(sub)) == ["d2"]
    assert h.broker.group_stats(sub.group, h.now)["acked"] == 3


# -------------------------------------------------- runs taken from the cursor
@settings(max_examples=150, deadline=None)
@given(
    delivered=st.integers(1, 20),  # the first ones out (then the cursor goes back)
    acked=st.sets(st.integers(1, 20)),
    deleted=st.sets(st.integers(1, 24)),
    priority=st.sets(st.integers(1, 24)),
    evicted=st.integers(0, 24),  # the oldest bodies only in storage
    limit=st.integers(0, 30),
)
def test_a_run_gives_what_the_cursor_gives_one_by_one(
        delivered: int, acked: set[int], deleted: set[int], priority: set[int],
        evicted: int, limit: int) -> None:
    """``take_run`` (the pump's way through a backlog) gives the messages, and leaves
    the cursor, as ``next_ready`` asked ``limit`` times does while nothing returned,
    prioritized or delayed waits: past acked, out, deleted and special seqs, and stopping
    before a body that is in storage only. ``put_back`` undoes what it gave."""
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=delivered)
    h.publish(*(send(CH, i, priority=1 if i in priority else 0) for i in range(1, 25)))
    h.ack(s, [d for d in h.take(sub) if d.seq in acked])  # the others stay out
    gc = sub.group.gcs[CH]
    gc.prio.clear()  # the specials stay special: the cursor passes them
    log = h.broker.channels[CH]
    for seq in deleted:
        log.delete_one(seq)
    log.evict_bytes(sum(m.size() for m in log.cache.values() if m.seq <= evicted))
    gc.cursor = 1  # as a put_back leaves it: what it passes on the way is passed again
    assert gc.plain()
    one_by_one = []
    while len(one_by_one) < limit:
        try:
            m = gc.next_ready(h.now)
        except NeedLoad:
            break
        if m is None:
            break
        one_by_one.append(m.seq)
    after = gc.cursor
    gc.cursor = 1
    run = gc.take_run(limit)
    assert [m.seq for m in run] == one_by_one
    assert gc.cursor == after
    if run:
        gc.put_back(run[0].seq)
        assert gc.take_run(limit) == run
