"""A broker on Redis under Sentinel (issue 18, item 3): kill -9 the Redis primary
under load with ``replicas = 1``; Sentinel promotes a replica and the broker follows
it by itself: publishes are refused with STORAGE_UNAVAILABLE (``/health`` 503
``storage_unavailable``) meanwhile, then confirmed again on the new primary, and every
message confirmed before, during and after is there, exactly as confirmed.

Two shapes: two replicas (the promoted one still has a replica to WAIT for: nobody
has to do anything), and one replica (the promoted one has none until the old
primary comes back, which Sentinel turns into its replica).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import wait_until
from ..redis_sentinel import SentinelSet
from ..redis_server import REDIS_SERVER
from .test_full_disk import drain, health
from .test_redis_storage import Producer

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]


@pytest.mark.parametrize("replicas", [2, 1], ids=["two-replicas", "one-replica"])
def test_redis_primary_killed_under_sentinel_the_broker_follows_the_new_one_losing_nothing(
        broker_factory: Any, tmp_path: Path, replicas: int) -> None:
    redis = SentinelSet(tmp_path / "redis", replicas=replicas).start()
    try:
        url = redis.url()
        cfg = tmp_path / "sentinel.toml"
        cfg.write_text(f'[storage]\nurl = "{url}"\nreplicas = 1\n')
        b = broker_factory.make(config=cfg, storage=url).start()
        producer = Producer(b)
        producer.start()
        try:
            wait_until(lambda: len(producer.confirmed) >= 200, 30,
                       what="publishes before the kill")
            old = redis.primary
            killed_at = time.monotonic()
            old.kill()  # kill -9 the Redis primary
            wait_until(lambda: producer.refused, 30, what="a refusal while Redis fails over")
            assert set(producer.refused.values()) == {300}  # STORAGE_UNAVAILABLE
            r = health(b)
            assert r.status_code == 503 and r.json()["status"] == "storage_unavailable"
            wait_until(lambda: redis.master_port() != old.port, 30,
                       what="Sentinel to promote a replica")
            promoted_at = time.monotonic()
            new = redis.server_at(redis.master_port())
            if replicas == 1:
                # The promoted replica has none of its own: commits cannot be confirmed,
                # and the broker, already on the new primary, says so.
                wait_until(lambda: f"(primary 127.0.0.1:{new.port}) has 0 replica(s)"
                           in health(b).text, 30, what="the broker on the new primary")
                old.start()  # back from its AOF; Sentinel makes it the new one's replica
            seen = len(producer.confirmed)
            wait_until(lambda: len(producer.confirmed) > seen + 200, 60,
                       what="publishes confirmed on the new primary")
            assert health(b).status_code == 200
            first_after = min(at for at in producer.confirmed_at.values()
                              if at > killed_at + 0.05)
            print(f"\nreplicas={replicas}: kill -> promotion {promoted_at - killed_at:.2f} s, "
                  f"kill -> first confirm on the new primary {first_after - killed_at:.2f} s")
        finally:
            producer.stop.set()
            producer.join(30)
        assert b.alive
        got, _ = drain(b, "recount", len(producer.confirmed))
        assert set(producer.confirmed) <= set(got), "a confirmed message is missing"
        assert all(got[seq] == n for seq, n in producer.confirmed.items())  # as confirmed
        assert b.stop() == 0
    finally:
        redis.stop()
