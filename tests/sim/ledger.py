"""The simulator's record of what happened, as clients and the disk saw it: what each
commit made durable, what was confirmed, delivered, settled. The invariants
(``invariants.py``) are checked against it; nothing here reads the broker's memory.

A "run" is one broker process between crashes: delivery tags, leases and attempt
counts seen in memory belong to a run; what was applied to storage outlives them all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from minou.core.log import Msg
from minou.core.writes import WriteBatch
from minou.names import is_dead_letter

from .scenario import Scenario

# (group key, channel, seq): one message as one group reads it
Read = tuple[str, str, int]


@dataclass(frozen=True)
class Stored:
    """A message as a commit made it durable."""

    channel: str
    seq: int
    id: str
    pid: str  # the payload's id: which client send it came from ("" if none)
    published_at: float
    expires_at: float | None
    special: bool  # priority or publish-time delay: served outside seq order
    headers: dict[str, str] | None


@dataclass(frozen=True)
class Sent:
    """One send a client made (a resend has the same pid)."""

    pid: str
    target: str  # a channel or a broadcast pattern
    dedup: str | None
    kind: str  # "plain", "numbered" (producer sequence) or "txn" (staged, fenced)


@dataclass
class Tag:
    """A delivery as the model follows it: live until settled, returned, redelivered,
    or its connection ends."""

    tag: int
    conn: int  # the connection's serial
    sid: int
    group: str
    channel: str
    seq: int
    attempts: int
    expires: float  # when a tick takes the lease back
    weight: int = 0  # what it holds against the in-flight bounds (memory, headers and key)
    live: bool = True

    @property
    def read(self) -> Read:
        return (self.group, self.channel, self.seq)


@dataclass
class DurableGroup:
    """A group's stored state for one channel (``GroupChannel.durable_state``)."""

    floor: int
    acked: frozenset[int]
    attempts: dict[int, int]

    def settled(self, seq: int) -> bool:
        return seq < self.floor or seq in self.acked

    @classmethod
    def decode(cls, floor: int, blob: bytes) -> DurableGroup:
        # The blob is a msgspec array: [acked, attempts, delayed, acked_runs] (core/
        # group.py _State; an older version wrote the first three only).
        fields = msgspec.msgpack.decode(blob) if blob else [[], {}, []]
        acked, attempts = set(fields[0]), fields[1]
        for lo, hi in fields[3] if len(fields) > 3 else ():
            acked.update(range(lo, hi))
        return cls(floor, frozenset(acked), {int(s): int(a) for s, a in attempts.items()})


@dataclass
class Ledger:
    scenario: Scenario
    run: int = 0
    # --- the disk: everything a commit applied
    stored: dict[tuple[str, int], Stored] = field(default_factory=dict)
    by_id: dict[str, tuple[str, int]] = field(default_factory=dict)
    by_pid: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # not dead letters
    live: dict[str, set[int]] = field(default_factory=dict)  # seqs storage holds per channel
    deleted: set[tuple[str, int]] = field(default_factory=set)
    durable: dict[tuple[str, str], DurableGroup] = field(default_factory=dict)
    # original (channel, seq) -> [(reason, group)] of its stored dead letters
    dead: dict[tuple[str, int], list[tuple[str, str]]] = field(default_factory=dict)
    dedup_last: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    reservations: dict[str, str] = field(default_factory=dict)  # exclusive channel -> owner
    groups_defined: set[str] = field(default_factory=set)  # group keys storage holds
    # --- what clients were told
    sent: dict[str, Sent] = field(default_factory=dict)
    confirmed: set[tuple[str, int]] = field(default_factory=set)
    acked: set[Read] = field(default_factory=set)  # acks answered as durable
    ack_issued: set[Read] = field(default_factory=set)  # acks the broker took
    # --- this run's deliveries
    tags: dict[int, Tag] = field(default_factory=dict)
    live_tags: dict[int, Tag] = field(default_factory=dict)
    holder: dict[Read, int] = field(default_factory=dict)  # the latest tag of a read
    attempts: dict[Read, int] = field(default_factory=dict)  # the latest delivery's
    restored_attempts: dict[Read, int] = field(default_factory=dict)  # durable at restart
    seen_attempts: dict[Read, int] = field(default_factory=dict)  # the highest, every run
    # (group, channel) -> (tag, seq) of its first deliveries of plain messages, by tag
    fresh: dict[tuple[str, str], list[tuple[int, int]]] = field(default_factory=dict)
    exceeded: dict[Read, int] = field(default_factory=dict)  # returned past the limit: run
    exceeded_ever: set[Read] = field(default_factory=set)
    returned_from: dict[Read, tuple[int, int]] = field(default_factory=dict)  # (conn, sid)
    drained: set[Read] = field(default_factory=set)  # delivered to the end-of-run readers
    readers: dict[str, str] = field(default_factory=dict)  # this run: exclusive -> client
    max_turn: int = 0  # the most delivery bytes one pump turn wrote
    max_conn_turn: int = 0  # ... to one connection
    # The in-flight pool (core/in_flight.py) is full: set by the delivery that reaches
    # in_flight_bytes, cleared by the settlement that takes it under 7/8 of it.
    in_flight_full: bool = False
    # --- known broker bugs (known.py): which are tolerated, and what they let through
    tolerated: frozenset[str] = frozenset()
    seen_known: dict[str, int] = field(default_factory=dict)

    # ----------------------------------------------------------------- disk
    def store(self, m: Msg) -> Stored:
        pid = _pid(m.data)
        s = Stored(m.channel, m.seq, m.id, pid, m.published_at, m.expires_at, m.special,
                   dict(m.headers) if m.headers else None)
        key = (m.channel, m.seq)
        self.stored[key] = s
        self.by_id[m.id] = key
        self.live.setdefault(m.channel, set()).add(m.seq)
        if is_dead_letter(m.channel):
            h = m.headers or {}
            original = (h.get("x-original-channel", ""), int(h.get("x-original-seq", "0")))
            self.dead.setdefault(original, []).append(
                (h.get("x-dead-reason", ""), h.get("x-dead-group", "")))
        elif pid:
            self.by_pid.setdefault(pid, []).append(key)
        return s

    def apply_rest(self, batch: WriteBatch) -> None:
        """What a commit does besides messages, in storage's order."""
        for channel, seq in batch.deletes:
            self.live.get(channel, set()).discard(seq)
            self.deleted.add((channel, seq))
        for channel, first in batch.truncates.items():
            self.live[channel] = {s for s in self.live.get(channel, ()) if s >= first}
        for key, gdef in batch.group_defs.items():
            if gdef is None:
                self.groups_defined.discard(key)
                self.durable = {k: v for k, v in self.durable.items() if k[0] != key}
            else:
                self.groups_defined.add(key)
        for (group, channel), value in batch.group_states.items():
            if value is None:
                self.durable.pop((group, channel), None)
            else:
                self.durable[(group, channel)] = DurableGroup.decode(*value)

    # ----------------------------------------------------------- deliveries
    def deliver(self, conn: int, sid: int, group: str, lease_s: float, channel: str,
                seq: int, tag: int, attempts: int, now: float, weight: int = 0) -> Tag:
        read = (group, channel, seq)
        before = self.holder.get(read)
        if before is not None:
            self.kill(self.tags[before])
        t = Tag(tag, conn, sid, group, channel, seq, attempts, now + lease_s, weight)
        self.tags[tag] = t
        self.live_tags[tag] = t
        if self.held_total() >= self.scenario.in_flight_bytes:
            self.in_flight_full = True
        self.holder[read] = tag
        self.attempts[read] = attempts
        self.seen_attempts[read] = max(attempts, self.seen_attempts.get(read, 0))
        return t

    def kill(self, t: Tag) -> None:
        t.live = False
        if self.live_tags.pop(t.tag, None) is not None and self.in_flight_full:
            limit = self.scenario.in_flight_bytes
            if self.held_total() < limit - limit // 8:
                self.in_flight_full = False

    def returned(self, t: Tag, *, by_member: bool = False) -> None:
        """A delivery came back unsettled (nack, lease expiry, unsubscribe, disconnect):
        past its channel's requeue limit, the broker must dead-letter it; else, if it
        came back from a member still reading (``by_member``: a nack, a lease that ran
        out), its next delivery should go to another member with credit."""
        self.kill(t)
        if t.attempts > self.scenario.channel_options(t.channel).requeue_limit:
            self.exceeded[t.read] = self.run
            self.exceeded_ever.add(t.read)
        elif by_member:
            self.returned_from[t.read] = (t.conn, t.sid)

    def expire_leases(self, now: float) -> list[Tag]:
        gone = [t for t in self.live_tags.values() if t.expires <= now]
        for t in gone:
            self.returned(t, by_member=True)
        return gone

    def unsettled(self, conn: int, sid: int) -> int:
        return sum(1 for t in self.live_tags.values() if t.conn == conn and t.sid == sid)

    def held(self, conn: int, sid: int) -> int:
        return sum(t.weight for t in self.live_tags.values() if t.conn == conn and t.sid == sid)

    def held_total(self) -> int:
        return sum(t.weight for t in self.live_tags.values())

    def conn_closed(self, conn: int, sid: int | None = None) -> None:
        for t in [t for t in self.live_tags.values()
                  if t.conn == conn and (sid is None or t.sid == sid)]:
            self.returned(t)

    def crashed(self) -> None:
        """The broker process died: every lease and tag of the run went with it."""
        self.run += 1
        self.tags.clear()
        self.live_tags.clear()
        self.in_flight_full = False
        self.holder.clear()
        self.returned_from.clear()
        self.readers.clear()
        self.attempts.clear()
        self.fresh.clear()
        self.restored_attempts = {
            (group, channel, seq): a for (group, channel), d in self.durable.items()
            for seq, a in d.attempts.items()}


def _pid(data: bytes) -> str:
    try:
        value: Any = json.loads(data)
    except ValueError:
        return ""
    return str(value.get("p", "")) if isinstance(value, dict) else ""
