"""``SeqRuns`` (core/seq_runs.py), a set of ints as sorted disjoint runs (a channel's
deleted seqs, a group's folded acks), against a plain Python set: every operation, the
batch merges included, answers as the set does, and the runs stay sorted, disjoint and
apart."""

from __future__ import annotations

import random
from itertools import pairwise
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
    assert runs.end() == (max(model) + 1 if model else 0)
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
    for s in range(-1, TOP + 20):
        assert (s in runs) == (s in model), s
    assert runs.count_between(-1, TOP + 20) == len(model)
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
    assert (runs.end(), len(runs), runs.run_count()) == (50, 42, 3)
    runs.add_seqs({60, 61, 62, 70, 5})  # scattered: one merge of their runs
    assert list(runs.runs()) == [(0, 6), (8, 40), (45, 50), (60, 63), (70, 71)]
    assert runs.drop_below(9) == 7
    assert list(runs.runs()) == [(9, 40), (45, 50), (60, 63), (70, 71)]
    runs.drop_below(71)
    assert (list(runs.runs()), runs.end(), bool(runs)) == ([], 0, False)


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
