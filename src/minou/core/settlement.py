"""Settlement: what a reader says about a delivery (ack, nack, extend its lease,
withdraw it), and what happens to a delivery that comes back unsettled."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from ..errors import BadRequest, UnknownDelivery
from ..limits import MAX_DELAY_S, MAX_LEASE_S, RETURNED_FROM_LIMIT
from .dead_letters import DeadLetters
from .group import Lease
from .session import Session
from .state import BrokerState

LEASE_HEAP_SLACK = 1024  # stale lease heap entries allowed beyond twice the live ones


def live_lease_entry(entry: tuple[float, int, int, Lease]) -> bool:
    """Whether a lease heap entry is its lease's current one, and the lease unsettled."""
    lease = entry[3]
    return (lease.extends == entry[2] and lease.gc.pending.get(lease.seq) is lease
            and not lease.returning)


class Settlement:
    def __init__(self, state: BrokerState, dead_letters: DeadLetters) -> None:
        self.state = state
        self.dead_letters = dead_letters

    def _lease(self, session: Session, tag: int) -> Lease:
        lease = session.leases.pop(tag, None)
        if lease is not None:
            lease.sub.leases.pop(tag, None)
        if lease is None or lease.gc.pending.get(lease.seq) is not lease:
            raise UnknownDelivery(f"delivery tag {tag}")  # _settling refuses it (_refuse)
        return lease

    def _settling(
        self, session: Session, tags: Iterable[int], failed: list[tuple[int, int, str]]
    ) -> Iterator[Lease]:
        """The leases ``tags`` name; refused tags go to ``failed`` (tag, code, text)."""
        for tag in tags:
            try:
                yield self._lease(session, tag)
            except UnknownDelivery:
                self._refuse(tag, failed)

    def _refuse(self, tag: int, failed: list[tuple[int, int, str]]) -> None:
        exc = UnknownDelivery(f"delivery tag {tag} is unknown, already settled, expired, "
                              "or not yours")
        self.state.counters.refuse(exc.reason)
        failed.append((tag, int(exc.code), exc.message))

    def ack(self, session: Session, tags: Iterable[int],
            now: float | None = None) -> list[tuple[int, int, str]]:
        state = self.state
        counters, mark = state.counters, state.mark
        failed: list[tuple[int, int, str]] = []
        latency = state.ack_latency if now is not None else None
        delivered: list[float] = []  # when each acked delivery was made, for ``latency``
        pool = state.in_flight
        leases = session.leases
        marked = None  # the group channel marked last: an ack frame's tags run in one
        acked = 0
        try:
            for tag in tags:
                # ``_lease``, inlined (per message): the same checks, the same refusal
                lease = leases.pop(tag, None)
                if lease is not None:
                    lease.sub.leases.pop(tag, None)
                if lease is None or lease.gc.pending.get(lease.seq) is not lease:
                    self._refuse(tag, failed)
                    continue
                gc = lease.gc
                gc.settle(lease.seq)
                sub = lease.sub
                sub.unsettled -= 1
                if sub.held < pool.cap and not pool.full:  # give_back, nothing to wake
                    sub.held -= lease.weight
                    pool.total -= lease.weight
                else:
                    pool.give_back(sub, lease.weight)
                acked += 1
                # Marking it again before another is marked changes nothing (ordered
                # sets: a key already in keeps its place).
                if gc is not marked:
                    mark(gc)
                    marked = gc
                delivered.append(lease.delivered)
        finally:
            counters.acked += acked
        if latency is not None and delivered:
            latency.observe_since(now, delivered)
        return failed

    def nack(
        self, session: Session, tags: Iterable[int], *, delay: float, front: bool, now: float
    ) -> list[tuple[int, int, str]]:
        failed: list[tuple[int, int, str]] = []
        if not 0 <= delay <= MAX_DELAY_S:  # also refuses NaN
            raise BadRequest(f"delay must be 0..{MAX_DELAY_S:g} seconds, got {delay}")
        for lease in self._settling(session, tags, failed):
            self.state.counters.nacked += 1
            self.return_lease(lease, now, front=front, delay=delay)
        return failed

    def extend(
        self, session: Session, tags: Iterable[int], seconds: float, now: float
    ) -> list[tuple[int, int, str]]:
        if not 0 < seconds <= MAX_LEASE_S:
            raise BadRequest(f"seconds must be in (0, {MAX_LEASE_S}], got {seconds}")
        failed: list[tuple[int, int, str]] = []
        for tag in tags:
            lease = session.leases.get(tag)
            if lease is None or lease.gc.pending.get(lease.seq) is not lease:
                exc = UnknownDelivery(f"delivery tag {tag} is unknown or expired")
                self.state.counters.refuse(exc.reason)
                failed.append((tag, int(exc.code), exc.message))
                continue
            lease.expires = now + seconds
            # An extended lease leaves its subscription's expiry order for the heap,
            # where its entry of an earlier extend (if any) becomes stale.
            lease.sub.leases.pop(tag, None)
            lease.extends += 1
            heapq.heappush(self.state.lease_heap,
                           (lease.expires, tag, lease.extends, lease))
        self._compact_lease_heap()
        return failed

    def _compact_lease_heap(self) -> None:
        """Stale entries (extended again, settled) would otherwise stay until their
        time, up to MAX_LEASE_S: a client extending in a loop grew the heap without
        bound. Past twice what was live at the last compaction (plus some slack) only
        the live entries are kept: at most one per unsettled lease."""
        state = self.state
        heap = state.lease_heap
        if len(heap) <= 2 * state.lease_heap_kept + LEASE_HEAP_SLACK:
            return
        heap[:] = [entry for entry in heap if live_lease_entry(entry)]
        heapq.heapify(heap)
        state.lease_heap_kept = len(heap)

    def withdraw(self, session: Session, tags: Iterable[int], now: float) -> None:
        """Deliveries the adapter could hand to nobody (the request waiting for them went
        away): back to the front of their queue at once, as if never sent (the attempt
        does not count). Unknown tags are ignored."""
        for tag in tags:
            lease = session.leases.get(tag)
            if lease is None or lease.gc.pending.get(lease.seq) is not lease:
                continue
            self._lease(session, tag)
            attempts = lease.gc.attempts
            if attempts.get(lease.seq, 0) > 1:
                attempts[lease.seq] -= 1
            else:
                attempts.pop(lease.seq, None)
            self.return_lease(lease, now, front=True, delay=0.0, counted=False)

    def return_lease(self, lease: Lease, now: float, *, front: bool, delay: float,
                     counted: bool = True) -> None:
        """A delivery came back unsettled: requeue it, or dead-letter past the limit.

        Attempt counts never go down, even across a crash: so a message goes out again
        only once the commit storing its last delivery's count is durable (``counted``:
        that delivery counts; a withdrawn one did not reach anyone). Until then it stays
        pending under a lease no tag reaches, which keeps it out of every reader's way
        and below the group's floor; the client's credit comes back at once."""
        gc, sub = lease.gc, lease.sub
        if gc.pending.get(lease.seq) is not lease or lease.returning:
            return
        sub.unsettled -= 1
        state = self.state
        state.in_flight.give_back(sub, lease.weight)
        if counted and lease.count_in > state.durable:
            lease.returning = True
            state.batch.on_commit.append(lambda: self._requeue(lease, now, front, delay))
            state.batch.on_fail.append(None)  # a failed commit carries it to the next
            state.mark_ready(gc.group)  # the credit it gave back takes what else is ready
            return
        self._requeue(lease, now, front, delay)

    def _requeue(self, lease: Lease, now: float, front: bool, delay: float) -> None:
        gc, sub = lease.gc, lease.sub
        if gc.pending.get(lease.seq) is not lease:
            return  # purged, seeked past or detached meanwhile
        if gc.group.gcs.get(gc.log.name) is not gc:
            # The group's state was replaced (a restart from ``seq:``) while this waited
            # for its commit: requeued there it would be delivered from the old state,
            # beside the new one's own copy.
            return
        limit = gc.log.options.requeue_limit
        if gc.attempts.get(lease.seq, 0) > limit:
            gc.settle(lease.seq)
            gc.acks -= 1
            self.dead_letters.dead_letter(lease.msg, "requeue_limit", gc.group.key,
                                          _too_many(limit))
        else:
            gc.requeue(lease.seq, front=front, delay=delay, now=now)
            if delay > 0:
                self.state.timed[gc] = None
            if sub.active:
                if len(gc.returned_from) >= RETURNED_FROM_LIMIT:
                    gc.returned_from.clear()  # stale ones (purged, expired): start afresh
                gc.returned_from[lease.seq] = id(sub)
        self.state.mark(gc)


def _too_many(limit: int) -> str:
    """Why a message was dead-lettered, in words: "delivered 3 times, the requeue
    limit is 2" (its deliveries are one more than its requeues)."""
    return (f"delivered {limit + 1} time{'s' if limit else ''} without an ack; the queue's "
            f"requeue_limit is {limit}")
