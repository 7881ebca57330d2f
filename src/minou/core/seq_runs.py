"""Sets of seqs kept as runs: sorted, disjoint half-open ranges ``[lo, hi)``.

A group's acks above its floor (core/group.py) come in long runs: one message that
waits (a delayed retry, a publish-time delay, a held lease) keeps the floor below it,
and every message acked after it is one more seq in the same run. As a set that is
~70 B of memory and ~5 B of every commit's group state per ack, for as long as the
message waits (up to years); as runs it is two ints per gap, whatever the acks.

The bounds live in two ``array('q')`` (16 B a run); lookups bisect them.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable


def runs_of(seqs: list[int]) -> list[tuple[int, int]]:
    """The runs of ``seqs`` (sorted, no duplicates), in order.

    A contiguous stretch shows itself by its ends (last - first == count - 1): halving
    until that holds costs a few steps per run instead of one per seq, and acks mostly
    come in long contiguous stretches."""
    out: list[tuple[int, int]] = []
    todo = [(0, len(seqs))] if seqs else []
    while todo:
        i, j = todo.pop()
        if seqs[j - 1] - seqs[i] == j - 1 - i:
            lo, hi = seqs[i], seqs[j - 1] + 1
            if out and out[-1][0] == hi:  # todo runs backwards: prepend, merged
                out[-1] = (lo, out[-1][1])
            else:
                out.append((lo, hi))
            continue
        mid = (i + j) // 2
        todo.append((i, mid))  # popped second: the right half first, the output reversed
        todo.append((mid, j))
    out.reverse()
    return out


class SeqRuns:
    """A set of ints as sorted disjoint ranges. ``hi`` is one past the largest (0 when
    empty): callers check ``seq < runs.hi`` before a lookup, an int compare on paths
    where the seq is most often above every run."""

    __slots__ = ("_his", "_los", "hi")

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._los = array("q")
        self._his = array("q")
        self.hi = 0
        self.add_ranges(sorted((int(lo), int(hi)) for lo, hi in ranges if lo < hi))

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self._los, seq) - 1
        return i >= 0 and seq < self._his[i]

    def __bool__(self) -> bool:
        return bool(self._los)

    def __repr__(self) -> str:
        return f"SeqRuns({self.ranges()!r})"

    def count_runs(self) -> int:
        return len(self._los)

    def count(self, lo: int = 0, hi: int | None = None) -> int:
        """How many seqs of ``[lo, hi)`` are in it (seqs are never negative)."""
        los, his = self._los, self._his
        hi = self.hi if hi is None else hi
        n = 0
        for i in range(bisect_right(his, lo), len(los)):
            a = los[i]
            if a >= hi:
                break
            n += min(his[i], hi) - max(a, lo)
        return n

    def end_of(self, seq: int) -> int:
        """The first seq from ``seq`` on that is not in it."""
        i = bisect_right(self._los, seq) - 1
        return self._his[i] if i >= 0 and seq < self._his[i] else seq

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._los, self._his, strict=True))

    def __iter__(self):  # type: ignore[no-untyped-def]
        for lo, hi in zip(self._los, self._his, strict=True):
            yield from range(lo, hi)

    def add_seqs(self, seqs: Iterable[int]) -> None:
        """Add the seqs of an unordered collection (a set: its duplicates gone)."""
        seqs = seqs if isinstance(seqs, (set, frozenset)) else set(seqs)
        if not seqs:
            return
        lo, hi = min(seqs), max(seqs)
        if hi - lo + 1 == len(seqs):  # contiguous, the common case: no sort
            self.add_ranges([(lo, hi + 1)])
        else:
            self.add_ranges(runs_of(sorted(seqs)))

    def add_ranges(self, new: list[tuple[int, int]]) -> None:
        """Merge in ``new``: sorted disjoint non-empty ranges. Only the runs from the
        first one ``new`` touches on are rewritten: acks mostly come above the rest."""
        if not new:
            return
        los, his = self._los, self._his
        k = bisect_left(his, new[0][0])  # the first run that ends at or after new's start
        out_lo: list[int] = []
        out_hi: list[int] = []
        old = zip(los[k:], his[k:], strict=True)
        nxt = next(old, None)
        for lo, hi in new:
            while nxt is not None and nxt[0] <= lo:
                _push(out_lo, out_hi, *nxt)
                nxt = next(old, None)
            _push(out_lo, out_hi, lo, hi)
        while nxt is not None:
            _push(out_lo, out_hi, *nxt)
            nxt = next(old, None)
        los[k:] = array("q", out_lo)
        his[k:] = array("q", out_hi)
        self.hi = his[-1]

    def drop_below(self, floor: int) -> None:
        """Forget every seq below ``floor``."""
        los, his = self._los, self._his
        k = bisect_right(his, floor)  # runs ending at or below floor are all below it
        if k:
            del los[:k]
            del his[:k]
        if los and los[0] < floor:
            los[0] = floor
        self.hi = his[-1] if his else 0


def _push(los: list[int], his: list[int], lo: int, hi: int) -> None:
    # Ranges come by start: one that starts at or before the last end extends it.
    if los and lo <= his[-1]:
        if hi > his[-1]:
            his[-1] = hi
    else:
        los.append(lo)
        his.append(hi)
