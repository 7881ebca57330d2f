"""One message that waits (a delayed retry, a publish-time delay) pins a group's floor:
every ack after it must not stay in memory and in every commit's group state one by one.

A group keeps its acks above the floor as a set of recent ones plus runs
(``SeqRuns``, core/seq_runs.py) and stores them as ranges (core/group.py ``_State.acked_runs``);
a state written by an older version (every seq in ``acked``) still restores.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core import group as group_mod
from minou.core.broker import Broker, Session
from minou.core.group import GroupChannel
from minou.protocol.frames import Send

from . import test_group_channel
from .helpers import Harness, seqs

# Tens of thousands of acks a test: under mutmut's trampolines far past the 5 s per-test
# limit, which failed `make mutate`'s first (stats) run
pytestmark = pytest.mark.timeout(300)

CH = "o/v1/1"


@contextmanager
def fold_at(n: int) -> Iterator[None]:
    """Fold acks into runs past ``n`` of them (FOLD_ACKED) within the block."""
    old = group_mod.FOLD_ACKED
    group_mod.FOLD_ACKED = n
    try:
        yield
    finally:
        group_mod.FOLD_ACKED = old


def _held(gc: GroupChannel) -> int:
    """What the group holds for its acks: set members and runs."""
    runs = getattr(gc, "acked_runs", None)  # None on the code before runs
    return len(gc.acked) + (runs.run_count() if runs is not None else 0)


def _pinned(pin: str, n: int = 199_000) -> tuple[Broker, GroupChannel, list[int]]:
    """``n`` acks after one message that waits: the first delivery nacked with a long
    delay (``pin="nack"``), held unsettled ("lease") or a first message published with
    a delay ("sched").
    Returns the broker, its group's channel state and the group-state bytes of each
    commit."""
    b = Broker()
    now = 1000.0
    s = Session("c")
    b.subscribe(s, 1, kind="consume", patterns=[CH], group="g", prefetch=1000, now=now)
    if pin == "sched":
        b.publish([Send(CH, b"0", delay=1e6)], now)
        b.on_committed(b.take_writes(), now)
    total = n + (pin in ("nack", "lease"))
    for i in range(0, total, 1000):
        b.publish([Send(CH, b"1") for _ in range(min(1000, total - i))], now)
        b.on_committed(b.take_writes(), now)
    first = pin in ("nack", "lease")
    done = 0
    sizes: list[int] = []
    while done < n:
        out, loads = b.pump(now)
        assert not loads and out
        for _sub, items in out.items():
            tags = [d.tag for d in items]
            if first:
                if pin == "nack":
                    b.nack(s, tags[:1], delay=1e6, front=False, now=now)
                tags, first = tags[1:], False  # "lease": held, not settled
            b.ack(s, tags, now)
            done += len(tags)
        w = b.take_writes()
        sizes += [len(v[1]) for v in w.group_states.values() if v]
        b.on_committed(w, now)
    gc = b.state.groups["consume:g"].gcs[CH]
    return b, gc, sizes


def test_acks_after_a_delayed_retry_take_bounded_state() -> None:
    """199,000 acks after one nack(delay=): the old code wrote 863 KB of group state
    at the last commit (every acked seq, each commit), 78 MB over the run."""
    _b, gc, sizes = _pinned("nack")
    assert gc.compute_floor() == 1  # the delayed one still pins it
    assert sizes[-1] < 10_000, sizes[-1]
    assert sum(sizes) < 5_000_000
    assert _held(gc) <= group_mod.FOLD_ACKED + 2
    assert gc.is_acked(2) and gc.is_acked(199_001) and not gc.is_acked(1)


def test_acks_after_a_publish_delayed_message_take_bounded_state() -> None:
    _b, gc, sizes = _pinned("sched")
    assert gc.compute_floor() == 1
    assert sizes[-1] < 10_000, sizes[-1]
    assert _held(gc) <= group_mod.FOLD_ACKED + 2


def test_acks_after_a_held_lease_take_bounded_state() -> None:
    _b, gc, sizes = _pinned("lease", n=50_000)
    assert gc.compute_floor() == 1 and 1 in gc.pending
    assert sizes[-1] < 10_000, sizes[-1]
    assert _held(gc) <= group_mod.FOLD_ACKED + 2


def test_the_floor_jumps_over_the_runs_once_the_delayed_one_is_acked() -> None:
    b, gc, _ = _pinned("nack", n=20_000)
    assert gc.acked_runs.run_count() == 1
    now = 1000.0 + 1e6
    b.tick(now)
    out, _ = b.pump(now)
    (items,) = out.values()
    assert [d.seq for d in items] == [1]
    (sub,) = out
    b.ack(sub.session, [items[0].tag], now)
    b.on_committed(b.take_writes(), now)
    assert gc.floor == 20_002
    assert _held(gc) == 0


# ---------------------------------------------------------------- restore
def _restored(blob: bytes, floor: int = 1, n: int = 5_000) -> tuple[Broker, GroupChannel]:
    b = Broker()
    now = 1000.0
    b.subscribe(Session("c"), 1, kind="consume", patterns=[CH], group="g", prefetch=n,
                now=now)
    b.publish([Send(CH, b"1") for _ in range(n)], now)
    b.on_committed(b.take_writes(), now)
    gc = b.state.groups["consume:g"].gcs[CH]
    gc.restore(floor, blob)
    return b, gc


def _delivered(b: Broker) -> list[int]:
    out, loads = b.pump(1000.0)
    assert not loads
    return sorted(d.seq for items in out.values() for d in items)


def test_a_state_written_by_the_old_version_restores() -> None:
    """The old blob: [acked (every seq), attempts, delayed]. 4,000 acked seqs (above
    FOLD_ACKED: folded into runs), seq 7 delayed."""
    acked = [s for s in range(1, 4_002) if s != 7]
    blob = msgspec.msgpack.encode([acked, {7: 1}, [(2000.0, 7)]])
    b, gc = _restored(blob)
    assert list(gc.acked_runs.runs()) == [(1, 7), (8, 4_002)]
    assert not gc.acked
    assert _delivered(b) == list(range(4_002, 5_001))  # 7 waits for its time
    floor, state = gc.durable_state()
    assert floor == 7
    # Written back as ranges
    acked_list, attempts, delayed, acked_runs = msgspec.msgpack.decode(state)
    assert (acked_list, attempts[7], delayed, acked_runs) == ([], 1, [[2000.0, 7]], [[8, 4_002]])


def test_a_small_old_state_restores_as_a_set() -> None:
    blob = msgspec.msgpack.encode([[3, 5], {}, []])
    b, gc = _restored(blob, n=6)
    assert gc.acked == {3, 5} and not gc.acked_runs
    assert _delivered(b) == [1, 2, 4, 6]


def test_a_state_with_runs_restores() -> None:
    _b0, gc0, _ = _pinned("nack", n=10_000)
    floor, blob = gc0.durable_state()
    b, gc = _restored(blob, floor=floor, n=10_001)
    assert {*gc.acked, *gc.acked_runs} == {*gc0.acked, *gc0.acked_runs}
    assert _delivered(b) == []  # 1 is delayed, everything else acked
    assert gc.durable_state() == (floor, blob)


def test_a_restart_redelivers_nothing_acked_and_the_delayed_one_later() -> None:
    """Through the engine and a storage: 3,000 acks after a nack(delay=60), a crash, a
    restore from what was committed."""
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=500)
    for _ in range(6):
        h.publish(*(Send(CH, b"1") for _ in range(500)))
    first = h.take(sub)
    h.nack(s, first[:1], delay=60.0)
    h.ack(s, first[1:])
    while got := h.take(sub):
        h.ack(s, got)
    h.commit()
    gc = h.broker.state.groups["consume:g"].gcs[CH]
    assert gc.floor == 1 and gc.acked_runs.run_count() == 1
    st = h.storage
    h2 = Harness(storage=st, now=h.now + 1.0, broker=Broker())
    h2.broker.restore(st.open(h2.now), h2.now)
    s2 = Session("c2")
    sub2 = h2.subscribe(s2, patterns=CH, group="g", prefetch=500)
    assert h2.take(sub2) == []
    h2.tick(60.0)
    again = h2.take(sub2)
    assert seqs(again) == [1]
    h2.ack(s2, again)
    h2.commit()
    gc2 = h2.broker.state.groups["consume:g"].gcs[CH]
    assert gc2.floor == 3_001 and _held(gc2) == 0


# ------------------------------------------------------ against a plain set
_OPS = st.lists(st.one_of(
    st.tuples(st.just("ack"), st.integers(0, 300)),
    st.tuples(st.just("ack_run"), st.integers(0, 300), st.integers(1, 40)),
    st.tuples(st.just("fold")),
    st.tuples(st.just("floor"), st.integers(0, 60)),
    st.tuples(st.just("restart")),
), max_size=60)


def _one_message_group() -> Any:
    """The group channel of a consumer group "g" of one member reading CH, which holds
    one committed message."""
    b = Broker()
    b.subscribe(Session("c"), 1, kind="consume", patterns=[CH], group="g", prefetch=1,
                now=1.0)
    b.publish([Send(CH, b"1")], 1.0)
    b.on_committed(b.take_writes(), 1.0)
    return b.state.groups["consume:g"].gcs[CH]


@settings(max_examples=300, deadline=None)
@given(ops=_OPS, fold=st.sampled_from([0, 3, 1024]))
def test_acked_seqs_behave_as_a_set(ops: list[Any], fold: int) -> None:
    """A group's acks (set + runs) against a plain set, through acks, folds, floor
    moves and an encode/decode round trip (``durable_state`` / ``restore``)."""
    with fold_at(fold):
        gc = _one_message_group()
        gc.restore(1, b"")
        model: set[int] = set()
        floor = 1
        for op in ops:
            if op[0] == "ack" and op[1] >= floor:
                gc.settle(op[1])
                model.add(op[1])
            elif op[0] == "ack_run":
                for s in range(max(op[1], floor), op[1] + op[2]):
                    gc.settle(s)
                    model.add(s)
            elif op[0] == "fold":
                gc.compute_floor()  # the cursor is at the floor: it stays
                assert gc.floor == floor
            elif op[0] == "floor":
                floor += op[1]
                gc.advance(floor)
                model = {s for s in model if s >= floor}
            else:
                f, blob = gc.durable_state()
                assert f == floor
                gc.restore(f, blob)
            for s in range(floor, 400):
                assert gc.is_acked(s) == (s in model), s
            assert {*gc.acked, *gc.acked_runs} == model
            assert len(gc.acked_runs) == len(set(gc.acked_runs))


def test_waiting_counts_with_the_acks_in_runs() -> None:
    """The ``waiting`` property of test_group_channel with every ack folded at once."""
    with fold_at(0):
        test_group_channel.test_waiting_counts_stored_messages_neither_out_nor_settled()


def test_a_group_channel_without_runs_shares_an_empty_one() -> None:
    """Most group channels never fold: they hold no runs object of their own, and one
    whose runs all fall below the floor gives its own back."""
    _b, gc, _ = _pinned("nack", n=3_000)
    assert gc.acked_runs.run_count() == 1
    fresh = _one_message_group()
    assert fresh.acked_runs is group_mod._NO_RUNS
    gc.advance(5_000)
    assert gc.acked_runs is group_mod._NO_RUNS and gc.runs_hi == 0
    assert not group_mod._NO_RUNS


def test_scattered_acks_are_stored_no_larger_than_a_list_of_seqs() -> None:
    """Acks out of order (every other seq: a gap each) make runs of one seq: stored as
    seqs, not as ranges of two ints."""
    _b, gc = _restored(b"", n=10)
    for seq in range(2, 20_002, 2):
        gc.settle(seq)
    gc.compute_floor()
    assert gc.acked_runs.run_count() == 10_000  # folded: 10,000 > FOLD_ACKED
    _floor, blob = gc.durable_state()
    as_list = msgspec.msgpack.encode([list(range(2, 20_002, 2)), {}, [], []])
    assert len(blob) <= len(as_list)
    gc.restore(1, blob)
    assert {*gc.acked, *gc.acked_runs} == set(range(2, 20_002, 2))


@pytest.mark.parametrize("fold", [0, 1024])
def test_waiting_skips_acks_in_runs_and_counts_an_acked_then_expired_one_once(
        fold: int) -> None:
    """Group stats' waiting (and the oldest waiting seq) are the same whether the acks
    above a pinned floor are held one by one or folded into runs: a returned message
    below the top of the runs waits, an acked one does not, and an acked message that
    then expired is taken away once."""
    with fold_at(fold):
        h = Harness()
        s = Session("c")
        sub = h.subscribe(s, patterns=CH, group="g", prefetch=4)
        h.publish_values(CH, list(range(8)))
        got = h.take(sub)
        assert seqs(got) == [1, 2, 3, 4]
        h.ack(s, [got[1], got[3]])  # 2 and 4; 1 stays out and pins the floor
        h.nack(s, [got[2]])  # 3 waits again
        assert h.broker.expire([(CH, 4)], h.now)
        gc = h.broker.state.groups["consume:g"].gcs[CH]
        assert gc.waiting() == (5, 3)  # 3, 5, 6, 7, 8
        assert bool(gc.runs_hi) == (fold == 0)
        h.ack(s, [got[0]])
        assert gc.waiting() == (5, 3)
        assert seqs(h.take(sub)) == [3, 5, 6, 7]
        assert gc.waiting() == (1, 8)
