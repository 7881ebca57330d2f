"""Queues that come and go while the broker runs: the building block of queues spread
over several brokers (docs/cluster.md, "The plan for queues spread over the brokers").

A broker that owns only some queues takes one over (``Restorer.adopt``: its stored part,
read after the claim that fenced its previous owner) and hands one on (``release``:
after the adapter stopped its deliveries and committed what it staged). Neither
touches another queue. Two properties hold, and are tested: restoring a whole
snapshot builds the same memory as restoring its shared part and adopting each queue;
releasing a queue and adopting what storage then holds gives the queue back as stored.

What a release leaves behind can never answer for the queue again: its channels and
group channels go (their deliveries are forgotten: their tags answer UNKNOWN_DELIVERY,
as after a takeover), its producer states and Spark fences go, and its dedup entries
become unreachable (``DedupWindow.retire``; they expire with the window). Group
definitions, reservations, staged transactions and the client registry are shared
state: they stay.
"""

from __future__ import annotations

from .group import Group
from .snapshot import queue_of
from .state import BrokerState
from .writes import WriteBatch


class QueueBusy(Exception):
    """The queue has writes no commit carried yet: commit, then release it."""


def channels_of(state: BrokerState, queue: str) -> list[str]:
    """The channels (with their dead letters) memory holds for ``queue``."""
    return [name for name in state.channels if queue_of(name) == queue]


def held_queues(state: BrokerState) -> set[str]:
    """The queues memory holds a channel of."""
    return {q for q in map(queue_of, state.channels) if q is not None}


def batch_touches(batch: WriteBatch, channels: set[str]) -> bool:
    """Whether ``batch`` writes anything of ``channels``."""
    return bool(
        any(m.channel in channels for m in batch.messages)
        or any(c in channels for c, _ in batch.deletes)
        or not channels.isdisjoint(batch.truncates)
        or not channels.isdisjoint(batch.channels)
        or any(c in channels for _, c in batch.group_states)
        or any(d[0] in channels for d in batch.dedup)
        or any(c in channels for _, c in batch.fences)
        or any(k[2] in channels for k in batch.producers))


def pending_for(state: BrokerState, queue: str) -> bool:
    """Whether the next commit would write something of ``queue``."""
    names = set(channels_of(state, queue))
    if not names:
        return False
    producers = state.producers
    return bool(
        batch_touches(state.batch, names)
        or any(gc.log.name in names for gc in state.dirty)
        or any(s.key[2] in names for s in producers.dirty)
        or any(k[2] in names for k in producers.gone))


def freeze(state: BrokerState, queue: str, frozen: bool = True) -> int:
    """Deliver nothing more of ``queue`` (it is being handed over: what is out settles
    first, so the hand-over delivers nothing twice), or again (``frozen`` False: the
    hand-over was given up). Returns its deliveries still out."""
    out = 0
    for name in channels_of(state, queue):
        log = state.channels[name]
        log.frozen = frozen
        for gc in log.states:
            out += sum(1 for lease in gc.pending.values() if not lease.returning)
            if not frozen:
                state.mark(gc)
    return out


def release(state: BrokerState, queue: str, now: float) -> int:
    """Forget ``queue``: another broker owns it from now on. Returns the deliveries
    forgotten (each comes again from the new owner). QueueBusy if the next commit
    would still write some of it (the adapter commits first, and makes sure the batch
    being written is durable too)."""
    if pending_for(state, queue):
        raise QueueBusy(f"queue {queue} has writes no commit carried yet")
    names = channels_of(state, queue)
    forgotten = 0
    groups: dict[Group, None] = {}
    for name in names:
        log = state.channels[name]
        state.drop_channel(log)
        state.special_count.total -= len(log.special)
        if log.kv is not None:
            log.kv.uncount()
        state.expiring.pop(log, None)
        for gc in list(log.states):
            grp = gc.group
            forgotten += len(gc.pending)
            gc.drop_leases()  # credit comes back to the subscriptions
            if grp.gcs.get(name) is gc:
                del grp.gcs[name]
            grp.ready.pop(gc, None)
            state.timed.pop(gc, None)
            groups[grp] = None
        log.states.clear()
        log.waiters = {}
    gone = set(names)
    state.dedup.retire(names, now)
    state.producers.release(gone)
    fences = state.transactions.fences
    for key in [k for k in fences if k[1] in gone]:
        del fences[key]
    for grp in groups:
        state.mark_ready(grp)  # credit freed here may serve the group's other queues
    return forgotten
