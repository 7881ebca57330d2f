"""The storage interface: small, blocking, called from one writer thread.

The broker core keeps the working state in memory; storage makes it durable
and gives it back at start (``open``) and when a reader falls behind the body
cache (``read_range``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..core.log import Msg
from ..core.snapshot import ChannelRecord, Snapshot
from ..core.writes import WriteBatch

__all__ = ["ChannelRecord", "Housekeeping", "Snapshot", "Storage", "Syncing"]


class Storage(Protocol):
    path: str  # where it lives, for messages (a file, a URL)
    backend: str  # "sqlite", "memory", ...
    max_size: int | None  # the quota in bytes (None: the disk); the server may change it

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

    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int,
                   max_bytes: int | None = None) -> list[Msg]:
        """Live messages with ``from_seq <= seq < to_seq`` in seq order, at most
        ``limit``; with ``max_bytes``, the page ends with the message that brings its
        ``core.log.read_weight`` (payload, headers, names) to that many bytes (so it
        holds at least one; ``core.log.page_end`` says where the next page starts)."""

    def expired(self, now: float, limit: int) -> list[Msg]:
        """Messages whose TTL has passed (with their bodies, to dead-letter them)."""

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        """For retention: one past the last seq < ``below`` published before ``cutoff``."""

    def size_bytes(self) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class Housekeeping(Protocol):
    """An optional capability: a backend with a write-ahead log to fold back in the
    background (SQLite). The server runs it beside the writer when it is there."""

    def checkpoint(self, truncate: bool = False, *, restart: bool = False) -> None:
        """Housekeeping the writer should not wait for (SQLite: WAL checkpoint);
        ``truncate``: the broker is idle, give the disk back too; ``restart``: the log
        crowds the disk, start it over now rather than at its threshold."""

    def wal_bytes(self) -> int:
        """Bytes waiting in the write-ahead log."""

    def keeps_wal(self) -> bool:
        """Whether the log's file is kept while idle (``truncate`` then frees nothing):
        the disk has room to spare."""

    def wal_moved(self) -> str:
        """Why the log's file at its path is not the one being written ("" while it is):
        removed or replaced under the broker."""

    def check_wal_in_place(self) -> None:
        """Raise StorageUnavailable if the log's file was removed or replaced, once what
        the log holds is copied into the database file."""


@runtime_checkable
class Syncing(Protocol):
    """An optional capability: a backend that can commit a batch whose ``sync_within``
    is set (every channel it writes has durability "interval") to the OS only, and make
    it durable on the disk later, in one go with every such commit before it (SQLite).
    A backend without it makes every batch durable in ``apply``."""

    def sync(self) -> None:
        """Make every commit ``apply`` returned from so far durable on the disk (called
        from a thread of its own, beside the writer). Raises OSError if the disk
        failed: what was written may be lost, the broker must stop."""

    def unsynced(self) -> bool:
        """Whether some commit is on the OS but not yet known to be on the disk."""

    def apply_now(self, batch: WriteBatch) -> bool:
        """Commit ``batch`` to the OS only, from the caller's own thread (the event
        loop: local writes, no fsync, no network), unless it would have to wait
        (SQLite: a checkpoint shuts writers out): False then, and nothing was done.
        ``sync`` then makes it durable (at once for a batch without ``sync_within``)."""

    def close_here(self) -> None:
        """Close what ``apply_now`` opened on the calling thread (its connection), and
        nothing else: ``close`` on the writer's thread closes the rest."""
