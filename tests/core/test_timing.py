"""Time-driven behaviour: TTL, publish-time delay, priorities, and log truncation."""

from __future__ import annotations

from minou.core.broker import Session
from minou.core.log import ChannelOptions

from .helpers import Harness, payloads, send, seqs

CH = "orders/v1/1"
DEAD = "_dead/orders/v1/1"


def _dead_messages(h: Harness) -> list:
    return [m for m in h.commit().messages if m.channel == DEAD]


# ------------------------------------------------------------------------ TTL
def test_per_message_ttl_expired_messages_are_not_delivered_and_are_dead_lettered() -> None:
    h = Harness()
    h.publish(send(CH, "short", ttl=10.0), send(CH, "forever"), send(CH, "long", ttl=100.0))
    h.advance(10.0)
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["forever", "long"]
    assert h.broker.counters.expired == 1
    assert h.broker.channels[CH].expired == 1
    assert h.broker.counters.dead_lettered == 1
    batch = h.commit()
    assert (CH, 1) in batch.deletes
    (dead,) = [m for m in batch.messages if m.channel == DEAD]
    assert dead.headers is not None
    assert dead.headers["x-dead-reason"] == "ttl"
    assert dead.headers["x-original-seq"] == "1"
    assert dead.expires_at is None  # a dead letter does not expire again


def test_message_delivered_before_its_ttl_is_not_expired() -> None:
    h = Harness()
    h.publish(send(CH, "x", ttl=10.0))
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    h.advance(9.9)
    assert payloads(h.take(sub)) == ["x"]
    assert h.broker.counters.expired == 0


def test_an_expired_message_met_in_a_pump_gives_no_member_more_than_its_prefetch() -> None:
    """Members a (prefetch 1) and b share a queue; the pump meets an expired message
    after a took its one: a still has no credit, so the rest goes to b."""
    h = Harness()
    a = h.subscribe(Session("a"), patterns=CH, group="g", prefetch=1)
    b = h.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "m1"), send(CH, "old", ttl=10.0), send(CH, "m3"), send(CH, "m4"))
    h.advance(10.0)
    got = h.pump()
    assert payloads(got[a]) == ["m1"] and a.unsettled == 1
    assert payloads(got[b]) == ["m3", "m4"]
    assert h.broker.counters.expired == 1


def test_per_channel_ttl() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(ttl=5.0) if key == "orders/v1"
                else ChannelOptions())
    h.publish(send(CH, "a"), send("other/v1/1", "b"))
    h.advance(4.0)
    h.publish(send(CH, "c"))
    h.advance(1.0)
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    other = h.subscribe(s, 2, patterns="other/v1/1", group="g2")
    got = h.pump()
    assert payloads(got[sub]) == ["c"]
    assert payloads(got[other]) == ["b"]
    assert h.broker.counters.expired == 1
    (dead,) = _dead_messages(h)
    assert dead.headers is not None and dead.headers["x-dead-reason"] == "ttl"


def test_per_message_ttl_overrides_the_channel_ttl() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(ttl=5.0))
    h.publish(send(CH, "a", ttl=60.0))
    h.advance(30.0)
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    assert payloads(h.take(sub)) == ["a"]


def test_expire_from_a_storage_scan() -> None:
    h = Harness()
    s = Session("c")
    h.publish(send(CH, "a", ttl=1.0), send(CH, "b", ttl=1.0), send(CH, "c"))
    h.advance(2.0)
    assert h.broker.expire([(CH, 1), (CH, 2), ("orders/v1/unknown", 1)], h.now) == 2
    assert h.broker.expire([(CH, 1)], h.now) == 0  # already gone
    assert h.broker.counters.expired == 2
    assert h.broker.channels[CH].count == 1
    batch = h.commit()
    assert sorted(batch.deletes) == [(CH, 1), (CH, 2)]
    assert [m.headers["x-dead-reason"] for m in batch.messages if m.headers] == ["ttl", "ttl"]
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["c"]


def test_ttl_dead_letter_off() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(dead_letter=False))
    h.publish(send(CH, "a", ttl=1.0))
    h.advance(1.0)
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    assert h.take(sub) == []
    assert h.broker.counters.expired == 1
    assert DEAD not in h.broker.channels


def test_a_full_dead_letter_channel_drops_its_oldest_even_when_its_channel_refuses() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2, overflow="refuse"))
    for i in range(3):
        a, b = h.publish(send(CH, f"a{i}", ttl=1.0), send(CH, f"b{i}", ttl=1.0))
        h.advance(1.0)  # what the storage scan finds past its TTL:
        assert h.broker.expire([(CH, a.seq), (CH, b.seq)], h.now) == 2
        h.commit()
    dead = h.broker.channels[DEAD]
    assert (h.broker.counters.expired, h.broker.counters.dead_lettered) == (6, 6)
    assert (dead.count, dead.dropped, h.broker.counters.dropped) == (2, 4, 4)
    sub = h.subscribe(Session("c"), patterns=DEAD, group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["a2", "b2"]  # the newest two are kept


# ---------------------------------------------------------------------- delay
def test_publish_time_delay() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "later", delay=10.0), send(CH, "now"))
    assert payloads(h.take(sub)) == ["now"]
    h.tick(9.9)
    assert h.pump() == {}
    h.tick(0.1)
    (d,) = h.take(sub)
    assert (payloads([d]), d.seq, d.attempts) == (["later"], 1, 1)


def test_publish_time_delay_for_a_reader_that_attaches_later() -> None:
    # Regression: attach used to leave the GroupChannel out of the timed set, so tick
    # never released a delay that was committed before the reader existed.
    h = Harness()
    h.publish(send(CH, "later", delay=10.0))
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    assert h.pump() == {}
    h.tick(10.0)
    assert payloads(h.take(sub)) == ["later"]


def test_publish_time_delay_after_a_replay_reset() -> None:
    h = Harness()
    s1 = Session("svc")
    h.subscribe(s1, kind="listen", patterns=CH)
    h.disconnect(s1)
    h.publish(send(CH, "later", delay=10.0))
    sub = h.subscribe(Session("svc"), kind="listen", patterns=CH, start="seq:1")
    assert h.pump() == {}
    h.tick(10.0)
    assert payloads(h.take(sub)) == ["later"]


def test_a_delayed_message_is_released_on_time_whatever_its_seq() -> None:
    """The tick compares the due time with the clock: here the message's seq (21) is
    past the clock's seconds (5), and nothing else wakes the reader."""
    h = Harness(now=0.0)
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=100)
    h.publish(*(send(CH, f"m{i}") for i in range(20)), send(CH, "later", delay=5.0))
    h.ack(s, h.take(sub))
    h.tick(4.9)
    assert h.pump() == {}
    h.tick(0.1)
    (d,) = h.take(sub)
    assert (payloads([d]), d.seq) == (["later"], 21)


def test_delayed_message_reaches_a_late_reader_once_something_else_wakes_the_channel() -> None:
    h = Harness()
    h.publish(send(CH, "later", delay=10.0))
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    h.tick(10.0)
    h.publish(send(CH, "poke"))
    assert sorted(payloads(h.take(sub))) == ["later", "poke"]


# ----------------------------------------------------------------- priorities
def test_higher_priority_first_among_ready_messages() -> None:
    h = Harness()
    h.publish(send(CH, "p0-a"), send(CH, "p5-a", priority=5), send(CH, "p9", priority=9),
              send(CH, "p0-b"), send(CH, "p5-b", priority=5))
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    got = h.take(sub)
    assert payloads(got) == ["p9", "p5-a", "p5-b", "p0-a", "p0-b"]
    assert [d.priority for d in got] == [9, 5, 5, 0, 0]


def test_priority_message_overtakes_the_queue_of_a_busy_consumer() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1, 2, 3])
    (first,) = h.take(sub)
    h.publish(send(CH, "urgent", priority=9))
    h.ack(s, [first])
    (d,) = h.take(sub)
    assert payloads([d]) == ["urgent"]
    h.ack(s, [d])
    order = []
    for _ in range(2):
        (d,) = h.take(sub)
        order.append(d.seq)
        h.ack(s, [d])
    assert order == [2, 3]


def test_priority_and_delay_together() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, "delayed-high", priority=9, delay=5.0), send(CH, "plain"))
    assert payloads(h.take(sub)) == ["plain"]
    h.tick(5.0)
    assert payloads(h.take(sub)) == ["delayed-high"]


# ----------------------------------------------------------------- truncation
def test_truncates_once_every_group_acked() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g1", prefetch=10)
    sb = h.subscribe(b, patterns=CH, group="g2", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    log = h.broker.channels[CH]
    got = h.pump()
    h.ack(a, got[sa])
    batch = h.broker.take_writes()
    assert batch.truncates == {}
    assert log.count == 3
    h.ack(b, got[sb][1:])  # seq 1 still out for g2
    assert h.broker.take_writes().truncates == {}
    h.ack(b, got[sb][:1])
    batch = h.broker.take_writes()
    assert batch.truncates == {CH: 4}
    assert (log.count, log.first_seq) == (0, 4)
    assert batch.group_states[("consume:g2", CH)][0] == 4


def test_truncation_stops_below_the_lowest_unsettled_seq() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4])
    got = h.take(sub)
    h.ack(s, [got[0], got[1], got[3]])
    assert h.broker.take_writes().truncates == {CH: 3}
    assert h.broker.channels[CH].count == 2


def test_without_a_group_messages_stay() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    for _ in range(3):
        assert h.broker.take_writes().truncates == {}
    assert h.broker.channels[CH].count == 3
    sub = h.subscribe(Session("late"), patterns=CH, group="g", prefetch=10)
    assert seqs(h.take(sub)) == [1, 2, 3]


def test_retention_keeps_settled_messages_for_replay() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(retention=3600.0))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    h.ack(s, h.take(sub))
    assert h.broker.take_writes().truncates == {}
    replay = h.subscribe(Session("r"), kind="listen", patterns=CH, start="oldest", prefetch=10)
    assert seqs(h.take(replay)) == [1, 2]


def test_truncation_counts_expired_messages_once() -> None:
    h = Harness()
    s = Session("c")
    h.publish(send(CH, 1), send(CH, 2, ttl=1.0), send(CH, 3))
    h.advance(1.0)
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    got = h.take(sub)
    assert seqs(got) == [1, 3]
    log = h.broker.channels[CH]
    assert log.count == 2
    h.ack(s, got)
    assert h.commit().truncates == {CH: 4}
    assert (log.count, log.first_seq) == (0, 4)


def test_ttl_dead_letters_carry_no_group_and_are_plain_messages() -> None:
    h = Harness()
    (o,) = h.publish(send(CH, "urgent", priority=9, ttl=1.0))
    h.publish(send(CH, "plain", ttl=1.0))
    h.advance(1.0)
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    assert h.take(sub) == []
    first, second = _dead_messages(h)
    assert first.headers is not None and first.headers["x-dead-reason"] == "ttl"
    assert first.headers["x-original-id"] == o.id
    assert "x-dead-group" not in first.headers
    assert all(isinstance(v, str) for v in first.headers.values())  # headers are text
    assert (first.priority, second.priority) == (0, 0)  # dead letters come in order
    reader = h.subscribe(Session("ops"), patterns=DEAD, group="ops", prefetch=10)
    got = h.take(reader)
    assert payloads(got) == ["urgent", "plain"] and [d.priority for d in got] == [0, 0]


def test_each_expired_message_is_counted_on_its_channel() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    assert h.broker.expire([("nowhere/v1/1", 1), (CH, 1), (CH, 3), (CH, 3)], h.now) == 2
    stats = h.broker.channel_stats(h.broker.channels[CH], h.now)
    assert (stats["depth"], stats["expired"]) == (1, 2)
    assert h.broker.counters.expired == 2


def test_expiring_a_message_whose_body_is_in_storage_only_removes_it_without_a_copy() -> None:
    h = Harness(cache_budget=0)
    h.publish_values(CH, [1, 2])
    h.tick()  # bodies over the (empty) budget leave memory
    log = h.broker.channels[CH]
    assert log.cache == {}
    assert h.broker.expire([(CH, 1)], h.now) == 1
    assert h.broker.counters.dead_lettered == 0
    assert log.count == 1
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == [2]


# ----------------------------------------------------------------- leases
def test_an_expired_lease_leaves_its_session_and_is_counted_once() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2, lease=5.0)
    h.publish_values(CH, [1, 2])
    h.take(sub)
    assert len(s.leases) == 2  # what the server reports as this connection's unsettled
    h.tick(5.0)
    assert len(s.leases) == 0 and sub.unsettled == 0
    h.tick(1.0)
    h.tick(1.0)
    assert h.broker.counters.lease_expired == 2


class _PollConn:
    """An adapter whose credit is not a fixed prefetch (an HTTP long poll)."""

    def __init__(self) -> None:
        self.recounts = 0

    def leases_expired(self) -> None:
        self.recounts += 1


def test_each_connection_whose_leases_expired_is_told_once() -> None:
    h = Harness()
    ca, cb, cc = _PollConn(), _PollConn(), _PollConn()
    a, b, c = Session("a", conn=ca), Session("b", conn=cb), Session("c", conn=cc)
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=2, lease=5.0)
    h.publish_values(CH, [1, 2])
    assert len(h.take(sa)) == 2
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=1, lease=5.0)
    h.subscribe(c, patterns=CH, group="g", prefetch=1, lease=60.0)
    h.publish_values(CH, [3])
    assert len(h.take(sb)) == 1
    h.tick(5.0)
    assert (ca.recounts, cb.recounts, cc.recounts) == (1, 1, 0)


# ----------------------------------------------------------- the body cache
def _fill(h: Harness, sizes: dict[str, int], body: int = 100) -> dict[str, int]:
    """Publish ``sizes[channel]`` messages of ``body`` bytes to each channel; return
    the size one of them takes in the cache."""
    for channel, n in sizes.items():
        h.publish(*(send(channel, "x" * (body - 2)) for _ in range(n)))
    one = {log.cache_bytes // len(log.cache) for log in h.broker.channels.values()}
    (size,) = one
    return {"one": size}


def test_bodies_within_the_cache_budget_stay_in_memory() -> None:
    h = Harness()
    size = _fill(h, {"a/v1/1": 4, "b/v1/1": 2})["one"]
    h.broker.cache_budget = 6 * size
    h.tick()
    assert h.broker.trim_cache() == 0
    assert [len(log.cache) for log in h.broker.channels.values()] == [4, 2]


def test_over_the_budget_the_biggest_cache_gives_its_oldest_bodies_first() -> None:
    h = Harness()
    size = _fill(h, {"a/v1/1": 2, "b/v1/1": 4, "c/v1/1": 1})["one"]
    a, b, c = (h.broker.channels[n] for n in ("a/v1/1", "b/v1/1", "c/v1/1"))
    h.broker.cache_budget = 6 * size  # 7 bodies: down to 4.5, so 3 go, all from b
    assert h.broker.trim_cache() == 3 * size
    assert (sorted(a.cache), sorted(b.cache), sorted(c.cache)) == ([1, 2], [4], [1])
    assert b.cache_lo == 4


def test_trimming_goes_on_to_the_next_biggest_cache_and_stops_once_enough_is_freed() -> None:
    h = Harness()
    size = _fill(h, {"a/v1/1": 3, "b/v1/1": 4, "c/v1/1": 1})["one"]
    a, b, c = (h.broker.channels[n] for n in ("a/v1/1", "b/v1/1", "c/v1/1"))
    h.broker.cache_budget = 4 * size  # 8 bodies: down to 3, so 5 go: all of b, 1 of a
    h.tick()
    assert (sorted(a.cache), sorted(b.cache), sorted(c.cache)) == ([2, 3], [], [1])
    assert sum(log.cache_bytes for log in (a, b, c)) == 3 * size
    # Trimmed bodies are read back from storage when a reader needs them.
    sub = h.subscribe(Session("r"), patterns="a/v1/1", group="g", prefetch=10)
    assert seqs(h.take(sub)) == [1, 2, 3]
    assert len(h.loads) == 1


def test_trimming_stops_in_the_middle_of_the_second_cache() -> None:
    h = Harness()
    size = _fill(h, {"a/v1/1": 3, "b/v1/1": 4, "c/v1/1": 2})["one"]
    a, b, c = (h.broker.channels[n] for n in ("a/v1/1", "b/v1/1", "c/v1/1"))
    h.broker.cache_budget = 8 * size  # 9 bodies: down to 6, so 3 go, all from b
    assert h.broker.trim_cache() == 3 * size
    # 6 bodies left (a 3, b 1, c 2); a budget whose three quarters are 2 bodies: 4 go,
    # all of a, then the oldest of c (bigger than b)
    h.broker.cache_budget = -(-8 * size // 3)
    assert h.broker.trim_cache() == 4 * size
    assert (sorted(a.cache), sorted(b.cache), sorted(c.cache)) == ([], [4], [2])


# ------------------------------------------------------------ idle producers
def test_idle_producer_states_are_dropped_by_a_sweep_once_a_minute() -> None:
    from minou.limits import PRODUCER_IDLE_S
    from minou.protocol.frames import Send

    from .helpers import T0, js

    def resend(pid: str) -> int:
        """A producer reconnects and sends its first message again: the seq it gets
        (the original one while the broker still knows the producer)."""
        session = Session("app", producer_id=pid)
        outcomes, _ = h.broker.publish([Send(CH, js(1), pseq=1)], h.now, session=session)
        h.commit()
        return outcomes[0].seq

    h = Harness()
    first = {}
    for pid in ("00000000000000aa", "00000000000000bb"):
        session = Session("app", producer_id=pid)
        outcomes, _ = h.broker.publish([Send(CH, js(1), pseq=1)], h.now, session=session)
        h.commit()
        first[pid] = outcomes[0].seq
    h.tick()  # a sweep: nothing idle yet
    h.tick(PRODUCER_IDLE_S - 10.0)  # a sweep: still nothing idle
    h.tick(11.0)  # both idle now, but the last sweep was 11 s ago
    assert resend("00000000000000aa") == first["00000000000000aa"]
    h.now = T0 + PRODUCER_IDLE_S - 10.0 + 60.0
    h.tick()  # a minute after the last sweep: bb is forgotten
    assert resend("00000000000000bb") != first["00000000000000bb"]


def test_a_message_is_expired_from_the_moment_its_ttl_is_reached() -> None:
    h = Harness()
    h.publish(send(CH, "a", ttl=1.0), send(CH, "b", ttl=2.0), send(CH, "c"))
    h.advance(1.0)
    sub = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["b", "c"]
    assert h.broker.counters.expired == 1
    assert [m.headers["x-original-seq"] for m in _dead_messages(h)] == ["1"]
