"""The storage interface: small, blocking, called from one writer thread.

The broker core keeps the working state in memory; storage makes it durable
and gives it back at start (``open``) and when a reader falls behind the body
cache (``read_range``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.group import GroupDef
from ..core.log import Msg
from ..core.writes import WriteBatch


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
    tail: list[Msg] = field(default_factory=list)  # recent bodies to warm the cache
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


class Storage(Protocol):
    path: str

    def open(self, now: float) -> Snapshot: ...

    def apply(self, batch: WriteBatch) -> None:
        """Make the whole batch durable in one transaction, or raise StorageError
        (StorageFull: the disk or the quota is full; nothing of the batch was written)."""

    def space(self) -> dict[str, Any]:
        """Free space as the writer sees it: ``free``, ``disk_free``, ``used``, ``max_size``."""

    def probe(self) -> tuple[bool, dict[str, Any]]:
        """After StorageFull: whether there is room again (and the space seen)."""

    def full_message(self, space: dict[str, Any], cause: str = ...) -> str:
        """The refusal text while full: the data directory and its free space."""

    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int) -> list[Msg]:
        """Live messages with ``from_seq <= seq < to_seq`` in seq order, at most ``limit``."""

    def expired(self, now: float, limit: int) -> list[Msg]:
        """Messages whose TTL has passed (with their bodies, to dead-letter them)."""

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        """For retention: one past the last seq < ``below`` published before ``cutoff``."""

    def checkpoint(self, truncate: bool = False) -> None:
        """Housekeeping the writer should not wait for (SQLite: WAL checkpoint)."""

    def wal_bytes(self) -> int:
        """Bytes waiting in a write-ahead log, if the backend has one (else 0)."""

    def size_bytes(self) -> int: ...

    def close(self) -> None: ...
