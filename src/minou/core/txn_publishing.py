"""Staged, fenced publishes: the broker side of ``transactions``. STAGE validates and
holds messages; TXN_COMMIT checks the whole commit, then publishes it through
``publishing`` with its fences, in one batch; both are stored with the pending batch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..auth.rules import Access
from ..errors import BadRequest, QueueFull
from ..protocol.frames import Send
from .publishing import Publishing
from .session import Session
from .state import BrokerState
from .transactions import WRITER_LINEAGE_META


class TxnPublishing:
    def __init__(self, state: BrokerState, publishing: Publishing) -> None:
        self.state = state
        self.publishing = publishing

    def stage(self, session: Session, txn: str, sends: list[Send], now: float) -> int:
        """Validate and hold ``sends`` under ``txn`` (refused messages refuse the frame)."""
        for send in sends:
            if send.channel.endswith("*"):
                raise BadRequest("a transaction publishes to channels, not broadcasts")
            self.publishing.validate(send, session.access)
        tx = self.state.transactions
        held = tx.stage(session.client_id, txn, sends, now)
        part = tx.staged[(session.client_id, txn)].parts
        self.state.batch.staged.append((session.client_id, txn, part, list(sends), now))
        return held

    def abort(self, session: Session, txns: list[str]) -> int:
        dropped = self.state.transactions.abort(session.client_id, txns)
        self.state.batch.unstaged += [(session.client_id, t) for t in txns]
        return dropped

    def expire(self, now: float) -> int:
        gone = self.state.transactions.expire(now)
        self.state.batch.unstaged += gone
        return len(gone)

    def commit(self, session: Session, writer_id: str, batch_id: int, txns: list[str],
               now: float, lineage: str, after: int = -1) -> dict[str, Any]:
        """Publish the transactions in the pending batch, fenced per (writer, channel):
        all of it or, if anything would be refused, nothing (the transactions stay
        staged and the fences where they were, so the writer may abort and replay)."""
        state = self.state
        tx, batch = state.transactions, state.batch
        tx.check_writer(session.client_id, writer_id)
        tx.check_lineage(writer_id, lineage)
        tx.check_names(txns)
        again = tx.answered(session.client_id, txns)
        if again is not None:  # sent again after its answer was lost: the same answer
            return again
        sends = tx.peek(session.client_id, txns)
        keep, skipped, fences = tx.fence(writer_id, batch_id, sends, after)
        full = state.storage_refusal
        if full is not None:
            raise type(full)(full.message, **full.detail)
        self._check_commit(keep, session.access)
        tx.take(session.client_id, txns)
        batch.unstaged += [(session.client_id, t) for t in txns]
        tx.discarded += len(sends) - len(keep)
        outcomes, staged = self.publishing.publish(keep, now)  # rules checked just above
        failed = [{"channel": o.channel, "code": o.code, "error": o.error}
                  for o in outcomes if o.code]
        # Not expected after the check; if it happens, the replay must not be fenced.
        refused = {f["channel"] for f in failed}
        fences = {k: b for k, b in fences.items() if k[1] not in refused}
        for key in fences:  # to undo if the commit fails
            batch.fence_undo.setdefault(key, tx.fences.get(key))
        tx.fences.update(fences)
        batch.fences.update(fences)
        # The first commit that names a transaction binds the id (one naming none only
        # checks: else any client could claim every writer id for nothing).
        if txns and writer_id not in tx.writers:
            tx.bind_writer(writer_id, session.client_id)
            batch.writers[writer_id] = session.client_id
        if txns and lineage and tx.lineages.get(writer_id) != lineage:
            tx.lineages[writer_id] = lineage
            batch.meta[WRITER_LINEAGE_META + writer_id] = lineage
        result = {"published": len(staged), "discarded": len(sends) - len(keep),
                  "replayed_channels": skipped, "failed": failed[:20]}
        for t in txns:
            batch.unstaged += tx.remember(session.client_id, t, now, result)
        batch.txn_done += [(session.client_id, t, result, now) for t in txns]
        return result

    def replay_holds(self, writer_id: str, batch_id: int, channels: list[str]) -> bool:
        """Whether the commit that made these channels of ``batch_id`` replays is still
        in place: a fence moved by a commit still being written goes back when that
        commit fails, and then the replay stored nothing either."""
        fences = self.state.transactions.fences
        return all((fence := fences.get((writer_id, ch))) is not None and fence >= batch_id
                   for ch in channels)

    def _check_commit(self, sends: list[Send], access: Access) -> None:
        """Raise what publishing ``sends`` would refuse: rules and schemas (either may
        have changed since STAGE) and room in channels that refuse when full."""
        for send in sends:
            self.publishing.validate(send, access)
        self.state.check_scheduled_room(
            sum(1 for s in sends if s.priority > 0 or s.delay))
        for name, n in Counter(s.channel for s in sends).items():
            log = self.state.channels.get(name)
            opts = log.options if log is not None else self.state.options(name)
            if opts.max_items is None or opts.overflow == "drop_oldest":
                continue
            held = log.count + log.inflight if log is not None else 0
            if held + n > opts.max_items:
                raise QueueFull(
                    f"the commit would put {n} messages into {name!r}, which has room for "
                    f"{max(0, opts.max_items - held)} (max_items {opts.max_items}); nothing "
                    "was published", channel=name, limit=opts.max_items)

    def release_writer(self, writer_id: str, *, drop_fences: bool) -> str | None:
        """Admin: free a writer id for the next client that commits under it (its
        fences stay, so a job moved to another client id stays exactly-once, unless
        ``drop_fences``: after a squatter's commit). Returns the owner it had."""
        tx, batch = self.state.transactions, self.state.batch
        owner = tx.writers.pop(writer_id, None)
        if owner is not None:
            batch.writers[writer_id] = None
        if drop_fences:  # a new run may take the writer over: its lineage goes too
            if tx.lineages.pop(writer_id, None) is not None:
                batch.meta[WRITER_LINEAGE_META + writer_id] = ""
            tx.fences = {k: b for k, b in tx.fences.items() if k[0] != writer_id}
            batch.fences = {k: b for k, b in batch.fences.items() if k[0] != writer_id}
            batch.dropped_fences.append(writer_id)
        return owner
