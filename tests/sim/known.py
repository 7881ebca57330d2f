"""Broker bugs the simulator found and that are not fixed yet. Each is named here with
what it breaks; a run tolerates the ones it is given (the CI budget tolerates them
all, so that it guards everything else), and counts how often each was met.
``python -m tests.sim --strict`` tolerates none: a known bug then fails its seed, and
``test_sim.py`` keeps one reproduction of each as an expected failure, which starts
passing (and must be removed) once the bug is fixed.

A workaround changes only what the simulator checks or what its storage returns,
never the broker.
"""

from __future__ import annotations

from minou.core.snapshot import Snapshot
from minou.storage.memory import MemoryStorage

from .ledger import Ledger

KNOWN_BUGS: dict[str, str] = {
    "dedup_answered_early":
        "a send whose dedup key repeats one still in flight is answered at once as a "
        "duplicate of it (engine.publish: nothing staged, reply now), before that "
        "message is durable: if its commit then fails or the broker crashes, the "
        "duplicate was confirmed and nothing is stored (SPEC: confirmed only once "
        "durable). A numbered send (idempotent producer) with such a key waits for "
        "the next commit, but not for the one holding the original: when that one "
        "fails (a full disk), the answer still names the dropped message. "
        "Tolerated: such answers are not counted as confirmations.",
    "trailing_hole_counted":
        "storage's snapshot (MemoryStorage._channel_record and SQLiteStorage._snapshot "
        "alike) reports holes between stored segments as gone but not the seqs after "
        "the last segment up to next_seq: publishes a failed commit dropped at the "
        "tail, when a later removal stored next_seq past them. After a restart the "
        "core counts them as live: max_items with drop_oldest deletes the phantom "
        "instead of a message and storage holds max_items + 1; count and depth are "
        "one too high. Tolerated: the simulator's storage reports them gone.",
    "overflow_drops_failed_seq":
        "ChannelLog.drop_inflight (max_items, drop_oldest, nothing committed left to "
        "drop) starts at ``end`` and skips ``gone``; but delete_one, moving first_seq "
        "past the seqs a failed commit left as gaps just above end, discarded them from "
        "``gone``, so the drop picks such a never-stored seq instead of the oldest "
        "message in flight. inflight goes negative and the channel holds one message "
        "more than max_items (in storage and from then on) until a restart. "
        "Tolerated: a drop_oldest channel may hold one more per drop of a seq never "
        "stored.",
    "txn_replay_answered_early":
        "a TXN_COMMIT whose fence (writer, channel) was moved by an earlier commit of "
        "the same batch id still in flight is answered 'discarded: replayed' (published "
        "0); when that earlier commit then fails (a full disk), on_failed puts the fence "
        "back but the replay's answer still goes out after its own commit: the writer "
        "moves on to its next batch and the batch is never stored (exactly-once sink "
        "loses it). Tolerated: such answers are not counted as confirmations.",
}


def tolerates(ledger: Ledger, name: str) -> bool:
    """Whether ``ledger``'s run tolerates known bug ``name`` (and count that it met it)."""
    assert name in KNOWN_BUGS, name
    if name not in ledger.tolerated:
        return False
    ledger.seen_known[name] = ledger.seen_known.get(name, 0) + 1
    return True


class SimStorage(MemoryStorage):
    """The memory store, with the known storage bugs worked around when tolerated."""

    def __init__(self, name: str, ledger: Ledger) -> None:
        super().__init__(name)
        self.ledger = ledger

    def open(self, now: float) -> Snapshot:
        snap = super().open(now)
        if "trailing_hole_counted" not in self.ledger.tolerated:
            return snap
        stored = self.ledger.stored
        for rec in snap.channels:
            gone = set(rec.gone)
            last = max((s for c, s in stored if c == rec.name), default=0)
            tail = {s for s in range(max(last + 1, rec.first_seq), rec.next_seq)
                    if s not in gone}
            if tail:
                tolerates(self.ledger, "trailing_hole_counted")
                gone |= tail
                first = rec.first_seq
                while first in gone:
                    gone.discard(first)
                    first += 1
                rec.first_seq, rec.gone = first, sorted(gone)
        return snap
