"""What one storage transaction must make durable (group commit).

A commit that fails (a full disk) wrote nothing. Its publishes are dropped and
their publishers told (``publishes``); everything else is state the broker's
memory already holds, so it is carried into the next batch (``carry``) and
written with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RequestError
from ..protocol.frames import Send
from .group import GroupDef
from .log import Msg


@dataclass(eq=False)
class WriteBatch:
    messages: list[Msg] = field(default_factory=list)
    deletes: list[tuple[str, int]] = field(default_factory=list)  # one message each
    truncates: dict[str, int] = field(default_factory=dict)  # channel -> new first seq
    # channel -> next seq to assign; present for new channels and whenever messages are
    # removed (otherwise storage derives it from the highest stored seq)
    channels: dict[str, int] = field(default_factory=dict)
    # Channels whose record goes too (removed by idle expiry, truncated whole before or
    # in this batch): nothing of them stays, not even their next seq.
    forgets: list[str] = field(default_factory=list)
    group_defs: dict[str, GroupDef | None] = field(default_factory=dict)  # None: delete
    group_states: dict[tuple[str, str], tuple[int, bytes] | None] = field(default_factory=dict)
    dedup: list[tuple[str, str, float, int, str]] = field(default_factory=list)
    clients: dict[str, bytes | None] = field(default_factory=dict)  # key registry; None: drop
    # delegated credentials (auth.credentials) by id; None: drop
    credentials: dict[str, bytes | None] = field(default_factory=dict)
    reservations: dict[str, str | None] = field(default_factory=dict)  # channel -> owner
    fences: dict[tuple[str, str], int] = field(default_factory=dict)  # (writer, channel) -> batch
    writers: dict[str, str | None] = field(default_factory=dict)  # writer id -> owner; None: free
    dropped_fences: list[str] = field(default_factory=list)  # writer ids whose fences go
    meta: dict[str, str | None] = field(default_factory=dict)  # None: drop the row
    used_tokens: list[tuple[str, float]] = field(default_factory=list)  # jti, expires
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    # (channel, seq) of messages that are dead letters moved back: counted as requeued
    requeued: set[tuple[str, int]] = field(default_factory=set)
    # Beside on_commit, one each: called instead if the commit fails (None: that
    # callback waits for the commit that carries this batch's state).
    on_fail: list[Callable[[RequestError], None] | None] = field(default_factory=list)
    publishes: list[Msg] = field(default_factory=list)  # messages a publisher waits for
    fence_undo: dict[tuple[str, str], int | None] = field(default_factory=dict)  # before
    # Producer states to store, taken from the core at hand-over: key -> row (None: drop)
    producers: dict[tuple[str, str, str], tuple[Any, ...] | None] = field(default_factory=dict)
    # Staged transactions are stored, so a broker restart between a writer's STAGE and
    # its TXN_COMMIT loses nothing: parts to add (owner, txn, part, sends, touched) and
    # transactions to drop (committed, aborted, expired), written after the parts.
    staged: list[tuple[str, str, int, list[Send], float]] = field(default_factory=list)
    unstaged: list[tuple[str, str]] = field(default_factory=list)
    # committed transactions' answers (owner, txn, result, when), written after unstaged
    txn_done: list[tuple[str, str, dict[str, Any], float]] = field(default_factory=list)
    # (producer state, sequence) of each numbered publish staged in this batch: if the
    # commit fails, those sequences become refusals (a resend gets the same error)
    sequenced: list[tuple[Any, int]] = field(default_factory=list)
    bytes: int = 0
    specials: int = 0  # messages with a priority or a delay in ``messages`` (not stored)
    number: int = 0  # set when the writer takes it: commits are numbered in order
    # Set when the writer takes it: None, the batch is on the disk before anything
    # waiting for it is answered (fsync); else every channel it writes to has
    # durability "interval" and its fsync may come this many seconds after.
    sync_within: float | None = None

    @property
    def registry_writes(self) -> bool:
        """Whether it writes state that belongs to no channel (identities, fences,
        transactions, group definitions): always made durable before the answer."""
        return bool(
            self.group_defs or self.clients or self.credentials or self.reservations
            or self.fences or self.writers or self.dropped_fences or self.meta
            or self.used_tokens or self.staged or self.unstaged or self.txn_done)

    def channel_names(self) -> set[str]:
        """Every channel this batch writes something of."""
        names = {m.channel for m in self.messages}
        names.update(c for c, _ in self.deletes)
        names.update(self.truncates)
        names.update(self.channels)
        names.update(self.forgets)
        names.update(c for _, c in self.group_states)
        names.update(d[0] for d in self.dedup)
        names.update(k[2] for k in self.producers)
        return names

    def __bool__(self) -> bool:
        return self.writes or bool(self.on_commit)

    @property
    def writes(self) -> bool:
        """Whether there is anything to store (a batch may carry only answers waiting
        for the commits before it)."""
        return bool(
            self.messages or self.deletes or self.truncates or self.channels or self.forgets
            or self.group_defs
            or self.group_states or self.dedup or self.clients or self.credentials
            or self.reservations
            or self.fences or self.writers or self.dropped_fences or self.meta
            or self.used_tokens or self.producers or self.staged or self.unstaged
            or self.txn_done
        )

    def carry(self, failed: WriteBatch, messages: list[Msg]) -> None:
        """Take on the state of ``failed``, an earlier batch whose commit wrote nothing,
        so that this batch writes both: where both set one key, this (newer) batch's
        value wins. ``messages``: those of ``failed`` still to write (no publisher
        waits for them: dead letters, requeues). Its dedup entries and fences went
        with its publishes, and its callbacks are the caller's."""
        self.messages[:0] = messages
        self.deletes[:0] = failed.deletes
        self.requeued |= failed.requeued
        for name, first in failed.truncates.items():
            self.truncates[name] = max(first, self.truncates.get(name, first))
        for name, next_seq in failed.channels.items():
            self.channels[name] = max(next_seq, self.channels.get(name, next_seq))
        for mine, theirs in ((self.group_defs, failed.group_defs),
                             (self.group_states, failed.group_states),
                             (self.clients, failed.clients),
                             (self.credentials, failed.credentials),
                             (self.reservations, failed.reservations),
                             (self.writers, failed.writers), (self.meta, failed.meta),
                             (self.producers, failed.producers)):
            for key, value in theirs.items():
                mine.setdefault(key, value)  # type: ignore[attr-defined]
        self.forgets[:0] = failed.forgets  # (Commits.on_failed drops those made again)
        self.dropped_fences[:0] = failed.dropped_fences
        self.used_tokens[:0] = failed.used_tokens
        self.staged[:0] = failed.staged
        self.unstaged[:0] = failed.unstaged
