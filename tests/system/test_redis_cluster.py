"""A broker on a Redis Cluster (``redis+cluster://``, issue 18 item 3): a real broker
process on three real ``redis-server --cluster-enabled`` primaries. Its queues shard
over the nodes by hash tag; killed -9 under load over several queues and started
again, it has every message it confirmed."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import minou
from minou.errors import StorageUnavailable

from ..conftest import BrokerProcess, wait_until
from ..redis_cluster import RedisCluster
from ..redis_server import REDIS_SERVER
from .test_redis_failover import cluster_view

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

ENDPOINTS = [f"shard{i}" for i in range(6)]  # six queues: shardN/v1


class Producer(threading.Thread):
    """Publishes to ``channel`` without pause; records confirmed (seq -> n)."""

    def __init__(self, broker: BrokerProcess, channel: str, *, retry: bool = False) -> None:
        super().__init__(daemon=True)
        self.broker, self.channel, self.retry = broker, channel, retry
        self.confirmed: dict[int, int] = {}
        self.refused: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with self.broker.connect_sync(f"pub-{self.channel.split('/')[0]}",
                                          reconnect=self.retry) as c:
                n = 0
                while not self.stop.is_set():
                    try:
                        receipt = c.send(self.channel, {"n": n})
                    except StorageUnavailable as exc:
                        self.refused.append(int(exc.code))
                        time.sleep(0.05)
                    else:
                        self.confirmed[receipt.seq] = n
                    n += 1
        except (minou.MinouError, OSError):
            return  # the broker was killed under it: what it confirmed is the count


def _read_all(broker: BrokerProcess, channel: str, expect: int) -> dict[int, int]:
    got: dict[int, int] = {}
    with broker.connect_sync("reader") as c:
        sub = c.consume(channel, group="count", prefetch=256)
        while True:
            try:
                msg = sub.get(timeout=20 if len(got) < expect else 1.0)
            except (TimeoutError, minou.Timeout):
                return got
            got[msg.seq] = msg.payload["n"]
            msg.ack()


def test_a_broker_on_a_redis_cluster_shards_its_queues_and_loses_nothing_when_killed(
        broker_factory: Any, redis_cluster: RedisCluster) -> None:
    prefix = f"sys{os.getpid()}-{time.monotonic_ns()}"
    b = broker_factory.make(storage=f"{redis_cluster.url}?prefix={prefix}").start()
    producers = [Producer(b, f"{e}/v1/1") for e in ENDPOINTS]
    for p in producers:
        p.start()
    wait_until(lambda: all(len(p.confirmed) >= 50 for p in producers), 60,
               what="publishes confirmed on every queue")
    b.kill()  # kill -9 mid-load
    for p in producers:
        p.stop.set()
        p.join(30)
    # The queues' keys are spread over the cluster's nodes, each queue whole on one.
    holders: dict[str, set[int]] = {}
    for i, node in enumerate(redis_cluster.clients()):
        for key in node.scan_iter(match=f"{prefix}:*", count=1000):
            tag = key.decode(errors="replace").split("{", 1)[1].split("}", 1)[0]
            holders.setdefault(tag, set()).add(i)
    queues = {f"{e}/v1" for e in ENDPOINTS}
    assert queues <= set(holders), holders
    assert all(len(holders[q]) == 1 for q in queues), holders
    assert len({next(iter(holders[q])) for q in queues}) >= 2, holders

    b.start()  # the same cluster and prefix: it claims every queue again
    for p in producers:
        got = _read_all(b, p.channel, len(p.confirmed))
        missing = set(p.confirmed) - set(got)
        assert not missing, f"{p.channel}: confirmed and lost: {sorted(missing)[:10]}"
        assert all(got[seq] == n for seq, n in p.confirmed.items())
    r = httpx.get(b.http + "/health", timeout=10)
    assert r.status_code == 200, r.text
    # `minou cluster` on a Redis Cluster: this broker primary, every queue claimed twice
    # (the first start, the restart) under this broker.
    view = cluster_view(b, b)
    me = view["this_broker"]["member"]
    assert view["primary"] == me
    assert [m["role"] for m in view["brokers"] if m["id"] == me] == ["primary"]
    assert {q["queue"]: (q["epoch"], q["owner"]) for q in view["queues"]
            if q["queue"] in queues} == {q: (2, me) for q in queues}
    assert b.stop() == 0


@pytest.fixture
def cluster_with_replicas(tmp_path: Path) -> Iterator[RedisCluster]:
    """Three primaries, each with a replica: a cluster of the test's own, to kill."""
    cluster = RedisCluster(tmp_path / "cluster", replicas=3).start()
    yield cluster
    cluster.stop()


def test_a_cluster_primary_killed_under_load_with_replicas_1_loses_nothing_confirmed(
        broker_factory: Any, cluster_with_replicas: RedisCluster) -> None:
    cluster = cluster_with_replicas
    prefix = f"fo{os.getpid()}"
    b = broker_factory.make(storage=f"{cluster.url}?prefix={prefix}&replicas=1").start()
    producers = [Producer(b, f"{e}/v1/1", retry=True) for e in ENDPOINTS]
    for p in producers:
        p.start()
    try:
        wait_until(lambda: all(len(p.confirmed) >= 30 for p in producers), 60,
                   what="publishes confirmed on every queue")
        victim = cluster.primary_of(f"{prefix}:{{{ENDPOINTS[0]}/v1}}:epoch")
        replica = next(n for n in cluster.nodes if n is not victim and str(
            n.client().info("replication").get("master_port")) == str(victim.port))
        victim.kill()  # kill -9 of the Redis primary holding shard0/v1
        killed = time.monotonic()
        wait_until(lambda: any(p.refused for p in producers), 30,
                   what="publishes refused while the cluster fails over")
        wait_until(lambda: replica.client().info("replication")["role"] == "master", 30,
                   what="the cluster to promote the replica")
        promoted = time.monotonic() - killed
        # The promoted replica has no replica of its own for a commit to WAIT for:
        # publishes stay refused until the old primary is back, as its replica.
        stalled = sum(len(p.confirmed) for p in producers)
        time.sleep(1.5)
        assert sum(len(p.confirmed) for p in producers) == stalled, \
            "a publish was confirmed without the replica its commit waits for"
        victim.start()
        counts = [len(p.confirmed) for p in producers]
        wait_until(lambda: all(len(p.confirmed) >= c + 30 for p, c in
                               zip(producers, counts, strict=True)), 90,
                   what="publishes confirmed again on every queue")
        resumed = time.monotonic() - killed
    finally:
        for p in producers:
            p.stop.set()
        for p in producers:
            p.join(30)
    assert b.alive
    for p in producers:
        got = _read_all(b, p.channel, len(p.confirmed))
        missing = set(p.confirmed) - set(got)
        assert not missing, f"{p.channel}: confirmed and lost: {sorted(missing)[:10]}"
        assert all(got[seq] == n for seq, n in p.confirmed.items())
    assert "cannot be reached" in b.output or "failed" in b.output, b.output[-2000:]
    print(f"kill -9 of a cluster primary -> replica promoted {promoted:.1f} s, publishes "
          f"confirmed again {resumed:.1f} s (the old primary restarted once promoted away)")
    assert b.stop() == 0
