"""Time: ``tick`` expires leases (their deliveries go back to the queue), releases
delayed and scheduled messages, ages out dedup keys and idle producer states, and
keeps cached message bodies under their memory budget. Storage finds expired
messages; ``expire`` removes them."""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from .dead_letters import DeadLetters
from .group import Lease
from .log import Msg
from .settlement import Settlement, live_lease_entry
from .state import BrokerState


class Timers:
    def __init__(self, state: BrokerState, dead_letters: DeadLetters,
                 settlement: Settlement) -> None:
        self.state = state
        self.dead_letters = dead_letters
        self.settlement = settlement
        self._producers_expired_at = 0.0

    def tick(self, now: float) -> None:
        state = self.state
        expired: list[Lease] = []
        for grp in state.groups.values():
            for sub in grp.members:
                for lease in sub.leases.values():
                    if lease.expires > now:
                        break
                    expired.append(lease)
        heap = state.lease_heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if live_lease_entry(entry):
                expired.append(entry[3])
        # What is live now is at most what is left: the next compaction's bar follows it down.
        state.lease_heap_kept = min(state.lease_heap_kept, len(heap))
        for lease in expired:
            lease.sub.leases.pop(lease.tag, None)
            lease.sub.session.leases.pop(lease.tag, None)
            state.counters.lease_expired += 1
            self.settlement.return_lease(lease, now, front=True, delay=0.0)
        # Adapters whose credit is not a fixed prefetch (HTTP long polls) recount it.
        for conn in {id(lease.sub.session.conn): lease.sub.session.conn
                     for lease in expired}.values():
            hook = getattr(conn, "leases_expired", None)
            if hook is not None:
                hook()
        timed = state.timed
        for gc in list(timed):
            if gc.release_due(now):
                state.mark(gc)
            if not gc.delayed and not gc.sched:
                del timed[gc]
        state.dedup.expire(now)
        if now - self._producers_expired_at >= 60.0:  # idle states are cheap to keep a while
            self._producers_expired_at = now
            state.producers.expire(now)
        self.trim_cache()

    def trim_cache(self) -> int:
        """Keep message bodies in memory under the budget; return bytes freed."""
        budget = self.state.cache_budget
        total = self.state.cached_bytes.total
        if total <= budget:
            return 0
        logs = self.state.channels.values()
        need = total - budget * 3 // 4
        freed = 0
        for log in sorted(logs, key=lambda lg: lg.cache_bytes, reverse=True):
            if freed >= need:
                break
            freed += log.evict_bytes(min(log.cache_bytes, need - freed))
        return freed

    def expire(self, items: Iterable[Msg | tuple[str, int]]) -> int:
        """Storage found these messages past their TTL; dead-letter them.

        Items are the messages read back from storage (so their bodies can be
        dead-lettered), or ``(channel, seq)`` pairs when only memory knows them.
        """
        n = 0
        for item in items:
            channel, seq = (item.channel, item.seq) if isinstance(item, Msg) else item
            log = self.state.channels.get(channel)
            if log is None:
                continue
            found = item if isinstance(item, Msg) else log.lookup(seq)
            if self.dead_letters.expire(channel, seq, found if isinstance(found, Msg) else None):
                n += 1
        return n
