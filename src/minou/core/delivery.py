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
from .group import Group, GroupChannel, Lease, NeedLoad, Subscription, lease_weight
from .log import READ_WEIGHT_BASE, Msg
from .replies import delivery_headers
from .state import BrokerState

# Messages a run takes from the cursor at most (the members' credit is the other bound;
# their burst and in-flight bytes may stop them sooner: the rest goes back)
RUN = 256


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
            state.delivery_latency.observe_since(now, first)
        return out, loads

    def _pump_group(
        self, grp: Group, now: float, out: dict[Subscription, list[Delivery]],
        loads: list[NeedLoad],
    ) -> bool:
        """Deliver what ``grp`` can; True while it still has both ready work and credit.

        Per message, so what does not change within a pump is looked up once: which
        members have credit (asked again only of the member a delivery went to, and of
        all once the in-flight pool fills; nothing else moves a member's credit during
        a pump), what a group channel's first delivery of the pump notes, and each
        member's lease dicts and delivery list. And while the group has one ready
        channel whose next messages come from its cursor alone (``GroupChannel.plain``:
        the common case, a backlog), they are taken a run at a time
        (``GroupChannel.take_run``) rather than looked for one by one; what the members
        cannot take goes back (``put_back``)."""
        ready = grp.ready
        if not ready:
            return False
        state = self.state
        pool = state.in_flight
        counters = state.counters
        dirty = state.dirty
        first = self._first_published
        tags = self._tags
        members = grp.members
        n = len(members)
        has_credit = [m.credit > 0 for m in members]
        cap = pool.cap
        count_in = state.taken + 1  # the commit that will store these attempt counts
        last_gc: GroupChannel | None = None
        # Per member index: its delivery list, its and its session's leases, its lease
        # length (at its first delivery of the pump)
        slots: list[tuple[list[Delivery], dict[int, Lease], dict[int, Lease], float] | None]
        slots = [None] * n
        delivered = 0
        run: list[Msg] = []  # the run being delivered, of ``gc``; ``at`` is its next one
        at = 0
        try:
            while ready:
                # The next member with credit in round-robin order (Group.member_for,
                # from the flags): the turn's member, else the next one after it.
                if not n:
                    idx = -1
                else:
                    idx = grp.rr % n
                    if not has_credit[idx]:
                        try:
                            idx = has_credit.index(True, idx)
                        except ValueError:
                            idx = has_credit.index(True) if True in has_credit else -1
                if idx < 0:
                    pool.over(grp)
                    # Members that only hit their burst limit get more in the next round.
                    return any(m.burst and m.active and not m.paused
                               and m.prefetch > m.unsettled for m in members)
                if at < len(run):
                    msg = run[at]
                    at += 1
                else:
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
                    if len(ready) > 1:  # rotate: the group's channels take turns
                        del ready[gc]
                        ready[gc] = None
                    elif not gc.returned_from and gc.plain():
                        # As much as the members can take, this one included
                        left = sum(m.prefetch - m.unsettled
                                   for m, c in zip(members, has_credit, strict=True) if c)
                        run, at = gc.take_run(min(left - 1, RUN)), 0
                    # A message that came back from a member goes to another one with
                    # credit (``idx`` is still the turn's member: nothing since took any).
                    if gc.returned_from:
                        found = grp.member_for(gc.returned_from.pop(msg.seq, 0))
                        assert found is not None  # checked above
                        idx = found[1]
                    if gc is not last_gc:
                        last_gc = gc
                        gc.log.touched = now
                        dirty[gc] = None  # attempts survive a crash: stored with the commit
                if msg.expires_at is not None and msg.expires_at <= now:
                    self.dead_letters.expire(msg.channel, msg.seq, msg)
                    # (Rare.) A dead letter is a publish: take nothing cached on trust.
                    if at < len(run):
                        gc.put_back(run[at].seq)
                    run, at = [], 0
                    has_credit = [m.credit > 0 for m in members]
                    cap = pool.cap
                    last_gc = None
                    continue
                sub = members[idx]
                grp.rr = (idx + 1) % n  # the next turn: the member after it
                slot = slots[idx]
                if slot is None:  # its first delivery of this pump
                    got = out.get(sub)
                    if got is None:
                        got = out[sub] = []
                    slot = slots[idx] = (got, sub.leases, sub.session.leases, sub.lease_s)
                items, sub_leases, session_leases, lease_s = slot
                # -- the delivery: a lease, counted in the bounds, and what goes out
                seq = msg.seq
                tag = next(tags)
                headers = msg.headers
                weight = (len(msg.data) + READ_WEIGHT_BASE
                          if not headers and msg.key is None else lease_weight(msg))
                lease = Lease(tag, gc, msg, seq, sub, weight, now, now + lease_s, count_in)
                gc.pending[seq] = lease
                attempts = gc.attempts.get(seq, 0) + 1
                gc.attempts[seq] = attempts
                gc.delivered += 1
                sub.unsettled += 1
                # Counted in the in-flight bounds (core/in_flight.py), inlined
                sub.held += weight
                pool.total += weight
                if pool.total >= pool.limit:
                    pool.reached()
                sub_leases[tag] = lease
                session_leases[tag] = lease
                delivered += 1
                if headers and REPLY_TO in headers:  # a request: the right to answer it
                    headers = delivery_headers(state, msg, attempts, now)
                if attempts > 1:
                    counters.redelivered += 1
                else:  # published -> first delivered, observed at the end of the pump
                    first.append(msg.published_at)
                items.append(Delivery(tag, msg.channel, seq, msg.id, msg.data, msg.raw,
                                      headers, attempts, msg.published_at, msg.priority,
                                      msg.key))
                sub.burst += len(msg.data) + 64
                if pool.cap != cap:  # the pool filled: every member's credit may be less
                    cap = pool.cap
                    has_credit = [m.credit > 0 for m in members]
                elif sub.credit <= 0:
                    has_credit[idx] = False
            return False
        finally:
            counters.delivered += delivered
            if at < len(run):  # what no member took goes back
                gc.put_back(run[at].seq)

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
