"""Redis replies turned back into what the core reads: pure, no Redis here.

A queue is read in pages (``QueueState``: the ``HEAD`` script's reply, then its
channels, special segments and dedup entries a page at a time); ``shared_snapshot``
reads the shared tables. Everything comes back sorted by key, the order SQLite's tables (by
primary key) give and MemoryStorage copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...core.group import GroupDef
from ...core.seq_runs import SeqRuns
from ...core.snapshot import ChannelRecord, Snapshot
from ...protocol.frames import Send
from ..segments import channel_record, decode_placed

_sends = msgspec.msgpack.Decoder(list[Send])
_NONE_GONE = SeqRuns()  # for a special of a channel the queue does not list
_unpack = msgspec.msgpack.decode


def pairs(flat: list[Any] | dict[Any, Any]) -> list[tuple[Any, Any]]:
    """A hash as pairs: from a script, HGETALL's flat [field, value, ...]; from
    redis-py, a dict."""
    if isinstance(flat, dict):
        return list(flat.items())
    return list(zip(flat[::2], flat[1::2], strict=True))


def text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass
class QueueState:
    """One queue as found: what goes into the snapshot, and what the writer must know.
    Built in steps as the pages of it arrive (``queue_head``, then ``add_channel`` for
    each channel, ``add_specials`` and ``add_dedup`` for each page)."""

    used: int = 0
    channels: list[tuple[int, ChannelRecord]] = field(default_factory=list)  # (born, rec)
    specials: list[tuple[str, int, int, float | None]] = field(default_factory=list)
    group_states: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    dedup: list[tuple[str, str, float, int, str]] = field(default_factory=list)
    producers: list[tuple[Any, ...]] = field(default_factory=list)
    fences: list[tuple[str, str, int]] = field(default_factory=list)
    # channel -> (next seq, first seq, creation order), as the head gave them
    heads: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # channel -> (its first live seq, the seqs gone inside): what a special must be in
    live: dict[str, tuple[int, SeqRuns]] = field(default_factory=dict)

    @property
    def groups(self) -> set[str]:
        return {g for g, *_ in self.group_states}

    @property
    def writers(self) -> set[str]:
        return {w for w, *_ in self.fences}


def queue_head(reply: list[Any]) -> QueueState:
    """A queue from the ``HEAD`` script's reply (scripts.py): all but its channels'
    segments and removed seqs, its special messages and its dedup entries (``whole``
    reads those when the reply has them)."""
    used, nexts, firsts, borns, groups, prods, fences = reply[:7]
    q = QueueState(used=int(used))
    first_of = {text(k): int(v) for k, v in pairs(firsts)}
    born_of = {text(k): int(v) for k, v in pairs(borns)}
    for raw, nxt in pairs(nexts):
        name = text(raw)
        q.heads[name] = (int(nxt), first_of.get(name, 1), born_of.get(name, 0))
    for grp, states in groups:
        for channel, value in pairs(states):
            floor, state = value.split(b":", 1)
            q.group_states.append((text(grp), text(channel), int(floor), state))
    q.producers = [(*_unpack(k), *_unpack(v)) for k, v in pairs(prods)]
    q.fences = [(text(w), text(c), int(b)) for w, hs in fences for c, b in pairs(hs)]
    return q


def whole(q: QueueState, reply: list[Any], now: float) -> bool:
    """The rest of a small queue, when the ``HEAD`` reply has it (``False`` if not:
    the start reads it in pages)."""
    if reply[7] is None:
        return False
    chans, bodies, dedup = reply[7]
    for raw, starts, metas, removed in chans:
        spans = [(int(s), int(m.split(b" ", 1)[0]))
                 for s, m in zip(starts, metas, strict=True) if m is not None]
        add_channel(q, text(raw), spans, SeqRuns.from_sorted(map(int, removed)))  # by seq
    add_specials(q, bodies)
    add_dedup(q, dedup, now)
    return True


def add_channel(q: QueueState, name: str, spans: list[tuple[int, int]],
                removed: SeqRuns) -> None:
    """Channel ``name`` of ``q`` (one of its heads), from its segments' (first, last)
    seqs in order and its removed seqs (taken over: the record's ``gone``)."""
    next_seq, first_seq, born = q.heads[name]
    rec = channel_record(name, next_seq, first_seq, spans, removed)
    q.live[name] = rec.first_seq, rec.gone
    q.channels.append((born, rec))


def add_specials(q: QueueState, bodies: list[bytes]) -> None:
    """The live priority and delayed messages of a page of special segments (after
    every channel of ``q`` is added); their bodies are not kept, nor even copied."""
    for body in bodies:
        for m in decode_placed(body):
            first, gone = q.live.get(m.channel, (None, _NONE_GONE))
            if first is not None and (m.priority > 0 or m.deliver_at is not None) and \
                    m.seq >= first and m.seq not in gone:
                q.specials.append((m.channel, m.seq, m.priority, m.deliver_at))


def add_dedup(q: QueueState, entries: list[Any] | dict[Any, Any], now: float) -> None:
    """A page of the queue's dedup hash: the entries not expired."""
    for key, value in pairs(entries):
        channel, dkey = _unpack(key)
        expires_at, seq, msg_id = _unpack(value)
        if expires_at > now:
            q.dedup.append((channel, dkey, expires_at, seq, msg_id))


def merge(snap: Snapshot, queues: list[QueueState]) -> None:
    """Every queue's part into ``snap``: channels in creation order, the rest by key."""
    snap.channels = [rec for _, rec in sorted(
        (c for q in queues for c in q.channels), key=lambda c: (c[0], c[1].name))]
    # (SSCAN, which pages the special segments, may give a segment twice: once here)
    snap.specials = sorted({s for q in queues for s in q.specials})
    snap.group_states = sorted(s for q in queues for s in q.group_states)
    # (so may HSCAN a dedup entry: a key is once in the hash)
    found = {d[:2]: d for q in queues for d in q.dedup}
    snap.dedup = sorted(snap.dedup + list(found.values()), key=lambda d: d[:2])
    snap.producers = sorted((p for q in queues for p in q.producers), key=lambda p: p[:3])
    snap.fences = sorted(f for q in queues for f in q.fences)


def shared_snapshot(tables: dict[str, list[Any]], tokens: list[tuple[bytes, float]],
                    txns: dict[bytes, list[Any]], dedup: list[Any], now: float) -> Snapshot:
    """The shared tables (HGETALL replies by name), unexpired tokens, staged
    transactions (member -> HGETALL) and pattern dedup entries."""
    t = {name: sorted((text(k), v) for k, v in pairs(flat)) for name, flat in tables.items()}
    snap = Snapshot()
    for key, value in t["groups"]:
        kind, patterns = _unpack(value)[:2]  # a third field (start) is no longer read
        snap.groups.append(GroupDef(key, kind, tuple(patterns)))
    snap.clients = [v for _, v in t["clients"]]
    snap.credentials = [v for _, v in t["credentials"]]
    snap.reservations = {k: text(v) for k, v in t["reservations"]}
    snap.writers = {k: text(v) for k, v in t["writers"]}
    snap.meta = {k: text(v) for k, v in t["meta"]}
    snap.used_tokens = sorted((text(j), float(e)) for j, e in tokens if float(e) > now)
    staged = []
    for raw, parts in txns.items():
        owner, txn = _unpack(raw)
        for part, value in pairs(parts):
            body, at = _unpack(value)
            n = int(part)
            staged.append((owner, txn, n, _sends.decode(body) if n else _unpack(body), at))
    snap.staged = sorted(staged, key=lambda s: s[:3])
    for key, value in pairs(dedup):
        channel, dkey = _unpack(key)
        expires_at, seq, msg_id = _unpack(value)
        if expires_at > now:
            snap.dedup.append((channel, dkey, expires_at, seq, msg_id))
    return snap
