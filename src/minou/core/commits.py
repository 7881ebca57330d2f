"""Durability: the pending ``WriteBatch`` and what happens when the adapter commits it.

``publish`` stages messages in the pending batch; they become visible to readers only
in ``on_committed``, after the adapter has made that batch durable, so nothing a
consumer sees can be lost or have its seq reused after a crash. Acks, nacks and
subscriptions change memory at once and are made durable with the next batch; their
replies wait for that commit too (``after_commit``). A commit that fails (a full disk)
wrote nothing: ``on_failed`` drops its publishes (their seqs become gaps, their
publishers are told) and carries the rest, which memory already holds, into the next
batch; while ``storage_refusal`` is set, publishes are refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ..errors import RequestError, StorageFull
from ..limits import RETENTION_RECHECK_S
from .log import ChannelLog, Msg
from .state import BrokerState
from .stream_ids import point_key, prune_points
from .writes import WriteBatch


def _plain_run_end(messages: list[Msg], start: int) -> int:
    """One past the run from ``start`` of messages of one channel with consecutive seqs,
    none of them special (priority or delay)."""
    first = messages[start]
    if first.priority or first.deliver_at is not None:
        return start
    name, seq = first.channel, first.seq
    end = start + 1
    for msg in itertools.islice(messages, end, None):
        if (msg.channel != name or msg.seq != seq + end - start or msg.priority
                or msg.deliver_at is not None):
            break
        end += 1
    return end


class Commits:
    def __init__(self, state: BrokerState) -> None:
        self.state = state
        # False: every message is made visible one by one (tests compare the two paths).
        self.bulk = True  # pragma: no mutate  (either way the states are the same)

    @property
    def has_dirty(self) -> bool:
        """Group or producer states changed that no commit has carried yet."""
        producers = self.state.producers
        return bool(self.state.dirty or producers.dirty or producers.gone)

    def take_writes(self) -> WriteBatch:
        """Hand the pending batch to the writer; start a new one."""
        state = self.state
        batch = state.batch
        touched: dict[ChannelLog, None] = {}
        for gc in state.dirty:
            if gc.group.gcs.get(gc.log.name) is not gc:
                continue  # detached meanwhile
            batch.group_states[(gc.group.key, gc.log.name)] = gc.durable_state()
            touched[gc.log] = None
        state.dirty = {}
        if state.producers.dirty or state.producers.gone:
            batch.producers.update(state.producers.take())
        for log in touched:
            # A bucket's revisions are its state: its readers never remove them.
            if not log.states or log.options.retention is not None or log.kv is not None:
                continue
            floor = min(gc.floor for gc in log.states)
            if floor > log.first_seq:
                log.truncate_below(floor)
                batch.truncates[log.name] = log.first_seq
                batch.channels[log.name] = log.next_seq  # stored with the removal
                prune_points(log.name, log.stream_ids, log.first_seq, batch.meta)
        state.batch = WriteBatch()
        state.taken += 1
        batch.number = state.taken
        batch.sync_within = self.sync_within(batch)
        return batch

    def sync_within(self, batch: WriteBatch) -> float | None:
        """How long the fsync of ``batch`` may wait after its commit: None (at once,
        before anything waiting for it is answered) unless every channel it writes to
        has durability "interval" and it writes nothing outside channels; then the
        shortest ``sync_interval`` among them."""
        if not self.state.any_interval or batch.registry_writes:
            return None
        intervals = []
        channels = self.state.channels
        for name in batch.channel_names():
            log = channels.get(name)
            opts = log.options if log is not None else self.state.options(name)
            if opts.durability != "interval":
                return None
            intervals.append(opts.sync_interval)
        return min(intervals) if intervals else None

    def on_committed(self, batch: WriteBatch, now: float) -> None:
        """The batch is durable: make its messages visible."""
        state = self.state
        channels, counters = state.channels, state.counters
        timed, ready_groups = state.timed, state.ready_groups
        # Batches are written one at a time, in order, and a failed one's state is
        # carried into the next: everything taken up to this one is durable now.
        state.durable = max(state.durable, batch.number)
        requeued = batch.requeued
        messages = batch.messages
        i, count = 0, len(messages)
        while i < count:
            msg = messages[i]
            i += 1
            log = channels.get(msg.channel)
            if log is None:
                continue
            if (i < count and self.bulk and not requeued and log.kv is None
                    and msg.seq >= log.first_seq
                    and (not log.gone.n or log.gone.top <= msg.seq)):
                end = _plain_run_end(messages, i - 1)
                if end - i >= 1:  # two or more: made visible at once
                    self._commit_run(log, messages[i - 1:end])
                    i = end
                    continue
            if msg.seq < log.first_seq or (log.gone.n and msg.seq in log.gone):
                if log.kv is not None:
                    log.kv.unstage(msg)
                continue  # dropped (overflow) before it was committed
            log.inflight -= 1
            log.append_committed(msg)
            log.count += 1
            if requeued and (msg.channel, msg.seq) in requeued:
                log.requeued += 1
                counters.requeued += 1
            else:
                log.published += 1
                counters.published += 1
            if log.kv is not None:
                self.compact(log, log.kv.commit(msg, log.options.history))
            for gc in log.states:
                if msg.special:
                    gc.add_special(msg.seq, msg.priority, msg.deliver_at, now)
                    if msg.deliver_at is not None:
                        timed[gc] = None
                gc.group.ready[gc] = None
                if gc.group.members:
                    ready_groups[gc.group] = None
        pending_forgets = state.batch.forgets
        for name in batch.forgets:  # the record went: the tombstone too, unless made again
            if name in pending_forgets:
                # Made again and removed again while this batch was written: that second
                # forget is still to come, with its own tombstone until then.
                continue
            state.forgetting.discard(name)
            if name not in channels:
                state.retired.pop(name, None)
        for callback in batch.on_commit:
            callback()

    def _commit_run(self, log: ChannelLog, run: list[Msg]) -> None:
        """What the loop of ``on_committed`` does message by message, for a run of
        consecutive plain messages of ``log`` none of which was dropped meanwhile."""
        taken = len(run)
        log.inflight -= taken
        log.append_run(run)
        log.count += taken
        log.published += taken
        self.state.counters.published += taken
        ready_groups = self.state.ready_groups
        for gc in log.states:
            gc.group.ready[gc] = None
            if gc.group.members:
                ready_groups[gc.group] = None

    def _forget_points(self, failed: WriteBatch, pending: WriteBatch) -> None:
        """The stream ids clients gave in ``failed`` (never stored) may be given again,
        where no later seq of their channel was assigned since (those were numbered
        from them, or checked against them: their points stay)."""
        failed_seqs: dict[str, set[int]] = {}
        for msg in failed.publishes:
            failed_seqs.setdefault(msg.channel, set()).add(msg.seq)
        for name, seqs in failed_seqs.items():
            log = self.state.channels.get(name)
            ids = log.stream_ids if log is not None else None
            if ids is None or log is None or log.next_seq != max(seqs) + 1:
                continue
            while ids.seqs and ids.seqs[-1] in seqs:  # from the last: only failed after it
                pending.meta[point_key(name, ids.seqs[-1])] = None
                ids.remove(ids.seqs[-1])

    def on_failed(self, batch: WriteBatch, error: RequestError) -> None:
        """The commit of ``batch`` failed and wrote nothing (a full disk).

        Its publishes are dropped: their seqs become gaps (never visible, never
        confirmed to anyone), their dedup keys and transaction fences are undone, and their
        publishers get ``error``. Everything else (acks, group states, deletes, dead
        letters, registrations) is what memory already holds: it is carried into the
        pending batch and written with it, first. A callback with a failure handler
        gets ``error`` (e.g. an ack's "not durable"); one without waits for that
        commit. Nothing is confirmed that was not written.
        """
        state = self.state
        dropped = {id(m) for m in batch.publishes}
        keep: list[Msg] = []
        for msg in batch.messages:
            if id(msg) not in dropped:
                keep.append(msg)
                continue
            waiting = state.awaited.get(msg.id) if state.awaited else None
            if waiting is not None:  # its early duplicates get the error, as it does,
                state.lost[msg.id] = error
                for pstate, pseq in waiting:  # and a resend of a numbered one too: set
                    if pstate is not None:  # now, so the next commit carries it
                        pstate.refuse(pseq, pseq, int(error.code), error.message)
                        state.producers.mark(pstate)
            log = state.channels.get(msg.channel)
            if log is not None and log.kv is not None:
                log.kv.unstage(msg)
            if log is None or msg.seq < log.first_seq or msg.seq in log.gone:
                continue  # dropped (overflow) before the commit: already a gap
            log.gone.add(msg.seq)
            log.inflight -= 1
        for channel, dedup_key, _, seq, msg_id in batch.dedup:
            state.dedup.forget(channel, dedup_key, seq, msg_id)
        for owner, txn, _, _ in batch.txn_done:  # not published: never "answered" as if
            state.transactions.forget((owner, txn))
        for pstate, pseq in batch.sequenced:  # a resend gets this error, not "stored"
            pstate.refuse(pseq, pseq, int(error.code), error.message)
            state.producers.mark(pstate)
        fences, pending = state.transactions.fences, state.batch
        for key, value in batch.fences.items():
            before = batch.fence_undo.get(key)
            if fences.get(key) == value:
                if before is None:
                    fences.pop(key, None)
                else:
                    fences[key] = before
            elif key in pending.fence_undo and pending.fence_undo[key] == value:
                pending.fence_undo[key] = before  # a later commit moved it on meanwhile
        pending.carry(batch, keep)
        if isinstance(error, StorageFull):  # nothing was written: a retry may give its id
            self._forget_points(batch, pending)
        if pending.forgets:  # a channel made again since keeps its record
            pending.forgets = [n for n in pending.forgets if n in state.forgetting]
        waiting = [(ok, fail) for ok, fail in
                   itertools.zip_longest(batch.on_commit, batch.on_fail) if ok is not None]
        pending.on_commit[:0] = [ok for ok, fail in waiting if fail is None]
        pending.on_fail[:0] = [None for ok, fail in waiting if fail is None]
        first: Exception | None = None
        for _, fail in waiting:
            if fail is not None:
                try:
                    fail(error)
                except Exception as exc:  # one handler's bug must not silence the others
                    first = first or exc
        if first is not None:
            raise first

    def compact(self, log: ChannelLog, seqs: list[int]) -> None:
        """Delete the revisions of a bucket past its history depth (``KvIndex.commit``)."""
        if not seqs:
            return
        batch = self.state.batch
        for seq in seqs:
            if log.delete_one(seq):
                batch.deletes.append((log.name, seq))
        batch.channels[log.name] = log.next_seq

    def after_commit(self, callback: Callable[[], None],
                     failed: Callable[[RequestError], None] | None = None) -> None:
        """Call ``callback`` once what is staged now is durable; ``failed`` (with the
        error) if that commit fails. Without ``failed``, the callback waits for the
        commit that makes it durable."""
        self.state.batch.on_commit.append(callback)
        self.state.batch.on_fail.append(failed)

    def retention_candidates(self, now: float = 0.0, start: int = 0,
                             count: int | None = None) -> list[tuple[str, int]]:
        """Channels with a retention period and the seq below which all readers settled,
        but not those whose settled messages were all found too young to go before
        ``now`` (``retention_looked``); of ``count`` channels from the ``start``-th (in
        the order they were made) when given: the broker walks a part a tick."""
        out = []
        for log in itertools.islice(self.state.channels.values(), start,
                                    None if count is None else start + count):
            if log.states and log.options.retention is not None and log.kv is None \
                    and log.retention_due <= now:
                floor = min(gc.compute_floor() for gc in log.states)
                if floor > log.first_seq:
                    out.append((log.name, floor))
        return out

    def retention_looked(self, channel: str, floor: int, first: int | None,
                         now: float) -> None:
        """Storage answered a retention candidate: keep only from ``first`` (None: keep
        all), and look at the channel again no sooner than its oldest settled message
        kept can go: when it was published plus the retention if memory holds it, else
        after ``RETENTION_RECHECK_S`` at most. A channel whose settled messages were all
        younger than the retention was looked up in storage every second, each of them:
        20,000 such channels held 71 % of a core of an idle broker."""
        log = self.state.channels.get(channel)
        if log is None:  # handed over or dropped while storage was read
            return
        if first is not None:
            self.truncate(channel, first)
        kept = log.first_seq
        if kept >= floor:
            log.retention_due = 0.0  # nothing settled is kept: the floor says when
            return
        retention = log.options.retention or 0.0
        oldest = log.cache.get(kept)
        if oldest is not None and oldest.published_at + retention > now:
            log.retention_due = oldest.published_at + retention
        else:
            log.retention_due = now + min(max(retention / 10, 1.0), RETENTION_RECHECK_S)

    def truncate(self, channel: str, first_seq: int) -> None:
        """Retention passed for every seq below ``first_seq``: forget them."""
        log = self.state.channels.get(channel)
        if log is not None and first_seq > log.first_seq:
            log.truncate_below(first_seq)
            batch = self.state.batch
            batch.truncates[channel] = log.first_seq
            batch.channels[channel] = log.next_seq
            prune_points(channel, log.stream_ids, log.first_seq, batch.meta)
