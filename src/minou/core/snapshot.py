"""What storage gives back at start: everything the core needs to rebuild its state.

It belongs to the core's side of the storage port (as ``writes.WriteBatch``, what the
core hands storage to make durable): every backend produces one, the core consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .dedup import DedupRows
from .group import GroupDef
from .seq_runs import SeqRuns
from .stream_ids import parse_point_key


@dataclass
class ChannelRecord:
    name: str
    next_seq: int
    first_seq: int
    count: int
    bytes: int = 0
    # deleted seqs inside [first_seq, next_seq), as runs: the core adopts it as it is
    gone: SeqRuns = field(default_factory=SeqRuns)

    def __post_init__(self) -> None:
        if not isinstance(self.gone, SeqRuns):  # seqs in any order (tests, tools)
            self.gone = SeqRuns(self.gone)


@dataclass
class Snapshot:
    """Everything the core needs to rebuild its state after a restart."""

    channels: list[ChannelRecord] = field(default_factory=list)
    specials: list[tuple[str, int, int, float | None]] = field(default_factory=list)
    groups: list[GroupDef] = field(default_factory=list)
    group_states: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    # (channel, key, expires_at, seq, id); SQLite gives them as compact columns
    dedup: list[tuple[str, str, float, int, str]] | DedupRows = field(default_factory=list)
    clients: list[bytes] = field(default_factory=list)  # encoded auth.registry.ClientRecord
    credentials: list[bytes] = field(default_factory=list)  # encoded auth.credentials.Credential
    reservations: dict[str, str] = field(default_factory=dict)  # exclusive channel -> owner
    fences: list[tuple[str, str, int]] = field(default_factory=list)  # writer, channel, batch
    writers: dict[str, str] = field(default_factory=dict)  # writer id -> the client owning it
    meta: dict[str, str] = field(default_factory=dict)  # format markers (e.g. key migrations)
    used_tokens: list[tuple[str, float]] = field(default_factory=list)  # jti, expires (unexpired)
    # core.producers.ProducerState.row() of every stored idempotent producer state
    producers: list[tuple[Any, ...]] = field(default_factory=list)
    # staged transactions: (owner, txn, part, sends, touched), in part order
    staged: list[tuple[str, str, int, list[Any], float]] = field(default_factory=list)


def queue_of(channel: str) -> str | None:
    """The queue (``endpoint/version``) a channel or its dead letters belong to: the
    unit one broker owns. None for what names no single queue (a broadcast pattern's
    dedup entries: shared)."""
    body = channel[len("_dead/"):] if channel.startswith("_dead/") else channel
    parts = body.split("/", 2)
    if len(parts) < 3 or any(c in body for c in "*>"):
        return None
    return f"{parts[0]}/{parts[1]}"


def queue_part(snap: Snapshot, queue: str) -> Snapshot:
    """What of ``snap`` belongs to ``queue`` alone (what ``Storage.open_queue`` returns),
    with the group definitions (shared, but needed to read its group states)."""
    def mine(channel: str) -> bool:
        return queue_of(channel) == queue

    return Snapshot(
        channels=[c for c in snap.channels if mine(c.name)],
        specials=[s for s in snap.specials if mine(s[0])],
        groups=list(snap.groups),
        group_states=[g for g in snap.group_states if mine(g[1])],
        dedup=[d for d in snap.dedup if mine(d[0])],
        fences=[f for f in snap.fences if mine(f[1])],
        producers=[p for p in snap.producers if mine(p[2])],
        meta={k: v for k, v in snap.meta.items()
              if (point := parse_point_key(k)) is not None and mine(point[0])},
    )


def shared_part(snap: Snapshot) -> Snapshot:
    """What of ``snap`` no one queue owns (what ``Storage.open_shared`` returns)."""
    return Snapshot(
        groups=list(snap.groups), dedup=[d for d in snap.dedup if queue_of(d[0]) is None],
        clients=list(snap.clients), credentials=list(snap.credentials),
        reservations=dict(snap.reservations), writers=dict(snap.writers),
        meta={k: v for k, v in snap.meta.items() if parse_point_key(k) is None},
        used_tokens=list(snap.used_tokens), staged=list(snap.staged),
    )
