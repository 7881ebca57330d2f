"""``SeqRuns`` (core/seq_runs.py) alone: what its lookups and batch merges cost, in
nanoseconds of this thread's CPU time per call (the best of 7 passes, then the median
of ``--runs``).

``contains in``     a seq inside the runs' span (1,000 runs of 5 with gaps of 5): half
                    in a run, half in a gap (a group's ``seq in acked_runs`` below
                    ``runs_hi``; a channel's ``seq in gone``)
``contains above``  a seq above every run (``ChannelLog.lookup`` of a new message)
``skip``            past the run a seq is in
``fold contiguous`` ``add_seqs`` of 1,025 consecutive acks (a group's fold), per fold
``fold scattered``  ``add_seqs`` of 1,025 acks, every other seq (acks out of order)

Before helper-37 merged them, a channel's deleted seqs were ``Gone`` (core/gone.py)
and a group's acks ``SeqRuns`` with another API: run against such a tree, both are
measured, the lookups as ``log`` (Gone) and ``group`` (the old SeqRuns).

Usage:  .venv/bin/python bench/seq_runs_ops.py [--runs 5]
        (PYTHONPATH=<other checkout>/src to measure another version)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from minou.core import seq_runs

SPANS = [(i * 10, i * 10 + 5) for i in range(1000)]
INSIDE = list(range(0, 10_000, 7))
ABOVE = list(range(20_000, 21_429))


def _structures() -> dict[str, Callable[[], Any]]:
    """name -> a factory of the structure built from SPANS."""
    cls: Any = seq_runs.SeqRuns
    if hasattr(cls, "from_runs"):
        return {"": lambda: cls.from_runs(SPANS)}
    from minou.core.gone import Gone  # type: ignore[import-not-found]  (before helper-37)

    return {"log ": lambda: Gone.from_runs(SPANS), "group ": lambda: cls(SPANS)}


def per_call(fn: Callable[[], None], calls: int) -> float:
    best = float("inf")
    for _ in range(7):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / calls * 1e9


def lookups(runs: Any, seqs: list[int], op: str) -> Callable[[], None]:
    if op == "skip":
        skip = getattr(runs, "skip", None) or runs.end_of

        def go() -> None:
            for _ in range(20):
                for s in seqs:
                    skip(s)
    else:
        def go() -> None:
            for _ in range(20):
                for s in seqs:
                    s in runs  # noqa: B015
    return go


def fold(batches: list[set[int]]) -> Callable[[], None]:
    def go() -> None:
        runs = seq_runs.SeqRuns()
        for b in batches:
            runs.add_seqs(b)
    return go


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    contiguous = [set(range(i, i + 1025)) for i in range(0, 1025 * 200, 1025)]
    scattered = [set(range(i, i + 2050, 2)) for i in range(0, 2050 * 200, 2050)]
    cases: list[tuple[str, Callable[[], None], int]] = []
    for prefix, make in _structures().items():
        runs = make()
        cases += [(f"{prefix}contains in", lookups(runs, INSIDE, "in"), 20 * len(INSIDE)),
                  (f"{prefix}contains above", lookups(runs, ABOVE, "in"), 20 * len(ABOVE)),
                  (f"{prefix}skip", lookups(runs, INSIDE, "skip"), 20 * len(INSIDE))]
    cases += [("fold contiguous", fold(contiguous), 200),
              ("fold scattered", fold(scattered), 200)]
    for name, fn, calls in cases:
        times = [per_call(fn, calls) for _ in range(args.runs)]
        unit = "µs" if name.startswith("fold") else "ns"
        scale = 1e-3 if unit == "µs" else 1
        print(f"{name:22} median {statistics.median(times) * scale:8.1f} {unit} "
              f"(best {min(times) * scale:.1f})")


if __name__ == "__main__":
    main()
