"""The last minutes of message rates, so a dashboard chart starts full, not empty.

The broker's once-a-second ticker samples its counters (through
``metrics.RateTracker``); this keeps, for the whole broker and for up to
``max_queues`` queues, the publish, deliver and ack rates between consecutive
samples in ring buffers of ``seconds`` slots. Memory is fixed at start:
``(max_queues + 1) * 3 * seconds`` floats plus the sample times, about 1.5 MB
with the defaults. ``GET /v1/rates/history`` serves it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from ..limits import RATE_HISTORY_QUEUES, RATE_HISTORY_S

BROKER = ""  # the key of the whole broker's series
_NEW = (0.0, 0.0, 0.0)  # a queue's totals before it came
RATES = ("published", "delivered", "acked")


class RateHistory:
    """Rings of (published, delivered, acked) per second, sampled about once a second."""

    def __init__(self, seconds: int = RATE_HISTORY_S, max_queues: int = RATE_HISTORY_QUEUES
                 ) -> None:
        if seconds < 2 or max_queues < 0:
            raise ValueError(f"need seconds >= 2 and max_queues >= 0, got {seconds}, "
                             f"{max_queues}")
        self.seconds = seconds
        self.max_queues = max_queues
        self._times = array("d", [math.nan]) * seconds
        self._pos = 0  # the slot the next sample goes to
        self._count = 0  # slots written so far (at most ``seconds``)
        self._rings: dict[str, array[float]] = {}  # key -> 3 * seconds rates, interleaved
        # The previous tick's totals: the queues' mapping as given (not copied).
        self._last: Mapping[str, Sequence[float]] = {}
        self._last_broker: tuple[float, float, float] | None = None
        self._last_t: float | None = None

    def sample(self, now: float, counters: Mapping[str, float],
               queues: Mapping[str, Sequence[float]] | None = None) -> None:
        """Take the totals of one tick: ``published``, ``delivered``, ``acked`` of the
        broker in ``counters``, and per queue a tuple beginning with those three, as
        the ticker gives RateTracker. Only the queues with a ring (at most
        ``max_queues``) are looked at once the rings are taken: a walk of every queue
        each second held the loop at 100,000 queues."""
        queues = {} if queues is None else queues
        broker = _broker_totals(counters)
        dt = now - self._last_t if self._last_t is not None else 0.0
        pos = self._pos
        self._times[pos] = now
        for key in list(self._rings):
            values = broker if key == BROKER else queues.get(key)
            if values is None:
                if self._absent_everywhere(key):
                    del self._rings[key]  # gone for a whole window: its slot is free
                else:
                    self._write(self._rings[key], pos, None)
            else:
                self._write(self._rings[key], pos, self._rates(key, values, dt))
        if broker is not None and BROKER not in self._rings:
            self._add(BROKER, broker, dt)
        if len(self._rings) - (BROKER in self._rings) < self.max_queues:
            for key, values in queues.items():
                if key not in self._rings:
                    self._add(key, values, dt)
                    if len(self._rings) - (BROKER in self._rings) >= self.max_queues:
                        break
        self._last, self._last_broker = queues, broker
        self._last_t = now
        self._pos = (pos + 1) % self.seconds
        self._count = min(self._count + 1, self.seconds)

    def _add(self, key: str, values: Sequence[float], dt: float) -> None:
        ring = self._rings[key] = array("d", [math.nan]) * (3 * self.seconds)
        self._write(ring, self._pos, self._rates(key, values, dt))

    def _rates(self, key: str, values: Sequence[float], dt: float
               ) -> tuple[float, ...] | None:
        """The rates since the previous tick (NaN for a counter that went down: purged
        and recreated); None without a previous tick. A queue that came since the
        previous tick is rated from 0: its counters start with it (a burst that made it
        shows)."""
        before = self._last_broker if key == BROKER else self._last.get(key, _NEW)
        if before is None or dt <= 0:
            return None
        return tuple((v - b) / dt if v >= b else math.nan
                     for v, b in zip(values[:3], before[:3], strict=True))

    def series(self, queue: str | None = None) -> dict[str, Any]:
        """Oldest first: ``t`` (unix seconds) and a list per rate (None where unknown);
        ``queue`` None for the whole broker. Empty lists for a queue with no history."""
        ring = self._rings.get(BROKER if queue is None else queue)
        slots = [(self._pos - self._count + i) % self.seconds for i in range(self._count)]
        out: dict[str, Any] = {"interval_s": 1.0, "t": [self._times[s] for s in slots]}
        for i, name in enumerate(RATES):
            out[name] = [_num(ring[3 * s + i]) for s in slots] if ring is not None else []
        if ring is None:
            out["t"] = []
        return out

    def _write(self, ring: array[float], pos: int, rates: tuple[float, ...] | None) -> None:
        for i in range(3):
            ring[3 * pos + i] = math.nan if rates is None else rates[i]

    def _absent_everywhere(self, key: str) -> bool:
        ring = self._rings[key]
        return self._count == self.seconds and all(math.isnan(v) for v in ring)


def _broker_totals(counters: Mapping[str, float]) -> tuple[float, float, float] | None:
    """The broker's (published, delivered, acked), 0 for one missing; None for none."""
    if not any(rate in counters for rate in RATES):
        return None
    p, d, a = (float(counters.get(rate, 0.0)) for rate in RATES)
    return p, d, a


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)
