"""Stream ids of a channel given explicit ids (core/stream_ids.py), against a model that
numbers every seq one by one as Redis numbers XADD."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.stream_ids import (
    N_MASK,
    SEQ_BITS,
    StreamIds,
    make_id,
    parse_explicit,
    parse_point_key,
    point_key,
)
from minou.errors import BadRequest


def model_next(top: int, seq: int) -> int:
    """The id XADD '*' gives the message at ``seq`` after ``top``: ``<seq>-0`` if that is
    greater, else the top's ms with the next n (Redis with a clock at ``seq`` ms)."""
    return max(seq << SEQ_BITS, top + 1)


# each step: None for '*', else an explicit (ms, n) given relative to the top
steps = st.lists(st.one_of(
    st.none(),
    st.tuples(st.integers(0, 3), st.integers(0, 3)),  # near the top (1-1, 1-2, ...)
    st.tuples(st.integers(4, 3000), st.integers(0, 5)),  # far ahead
), max_size=60)


def run(plan: list[tuple[int, int] | None]) -> tuple[StreamIds, list[int]]:
    ids, model = StreamIds(), [0]  # model[seq] = id; model[0] = 0 (no message)
    for step in plan:
        seq = len(model)
        top = model[-1]
        if step is None:
            want = model_next(top, seq)
        else:
            dm, n = step
            ms = (top >> SEQ_BITS) + dm
            want = make_id(ms, n)
            if want <= top:
                with pytest.raises(BadRequest, match=r"equal or smaller|greater than 0\-0"):
                    ids.assign(seq, ms, n)
                continue
            ids.assign(seq, ms, n)
        model.append(want)
        assert ids.id_of(seq) == want
    return ids, model


@settings(max_examples=300, deadline=None)
@given(steps)
def test_ids_match_the_model_and_never_change(plan: list[tuple[int, int] | None]) -> None:
    ids, model = run(plan)
    for seq in range(1, len(model)):
        assert ids.id_of(seq) == model[seq]
        assert ids.id_of(seq) > ids.id_of(seq - 1) if seq > 1 else True


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(0, 3000 * 60 + 20), st.integers(0, 6))
def test_ceil_and_exact_lookups_match_a_scan(plan: list[tuple[int, int] | None],
                                             ms: int, n: int) -> None:
    ids, model = run(plan)
    end = len(model)
    value = make_id(ms, n)
    scan = next((s for s in range(1, end) if model[s] >= value), end)
    assert ids.ceil(value, end) == scan
    exact = next((s for s in range(1, end) if model[s] == value), None)
    assert ids.seq_of(value, end) == exact
    for s in range(1, end):  # every stored id is found, with or without a bound
        assert ids.seq_of(model[s], end) == s and ids.seq_of(model[s]) == s
    # Unbounded: over the seqs to come too, numbered by '*' from the top
    future = list(model)
    while future[-1] <= value or len(future) <= end:
        future.append(model_next(future[-1], len(future)))
    assert ids.ceil(value) == next(s for s in range(1, len(future)) if future[s] >= value)
    assert ids.id_of(ids.search_end(value)) > value


def test_auto_ids_follow_an_id_from_the_future_as_redis_does() -> None:
    ids = StreamIds()
    assert ids.assign(3, 1000, 5) == make_id(1000, 5)
    assert [ids.text(s) for s in (1, 2, 3, 4, 5)] == [b"1-0", b"2-0", b"1000-5", b"1000-6",
                                                     b"1000-7"]
    assert ids.text(1000) == b"1000-1002"
    assert ids.text(1001) == b"1001-0"


def test_an_id_the_message_gets_anyway_makes_no_point() -> None:
    ids = StreamIds()
    assert ids.assign(1, 1, 0) is None
    assert ids.assign(2, 7, 0) == make_id(7, 0)
    assert ids.assign(3, 7, 1) is None
    assert len(ids) == 1


def test_ms_star_takes_the_next_n_of_that_ms() -> None:
    ids = StreamIds()
    assert ids.assign(1, 50, None) == make_id(50, 0)
    assert ids.assign(2, 50, None) is None  # 50-1: what '*' gives anyway
    assert ids.text(2) == b"50-1"
    with pytest.raises(BadRequest, match="equal or smaller"):
        ids.assign(3, 49, None)
    assert ids.assign(3, 60, None) == make_id(60, 0)


def test_zero_and_the_top_are_refused_in_redis_words() -> None:
    ids = StreamIds()
    with pytest.raises(BadRequest, match="must be greater than 0-0"):
        ids.assign(1, 0, 0)
    ids.assign(1, 5, 5)
    with pytest.raises(BadRequest, match="equal or smaller than the target stream top"):
        ids.assign(2, 5, 5)
    assert len(ids) == 1


def test_points_are_bounded_with_a_precise_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("minou.core.stream_ids.MAX_POINTS", 3)
    ids = StreamIds()
    for seq in (1, 2, 3):
        ids.assign(seq, 10 * seq, 1)
    with pytest.raises(BadRequest, match="3 entries added with ids of their own"):
        ids.assign(4, 100, 1)
    assert len(ids) == 3
    assert ids.id_of(4) == make_id(30, 2)  # '*' still numbers the next message


def test_prune_keeps_the_point_that_still_numbers_live_messages() -> None:
    ids = StreamIds()
    for seq, ms in ((2, 100), (5, 200), (9, 300)):
        ids.assign(seq, ms, 0)
    before = {s: ids.id_of(s) for s in range(6, 15)}
    assert ids.prune(4) == []  # the point at 2 numbers 3 and 4
    assert ids.prune(6) == [2]
    assert {s: ids.id_of(s) for s in range(6, 15)} == before
    assert ids.prune(100) == [5]
    assert len(ids) == 1


def test_points_added_out_of_order_at_start_up() -> None:
    ids, other = StreamIds(), StreamIds()
    for seq, ms in ((2, 100), (5, 200), (9, 300)):
        ids.assign(seq, ms, 0)
    for seq, ms in ((9, 300), (2, 100), (5, 200)):
        other.add(seq, make_id(ms, 0))
    assert [other.id_of(s) for s in range(1, 20)] == [ids.id_of(s) for s in range(1, 20)]


@pytest.mark.parametrize("text", ["", "-1-0", "1-", "a-b", "1-0-0", "1-**",
                                  "99999999999999999999999-0", f"1-{N_MASK + 1}"])
def test_explicit_ids_that_are_not_ids(text: str) -> None:
    with pytest.raises(BadRequest, match="Invalid stream ID"):
        parse_explicit(text)


def test_explicit_ids() -> None:
    assert parse_explicit("5") == (5, 0)  # as Redis reads XADD s 5 ...
    assert parse_explicit("5-3") == (5, 3)
    assert parse_explicit("5-*") == (5, None)
    assert parse_explicit(f"{N_MASK}-{N_MASK}") == (N_MASK, N_MASK)


def test_point_keys_round_trip() -> None:
    assert parse_point_key(point_key("redis/v1/a%2Fb", 12)) == ("redis/v1/a%2Fb", 12)
    assert parse_point_key("listen_keys") is None
    assert parse_point_key("resp-id/x/") is None


def test_refusals_are_redis_words_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    for text in ("x", f"{N_MASK + 1}-0"):
        with pytest.raises(BadRequest) as err:
            parse_explicit(text)
        assert err.value.message == "Invalid stream ID specified as stream command argument"
    ids = StreamIds()
    ids.assign(1, 6, N_MASK)
    with pytest.raises(BadRequest) as err:  # no n left in that ms
        ids.assign(2, 6, None)
    assert err.value.message == ("The ID specified in XADD is equal or smaller than the "
                                 "target stream top item")
    monkeypatch.setattr("minou.core.stream_ids.MAX_POINTS", 1)
    with pytest.raises(BadRequest) as err:
        ids.assign(2, 9, 0)
    assert err.value.message == (
        "this stream holds 1 entries added with ids of their own (the limit, kept in "
        "memory until the entries are removed): add with '*' or let readers settle the "
        "older entries")


def test_ids_use_all_64_bits_of_each_part() -> None:
    ids = StreamIds()
    assert ids.assign(1, N_MASK, N_MASK - 1) == make_id(N_MASK, N_MASK - 1)
    assert ids.text(1) == b"%d-%d" % (N_MASK, N_MASK - 1)
    assert ids.text(2) == b"%d-%d" % (N_MASK, N_MASK)


def test_a_point_added_again_replaces_the_first() -> None:
    ids = StreamIds()
    ids.add(5, make_id(50, 1))
    ids.add(5, make_id(60, 2))  # the last one again
    assert len(ids) == 1 and ids.id_of(5) == make_id(60, 2)
    ids.add(9, make_id(90, 0))
    ids.add(5, make_id(70, 3))  # an earlier one again (start-up reads any order)
    assert list(ids.seqs) == [5, 9] and ids.id_of(5) == make_id(70, 3)
    assert ids.id_of(9) == make_id(90, 0)


def test_the_search_ends_past_the_points_and_the_id() -> None:
    ids = StreamIds()
    assert ids.search_end(make_id(5, 7)) == 7
    for seq in range(1, 11):  # 1-1, 1-2, ... 1-10: ids below <seq>-0
        ids.assign(seq, 1, seq)
    assert ids.search_end(make_id(1, 5)) == 12
    assert ids.ceil(make_id(1, 5)) == 5 and ids.seq_of(make_id(1, 7)) == 7
    assert ids.id_of(11) == make_id(11, 0)  # '*' next: <seq>-0 is above 1-10
    assert ids.ceil(make_id(1, 11)) == 11 and ids.ceil(make_id(2, 0)) == 11
    assert ids.ceil(make_id(11, 1)) == 12


def test_an_n_run_past_its_64_bits_carries_and_stays_increasing() -> None:
    ids = StreamIds()
    ids.assign(2, 5, N_MASK - 1)
    got = [ids.id_of(s) for s in range(1, 10)]
    assert got == sorted(set(got)) and got[1:4] == [make_id(5, N_MASK - 1),
                                                    make_id(5, N_MASK), make_id(6, 0)]
    assert got[5] == make_id(6, 2) and got[6] == make_id(7, 0)
    top = StreamIds()
    top.assign(1, N_MASK, N_MASK)
    with pytest.raises(BadRequest) as err:
        top.check_next(2)
    assert err.value.message == ("The stream has exhausted the last possible ID, unable "
                                 "to add more items")
    ids.check_next(10)  # room left: nothing raised


@pytest.fixture
def no_collection() -> Iterator[None]:
    """StreamIds.held counts every stream of the process, and a stream's points leave it
    when the stream is freed: other tests' streams collected by a GC run in the middle
    of a count moved it (held 5 -> 1 under a two-worker make test)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_point_whose_message_was_never_stored_is_removed(no_collection: None) -> None:
    ids = StreamIds()
    ids.assign(2, 100, 0)
    ids.assign(3, 200, 0)
    held = StreamIds.held
    assert ids.remove(3) and not ids.remove(3) and not ids.remove(7)
    assert StreamIds.held == held - 1 and list(ids.seqs) == [2]
    assert ids.id_of(3) == make_id(100, 1)  # numbered from the point before
    assert ids.assign(3, 200, 0) == make_id(200, 0)  # the id may be given again


def test_stored_points_read_every_point_row_and_skip_the_rest() -> None:
    from minou.core.stream_ids import stored_points

    meta = {"listen_keys": "escaped", "lineage:v": "3-0", point_key("a/v1/x", 3): "",
            point_key("a/v1/x", 4): "bad", point_key("a/v1/x", 5): "9-0", "lineage:w": "z",
            point_key("b/v1/y", 2): "7-3"}
    assert stored_points(meta) == {"a/v1/x": [(5, make_id(9, 0))],
                                   "b/v1/y": [(2, make_id(7, 3))]}


def test_the_points_of_every_stream_together_are_bounded(
        monkeypatch: pytest.MonkeyPatch, no_collection: None) -> None:
    monkeypatch.setattr(StreamIds, "held", 1000)  # as if other streams held some
    base = StreamIds.held
    a, b = StreamIds(), StreamIds()
    a.assign(1, 10, 1)
    b.assign(1, 10, 1)
    b.assign(2, 20, 1)
    assert StreamIds.held == base + 3
    monkeypatch.setattr("minou.core.stream_ids.MAX_POINTS_HELD", base + 3)
    with pytest.raises(BadRequest) as err:
        a.assign(2, 30, 1)
    assert err.value.message == (
        "the broker holds 1,003 entries added with ids of their own over all streams (the "
        "limit, kept in memory until the entries are removed): add with '*' or let "
        "readers settle older entries")
    assert a.assign(2, 10, 2) is None  # no point needed: never refused for the bound
    assert b.prune(2) == [1] and StreamIds.held == base + 2
    a.assign(3, 30, 1)  # room again
    del a, err  # a channel removed: its points go with it (the traceback held it too)
    assert StreamIds.held == base + 1
    b.add(2, make_id(25, 0))  # replaced, not added
    assert StreamIds.held == base + 1
    b.add(1, make_id(5, 0))  # an earlier one (start-up order): one more
    assert StreamIds.held == base + 2


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 70))
def test_after_pruning_the_live_ids_are_kept_and_found(plan: list[tuple[int, int] | None],
                                                       first: int) -> None:
    """Points below the first live seq go (but the one numbering it); the ids from
    there on do not change and every search still finds them (ids below <seq>-0 too)."""
    ids, model = run(plan)
    end = len(model)
    first = min(first, end)
    ids.prune(first)
    got = [ids.id_of(s) for s in range(1, end)]
    assert got == sorted(set(got))  # still increasing, gone seqs included
    for s in range(first, end):
        assert ids.id_of(s) == model[s]
        assert ids.seq_of(model[s]) == s and ids.ceil(model[s]) == s


def test_ids_below_seq_stay_in_order_once_their_first_points_are_pruned() -> None:
    ids = StreamIds()
    for seq, n in ((1, 1), (2, 2), (3, 4)):
        ids.assign(seq, 1, n)
    assert ids.prune(3) == [1, 2]
    assert [ids.text(s) for s in (1, 2, 3, 4)] == [b"1-0", b"1-3", b"1-4", b"4-0"]
    assert ids.ceil(make_id(1, 4)) == 3 and ids.seq_of(make_id(1, 4)) == 3


def test_edges_of_the_id_space() -> None:
    ids = StreamIds()
    ids.assign(1, N_MASK, N_MASK - 1)
    ids.check_next(2)  # the very last id is still one: given
    assert ids.id_of(2) == (1 << 2 * 64) - 1
    with pytest.raises(BadRequest, match="exhausted"):
        ids.check_next(3)
    with pytest.raises(BadRequest, match="exhausted"):  # an explicit id too, as Redis
        ids.assign(3, N_MASK, None)
    assert StreamIds().search_end(make_id(0, 5)) == 2
    only = StreamIds()
    only.assign(2, 100, 0)
    assert only.remove(2) and len(only) == 0  # the first (and only) point too
