"""Redis stream ids of a channel given explicit ids (``XADD key 1700000000000-0 ...``).

A channel's messages are numbered by seq, and a stream id is ``<seq>-0`` until a
client names an id of its own. Such an id must be greater than the stream's top (as in
Redis) and becomes a **point**: the message at seq ``s0`` has id ``(ms, n)``. The
messages after a point until the next one are numbered from it the way Redis numbers
``XADD *`` after an id from the future — ``(ms, n + 1)``, ``(ms, n + 2)`` ... — until
their seq passes ``ms``, from where ``<seq>-0`` is greater again and takes over. So
the points alone give every message's id, ids grow with seqs, and a seq's id never
changes once the seq is assigned (a new point only ever comes after the top).

An id is kept as one integer, ``ms << 64 | n``: they compare as Redis compares ids.
Points are persisted as storage meta rows (``POINT_META`` + channel + seq), written
in the batch that stores their message; the points below the channel's first live
seq but the last one are dropped as the channel is truncated.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right

from ..errors import BadRequest

SEQ_BITS = 64
N_MASK = (1 << SEQ_BITS) - 1
ID_MAX = (1 << 2 * SEQ_BITS) - 1
POINT_META = "resp-id/"  # + channel + "/" + seq -> "<ms>-<n>"
ID_HEADER = "x-resp-id"  # a publish's explicit id: "<ms>-<n>" or "<ms>-*"
MAX_POINTS = 100_000  # per channel: explicit ids held in memory until their messages go
MAX_POINTS_HELD = 1_000_000  # by every channel of the process together (24 MB)
TOP_ERROR = "The ID specified in XADD is equal or smaller than the target stream top item"
EXHAUSTED_ERROR = "The stream has exhausted the last possible ID, unable to add more items"
ZERO_ERROR = "The ID specified in XADD must be greater than 0-0"
_EXPLICIT = re.compile(r"(\d{1,20})(?:-(\d{1,20}|\*))?\Z")  # "<ms>" alone is <ms>-0


def make_id(ms: int, n: int) -> int:
    return ms << SEQ_BITS | n


def id_text(value: int) -> str:
    return f"{value >> SEQ_BITS}-{value & N_MASK}"


def point_key(channel: str, seq: int) -> str:
    return f"{POINT_META}{channel}/{seq}"


def parse_point_key(key: str) -> tuple[str, int] | None:
    """``(channel, seq)`` of a point's meta key, None if it is not one."""
    if not key.startswith(POINT_META):
        return None
    channel, _, seq = key[len(POINT_META):].rpartition("/")
    return (channel, int(seq)) if channel and seq.isdigit() else None


def parse_explicit(text: str) -> tuple[int, int | None]:
    """``(ms, n)`` of an explicit id (``n`` None for ``<ms>-*``: the next free n of that
    ms). BadRequest in Redis's words for anything else."""
    m = _EXPLICIT.match(text)
    if m is None:
        raise BadRequest("Invalid stream ID specified as stream command argument")
    ms = int(m.group(1))
    n = None if m.group(2) == "*" else int(m.group(2) or 0)
    if ms > N_MASK or (n is not None and n > N_MASK):
        raise BadRequest("Invalid stream ID specified as stream command argument")
    return ms, n


class StreamIds:
    """The points of one channel, in seq order (three parallel arrays: 24 bytes each)."""

    __slots__ = ("mss", "ns", "seqs")
    held = 0  # the points every StreamIds of this process holds

    def __init__(self) -> None:
        self.seqs = array("q")
        self.mss = array("Q")
        self.ns = array("Q")

    def __del__(self) -> None:  # a channel removed or handed over: its points go with it
        StreamIds.held -= len(self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)

    def id_of(self, seq: int) -> int:
        """The id of ``seq`` (of a seq not assigned yet: the id it gets unless a new
        point comes first)."""
        i = bisect_right(self.seqs, seq) - 1
        if i < 0:
            if not self.seqs:
                return seq << SEQ_BITS
            # Below the first point: <seq>-0, unless points before it were pruned and
            # it is below <seq>-0 (1-4 after 1-1, 1-2): then counted down from it, so
            # that ids stay in order for the searches (these seqs are gone: not live,
            # not held by a reader).
            first = self.mss[0] << SEQ_BITS | self.ns[0]
            return min(seq << SEQ_BITS, max(0, first - (self.seqs[0] - seq)))
        s0, ms = self.seqs[i], self.mss[i]
        if seq == s0:
            return ms << SEQ_BITS | self.ns[i]
        # (ms, n + k) while that is above <seq>-0, which takes over after: an n that
        # runs past its 64 bits carries into ms, and the max keeps ids increasing then.
        return max((ms << SEQ_BITS) + self.ns[i] + seq - s0, seq << SEQ_BITS)

    def text(self, seq: int) -> bytes:
        value = self.id_of(seq)
        return b"%d-%d" % (value >> SEQ_BITS, value & N_MASK)

    def assign(self, seq: int, ms: int, n: int | None) -> int | None:
        """Give the next message (``seq``) the explicit id ``ms-n``: the id, or None if
        it is the one the message gets anyway (no point needed)."""
        value, point = self.resolve(seq, ms, n)
        if not point:
            return None
        self.add(seq, value)
        return value

    def check_next(self, seq: int) -> None:
        """An ``XADD *`` as message ``seq``: refused, in Redis's words, once the ids are
        used up (a point at the largest ms took every n)."""
        if self.id_of(seq) > ID_MAX:
            raise BadRequest(EXHAUSTED_ERROR)

    def resolve(self, seq: int, ms: int, n: int | None) -> tuple[int, bool]:
        """The id ``ms-n`` stands for as the next message's (``seq``), and whether it
        needs a point. BadRequest (Redis's words) unless it is greater than the top, or
        if it needs a point and the channel holds ``MAX_POINTS``. Changes nothing."""
        top = self.id_of(seq - 1) if seq > 1 else 0
        if top >= ID_MAX:  # as Redis answers any XADD then
            raise BadRequest(EXHAUSTED_ERROR)
        if n is None:  # <ms>-*: the next n of that ms
            if ms == top >> SEQ_BITS:
                if top & N_MASK == N_MASK:
                    raise BadRequest(TOP_ERROR)
                n = (top & N_MASK) + 1
            else:
                n = 0
        value = make_id(ms, n)
        if value == 0:
            raise BadRequest(ZERO_ERROR)
        if value <= top:
            raise BadRequest(TOP_ERROR)
        if value == self.id_of(seq):
            return value, False
        if len(self.seqs) >= MAX_POINTS:
            raise BadRequest(
                f"this stream holds {MAX_POINTS:,} entries added with ids of their own "
                "(the limit, kept in memory until the entries are removed): add with '*' "
                "or let readers settle the older entries")
        if StreamIds.held >= MAX_POINTS_HELD:
            raise BadRequest(
                f"the broker holds {MAX_POINTS_HELD:,} entries added with ids of their own "
                "over all streams (the limit, kept in memory until the entries are "
                "removed): add with '*' or let readers settle older entries")
        return value, True

    def add(self, seq: int, value: int) -> None:
        """Add a point after every other (a stored one at start-up: any order)."""
        if self.seqs and seq <= self.seqs[-1]:
            i = bisect_right(self.seqs, seq)
            if i and self.seqs[i - 1] == seq:
                self.mss[i - 1], self.ns[i - 1] = value >> SEQ_BITS, value & N_MASK
                return
            StreamIds.held += 1
            self.seqs.insert(i, seq)
            self.mss.insert(i, value >> SEQ_BITS)
            self.ns.insert(i, value & N_MASK)
            return
        StreamIds.held += 1
        self.seqs.append(seq)
        self.mss.append(value >> SEQ_BITS)
        self.ns.append(value & N_MASK)

    def prune(self, first_seq: int) -> list[int]:
        """Drop the points no live message needs (all below ``first_seq`` but the last:
        it still numbers the messages after it); return their seqs."""
        k = bisect_right(self.seqs, first_seq) - 1
        if k <= 0:
            return []
        dropped = self.seqs[:k].tolist()
        del self.seqs[:k], self.mss[:k], self.ns[:k]
        StreamIds.held -= k
        return dropped

    def search_end(self, value: int) -> int:
        """A seq whose id is above ``value``: so is every later one. Past the last
        point (seq p, ms m) a seq's id is at least ``<seq>-0`` once seq > m."""
        last = max(self.seqs[-1], self.mss[-1]) if self.seqs else 0
        return max(last, value >> SEQ_BITS) + 2

    def ceil(self, value: int, hi: int | None = None) -> int:
        """The lowest seq in ``[1, hi)`` whose id is >= ``value`` (``hi`` if none;
        None: the lowest seq at all)."""
        hi = self.search_end(value) if hi is None else hi
        lo = 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.id_of(mid) >= value:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def seq_of(self, value: int, end: int | None = None) -> int | None:
        """The seq below ``end`` (None: any) whose id is exactly ``value``, if any."""
        seq = self.ceil(value, end)
        return seq if (end is None or seq < end) and self.id_of(seq) == value else None

    def remove(self, seq: int) -> bool:
        """Forget the point at ``seq``, the last one: its message was never stored (a
        commit that wrote nothing) and no later seq was assigned, so the id can be
        given again. (The seqs it numbered were never stored either.)"""
        i = bisect_right(self.seqs, seq) - 1
        if i < 0 or self.seqs[i] != seq:
            return False
        del self.seqs[i], self.mss[i], self.ns[i]
        StreamIds.held -= 1
        return True


def prune_points(name: str, ids: StreamIds | None, first_seq: int,
                 meta: dict[str, str | None]) -> None:
    """Drop the points of channel ``name`` its live messages (from ``first_seq``) no
    longer need, from memory and (through ``meta``, a batch's) from storage."""
    if ids is not None:
        for old in ids.prune(first_seq):
            meta[point_key(name, old)] = None




def stored_points(meta: dict[str, str]) -> dict[str, list[tuple[int, int]]]:
    """The points storage meta holds: channel -> [(seq, id)]."""
    out: dict[str, list[tuple[int, int]]] = {}
    for key, text in meta.items():
        where = parse_point_key(key)
        if where is None or not text:
            continue
        try:
            ms, n = parse_explicit(text)
        except BadRequest:
            continue
        out.setdefault(where[0], []).append((where[1], make_id(ms, n or 0)))
    return out
