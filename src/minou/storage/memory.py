"""In-process storage: SQLiteStorage's twin, for tests and the deterministic simulator.

Stores live in a registry of this process by name, so ``MemoryStorage("x")`` made
again after ``close()`` (a restart) opens what was committed before. A crash is an
instance dropped without ``close``: what it committed stays, as on a disk.
``MemoryStorage.forget(name)`` loses the disk itself, ``drop_all()`` every one.

Every Storage call answers as SQLiteStorage's does, because the core must not be able
to tell them apart. So messages are kept as SQLite keeps them: one encoded segment per
channel per run of consecutive seqs in a batch, single removed seqs listed beside.
Answers depend on that shape (``retained_until`` searches segments' first publish
times, a truncate keeps a segment that straddles the new first seq), and bodies come
back decoded from bytes, so nothing the core holds is shared with the store.

``apply`` is atomic by copy-on-write: a batch works on copies of the tables and
channels it touches, and the store takes them only once the whole batch is applied
and fits ``max_size``. Published tables are never changed again, so a reader (another
thread) takes the current state and reads it without a lock.

The quota counts what a store holds: each record's strings and bytes (a segment: its
encoded messages) plus RECORD_BYTES for the rest. A batch that would grow the store
past ``max_size`` raises StorageFull and writes nothing. As with SQLite, the first
time gives back a reserve (``reserve`` bytes above ``max_size``) so that the small
writes the broker must still make (acks, group states) find room, until ``probe``
sees room again.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..core.group import GroupDef
from ..core.log import READ_WEIGHT_BASE, Msg, read_weight
from ..core.seq_runs import SeqRuns
from ..core.snapshot import ChannelRecord, Snapshot
from ..core.writes import WriteBatch
from ..errors import StorageFenced, StorageFull, StorageUnavailable
from ..limits import STORAGE_RESERVE_BYTES, STORAGE_RESUME_BYTES
from ..names import schema_key
from ..protocol.frames import Send
from . import segments
from .segments import runs

RECORD_BYTES = 64  # a record's keys, numbers and bookkeeping, roughly
FULL_CAUSE = "max_size reached"
_enc = msgspec.msgpack.Encoder()
_messages = msgspec.msgpack.Decoder(list[Msg])
_sends = msgspec.msgpack.Decoder(list[Send])

# The tables besides messages, each a dict from its primary key to the rest of a row.
TABLES = ("groups", "group_states", "dedup", "clients", "credentials", "reservations",
          "fences", "writers", "meta", "used_tokens", "staged", "producers")


@dataclass(eq=False)  # hashed by identity: the expiry scan remembers finished segments
class _Segment:
    """Consecutive messages [first seq, last] of one channel, encoded."""

    last: int
    published_at: float  # the first message's: retention searches on it
    expires_min: float | None
    special: bool  # holds a priority or delayed message (restored in Snapshot.specials)
    body: bytes

    @classmethod
    def of(cls, msgs: list[Msg]) -> _Segment:
        expires = [m.expires_at for m in msgs if m.expires_at is not None]
        return cls(msgs[-1].seq, msgs[0].published_at, min(expires) if expires else None,
                   any(m.priority or m.deliver_at is not None for m in msgs), _enc.encode(msgs))

    def cost(self) -> int:
        return RECORD_BYTES + len(self.body)


@dataclass(eq=False)
class _Channel:
    next_seq: int
    first_seq: int = 1
    starts: list[int] = field(default_factory=list)  # the segments' first seqs, sorted
    segments: dict[int, _Segment] = field(default_factory=dict)
    removed: set[int] = field(default_factory=set)  # seqs deleted from inside a segment

    def copy(self) -> _Channel:
        return _Channel(self.next_seq, self.first_seq, list(self.starts), dict(self.segments),
                        set(self.removed))


@dataclass(eq=False)
class _State:
    """One committed state of a store. Never changed once a store holds it."""

    channels: dict[str, _Channel] = field(default_factory=dict)  # in creation order
    tables: dict[str, dict[Any, Any]] = field(default_factory=lambda: {t: {} for t in TABLES})
    used: int = 0  # bytes, as the quota counts them


@dataclass(eq=False)
class _Store:
    state: _State = field(default_factory=_State)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one batch at a time
    # Fencing, as on Redis (storage/redis): each queue's epoch and the instance that
    # holds the store (the primary), for instances made with ``claim=True``.
    epochs: dict[str, int] = field(default_factory=dict)
    primary: object = None


# The process's stores, by name. A module-level registry on purpose: it is the "disk"
# that outlives the instances (restarts) of one process.
_STORES: dict[str, _Store] = {}
_STORES_LOCK = threading.Lock()


def _cost(*parts: Any) -> int:
    """A record's size for the quota: its strings and bytes, plus RECORD_BYTES."""
    return RECORD_BYTES + sum(_text_len(p) for p in parts)


def _text_len(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    if isinstance(value, tuple | list):
        return sum(_text_len(v) for v in value)
    return 0


def _free_memory() -> int:
    """What the machine has left for a store to grow into: its "disk"."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return sys.maxsize  # not known here: no limit but max_size


class _Work:
    """A batch being applied: copies of what it changes, over a committed state."""

    def __init__(self, base: _State) -> None:
        self.state = _State(dict(base.channels), dict(base.tables), base.used)
        self._own_tables: set[str] = set()
        self._own_channels: set[str] = set()

    # ------------------------------------------------------------ tables
    def table(self, name: str) -> dict[Any, Any]:
        """Table ``name`` to change (copied on the first change)."""
        if name not in self._own_tables:
            self.state.tables[name] = dict(self.state.tables[name])
            self._own_tables.add(name)
        return self.state.tables[name]

    def put(self, name: str, key: Any, value: Any) -> None:
        table = self.table(name)
        old = table.get(key)
        if old is not None:
            self.state.used -= _cost(key, old)
        table[key] = value
        self.state.used += _cost(key, value)

    def drop(self, name: str, key: Any) -> None:
        if key in self.state.tables[name]:
            self.state.used -= _cost(key, self.table(name).pop(key))

    def drop_where(self, name: str, gone: Callable[[Any, Any], bool]) -> None:
        for key in [k for k, v in self.state.tables[name].items() if gone(k, v)]:
            self.drop(name, key)

    def put_or_drop(self, name: str, changes: dict[Any, Any]) -> None:
        """A value replaces the row, None drops it."""
        for key, value in changes.items():
            if value is None:
                self.drop(name, key)
            else:
                self.put(name, key, value)

    # ---------------------------------------------------------- channels
    def channel(self, name: str) -> _Channel | None:
        """Channel ``name`` to change (copied on the first change), None if unknown."""
        ch = self.state.channels.get(name)
        if ch is not None and name not in self._own_channels:
            ch = self.state.channels[name] = ch.copy()
            self._own_channels.add(name)
        return ch

    def new_channel(self, name: str, next_seq: int) -> None:
        self.state.channels[name] = _Channel(next_seq)
        self._own_channels.add(name)
        self.state.used += _cost(name)

    def put_segment(self, ch: _Channel, seg: _Segment, first: int) -> None:
        old = ch.segments.get(first)
        if old is None:
            insort(ch.starts, first)
        else:
            self.state.used -= old.cost()
        ch.segments[first] = seg
        self.state.used += seg.cost()

    def remove(self, ch: _Channel, seq: int) -> None:
        if seq not in ch.removed:
            ch.removed.add(seq)
            self.state.used += RECORD_BYTES

    def truncate(self, ch: _Channel, first: int) -> None:
        """Messages below ``first`` go; a segment that reaches ``first`` stays whole (as
        in SQLite: ``first_seq`` hides the part below)."""
        ch.first_seq = max(ch.first_seq, first)
        below = bisect_left(ch.starts, first)
        kept = []
        for start in ch.starts[:below]:
            if ch.segments[start].last < first:
                self.state.used -= ch.segments.pop(start).cost()
            else:
                kept.append(start)
        ch.starts[:below] = kept
        gone = {seq for seq in ch.removed if seq < first}
        ch.removed -= gone
        self.state.used -= RECORD_BYTES * len(gone)


# ------------------------------------------------------------------ applying a batch
# One function per record kind, run in the order SQLiteStorage writes them (it matters
# within a table: messages before deletes and truncates, a group's deletion before its
# new states, dropped fences before new ones, staged parts before unstaged, answers last).
def _channels(w: _Work, batch: WriteBatch) -> None:
    # As in SQLite, an existing channel's next seq is stored only with a removal;
    # otherwise it follows from the highest stored seq.
    removing = set(batch.truncates) | {c for c, _ in batch.deletes}
    for name, next_seq in batch.channels.items():
        if name not in w.state.channels:
            w.new_channel(name, next_seq)
        elif name in removing:
            ch = w.channel(name)
            assert ch is not None
            ch.next_seq = max(ch.next_seq, next_seq)


def _known(w: _Work, name: str) -> _Channel:
    ch = w.channel(name)
    if ch is None:  # SQLite fails here too (with a KeyError)
        raise StorageUnavailable(f"commit failed: channel {name!r} was never created")
    return ch


def _messages_of(w: _Work, batch: WriteBatch) -> None:
    by_channel: dict[str, list[Msg]] = {}
    for m in batch.messages:
        by_channel.setdefault(m.channel, []).append(m)
    for name, msgs in by_channel.items():
        ch = _known(w, name)
        for run in runs(msgs):
            w.put_segment(ch, _Segment.of(run), run[0].seq)


def _deletes(w: _Work, batch: WriteBatch) -> None:
    for name, seq in batch.deletes:
        ch = w.channel(name)
        if ch is not None:  # a channel never stored has nothing to delete
            w.remove(ch, seq)


def _truncates(w: _Work, batch: WriteBatch) -> None:
    for name, first in batch.truncates.items():
        w.truncate(_known(w, name), first)


def _forgets(w: _Work, batch: WriteBatch) -> None:
    for name in batch.forgets:
        if w.state.channels.pop(name, None) is not None:
            w.state.used -= _cost(name)


def _groups(w: _Work, batch: WriteBatch) -> None:
    deleted = {key for key, gdef in batch.group_defs.items() if gdef is None}
    for key, gdef in batch.group_defs.items():
        if gdef is None:
            w.drop("groups", key)
        else:
            w.put("groups", key, (gdef.kind, tuple(gdef.patterns)))
    if deleted:
        w.drop_where("group_states", lambda k, _: k[0] in deleted)
    w.put_or_drop("group_states",
                  {k: None if v is None else tuple(v) for k, v in batch.group_states.items()})


def _dedup(w: _Work, batch: WriteBatch) -> None:
    for channel, key, expires_at, seq, msg_id in batch.dedup:
        w.put("dedup", (channel, key), (float(expires_at), seq, msg_id))


def _records(w: _Work, batch: WriteBatch) -> None:
    """Rows the broker replaces whole: key registry, credentials, reservations, writers,
    meta, producers (keyed by the row's own first three columns, as in SQLite)."""
    w.put_or_drop("clients", batch.clients)
    w.put_or_drop("credentials", batch.credentials)
    w.put_or_drop("reservations", batch.reservations)
    w.put_or_drop("writers", batch.writers)
    w.put_or_drop("meta", batch.meta)
    for key, row in batch.producers.items():
        if row is None:
            w.drop("producers", tuple(key))
        else:  # ``used`` (the ninth column) is a REAL in SQLite: stored as a float
            w.put("producers", tuple(row[:3]), (*row[3:8], float(row[8]), *row[9:]))


def _fences(w: _Work, batch: WriteBatch) -> None:
    if batch.dropped_fences:
        dropped = set(batch.dropped_fences)
        w.drop_where("fences", lambda k, _: k[0] in dropped)
    for key, number in batch.fences.items():
        w.put("fences", key, number)


def _used_tokens(w: _Work, batch: WriteBatch) -> None:
    for jti, expires in batch.used_tokens:
        if jti not in w.state.tables["used_tokens"]:  # the first expiry stays, as in SQLite
            w.put("used_tokens", jti, float(expires))


def _staged(w: _Work, batch: WriteBatch) -> None:
    for owner, txn, part, sends, at in batch.staged:
        w.put("staged", (owner, txn, part), (_enc.encode(sends), float(at)))
    if batch.unstaged:
        gone = set(batch.unstaged)
        w.drop_where("staged", lambda k, _: k[:2] in gone)
    for owner, txn, result, at in batch.txn_done:  # part 0: the commit's answer
        w.put("staged", (owner, txn, 0), (_enc.encode(result), float(at)))


STEPS = (_channels, _messages_of, _deletes, _truncates, _forgets, _groups, _dedup, _records,
         _fences, _used_tokens, _staged)


def _prune(w: _Work, batch: WriteBatch, commits: int) -> None:
    """What SQLite drops now and then: dedup entries and used tokens an hour past."""
    if batch.dedup and commits % 1000 == 0:
        w.drop_where("dedup", lambda _, v: v[0] < batch.dedup[0][2] - 3600)
    if batch.used_tokens and commits % 64 == 0:
        oldest = min(e for _, e in batch.used_tokens) - 3600
        w.drop_where("used_tokens", lambda _, v: v < oldest)


# --------------------------------------------------------------------- reading
def _channel_record(name: str, ch: _Channel) -> ChannelRecord:
    """The channel as SQLiteStorage reads it back (the same steps on the same shape)."""
    spans = [(start, ch.segments[start].last) for start in ch.starts]
    return segments.channel_record(name, ch.next_seq, ch.first_seq, spans,
                                   SeqRuns.from_sorted(sorted(ch.removed)))


def _specials(ch: _Channel, rec: ChannelRecord) -> Iterator[tuple[str, int, int, float | None]]:
    gone = rec.gone
    for start in ch.starts:
        if ch.segments[start].special:
            for m in _messages.decode(ch.segments[start].body):
                if m.special and m.seq >= rec.first_seq and m.seq not in gone:
                    yield m.channel, m.seq, m.priority, m.deliver_at


def _snapshot(state: _State, now: float) -> Snapshot:
    snap = Snapshot()
    for name, ch in state.channels.items():
        rec = _channel_record(name, ch)
        snap.channels.append(rec)
        snap.specials.extend(_specials(ch, rec))
    # Sorted by key, the order SQLite's tables (by primary key) give back.
    t = {name: sorted(table.items()) for name, table in state.tables.items()}
    snap.groups = [GroupDef(key, *v) for key, v in t["groups"]]
    snap.group_states = [(*k, *v) for k, v in t["group_states"]]
    snap.dedup = [(*k, *v) for k, v in t["dedup"] if v[0] > now]
    snap.clients = [record for _, record in t["clients"]]
    snap.credentials = [record for _, record in t["credentials"]]
    snap.reservations = dict(t["reservations"])
    snap.fences = [(*k, batch) for k, batch in t["fences"]]
    snap.writers = dict(t["writers"])
    snap.meta = dict(t["meta"])
    snap.used_tokens = [(jti, expires) for jti, expires in t["used_tokens"] if expires > now]
    snap.staged = [(owner, txn, part, _sends.decode(body) if part else msgspec.msgpack.decode(
        body), at) for (owner, txn, part), (body, at) in t["staged"]]
    snap.producers = [(*k, *v) for k, v in t["producers"]]
    return snap


def _due_segments(state: _State, now: float) -> list[tuple[str, _Segment]]:
    """Segments holding a message whose TTL has passed, soonest expiry first (the
    order of SQLite's expiry index)."""
    due = [(seg.expires_min, order, first, name, seg)
           for order, (name, ch) in enumerate(state.channels.items())
           for first, seg in ch.segments.items()
           if seg.expires_min is not None and seg.expires_min <= now]
    due.sort(key=lambda d: d[:3])
    return [(name, seg) for *_, name, seg in due]


def _queue(channel: str) -> str | None:
    """The queue (``endpoint/version``) of a channel or its dead letters; None for a
    pattern of no single queue."""
    try:
        key = schema_key(channel)
    except ValueError:
        return None
    return None if "*" in key or ">" in key else key


def _touched(batch: WriteBatch) -> set[str]:
    """The queues a batch writes to (as the Redis backend splits it)."""
    names = [m.channel for m in batch.messages]
    names += [c for c, _ in batch.deletes]
    names += [*batch.truncates, *batch.channels, *batch.forgets]
    names += [c for _, c in batch.group_states]
    names += [c for _, c in batch.fences]
    names += [d[0] for d in batch.dedup]
    return {q for q in map(_queue, names) if q is not None}


class MemoryStorage:
    backend = "memory"

    def __init__(self, name: str = "default", *, max_size: int | None = None,
                 reserve: int = STORAGE_RESERVE_BYTES, claim: bool = False) -> None:
        """``claim``: fence as RedisStorage does: ``open`` takes the store over (every
        queue's epoch goes up) and a batch of an instance that no longer holds it (or
        whose epoch of a queue it touches moved on) raises StorageFenced, writing
        nothing. The simulator's takeovers use it; tests opening a second instance
        beside a running one must not."""
        self.name = name
        self.claim = claim
        self.epochs: dict[str, int] = {}
        self.path = f"memory://{name}"
        self.max_size = max_size  # bytes as the quota counts them (None: no limit)
        self.reserve = reserve
        self.reserve_released = False  # since the last StorageFull, until probe() says room
        # The server names these in its full-storage log lines (SQLite: the data dir and
        # the reserve file); a memory store has only its URL to show.
        self.data_dir = self.reserve_path = self.path
        # The store this instance was made on: after forget() it keeps writing there,
        # where no later instance looks (a crashed process's lost disk).
        with _STORES_LOCK:
            self._store = _STORES.setdefault(name, _Store())
        self._commits = 0  # this instance's, as SQLite's (it paces the pruning)
        self._expiry_done: weakref.WeakSet[_Segment] = weakref.WeakSet()

    @staticmethod
    def forget(name: str) -> None:
        """Lose store ``name``: the next instance of that name starts empty."""
        with _STORES_LOCK:
            _STORES.pop(name, None)

    @staticmethod
    def drop_all() -> None:
        """Lose every store of the process (test isolation)."""
        with _STORES_LOCK:
            _STORES.clear()

    def _state(self) -> _State:
        return self._store.state  # a committed state: read it without a lock

    def open(self, now: float) -> Snapshot:
        if self.claim:
            store = self._store
            with store.lock:
                store.primary = self
                # Every queue ever claimed (as Redis's registry: a claim registers the
                # queue even if its first commit never landed) and every stored one.
                found = {_queue(name) for name in store.state.channels} | set(store.epochs)
                for queue in sorted(q for q in found if q is not None):
                    self._claim(queue)
        return _snapshot(self._state(), now)

    def _claim(self, queue: str) -> None:
        epochs = self._store.epochs
        epochs[queue] = self.epochs[queue] = epochs.get(queue, 0) + 1

    def _check_fence(self, batch: WriteBatch) -> None:
        """Under the store's lock: StorageFenced if another instance took over."""
        store = self._store
        if store.primary is not self:
            raise StorageFenced(f"{self.path} was taken over by another broker: nothing "
                                "written", {}, "another instance")
        fenced = {}
        for queue in _touched(batch):
            if queue not in self.epochs and queue not in store.epochs:
                self._claim(queue)  # a new queue, claimed by the holder at its first write
            elif store.epochs.get(queue) != self.epochs.get(queue):
                fenced[queue] = store.epochs.get(queue, 0)
        if fenced:
            raise StorageFenced(f"{self.path}: queue(s) {', '.join(sorted(fenced))} were "
                                "claimed by another broker: nothing written", fenced)

    def apply(self, batch: WriteBatch) -> None:
        """Apply ``batch`` whole, or raise (StorageFull past ``max_size``,
        StorageUnavailable for what SQLite could not store) with nothing written."""
        store = self._store
        with store.lock:
            if self.claim:
                self._check_fence(batch)
            base = store.state
            work = _Work(base)
            try:
                for step in STEPS:
                    step(work, batch)
                _prune(work, batch, self._commits)
            except (msgspec.EncodeError, TypeError, ValueError) as exc:
                raise StorageUnavailable(f"commit failed: {exc}") from exc
            if not self._fits(work.state.used, base.used):
                raise self._full()
            store.state = work.state
        self._commits += 1

    # ---------------------------------------------------------------- quota
    def _fits(self, used: int, before: int) -> bool:
        """A batch that does not grow the store always fits (it frees what it can)."""
        if self.max_size is None or used <= before:
            return True
        return used <= self.max_size + (self.reserve if self.reserve_released else 0)

    def _full(self) -> StorageFull:
        """The StorageFull to raise; gives the reserve back (the first time)."""
        space = self.space()
        released = not self.reserve_released and self.reserve > 0
        self.reserve_released = True
        return StorageFull(self.full_message(space, FULL_CAUSE), data_dir=self.path,
                           free_bytes=space["free"], disk_free_bytes=space["disk_free"],
                           cause=FULL_CAUSE, reserve_released=released,
                           max_size=self.max_size)

    def full_message(self, space: dict[str, Any], cause: str = FULL_CAUSE) -> str:
        """What a refused request is told: the store, the free space, and why."""
        return segments.full_text(cause, f"the in-memory store {self.path}", space,
                                  "of memory free")

    def space(self) -> dict[str, Any]:
        used = self._state().used
        disk_free = _free_memory()
        out = {"disk_free": disk_free, "used": used, "free": disk_free,
               "max_size": self.max_size}
        if self.max_size is not None:
            out["free"] = min(disk_free, max(0, self.max_size - used))
        return out

    def probe(self) -> tuple[bool, dict[str, Any]]:
        """After StorageFull: is there room again (what SQLite asks of max_size; there
        is no reserve file to take back)? If so, the reserve is held back again."""
        space = self.space()
        need = STORAGE_RESUME_BYTES
        if self.max_size is not None:
            need = min(need, self.max_size // 4)
        room = self.max_size is None or self.max_size - space["used"] >= need
        if room:
            self.reserve_released = False
        return room, space

    # -------------------------------------------------------------- reading
    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int,
                   max_bytes: int | None = None) -> list[Msg]:
        ch = self._state().channels.get(channel)
        if ch is None or limit <= 0:
            return []
        lo, hi = max(from_seq, ch.first_seq, 0), to_seq
        if lo >= hi:
            return []
        out: list[Msg] = []
        size, most = 0, max_bytes if max_bytes is not None else 1 << 62
        # From the segment holding ``lo`` (the last one starting at or before it).
        for i in range(max(0, bisect_right(ch.starts, lo) - 1), len(ch.starts)):
            if ch.starts[i] >= hi:
                break
            for m in _messages.decode(ch.segments[ch.starts[i]].body):
                if lo <= m.seq < hi and m.seq not in ch.removed:
                    out.append(m)
                    size += read_weight(m) if m.headers else len(m.data) + READ_WEIGHT_BASE
                    if len(out) >= limit or size >= most:
                        return out
        return out

    def expired(self, now: float, limit: int) -> list[Msg]:
        state = self._state()
        out: list[Msg] = []
        for name, seg in _due_segments(state, now):
            if seg in self._expiry_done:
                continue
            ch = state.channels[name]
            msgs = _messages.decode(seg.body)
            due = [m for m in msgs if m.expires_at is not None and m.expires_at <= now
                   and m.seq >= ch.first_seq and m.seq not in ch.removed]
            if not due and all(m.expires_at is None or m.expires_at <= now for m in msgs):
                self._expiry_done.add(seg)  # nothing left to expire here: skip it from now on
            out.extend(due)
            if len(out) >= limit:
                break
        return out[:limit]

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        """The seq after the last message below ``below`` published before ``cutoff``."""
        ch = self._state().channels.get(channel)
        if ch is None:
            return None

        def first_at_or_after(seq: int) -> tuple[int, float] | None:
            i = bisect_left(ch.starts, seq)
            if i == len(ch.starts) or ch.starts[i] >= below:
                return None
            return ch.starts[i], ch.segments[ch.starts[i]].published_at

        return segments.retained_until(first_at_or_after,
                                       lambda seq: ch.segments[seq].body, below, cutoff)

    def size_bytes(self) -> int:
        return self._state().used

    def close(self) -> None:
        """Nothing to release: the store stays in the registry for the next instance."""
