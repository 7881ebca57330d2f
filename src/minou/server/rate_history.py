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
from collections.abc import Mapping
from typing import Any

from ..limits import RATE_HISTORY_QUEUES, RATE_HISTORY_S

BROKER = ""  # the key of the whole broker's series
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
        self._last: dict[str, tuple[float, float, float]] = {}  # the previous totals
        self._last_t: float | None = None

    def sample(self, now: float, counters: Mapping[str, float]) -> None:
        """Take the counters of one tick: ``published``, ``delivered``, ``acked`` for the
        broker and ``<queue>|published`` (…) per queue, as the ticker gives RateTracker."""
        totals = _totals(counters)
        dt = now - self._last_t if self._last_t is not None else 0.0
        pos = self._pos
        self._times[pos] = now
        for key in list(self._rings):
            if key not in totals:
                if self._absent_everywhere(key):
                    del self._rings[key]  # gone for a whole window: its slot is free
                else:
                    self._write(self._rings[key], pos, None)
        for key, values in totals.items():
            ring = self._rings.get(key)
            if ring is None:
                if key != BROKER and len(self._rings) - (BROKER in self._rings) \
                        >= self.max_queues:
                    continue
                ring = self._rings[key] = array("d", [math.nan]) * (3 * self.seconds)
            before = self._last.get(key)
            rates = None
            if before is not None and dt > 0:
                rates = tuple((v - b) / dt if v >= b else math.nan
                              for v, b in zip(values, before, strict=True))
            self._write(ring, pos, rates)
        self._last = totals
        self._last_t = now
        self._pos = (pos + 1) % self.seconds
        self._count = min(self._count + 1, self.seconds)

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


def _totals(counters: Mapping[str, float]) -> dict[str, tuple[float, float, float]]:
    out: dict[str, list[float]] = {}
    for name, value in counters.items():
        key, sep, rate = name.rpartition("|")
        if not sep:
            key, rate = BROKER, name
        if rate in RATES:
            out.setdefault(key, [0.0, 0.0, 0.0])[RATES.index(rate)] = float(value)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)
