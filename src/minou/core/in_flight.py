"""The memory unsettled deliveries hold, bounded in bytes as well as in count.

A delivery's lease keeps its message (the body too: a dead letter needs it) until the
reader settles it, and the body cache may have let the message go meanwhile. Prefetch
bounds how many a subscription holds, not how big they are: a consumer that takes
1 MiB messages with a prefetch of 1,500 and never acks would pin 1.5 GiB. So each
delivery is weighed by what its message holds in memory (``log.held_weight``: payload,
headers and key as ``Msg.size`` counts them, and at least payload + 512) and:

- a subscription holding ``per_subscription`` bytes or more gets no more deliveries;
- once all subscriptions together hold ``limit`` bytes, the pool is *full* until they
  are back under 7/8 of it: meanwhile one holding ``share`` or more gets none, and
  readers within their share go on;
- a subscription holding nothing always gets one message, however big (so nothing
  stalls for good on a message larger than a bound).

The bound is therefore ``limit`` plus, per subscription, its share and one message;
and ``per_subscription`` plus one message for any one of them. What a settlement gives
back (``give_back``) wakes the groups it had stopped: when the pool is no longer full,
those the total stopped are served first, the ones holding least first and the group
whose ack freed the room last (else a reader acking one message at a time would take
the room back at each ack, and a reader waiting at its share would wait as long as
it reads). The 1/8 between full and not keeps those wake-ups to one per eighth of the
limit settled, not one per ack. No I/O.

Delivery and settlement run this per message, so the rule is kept as one number,
``cap``: what a subscription may hold now (``per_subscription``, or the smaller
``share`` while full), moved only when the pool fills or drains.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol

from ..limits import IN_FLIGHT_BYTES, IN_FLIGHT_PER_SUBSCRIPTION, IN_FLIGHT_SHARE


class Holder(Protocol):
    """A subscription, as the bounds see it (``group.Subscription``)."""

    held: int  # bytes of its unsettled deliveries
    group: Any  # what ``wake`` takes: its group (with ``members``, Holders too)


class InFlightBytes:
    def __init__(self, wake: Callable[[Any], None],
                 wake_first: Callable[[Iterable[Any]], None]) -> None:
        self.wake = wake  # BrokerState.mark_ready
        self.wake_first = wake_first  # BrokerState.ready_first
        self.total = 0
        # Groups with a member the full pool stopped: woken once it is no longer full.
        self.stopped: dict[Hashable, None] = {}
        self.configure()

    def configure(self, limit: int = IN_FLIGHT_BYTES, share: int = IN_FLIGHT_SHARE,
                  per_subscription: int = IN_FLIGHT_PER_SUBSCRIPTION) -> None:
        """Set the bounds (the adapter again on a reload: ``in_flight_bytes``). A
        subscription that a lowered bound now stops waits for its next settlement; one
        a raised ``per_subscription`` frees gets more at its group's next pump."""
        self.limit = limit
        self.resume = limit - limit // 8  # no longer full under this
        self.share = share
        self.per_subscription = max(1, per_subscription)
        if self.total >= limit:
            self.reached()
        else:
            self._drained(None)

    def stops(self, held: int) -> bool:
        """Whether a subscription holding ``held`` bytes must wait for a settlement (the
        cap is at least 1: one holding nothing never does)."""
        return held >= self.cap

    def over(self, grp: Any) -> None:
        """``grp`` found no member with credit: if the full pool stopped one of them,
        wake the group once it is no longer full."""
        if self.full and any(m.held >= self.cap for m in grp.members):
            self.stopped[grp] = None

    def reached(self) -> None:
        """The total is at the limit: until it drains, a subscription may hold its share.
        (Dispatcher._deliver counts a delivery in: ``held`` and ``total`` grow by its
        weight, and this is called once the total reaches ``limit``.)"""
        self.full = True
        self.cap = max(1, min(self.share, self.per_subscription))

    def give_back(self, sub: Holder, weight: int) -> None:
        held = sub.held
        sub.held = held - weight
        self.total -= weight
        # Settlement.ack inlines the case where neither holds (keep them equal).
        if held >= self.cap:  # it was stopped
            self.wake(sub.group)
        if self.full and self.total < self.resume:
            self._drained(sub.group)

    def _drained(self, settling: Any) -> None:
        self.full = False
        self.cap = self.per_subscription
        if not self.stopped:
            return
        stopped, self.stopped = self.stopped, {}
        last = settling in stopped  # (its value is None: pop's result says nothing)
        stopped.pop(settling, None)
        order = sorted(stopped, key=_least_held)
        if last:
            order.append(settling)
        self.wake_first(order)


def _least_held(grp: Any) -> int:
    return min((m.held for m in grp.members), default=0)
