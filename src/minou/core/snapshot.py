"""What storage gives back at start: everything the core needs to rebuild its state.

It belongs to the core's side of the storage port (as ``writes.WriteBatch``, what the
core hands storage to make durable): every backend produces one, the core consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .group import GroupDef


@dataclass
class ChannelRecord:
    name: str
    next_seq: int
    first_seq: int
    count: int
    bytes: int = 0
    gone: list[int] = field(default_factory=list)  # deleted seqs inside [first_seq, next_seq)


@dataclass
class Snapshot:
    """Everything the core needs to rebuild its state after a restart."""

    channels: list[ChannelRecord] = field(default_factory=list)
    specials: list[tuple[str, int, int, float | None]] = field(default_factory=list)
    groups: list[GroupDef] = field(default_factory=list)
    group_states: list[tuple[str, str, int, bytes]] = field(default_factory=list)
    dedup: list[tuple[str, str, float, int, str]] = field(default_factory=list)
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
