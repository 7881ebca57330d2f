"""A channel's log (core/log.py ``ChannelLog``): its count of live messages, what a
lookup answers (a body, GONE, or MISSING: ask storage), and the cache of bodies."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.broker import Session
from minou.core.log import (
    GONE,
    MISSING,
    READ_WEIGHT_BASE,
    ChannelLog,
    Msg,
    held_weight,
    page_end,
    read_weight,
)

from .helpers import Harness, send

CH = "orders/v1/1"


def _log(n: int, *, size: int = 20) -> ChannelLog:
    log = ChannelLog(CH)
    for seq in range(1, n + 1):
        log.next_seq += 1
        log.append_committed(Msg(CH, seq, f"id{seq}", b"x" * size))
        log.count += 1
    return log


def test_the_sentinels_name_themselves() -> None:
    assert (repr(GONE), repr(MISSING)) == ("GONE", "MISSING")


def test_deleting_the_head_when_the_next_is_gone_does_not_skip_a_live_one() -> None:
    log = _log(5)
    assert log.delete_one(2)
    assert log.delete_one(1)  # the head: 2 is gone, 3 is the new head
    assert (log.first_seq, log.count, log.oldest_live()) == (3, 3, 3)
    assert isinstance(log.lookup(3), Msg)
    assert log.delete_one(4)
    assert log.delete_one(3)  # the head again, over 4, to 5
    assert (log.first_seq, log.count, log.oldest_live()) == (5, 1, 5)
    assert log.gone == set()
    assert isinstance(log.lookup(5), Msg)


def test_deleting_a_message_twice_does_not_make_the_depth_drift() -> None:
    log = _log(3)
    assert log.delete_one(2)
    assert not log.delete_one(2)
    assert log.delete_one(1)
    assert not log.delete_one(1)
    assert not log.delete_one(0)
    assert not log.delete_one(4)  # not committed
    assert log.count == 1
    assert log.cache_bytes == log.cache[3].size()


def test_expiring_a_message_twice_counts_it_once() -> None:
    h = Harness()
    h.subscribe(Session("c"), patterns=CH, group="g")
    h.publish_values(CH, [1, 2, 3])
    assert h.broker.expire([(CH, 2)], h.now) == 1
    assert h.broker.expire([(CH, 2)], h.now) == 0
    log = h.broker.channels[CH]
    stats = h.broker.channel_stats(log, h.now)
    assert (stats["depth"], stats["expired"]) == (2, 1)
    assert h.broker.counters.expired == 1


def test_oldest_live_skips_deleted_ones_and_knows_when_none_is_left() -> None:
    log = _log(3)
    assert log.oldest_live() == 1
    log.delete_one(2)
    log.delete_one(1)
    assert log.oldest_live() == 3
    log.delete_one(3)
    assert log.oldest_live() is None
    assert ChannelLog(CH).oldest_live() is None


def test_evict_bytes_frees_the_oldest_bodies_first_and_no_more_than_asked() -> None:
    log = _log(4)
    one = log.cache[1].size()
    assert log.evict_bytes(1) == one  # a whole body, the oldest
    assert log.cache_lo == 2 and sorted(log.cache) == [2, 3, 4]
    assert log.lookup(1) is MISSING  # in storage only now
    assert log.evict_bytes(one + 1) == 2 * one
    assert (log.cache_lo, sorted(log.cache)) == (4, [4])
    assert log.cache_bytes == one
    assert log.evict_bytes(0) == 0
    assert log.cache_lo == 4


def test_evict_bytes_frees_what_headers_and_keys_hold_too() -> None:
    """Each body is counted as ``Msg.size`` counts it, whatever it carries."""
    log = ChannelLog(CH)
    msgs = [Msg(CH, 1, "a", b"1"), Msg(CH, 2, "b", b"2", headers={"h": "v" * 50}),
            Msg(CH, 3, "c", b"3", key="k" * 40),
            Msg(CH, 4, "d", b"4", headers={"h": "1"}, key="k")]
    for m in msgs:
        log.append_committed(m)
    sizes = [m.size() for m in msgs]
    assert len(set(sizes)) == 4  # each shape is counted differently
    assert [log.evict_bytes(1) for _ in msgs] == sizes
    assert log.cache_bytes == 0


def test_evict_bytes_passes_over_deleted_seqs() -> None:
    log = _log(4)
    one = log.cache[1].size()
    log.delete_one(2)
    assert log.evict_bytes(one + 1) == 2 * one  # 1 and 3: 2 had no body left
    assert sorted(log.cache) == [4]
    assert log.lookup(2) is GONE
    assert log.lookup(3) is MISSING
    assert log.evict_bytes(10 * one) == one
    assert (log.cache_lo, log.cache_bytes) == (5, 0)


@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    n=st.integers(0, 8),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("delete"), st.integers(0, 10)),
            st.tuples(st.just("truncate"), st.integers(0, 10)),
            st.tuples(st.just("evict"), st.integers(0, 3)),
            st.tuples(st.just("evict_below"), st.integers(0, 10)),
            st.tuples(st.just("load"), st.integers(1, 9)),
        ),
        max_size=10,
    ),
)
def test_the_log_keeps_its_count_and_lookups_straight(n: int, ops: list) -> None:
    """Whatever is deleted, truncated, evicted and read back from storage: ``count`` is
    the number of live messages, a live one is found (in the cache or the page read
    back, else MISSING), a deleted or truncated one is GONE, and the cached bytes add
    up."""
    log = _log(n)
    size = Msg(CH, 0, "", b"x" * 20).size()
    live = set(range(1, n + 1))
    for op, arg in ops:
        if op == "delete":
            assert log.delete_one(arg) == (arg in live)
            live.discard(arg)
        elif op == "truncate":
            removed = {s for s in live if s < arg}
            assert log.truncate_below(arg) == len(removed)
            live -= removed
        elif op == "evict":
            log.evict_bytes(arg * size)
        elif op == "load":  # storage read back the live messages of [arg, arg + 3)
            log.readback = {s: Msg(CH, s, f"id{s}", b"x" * 20)
                            for s in range(arg, arg + 3) if s in live}
            log.rb_lo, log.rb_hi = arg, arg + 3
        else:
            log.evict_below(arg)
        assert log.count == len(live)
        assert log.oldest_live() == min(live, default=None)
        for seq in range(0, n + 3):
            found = log.lookup(seq)
            if seq not in live:
                assert found is GONE
            elif seq in log.cache or log.rb_lo <= seq < log.rb_hi:
                assert isinstance(found, Msg) and found.seq == seq
            else:
                assert found is MISSING
        assert log.cache_bytes == size * len(log.cache)
        assert set(log.cache) <= live
        assert set(log.readback) <= live


def test_the_cache_counts_each_body_with_its_overhead() -> None:
    """The body cache budget counts a message as its bytes plus 280 (the object and its
    dict slot): a budget of exactly that for every body keeps them all."""
    h = Harness()
    h.publish_values(CH, ["x" * 98, "y" * 198])  # 100 and 200 bytes of JSON
    log = h.broker.channels[CH]
    assert log.cache_bytes == (100 + 280) + (200 + 280)
    h.broker.cache_budget = log.cache_bytes
    assert h.broker.trim_cache() == 0
    h.broker.cache_budget = log.cache_bytes - 1
    assert h.broker.trim_cache() == 100 + 280


def test_the_cache_counts_headers_and_keys_too() -> None:
    """A message's headers and key are held with its body: 64 headers of 120 bytes and a
    256-character key on a 1-byte payload hold ~12 KB, which the budget counted as 281
    bytes (a writer made the cache hold 40 x its budget). Each header counts its text
    and ~140 bytes of objects, the dict 240, the key its text and 50."""
    h = Harness()
    headers = {f"h{i:02d}": "v" * 117 for i in range(64)}
    h.publish(send(CH, 1, headers=headers, key="k" * 256), send(CH, 2))
    log = h.broker.channels[CH]
    plain = 1 + 280
    assert log.cache_bytes == plain + 240 + 64 * (3 + 117 + 140) + 256 + 50 + plain
    h.broker.cache_budget = 10_000
    assert h.broker.trim_cache() > 0  # the headed one does not fit a budget of 10 KB


def test_reprs_name_the_channel_and_position() -> None:
    log = _log(1)
    assert repr(log.cache[1]) == f"Msg({CH!r}, seq=1)"
    h = Harness()
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    (gc,) = sub.group.gcs.values()
    assert repr(gc) == f"GroupChannel('consume:g', {CH!r}, cursor=1)"


def test_truncating_to_a_deleted_seq_starts_the_log_at_the_next_live_one() -> None:
    log = _log(5)
    log.delete_one(3)
    assert log.truncate_below(3) == 2
    assert (log.first_seq, log.count, log.oldest_live()) == (3, 2, 4)
    assert log.lookup(3) is GONE and isinstance(log.lookup(4), Msg)


# ------------------------------------------------- pages bounded by bytes (read-back)
def _m(seq: int, size: int, headers: dict[str, str] | None = None) -> Msg:
    return Msg("orders/v1/1", seq, f"id-{seq}", b"x" * size, headers=headers)


def test_read_weight_is_payload_headers_and_a_base() -> None:
    assert read_weight(_m(1, 100)) == 100 + READ_WEIGHT_BASE
    assert read_weight(_m(1, 0, {"ab": "cde", "f": ""})) == \
        READ_WEIGHT_BASE + (2 + 3 + 8) + (1 + 0 + 8)


def test_held_weight_is_the_memory_of_headers_and_key_and_never_less_than_read_weight(
) -> None:
    headers = {"ab": "cde", "f": ""}
    with_headers = _m(1, 10, headers)
    assert held_weight(with_headers) == with_headers.size() == \
        10 + 280 + 240 + (2 + 3 + 140) + (1 + 0 + 140)
    assert held_weight(with_headers) > read_weight(with_headers)
    short_key = Msg("orders/v1/1", 2, "id-2", b"x" * 10, key="k")  # size 341 < 522
    assert held_weight(short_key) == 10 + READ_WEIGHT_BASE
    long_key = Msg("orders/v1/1", 3, "id-3", b"x" * 10, key="k" * 300)
    assert held_weight(long_key) == long_key.size() == 10 + 280 + 300 + 50


def test_page_end_says_where_the_next_page_starts() -> None:
    w = 100 + READ_WEIGHT_BASE
    page = [_m(s, 100) for s in (3, 4, 6)]
    assert page_end([], 10, None, 50) == 50  # nothing there: read to the end
    assert page_end(page, 3, None, 50) == 7  # full by count
    assert page_end(page, 10, None, 50) == 50  # short, no byte bound: that was all
    assert page_end(page, 10, 3 * w, 50) == 7  # exactly at the bound: cut there
    assert page_end(page, 10, 3 * w + 1, 50) == 50  # under it: that was all


def test_cached_range_stops_at_max_bytes_with_one_message_at_least() -> None:
    log = ChannelLog("orders/v1/1")
    for s in range(1, 6):
        log.append_committed(_m(s, 1000))
    log.next_seq = 6
    w = 1000 + READ_WEIGHT_BASE
    seqs_of = [[m.seq for m in page] for page in (
        log.cached_range(1, 6, 10, 1), log.cached_range(1, 6, 10, 2 * w),
        log.cached_range(1, 6, 10, 2 * w + 1), log.cached_range(2, 6, 2, None),
        log.cached_range(1, 6, 10, None), log.cached_range(1, 3, 10, None))]
    assert seqs_of == [[1], [1, 2], [1, 2, 3], [2, 3], [1, 2, 3, 4, 5], [1, 2]]
    log.evict_below(3)  # 1 and 2 are in storage only now
    assert log.cached_range(1, 6, 10, 10 * w) is None
