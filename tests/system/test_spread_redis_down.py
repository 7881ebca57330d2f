"""Redis out of reach for every broker spreading the queues (paused, restarting): not a
partition of one broker, so none stops; once Redis answers they all go on. (A broker
cut off alone stops: ``test_a_broker_cut_off_from_redis_exits_and_the_other_adopts_its_queues``.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import minou

from ..conftest import wait_until
from ..redis_server import RedisServer
from . import test_spread
from .test_spread import (
    LEASE,
    QUEUES,
    SPREAD_MARKS,
    consume,
    publish_all,
    settled_spread,
    spread_brokers,
)

pytestmark = SPREAD_MARKS
redis = test_spread.redis  # the fixture: one Redis per test


@pytest.mark.parametrize("how", ["paused", "restarted"])
def test_redis_out_of_reach_past_the_lease_stops_no_spreading_broker(
        broker_factory: Any, redis: RedisServer, tmp_path: Path, how: str) -> None:
    """redis-server SIGSTOPped for five leases then SIGCONT, or killed -9 and started
    again from its AOF five leases later: every broker's renewals failed past its lease,
    and so did the others'; each asks the others' ``/health``, finds none reaching
    Redis, and stays up (it used to stop: all of them exited 1 and nothing served once
    Redis was back). Once Redis answers, the first broker to renew leaves the other's
    queues to it for a lease (it used to adopt them at once, fencing the other, which
    then stopped). Everything confirmed before and after is read back once."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    sent = publish_all(a, 5)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    assert "redis_seen_s" in httpx.get(a.http + "/health").json()
    assert redis.proc is not None
    if how == "paused":
        os.kill(redis.proc.pid, signal.SIGSTOP)
    else:
        redis.kill()
    try:
        time.sleep(5 * LEASE)
        assert a.alive and b.alive, (a.output + b.output)[-3000:]
    finally:
        if how == "paused":
            os.kill(redis.proc.pid, signal.SIGCONT)
        else:
            redis.start()
    wait_until(lambda: settled_spread(b, 2), timeout=20)
    time.sleep(3 * LEASE)  # past the lease left to the other broker
    assert a.alive and b.alive, (a.output + b.output)[-3000:]
    assert "no other live broker reaches it either" in a.output + b.output
    sent += publish_all(b, 5, start=5)
    got = consume(a, sent)
    assert len(got) == sent and set(got.values()) == {1}


def test_redis_over_maxmemory_spreading_brokers_stay_alive_deliver_and_resume(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Redis over ``maxmemory`` (noeviction: its operator lowered it under what is used):
    publishes are refused (``STORAGE_FULL``), and the brokers' alive records are still
    renewed (an allow-oom script), so they stay alive and deliver; consumers ack, the
    acked messages go, and publishes resume by themselves. The records used to be plain
    writes, refused like publishes: past the lease every broker delivered nothing (and
    stopped), so nothing could free the room."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    with a.connect_sync("producer") as c:
        for i in range(40):
            c.send_many([(f"{q}/1", {"n": i, "q": q, "pad": "x" * 8000}) for q in QUEUES])
    sent = 40 * len(QUEUES)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    client = redis.client()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(client.info("memory")["used_memory"] * 4 // 5))
    with b.connect_sync("late") as c, pytest.raises(minou.MinouError, match="maxmemory"):
        c.send("orders/v1/1", {"n": -1, "q": "orders/v1"})
    time.sleep(3 * LEASE)  # past the lease: the records must have been renewed
    assert a.alive and b.alive, (a.output + b.output)[-3000:]
    assert "cannot renew" not in a.output + b.output
    got = consume(a, sent)
    assert len(got) == sent and set(got.values()) == {1}

    def published() -> bool:
        try:
            with b.connect_sync("late") as c:
                c.send("orders/v1/1", {"n": -1, "q": "orders/v1"})
        except minou.MinouError:
            return False
        return True

    wait_until(published, timeout=20, what="publishes accepted once the acked ones went")
