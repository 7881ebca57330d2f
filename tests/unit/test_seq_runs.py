"""``SeqRuns`` (core/seq_runs.py), a set of ints as sorted disjoint runs (a channel's
deleted seqs, a group's folded acks), against a plain Python set: every operation, the
batch merges included, answers as the set does, and the runs stay sorted, disjoint and
apart."""

from __future__ import annotations

import random
from itertools import pairwise, product
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.seq_runs import SeqRuns, runs_of

TOP = 120
SEQ = st.integers(0, TOP)
# Runs ordered by start, as add_runs takes them: empty, touching and overlapping ones too
RUNS = st.lists(st.tuples(SEQ, st.integers(-2, 15)), max_size=12).map(
    lambda rs: [(a, a + n) for a, n in sorted(rs)])
# Seqs in any order with repeats, or a contiguous stretch shuffled (add_seqs' fast path)
BATCH = st.one_of(
    st.lists(SEQ, max_size=40),
    st.tuples(SEQ, st.integers(1, 30), st.randoms(use_true_random=False)).map(
        lambda t: t[2].sample(range(t[0], t[0] + t[1]), t[1])),
)
OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["add", "discard", "drop_below", "drop_from", "skip",
                               "contains"]), SEQ),
    st.tuples(st.just("add_run"), SEQ, st.integers(-1, 12)),
    st.tuples(st.just("count_between"), SEQ, SEQ),
    st.tuples(st.just("add_seqs"), BATCH),
    st.tuples(st.just("add_runs"), RUNS),
), max_size=60)


def check(runs: SeqRuns, model: set[int]) -> None:
    """Everything ``runs`` answers without changing is what ``model`` answers."""
    assert list(runs) == sorted(model)
    assert len(runs) == runs.n == len(model) and bool(runs) == bool(model)
    assert runs.top == (max(model) + 1 if model else 0)
    spans = list(runs.runs())  # non-empty, ascending, apart (a gap between two)
    assert all(a < b for a, b in spans)
    assert all(b < c for (_, b), (c, _) in pairwise(spans))
    assert runs.run_count() == len(spans)
    assert runs == model and runs == sorted(model) and runs == tuple(sorted(model))


@settings(max_examples=200, deadline=None)
@given(start=st.lists(SEQ, max_size=40), ops=OPS)
def test_seq_runs_answer_as_a_plain_set(start: list[int], ops: list[Any]) -> None:
    runs, model = SeqRuns(start), set(start)
    check(runs, model)
    one_by_one = SeqRuns()
    for seq in start:
        one_by_one.add(seq)
    check(one_by_one, model)
    for op, arg, *more in ops:
        if op == "add":
            runs.add(arg)
            model.add(arg)
        elif op == "add_run":
            runs.add_run(arg, arg + more[0])
            model.update(range(arg, arg + more[0]))
        elif op == "add_seqs":
            runs.add_seqs(arg)
            model.update(arg)
        elif op == "add_runs":
            runs.add_runs(arg)
            for a, b in arg:
                model.update(range(a, b))
        elif op == "discard":
            runs.discard(arg)
            model.discard(arg)
        elif op == "drop_below":
            assert runs.drop_below(arg) == len({s for s in model if s < arg})
            model = {s for s in model if s >= arg}
        elif op == "drop_from":
            assert runs.drop_from(arg) == len({s for s in model if s >= arg})
            model = {s for s in model if s < arg}
        elif op == "skip":
            past = arg
            while past in model:
                past += 1
            assert runs.skip(arg) == past
        elif op == "count_between":
            assert runs.count_between(arg, more[0]) == \
                len([s for s in model if arg <= s < more[0]])
        else:
            assert (arg in runs) == (arg in model)
        check(runs, model)
    for s in range(-1, TOP + 40):  # past the highest seq an op can add (TOP + 30)
        assert (s in runs) == (s in model), s
    assert runs.count_between(-1, TOP + 40) == len(model)
    for seq in start:  # the ends, the middle and the whole of runs
        runs.discard(seq)
        model.discard(seq)
        check(runs, model)
    assert SeqRuns.from_sorted(sorted(list(model) * 2)) == SeqRuns(model) == runs  # repeats
    assert SeqRuns.from_runs(runs.runs()) == runs
    assert eval(repr(runs), {"SeqRuns": SeqRuns}) == runs


@settings(max_examples=100, deadline=None)
@given(spans=RUNS, more=RUNS)
def test_runs_read_back_merge_their_touching_and_overlapping_ones(spans, more) -> None:
    """``from_runs`` (storage's removed rows, a group state's ranges) and ``add_runs``
    (a batch merged into what is there) hold what the ranges cover."""
    model = {s for a, b in spans for s in range(a, b)}
    runs = SeqRuns.from_runs(spans)
    check(runs, model)
    runs.add_runs(more)
    check(runs, model | {s for a, b in more for s in range(a, b)})


@settings(max_examples=100, deadline=None)
@given(seqs=st.sets(st.integers(0, 300)))
def test_runs_of_sorted_seqs_are_their_maximal_stretches(seqs: set[int]) -> None:
    expected = list(SeqRuns.from_sorted(sorted(seqs)).runs())
    assert runs_of(sorted(seqs)) == expected


def test_runs_of_contiguous_and_scattered() -> None:
    assert runs_of([]) == []
    assert runs_of([5]) == [(5, 6)]
    assert runs_of(list(range(10, 1_000_000))) == [(10, 1_000_000)]
    assert runs_of([1, 2, 3, 7, 9, 10]) == [(1, 4), (7, 8), (9, 11)]


def test_merging_below_between_and_above() -> None:
    runs = SeqRuns.from_runs([(10, 20), (30, 40)])
    runs.add_runs([(45, 50)])
    runs.add_runs([(20, 30)])  # fills the gap: one run
    runs.add_runs([(0, 5), (8, 10)])
    assert list(runs.runs()) == [(0, 5), (8, 40), (45, 50)]
    assert (runs.top, len(runs), runs.run_count()) == (50, 42, 3)
    runs.add_seqs({60, 61, 62, 70, 5})  # scattered: one merge of their runs
    assert list(runs.runs()) == [(0, 6), (8, 40), (45, 50), (60, 63), (70, 71)]
    assert runs.drop_below(9) == 7
    assert list(runs.runs()) == [(9, 40), (45, 50), (60, 63), (70, 71)]
    runs.drop_below(71)
    assert (list(runs.runs()), runs.top, bool(runs)) == ([], 0, False)


def test_forgetting_the_oldest_runs_compacts_them_away_and_answers_the_same() -> None:
    """Runs forgotten by ``drop_below`` stay in the arrays until they are half of
    them (forgetting costs what it forgets); every answer ignores them."""
    runs, model = SeqRuns(range(0, 2000, 2)), set(range(0, 2000, 2))
    for below in range(0, 2100, 37):
        runs.add(below + 1)
        model.add(below + 1)
        assert runs.drop_below(below) == len([s for s in model if s < below])
        model = {s for s in model if s >= below}
        check(runs, model)
        assert all((s in runs) == (s in model) for s in range(below - 5, below + 80))
        assert runs.count_between(0, 3000) == len(model)
        assert runs.skip(below) == min(set(range(below, 3000)) - model)
    assert runs.nbytes() < 1024  # compacted: the arrays shrank with it


def test_batches_merged_around_forgotten_runs_answer_the_same() -> None:
    """Batches (``add_seqs``, ``add_runs``) that reach below the floor, into runs
    forgotten but not compacted away yet, and across compactions."""
    rng = random.Random(7)
    runs, model = SeqRuns(range(0, 3000, 2)), set(range(0, 3000, 2))
    for below in range(0, 3100, 23):
        batch = rng.sample(range(below - 40, below + 200), 12)
        runs.add_seqs(batch)
        model.update(batch)
        runs.add_runs([(below - 30, below - 28), (below + 3, below + 5)])
        model.update([below - 30, below - 29, below + 3, below + 4])
        assert runs.drop_below(below) == len([s for s in model if s < below])
        model = {s for s in model if s >= below}
        check(runs, model)
        assert all((s in runs) == (s in model) for s in range(below - 5, below + 80))
        assert runs.skip(below) == min(set(range(below, 3500)) - model)


def _below_forgotten_runs() -> tuple[SeqRuns, set[int]]:
    """Runs added back below a floor, under forgotten runs not compacted away yet whose
    bounds are all above them: a lookup that bisected the whole arrays, not only what
    is kept, would be led astray by them."""
    runs = SeqRuns.from_runs([(100 + 10 * i, 105 + 10 * i) for i in range(30)])
    runs.drop_below(390)  # 29 runs forgotten, fewer than compaction waits for
    runs.add_run(10, 20)
    runs.add(30)
    runs.add_runs([(40, 50), (60, 61)])
    return runs, {*range(10, 20), 30, *range(40, 50), 60, *range(390, 395)}


def test_runs_added_below_forgotten_ones_answer_as_a_set() -> None:
    runs, model = _below_forgotten_runs()
    check(runs, model)
    for s in range(0, 400):
        assert (s in runs) == (s in model), s
        past = s
        while past in model:
            past += 1
        assert runs.skip(s) == past, s
    for a, b in [(0, 400), (12, 45), (15, 16), (30, 31), (45, 392), (0, 10), (50, 60)]:
        assert runs.count_between(a, b) == len([s for s in model if a <= s < b]), (a, b)
    changes: list[tuple[str, tuple[int, ...], set[int]]] = [
        ("add_run", (15, 35), set(range(15, 35))), ("add_run", (0, 45), set(range(45))),
        ("add_run", (5, 400), set(range(5, 400))), ("add_run", (20, 30), set(range(20, 30))),
        ("add", (20,), {20}), ("add", (29,), {29}), ("add", (55,), {55}),
        ("add_runs", ([(0, 12), (25, 42)],), {*range(12), *range(25, 42)}),
    ]
    for op, args, added in changes:
        runs, model = _below_forgotten_runs()
        getattr(runs, op)(*args)
        check(runs, model | added)
    for seq in (10, 15, 19, 30, 40, 49, 60, 390, 394, 100, 5):
        runs, model = _below_forgotten_runs()
        runs.discard(seq)
        check(runs, model - {seq})
    for seq in (0, 10, 15, 30, 31, 45, 392, 400):
        runs, model = _below_forgotten_runs()
        assert runs.drop_from(seq) == len([s for s in model if s >= seq])
        check(runs, {s for s in model if s < seq})
    for seq in (0, 10, 15, 20, 35, 45, 61, 392, 400):
        runs, model = _below_forgotten_runs()
        assert runs.drop_below(seq) == len([s for s in model if s < seq])
        check(runs, {s for s in model if s >= seq})


def test_forgetting_every_run_frees_the_arrays() -> None:
    """Whether some runs were forgotten before or not, and however many."""
    empty = SeqRuns().nbytes()
    for top, first_below, forget in product((40, 4000), (0, 10), ("drop_below", "drop_from",
                                                                   "discard")):
        runs = SeqRuns(range(0, top, 2))
        assert runs.nbytes() >= empty + 16 * runs.run_count()
        runs.drop_below(first_below)  # forgotten runs kept until compacted
        held = len(runs)
        if forget == "drop_below":
            assert runs.drop_below(top) == held
        elif forget == "drop_from":
            assert runs.drop_from(first_below) == held
        else:
            for seq in range(first_below, top, 2):
                runs.discard(seq)
        assert (len(runs), runs.run_count()) == (0, 0)
        # (an array keeps its room when it shrinks by less than 16 items: one by one,
        # ``discard`` frees none of it; nothing but tests calls it)
        if forget != "discard":
            assert runs.nbytes() <= empty + (512 if first_below else 0), forget
        runs.add(7)  # and it starts again from nothing
        assert list(runs.runs()) == [(7, 8)]


def test_an_empty_one_answers_as_an_empty_set() -> None:
    runs = SeqRuns()
    assert (len(runs), bool(runs), list(runs), list(runs.runs())) == (0, False, [], [])
    assert (5 in runs, runs.skip(5), runs.count_between(0, 10), runs.top) == (False, 5, 0, 0)
    assert (runs.drop_below(5), runs.drop_from(5), runs.run_count()) == (0, 0, 0)
    runs.discard(5)
    runs.add_seqs([])
    runs.add_runs([(3, 3), (4, 2)])
    assert runs == set() and runs == SeqRuns.from_sorted([]) == SeqRuns.from_runs([])


def test_a_batch_with_repeats_adds_each_seq_once() -> None:
    runs = SeqRuns()
    runs.add_seqs([5, 5, 7])  # as many as a contiguous 5..7, which it is not
    assert list(runs.runs()) == [(5, 6), (7, 8)]
    runs.add_seqs(iter([9, 8, 8]))
    assert list(runs.runs()) == [(5, 6), (7, 10)]
    assert SeqRuns([3, 1, 1]) == {1, 3}


def test_equal_only_to_the_same_seqs() -> None:
    runs = SeqRuns.from_runs([(1, 3), (5, 6)])
    assert runs == SeqRuns([5, 1, 2]) and runs == {1, 2, 5} and runs == [1, 2, 5]
    assert runs == (1, 2, 5) and runs == frozenset({1, 2, 5})
    for other in (SeqRuns([1, 2, 6]), SeqRuns([1, 2]), {1, 2, 6}, {1, 2}, [1, 2, 6], [1, 2],
                  [5, 2, 1], (1, 2, 5, 6), SeqRuns()):
        assert runs != other and not runs == other, other  # noqa: SIM201
    assert (runs == 5) is False and (runs == "1-3") is False
