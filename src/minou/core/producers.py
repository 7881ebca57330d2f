"""Idempotent producers: each client connection's publishes carry a sequence number
per channel, and the broker keeps the last one per (client, producer id, channel).

A resend of a sequence already handled (the client reconnected and sends again what
was never confirmed) is answered from this state instead of being stored twice; a
sequence past the next one means messages between were lost on the way and is
refused. As Kafka's idempotent producer, the cost is one small record per producer
and channel, whatever the rate: no key per message.

The state lives in memory and is written with the messages it describes (same
commit), so it survives a kill -9 exactly as they do. No I/O here.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import OutOfSequence
from ..limits import MAX_REFUSED_RANGES
from ..protocol.frames import Outcome

# A producer id is broker-made (16 hex digits) but a client presents it again: bounded
# and plain, so it is safe in a storage key and a log line.
PRODUCER_ID = re.compile(r"[0-9a-f]{16}")

Key = tuple[str, str, str]  # client id, producer id, channel
_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder(list[tuple[int, int, int, str]]).decode


@dataclass(eq=False, slots=True)
class ProducerState:
    """One (client, producer id, channel). ``last`` is the highest sequence handled
    (stored or refused). Stored messages of one producer on one channel usually get
    consecutive seqs (a run): ``run_pseq..run_last`` were stored at ``run_seq`` on, so
    a replay of any of them is answered with its own seq and id."""

    key: Key
    last: int = 0
    run_pseq: int = 0  # 0: no run known
    run_last: int = 0
    run_seq: int = 0
    id_hash: str = ""  # the 16 hex digits that start the run's message ids
    used: float = 0.0
    # (first, last, code, text): sequences refused, so a replay gets the same answer
    refused: list[tuple[int, int, int, str]] = field(default_factory=list)
    evicted: bool = False
    moved: bool = False  # its queue went to another broker: never brought back
    written: bool = False  # has (or will have, with the next commit) a stored row

    def row(self) -> tuple[Any, ...]:
        return (*self.key, self.last, self.run_pseq, self.run_last, self.run_seq,
                self.id_hash, self.used, _pack(self.refused) if self.refused else None)

    def stored(self, pseq: int, seq: int, msg_id: str) -> None:
        self.last = pseq
        if not seq:  # a broadcast that reached no channel: nothing to point at
            self.run_pseq = self.run_last = self.run_seq = 0  # (id_hash is read with a run only)
            return
        if (pseq == self.run_last + 1 and seq == self.run_seq + (pseq - self.run_pseq)
                and self.run_pseq and msg_id.startswith(self.id_hash)):
            self.run_last = pseq
            return
        self.run_pseq = self.run_last = pseq
        self.run_seq = seq
        self.id_hash = msg_id[:16]

    def refuse(self, first: int, last: int, code: int, text: str) -> None:
        self.last = max(self.last, last)
        if self.run_pseq and first <= self.run_last:  # the run no longer holds (rollback)
            if first <= self.run_pseq:
                self.run_pseq = self.run_last = self.run_seq = 0
            else:
                self.run_last = first - 1
        merged = self.refused[-1] if self.refused else None
        if merged is not None and merged[1] + 1 == first and merged[2:] == (code, text):
            self.refused[-1] = (merged[0], last, code, text)
        else:
            self.refused.append((first, last, code, text))
            del self.refused[:-MAX_REFUSED_RANGES]

    def replay(self, pseq: int, channel: str) -> Outcome:
        """The answer for a sequence already handled."""
        for first, last, code, text in self.refused:
            if first <= pseq <= last:
                return Outcome(channel=channel, code=code, error=text)
        if self.run_pseq and self.run_pseq <= pseq <= self.run_last:
            seq = self.run_seq + (pseq - self.run_pseq)
            return Outcome(seq=seq, id=f"{self.id_hash}{seq:x}", channel=channel,
                           duplicate=True)
        # Stored before the run this state still describes: a duplicate all the same,
        # but its seq is no longer known.
        return Outcome(channel=channel, duplicate=True)


class Producers:
    """Every known producer state, bounded: past ``max_states`` the least recently
    used go, and any unused for ``idle`` seconds. A producer whose state went
    starts afresh (its next sequence is accepted whatever it is)."""

    def __init__(self, max_states: int, idle: float) -> None:
        self.max_states = max_states
        self.idle = idle
        self.states: dict[Key, ProducerState] = {}
        self.dirty: dict[ProducerState, None] = {}
        self.evicted = 0  # states dropped under max_states (counted for metrics)
        self.gone: list[Key] = []  # evicted or expired: their rows are deleted

    def __len__(self) -> int:
        return len(self.states)

    def state(self, key: Key, now: float, known: ProducerState | None = None) -> ProducerState:
        """The state of ``key`` (``known``: one a session held, brought back if it was
        evicted meanwhile, so what it knows is not lost while its producer is alive)."""
        state = self.states.get(key)
        if state is None:
            if known is not None and known.key == key and not known.moved:
                state = known
                state.evicted = False
                self.gone = [k for k in self.gone if k != key]
            else:
                state = ProducerState(key)
            self.states[key] = state
            state.used = now
            if len(self.states) > self.max_states:
                self._evict()
        state.used = now
        return state

    def check(self, state: ProducerState, pseq: int, channel: str) -> Outcome | None:
        """None if ``pseq`` is the next sequence (or the state is new); the replayed
        answer if it was handled already; OutOfSequence if sequences were skipped (the
        publish's outcome: its code and message, no detail, reach the client)."""
        if pseq <= 0:
            raise OutOfSequence(f"sequence {pseq} is not a positive number")
        if not state.last or pseq == state.last + 1:
            return None
        if pseq <= state.last:
            return state.replay(pseq, channel)
        raise OutOfSequence(
            f"producer {state.key[1]} skipped sequences on {channel!r}: expected "
            f"{state.last + 1}, got {pseq}: messages {state.last + 1}..{pseq - 1} never "
            "reached the broker")

    def mark(self, state: ProducerState) -> None:
        state.written = True
        self.dirty[state] = None

    def take(self) -> dict[Key, tuple[Any, ...] | None]:
        """Rows to write (None: delete), for the next commit."""
        rows: dict[Key, tuple[Any, ...] | None] = {key: None for key in self.gone}
        for state in self.dirty:
            if not state.evicted:
                rows[state.key] = state.row()
        self.gone = []
        self.dirty = {}
        return rows

    def expire(self, now: float) -> int:
        """Drop the states unused for ``idle`` seconds; return how many."""
        old = [s for s in self.states.values() if now - s.used > self.idle]
        for state in old:
            self._drop(state)
        return len(old)

    def _evict(self) -> None:
        # A tenth at once, so the cost is paid once per many new states.
        n = max(1, len(self.states) - self.max_states + self.max_states // 10)
        for state in heapq.nsmallest(n, self.states.values(), key=lambda s: s.used):
            self._drop(state)
            self.evicted += 1

    def _drop(self, state: ProducerState) -> None:
        del self.states[state.key]
        state.evicted = True
        self.dirty.pop(state, None)
        if state.written:  # a row to delete (none for a state only ever refused)
            self.gone.append(state.key)

    def release(self, channels: set[str]) -> int:
        """The queue of ``channels`` moved to another broker: forget their states
        without deleting their rows (the new owner reads them). Returns how many."""
        moved = [s for key, s in self.states.items() if key[2] in channels]
        for state in moved:
            del self.states[state.key]
            self.dirty.pop(state, None)
            state.evicted = state.moved = True
        return len(moved)

    def load(self, rows: list[tuple[Any, ...]], now: float) -> None:
        for client, producer, channel, last, run_pseq, run_last, run_seq, id_hash, used, \
                refused in rows:
            if now - used > self.idle:
                self.gone.append((client, producer, channel))
                continue
            key = (client, producer, channel)
            self.states[key] = ProducerState(
                key, last, run_pseq, run_last, run_seq, id_hash, used,
                [tuple(r) for r in _unpack(refused)] if refused else [], written=True)
