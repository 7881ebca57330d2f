"""Operator actions: purge, delete a group, requeue dead letters, queue stats, receipts,
message ids and the one-sentence diagnosis."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from minou.auth.rules import Rules
from minou.core import maintenance as mt
from minou.core.broker import Session
from minou.core.log import ChannelLog, ChannelOptions, Msg
from minou.errors import BadRequest, ErrorCode, NotAuthorized, NotFound
from minou.protocol.frames import Send
from minou.schemas import compile_schema

from .helpers import T0, Harness, payloads, send, seqs

Q = "orders/v1"
CH = "orders/v1/1"
CH2 = "orders/v1/2"
OTHER = "orders/v2/1"
DEAD = "_dead/orders/v1/1"


def _codes(failed: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    return [(tag, code) for tag, code, _ in failed]


def _log(h: Harness, name: str = CH) -> ChannelLog:
    return h.broker.channels[name]


def _dead_letters(h: Harness, *sends: Send) -> list[Msg]:
    """Publish ``sends`` to CH, have group "g" nack each one past requeue_limit=0, commit,
    and return the dead letters as storage would hand them over (from the dead log's cache).
    """
    s = Session("worker")
    sub = h.subscribe(s, 99, patterns=CH, group="g", prefetch=len(sends))
    h.publish(*sends)
    got = h.take(sub)
    assert len(got) == len(sends)
    assert h.nack(s, got) == []
    h.broker.unsubscribe(s, 99, h.now)
    h.commit()
    dead = _log(h, DEAD)
    msgs = [dead.cache[seq] for seq in sorted(dead.cache)]
    assert len(msgs) == len(sends)
    return msgs


def _diagnose(h: Harness, queue: str = Q, **kw: Any) -> str:
    stats = mt.queue_stats(h.broker, queue, now=h.now)
    return mt.diagnose(h.broker, queue, stats, h.now, **kw)


# ----------------------------------------------------------- queue_of / channels_of
def test_queue_of_keeps_the_dead_letter_prefix() -> None:
    assert mt.queue_of(CH) == Q
    assert mt.queue_of("orders/v1/a%2Fb") == Q
    assert mt.queue_of(DEAD) == "_dead/orders/v1"


def test_channels_of_lists_one_version_sorted_or_one_channel() -> None:
    h = Harness()
    h.publish(send(CH2), send(CH), send(OTHER), send("orders/v11/1"), send("orders2/v1/1"))
    assert [log.name for log in mt.channels_of(h.broker, Q)] == [CH, CH2]
    assert [log.name for log in mt.channels_of(h.broker, Q, "2")] == [CH2]
    assert mt.channels_of(h.broker, Q, "3") == []
    assert mt.channels_of(h.broker, "_dead/orders/v1") == []


# ---------------------------------------------------------------------- purge
def test_purge_removes_every_committed_message_and_returns_the_count() -> None:
    h = Harness()
    h.publish_values(CH, list(range(5)))
    h.publish_values(CH2, [1])
    log = _log(h)
    assert mt.purge(h.broker, log) == 5
    assert log.count == 0 and log.first_seq == 6 and log.end == 6
    assert log.cache == {} and log.cache_bytes == 0
    assert mt.queue_stats(h.broker, Q, "1")["depth"] == 0
    assert _log(h, CH2).count == 1  # only the purged channel
    assert mt.purge(h.broker, log) == 0  # nothing left


def test_purge_counts_only_live_messages() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, list(range(6)))
    h.ack(s, h.take(sub))
    h.commit()  # seqs 1-2 truncated
    h.broker.expire([(CH, 4)], h.now)  # one deleted in the middle
    log = _log(h)
    assert (log.first_seq, log.count) == (3, 3)
    assert mt.purge(h.broker, log) == 3
    assert log.count == 0


def test_purge_batch_carries_the_truncate_and_the_next_seq() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    mt.purge(h.broker, _log(h))
    batch = h.commit()
    assert batch.truncates == {CH: 4}
    assert batch.channels[CH] == 4


def test_purge_moves_every_readers_floor_and_cursor_to_the_end() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=3)
    h.publish(send(CH, "later", delay=50.0))  # seq 1: a publish-time delay
    h.publish_values(CH, [2, 3, 4, 5, 6])
    d2, d3, _d4 = h.take(sub)
    h.nack(s, [d2], delay=30.0)
    h.nack(s, [d3])
    h.commit()
    mt.purge(h.broker, _log(h))
    batch = h.commit()  # before any pump could clean the returned seqs up
    floor, _blob = batch.group_states[("consume:g", CH)]
    assert floor == 7
    (g,) = mt.queue_stats(h.broker, Q, now=h.now)["groups"]
    assert (g["lag"], g["unsettled"]) == (0, 0)
    assert mt.oldest_unsettled(h.broker, _log(h), "consume:g") is None


def test_purge_makes_pending_leases_unknown() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2, lease=10.0)
    h.publish_values(CH, [1, 2, 3])
    d1, d2 = h.take(sub)
    assert sub.unsettled == 2
    mt.purge(h.broker, _log(h))
    assert sub.unsettled == 0 and s.leases == {} and sub.leases == {}
    assert _codes(h.ack(s, [d1])) == [(d1.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert _codes(h.nack(s, [d2])) == [(d2.tag, ErrorCode.UNKNOWN_DELIVERY)]
    assert h.broker.counters.acked == 0
    h.tick(60.0)  # the leases' expiry does not bring them back
    assert h.broker.counters.lease_expired == 0
    assert h.pump() == {}


def test_readers_continue_with_messages_published_after_the_purge() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    consumer = h.subscribe(a, patterns=CH, group="g", prefetch=2)
    listener = h.subscribe(b, kind="listen", patterns=CH, prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4])
    got = h.pump()
    (d1, d2) = got[consumer]
    h.nack(a, [d1], delay=30.0)  # a delayed retry
    h.nack(a, [d2])  # a front retry
    h.publish(send(CH, "later", delay=50.0))  # a publish-time delay
    assert mt.purge(h.broker, _log(h)) == 5
    h.tick(100.0)
    assert h.pump() == {}
    h.publish_values(CH, ["new1", "new2"])
    got = h.pump()
    assert seqs(got[consumer]) == [6, 7]
    assert [d.attempts for d in got[consumer]] == [1, 1]
    assert payloads(got[listener]) == ["new1", "new2"]
    assert h.ack(a, got[consumer]) == [] and h.ack(b, got[listener]) == []
    h.commit()
    assert _log(h).count == 0


def test_messages_not_yet_committed_at_purge_time_survive() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, ["old1", "old2"])
    h.publish(send(CH, "inflight1"), send(CH, "inflight2", priority=5), commit=False)
    log = _log(h)
    assert mt.purge(h.broker, log) == 2
    batch = h.commit()
    assert [m.seq for m in batch.messages] == [3, 4]
    assert log.count == 2
    got = h.take(sub)
    assert sorted(payloads(got)) == ["inflight1", "inflight2"]
    assert h.ack(s, got) == []


# ---------------------------------------------------------------- delete_group
def test_delete_group_refuses_while_it_has_members() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns=CH, group="g")
    with pytest.raises(BadRequest, match="member"):
        mt.delete_group(h.broker, "consume:g", h.now)
    assert "consume:g" in h.broker.groups
    assert len(_log(h).states) == 1


def test_delete_group_unknown_is_not_found() -> None:
    h = Harness()
    with pytest.raises(NotFound, match="nope"):
        mt.delete_group(h.broker, "consume:nope", h.now)


def test_delete_group_forgets_definition_and_detaches_every_channel() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns="orders/v1/*", group="g")
    h.publish_values(CH, [1])
    h.publish_values(CH2, [2])
    h.broker.unsubscribe(s, 1, h.now)
    h.commit()
    result = mt.delete_group(h.broker, "consume:g", h.now)
    assert result == {"group": "consume:g", "channels": 2}
    assert "consume:g" not in h.broker.groups
    assert _log(h).states == [] and _log(h, CH2).states == []
    batch = h.commit()
    assert "consume:g" in batch.group_defs and batch.group_defs["consume:g"] is None
    assert batch.group_states[("consume:g", CH)] is None
    assert batch.group_states[("consume:g", CH2)] is None
    # A channel created afterwards is not read by the forgotten group.
    h.publish_values("orders/v1/3", [3])
    assert _log(h, "orders/v1/3").states == []
    # A new subscription of the same name starts afresh (consume: from the oldest).
    again = h.subscribe(Session("d"), patterns=CH, group="g")
    assert payloads(h.take(again)) == [1]


def test_delete_group_with_force_drops_its_members_and_their_leases() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2])
    got = h.take(sub)
    mt.delete_group(h.broker, "consume:g", h.now, force=True)
    assert s.subs == {} and s.leases == {}
    assert not sub.active and sub.unsettled == 0
    assert _codes(h.ack(s, got)) == [(d.tag, ErrorCode.UNKNOWN_DELIVERY) for d in got]
    assert h.pump() == {}
    assert h.commit().group_defs == {"consume:g": None}


def test_deleting_a_stalled_group_lets_the_other_readers_floor_truncate() -> None:
    h = Harness()
    gone, live = Session("gone"), Session("live")
    h.subscribe(gone, patterns=CH, group="stalled")
    h.broker.unsubscribe(gone, 1, h.now)
    sub = h.subscribe(live, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    h.ack(live, h.take(sub))
    assert CH not in h.commit().truncates  # "stalled" still holds everything
    assert _log(h).count == 3
    mt.delete_group(h.broker, "consume:stalled", h.now)
    batch = h.commit()
    assert batch.truncates[CH] == 4
    assert _log(h).count == 0


def test_after_deleting_a_group_the_remaining_readers_acks_truncate() -> None:
    h = Harness()
    gone, live = Session("gone"), Session("live")
    h.subscribe(gone, kind="listen", patterns=CH, name="durable")
    h.broker.unsubscribe(gone, 1, h.now)
    sub = h.subscribe(live, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    got = h.take(sub)
    mt.delete_group(h.broker, "listen:gone:durable", h.now)
    assert CH not in h.commit().truncates  # "g" has not acked yet
    h.ack(live, got)
    assert h.commit().truncates == {CH: 4}
    assert _log(h).count == 0


# --------------------------------------------------------------- requeue_dead
def test_requeue_dead_moves_dead_letters_back_with_new_seqs_and_clean_headers() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    msgs = _dead_letters(
        h,
        send(CH, {"n": 1}, headers={"trace": "t1", "x-custom": "keep"}, key="k1"),
        send(CH, {"n": 2}),
        Send(CH, b"\x00\x01", raw=True),
    )
    assert all(m.headers and m.headers["x-dead-reason"] == "requeue_limit" for m in msgs)
    assert msgs[0].headers is not None and msgs[0].headers["x-dead-group"] == "consume:g"
    dead, log = _log(h, DEAD), _log(h)
    assert (log.first_seq, log.count, dead.count) == (4, 0, 3)
    assert mt.requeue_dead(h.broker, dead, msgs, h.now) == 3
    assert dead.count == 0
    batch = h.commit()
    assert sorted(d for d in batch.deletes if d[0] == DEAD) == [(DEAD, 1), (DEAD, 2), (DEAD, 3)]
    moved = [m for m in batch.messages if m.channel == CH]
    assert [m.seq for m in moved] == [4, 5, 6]
    assert [m.data for m in moved] == [b'{"n": 1}', b'{"n": 2}', b"\x00\x01"]
    assert [m.raw for m in moved] == [False, False, True]
    assert [m.headers for m in moved] == [{"trace": "t1", "x-custom": "keep"}, None, None]
    assert moved[0].key == "k1"
    assert moved[0].id == h.broker.new_id(log, 4) != msgs[0].id
    assert log.count == 3 and dead.count == 0
    # Counted as requeued, not as published: a requeue is no new traffic
    assert (log.published, log.requeued) == (3, 3)
    assert mt.queue_stats(h.broker, Q, now=h.now)["requeued"] == 3
    # (the broker's published: the 3 sent and their 3 dead-letter copies; not 9)
    assert (h.broker.counters.published, h.broker.counters.requeued) == (6, 3)
    # The group reads them again as new messages: attempts start over.
    s = Session("c2")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    got = h.take(sub)
    assert [(d.seq, d.attempts) for d in got] == [(4, 1), (5, 1), (6, 1)]
    assert all(not (d.headers or {}).keys() & set(mt._DEAD_HEADERS) for d in got)


def test_requeue_dead_skips_letters_already_moved_or_unknown() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    msgs = _dead_letters(h, send(CH, 1), send(CH, 2))
    dead = _log(h, DEAD)
    assert mt.requeue_dead(h.broker, dead, msgs[:1], h.now) == 1
    h.commit()
    assert mt.requeue_dead(h.broker, dead, msgs, h.now) == 1  # seq 1 is gone already
    batch = h.commit()
    assert [(m.channel, m.seq) for m in batch.messages] == [(CH, 4)]
    assert mt.requeue_dead(h.broker, dead, msgs, h.now) == 0
    assert not h.commit().messages


def test_requeue_dead_leaves_letters_a_dead_channel_reader_holds() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    msgs = _dead_letters(h, send(CH, "held"), send(CH, "free"))
    ops = Session("ops")
    reader = h.subscribe(ops, patterns=DEAD, group="ops", prefetch=1)
    (held,) = h.take(reader)
    assert held.seq == 1
    dead = _log(h, DEAD)
    assert mt.requeue_dead(h.broker, dead, msgs, h.now) == 1
    assert dead.count == 1
    batch = h.commit()
    assert [d for d in batch.deletes if d[0] == DEAD] == [(DEAD, 2)]
    assert [json.loads(m.data) for m in batch.messages] == ["free"]
    assert h.ack(ops, [held]) == []  # the reader's lease is intact
    assert h.take(reader) == []  # seq 2 left the dead channel


def test_requeue_dead_refuses_a_channel_that_is_not_a_dead_letter_channel() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    with pytest.raises(BadRequest, match="not a dead-letter channel"):
        mt.requeue_dead(h.broker, _log(h), list(_log(h).cache.values()), h.now)
    assert _log(h).count == 1


def test_requeue_dead_into_a_full_channel_keeps_the_dead_letter() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0, max_items=1))
    msgs = _dead_letters(h, send(CH, "dead"))
    h.publish_values(CH, ["fills the channel"])
    dead = _log(h, DEAD)
    # The channel is full: nothing moves, and the dead letter stays where it is.
    assert mt.requeue_dead(h.broker, dead, msgs, h.now) == 0
    assert dead.count == 1
    assert isinstance(dead.lookup(1), Msg)



def test_a_letter_a_federation_link_could_not_deliver_is_kept_in_the_dead_letters() -> None:
    """server/federation.py keeps what a link's destination refused in the source
    channel's dead letters, whatever the channel's own options (dead_letter off here),
    and a full dead-letter channel drops its oldest as for any dead letter."""
    h = Harness(channel_options=lambda key: ChannelOptions(dead_letter=False, max_items=2))
    dl = h.broker.dead_letters
    first = dl.keep(CH, b'{"n": 1}', False, {"x-dead-reason": "federation"}, "k1", T0 + 5)
    second = dl.keep(CH, b"\x00", True, {}, None, T0 + 6)
    assert (first.channel, first.seq, second.seq) == (DEAD, 1, 2)
    assert (first.data, first.raw, first.headers, first.key) == (
        b'{"n": 1}', False, {"x-dead-reason": "federation"}, "k1")
    assert (second.data, second.raw, second.key) == (b"\x00", True, None)
    assert (first.published_at, second.published_at) == (T0 + 5, T0 + 6)
    assert h.broker.counters.dead_lettered == 2
    assert CH not in h.broker.channels  # the source channel is not made for it
    batch = h.commit()
    assert [(m.channel, m.seq) for m in batch.messages] == [(DEAD, 1), (DEAD, 2)]
    dead = _log(h, DEAD)
    assert (dead.count, dead.next_seq) == (2, 3)
    dl.keep(CH, b'"third"', False, {}, None, T0 + 7)  # max_items=2: the oldest goes
    batch = h.commit()
    assert (DEAD, 1) in batch.deletes and (dead.count, dead.dropped) == (2, 1)
    s = Session("reader")
    sub = h.subscribe(s, patterns=DEAD, group="dead", prefetch=10)
    got = h.take(sub)
    assert seqs(got) == [2, 3] and [d.data for d in got] == [b"\x00", b'"third"']
    assert h.broker.counters.dead_lettered == 3


# ---------------------------------------------------------------- queue_stats
def test_queue_stats_aggregates_the_channels_of_one_version() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(
        prefetch=4 if key == Q else 1, ttl=600.0 if key == Q else None, max_items=100))
    c1, c2, lis, oth = Session("c1"), Session("c2"), Session("l"), Session("o")
    s1 = h.subscribe(c1, patterns="orders/v1/*", group="g", prefetch=1)
    s2 = h.subscribe(c2, patterns="orders/v1/*", group="g", prefetch=1)
    sl = h.subscribe(lis, kind="listen", patterns=CH, start="oldest", prefetch=1)
    so = h.subscribe(oth, patterns=OTHER, group="o", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    h.publish_values(CH2, [4, 5])
    h.publish_values(OTHER, [6, 7, 8, 9])
    got = h.pump()
    assert [len(got[s]) for s in (s1, s2, sl, so)] == [1, 1, 1, 4]
    stats = mt.queue_stats(h.broker, Q, oldest={CH: h.now - 30.0, CH2: None}, now=h.now)
    assert stats["queue"] == Q
    assert [c["channel"] for c in stats["channels"]] == [CH, CH2]
    assert stats["depth"] == 5
    assert stats["published"] == 5
    assert stats["unsettled"] == 3
    assert stats["consumers"] == 2
    assert stats["listeners"] == 1
    assert {g["group"] for g in stats["groups"]} == {"consume:g", "listen:l:orders/v1/1"}
    assert stats["oldest_age_s"] == 30.0
    assert (stats["dropped"], stats["expired"]) == (0, 0)
    opts = stats["options"]
    assert (opts["prefetch"], opts["ttl"], opts["max_items"]) == (4, 600.0, 100)
    assert opts["overflow"] == "refuse" and opts["schema"] is None

    one = mt.queue_stats(h.broker, Q, "2", now=h.now)
    assert [c["channel"] for c in one["channels"]] == [CH2]
    assert (one["depth"], one["unsettled"], one["published"]) == (2, 1, 2)
    assert (one["consumers"], one["listeners"]) == (2, 0)
    assert [g["group"] for g in one["groups"]] == ["consume:g"]
    assert one["oldest_age_s"] is None

    other = mt.queue_stats(h.broker, "orders/v2", now=h.now)
    assert (other["depth"], other["unsettled"], other["consumers"]) == (4, 4, 1)
    assert [g["group"] for g in other["groups"]] == ["consume:o"]
    assert other["options"]["prefetch"] == 1


def test_queue_stats_oldest_age_is_the_maximum_and_counts_dropped_and_expired() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2,
                                                           overflow="drop_oldest"))
    h.publish_values(CH, [1, 2, 3])
    h.publish(send(CH2, "short", ttl=1.0))
    h.advance(5.0)
    h.broker.expire([(CH2, 1)], h.now)
    stats = mt.queue_stats(h.broker, Q, oldest={CH: T0 - 1.5, CH2: T0 - 20.25}, now=T0)
    assert stats["oldest_age_s"] == 20.25
    assert (stats["depth"], stats["dropped"], stats["expired"]) == (2, 1, 1)
    assert mt.queue_stats(h.broker, Q, oldest={CH: None}, now=T0)["oldest_age_s"] is None


def test_queue_stats_of_an_unknown_queue_is_empty_with_configured_options() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(prefetch=7 if key == Q else 1))
    stats = mt.queue_stats(h.broker, Q, now=h.now)
    assert stats["channels"] == [] and stats["groups"] == []
    assert (stats["depth"], stats["published"], stats["consumers"]) == (0, 0, 0)
    assert stats["options"]["prefetch"] == 7
    assert mt.queue_stats(h.broker, "_dead/orders/v1", now=h.now)["options"]["prefetch"] == 7


def test_queue_stats_of_a_dead_letter_queue() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    _dead_letters(h, send(CH, 1), send(CH, 2))
    stats = mt.queue_stats(h.broker, "_dead/orders/v1", now=h.now)
    assert [c["channel"] for c in stats["channels"]] == [DEAD]
    assert stats["depth"] == 2
    assert mt.queue_stats(h.broker, Q, now=h.now)["depth"] == 0


# ---------------------------------------------------------------- oldest_unsettled
def test_oldest_unsettled_without_readers_is_the_first_live_seq() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    log = _log(h)
    assert mt.oldest_unsettled(h.broker, log) == 1
    h.broker.expire([(CH, 1)], h.now)
    assert mt.oldest_unsettled(h.broker, log) == 2
    h.broker.expire([(CH, 3), (CH, 2)], h.now)
    assert mt.oldest_unsettled(h.broker, log) is None


def test_oldest_unsettled_with_a_group_is_its_floor() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=3)
    h.publish_values(CH, [1, 2, 3, 4])
    d1, d2, d3 = h.take(sub)
    log = _log(h)
    assert mt.oldest_unsettled(h.broker, log, "consume:g") == 1
    h.ack(s, [d1, d3])
    assert mt.oldest_unsettled(h.broker, log, "consume:g") == 2
    assert mt.oldest_unsettled(h.broker, log) == 2
    h.ack(s, [d2])
    assert mt.oldest_unsettled(h.broker, log, "consume:g") == 4  # delivered 3 is acked
    assert mt.oldest_unsettled(h.broker, log, "consume:nobody") is None


def test_oldest_unsettled_skips_deleted_and_acked_seqs_above_the_floor() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=4)
    h.publish_values(CH, [1, 2, 3, 4])
    d1, d2, d3, _d4 = h.take(sub)
    h.nack(s, [d2])  # 2 waits in the front queue: the group's floor
    h.ack(s, [d1, d3])
    h.broker.expire([(CH, 2)], h.now)  # and then it is deleted
    assert 2 in _log(h).gone
    assert mt.oldest_unsettled(h.broker, _log(h), "consume:g") == 4


def test_oldest_unsettled_is_the_lowest_over_every_group() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="fast", prefetch=10)
    sb = h.subscribe(b, patterns=CH, group="slow", prefetch=1)
    h.publish_values(CH, [1, 2, 3])
    got = h.pump()
    h.ack(a, got[sa])
    h.ack(b, got[sb])
    log = _log(h)
    assert mt.oldest_unsettled(h.broker, log, "consume:fast") is None
    assert mt.oldest_unsettled(h.broker, log, "consume:slow") == 2
    assert mt.oldest_unsettled(h.broker, log) == 2


def test_oldest_unsettled_is_none_when_everything_is_settled() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    h.ack(s, h.take(sub))
    log = _log(h)
    assert mt.oldest_unsettled(h.broker, log, "consume:g") is None
    assert mt.oldest_unsettled(h.broker, log) is None
    h.commit()
    assert mt.oldest_unsettled(h.broker, log) is None


def test_oldest_unsettled_when_the_oldest_unread_message_was_dropped() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2,
                                                           overflow="drop_oldest"))
    s = Session("c")
    h.subscribe(s, patterns=CH, group="g")
    h.broker.unsubscribe(s, 1, h.now)  # a stalled consumer group
    h.publish_values(CH, [1, 2])
    h.publish_values(CH, [3])  # drops seq 1
    log = _log(h)
    assert (log.first_seq, log.count) == (2, 2)
    assert mt.oldest_unsettled(h.broker, log, "consume:g") == 2


# --------------------------------------------------------------------- receipt
def test_receipt_follows_a_message_from_stored_to_removed() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, ["x"])
    log = _log(h)
    r = mt.receipt(h.broker, log, 1)
    assert r == {"channel": CH, "seq": 1, "state": "stored", "published_at": T0,
                 "groups": [{"group": "consume:g", "state": "waiting", "attempts": 0}]}
    (d,) = h.take(sub)
    r = mt.receipt(h.broker, log, 1)
    assert r["state"] == "delivered"
    assert r["groups"] == [{"group": "consume:g", "state": "delivered", "attempts": 1}]
    h.nack(s, [d])
    r = mt.receipt(h.broker, log, 1)
    assert r["state"] == "stored"
    assert r["groups"] == [{"group": "consume:g", "state": "requeued", "attempts": 1}]
    (d,) = h.take(sub)
    assert mt.receipt(h.broker, log, 1)["groups"][0]["attempts"] == 2
    h.ack(s, [d])
    r = mt.receipt(h.broker, log, 1)
    assert r["state"] == "acked"
    assert r["groups"] == [{"group": "consume:g", "state": "acked", "attempts": 0}]
    assert CH in h.commit().truncates
    r = mt.receipt(h.broker, log, 1)
    assert r == {"channel": CH, "seq": 1, "state": "removed", "groups": []}


def test_receipt_is_acked_only_when_every_group_acked() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="a")
    h.subscribe(b, patterns=CH, group="b")
    h.publish_values(CH, [1])
    got = h.pump()
    h.ack(a, got[sa])
    r = mt.receipt(h.broker, _log(h), 1)
    states = {g["group"]: g["state"] for g in r["groups"]}
    assert states == {"consume:a": "acked", "consume:b": "delivered"}
    assert r["state"] == "delivered"


def test_receipt_without_readers_and_for_deleted_or_unknown_seqs() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2])
    h.publish(send(CH, 3), commit=False)
    log = _log(h)
    assert mt.receipt(h.broker, log, 1)["state"] == "stored"
    assert mt.receipt(h.broker, log, 1)["groups"] == []
    h.broker.expire([(CH, 2)], h.now)
    assert mt.receipt(h.broker, log, 2) == {"channel": CH, "seq": 2, "state": "removed",
                                            "groups": []}
    assert mt.receipt(h.broker, log, 3) == {"channel": CH, "seq": 3, "state": "unknown",
                                            "groups": []}  # staged, not committed
    assert mt.receipt(h.broker, log, 99)["state"] == "unknown"


# --------------------------------------------------------- message ids (find_message)
def test_message_ids_map_back_to_their_channel_and_seq() -> None:
    h = Harness()
    outs = h.publish_values(CH, list(range(20)))
    log = _log(h)
    for o in outs:
        assert o.id == h.broker.new_id(log, o.seq)
        assert h.broker.find_message(o.id) == (log, o.seq)
    assert outs[16].id.endswith("11")  # seq 17 in hex
    assert len(outs[0].id) == 17


def test_message_ids_are_unique_across_channels() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    (a,) = h.publish_values(CH2, ["a"])
    (b,) = h.publish_values(OTHER, ["b"])
    (dead,) = _dead_letters(h, send(CH, "d"))
    ids = {a.id, b.id, dead.id, h.broker.new_id(_log(h), 1)}
    assert len(ids) == 4
    assert {a.seq, b.seq, dead.seq} == {1}
    assert h.broker.find_message(a.id) == (_log(h, CH2), 1)
    assert h.broker.find_message(b.id) == (_log(h, OTHER), 1)
    assert h.broker.find_message(dead.id) == (_log(h, DEAD), 1)
    assert h.broker.find_message(h.broker.new_id(_log(h), 1)) == (_log(h), 1)


def test_find_message_hashes_channels_it_has_not_named_yet() -> None:
    h = Harness()
    (o,) = h.publish_values(CH, [1])
    log = _log(h)
    log.id_hash = 0  # as after a restart: no id of this run has named it
    h.broker.state.ids.by_hash.clear()
    assert h.broker.find_message(o.id) == (log, 1)


def test_find_message_rejects_garbage() -> None:
    h = Harness()
    (o,) = h.publish_values(CH, [1])
    good_hash = o.id[:16]
    wrong_hash = f"{int(good_hash, 16) ^ 1:016x}"
    for bad in ("", "1", good_hash, "z" * 17, good_hash + "zz", "g" + o.id[1:],
                good_hash + "1" * 17, wrong_hash + "1", "0" * 16 + "1"):
        assert h.broker.find_message(bad) is None, bad


@pytest.mark.parametrize("suffix", ["-1", "0", " 1", "+1", "1_0"])
def test_find_message_rejects_seq_parts_new_id_never_produces(suffix: str) -> None:
    h = Harness()
    (o,) = h.publish_values(CH, [1])
    assert h.broker.find_message(o.id[:16] + suffix) is None


# -------------------------------------------------------------------- diagnose
def test_diagnose_draining_comes_first() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g")
    h.publish_values(CH, [1])
    text = _diagnose(h, draining=True, schema_recent=3.0, deliver_rate=5.0)
    assert text == "The broker is stopping (soft stop): nothing new is delivered."


def test_diagnose_schema_refusals() -> None:
    h = Harness()
    text = _diagnose(h, schema_recent=2.54)
    assert text.startswith("Publishes are being refused by the schema of orders/v1 (2.5/s")
    assert "wrong format" in text


def test_diagnose_nothing_published() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g")
    assert _diagnose(h) == "Nothing has been published to orders/v1 yet."
    assert _diagnose(h, "orders/v9") == "Nothing has been published to orders/v9 yet."


def test_diagnose_empty_after_settlement() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    h.ack(s, h.take(sub))
    h.commit()
    assert _diagnose(h) == "The queue is empty: everything published has been settled."


def test_diagnose_no_reader() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    text = _diagnose(h)
    assert text.startswith("No consumer or listener has ever subscribed to orders/v1")


def _refused(h: Harness, times: int, pattern: str = CH) -> None:
    access = Rules.parse([{"client": "intruder", "read": ["payments/*"]}]).for_client("intruder")
    for sid in range(times):
        with pytest.raises(NotAuthorized):
            h.subscribe(Session("intruder", access=access), sid, patterns=pattern, group="x")


def test_diagnose_no_reader_because_the_rules_refused_one() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    _refused(h, 2)
    assert h.broker.read_refusals[CH] == [2, "intruder"]
    assert "consume:x" not in h.broker.groups
    text = _diagnose(h)
    assert text == ("No reader: client 'intruder' was refused reading 'orders/v1/1' by the "
                    "rules (2 time(s)); messages wait.")


def test_diagnose_refusals_for_another_queue_are_not_blamed() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    _refused(h, 1, "orders/v2/*")
    _refused(h, 1, "orders/v10/1")
    assert len(h.broker.read_refusals) == 2
    assert _diagnose(h).startswith("No consumer or listener has ever subscribed")


@pytest.mark.parametrize("pattern", ["orders/*", "orders/v1/*"])
def test_diagnose_refusal_of_a_wildcard_over_the_queue_is_blamed(pattern: str) -> None:
    h = Harness()
    h.publish_values(CH, [1])
    _refused(h, 1, pattern)
    assert f"refused reading {pattern!r}" in _diagnose(h)


def test_diagnose_no_connected_member() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns=CH, group="g")
    h.broker.unsubscribe(s, 1, h.now)
    h.publish_values(CH, [1])
    assert _diagnose(h) == "No consumer is connected (group(s) consume:g have no members)."
    _refused(h, 3)
    assert _diagnose(h) == (
        "No consumer is connected (group(s) consume:g have no members). Client 'intruder' "
        "was refused reading 'orders/v1/1' by the rules (3 time(s)).")


def test_diagnose_every_member_paused() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=5)
    sb = h.subscribe(b, kind="listen", patterns=CH, prefetch=5)
    h.publish_values(CH, [1])
    sa.paused = True
    assert not _diagnose(h).startswith("Every consumer is paused")
    sb.paused = True
    assert _diagnose(h) == ("Every consumer is paused: their connections are not reading "
                            "fast enough.")


def test_diagnose_every_member_at_its_prefetch_limit() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=1)
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2, 3, 4])
    got = h.pump()
    assert (len(got[sa]), len(got[sb])) == (1, 2)
    assert _diagnose(h) == ("All 2 consumer(s) are at their prefetch limit (they take at "
                            "most 1 and 2 at a time, as they subscribed): they hold 3 "
                            "message(s) in flight and are not acking.")
    h.ack(a, got[sa])
    assert "prefetch limit" not in _diagnose(h)


def test_diagnose_names_every_prefetch_limit_in_order() -> None:
    h = Harness()
    subs = [h.subscribe(Session(name), patterns=CH, group="g", prefetch=prefetch)
            for name, prefetch in (("a", 5), ("b", 1), ("c", 2), ("d", 1))]
    h.publish_values(CH, list(range(12)))
    got = h.pump()
    assert [len(got[sub]) for sub in subs] == [5, 1, 2, 1]
    assert _diagnose(h) == ("All 4 consumer(s) are at their prefetch limit (they take at "
                            "most 1, 2 and 5 at a time, as they subscribed): they hold 9 "
                            "message(s) in flight and are not acking.")


def test_diagnose_delayed_by_a_nack() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1])
    h.nack(s, h.take(sub), delay=60.0)
    assert h.pump() == {}
    when = time.strftime("%H:%M:%S", time.localtime(h.now + 60.0))
    assert _diagnose(h) == (f"Messages are delayed (publish delay or nack delay) until "
                            f"{when}, in 60 s.")
    h.publish_values(CH, [2])  # something else is ready now: not "delayed"
    assert _diagnose(h).startswith("2 message(s) wait and 1 reader(s)")
    assert payloads(h.take(sub)) == [2]
    h.tick(60.0)
    assert not _diagnose(h).startswith("Messages are delayed")


def test_diagnose_delayed_by_a_publish_delay() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g", prefetch=5)
    h.publish(send(CH, 1, delay=30.0))
    assert h.pump() == {}
    h.advance(10.0)
    assert _diagnose(h).endswith(", in 20 s.")


def test_diagnose_flowing_and_waiting() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1, 2])
    assert len(h.take(sub)) == 2
    assert _diagnose(h, deliver_rate=3.04) == "Messages are flowing: 3.0 delivered per second."
    # Both are in flight: nothing waits (they were "2 message(s) wait" before).
    assert _diagnose(h) == ("Nothing waits: 2 message(s) are in flight (delivered, not yet "
                            "acked).")
    h.publish_values(CH, [3])
    assert _diagnose(h) == ("1 message(s) wait and 1 reader(s) are connected; deliveries "
                            "should follow.")


def _http_consumer(h: Harness, client: str = "poller") -> Any:
    """A subscription as an HTTP consumer session makes it: credit only while a request
    waits, none now."""
    sub = h.subscribe(Session(client), patterns="orders/v1/*", group="g", prefetch=1)
    sub.prefetch = 0
    sub.on_demand = True
    return sub


def test_diagnose_an_http_consumer_with_no_request_waiting_is_not_a_flowing_reader() -> None:
    h = Harness()
    _http_consumer(h)
    h.publish_values(CH, [1])
    assert h.pump() == {}  # no credit: nothing is taken from the queue
    expected = ("Nobody is asking for messages: 1 HTTP consumer(s) are connected but no "
                "consume request is waiting (an HTTP consumer takes messages only while a "
                "POST /v1/consume request waits); 1 message(s) wait.")
    assert _diagnose(h) == expected
    # Deliveries earlier in the rate window do not make it "flowing" (it said "0.0").
    assert _diagnose(h, deliver_rate=1 / 60) == expected


def test_diagnose_names_http_consumers_among_consumers_at_their_limit() -> None:
    h = Harness()
    _http_consumer(h)
    native = h.subscribe(Session("worker"), 2, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1, 2])
    assert len(h.take(native)) == 1
    assert _diagnose(h) == ("All 2 consumer(s) are at their prefetch limit (each takes at "
                            "most 1 at a time, as they subscribed): they hold 1 message(s) "
                            "in flight and are not acking. 1 of them are HTTP consumer(s) "
                            "with no request waiting.")


def test_diagnose_is_not_flowing_when_the_oldest_waiting_message_is_older_than_the_window(
) -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1])
    stats = mt.queue_stats(h.broker, Q, now=h.now, oldest_waiting={CH: h.now - 30.0})
    assert mt.diagnose(h.broker, Q, stats, h.now, deliver_rate=2.0) == (
        "Messages are flowing: 2.0 delivered per second.")
    stats = mt.queue_stats(h.broker, Q, now=h.now, oldest_waiting={CH: h.now - 90.0})
    text = mt.diagnose(h.broker, Q, stats, h.now, deliver_rate=2.0)
    assert "flowing" not in text
    assert text == ("Deliveries do not keep up: 2.0 delivered per second, but the oldest of 1 "
                    "waiting message(s) has waited 90 s (longer than the last 60 s).")
    text = mt.diagnose(h.broker, Q, stats, h.now, rate_window=300.0, deliver_rate=2.0)
    assert text.startswith("Messages are flowing")
    assert mt.diagnose(h.broker, Q, stats, h.now) == (
        "1 message(s) wait, the oldest for 90 s, and nothing was delivered in the last 60 s "
        "although 1 reader(s) could take more.")


@pytest.mark.parametrize(("rate", "text"), [
    (1 / 60, ("1.0", "minute")), (0.02, ("1.2", "minute")), (0.0004, ("1.4", "hour")),
    (0.25, ("0.25", "second")), (3.04, ("3.0", "second")), (12.4, ("12", "second")),
    (0.002, ("0.12", "minute")),
])
def test_rate_text_never_shows_a_positive_rate_as_zero(rate: float, text: tuple[str, str]
                                                       ) -> None:
    assert mt.rate_text(rate) == text


def test_diagnose_a_slow_flow_in_readable_units() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1])
    assert len(h.take(sub)) == 1
    assert _diagnose(h, deliver_rate=0.02) == "Messages are flowing: 1.2 delivered per minute."


def test_queue_stats_names_waiting_and_in_flight_apart() -> None:
    h = Harness()
    c, lis = Session("c"), Session("l")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=1)
    h.publish_values(CH, [1, 2, 3])
    h.advance(10.0)
    h.publish_values(CH2, [4])  # nobody reads channel 2: it waits
    got = h.take(sub)
    stats = mt.queue_stats(h.broker, Q, now=h.now + 5.0, oldest_waiting={CH: h.now - 8.0})
    assert (stats["waiting"], stats["in_flight"], stats["unsettled"]) == (2 + 1, 1, 1)
    assert stats["oldest_in_flight_age_s"] == 15.0  # since it was published
    assert stats["oldest_waiting_age_s"] == 13.0
    (g,) = stats["groups"]
    assert (g["waiting"], g["in_flight"], g["unsettled"]) == (2, 1, 1)
    assert mt.oldest_waiting(h.broker, _log(h), None) == 2
    assert mt.oldest_waiting(h.broker, _log(h, CH2), None) == 1  # no reader: oldest live
    h.ack(c, got)
    # A listener from the oldest: the channel's furthest-behind reader counts, once.
    h.subscribe(lis, kind="listen", patterns=CH, start="oldest", prefetch=1)
    stats = mt.queue_stats(h.broker, Q, now=h.now)
    assert (stats["waiting"], stats["in_flight"]) == (3 + 1, 0)
    assert stats["oldest_in_flight_age_s"] is None and stats["oldest_waiting_age_s"] is None
    one = mt.queue_stats(h.broker, Q, now=h.now, group="consume:g")
    assert (one["waiting"], one["in_flight"]) == (2, 0)
    assert mt.oldest_waiting(h.broker, _log(h), "consume:g") == 2
    assert mt.oldest_waiting(h.broker, _log(h), "nobody") is None
    h.nack(c, h.take(sub), delay=30.0)  # a delayed retry still waits
    assert mt.queue_stats(h.broker, Q, "1", now=h.now, group="consume:g")["waiting"] == 2


def test_diagnose_names_channels_nobody_reads() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g", prefetch=5)
    h.publish_values(CH2, [1, 2])  # channel 2: no reader
    stats = mt.queue_stats(h.broker, Q, now=h.now, oldest_waiting={CH2: h.now - 300.0})
    assert mt.diagnose(h.broker, Q, stats, h.now, deliver_rate=4.0) == (
        "Deliveries do not keep up: 4.0 delivered per second, but the oldest of 2 waiting "
        "message(s) has waited 300 s (longer than the last 60 s). 1 of its channels "
        "(orders/v1/2) have no reader at all: their messages wait for one.")


# ------------------------------------------------------------ boundaries of the figures
@pytest.mark.parametrize(("rate", "text"), [
    (10.0, ("10", "second")), (10.5, ("10", "second")), (1.0, ("1.0", "second")),
    (1.5, ("1.5", "second")), (0.1, ("0.10", "second")), (0.09, ("5.4", "minute")),
    (1 / 60.5, ("0.99", "minute")), (1 / 600, ("0.10", "minute")), (0.009, ("0.54", "minute")),
    (0.1 / 60.5, ("6", "hour")), (0.00040275, ("1.4", "hour")),
])
def test_rate_text_switches_units_exactly_at_their_boundaries(rate: float,
                                                               text: tuple[str, str]) -> None:
    assert mt.rate_text(rate) == text


def test_queue_stats_ages_are_rounded_to_milliseconds_and_counts_sum_every_channel() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns="orders/v1/*", group="g", prefetch=10)
    sb = h.subscribe(b, kind="listen", patterns="orders/v1/*", start="oldest", prefetch=10)
    sb.paused = True
    h.publish_values(CH, [1, 2])
    h.publish_values(CH2, [3, 4, 5])
    h.advance(1.2345678)
    got = h.take(sa)
    h.ack(a, [d for d in got if d.seq == 1])  # one of each channel's first
    stats = mt.queue_stats(h.broker, Q, now=h.now, oldest={CH: h.now - 2.0004999},
                           oldest_waiting={CH2: h.now - 7.1236})
    assert (stats["delivered"], stats["acked"]) == (5, 2)
    assert (stats["waiting"], stats["in_flight"]) == (5, 3)  # the listener's 2 + 3; 3 out
    assert stats["oldest_in_flight_age_s"] == 1.235
    assert (stats["oldest_age_s"], stats["oldest_waiting_age_s"]) == (2.0, 7.124)


def test_queue_stats_show_every_option_of_the_queue() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(
        prefetch=3, ttl=60.0, max_items=10, overflow="drop_oldest", requeue_limit=4,
        dead_letter=False, retention=30.0, durability="interval", sync_interval=0.025,
        expire_idle=600.0))
    h.publish_values(CH, [1])
    want = {"prefetch": 3, "ttl": 60.0, "max_items": 10, "overflow": "drop_oldest",
            "requeue_limit": 4, "dead_letter": False, "retention": 30.0, "schema": None,
            "durability": "interval", "sync_interval_ms": 25.0, "expire_idle": 600.0}
    assert mt.queue_stats(h.broker, Q, now=h.now)["options"] == want
    assert mt.queue_stats(h.broker, "_dead/" + Q, now=h.now)["options"] == want
    h.broker.options_for = lambda key: ChannelOptions(prefetch=9)  # a reload
    for log in h.broker.channels.values():
        log.options = h.broker.options(log.name)
    options = mt.queue_stats(h.broker, Q, now=h.now)["options"]
    assert (options["prefetch"], options["durability"], options["sync_interval_ms"]) == (
        9, "fsync", None)


def test_queue_stats_show_the_sync_interval_to_the_microsecond() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(durability="interval",
                                                           sync_interval=0.0012345))
    h.publish_values(CH, [1])
    assert mt.queue_stats(h.broker, Q, now=h.now)["options"]["sync_interval_ms"] == 1.234


def test_oldest_waiting_is_none_when_the_group_has_everything_out() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    assert len(h.take(sub)) == 2
    assert mt.oldest_waiting(h.broker, _log(h), "consume:g") is None
    assert mt.oldest_waiting(h.broker, _log(h)) is None


def test_oldest_unsettled_passes_one_deleted_seq_at_a_time() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    h.broker.expire([(CH, 1)], h.now)
    assert mt.oldest_unsettled(h.broker, _log(h)) == 2


def test_receipt_of_a_seq_past_the_end_names_no_group() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g")
    h.publish_values(CH, [1])
    assert mt.receipt(h.broker, _log(h), 5) == {"channel": CH, "seq": 5, "state": "unknown",
                                                "groups": []}


def test_a_requeued_dead_letter_is_published_anew() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0, ttl=100.0))
    msgs = _dead_letters(h, send(CH, 1))
    h.advance(50.0)
    assert mt.requeue_dead(h.broker, _log(h, DEAD), msgs, h.now) == 1
    h.commit()
    r = mt.receipt(h.broker, _log(h), 2)
    assert (r["state"], r["published_at"]) == ("stored", h.now)  # its TTL starts again


def test_diagnose_a_wildcard_refusal_of_another_endpoint_is_not_blamed() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    _refused(h, 1, "ordersx/*")
    assert _diagnose(h) == ("No consumer or listener has ever subscribed to orders/v1: "
                            "messages wait until one does.")


def test_diagnose_blames_the_most_refused_reader() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    access = Rules.parse([{"client": "*", "read": ["payments/*"]}])
    for who, pattern, times in (("b", "orders/v1/*", 3), ("a", CH, 1), ("c", "orders/*", 2)):
        for sid in range(times):
            with pytest.raises(NotAuthorized):
                h.subscribe(Session(who, access=access.for_client(who)), sid,
                            patterns=pattern, group="x")
    assert _diagnose(h) == ("No reader: client 'b' was refused reading 'orders/v1/*' by the "
                            "rules (3 time(s)); messages wait.")
    s = Session("m")
    h.subscribe(s, patterns=CH, group="g")
    h.broker.unsubscribe(s, 1, h.now)
    assert _diagnose(h).endswith(" Client 'b' was refused reading 'orders/v1/*' by the rules "
                                 "(3 time(s)).")


def test_diagnose_names_three_groups_without_members_at_most() -> None:
    h = Harness()
    for name in "abcd":
        s = Session(name)
        h.subscribe(s, patterns=CH, group=name)
        h.broker.unsubscribe(s, 1, h.now)
    h.publish_values(CH, [1])
    assert _diagnose(h) == ("No consumer is connected (group(s) consume:a, consume:b, "
                            "consume:c have no members).")


def test_diagnose_schema_refusals_at_any_rate() -> None:
    h = Harness()
    h.publish_values(CH, [1])
    assert _diagnose(h, schema_recent=0.5) == (
        "Publishes are being refused by the schema of orders/v1 (0.5/s over the last "
        "minute): producers send the wrong format.")


def test_diagnose_settled_messages_kept_for_retention() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(retention=3600.0))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1, 2])
    h.ack(s, h.take(sub))
    h.commit()
    assert _diagnose(h) == ("Nothing waits and nothing is in flight: the 2 stored message(s) "
                            "are settled (kept for replay by retention, or removed soon).")


def test_diagnose_waiting_exactly_as_long_as_the_window_still_flows() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1, 2])  # not pumped yet: both wait
    stats = mt.queue_stats(h.broker, Q, now=h.now, oldest_waiting={CH: h.now - 60.0})
    assert mt.diagnose(h.broker, Q, stats, h.now, deliver_rate=2.0) == (
        "Messages are flowing: 2.0 delivered per second.")


def test_diagnose_http_consumers_holding_messages_with_none_asking() -> None:
    h = Harness()
    sub = _http_consumer(h)
    sub.prefetch = 1
    h.publish_values(CH, [1, 2])
    assert len(h.take(sub)) == 1
    sub.prefetch = 0  # the request that took it is answered: none waits now
    assert _diagnose(h) == (
        "Nobody is asking for messages: 1 HTTP consumer(s) are connected but no consume "
        "request is waiting (an HTTP consumer takes messages only while a POST /v1/consume "
        "request waits); 1 message(s) wait; they hold 1 message(s) in flight (delivered, not "
        "yet acked).")


@pytest.mark.parametrize(("unread", "hint"), [
    (["2"], "1 of its channels (orders/v1/2) have"),
    (["2", "3"], "2 of its channels (orders/v1/2, …) have"),
])
def test_diagnose_hints_at_channels_nobody_reads(unread: list[str], hint: str) -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g", prefetch=5)
    for cid in unread:
        h.publish_values(f"{Q}/{cid}", [1])
    assert _diagnose(h) == (f"{len(unread)} message(s) wait and 1 reader(s) are connected; "
                            f"deliveries should follow. {hint} no reader at all: their "
                            "messages wait for one.")


def test_diagnose_a_wildcard_refusal_of_an_endpoint_is_not_blamed_on_a_longer_one() -> None:
    h = Harness()
    h.publish_values("ordersx/v1/1", [1])
    _refused(h, 1, "orders/*")
    assert _diagnose(h, "ordersx/v1") == ("No consumer or listener has ever subscribed to "
                                          "ordersx/v1: messages wait until one does.")


def test_oldest_unsettled_stops_at_the_first_seq_not_settled_past_a_deleted_one() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=4)
    h.publish_values(CH, [1, 2, 3, 4])
    d1, d2, _d3, _d4 = h.take(sub)
    h.ack(s, [d1])
    h.nack(s, [d2])  # 2 is the group's floor
    h.broker.expire([(CH, 2)], h.now)  # and then it is deleted; 3 is still out
    assert mt.oldest_unsettled(h.broker, _log(h), "consume:g") == 3


def test_queue_stats_name_the_schema_of_the_queue() -> None:
    schema = compile_schema({"type": "object"}, key=Q)
    h = Harness(channel_options=lambda key: ChannelOptions(schema=schema))
    assert mt.queue_stats(h.broker, Q, now=h.now)["options"]["schema"] == schema.key


def test_a_dead_letter_queue_is_diagnosed_as_one_and_keeps_no_dead_letters_itself() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    msgs = _dead_letters(h, send(CH, {"n": 1}), send(CH, {"n": 2}))
    assert msgs[0].headers is not None
    assert msgs[0].headers["x-dead-detail"] == ("delivered 1 time without an ack; the "
                                                "queue's requeue_limit is 0")
    dead_q = "_dead/" + Q
    # read by people, not consumers: no "never subscribed" warning
    assert _diagnose(h, dead_q) == (f"2 dead letter(s) of {Q}: messages that expired or were "
                                    "given up after too many deliveries. Each one says why; "
                                    "requeue them once the cause is fixed, or delete them.")
    stats = mt.queue_stats(h.broker, dead_q, now=h.now)
    assert stats["options"]["dead_letter"] is False
    assert mt.queue_stats(h.broker, Q, now=h.now)["options"]["dead_letter"] is True
    assert mt.requeue_dead(h.broker, _log(h, DEAD), msgs, h.now) == 2
    h.commit()
    assert _diagnose(h, dead_q) == f"No dead letters: nothing of {Q} waits here."


def test_delete_messages_removes_the_live_ones_it_names_once() -> None:
    h = Harness()
    s = Session("reader")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.broker.unsubscribe(s, sub.sid, h.now)  # the group stays, reading nothing now
    h.publish(*(send(CH, {"n": i}) for i in range(5)))
    h.commit()
    log = _log(h)
    (gc,) = log.states
    h.broker.state.dirty.clear()
    assert mt.delete_messages(h.broker, log, [2, 4, 2, 9, 0]) == [2, 4]
    assert log.count == 3
    assert gc in h.broker.state.dirty  # its waiting count changed: written again
    batch = h.commit()
    assert sorted(batch.deletes) == [(CH, 2), (CH, 4)]
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    assert [d.seq for d in h.take(sub)] == [1, 3, 5]
    assert mt.delete_messages(h.broker, log, [2]) == []


def test_a_dead_letters_reason_counts_its_deliveries_in_words() -> None:
    from minou.core.settlement import _too_many

    assert _too_many(0) == "delivered 1 time without an ack; the queue's requeue_limit is 0"
    assert _too_many(2) == "delivered 3 times without an ack; the queue's requeue_limit is 2"


def test_a_deleted_entry_a_reader_holds_keeps_its_stream_id() -> None:
    """XDEL of an entry a consumer still holds moves the first live seq past it; the
    points numbering it stay until the reader's floor passes (its group shows it by its
    id in XPENDING / XCLAIM: core/stream_ids.py)."""
    from minou.core.stream_ids import ID_HEADER

    h = Harness()
    s = Session("reader")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}),
              send(CH, 2, headers={ID_HEADER: "200-0"}), resp_door=True)
    held = h.take(sub)
    log = _log(h)
    assert mt.delete_messages(h.broker, log, [1]) == [1]
    assert log.first_seq == 2
    h.publish(send(CH, 3, headers={ID_HEADER: "300-0"}), resp_door=True)
    assert log.stream_ids is not None and log.stream_ids.text(1) == b"100-0"
    h.ack(s, held)
    h.commit()  # the floor passes them: the points below go
    h.publish(send(CH, 4, headers={ID_HEADER: "400-0"}), resp_door=True)
    assert list(log.stream_ids.seqs) == [3, 4]


def test_an_explicit_id_prunes_points_of_entries_deleted_with_no_reader() -> None:
    """No reader: XDEL moves the first live seq, no settlement prunes; the next XADD with
    an id drops the points no live entry needs (rows too), and its header holds the id
    it got (``<ms>-*`` resolved)."""
    from minou.core.stream_ids import ID_HEADER, point_key

    h = Harness()
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}),
              send(CH, 2, headers={ID_HEADER: "200-0"}),
              send(CH, 3, headers={ID_HEADER: "300-0"}), resp_door=True)
    log = _log(h)
    assert mt.delete_messages(h.broker, log, [1, 2]) == [1, 2]
    h.publish(send(CH, 4, headers={ID_HEADER: "300-*"}), commit=False, resp_door=True)
    batch = h.commit()
    assert list(log.stream_ids.seqs) == [3]
    assert batch.meta[point_key(CH, 1)] is None and batch.meta[point_key(CH, 2)] is None
    assert batch.messages[-1].headers == {ID_HEADER: "300-1"}
