"""Groups: the one reader model under listen, consume and replay.

A ``Group`` reads every channel its patterns match. For each channel it keeps
a ``GroupChannel``: a cursor into the log (messages below it were handed out
at least once or skipped) plus the out-of-order sets: leases of unsettled
deliveries, returned messages (front / back / delayed), and the priority and
publish-delay heaps for "special" messages, which the cursor skips.

Everything below ``floor`` is settled for this group. What must survive a
restart is ``floor`` and the small state above it (acked seqs, attempts,
delayed retries): see ``GroupChannel.durable_state``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..limits import BURST_BYTES
from ..names import Pattern, match_keys
from .in_flight import InFlightBytes
from .log import GONE, MISSING, READ_WEIGHT_BASE, ChannelLog, Msg, held_weight
from .seq_runs import SeqRuns

# Acks above the floor beyond this many are folded into runs (``compute_floor``): the
# set stays the fast check for the recent ones, the runs hold the rest in two ints per
# gap. One message that waits (a delayed retry, a publish-time delay, a held lease)
# pins the floor for as long as it waits: as a set, every ack after it stayed in memory
# and in every commit's group state (78 MB of state written over 199,000 acks).
FOLD_ACKED = 1024
# The runs of a group channel that has none (most: a group reads up to thousands of
# channels), shared: never changed, replaced by a SeqRuns of its own at the first fold.
_NO_RUNS = SeqRuns()


def _heap(items: list[Any]) -> list[Any]:
    heapq.heapify(items)
    return items


class Lease(msgspec.Struct):
    """One unsettled delivery. A Struct, built in C: one per delivery, and a Python
    ``__init__`` setting ten attributes was a tenth of the core's deliver+ack."""

    tag: int
    gc: GroupChannel
    msg: Msg
    seq: int
    sub: Subscription
    # What it holds against the in-flight bounds (``lease_weight``)
    weight: int
    delivered: float
    expires: float  # an extend moves it
    # The commit (WriteBatch.number) that stores this delivery's attempt count, and
    # whether it came back and waits for that commit to be requeued (Settlement).
    count_in: int = 0
    returning: bool = False
    # Extends so far: the lease heap's entry carrying this number is its live one
    # (Settlement.extend); older entries are stale and skipped.
    extends: int = 0

    def __repr__(self) -> str:  # not the fields': they reach the whole group
        return f"Lease(tag={self.tag}, seq={self.seq})"


def lease_weight(msg: Msg) -> int:
    """What a delivery of ``msg`` holds against the in-flight bounds (``held_weight``;
    the delivery path inlines its common case, no headers and no key)."""
    return (len(msg.data) + READ_WEIGHT_BASE
            if not msg.headers and msg.key is None else held_weight(msg))


class NeedLoad(Exception):
    """The next message's body is in storage only; the adapter must load it."""

    def __init__(self, log: ChannelLog, seq: int) -> None:
        self.log = log
        self.seq = seq


class _State(msgspec.Struct, array_like=True):
    # ``acked``: single seqs (what older versions wrote, all of them); ``acked_runs``
    # the rest as [lo, hi) ranges. A new field goes last: an older state decodes with
    # the default.
    acked: list[int] = []
    attempts: dict[int, int] = {}
    delayed: list[tuple[float, int]] = []
    acked_runs: list[tuple[int, int]] = []


_state_encoder = msgspec.msgpack.Encoder()
_state_decoder = msgspec.msgpack.Decoder(_State)


class GroupChannel:
    def __init__(self, group: Group, log: ChannelLog, cursor: int) -> None:
        self.group = group
        self.log = log
        self.cursor = cursor
        self.floor = cursor
        self.pending: dict[int, Lease] = {}
        self.front: list[int] = []  # returned for retry now: a heap, lowest seq first
        self.skip: set[int] = set()  # seqs the cursor must pass (restored delayed retries)
        self.back: deque[tuple[int, int]] = deque()  # (serve once cursor >= this, seq)
        self.delayed: list[tuple[float, int]] = []  # nack(delay=): (not_before, seq)
        self.prio: list[tuple[int, int]] = []  # (-priority, seq), ready now
        self.sched: list[tuple[float, int]] = []  # publish-time delay: (deliver_at, seq)
        self.attempts: dict[int, int] = {}
        # seq -> id() of the member it came back from (lease ran out, nack): its next
        # delivery prefers another member with credit. An id, not a reference: a stale
        # entry only costs a preference, never keeps a subscription alive.
        self.returned_from: dict[int, int] = {}
        # Acked seqs at or above the floor: the recent ones in ``acked``, older ones
        # folded into ``acked_runs`` (FOLD_ACKED); ``runs_hi`` is acked_runs.top, an int
        # check before a lookup on the delivery path. Both parts count: ``is_acked``.
        self.acked: set[int] = set()
        self.acked_runs = _NO_RUNS
        self.runs_hi = 0
        self.delivered = 0
        self.acks = 0

    def __repr__(self) -> str:
        return f"GroupChannel({self.group.key!r}, {self.log.name!r}, cursor={self.cursor})"

    # -- specials ---------------------------------------------------------
    def add_special(self, seq: int, priority: int, deliver_at: float | None, now: float) -> None:
        # Callers pass a seq just committed, or an unacked one (load_specials): never
        # one this group has settled.
        if deliver_at is not None and deliver_at > now:
            heapq.heappush(self.sched, (deliver_at, seq))
        else:
            heapq.heappush(self.prio, (-priority, seq))

    def load_specials(self, now: float) -> None:
        # A restored delayed retry (in ``skip``) comes back from ``delayed`` at its
        # time: queued from the specials too, it would go out at once (and twice).
        for seq, (priority, deliver_at) in self.log.special.items():
            if seq >= self.floor and not self.is_acked(seq) and seq not in self.skip:
                self.add_special(seq, priority, deliver_at, now)

    def is_acked(self, seq: int) -> bool:
        """Whether ``seq`` (at or above the floor) is acked by this group."""
        return seq in self.acked or (seq < self.runs_hi and seq in self.acked_runs)

    # -- picking the next message -----------------------------------------
    def _take(self, seq: int) -> Msg | None:
        """Look ``seq`` up; None if it is gone or already out; NeedLoad if not in memory."""
        m = self.log.lookup(seq)
        if m is MISSING:
            raise NeedLoad(self.log, seq)
        if (m is GONE or seq in self.pending or seq in self.acked
                or (seq < self.runs_hi and seq in self.acked_runs)):
            return None
        return m  # type: ignore[return-value]

    def next_ready(self, now: float) -> Msg | None:
        while self.front:
            m = self._take(self.front[0])
            heapq.heappop(self.front)
            if m is not None:
                return m
        sched = self.sched
        while sched and sched[0][0] <= now:
            _, seq = heapq.heappop(sched)
            prio = self.log.special.get(seq, (0, None))[0]
            heapq.heappush(self.prio, (-prio, seq))
        while self.prio:
            m = self._take(self.prio[0][1])
            heapq.heappop(self.prio)
            if m is not None:
                return m
        while self.back and self.back[0][0] <= self.cursor:
            m = self._take(self.back[0][1])
            self.back.popleft()
            if m is not None:
                return m
        log = self.log
        special, acked, skip = log.special, self.acked, self.skip
        runs_hi, runs = self.runs_hi, self.acked_runs
        while self.cursor < log.end:
            seq = self.cursor
            if (seq in special or seq in acked or seq in skip
                    or (seq < runs_hi and seq in runs)):
                self.cursor += 1
                continue
            # ``_take`` inlined, without the acked checks just made: once per delivery
            m = log.lookup(seq)
            if m is MISSING:
                raise NeedLoad(log, seq)
            self.cursor += 1
            if m is not GONE and seq not in self.pending:
                return m  # type: ignore[return-value]
        while self.back:
            m = self._take(self.back[0][1])
            self.back.popleft()
            if m is not None:
                return m
        return None

    def plain(self) -> bool:
        """Whether the next messages come from the cursor alone (nothing returned,
        prioritized or scheduled waits): ``take_run`` may hand them out."""
        return not (self.front or self.prio or self.back or self.sched)

    def take_run(self, limit: int) -> list[Msg]:
        """Up to ``limit`` messages from the cursor, the ones ``next_ready`` would give
        one by one while ``plain``; the cursor moves past them. It stops before a
        message whose body is in storage only (``next_ready`` then raises NeedLoad for
        it). The pump takes a member's run in one call, and sets the cursor back to
        the first of them it did not deliver (``put_back``)."""
        out: list[Msg] = []
        if limit <= 0:
            return out
        log = self.log
        special, acked, skip, pending = log.special, self.acked, self.skip, self.pending
        runs_hi, runs = self.runs_hi, self.acked_runs
        # ``log.lookup``'s common case inlined: nothing deleted, the seq in the cache
        cache, cache_lo = log.cache, max(log.cache_lo, log.first_seq)
        cached = not log.gone.n
        seq, end = self.cursor, log.end
        while seq < end:
            if (seq in special or seq in acked or seq in skip
                    or (seq < runs_hi and seq in runs)):
                seq += 1
                continue
            m = cache.get(seq, GONE) if cached and seq >= cache_lo else log.lookup(seq)
            if m is MISSING:
                break
            if m is not GONE and seq not in pending:
                out.append(m)  # type: ignore[arg-type]
                if len(out) >= limit:
                    seq += 1
                    break
            seq += 1
        self.cursor = seq
        return out

    def put_back(self, seq: int) -> None:
        """The messages a ``take_run`` gave from ``seq`` on were not delivered: the
        cursor goes back to it (what it passes on the way is passed again)."""
        self.cursor = min(self.cursor, seq)

    def waiting(self) -> tuple[int, int | None]:
        """How many stored messages wait for this group (neither delivered nor settled
        yet: new, requeued or delayed), and the lowest of their seqs."""
        log = self.log
        lo, end = max(self.compute_floor(), log.first_seq), log.end
        if lo >= end:
            return 0, None
        gone, acked, runs, pending = log.gone, self.acked, self.acked_runs, self.pending
        is_acked = self.is_acked
        taken = gone.count_between(lo, end)  # over its runs, not its seqs
        taken += runs.count_between(lo, end)  # the acked runs, less their seqs also gone
        taken -= sum(gone.count_between(max(a, lo), min(b, end)) for a, b in runs.runs()
                     if a < end and b > lo)
        taken += sum(1 for s in acked if lo <= s < end and s not in gone)
        taken += sum(1 for s in pending if lo <= s < end and s not in gone and not is_acked(s))
        seq = lo
        while seq < end:
            past = gone.skip(seq)  # a deleted run at once, not seq by seq
            if past != seq:
                seq = past
            elif seq in acked or seq in pending:
                seq += 1
            elif seq < self.runs_hi and seq in runs:  # an acked run in one step too
                seq = runs.skip(seq)
            else:
                break
        return max(0, end - lo - taken), seq if seq < end else None

    # -- settling ---------------------------------------------------------
    def settle(self, seq: int) -> None:
        self.pending.pop(seq, None)
        self.attempts.pop(seq, None)
        self.acked.add(seq)
        self.acks += 1

    def requeue(self, seq: int, *, front: bool, delay: float, now: float) -> None:
        self.pending.pop(seq, None)
        if delay > 0:
            heapq.heappush(self.delayed, (now + delay, seq))
        elif front:
            heapq.heappush(self.front, seq)
        else:
            self.back.append((self.log.next_seq, seq))

    def drop_leases(self, below: int | None = None) -> None:
        """Forget the deliveries of seqs below ``below`` (all of them without): their
        tags become unknown, their subscriptions' credit comes back."""
        for seq, lease in list(self.pending.items()):
            if below is None or seq < below:
                if not lease.returning:  # a returned one gave its credit back already
                    lease.sub.unsettled -= 1
                    lease.sub.pool.give_back(lease.sub, lease.weight)
                lease.sub.session.leases.pop(lease.tag, None)
                lease.sub.leases.pop(lease.tag, None)
                del self.pending[seq]

    def advance(self, upto: int) -> None:
        """Settle everything below ``upto`` for this group (a reader that keeps its own
        offsets reports progress); its deliveries below are forgotten."""
        self.drop_leases(upto)
        self.front = _heap([s for s in self.front if s >= upto])
        self.back = deque(b for b in self.back if b[1] >= upto)
        self.delayed = _heap([d for d in self.delayed if d[1] >= upto])
        self.prio = _heap([p for p in self.prio if p[1] >= upto])
        self.sched = _heap([s for s in self.sched if s[1] >= upto])
        self.skip = {s for s in self.skip if s >= upto}
        self._drop_acked_below(upto)
        self.attempts = {s: n for s, n in self.attempts.items() if s >= upto}
        self.cursor = max(self.cursor, upto)
        self.floor = max(self.floor, upto)

    def release_due(self, now: float) -> bool:
        moved = False
        while self.delayed and self.delayed[0][0] <= now:
            _, seq = heapq.heappop(self.delayed)
            heapq.heappush(self.front, seq)
            moved = True
        return moved or bool(self.sched and self.sched[0][0] <= now)

    # -- durability -------------------------------------------------------
    def compute_floor(self) -> int:
        lo = self.cursor
        if self.pending:
            lo = min(lo, min(self.pending))
        for seq in self.front:
            lo = min(lo, seq)
        for _, seq in self.back:
            lo = min(lo, seq)
        for _, seq in self.delayed:
            lo = min(lo, seq)
        is_acked = self.is_acked
        for _, seq in self.prio:
            if seq < lo and not is_acked(seq):
                lo = seq
        for _, seq in self.sched:
            if seq < lo and not is_acked(seq):
                lo = seq
        if lo > self.floor:
            self._drop_acked_below(lo)
            # Entries below the floor are rare (settle drops a seq's attempts): look
            # before rebuilding.
            attempts = self.attempts
            if attempts and min(attempts) < lo:
                self.attempts = {s: a for s, a in attempts.items() if s >= lo}
            if self.skip and min(self.skip) < lo:
                self.skip = {s for s in self.skip if s >= lo}
        self.floor = lo
        if len(self.acked) > FOLD_ACKED:
            self.fold_acked()
        return lo

    def fold_acked(self) -> None:
        """Move the acked set into the runs."""
        if self.acked_runs is _NO_RUNS:
            self.acked_runs = SeqRuns()
        self.acked_runs.add_seqs(self.acked)
        self.runs_hi = self.acked_runs.top
        self.acked = set()

    def _drop_acked_below(self, lo: int) -> None:
        acked = self.acked
        low = min(acked) if acked else lo
        if low < lo:
            # The cheaper of a walk over the seqs dropped and a rebuild of the rest
            if lo - low <= len(acked):
                acked.difference_update(range(low, lo))
            else:
                self.acked = {s for s in acked if s >= lo}
        if self.runs_hi:
            self.acked_runs.drop_below(lo)
            self.runs_hi = self.acked_runs.top
            if not self.runs_hi:
                self.acked_runs = _NO_RUNS

    def durable_state(self) -> tuple[int, bytes]:
        floor = self.compute_floor()
        acked, runs = self.acked, list(self.acked_runs.runs())
        if runs and any(hi - lo == 1 for lo, hi in runs):
            # A run of one seq is smaller as a seq (acks out of order: one gap each)
            acked = [*acked, *(lo for lo, hi in runs if hi - lo == 1)]
            runs = [r for r in runs if r[1] - r[0] > 1]
        state = _State(
            acked=sorted(acked),
            attempts={s: a for s, a in self.attempts.items() if a},
            delayed=list(self.delayed),
            acked_runs=runs,
        )
        return floor, _state_encoder.encode(state)

    def restore(self, floor: int, blob: bytes) -> None:
        state = _state_decoder.decode(blob) if blob else _State()  # an empty stored state
        self.cursor = self.floor = floor
        # A state of an older version has every acked seq in ``acked``: folded here
        # when many, written back as runs at the next commit.
        self.acked = set(state.acked)
        self.acked_runs = (SeqRuns.from_runs(sorted(state.acked_runs)) if state.acked_runs
                           else _NO_RUNS)
        self.runs_hi = self.acked_runs.top
        if len(self.acked) > FOLD_ACKED:
            self.fold_acked()
        self.attempts = dict(state.attempts)
        self.delayed = [tuple(d) for d in state.delayed]  # type: ignore[misc]
        heapq.heapify(self.delayed)
        # Delayed retries are served from their heap, not again by the cursor.
        self.skip = {seq for _, seq in self.delayed}


@dataclass(eq=False)
class Subscription:
    session: Any
    sid: int
    group: Group
    prefetch: int
    lease_s: float
    pool: InFlightBytes
    unsettled: int = 0
    held: int = 0  # bytes of the unsettled deliveries (InFlightBytes)
    paused: bool = False
    active: bool = True
    # Credit only while a request waits (an HTTP long poll); with none, no credit at all.
    on_demand: bool = False
    # Leases in delivery order: with one lease length per subscription this is also
    # expiry order, so expiry scans stop at the first live one (no heap garbage).
    leases: dict[int, Lease] = field(default_factory=dict)

    burst: int = 0  # bytes handed out in the current pump round

    @property
    def credit(self) -> int:
        if self.paused or not self.active or self.burst >= BURST_BYTES:
            return 0
        if self.held >= self.pool.cap:  # InFlightBytes.stops, inlined
            return 0
        return self.prefetch - self.unsettled


@dataclass(frozen=True, slots=True)
class GroupDef:
    """What is persisted about a group."""

    key: str
    kind: str  # "listen" | "consume"
    patterns: tuple[str, ...]


class PatternIndex:
    """The patterns groups read, over every group of a broker (each held for good): how
    many (``total``), and each pattern's prefix -> the groups reading it (``readers``).

    A channel's groups are then a few lookups by its ``match_keys``: trying every group
    against each new channel cost ~8 ms with 20,000 groups (MAX_GROUPS), a stall of the
    whole broker per new channel. A group changes its patterns only through
    ``Group.add_pattern`` and ``Group.set_patterns``, which keep this up to date."""

    __slots__ = ("_ranks", "readers", "total")

    def __init__(self) -> None:
        self.total = 0
        self.readers: dict[str, dict[Group, None]] = {}  # ordered sets: values unused
        self._ranks = 0

    def next_rank(self) -> int:
        self._ranks += 1
        return self._ranks

    def add(self, grp: Group, prefixes: Iterable[str]) -> None:
        readers = self.readers
        for prefix in prefixes:
            bucket = readers.get(prefix)
            if bucket is None:
                readers[prefix] = {grp: None}
            else:
                bucket[grp] = None

    def remove(self, grp: Group, prefixes: Iterable[str]) -> None:
        readers = self.readers
        for prefix in prefixes:
            bucket = readers.get(prefix)
            if bucket is not None:
                bucket.pop(grp, None)
                if not bucket:  # a prefix nobody reads takes no room
                    del readers[prefix]

    def groups_of(self, keys: list[str]) -> list[Group]:
        """The groups reading a channel whose ``match_keys`` are ``keys``, each once, in
        the order the broker took them (``Group.rank``: what a scan of ``groups`` gave;
        delivery order follows the order channels are attached in)."""
        readers = self.readers
        found: list[Group] = []
        several = False
        for key in keys:
            bucket = readers.get(key)
            if bucket:
                several = bool(found)
                found.extend(bucket)
        if len(found) > 1:
            if several:  # a group reading two of them (a/* and a/v1/*) counts once
                found = list(dict.fromkeys(found))
            found.sort(key=_rank)
        return found


def _rank(grp: Group) -> int:
    return grp.rank


@dataclass(eq=False)
class Group:
    key: str
    kind: str
    patterns: list[Pattern]
    gcs: dict[str, GroupChannel] = field(default_factory=dict)
    members: list[Subscription] = field(default_factory=list)
    ready: dict[GroupChannel, None] = field(default_factory=dict)
    rr: int = 0
    # ``patterns`` indexed: a group may read thousands of channels by name (a Spark
    # source positions each), and a scan of them per new channel or per added pattern
    # made a large SUBSCRIBE stall the whole broker. Change patterns only through
    # ``add_pattern`` and ``set_patterns``.
    # Each pattern by its prefix (a name's is the name): a channel matches a group that
    # has one of its ``match_keys``, a few lookups however many wildcards the group has
    # (trying each of 10,000 wildcards of each group stalled every new channel).
    texts: set[str] = field(init=False, repr=False)
    prefixes: set[str] = field(init=False, repr=False)
    # The index of the broker's groups (BrokerState.patterns) once the group is the
    # broker's (``adopt``), this group's own till then; and the group's place in the
    # broker's order of groups (PatternIndex.groups_of).
    index: PatternIndex = field(init=False, repr=False)
    rank: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self.index = PatternIndex()
        self.texts, self.prefixes = set(), set()
        self.set_patterns(self.patterns)

    def adopt(self, index: PatternIndex) -> None:
        """Count and index this group's patterns in ``index`` (the broker's, or a fresh
        one when the broker drops the group) from now on; the group comes last in its
        order."""
        self.index.total -= len(self.patterns)
        self.index.remove(self, self.prefixes)
        index.total += len(self.patterns)
        index.add(self, self.prefixes)
        self.rank = index.next_rank()
        self.index = index

    def set_patterns(self, patterns: list[Pattern]) -> None:
        self.index.total += len(patterns) - len(self.texts)
        old = self.prefixes
        self.patterns = patterns
        self.texts = {p.text for p in patterns}
        self.prefixes = {p.prefix for p in patterns}
        self.index.remove(self, old - self.prefixes)
        self.index.add(self, self.prefixes - old)

    def add_pattern(self, pattern: Pattern) -> bool:
        """Read ``pattern`` too; False if the group reads it already."""
        if pattern.text in self.texts:
            return False
        self.patterns.append(pattern)
        self.texts.add(pattern.text)
        self.prefixes.add(pattern.prefix)
        self.index.total += 1
        self.index.add(self, (pattern.prefix,))
        return True

    def matches(self, channel: str) -> bool:
        return self.matches_keys(match_keys(channel))

    def matches_keys(self, keys: list[str]) -> bool:
        """Whether the group reads a channel whose ``match_keys`` are ``keys``."""
        prefixes = self.prefixes
        return any(k in prefixes for k in keys)

    def definition(self) -> GroupDef:
        return GroupDef(self.key, self.kind, tuple(p.text for p in self.patterns))

    def member_for(self, avoid: int = 0) -> tuple[Subscription, int] | None:
        """The next member with credit in round-robin order (and its index), passing over
        the member whose ``id()`` is ``avoid`` while another has credit. The turn moves
        only when a delivery is made (``Dispatcher._pump_group`` sets ``rr``): a pump
        round that finds nothing to deliver must not use up members' turns."""
        members = self.members
        n = len(members)
        if not n:
            return None
        first = self.rr % n  # the turn's member, most often the one (one per delivery)
        sub = members[first]
        if sub.credit > 0 and not (avoid and id(sub) == avoid):
            return sub, first
        fallback: tuple[Subscription, int] | None = None
        for i in range(n):
            idx = (self.rr + i) % n
            sub = members[idx]
            if sub.credit > 0:
                if avoid and id(sub) == avoid:
                    fallback = (sub, idx)
                    continue
                return sub, idx
        return fallback
