"""The broker's last minutes of rates: fixed rings, oldest first, per queue and overall."""

from __future__ import annotations

import pytest

from minou.server.metrics import RateTracker
from minou.server.rate_history import RateHistory


def _tick(h: RateHistory, t: float, published: int, delivered: int = 0, acked: int = 0,
          **queues: tuple[int, int, int]) -> None:
    counters = {"published": published, "delivered": delivered, "acked": acked,
                "schema_refused": 7}
    h.sample(t, counters, {name.replace("_", "/"): (p, d, a, 1)
                           for name, (p, d, a) in queues.items()})


def test_rates_between_samples_oldest_first_with_the_first_unknown() -> None:
    h = RateHistory(seconds=5)
    assert h.series() == {"interval_s": 1.0, "t": [], "published": [], "delivered": [],
                          "acked": []}
    _tick(h, 100.0, 10, 0, 0, orders_v1=(10, 0, 0))
    _tick(h, 101.0, 30, 5, 2, orders_v1=(20, 5, 2))
    _tick(h, 103.0, 30, 9, 6, orders_v1=(20, 9, 6))
    s = h.series()
    assert s["t"] == [100.0, 101.0, 103.0]
    assert s["published"] == [None, 20.0, 0.0]
    assert s["delivered"] == [None, 5.0, 2.0] and s["acked"] == [None, 2.0, 2.0]
    q = h.series("orders/v1")
    assert q["published"] == [None, 10.0, 0.0] and q["t"] == s["t"]
    assert h.series("nothing/v1")["t"] == []


def test_the_ring_keeps_only_the_last_seconds() -> None:
    h = RateHistory(seconds=4)
    for i in range(10):
        _tick(h, 100.0 + i, 3 * i)
    s = h.series()
    assert s["t"] == [106.0, 107.0, 108.0, 109.0]
    assert s["published"] == [3.0] * 4


def test_a_queue_appearing_later_is_rated_from_zero_and_a_counter_reset_is_unknown() -> None:
    h = RateHistory(seconds=6)
    _tick(h, 1.0, 0)
    _tick(h, 2.0, 0)
    _tick(h, 3.0, 5, audit_v1=(5, 0, 0))  # came since 2.0 with 5 published: its counters
    _tick(h, 4.0, 9, audit_v1=(9, 0, 0))  # start with it, so that is 5 a second
    _tick(h, 5.0, 9, audit_v1=(1, 0, 0))  # purged and recreated: counters went down
    assert h.series("audit/v1")["published"] == [None, None, 5.0, 4.0, None]


def test_memory_is_bounded_in_queues_and_forgotten_queues_free_their_slot() -> None:
    h = RateHistory(seconds=3, max_queues=2)
    _tick(h, 1.0, 0, a_v1=(0, 0, 0), b_v1=(0, 0, 0), c_v1=(0, 0, 0))
    _tick(h, 2.0, 0, a_v1=(1, 0, 0), b_v1=(1, 0, 0), c_v1=(1, 0, 0))
    assert [bool(h.series(q)["t"]) for q in ("a/v1", "b/v1", "c/v1")] == [True, True, False]
    assert h.series()["published"] == [None, 0.0]  # the broker's own always is
    for t in (3.0, 4.0, 5.0):  # a/v1 and b/v1 gone for a whole window
        _tick(h, t, 0, c_v1=(1, 0, 0))
    _tick(h, 6.0, 0, c_v1=(2, 0, 0))
    assert h.series("a/v1")["t"] == [] and h.series("c/v1")["published"][-1] == 1.0


def test_the_rate_tracker_feeds_its_history() -> None:
    h = RateHistory(seconds=10)
    tracker = RateTracker(window_s=60.0, history=h)
    tracker.sample(10.0, {"published": 0, "refused": {"x": 1}})
    tracker.sample(12.0, {"published": 8, "refused": {"x": 1}})
    assert tracker.rate("published") == 4.0
    assert h.series()["published"] == [None, 4.0]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="seconds"):
        RateHistory(seconds=1)
