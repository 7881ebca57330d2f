"""Delivery: hand ready messages to the subscriptions that have credit.

``pump`` serves the groups in ``ready_groups``: inside a group it goes round-robin
over the members with credit and rotates over the group's channels, and returns the
deliveries per subscription. When a message body is only in storage, that group
channel waits and ``pump`` returns a load request; the adapter reads a page and calls
``on_loaded``, which makes the waiting group channels ready again.
"""

from __future__ import annotations

import itertools

from ..names import REPLY_TO
from ..protocol.frames import Delivery
from .dead_letters import DeadLetters
from .group import Group, GroupChannel, Lease, NeedLoad, Subscription
from .log import Msg
from .replies import delivery_headers
from .state import BrokerState


class Dispatcher:
    def __init__(self, state: BrokerState, dead_letters: DeadLetters) -> None:
        self.state = state
        self.dead_letters = dead_letters
        self._tags = itertools.count(1)
        # When each message first delivered by the pump under way was published
        self._first_published: list[float] = []

    def pump(self, now: float) -> tuple[dict[Subscription, list[Delivery]], list[NeedLoad]]:
        out: dict[Subscription, list[Delivery]] = {}
        loads: list[NeedLoad] = []
        state = self.state
        ready_groups = state.ready_groups
        self._first_published = first = []
        for grp in list(ready_groups):
            if not self._pump_group(grp, now, out, loads):
                del ready_groups[grp]
        for sub in out:
            sub.burst = 0
        if first and state.delivery_latency is not None:
            state.delivery_latency.observe_many([now - at for at in first])
        return out, loads

    def _pump_group(
        self, grp: Group, now: float, out: dict[Subscription, list[Delivery]],
        loads: list[NeedLoad],
    ) -> bool:
        """Deliver what ``grp`` can; True while it still has both ready work and credit."""
        ready = grp.ready
        while ready:
            found = grp.member_for()
            if found is None:
                self.state.in_flight.over(grp)
                # Members that only hit their burst limit get more in the next round.
                return any(m.burst and m.active and not m.paused
                           and m.prefetch > m.unsettled for m in grp.members)
            gc = next(iter(ready))
            if gc.log.frozen:  # its queue is being handed over (ownership.freeze)
                del ready[gc]
                continue
            try:
                msg = gc.next_ready(now)
            except NeedLoad as need:
                del ready[gc]
                if not need.log.loading:
                    need.log.loading = True
                    loads.append(need)
                need.log.waiters[gc] = None
                continue
            if msg is None:
                del ready[gc]
                continue
            if msg.expires_at is not None and msg.expires_at <= now:
                self.dead_letters.expire(msg.channel, msg.seq, msg)
                continue
            if len(ready) > 1:  # rotate: the group's channels take turns
                del ready[gc]
                ready[gc] = None
            # A message that came back from a member goes to another one with credit
            # (``found`` above is still the turn's member: nothing since took credit).
            if gc.returned_from:
                found = grp.member_for(gc.returned_from.pop(msg.seq, 0))
                assert found is not None  # checked above; nothing since took credit away
            sub, idx = found
            grp.rr = (idx + 1) % len(grp.members)  # the next turn: the member after it
            items = out.get(sub)
            if items is None:
                items = out[sub] = []
            items.append(self._deliver(sub, gc, msg, now))
            sub.burst += len(msg.data) + 64
        return False

    def _deliver(self, sub: Subscription, gc: GroupChannel, msg: Msg, now: float) -> Delivery:
        state = self.state
        tag = next(self._tags)
        lease = Lease(tag, gc, msg, sub, now)
        gc.pending[msg.seq] = lease
        gc.log.touched = now
        attempts = gc.attempts.get(msg.seq, 0) + 1
        gc.attempts[msg.seq] = attempts
        gc.delivered += 1
        state.dirty[gc] = None  # attempts survive a crash: stored with the next commit
        lease.count_in = state.taken + 1
        sub.unsettled += 1
        # Counted in the in-flight bounds (core/in_flight.py), inlined: per delivery
        weight = lease.weight
        sub.held += weight
        pool = state.in_flight
        pool.total += weight
        if pool.total >= pool.limit:
            pool.reached()
        sub.session.leases[tag] = lease
        sub.leases[tag] = lease
        counters = state.counters
        counters.delivered += 1
        headers = msg.headers
        if headers and REPLY_TO in headers:  # a request: the right to answer it
            headers = delivery_headers(state, msg, attempts, now)
        if attempts > 1:
            counters.redelivered += 1
        else:  # published -> first delivered, observed at the end of the pump
            self._first_published.append(msg.published_at)
        return Delivery(tag, msg.channel, msg.seq, msg.id, msg.data, msg.raw, headers,
                        attempts, msg.published_at, msg.priority, msg.key)

    def on_loaded(self, channel: str, from_seq: int, msgs: list[Msg], upto: int) -> None:
        """Storage returned the live messages of ``[from_seq, upto)``."""
        log = self.state.channels.get(channel)
        if log is None:
            return
        log.loading = False
        log.readback = {m.seq: m for m in msgs}
        log.rb_lo, log.rb_hi = from_seq, upto
        for gc in log.waiters:
            if gc.group.gcs.get(channel) is gc:
                gc.group.ready[gc] = None
                if gc.group.members:
                    self.state.ready_groups[gc.group] = None
        log.waiters = {}
