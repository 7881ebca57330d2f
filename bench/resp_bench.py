#!/usr/bin/env python3
"""The Redis protocol door (issue 26) against a real Redis, with the same redis-py
workload on both, in the same run.

  .venv/bin/python bench/resp_bench.py             (SQLite, fsync: the default)
  .venv/bin/python bench/resp_bench.py --runs 3 -n 100000

Rows: ``XADD`` of 100 B pipelined 1000 per round trip by 1 and by 4 producer
processes; ``XREADGROUP COUNT 1000`` + one ``XACK`` per batch by 1 and by 4 consumer
processes over a stream pre-filled with N entries. The peer is redis-server with AOF
``everysec`` (bench/peers.py's ``redis-aof``); minou confirms an XADD once it is
fsync'd. Each process is peers.py's worker (uvloop, a barrier, CLOCK_MONOTONIC);
minou's connections authenticate as a client with its own key (a JWT as the Redis
password) under a rule. A fresh broker and a fresh Redis for every test. Printed: a
table of medians of ``--runs`` runs (min - max) and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import peers  # noqa: E402
from bench_clients import _process_key, run_jobs  # noqa: E402
from bench_servers import MinouBroker, PeerServer  # noqa: E402

CLIENT = "bench-resp"


class RespPeer(peers.RedisPeer):
    """peers.py's Redis driver, pointed at minou's Redis protocol door."""

    def __init__(self, job: dict[str, Any]) -> None:
        super().__init__(job["resp_port"])
        self.password = job["password"]

    async def connect(self) -> None:
        import redis.asyncio as aioredis

        self.r = aioredis.Redis(host="127.0.0.1", port=self.port, username=CLIENT,
                                password=self.password)
        await self.r.ping()


def minou_password(url: str) -> str:
    """Register the bench client's key (a first native connection), then its JWT."""
    import minou
    from minou.auth.tokens import make_token

    async def register() -> None:
        c = await minou.connect(url, client_id=CLIENT, key=_process_key())
        await c.close()

    asyncio.run(register())
    return make_token(CLIENT, _process_key(), "minou", ttl=3600)


def make_group(port: int, password: str | None) -> None:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port, username=CLIENT if password else None,
                    password=password)
    r.xgroup_create(peers.QUEUE, peers.GROUP, id="0", mkstream=True)
    r.close()


TESTS = [("XADD pipelined, 1 producer (msg/s)", "pub", 1),
         ("XADD pipelined, 4 producers (msg/s)", "pub", 4),
         ("XREADGROUP COUNT 1000 + XACK, 1 consumer (msg/s)", "con", 1),
         ("XREADGROUP COUNT 1000 + XACK, 4 consumers (msg/s)", "con", 4)]


def run_test(system: str, role: str, procs: int, n: int, work: Path) -> float:
    broker = MinouBroker(work, extra_config="resp_port = 0\n") if system == "minou" else None
    redis_server = PeerServer("redis-aof", work) if broker is None else None
    try:
        if broker is not None:
            url = broker.start()
            password: str | None = minou_password(url)
            assert broker.resp_port is not None
            port = broker.resp_port
            base: dict[str, Any] = {"peer": "minou-resp", "resp_port": port,
                                    "password": password}
        else:
            assert redis_server is not None
            redis_server.start()
            port, password = redis_server.port, None
            base = {"peer": "redis-aof", "ports": {"redis-aof": port}}
        make_group(port, password)
        pub = [{**base, "role": "pub", "n": n // (procs if role == "pub" else 2),
                "size": 100, "window": 1000, "limit_s": 120}
               for _ in range(procs if role == "pub" else 2)]
        results = run_jobs(pub, timeout=300)
        if role == "pub":
            return peers.throughput(results)[1]
        con = [{**base, "role": "con", "n": n // procs, "batch": 1000, "idle_s": 3.0,
                "limit_s": 120, "name": f"c{i}"} for i in range(procs)]
        return peers.throughput(run_jobs(con, timeout=300))[1]
    finally:
        if broker is not None:
            broker.close()
        if redis_server is not None:
            redis_server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=100_000, help="messages per test")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="minou-resp-", dir=HERE / "results") as work:
        for _ in range(args.runs):
            for label, role, procs in TESTS:
                for system in ("minou", "redis-aof"):
                    results.setdefault((label, system), []).append(
                        run_test(system, role, procs, args.n, Path(work)))

    def cell(values: list[float]) -> str:
        v = sorted(values)
        return f"{statistics.median(v):,.0f} ({v[0]:,.0f} - {v[-1]:,.0f})"

    print(f"Redis protocol, redis-py workload, medians of {args.runs} runs (min - max)")
    print("| test | minou (RESP) | redis-aof (everysec) | minou/redis |\n|---|---:|---:|---:|")
    for label, _, _ in TESTS:
        m, r = results[(label, "minou")], results[(label, "redis-aof")]
        print(f"| {label} | {cell(m)} | {cell(r)} | "
              f"{statistics.median(m) / statistics.median(r):.2f}x |")


if __name__ == "__main__":
    main()
