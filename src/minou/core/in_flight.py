"""The memory unsettled deliveries hold, bounded in bytes as well as in count.

A delivery's lease keeps its message (the body too: a dead letter needs it) until the
reader settles it, and the body cache may have let the message go meanwhile. Prefetch
bounds how many a subscription holds, not how big they are: a consumer that takes
1 MiB messages with a prefetch of 1,500 and never acks would pin 1.5 GiB. So each
delivery is weighed (``read_weight``: payload, headers and a fixed part) and:

- a subscription holding ``per_subscription`` bytes or more gets no more deliveries;
- while all subscriptions together hold ``limit`` bytes or more, one holding ``share``
  or more gets none, and readers within their share go on;
- a subscription holding nothing always gets one message, however big (so nothing
  stalls for good on a message larger than a bound).

The bound is therefore ``limit`` plus, per subscription, its share and one message;
and ``per_subscription`` plus one message for any one of them. What a settlement gives
back (``give_back``) wakes the groups it had stopped. No I/O.

Delivery and settlement run this per message, so the rule is kept as one number,
``cap``: what a subscription may hold now (``per_subscription``, or the smaller
``share`` while the total is at the limit), moved only when the total crosses it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from ..limits import IN_FLIGHT_BYTES, IN_FLIGHT_PER_SUBSCRIPTION, IN_FLIGHT_SHARE


class Holder(Protocol):
    """A subscription, as the bounds see it (``group.Subscription``)."""

    held: int  # bytes of its unsettled deliveries
    group: Any  # what ``wake`` takes: its group


class InFlightBytes:
    def __init__(self, wake: Callable[[Any], None]) -> None:
        self.wake = wake  # BrokerState.mark_ready
        self.total = 0
        # Groups whose members the total stopped: woken when it is back under the limit.
        self.stopped: dict[Hashable, None] = {}
        self.configure()

    def configure(self, limit: int = IN_FLIGHT_BYTES, share: int = IN_FLIGHT_SHARE,
                  per_subscription: int = IN_FLIGHT_PER_SUBSCRIPTION) -> None:
        """Set the bounds (the adapter again on a reload: ``in_flight_bytes``)."""
        self.limit = limit
        self.share = share
        self.per_subscription = max(1, per_subscription)
        self.full = False
        if self.total >= limit:
            self.reached()
        else:
            self.cap = self.per_subscription
            self._wake_stopped()  # a raised limit frees them now

    def stops(self, held: int) -> bool:
        """Whether a subscription holding ``held`` bytes must wait for a settlement (a
        cap of at least 1: one holding nothing never does)."""
        return held >= self.cap

    def over(self, grp: Hashable) -> None:
        """``grp`` found no member with credit: if the total is why, wake it later."""
        if self.full:
            self.stopped[grp] = None

    def take(self, sub: Holder, weight: int) -> None:
        sub.held += weight
        self.total += weight
        if self.total >= self.limit:
            self.reached()

    def reached(self) -> None:
        """The total is at the limit: from now on a subscription may hold its share."""
        self.full = True
        self.cap = max(1, min(self.share, self.per_subscription))

    def give_back(self, sub: Holder, weight: int) -> None:
        held = sub.held
        sub.held = held - weight
        self.total -= weight
        # Settlement.ack inlines the case where neither holds (keep them equal).
        if held >= self.cap:  # it was stopped
            self.wake(sub.group)
        if self.full and self.total < self.limit:
            self.full = False
            self.cap = self.per_subscription
            self._wake_stopped()

    def _wake_stopped(self) -> None:
        stopped, self.stopped = self.stopped, {}
        for grp in stopped:
            self.wake(grp)
