"""A WriteBatch turned into what the scripts run: one op list per queue, one shared.

Pure: no Redis here. The planner checks and encodes everything before anything is
sent, so a batch that cannot be stored (a body msgspec cannot encode, a channel never
created) fails with nothing written, as in SQLite. Ops are flat argument lists (an op
name, then its fixed arguments) that the Lua scripts walk in order; the order inside
a queue is SQLite's (messages before deletes and truncates, a group's deletion before
its new states, dropped fences before new ones; shared: staged parts, then unstaged,
then answers).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...core.log import Msg
from ...core.stream_ids import parse_point_key
from ...core.writes import WriteBatch
from ...errors import StorageUnavailable
from ..segments import encode, runs
from .keys import queue_of

RECORD_BYTES = 64  # a record's keys and bookkeeping, roughly: the scripts count the same
_pack = msgspec.msgpack.Encoder().encode



def txn_member(owner: str, txn: str) -> bytes:
    return _pack([owner, txn])


@dataclass
class Plan:
    queues: dict[str, list[Any]] = field(default_factory=dict)  # queue -> ops
    shared: list[Any] = field(default_factory=list)
    created: dict[str, int] = field(default_factory=dict)  # new channel -> creation order
    forgotten: list[str] = field(default_factory=list)  # channels whose record goes
    inserting: set[str] = field(default_factory=set)  # queues receiving messages
    grow: int = 0  # bytes the batch may add, at most (the quota is checked on it)
    group_queues: dict[str, set[str]] = field(default_factory=dict)  # states written
    writer_queues: dict[str, set[str]] = field(default_factory=dict)  # fences written

    def ops(self, queue: str | None) -> list[Any]:
        return self.shared if queue is None else self.queues.setdefault(queue, [])

    def add(self, queue: str | None, op: str, *args: Any) -> None:
        ops = self.ops(queue)
        ops.append(op)
        ops.extend(args)
        if op not in ("D", "T", "CX", "GX", "GD", "XP", "RD", "FX", "HD", "TP", "UT", "ID"):
            self.grow += RECORD_BYTES + sum(len(a) for a in args if isinstance(a, str | bytes))
        elif op == "D":
            self.grow += RECORD_BYTES


def _queue(channel: str) -> str:
    queue = queue_of(channel)
    if queue is None:
        raise StorageUnavailable(f"commit failed: {channel!r} is no channel of a queue")
    return queue


def _float(value: float) -> str:
    return repr(float(value))


def plan(batch: WriteBatch, *, known: set[str], next_order: int,
         group_queues: dict[str, set[str]], writer_queues: dict[str, set[str]]) -> Plan:
    """The ops for ``batch``. ``known``: channels this storage knows exist;
    ``group_queues``/``writer_queues``: where each group's states and each writer's
    fences may be (a deletion is sent there). Raises StorageUnavailable (nothing sent)
    for what cannot be stored."""
    p = Plan()
    try:
        _channels(p, batch, known, next_order)
        _messages(p, batch.messages)
        _removals(p, batch, known)
        _groups(p, batch, group_queues)
        _dedup(p, batch)
        _producers(p, batch)
        _fences(p, batch, writer_queues)
        _shared(p, batch)
    except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as exc:
        raise StorageUnavailable(f"commit failed: {exc}") from exc
    return p


def _channels(p: Plan, batch: WriteBatch, known: set[str], order: int) -> None:
    removing = set(batch.truncates) | {c for c, _ in batch.deletes}
    for name, next_seq in batch.channels.items():
        if name not in known:
            p.created[name] = order
            order += 1
        p.add(_queue(name), "C", name, int(next_seq), p.created.get(name, 0),
              "1" if name in removing else "")
    unknown = ({m.channel for m in batch.messages} | set(batch.truncates)) - known - set(
        p.created)
    if unknown:  # a core bug: a channel's first write must carry its next seq
        raise StorageUnavailable(f"batch writes to channels storage does not know: "
                                 f"{sorted(unknown)[:5]} (no next_seq given)")


def _messages(p: Plan, messages: list[Msg]) -> None:
    by_channel: dict[str, list[Msg]] = {}
    for m in messages:
        by_channel.setdefault(m.channel, []).append(m)
    for name, msgs in by_channel.items():
        queue = _queue(name)
        p.inserting.add(queue)
        for run in runs(msgs):
            expires = [m.expires_at for m in run if m.expires_at is not None]
            special = any(m.priority or m.deliver_at is not None for m in run)
            # The expiry slot also says "special" (a leading "!"), so one op holds both.
            exp = _float(min(expires)) if expires else ""
            p.add(queue, "S", name, run[0].seq, run[-1].seq, _float(run[0].published_at),
                  ("!" if special else "") + exp, encode(run))


def _removals(p: Plan, batch: WriteBatch, known: set[str]) -> None:
    # Stored: known, or created by this batch (not ``known | created``: a copy of every
    # channel's name per commit, ~2 ms on the loop at 100,000 channels).
    created = p.created
    for name, seq in batch.deletes:
        if name in known or name in created:  # one never stored has nothing to delete
            p.add(_queue(name), "D", name, int(seq))
    for name, first in batch.truncates.items():
        p.add(_queue(name), "T", name, int(first))
    for name in batch.forgets:
        if name in known or name in created:
            p.add(_queue(name), "CX", name)
            p.forgotten.append(name)


def _groups(p: Plan, batch: WriteBatch, group_queues: dict[str, set[str]]) -> None:
    for key, gdef in batch.group_defs.items():
        if gdef is None:
            for queue in sorted(group_queues.get(key, ())):
                p.add(queue, "GX", key)
            p.add(None, "HD", "groups", key)
        else:
            p.add(None, "H", "groups", key, _pack([gdef.kind, list(gdef.patterns)]))
    for (grp, channel), value in batch.group_states.items():
        queue = _queue(channel)
        if value is None:
            p.add(queue, "GD", grp, channel)
        else:
            floor, state = value
            p.add(queue, "G", grp, channel, b"%d:" % int(floor) + bytes(state))
            p.group_queues.setdefault(grp, set()).add(queue)


def _dedup(p: Plan, batch: WriteBatch) -> None:
    places: set[str | None] = set()
    for channel, key, expires_at, seq, msg_id in batch.dedup:
        queue = queue_of(channel)
        places.add(queue)
        p.add(queue, "X", _pack([channel, key]), _float(expires_at),
              _pack([float(expires_at), int(seq), msg_id]))
    if batch.dedup:
        # As SQLite: entries an hour past the oldest expiry being written are surely dead.
        cutoff = _float(batch.dedup[0][2] - 3600)
        for queue in places:
            p.add(queue, "XP", cutoff)


def _producers(p: Plan, batch: WriteBatch) -> None:
    for key, row in batch.producers.items():
        queue = _queue(key[2])
        if row is None:
            p.add(queue, "RD", _pack(list(key)))
        else:  # ``used`` (the ninth column) is a REAL in SQLite: stored as a float
            p.add(queue, "R", _pack(list(row[:3])),
                  _pack([*row[3:8], float(row[8]), *row[9:]]))


def _fences(p: Plan, batch: WriteBatch, writer_queues: dict[str, set[str]]) -> None:
    for writer in batch.dropped_fences:
        for queue in sorted(writer_queues.get(writer, ())):
            p.add(queue, "FX", writer)
    for (writer, channel), number in batch.fences.items():
        queue = _queue(channel)
        p.add(queue, "F", writer, channel, int(number))
        p.writer_queues.setdefault(writer, set()).add(queue)


def _put_or_drop(p: Plan, table: str, changes: Iterable[tuple[str, Any]]) -> None:
    for key, value in changes:
        if value is None:
            p.add(None, "HD", table, key)
        else:
            p.add(None, "H", table, key, value)


def _shared(p: Plan, batch: WriteBatch) -> None:
    _put_or_drop(p, "clients", batch.clients.items())
    _put_or_drop(p, "credentials", batch.credentials.items())
    _put_or_drop(p, "writers", batch.writers.items())
    shared_meta = []
    for key, value in batch.meta.items():
        point = parse_point_key(key)
        if point is None:
            shared_meta.append((key, value))
        elif value is None:  # a queue's own: written atomically with its messages
            p.add(_queue(point[0]), "ID", key)
        else:
            p.add(_queue(point[0]), "I", key, value)
    _put_or_drop(p, "meta", shared_meta)
    for jti, expires in batch.used_tokens:
        p.add(None, "TK", jti, _float(expires))
    if batch.used_tokens:  # every token lives at most an hour (as SQLite prunes)
        p.add(None, "TP", _float(min(e for _, e in batch.used_tokens) - 3600))
    _put_or_drop(p, "reservations", batch.reservations.items())
    for owner, txn, part, sends, at in batch.staged:
        p.add(None, "ST", txn_member(owner, txn), int(part), _pack([encode(sends), float(at)]))
    for owner, txn in batch.unstaged:
        p.add(None, "UT", txn_member(owner, txn))
    for owner, txn, result, at in batch.txn_done:  # part 0: the commit's answer
        p.add(None, "ST", txn_member(owner, txn), 0, _pack([_pack(result), float(at)]))
