"""The bytes of frames and request bodies still arriving, over every connection: bounded.

A connection may hold a HELLO's worth of an unfinished frame (``INPUT_SMALL_BYTES``) on
its own. Past that, the frame's (or body's) declared size is reserved here first, from
a broker-wide budget and from its client's share of it; a connection that finds no room
reads nothing more until a reservation ends (native: its socket pauses, FIFO), or is
answered "try again" (HTTP: a 503). Without it, one authenticated client could open
every connection slot and park 16 MiB of a frame in each, for good: 10 sockets held
+150 MiB, ``max_connections`` of them 160 GB.

A reservation must then arrive at ``INPUT_MIN_RATE`` bytes a second on average after a
grace (``deadline``): a stalled or trickling sender cannot keep the budget from everyone
else. The server's sweep cuts those past their deadline.

No I/O and no clock: callers pass the time, and wake or cut the holders they are given.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..limits import (
    INPUT_BUDGET_BYTES,
    INPUT_CLIENT_SHARE,
    INPUT_GRACE_S,
    INPUT_MIN_RATE,
    INPUT_SMALL_BYTES,
)


def input_budget_limits(max_frame_size: int) -> tuple[int, int]:
    """(total, per client) for frames up to ``max_frame_size``: a client can always have
    one of the largest in flight."""
    total = max(INPUT_BUDGET_BYTES, INPUT_CLIENT_SHARE * max_frame_size)
    return total, total // INPUT_CLIENT_SHARE


@dataclass(slots=True)
class Reservation:
    client: str
    size: int
    since: float
    deadline: float


class InputBudget:
    """Reservations of holders (connections), by client.

    Args:
        total: bytes reserved at once over every connection.
        per_client: ... of which one client's connections together.
    """

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self.used = 0
        self.by_client: dict[str, int] = {}
        self.held: dict[Any, Reservation] = {}
        self.waiting: OrderedDict[Any, tuple[str, int]] = OrderedDict()
        self.waits = 0  # reservations that had to wait (a counter)
        self.cut = 0  # holders cut for arriving too slowly (a counter)

    def resize(self, total: int, per_client: int) -> None:
        """New limits (a reload); what is reserved stays."""
        self.total, self.per_client = total, per_client

    @staticmethod
    def needs_room(size: int) -> bool:
        return size > INPUT_SMALL_BYTES

    def reserve(self, holder: Any, client: str, size: int, now: float) -> bool:
        """Reserve ``size`` bytes for ``holder``'s frame or body being read. True: read
        on. False: no room now; with ``wait`` (see ``enqueue``) the holder is handed back
        by ``release`` once there is."""
        if holder in self.held:
            self.release(holder)
        if not self._fits(client, size):
            return False
        self._take(holder, client, size, now)
        return True

    def grow(self, holder: Any, client: str, size: int, now: float) -> bool:
        """Reserve ``size`` bytes in all for ``holder``, which holds some already: for
        input whose size is not known ahead (a WebSocket message, arriving frame by
        frame). Its deadline still counts from the first reservation. False: no room
        for the rest (what it holds stays reserved)."""
        res = self.held.get(holder)
        if res is None:
            return self.reserve(holder, client, size, now)
        more = size - res.size
        if more <= 0:
            return True
        if self.used + more > self.total or \
                self.by_client[res.client] + more > self.per_client:
            return False
        res.size = size
        res.deadline = res.since + self.allowed_seconds(size)
        self.used += more
        self.by_client[res.client] += more
        return True

    def enqueue(self, holder: Any, client: str, size: int) -> None:
        """Wait for room, in arrival order (``release`` returns it with the others
        granted)."""
        self.waits += 1
        self.waiting[holder] = (client, size)

    def release(self, holder: Any, now: float = 0.0) -> list[Any]:
        """``holder``'s frame is complete, or its connection gone (waiting or not). The
        holders granted a reservation in its place, to be woken."""
        self.waiting.pop(holder, None)
        res = self.held.pop(holder, None)
        if res is None:
            return []
        self.used -= res.size
        left = self.by_client[res.client] - res.size
        if left:
            self.by_client[res.client] = left
        else:
            del self.by_client[res.client]
        return self._grant(now)

    def overdue(self, now: float) -> list[Any]:
        """Holders whose reservation is past its deadline (cut them: ``release`` when
        they are gone)."""
        late = [holder for holder, res in self.held.items() if res.deadline < now]
        self.cut += len(late)
        return late

    def reserved(self, holder: Any) -> int:
        res = self.held.get(holder)
        return res.size if res is not None else 0

    def stats(self) -> dict[str, int]:
        return {"reserved_bytes": self.used, "limit_bytes": self.total,
                "per_client_bytes": self.per_client, "holders": len(self.held),
                "waiting": len(self.waiting), "waited": self.waits, "cut": self.cut}

    @staticmethod
    def allowed_seconds(size: int) -> float:
        """How long a frame or body of ``size`` bytes may take to arrive once reserved."""
        return INPUT_GRACE_S + size / INPUT_MIN_RATE

    def _fits(self, client: str, size: int) -> bool:
        if not self.held:
            return True  # alone, any size the frame limit lets through gets in
        mine = self.by_client.get(client, 0)
        if mine and mine + size > self.per_client:
            return False
        return self.used + size <= self.total

    def _take(self, holder: Any, client: str, size: int, now: float) -> None:
        self.held[holder] = Reservation(client, size, now, now + self.allowed_seconds(size))
        self.used += size
        self.by_client[client] = self.by_client.get(client, 0) + size

    def _grant(self, now: float) -> list[Any]:
        granted = []
        for holder, (client, size) in list(self.waiting.items()):
            if not self._fits(client, size):
                if self.by_client.get(client, 0) + size > self.per_client:
                    continue  # its client's share is full: not the others' turn lost
                break  # the budget is full: first come, first served
            del self.waiting[holder]
            self._take(holder, client, size, now)
            granted.append(holder)
        return granted
