"""The memory that deliveries written but not yet sent may hold, shared by every
connection. No I/O: the server (``BrokerServer.note_unsent``/``watch_consumers``) and
the simulator (``tests/sim``) run this same rule.

All connections together may hold ``limit`` bytes of unsent deliveries. Past that, a
connection holding more than ``share`` gets no more deliveries until the total is back
under the limit, while readers that keep up go on. A write is noted when it is made,
but reads are seen only at the next recount (the server's tick), so between recounts
the running total only grows: it errs on the safe side. What consumers that stop
reading can pin is therefore bounded: the limit and one delivery frame (the write
that crossed it), plus per connection its share and one frame (the one written before
it was paused). The simulator checks that bound (invariant ``delivery_budget``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ..limits import BUDGET_SHARE


class Holder(Protocol):
    """A connection, as the budget sees it."""

    unsent_noted: int  # its part of the running total

    def set_budget_paused(self, paused: bool) -> None: ...


class DeliveryBudget:
    def __init__(self, share: int = BUDGET_SHARE) -> None:
        self.share = share
        self.running = 0  # noted at every write, exact again at every recount

    def note(self, holder: Holder, buffered: int, limit: int) -> bool:
        """A delivery write left ``buffered`` bytes unsent on ``holder``: whether it
        must stop getting deliveries now (not at the next recount)."""
        self.running += buffered - holder.unsent_noted
        holder.unsent_noted = buffered
        return self.running > limit and buffered > self.share

    def recount(self, sizes: Iterable[tuple[Holder, int]], limit: int) -> int:
        """The exact unsent bytes of every open connection: pause those over their
        share while the total is over ``limit``, resume the others. Returns the total."""
        pairs = list(sizes)
        total = sum(size for _, size in pairs)
        over = total > limit
        for holder, size in pairs:
            holder.unsent_noted = size
            holder.set_budget_paused(over and size > self.share)
        self.running = total
        return total
