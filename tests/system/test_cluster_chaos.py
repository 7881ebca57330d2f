"""Chaos over three brokers on Redis (issue 18, item 4), short: the run of
``make chaos`` (tests/chaos.py) with fewer faults, and its counts asserted.

A Redis primary with a replica (``replicas = 1``), three brokers (``owner_lease`` 1 s),
four producers and four consumers, native and HTTP; three kill -9 of a random broker,
two SIGSTOP of the primary past its lease then SIGCONT, one SIGTERM of the primary,
each broker started again. Then: no confirmed message lost or changed, none delivered
after its ack was confirmed, every duplicate delivery explained by an unsettled earlier
one, first deliveries in order per consumer and channel, every woken primary exited 1
(or stayed a standby), and no primary lost its lease without having been paused.
``MINOU_CHAOS_SEED`` picks another schedule of faults (default 18).

The same with ``placement = "spread"``: six queues spread over the three brokers, no
primary; three kill -9 of a random broker, two SIGSTOP of a broker owning queues past
its lease (woken, each must exit 1), one clean stop (SIGTERM or ``minou soft-stop``,
exit 0) of a broker owning queues; the second group is read by a native consumer (an
HTTP consumer reads only its broker's queues there). The same counts asserted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..chaos import Chaos, Plan, failures
from ..redis_server import REDIS_SERVER

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]


def test_three_brokers_under_kills_pauses_and_a_clean_stop_lose_nothing_confirmed(
        tmp_path: Path) -> None:
    plan = Plan(seconds=30, seed=int(os.environ.get("MINOU_CHAOS_SEED", "18")), kills=3,
                pauses=2, graceful=1)
    lines: list[str] = []
    counts = Chaos(plan, tmp_path, out=lines.append).run()
    report = "\n".join([*lines, "", counts.table(), *(
        f"  {k}: {'; '.join(v)}" for k, v in counts.examples.items()), *counts.anomalies])
    print(report)  # shown with -s, and below any failure
    assert failures(counts) == [], report
    assert counts.confirmed > 300, report  # the load went on through the faults
    assert counts.confirmed_lost == 0 and counts.confirmed_changed == 0, report
    assert counts.after_ack == 0 and counts.duplicates_unexplained == 0, report
    assert counts.order_violations == 0, report
    assert counts.pauses_exit_1 + counts.pauses_standby == 2, report
    # Each pause and the clean stop hand the lease to another broker: a takeover each.
    assert counts.takeovers >= 3, report


def test_spread_three_brokers_under_kills_pauses_and_a_clean_stop_lose_nothing_confirmed(
        tmp_path: Path) -> None:
    plan = Plan(seconds=30, seed=int(os.environ.get("MINOU_CHAOS_SEED", "18")), kills=3,
                pauses=2, graceful=1, placement="spread")
    lines: list[str] = []
    counts = Chaos(plan, tmp_path, out=lines.append).run()
    report = "\n".join([*lines, "", counts.table(), *(
        f"  {k}: {'; '.join(v)}" for k, v in counts.examples.items()), *counts.anomalies])
    print(report)  # shown with -s, and below any failure
    assert failures(counts) == [], report
    assert counts.confirmed > 300, report  # the load went on through the faults
    assert counts.confirmed_lost == 0 and counts.confirmed_changed == 0, report
    assert counts.after_ack == 0 and counts.duplicates_unexplained == 0, report
    assert counts.order_violations == 0, report
    # Each woken broker found its queues taken and exited 1: none stays up.
    assert counts.pauses_exit_1 == 2 and counts.pauses_standby == 0, report
    # The pauses and the clean stop hit brokers owning queues: each moved some.
    assert counts.queues_moved >= 3, report
