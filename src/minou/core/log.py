"""A channel's append-only log as the broker core sees it.

Only recent message bodies live in memory (``cache``, which covers every live
seq in ``[cache_lo, end)``) plus one page read back from storage
(``readback``, covering ``[rb_lo, rb_hi)``). A seq in neither window is
``MISSING``: the core asks the adapter to load it. A seq inside a window but
absent from its dict was deleted (``GONE``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from ..limits import (
    DEFAULT_PREFETCH,
    DEFAULT_REQUEUE_LIMIT,
    DEFAULT_SYNC_INTERVAL_S,
)
from ..names import is_kv
from .kv import KvIndex
from .seq_runs import SeqRuns
from .stream_ids import StreamIds

MSG_OVERHEAD = 280  # a Msg without headers or key in the body cache: object, slot, bytes


class Msg(msgspec.Struct, array_like=True, gc=False):
    """One stored message. Bodies are bytes; JSON is not parsed past validation.

    A msgspec Struct so that storage encodes and decodes whole batches of them
    without Python code per message.
    """

    channel: str
    seq: int
    id: str
    data: bytes
    raw: bool = False
    headers: dict[str, str] | None = None
    priority: int = 0
    published_at: float = 0.0
    expires_at: float | None = None
    deliver_at: float | None = None
    key: str | None = None

    @property
    def special(self) -> bool:
        """Served outside the plain seq order (priority or publish-time delay)."""
        return self.priority > 0 or self.deliver_at is not None

    def size(self) -> int:
        """What the message holds in the body cache, roughly, on CPython 3.11: the
        object, its bytes and its cache slot; its headers (the dict, and two strings
        and a slot each: 64 one-letter headers are ~8 KB) and its key. Counting the
        payload alone let headers and keys hold 40 x the cache's budget."""
        if self.headers is None and self.key is None:  # the common case, kept short
            return len(self.data) + MSG_OVERHEAD
        size = len(self.data) + MSG_OVERHEAD
        headers = self.headers
        if headers:  # (summed with map: a generator over the items cost twice as much)
            size += 240 + 140 * len(headers) + sum(map(len, headers)) + \
                sum(map(len, headers.values()))
        if self.key:
            size += len(self.key) + 50
        return size

    def __repr__(self) -> str:
        return f"Msg({self.channel!r}, seq={self.seq})"


# What a message adds to a page besides its payload and headers (channel, id, key,
# framing): a bound for the usual ones, not a count (counting cost a backlog's read-back
# a third more time per message).
READ_WEIGHT_BASE = 512


def read_weight(m: Msg) -> int:
    """What a message weighs in a page read back or answered: its payload and headers
    plus READ_WEIGHT_BASE. Pages stop at STORAGE_READ_BYTES of it, so one page (and one
    more message at most) fits a frame whatever the messages carry. Storage inlines
    the same sum (keep them equal)."""
    headers = m.headers
    if headers:
        return len(m.data) + READ_WEIGHT_BASE + 8 * len(headers) + \
            sum(map(len, headers)) + sum(map(len, headers.values()))
    return len(m.data) + READ_WEIGHT_BASE


def held_weight(m: Msg) -> int:
    """What an unsettled delivery of ``m`` holds against the in-flight bounds: what the
    message holds in memory (``Msg.size``: a header's objects are ~140 B, its text alone
    in read_weight, and the key counts) and never less than ``read_weight``. A lease
    inlines the common case, no headers and no key: ``len(data) + READ_WEIGHT_BASE``
    (keep them equal). Weighed by read_weight alone (a wire measure: it cuts pages),
    1-byte messages with 64 headers counted 1/8 of their Msg.size, so the bounds let
    8 x as many of them be held."""
    if m.headers:  # a header adds 140 B to size, 8 to read_weight: size is the larger
        return m.size()
    return max(len(m.data) + READ_WEIGHT_BASE, m.size())


def page_end(msgs: list[Msg], limit: int, max_bytes: int | None, upto: int) -> int:
    """Where the next page of a read of ``[..., upto)`` starts: after its last message
    when the read stopped at ``limit`` messages or ``max_bytes`` (of ``read_weight``:
    more may follow), else ``upto`` (it read everything there was)."""
    if not msgs:
        return upto
    if len(msgs) >= limit or (max_bytes is not None
                              and sum(map(read_weight, msgs)) >= max_bytes):
        return msgs[-1].seq + 1
    return upto


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


GONE: Final = _Sentinel("GONE")
MISSING: Final = _Sentinel("MISSING")


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """Per channel-version options (SPEC §4 ``channels."orders/v1"``)."""

    prefetch: int = DEFAULT_PREFETCH
    ttl: float | None = None
    max_items: int | None = None
    overflow: str = "refuse"  # or "drop_oldest"
    requeue_limit: int = DEFAULT_REQUEUE_LIMIT
    dead_letter: bool = True
    retention: float | None = None  # seconds to keep settled messages for replay
    schema: Any = None  # minou.schemas.CompiledSchema: payloads are validated before storing
    # "fsync": a publish is confirmed once on the disk; "interval": once written to the
    # OS (a kill -9 loses nothing), on the disk within ``sync_interval`` seconds (a power
    # cut may lose that much). SQLite only: Redis follows its own appendfsync.
    durability: str = "fsync"
    sync_interval: float = DEFAULT_SYNC_INTERVAL_S
    # Remove the channel (messages, and the groups that read only it) after this many
    # seconds without a publish, a delivery or a connected reader (core/expiry.py).
    expire_idle: float | None = None
    # A key-value bucket's revisions kept per key (core/kv.py); other channels ignore it.
    history: int = 1


class CachedBytes:
    """The bytes of message bodies cached in memory over every channel of a broker, kept
    as each channel's ``cache_bytes`` changes: summing them each tick walked every
    channel (~10 ms of the loop four times a second at 100,000 channels)."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


class SpecialCount:
    """The special (priority or delayed) messages held over every channel of a broker."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = 0


@dataclass(eq=False)
class ChannelLog:
    name: str
    options: ChannelOptions = field(default_factory=ChannelOptions)
    first_seq: int = 1  # lowest seq that may still be live
    end: int = 1  # one past the highest committed (visible) seq
    next_seq: int = 1  # next seq to assign (assigned but uncommitted in [end, next_seq))
    count: int = 0  # live messages
    inflight: int = 0  # assigned, not yet committed
    cache: dict[int, Msg] = field(default_factory=dict)
    cache_lo: int = 1
    cache_bytes: int = 0
    cached: CachedBytes = field(default_factory=CachedBytes)  # the broker's, once held
    readback: dict[int, Msg] = field(default_factory=dict)
    rb_lo: int = 0
    rb_hi: int = 0
    special: dict[int, tuple[int, float | None]] = field(default_factory=dict)
    # The broker's (BrokerState.special_count) once it holds this log: ``special``'s size
    # over every channel, kept as ``special`` changes.
    special_count: SpecialCount = field(default_factory=SpecialCount)
    gone: SeqRuns = field(default_factory=SeqRuns)  # deleted seqs above first_seq
    states: list = field(default_factory=list)  # GroupChannel readers
    dropped: int = 0
    expired: int = 0
    published: int = 0
    requeued: int = 0  # dead letters moved back here (not in published)
    loading: bool = False
    touched: float = 0.0  # the last publish or delivery, or when a reader was last seen
    retention_due: float = 0.0  # no retention candidate before (Commits.retention_looked)
    waiters: dict = field(default_factory=dict)  # GroupChannels waiting for a load
    id_hash: int = 0  # names the channel inside message ids (Broker.new_id)
    frozen: bool = False  # its queue is being handed over: nothing more is delivered
    kv: KvIndex | None = None  # a key-value bucket's index (core/kv.py)
    stream_ids: StreamIds | None = None  # explicit Redis stream ids (core/stream_ids.py)
    order: int = 0  # when the broker took it, among its channels (core/channel_index.py)

    def __post_init__(self) -> None:
        if is_kv(self.name):
            self.kv = KvIndex()

    def lookup(self, seq: int) -> Msg | _Sentinel:
        gone = self.gone  # (its ``n`` first: no Python call while nothing is deleted)
        if seq < self.first_seq or (gone.n and seq in gone):
            return GONE
        if self.cache_lo <= seq < self.end:
            return self.cache.get(seq, GONE)
        if self.rb_lo <= seq < self.rb_hi:
            return self.readback.get(seq, GONE)
        if seq >= self.end:
            return GONE  # not committed yet: not visible
        return MISSING

    def cached_range(self, start: int, end: int, limit: int,
                     max_bytes: int | None = None) -> list[Msg] | None:
        """The live messages in ``[start, end)``, at most ``limit`` (and ``max_bytes``
        of ``read_weight``, always one), if memory holds every one of them (a reader just behind
        the latest commit: no storage read); else None."""
        out: list[Msg] = []
        seq, size = start, 0
        while seq < end and len(out) < limit:
            found = self.lookup(seq)
            if isinstance(found, Msg):
                out.append(found)
                size += read_weight(found)
                if max_bytes is not None and size >= max_bytes:
                    break
            elif found is MISSING:
                return None
            seq += 1
        return out

    def append_committed(self, msg: Msg) -> None:
        self.cache[msg.seq] = msg
        size = msg.size()
        self.cache_bytes += size
        self.cached.total += size
        if msg.seq >= self.end:
            self.end = msg.seq + 1
        if msg.special:
            self.add_special(msg.seq, msg.priority, msg.deliver_at)

    def append_run(self, msgs: list[Msg]) -> None:
        """``append_committed`` of each of ``msgs``: consecutive seqs, none special."""
        self.cache.update(zip(range(msgs[0].seq, msgs[-1].seq + 1), msgs, strict=True))
        size = sum(map(Msg.size, msgs))
        self.cache_bytes += size
        self.cached.total += size
        if msgs[-1].seq >= self.end:
            self.end = msgs[-1].seq + 1

    def add_special(self, seq: int, priority: int, deliver_at: float | None) -> None:
        if seq not in self.special:
            self.special_count.total += 1
        self.special[seq] = (priority, deliver_at)

    def evict_below(self, seq: int) -> int:
        """Drop cached bodies below ``seq``; return bytes freed."""
        freed = 0
        if seq <= self.cache_lo:
            return 0
        for s in range(self.cache_lo, min(seq, self.end)):
            m = self.cache.pop(s, None)
            if m is not None:
                freed += m.size()
        self.cache_lo = seq
        self.cache_bytes -= freed
        self.cached.total -= freed
        return freed

    def evict_bytes(self, need: int) -> int:
        """Drop the oldest cached bodies until ``need`` bytes are freed (they stay in storage)."""
        seq, freed, end = self.cache_lo, 0, self.end
        pop = self.cache.pop  # (the per-message loop of a publish-only load: kept short)
        while seq < end and freed < need:
            m = pop(seq, None)
            if m is not None:
                freed += len(m.data) + MSG_OVERHEAD if m.headers is None and m.key is None \
                    else m.size()
            seq += 1
        self.cache_lo = seq
        self.cache_bytes -= freed
        self.cached.total -= freed
        return freed

    def truncate_below(self, seq: int) -> int:
        """Forget every seq below ``seq`` (settled by all readers); return messages removed."""
        if seq <= self.first_seq:
            return 0
        seq = min(seq, self.end)
        removed = (seq - self.first_seq) - self.gone.drop_below(seq)
        below = [s for s in self.special if s < seq]
        for s in below:
            del self.special[s]
        self.special_count.total -= len(below)
        if self.cache_lo < seq:
            self.evict_below(seq)
        if self.rb_hi and seq >= self.rb_lo:
            for s in [s for s in self.readback if s < seq]:
                del self.readback[s]
        self.first_seq = seq
        self.count -= removed
        if self.kv is not None:
            self.kv.forget_below(seq)
        return removed

    def delete_one(self, seq: int) -> bool:
        """Delete one live message (TTL, dead-lettered, dropped). True if it was live."""
        if seq < self.first_seq or seq in self.gone or seq >= self.end:
            return False
        if seq == self.first_seq:
            # the deleted run right above it goes too: the channel starts after it
            self.first_seq = self.gone.skip(seq + 1)
            self.gone.drop_below(self.first_seq)
        else:
            self.gone.add(seq)
        m = self.cache.pop(seq, None)
        if m is not None:
            size = m.size()
            self.cache_bytes -= size
            self.cached.total -= size
        self.readback.pop(seq, None)
        if self.special.pop(seq, None) is not None:
            self.special_count.total -= 1
        self.count -= 1
        if self.kv is not None:
            self.kv.forget(seq)
        return True

    def drop_inflight(self) -> int:
        """Drop the oldest message not yet committed; its commit will skip it."""
        # delete_one may have moved first_seq past end, over the gaps failed commits
        # left there (no longer in ``gone``): those seqs were never stored.
        seq = self.gone.skip(max(self.end, self.first_seq))
        self.gone.add(seq)
        self.inflight -= 1
        return seq

    def oldest_live(self) -> int | None:
        """The lowest live seq, if known without storage."""
        s = self.gone.skip(self.first_seq)
        return s if s < self.end else None
