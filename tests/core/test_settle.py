"""Settlement: fenced acks, nack front/back/delay, leases, disconnect, requeue limit."""

from __future__ import annotations

from typing import Any

import pytest

from minou.core.broker import Session
from minou.core.group import Subscription
from minou.core.log import ChannelOptions
from minou.core.settlement import LEASE_HEAP_SLACK
from minou.errors import BadRequest, ErrorCode
from minou.protocol.frames import Delivery

from .helpers import Harness, consumer, payloads, seqs

CH = "orders/v1/1"


def _codes(failed: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    return [(tag, code) for tag, code, _ in failed]


# ---------------------------------------------------------------- fenced tags
def test_ack_with_unknown_tag_is_refused() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns=CH, group="g")
    failed = h.ack(s, [424242])
    assert _codes(failed) == [(424242, ErrorCode.UNKNOWN_DELIVERY)]
    assert failed[0][2]
    assert h.broker.counters.refused["unknown_delivery"] == 1


def test_ack_twice_is_refused_the_second_time() -> None:
    h, s, sub = consumer(CH, [1])
    (d,) = h.take(sub)
    assert h.ack(s, [d]) == []
    assert _codes(h.ack(s, [d])) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert h.broker.counters.acked == 1


def test_only_the_session_a_message_was_delivered_to_can_settle_it() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g")
    h.subscribe(b, patterns=CH, group="g")
    h.publish_values(CH, [1])
    (d,) = h.take(sa)
    assert _codes(h.ack(b, [d])) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert _codes(h.nack(b, [d])) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert _codes(h.extend(b, [d], 30)) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert h.ack(a, [d]) == []  # b's attempts did not disturb a's lease


def test_stale_tag_after_lease_expiry_is_refused_and_redelivery_can_be_acked() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", lease=10.0)
    h.publish_values(CH, ["job"])
    (old,) = h.take(sa)
    sb = h.subscribe(b, patterns=CH, group="g", lease=10.0)
    h.tick(9.9)
    assert h.pump() == {}
    h.tick(0.1)  # the lease has run out
    assert h.broker.counters.lease_expired == 1
    assert sa.unsettled == 0
    got = h.pump()
    new = (got.get(sa) or []) + (got.get(sb) or [])
    assert len(new) == 1
    (new_d,) = new
    assert new_d.seq == old.seq and new_d.tag != old.tag
    assert new_d.attempts == 2
    failed = h.ack(a, [old])
    assert _codes(failed) == [(old.tag, ErrorCode.UNKNOWN_DELIVERY)]
    owner = a if sa in got else b
    assert h.ack(owner, [new_d]) == []
    assert h.broker.counters.acked == 1


def test_stale_tag_is_refused_even_when_redelivered_to_the_same_session() -> None:
    h, s, sub = consumer(CH, [1], lease=5.0)
    (old,) = h.take(sub)
    h.tick(5.0)
    (new,) = h.take(sub)
    assert new.seq == old.seq
    assert _codes(h.ack(s, [old, new])) == [(old.tag, ErrorCode.UNKNOWN_DELIVERY)]
    h.tick(100.0)
    assert h.pump() == {}


def test_mixed_ack_reports_only_the_bad_tags() -> None:
    h, s, sub = consumer(CH, [1, 2, 3], prefetch=3)
    got = h.take(sub)
    failed = h.ack(s, [got[0].tag, 999, got[2].tag])
    assert _codes(failed) == [(999, ErrorCode.UNKNOWN_DELIVERY)]
    assert sub.unsettled == 1
    assert h.broker.counters.acked == 2  # each ack of the frame counted


# ---------------------------------------------------------------------- nack
def test_nack_front_keeps_order_for_a_single_consumer() -> None:
    h, s, sub = consumer(CH, [1, 2, 3, 4, 5], prefetch=3)
    got = h.take(sub)
    assert seqs(got) == [1, 2, 3]
    assert h.nack(s, list(reversed(got)), front=True) == []
    again = h.take(sub)
    assert seqs(again) == [1, 2, 3]
    assert [d.attempts for d in again] == [2, 2, 2]
    h.ack(s, again)
    assert seqs(h.take(sub)) == [4, 5]
    assert h.broker.counters.nacked == 3


def test_nack_back_goes_after_the_messages_already_queued() -> None:
    h, s, sub = consumer(CH, [1, 2, 3], prefetch=1)
    (d1,) = h.take(sub)
    h.nack(s, [d1], front=False)
    h.publish_values(CH, [4])  # published after the nack: comes after the requeued one
    order = []
    for _ in range(4):
        (d,) = h.take(sub)
        order.append((d.seq, d.attempts))
        h.ack(s, [d])
    assert order == [(2, 1), (3, 1), (1, 2), (4, 1)]


@pytest.mark.parametrize("how", ["nack", "withdraw"])
def test_a_delivery_given_back_does_not_expire_later_as_a_lease(how: str) -> None:
    """A nacked or withdrawn delivery is over: when its lease would have run out,
    nothing expires, no lease is counted as expired and the connection is not told
    to recount its credit (only the redelivery holds a lease then)."""
    from .test_timing import _PollConn

    h = Harness()
    conn = _PollConn()
    s = Session("c", conn=conn)
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1, lease=10.0)
    h.publish_values(CH, [1])
    (d,) = h.take(sub)
    if how == "nack":
        h.nack(s, [d])
    else:
        h.broker.withdraw(s, [d.tag], h.now)
    h.tick(5.0)
    (again,) = h.take(sub)  # its lease runs to 15 s
    h.tick(5.0)  # 10 s: when the first delivery's lease would have run out
    assert h.broker.counters.lease_expired == 0
    assert conn.recounts == 0
    assert h.ack(s, [again]) == []


def test_nack_with_delay_waits_then_redelivers() -> None:
    h, s, sub = consumer(CH, [1, 2], prefetch=1)
    (d1,) = h.take(sub)
    h.nack(s, [d1], delay=30.0)
    (d2,) = h.take(sub)
    assert d2.seq == 2
    h.ack(s, [d2])
    h.tick(29.9)
    assert h.pump() == {}
    h.tick(0.1)
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 2)


def test_attempts_grow_with_each_redelivery() -> None:
    h, s, sub = consumer(CH, [1], lease=5.0)
    attempts = []
    for how in ("front", "back", "delay", "lease", "front"):
        (d,) = h.take(sub)
        attempts.append(d.attempts)
        if how == "lease":
            h.tick(5.0)
        else:
            h.nack(s, [d], front=how == "front", delay=1.0 if how == "delay" else 0.0)
            h.tick(1.0)
    (d,) = h.take(sub)
    attempts.append(d.attempts)
    assert attempts == [1, 2, 3, 4, 5, 6]
    assert h.broker.counters.redelivered == 5


def test_negative_nack_delay_is_refused() -> None:
    h, s, sub = consumer(CH, [1])
    (d,) = h.take(sub)
    with pytest.raises(BadRequest):
        h.nack(s, [d], delay=-1.0)
    assert h.ack(s, [d]) == []


# ---------------------------------------------------------------------- leases
def test_extend_keeps_a_lease_alive_past_its_original_expiry() -> None:
    h, s, sub = consumer(CH, [1], lease=10.0)
    (d,) = h.take(sub)
    h.tick(8.0)
    assert h.extend(s, [d], 20.0) == []
    h.tick(5.0)  # 13 s after delivery: past the original 10 s lease
    assert h.broker.counters.lease_expired == 0
    h.tick(14.0)  # 27 s: still inside the extension (8 + 20)
    assert h.pump() == {}
    assert h.ack(s, [d]) == []


def test_extended_lease_still_expires_eventually() -> None:
    h, s, sub = consumer(CH, [1], lease=10.0)
    (d,) = h.take(sub)
    h.extend(s, [d], 20.0)
    h.tick(20.0)
    assert h.broker.counters.lease_expired == 1
    (again,) = h.take(sub)
    assert again.attempts == 2
    assert _codes(h.extend(s, [d], 5.0)) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]


def test_a_lease_extended_twice_to_the_same_time_comes_back_once() -> None:
    """An extend frame naming a tag twice, and two extends to the same time: when the
    lease runs out the message comes back once, the reader's credit once (prefetch 1
    still means one at a time), and the expiry is counted once."""
    h, s, sub = consumer(CH, [1, 2, 3], lease=10.0, prefetch=1)
    (d,) = h.take(sub)
    assert h.extend(s, [d, d], 20.0) == []
    assert h.extend(s, [d], 20.0) == []  # the same time again: the clock has not moved
    h.tick(20.0)
    assert sub.unsettled == 0 and h.broker.counters.lease_expired == 1
    assert [(x.seq, x.attempts) for x in h.take(sub)] == [(1, 2)]
    assert sub.unsettled == 1


def test_extending_a_lease_again_and_again_holds_one_entry_for_it() -> None:
    """A client extending the same lease in a loop (each extend a later time) made the
    broker keep every earlier expiry until its time, up to MAX_LEASE_S: the lease heap
    now keeps at most twice its live entries (plus a slack), and the lease still runs
    out at the last time it was given, once."""
    h, s, sub = consumer(CH, [1, 2], lease=10.0, prefetch=2)
    d1, d2 = h.take(sub)
    heap = h.broker.state.lease_heap
    for i in range(3 * LEASE_HEAP_SLACK):
        h.extend(s, [d1], 100.0 + i)  # later each time
        assert len(heap) <= 2 + LEASE_HEAP_SLACK
        if i == 9:  # a few stale entries wait for a compaction: no rebuild per extend
            assert len(heap) == 10
    h.extend(s, [d2], 50.0)
    h.tick(50.0)
    assert h.broker.counters.lease_expired == 1  # d2 only
    h.tick(100.0 + (3 * LEASE_HEAP_SLACK - 1) - 50.0 - 0.5)  # just before d1's last time
    assert h.broker.counters.lease_expired == 1 and sub.unsettled == 1
    h.tick(0.5)
    assert h.broker.counters.lease_expired == 2 and sub.unsettled == 0
    assert heap == []


def test_settled_leases_leave_no_heap_entries_behind_for_long() -> None:
    """Extended leases acked long before their time: their entries go at the next
    compaction, not at their (up to 12 h away) time; the ones still out stay."""
    n = 2 * LEASE_HEAP_SLACK
    h, s, sub = consumer(CH, list(range(n + 1)), lease=10.0, prefetch=n + 1)
    got = h.take(sub)
    assert h.extend(s, got, 3600.0) == []
    assert h.ack(s, got[:n]) == []  # all but the last
    heap = h.broker.state.lease_heap
    assert len(heap) == n + 1  # their entries are still there: no extend since
    for i in range(2 * n + LEASE_HEAP_SLACK):  # the one left, extended on and on
        h.extend(s, got[n:], 3600.0 + i)
        assert len(heap) <= 2 * (n + 1) + LEASE_HEAP_SLACK  # what was live, twice
    assert {entry[3].tag for entry in heap} == {got[n].tag}  # the acked ones' went
    assert len(heap) <= 2 + LEASE_HEAP_SLACK
    h.tick(3600.0 + 2 * n + LEASE_HEAP_SLACK)
    assert h.broker.counters.lease_expired == 1 and heap == []


def test_extend_rejects_bad_durations() -> None:
    h = Harness()
    s = Session("c")
    with pytest.raises(BadRequest):
        h.extend(s, [1], 0)
    with pytest.raises(BadRequest):
        h.extend(s, [1], 10 * 86400)


def test_default_lease_comes_from_the_broker() -> None:
    h = Harness(default_lease=3.0)
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g")
    h.publish_values(CH, [1])
    h.take(sub)
    h.tick(3.0)
    assert h.broker.counters.lease_expired == 1


# ------------------------------------------------------------------ disconnect
def test_disconnect_returns_unsettled_to_the_front_in_seq_order() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=3)
    h.publish_values(CH, [1, 2, 3, 4, 5])
    got = h.take(sa)
    assert seqs(got) == [1, 2, 3]
    h.ack(a, got[1:2])  # seq 2 is done
    h.disconnect(a)
    assert a.subs == {} and a.leases == {}
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=10)
    again = h.take(sb)
    assert [(d.seq, d.attempts) for d in again] == [(1, 2), (3, 2), (4, 1), (5, 1)]
    assert _codes(h.ack(a, got[:1])) == [(got[0].tag, ErrorCode.UNKNOWN_DELIVERY)]


# --------------------------------------------------------------- requeue limit
def test_requeue_limit_dead_letters_the_message() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=2))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    (o,) = h.publish_values(CH, [{"n": 1}])
    h.publish_values(CH, [{"n": 2}])
    deliveries = 0
    while True:
        got = h.take(sub)
        assert got, "message neither delivered nor dead-lettered"
        (d,) = got
        if d.seq != 1:
            break
        deliveries += 1
        h.nack(s, [d])
    assert deliveries == 3  # the first delivery and two requeues
    assert d.seq == 2  # the next message flows on
    assert h.broker.counters.dead_lettered == 1
    batch = h.commit()
    (dead,) = [m for m in batch.messages if m.channel == "_dead/orders/v1/1"]
    assert dead.headers is not None
    assert dead.headers["x-dead-reason"] == "requeue_limit"
    assert dead.headers["x-original-channel"] == CH
    assert dead.headers["x-original-seq"] == "1"
    assert dead.headers["x-original-id"] == o.id
    assert dead.headers["x-dead-group"] == "consume:g"
    assert dead.data == b'{"n": 1}'
    # The original is settled for this group: never delivered again.
    h.ack(s, [d])
    h.tick(3600)
    assert h.pump() == {}
    # The dead-letter channel can be consumed like any other.
    reader = h.subscribe(Session("ops"), patterns="_dead/orders/v1/1", group="ops")
    (dl,) = h.take(reader)
    assert payloads([dl]) == [{"n": 1}]
    assert dl.headers is not None and dl.headers["x-dead-reason"] == "requeue_limit"


def test_requeue_limit_only_settles_for_the_group_that_gave_up() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="flaky")
    sb = h.subscribe(b, patterns=CH, group="fine")
    h.publish_values(CH, [1])
    got = h.pump()
    h.nack(a, got[sa])
    assert h.broker.counters.dead_lettered == 1
    assert h.take(sa) == []
    assert h.ack(b, got[sb]) == []


def test_lease_expiry_counts_toward_the_requeue_limit() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=1))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", lease=1.0)
    h.publish_values(CH, [1])
    for _ in range(2):
        assert seqs(h.take(sub)) == [1]
        h.tick(1.0)
    assert h.take(sub) == []
    assert h.broker.counters.dead_lettered == 1
    assert "_dead/orders/v1/1" in h.broker.channels


def test_dead_lettering_off_drops_but_counts() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0, dead_letter=False))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g")
    h.publish_values(CH, [1])
    h.nack(s, h.take(sub))
    assert h.broker.counters.dead_lettered == 1
    assert "_dead/orders/v1/1" not in h.broker.channels
    assert h.commit().messages == []


def test_extending_one_lease_does_not_hold_back_the_expiry_of_the_others() -> None:
    h, s, sub = consumer(CH, [1, 2, 3], prefetch=3, lease=10.0)
    d1, d2, d3 = h.take(sub)
    h.extend(s, [d1], 100.0)
    h.tick(10.0)
    assert h.broker.counters.lease_expired == 2
    assert [(d.seq, d.attempts) for d in h.take(sub)] == [(2, 2), (3, 2)]
    assert [tag for tag, _, _ in h.ack(s, [d1, d2, d3])] == [d2.tag, d3.tag]


# ------------------------------------------------------------------- withdraw
def test_withdraw_puts_a_delivery_nobody_took_back_in_front_as_if_never_sent() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    poller, worker = Session("poller"), Session("worker")
    sp = h.subscribe(poller, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1, 2])
    (d,) = h.take(sp)
    sp.prefetch = 0  # the request that was to take it went away: no credit left
    h.broker.withdraw(poller, [d.tag, 999], h.now)  # an unknown tag is ignored
    assert sp.unsettled == 0 and not poller.leases
    assert _codes(h.ack(poller, [d])) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    sw = h.subscribe(worker, 2, patterns=CH, group="g", prefetch=5)
    got = h.take(sw)
    # Not a retry: the same first attempt, in order, and no dead letter (requeue_limit=0).
    assert seqs(got) == [1, 2] and [m.attempts for m in got] == [1, 1]
    assert h.broker.counters.dead_lettered == 0


def test_withdraw_keeps_the_attempt_count_of_a_redelivery() -> None:
    h = Harness()
    s = Session("poller")
    sub = h.subscribe(s, patterns=CH, group="g", lease=5.0)
    h.publish_values(CH, [1])
    (d,) = h.take(sub)
    h.tick(5.0)  # the lease runs out: a real retry
    (d,) = h.take(sub)
    assert d.attempts == 2
    h.broker.withdraw(s, [d.tag], h.now)  # the second delivery reached nobody
    (d,) = h.take(sub)
    assert d.attempts == 2
    h.tick(5.0)
    (d,) = h.take(sub)
    assert d.attempts == 3
    h.broker.withdraw(s, [d.tag], h.now)  # the third delivery reached nobody
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (1, 3)
    h.broker.withdraw(s, [again.tag], h.now)
    (third,) = h.take(sub)
    assert third.attempts == 3


def test_withdraw_goes_on_past_unknown_tags() -> None:
    h = Harness()
    s = Session("poller")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2])
    d1, d2 = h.take(sub)
    h.broker.withdraw(s, [999, d1.tag, 998, d2.tag], h.now)
    assert sub.unsettled == 0 and not s.leases
    assert [(d.seq, d.attempts) for d in h.take(sub)] == [(1, 1), (2, 1)]


# -------------------------------------------------------------- limits of settlement
def test_extend_accepts_the_longest_lease_and_refuses_longer() -> None:
    from minou.limits import MAX_LEASE_S

    h, s, sub = consumer(CH, [1], lease=5.0)
    (d,) = h.take(sub)
    assert h.extend(s, [d], MAX_LEASE_S) == []
    h.tick(MAX_LEASE_S - 1.0)
    assert h.ack(s, [d]) == []
    with pytest.raises(BadRequest) as exc:
        h.extend(s, [d], MAX_LEASE_S * 1.0001)
    assert exc.value.code == ErrorCode.BAD_REQUEST and exc.value.message


def test_nack_accepts_the_longest_delay_and_refuses_longer() -> None:
    from minou.limits import MAX_DELAY_S

    h, s, sub = consumer(CH, [1])
    (d,) = h.take(sub)
    with pytest.raises(BadRequest) as exc:
        h.nack(s, [d], delay=MAX_DELAY_S * 1.0001)
    assert exc.value.code == ErrorCode.BAD_REQUEST and exc.value.message
    assert h.nack(s, [d], delay=MAX_DELAY_S) == []
    h.tick(MAX_DELAY_S - 1.0)
    assert h.pump() == {}


def test_extend_of_an_unknown_tag_is_refused_and_counted() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns=CH, group="g")
    failed = h.extend(s, [31337], 30.0)
    assert _codes(failed) == [(31337, ErrorCode.UNKNOWN_DELIVERY)]
    assert failed[0][2]
    assert h.broker.counters.refused["unknown_delivery"] == 1


def test_an_unknown_tag_among_several_does_not_stop_the_others_being_extended() -> None:
    h, s, sub = consumer(CH, [1, 2], lease=10.0, prefetch=2)
    d1, d2 = h.take(sub)
    h.tick(8.0)
    assert _codes(h.extend(s, [31337, d1.tag, d2.tag], 20.0)) == \
        [(31337, ErrorCode.UNKNOWN_DELIVERY)]
    h.tick(5.0)  # past the first lease: both extended, neither expired
    assert h.broker.counters.lease_expired == 0
    assert h.ack(s, [d1, d2]) == []


def test_a_dead_lettered_message_is_not_counted_as_acked_by_its_group() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=1))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g")
    h.publish_values(CH, [1, 2])
    for _ in range(2):
        (d,) = h.take(sub)
        assert d.seq == 1
        h.nack(s, [d])
    (d2,) = h.take(sub)
    h.ack(s, [d2])
    assert h.broker.counters.dead_lettered == 1
    stats = h.broker.group_stats(sub.group, h.now)
    assert (stats["acked"], stats["delivered"]) == (1, 3)


class _Latency:
    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, value: float) -> None:
        self.seen.append(value)

    def observe_since(self, now: float, times: list[float]) -> None:
        self.seen.extend(now - t for t in times)


def test_ack_latency_is_the_time_from_delivery_to_ack_even_after_an_extend() -> None:
    h = Harness()
    latency = _Latency()
    h.broker.ack_latency = latency
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2, lease=30.0)
    h.publish_values(CH, [1, 2])
    d1, d2 = h.take(sub)
    h.advance(3.0)
    h.ack(s, [d1])
    h.advance(7.0)
    h.extend(s, [d2], 60.0)
    h.advance(5.0)
    h.ack(s, [d2])
    assert latency.seen == [3.0, 15.0]


# ------------------------------------- a return waits for its count to be stored
def _held(h: Harness, s: Session, **sub_kw: Any) -> tuple[Subscription, Delivery]:
    """A consumer that got the message and gave it back before the commit storing its
    attempt count (the nack reaches the broker first)."""
    sub = h.subscribe(s, patterns=CH, group="g", **sub_kw)
    h.publish_values(CH, ["job"])
    (d,) = h.take(sub)
    return sub, d


def test_a_message_returned_before_its_count_is_stored_waits_for_that_commit() -> None:
    h = Harness()
    s = Session("c")
    sub, d = _held(h, s, prefetch=1)
    assert h.engine.settle(s, "nack", [d.tag], None) == []
    assert sub.unsettled == 0  # its credit is back at once
    assert h.take(sub) == []
    assert _codes(h.ack(s, [d])) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY)]
    stats = h.broker.group_stats(sub.group, h.now)
    assert stats["waiting"] == 0
    h.commit()
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (d.seq, 2)


def test_a_held_return_goes_where_the_nack_asked_once_its_count_is_stored() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, ["job", "next", "later"])
    (job,) = h.take(sub)
    h.engine.settle(s, "nack", [job.tag], None, front=True)  # held: its count is unstored
    (nxt,) = h.take(sub)  # the others flow meanwhile
    assert payloads([nxt]) == ["next"]
    h.ack(s, [nxt])
    h.commit()
    assert payloads(h.take(sub)) == ["job"]  # to the front, before "later"


def test_a_held_return_is_not_returned_twice_by_its_extended_lease_running_out() -> None:
    h = Harness()
    s = Session("c")
    sub, d = _held(h, s, prefetch=1, lease=2.0)
    h.extend(s, [d], 5.0)
    h.engine.settle(s, "nack", [d.tag], None)
    h.advance(10.0)
    h.broker.tick(h.now)  # the extended lease's expiry comes up while it waits
    assert h.broker.counters.lease_expired == 0
    assert sub.unsettled == 0
    h.commit()
    assert [x.attempts for x in h.take(sub)] == [2]


def test_a_held_return_dropped_by_a_seek_gives_no_credit_back_twice() -> None:
    h = Harness()
    s = Session("c")
    sub, d = _held(h, s, prefetch=1)
    h.engine.settle(s, "nack", [d.tag], None)
    assert h.broker.set_position(s, "g", {CH: 2}, h.now) == {CH: 0}
    assert sub.unsettled == 0
    h.commit()
    assert h.take(sub) == []  # settled by the seek, not requeued
    h.publish_values(CH, ["next"])
    assert payloads(h.take(sub)) == ["next"]


def test_after_a_restart_the_first_delivery_returned_early_still_waits_for_its_count() -> None:
    """The first batch of a broker's run stores its first deliveries' counts: a nack
    that comes before it lands must not let the message out again with attempt 1 still
    stored (a crash would then hand it out as attempt 1 once more)."""
    from .test_group_channel import _restarted

    h = Harness()
    h.publish_values(CH, ["job"])
    h = _restarted(h)  # this run has committed nothing yet
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    (d,) = h.take(sub)
    h.engine.settle(s, "nack", [d.tag], None)
    assert h.take(sub) == []
    h.commit()
    (again,) = h.take(sub)
    assert (again.seq, again.attempts) == (d.seq, 2)


def test_the_lease_heap_bound_follows_the_live_leases_down() -> None:
    """Many extended leases running out by time (not compacted away) leave a heap
    whose bound is again what is live: one lease extended on and on afterwards keeps
    it small, not at twice the earlier crowd."""
    n = 2 * LEASE_HEAP_SLACK
    h, s, sub = consumer(CH, list(range(n)), lease=10.0, prefetch=n)
    got = h.take(sub)
    assert h.extend(s, got, 60.0) == []  # all live: kept as they are
    h.tick(60.0)
    assert h.broker.counters.lease_expired == n and h.broker.state.lease_heap == []
    d = Session("d")
    (again,) = h.take(h.subscribe(d, patterns=CH, group="g", prefetch=1))
    heap = h.broker.state.lease_heap
    for i in range(3 * LEASE_HEAP_SLACK):
        assert h.extend(d, [again], 100.0 + i) == []
    assert len(heap) <= 2 + LEASE_HEAP_SLACK
