"""Publishing: staging, commit visibility, seqs, outcomes, refusals, limits, dedup, broadcast."""

from __future__ import annotations

import pytest

from minou.core import publishing
from minou.core.broker import Session
from minou.core.log import ChannelOptions
from minou.errors import ErrorCode
from minou.protocol.frames import Send

from .helpers import Harness, payloads, send, seqs


def test_messages_are_invisible_until_committed() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/1", group="g")
    outcomes = h.publish(send("orders/v1/1", 1), send("orders/v1/1", 2), commit=False)
    assert [o.seq for o in outcomes] == [1, 2]
    assert h.pump() == {}
    log = h.broker.channels["orders/v1/1"]
    assert (log.count, log.end, log.inflight) == (0, 1, 2)
    batch = h.commit()
    assert [m.seq for m in batch.messages] == [1, 2]
    assert batch.channels["orders/v1/1"] == 3
    assert (log.count, log.end, log.inflight) == (2, 3, 0)
    got = h.take(sub)
    assert seqs(got) == [1]
    assert payloads(got) == [1]
    assert h.broker.counters.published == 2


def test_listener_starting_new_sees_messages_committed_after_it_subscribed() -> None:
    h = Harness()
    h.publish(send("orders/v1/1", "old"))
    h.publish(send("orders/v1/1", "staged"), commit=False)
    s = Session("c")
    sub = h.subscribe(s, kind="listen", patterns="orders/v1/1", prefetch=10)
    assert h.pump() == {}
    h.commit()
    assert payloads(h.take(sub)) == ["staged"]


def test_seq_strictly_increasing_per_channel_across_batches() -> None:
    h = Harness()
    a, b = "orders/v1/a", "orders/v1/b"
    first = h.publish(send(a, 0), send(b, 0), send(a, 1))
    second = h.publish(send(b, 1), send(a, 2), send(a, 3))
    by_channel: dict[str, list[int]] = {}
    for o in first + second:
        by_channel.setdefault(o.channel, []).append(o.seq)
    assert by_channel == {a: [1, 2, 3, 4], b: [1, 2]}
    ids = [o.id for o in first + second]
    assert all(ids) and len(set(ids)) == len(ids)


def test_outcome_fields_of_a_stored_message() -> None:
    h = Harness()
    (o,) = h.publish(send("orders/v1/1", {"x": 1}, headers={"k": "v"}, key="k1"))
    assert o.seq == 1
    assert o.channel == "orders/v1/1"
    assert o.id and isinstance(o.id, str)
    assert (o.duplicate, o.code, o.error, o.fanout) == (False, 0, "", 1)
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/1", group="g")
    (d,) = h.take(sub)
    assert (d.channel, d.seq, d.id, d.headers, d.key, d.attempts) == (
        "orders/v1/1", 1, o.id, {"k": "v"}, "k1", 1)
    assert d.published_at == h.now
    assert d.raw is False


def test_raw_payload_is_not_parsed() -> None:
    h = Harness()
    (o,) = h.publish(Send("orders/v1/1", b"\x00\xff{bad", raw=True))
    assert o.code == 0
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g")
    (d,) = h.take(sub)
    assert (d.data, d.raw) == (b"\x00\xff{bad", True)


# ---------------------------------------------------------------- refusals
def test_bad_messages_get_their_own_error_and_the_rest_of_the_batch_is_stored() -> None:
    h = Harness(max_message_size=100)
    outcomes = h.publish(
        send("orders/v1/1", "ok-1"),
        send("orders/v1/1/extra", "x"),  # invalid channel
        Send("orders/v1/1", b"{bad"),  # not JSON
        Send("orders/v1/1", b"1" * 101),  # over max_message_size
        send("orders/v1/1", "x", priority=10),  # priority out of range
        send("orders/v1/1", "x", priority=-1),
        send("nope", "x"),  # invalid channel
        send("orders/v1/1", "ok-2"),
    )
    codes = [o.code for o in outcomes]
    assert codes == [
        0, ErrorCode.INVALID_CHANNEL, ErrorCode.INVALID_PAYLOAD, ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.BAD_REQUEST, ErrorCode.BAD_REQUEST, ErrorCode.INVALID_CHANNEL, 0,
    ]
    assert [o.seq for o in outcomes] == [1, 0, 0, 0, 0, 0, 0, 2]
    assert all(o.error for o in outcomes if o.code)
    assert "priority" in outcomes[4].error
    assert "JSON" in outcomes[2].error
    assert h.broker.counters.refused == {
        "invalid_channel": 2, "invalid_payload": 1, "message_too_large": 1, "bad_request": 2,
    }
    assert h.broker.counters.published == 2
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["ok-1", "ok-2"]
    assert h.broker.channels["orders/v1/1"].count == 2
    assert set(h.broker.channels) == {"orders/v1/1"}


def test_message_at_exactly_max_size_is_accepted() -> None:
    h = Harness(max_message_size=10)
    (o,) = h.publish(Send("orders/v1/1", b"1" * 10))
    assert o.code == 0 and o.seq == 1


@pytest.mark.parametrize("field", ["ttl", "delay"])
def test_negative_ttl_or_delay_is_refused(field: str) -> None:
    h = Harness()
    (o,) = h.publish(send("orders/v1/1", 1, **{field: -1.0}))
    assert o.code == ErrorCode.BAD_REQUEST
    assert field in o.error


# ------------------------------------------------------------------ max_items
def test_max_items_refuse_stores_nothing() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2))
    outcomes = h.publish_values("orders/v1/1", [1, 2, 3])
    assert [o.code for o in outcomes] == [0, 0, ErrorCode.QUEUE_FULL]
    assert outcomes[2].seq == 0
    log = h.broker.channels["orders/v1/1"]
    assert (log.count, log.next_seq) == (2, 3)
    assert h.broker.counters.refused["queue_full"] == 1
    assert h.broker.counters.dropped == 0
    # A refused message leaves nothing in the next batch either.
    (o,) = h.publish(send("orders/v1/1", 4), commit=False)
    assert o.code == ErrorCode.QUEUE_FULL
    assert h.broker.take_writes().messages == []
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g", prefetch=10)
    assert payloads(h.take(sub)) == [1, 2]


def test_max_items_frees_room_once_messages_are_acked_and_truncated() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2))
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/1", group="g", prefetch=10)
    h.publish_values("orders/v1/1", [1, 2])
    assert h.publish(send("orders/v1/1", 3))[0].code == ErrorCode.QUEUE_FULL
    h.ack(s, h.take(sub))
    h.commit()  # truncation happens with the next batch
    assert h.publish(send("orders/v1/1", 3))[0].code == 0


def test_max_items_drop_oldest() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2, overflow="drop_oldest"))
    h.publish_values("orders/v1/1", [1, 2])
    (o,) = h.publish(send("orders/v1/1", 3), commit=False)
    assert o.code == 0 and o.seq == 3
    batch = h.commit()
    assert batch.deletes == [("orders/v1/1", 1)]
    assert h.broker.counters.dropped == 1
    log = h.broker.channels["orders/v1/1"]
    assert (log.dropped, log.count) == (1, 2)
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g", prefetch=10)
    assert payloads(h.take(sub)) == [2, 3]


def test_drop_oldest_never_refuses_even_within_one_batch() -> None:
    # Regression: it used to answer QueueFull once uncommitted messages alone filled max_items.
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2, overflow="drop_oldest"))
    outcomes = h.publish_values("orders/v1/1", [1, 2, 3, 4])
    assert [o.code for o in outcomes] == [0, 0, 0, 0]
    assert h.broker.counters.dropped == 2
    log = h.broker.channels["orders/v1/1"]
    assert (log.count, log.inflight) == (2, 0)
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g", prefetch=10)
    assert payloads(h.take(sub)) == [3, 4]


# ---------------------------------------------------------------------- dedup
def test_dedup_within_window_returns_the_first_outcome_and_stores_nothing() -> None:
    h = Harness(dedup_window=60.0)
    (first,) = h.publish(send("orders/v1/1", "a", dedup="k"))
    h.advance(59.0)
    (again,) = h.publish(send("orders/v1/1", "b", dedup="k"), commit=False)
    assert again.duplicate is True
    assert (again.seq, again.id, again.code) == (first.seq, first.id, 0)
    assert h.broker.take_writes().messages == []
    assert h.broker.counters.duplicates == 1
    # Another key, or the same key on another channel, is not a duplicate.
    other = h.publish(send("orders/v1/1", "c", dedup="k2"), send("orders/v1/2", "d", dedup="k"))
    assert [(o.duplicate, o.seq) for o in other] == [(False, 2), (False, 1)]
    h.advance(1.0)  # now == first publish + window: accepted again
    (late,) = h.publish(send("orders/v1/1", "e", dedup="k"))
    assert late.duplicate is False and late.seq == 3 and late.id != first.id
    sub = h.subscribe(Session("c"), patterns="orders/v1/1", group="g", prefetch=10)
    assert payloads(h.take(sub)) == ["a", "c", "e"]


def test_dedup_within_one_uncommitted_batch() -> None:
    h = Harness()
    a, b = h.publish(send("orders/v1/1", 1, dedup="k"), send("orders/v1/1", 2, dedup="k"))
    assert (b.duplicate, b.seq, b.id) == (True, a.seq, a.id)
    assert h.broker.channels["orders/v1/1"].count == 1


def test_dedup_is_recorded_for_storage() -> None:
    h = Harness(dedup_window=30.0)
    h.publish(send("orders/v1/1", 1, dedup="k"), commit=False)
    batch = h.broker.take_writes()
    assert len(batch.dedup) == 1
    channel, key, expires, seq, ident = batch.dedup[0]
    assert (channel, key, expires, seq) == ("orders/v1/1", "k", h.now + 30.0, 1)
    assert ident == batch.messages[0].id


# ------------------------------------------------------------------ broadcast
def test_broadcast_reaches_every_channel_of_the_version_that_has_a_reader() -> None:
    h = Harness()
    s = Session("c")
    subs = {}
    for i, ch in enumerate(["orders/v1/a", "orders/v1/b", "orders/v2/a"], start=1):
        subs[ch] = h.subscribe(s, i, patterns=ch, group=f"g{i}", prefetch=10)
    h.publish(send("orders/v1/noreader", "before"))  # exists, nobody reads it
    (o,) = h.publish(send("orders/v1/*", "all"))
    assert o.code == 0
    assert o.fanout == 2
    assert o.channel == "orders/v1/*"
    assert o.seq == 1 and o.id
    got = h.pump()
    assert payloads(got[subs["orders/v1/a"]]) == ["all"]
    assert payloads(got[subs["orders/v1/b"]]) == ["all"]
    assert subs["orders/v2/a"] not in got
    assert h.broker.channels["orders/v1/noreader"].count == 1
    assert h.broker.channels["orders/v2/a"].count == 0
    ids = {d.id for items in got.values() for d in items}
    assert len(ids) == 2  # one message per destination channel


def test_broadcast_reaches_channels_read_by_a_wildcard_group() -> None:
    h = Harness()
    h.publish(send("orders/v1/a", 0), send("orders/v1/b", 0), send("orders/v10/c", 0))
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/*", group="g", start="new", prefetch=10)
    (o,) = h.publish(send("orders/v1/*", "all"))
    assert o.fanout == 2
    got = h.take(sub)
    assert sorted(d.channel for d in got) == ["orders/v1/a", "orders/v1/b"]


def test_broadcast_without_readers_reaches_nobody() -> None:
    h = Harness()
    h.publish(send("orders/v1/a", 0))
    (o,) = h.publish(send("orders/v1/*", "all"))
    assert (o.code, o.fanout, o.seq) == (0, 0, 0)
    assert h.broker.channels["orders/v1/a"].count == 1


def test_broadcast_to_a_bad_pattern_is_refused() -> None:
    h = Harness()
    (o,) = h.publish(send("orders/x1/*", 1))
    assert o.code == ErrorCode.INVALID_CHANNEL


def test_broadcast_refused_by_a_full_target_stores_nothing() -> None:
    # Regression: the targets staged before the full one used to keep the message.
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    s = Session("c")
    for i, ch in enumerate(["orders/v1/a", "orders/v1/b", "orders/v1/c"], start=1):
        h.subscribe(s, i, patterns=ch, group=f"g{i}")
    h.publish(send("orders/v1/b", "fill"))
    (o,) = h.publish(send("orders/v1/*", "all"))
    assert o.code == ErrorCode.QUEUE_FULL
    assert {n: log.count for n, log in h.broker.channels.items()} == {
        "orders/v1/a": 0, "orders/v1/b": 1, "orders/v1/c": 0}


def test_a_refused_message_does_not_record_its_dedup_key() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/1", group="g")
    h.publish(send("orders/v1/1", "fill"))
    (refused,) = h.publish(send("orders/v1/1", "x", dedup="k"))
    assert refused.code == ErrorCode.QUEUE_FULL
    h.ack(s, h.take(sub))
    h.commit()
    (retry,) = h.publish(send("orders/v1/1", "x", dedup="k"))
    assert (retry.code, retry.duplicate, retry.seq) == (0, False, 2)


# ------------------------------------------ refusals and early duplicates
def test_a_refusal_names_its_channel_cut_to_255_characters() -> None:
    h = Harness()
    long = "orders/v1/" + "x" * 300
    bad, full = h.publish(send(long, 1), Send("orders/v1/1", b"{bad"))
    assert (bad.code, bad.channel) == (ErrorCode.INVALID_CHANNEL, long[:255])
    assert (full.code, full.channel) == (ErrorCode.INVALID_PAYLOAD, "orders/v1/1")


def test_a_dedup_duplicate_of_a_message_whose_commit_failed_gets_that_error() -> None:
    """Duplicates of a message still being written are answered after its commit:
    with the message's seq if it was stored, with the commit's error if not (and a
    resend then stores it)."""
    from minou.errors import StorageFull

    full = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)
    h = Harness()
    (first,) = h.publish(send("orders/v1/1", 1, dedup="k"), commit=False)
    failing = h.broker.take_writes()
    outcomes, staged = h.broker.publish(
        [send("orders/v1/1", 1, dedup="k"), send("orders/v1/2", 2),
         send("orders/v1/1", 1, dedup="k")], h.now)
    assert [o.duplicate for o in outcomes] == [True, False, True] and staged
    early = list(h.broker.early_duplicates)
    assert [i for i, _, _ in early] == [0, 2]
    h.broker.on_failed(failing, full)
    h.broker.settle_duplicates(outcomes, early)
    assert [(o.channel, o.code, o.error, o.seq, o.duplicate) for o in outcomes] == [
        ("orders/v1/1", ErrorCode.STORAGE_FULL, full.message, 0, False),
        ("orders/v1/2", 0, "", 1, False),
        ("orders/v1/1", ErrorCode.STORAGE_FULL, full.message, 0, False)]
    # The message itself (its publisher is told) and its two duplicates:
    assert h.broker.counters.refused == {"storage_full": 3}
    assert [o.code for o in h.replies[-1][0]] == [ErrorCode.STORAGE_FULL]
    h.commit()
    (again,) = h.publish(send("orders/v1/1", 1, dedup="k"))
    assert (again.duplicate, again.code, again.seq) == (False, 0, first.seq + 1)


def test_a_dedup_duplicate_of_a_message_being_written_stands_once_it_is_stored() -> None:
    h = Harness()
    (first,) = h.publish(send("orders/v1/1", 1, dedup="k"), commit=False)
    writing = h.broker.take_writes()
    outcomes, _ = h.broker.publish([send("orders/v1/1", 1, dedup="k")], h.now)
    early = list(h.broker.early_duplicates)
    assert len(early) == 1
    h.broker.on_committed(writing, h.now)
    h.broker.settle_duplicates(outcomes, early)
    assert [(o.duplicate, o.seq, o.id, o.code) for o in outcomes] == [
        (True, first.seq, first.id, 0)]
    assert h.broker.counters.refused == {}
    # A duplicate of a stored message is answered at once.
    h.broker.publish([send("orders/v1/1", 1, dedup="k")], h.now)
    assert h.broker.early_duplicates == []


def test_a_dedup_duplicate_of_a_broadcast_that_reached_nobody_is_answered_at_once() -> None:
    h = Harness()
    (first,) = h.publish(send("orders/v1/*", 1, dedup="k"))
    assert (first.fanout, first.seq, first.id) == (0, 0, "")
    outcomes, staged = h.broker.publish([send("orders/v1/*", 1, dedup="k")], h.now)
    assert [(o.duplicate, o.seq, o.code) for o in outcomes] == [(True, 0, 0)]
    assert staged == [] and h.broker.early_duplicates == []


def test_a_numbered_producer_evicted_while_connected_keeps_what_it_knew() -> None:
    """The broker-wide table of producer states is bounded; a connection keeps its own
    states, so a resend after its state was evicted is still a duplicate."""
    h = Harness()
    h.broker.producers.max_states = 1
    p = Session("app", producer_id="00000000000000aa")
    q = Session("other", producer_id="00000000000000bb")
    first, _ = h.broker.publish([Send("orders/v1/1", b"1", pseq=1)], h.now, session=p)
    h.commit()
    h.broker.publish([Send("orders/v1/1", b"2", pseq=1)], h.now, session=q)  # evicts p's
    h.commit()
    assert h.broker.producers.evicted >= 1
    again, staged = h.broker.publish([Send("orders/v1/1", b"1", pseq=1)], h.now, session=p)
    assert staged == [] and (again[0].duplicate, again[0].seq) == (True, first[0].seq)
    nxt, _ = h.broker.publish([Send("orders/v1/1", b"3", pseq=2)], h.now, session=p)
    assert (nxt[0].code, nxt[0].duplicate) == (0, False)


@pytest.mark.parametrize(("fanout", "size", "code"), [
    (3, 4, 0), (4, 1, ErrorCode.BAD_REQUEST),  # the channel limit: 3 copies
    (3, 5, ErrorCode.BAD_REQUEST),  # the byte limit: 12 bytes x channels
    (2, 6, 0), (2, 7, ErrorCode.BAD_REQUEST),
])
def test_a_broadcast_is_refused_past_its_channel_or_byte_limit_and_stored_nowhere(
        monkeypatch: pytest.MonkeyPatch, fanout: int, size: int, code: int) -> None:
    monkeypatch.setattr(publishing, "MAX_BROADCAST_FANOUT", 3)
    monkeypatch.setattr(publishing, "MAX_BROADCAST_BYTES", 12)
    h = Harness()
    s = Session("c")
    for i in range(fanout):
        h.subscribe(s, i + 1, patterns=f"orders/v1/{i}", group=f"g{i}")
    (o,) = h.publish(Send("orders/v1/*", b"1" * size))
    assert o.code == code
    if not code:
        assert o.fanout == fanout
    assert sum(log.count for log in h.broker.channels.values()) == (0 if code else fanout)


def test_every_dedup_duplicate_is_counted() -> None:
    h = Harness()
    h.publish(send("orders/v1/1", 1, dedup="k"))
    for _ in range(3):
        (o,) = h.publish(send("orders/v1/1", 1, dedup="k"))
        assert o.duplicate
    assert h.broker.counters.duplicates == 3


def test_a_client_publishes_only_where_its_rules_let_it_write() -> None:
    """Alone, in a frame to one channel (the run path) or to a channel made just now: a
    send to a channel the client may not write to is refused (NOT_AUTHORIZED), the
    others of the frame are stored, and nothing of the refused ones is staged."""
    from minou.auth.rules import Access

    h = Harness()
    access = Access("c", write=["orders/*"])
    h.publish(send("secret/v1/a", 0))  # the channel exists (an unrestricted client)

    def publish(*sends: Send) -> list[int]:
        outcomes = h.engine.publish(sends, access, lambda *_: None, publisher=h)
        h.commit()
        return [o.code for o in outcomes]

    denied = int(ErrorCode.NOT_AUTHORIZED)
    assert publish(send("secret/v1/a", 1)) == [denied]
    assert publish(send("secret/v1/b", 1)) == [denied]  # not made either
    assert publish(send("secret/v1/a", 2), send("secret/v1/a", 3), send("orders/v1/1", 4)
                   ) == [denied, denied, 0]
    assert "secret/v1/b" not in h.broker.channels
    sub = h.subscribe(Session("r"), patterns="secret/v1/a", group="g", prefetch=10)
    assert payloads(h.take(sub)) == [0]


def test_only_a_redis_broadcast_may_not_name_a_stream_id() -> None:
    """Through the Redis door the header names the message's stream id, which one
    channel gives: a broadcast naming one is refused, one without is stored to every
    channel read under the prefix. From another door the header is an ordinary one."""
    from minou.core.stream_ids import ID_HEADER

    h = Harness()
    for i, ch in enumerate(("a/v1/1", "a/v1/2")):
        h.publish(send(ch, 0))
        h.subscribe(Session("r"), i, patterns=ch, group=f"g{i}", prefetch=10)
    [named] = h.publish(send("a/v1/*", 1, headers={ID_HEADER: "5-0"}), resp_door=True)
    assert named.code == ErrorCode.BAD_REQUEST
    [plain] = h.publish(send("a/v1/*", 2), resp_door=True)
    assert (plain.code, plain.fanout) == (0, 2)
    [native] = h.publish(send("a/v1/*", 3, headers={ID_HEADER: "5-0"}))
    assert (native.code, native.fanout) == (0, 2)
