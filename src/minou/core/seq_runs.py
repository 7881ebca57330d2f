"""A set of ints kept as sorted disjoint runs ``[lo, hi)``: two arrays of 64-bit ints,
16 bytes a run (``SeqRuns``). Its two users hold seqs that come in long runs, which as
a set cost ~70-80 bytes each for as long as they were held:

- A channel's deleted seqs above its first (``ChannelLog.gone``). Deletions come in
  runs (a key-value bucket's older revisions of a hot key, expiry of consecutive
  messages), and ``first_seq`` only moves past a seq once every seq below it is gone,
  so one old live message pins it and every later deletion stays here: a bucket with
  one cold key and one key updated 10 million times held 2 live revisions and ~800 MB
  as a set (with a heap beside it), one run as runs. Between two runs there is a seq
  that is not deleted (a live one, or one not committed yet), so the runs are never
  more than the live messages + 1: the memory is bounded by what the channel holds,
  whatever was deleted (a bitmap over ``[first_seq, end)`` is not: it grows by a bit
  per seq under a pinned ``first_seq``).
- A consumer group's acks above its floor, past ``FOLD_ACKED`` single ones
  (``GroupChannel.acked_runs``, core/group.py). One message that waits (a delayed
  retry, a publish-time delay, a held lease) keeps the floor below it, and every
  message acked after it is one more seq in the same run: ~70 B of memory and ~5 B of
  every commit's group state per ack as a set, two ints per gap as runs. Acks are
  folded in by the thousand (``add_seqs``): one merge of sorted runs, not an insert
  per seq.

The runs before ``_k`` were forgotten (``drop_below``) and are compacted away once
they are half the arrays: forgetting the oldest runs costs what it forgets, not a move
of every run kept.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence


def runs_of(seqs: Sequence[int]) -> list[tuple[int, int]]:
    """The runs of ``seqs`` (sorted, no repeats), in order.

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
    """A set of ints as sorted disjoint runs. ``n`` (the number of seqs) and ``top``
    (one past the largest, 0 when empty) are plain attributes: the hot paths test them
    without a Python call (``ChannelLog.lookup`` whether anything is deleted,
    ``GroupChannel`` whether a seq is above every acked run, in ``runs_hi``), and a
    lookup above every run (a new message) is one compare."""

    __slots__ = ("_k", "hi", "lo", "n", "top")
    __hash__ = None  # type: ignore[assignment]  (mutable)

    def __init__(self, seqs: Iterable[int] = ()) -> None:
        """From seqs in any order, repeats allowed."""
        self.lo = array("q")  # run starts, ascending
        self.hi = array("q")  # run ends (exclusive): lo[i] < hi[i] < lo[i + 1]
        self.n = 0
        self.top = 0  # hi[-1], or 0 when empty
        self._k = 0  # runs below it are forgotten
        self.add_seqs(seqs)

    @classmethod
    def from_runs(cls, runs: Iterable[tuple[int, int]]) -> SeqRuns:
        """From runs ``(lo, hi)`` (exclusive hi) in ascending order, as storage reads
        them back; touching or overlapping ones are merged, empty ones skipped."""
        g = cls()
        lo, hi = g.lo, g.hi
        n = 0
        for a, b in runs:
            if b <= a:
                continue
            if hi and a <= hi[-1]:
                if b > hi[-1]:
                    n += b - hi[-1]
                    hi[-1] = b
                continue
            lo.append(a)
            hi.append(b)
            n += b - a
        g.n = n
        g.top = hi[-1] if n else 0
        return g

    @classmethod
    def from_sorted(cls, seqs: Iterable[int]) -> SeqRuns:
        """From seqs in ascending order (repeats allowed), streamed: a restart reads
        millions of removed rows into it without a set or a list of them."""
        g = cls()
        lo, hi = g.lo, g.hi
        a = b = n = 0
        for seq in seqs:
            if seq == b:
                b += 1
            elif seq >= b or not n:
                if n:
                    lo.append(a)
                    hi.append(b)
                a, b = seq, seq + 1
            else:
                continue  # a repeat
            n += 1
        if n:
            lo.append(a)
            hi.append(b)
        g.n, g.top = n, b
        return g

    # ------------------------------------------------------------ reading
    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n != 0

    def __contains__(self, seq: object) -> bool:
        if seq >= self.top:  # type: ignore[operator]
            return False
        k = self._k
        i = bisect_right(self.lo, seq, k)  # type: ignore[call-overload]
        return i > k and seq < self.hi[i - 1]  # type: ignore[operator]

    def __iter__(self) -> Iterator[int]:
        lo, hi = self.lo, self.hi
        for i in range(self._k, len(lo)):
            yield from range(lo[i], hi[i])

    def runs(self) -> Iterator[tuple[int, int]]:
        """The runs ``(lo, hi)``, ascending."""
        k = self._k
        return zip(self.lo[k:], self.hi[k:], strict=True)

    def run_count(self) -> int:
        return len(self.lo) - self._k

    def nbytes(self) -> int:
        """What its two arrays hold: their allocation, runs forgotten but not yet
        compacted away included (128 bytes empty, 16 more a run)."""
        return self.lo.__sizeof__() + self.hi.__sizeof__()

    def count_between(self, start: int, end: int) -> int:
        """How many seqs in ``[start, end)`` are here (C sums over the runs it spans)."""
        if not self.n or start >= end:
            return 0
        lo, hi = self.lo, self.hi
        i = bisect_right(hi, start, self._k)  # the first run ending after start
        j = bisect_left(lo, end, i)  # runs from j on start at or after end
        if i >= j:
            return 0
        total = sum(hi[i:j]) - sum(lo[i:j])
        if lo[i] < start:
            total -= start - lo[i]
        if hi[j - 1] > end:
            total -= hi[j - 1] - end
        return total

    def skip(self, seq: int) -> int:
        """The first seq at or after ``seq`` that is not here (past a run at once)."""
        if seq < self.top:
            k = self._k
            i = bisect_right(self.lo, seq, k)
            if i > k and seq < self.hi[i - 1]:
                return self.hi[i - 1]
        return seq

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SeqRuns):
            return self.n == other.n and list(self.runs()) == list(other.runs())
        if isinstance(other, (set, frozenset)):
            return self.n == len(other) and set(self) == other
        if isinstance(other, (list, tuple)):
            return self.n == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"SeqRuns.from_runs({list(self.runs())!r})"

    # ------------------------------------------------------------ changing
    def add(self, seq: int) -> None:
        lo, hi = self.lo, self.hi
        if not self.n or seq > self.top:  # past every run: the usual case
            lo.append(seq)
            hi.append(seq + 1)
            self.n += 1
            self.top = seq + 1
            return
        if seq == self.top:
            hi[-1] = seq + 1
            self.n += 1
            self.top = seq + 1
            return
        i = bisect_right(lo, seq, self._k)  # runs before i start at or below seq
        left = i > self._k and hi[i - 1] >= seq
        if left and hi[i - 1] > seq:
            return  # already here
        right = i < len(lo) and lo[i] == seq + 1
        if left and right:
            hi[i - 1] = hi[i]
            del lo[i], hi[i]
        elif left:
            hi[i - 1] = seq + 1
        elif right:
            lo[i] = seq
        else:
            lo.insert(i, seq)
            hi.insert(i, seq + 1)
        self.n += 1

    def add_run(self, start: int, end: int) -> None:
        """Add every seq of ``[start, end)``."""
        if start >= end:
            return
        lo, hi = self.lo, self.hi
        if not self.n or start > self.top:
            lo.append(start)
            hi.append(end)
            self.n += end - start
            self.top = end
            return
        i = bisect_left(hi, start, self._k)  # the first run reaching start (or touching)
        j = bisect_right(lo, end, i)  # runs before j start at or below end
        if i < j:
            covered = sum(hi[i:j]) - sum(lo[i:j])
            start, end = min(start, lo[i]), max(end, hi[j - 1])
        else:
            covered = 0
        lo[i:j] = array("q", (start,))
        hi[i:j] = array("q", (end,))
        self.n += end - start - covered
        self.top = hi[-1]

    def add_seqs(self, seqs: Iterable[int]) -> None:
        """Add seqs in any order, repeats allowed (a group's acked set, folded)."""
        seqs = seqs if isinstance(seqs, (set, frozenset)) else set(seqs)
        if not seqs:
            return
        first, last = min(seqs), max(seqs)
        if last - first + 1 == len(seqs):  # contiguous, the common case: no sort
            self.add_run(first, last + 1)
        else:
            self._merge(runs_of(sorted(seqs)))

    def add_runs(self, new: Iterable[tuple[int, int]]) -> None:
        """Add runs ``(lo, hi)`` ordered by ``lo`` (touching or overlapping ones merged,
        empty ones skipped) in one merge: only the runs from the first one ``new``
        reaches to the last one it reaches are rewritten, not one insert per run."""
        self._merge([(a, b) for a, b in new if a < b])

    def _merge(self, new: list[tuple[int, int]]) -> None:
        # ``new``: non-empty runs ordered by start
        if not new:
            return
        lo, hi = self.lo, self.hi
        k = i = bisect_left(hi, new[0][0], self._k)  # the first run reaching new's start
        end = len(lo)
        out_lo: list[int] = []
        out_hi: list[int] = []
        for a, b in new:
            while i < end and lo[i] <= a:
                _push(out_lo, out_hi, lo[i], hi[i])
                i += 1
            _push(out_lo, out_hi, a, b)
        while i < end and lo[i] <= out_hi[-1]:  # runs the last new one reaches
            _push(out_lo, out_hi, lo[i], hi[i])
            i += 1
        self.n += sum(out_hi) - sum(out_lo) - (sum(hi[k:i]) - sum(lo[k:i]))
        lo[k:i] = array("q", out_lo)
        hi[k:i] = array("q", out_hi)
        self.top = hi[-1]

    def discard(self, seq: int) -> None:
        if seq not in self:
            return
        lo, hi = self.lo, self.hi
        i = bisect_right(lo, seq, self._k) - 1
        a, b = lo[i], hi[i]
        if a == seq and b == seq + 1:
            del lo[i], hi[i]
        elif a == seq:
            lo[i] = seq + 1
        elif b == seq + 1:
            hi[i] = seq
        else:
            hi[i] = seq
            lo.insert(i + 1, seq + 1)
            hi.insert(i + 1, b)
        self.n -= 1
        if self.n:
            self.top = hi[-1]
        else:
            del lo[:], hi[:]
            self._k = self.top = 0

    def drop_below(self, seq: int) -> int:
        """Forget the seqs below ``seq``; return how many there were."""
        if not self.n:
            return 0
        lo, hi, k = self.lo, self.hi, self._k
        if lo[k] >= seq:
            return 0
        i = bisect_right(hi, seq, k)  # runs k..i end at or below seq: all forgotten
        dropped = sum(hi[k:i]) - sum(lo[k:i])
        if i < len(lo) and lo[i] < seq:
            dropped += seq - lo[i]
            lo[i] = seq
        self.n -= dropped
        if i >= len(lo):
            del lo[:], hi[:]
            i = self.top = 0
        elif i > 64 and i * 2 > len(lo):  # the forgotten half goes (amortized O(1))
            del lo[:i], hi[:i]
            i = 0
        self._k = i
        return dropped

    def drop_from(self, seq: int) -> int:
        """Forget the seqs at or above ``seq``; return how many there were."""
        if seq >= self.top:
            return 0
        dropped = self.count_between(seq, self.top)
        lo, hi = self.lo, self.hi
        j = bisect_left(lo, seq, self._k)  # runs from j on start at or after seq
        del lo[j:], hi[j:]
        if len(lo) > self._k and hi[-1] > seq:
            hi[-1] = seq
        self.n -= dropped
        if self.n:
            self.top = hi[-1]
        else:
            del lo[:], hi[:]
            self._k = self.top = 0
        return dropped


def _push(los: list[int], his: list[int], lo: int, hi: int) -> None:
    # Runs come by start: one that starts at or before the last end extends it.
    if los and lo <= his[-1]:
        if hi > his[-1]:
            his[-1] = hi
    else:
        los.append(lo)
        his.append(hi)
