"""apply() throughput of the storage backends, side by side: batches shaped like the
broker's group commits. Not part of `make bench` (which measures brokers); run it to see
what a commit costs on each backend:

    python bench/storage_apply.py [--batches 300] [--runs 3]

SQLite runs in a temp dir (synchronous=FULL); Redis is a redis-server this script
starts on a free loopback port with appendonly yes and appendfsync always, and the
Redis Cluster three such servers with cluster-enabled (the slots split evenly), in the
same run. Prints medians of ``--runs`` runs: batches/s and messages/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_cluster import RedisCluster
from tests.redis_server import RedisServer

from minou.core.log import Msg
from minou.core.writes import WriteBatch
from minou.storage.base import Storage
from minou.storage.redis import RedisStorage
from minou.storage.sqlite import SQLiteStorage

BODY = b"x" * 100
GROUP = "consume:bench"


def publishes(channels: list[str], per_batch: int) -> Callable[[int], WriteBatch]:
    """Batch i: ``per_batch`` messages of 100 B, spread over ``channels``."""
    def make(i: int) -> WriteBatch:
        b = WriteBatch()
        per = per_batch // len(channels)
        for ch in channels:
            first = i * per + 1
            b.messages.extend(Msg(ch, s, f"id-{s}", BODY, published_at=time.time())
                              for s in range(first, first + per))
            if i == 0:
                b.channels[ch] = 1
        return b
    return make


def acks(channels: list[str], per_batch: int) -> Callable[[int], WriteBatch]:
    """Batch i: the group's state per channel and the settled head truncated (what a
    batch of ``per_batch`` acks writes)."""
    def make(i: int) -> WriteBatch:
        per = per_batch // len(channels)
        upto = (i + 1) * per + 1
        return WriteBatch(
            group_states={(GROUP, ch): (upto, b"\x93\x90\x80\x90" * 8) for ch in channels},
            truncates=dict.fromkeys(channels, upto), channels=dict.fromkeys(channels, upto))
    return make


def run(st: Storage, make: Callable[[int], WriteBatch], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        st.apply(make(i))
    return n / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    shapes = {
        "publish 100 x 100 B, 1 queue": (["orders/v1/1"], 100),
        "publish 100 x 100 B, 4 queues": ([f"q{k}/v1/1" for k in range(4)], 100),
        "publish 96 x 100 B, 8 queues": ([f"q{k}/v1/1" for k in range(8)], 96),
        "ack 100 (states + truncate), 1 queue": (["orders/v1/1"], 100),
    }
    backends = ("sqlite", "redis", "cluster")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        cluster = RedisCluster(Path(tmp) / "cluster").start()
        try:
            results: dict[tuple[str, str], list[float]] = {}
            for r in range(args.runs):
                for backend in backends:
                    st: Storage
                    if backend == "sqlite":
                        st = SQLiteStorage(Path(tmp) / f"sqlite{r}")
                    elif backend == "redis":
                        st = RedisStorage(f"{server.url}?prefix=bench{r}")
                    else:
                        st = RedisStorage(f"{cluster.url}?prefix=bench{r}")
                    st.open(time.time())
                    for name, (channels, per) in shapes.items():
                        if name.startswith("ack"):
                            make = acks(channels, per)
                        else:
                            make = publishes([f"{r}{c}" for c in channels], per)
                        if name.startswith("ack"):  # acks settle what was published
                            pub = publishes(channels, per)
                            for i in range(args.batches):
                                st.apply(pub(i))
                        results.setdefault((name, backend), []).append(
                            run(st, make, args.batches))
                    st.close()
        finally:
            server.stop()
            cluster.stop()
    print(f"{'batch shape':40} {'sqlite b/s':>11} {'redis b/s':>10} {'cluster b/s':>12} "
          f"{'redis/sqlite':>13} {'cluster/redis':>14}")
    for name, (_, per) in shapes.items():
        lite, red, clu = (statistics.median(results[name, b]) for b in backends)
        print(f"{name:40} {lite:11.0f} {red:10.0f} {clu:12.0f} {red / lite:13.0%} "
              f"{clu / red:14.0%}   ({lite * per:.0f} / {red * per:.0f} / {clu * per:.0f} msg/s)")


if __name__ == "__main__":
    main()
