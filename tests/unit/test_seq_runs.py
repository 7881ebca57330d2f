"""``SeqRuns`` (core/seq_runs.py), a set of ints as sorted disjoint ranges, against a
plain set."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.seq_runs import SeqRuns, runs_of


@settings(max_examples=300, deadline=None)
@given(batches=st.lists(st.sets(st.integers(0, 200)), max_size=8), floor=st.integers(0, 220))
def test_seq_runs_against_a_set(batches: list[set[int]], floor: int) -> None:
    runs = SeqRuns()
    model: set[int] = set()
    for batch in batches:
        runs.add_seqs(batch)
        model |= batch
        assert runs_of(sorted(batch)) == SeqRuns((s, s + 1) for s in batch).ranges()
    assert set(runs) == model
    assert SeqRuns(runs.ranges()).ranges() == runs.ranges()
    for lo in (0, 50, 150):
        for hi in (60, 201, 250):
            assert runs.count(lo, hi) == sum(1 for s in model if lo <= s < hi)
    for s in range(-1, 202):
        assert (s in runs) == (s in model)
        end = runs.end_of(s)
        assert all(x in model for x in range(s, end)) and end not in model
    assert runs.hi == (max(model) + 1 if model else 0)
    runs.drop_below(floor)
    assert set(runs) == {s for s in model if s >= floor}
    assert runs.hi == (max(runs) + 1 if runs else 0)


def test_runs_of_contiguous_and_scattered() -> None:
    assert runs_of([]) == []
    assert runs_of([5]) == [(5, 6)]
    assert runs_of(list(range(10, 1_000_000))) == [(10, 1_000_000)]
    assert runs_of([1, 2, 3, 7, 9, 10]) == [(1, 4), (7, 8), (9, 11)]


def test_merging_below_between_and_above() -> None:
    runs = SeqRuns([(10, 20), (30, 40)])
    runs.add_ranges([(45, 50)])
    runs.add_ranges([(20, 30)])  # fills the gap: one run
    runs.add_ranges([(0, 5), (8, 10)])
    assert runs.ranges() == [(0, 5), (8, 40), (45, 50)]
    assert (runs.hi, runs.count(), runs.count_runs()) == (50, 42, 3)
    runs.drop_below(9)
    assert runs.ranges() == [(9, 40), (45, 50)]
    runs.drop_below(50)
    assert (runs.ranges(), runs.hi, bool(runs)) == ([], 0, False)
