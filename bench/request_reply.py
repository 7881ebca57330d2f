#!/usr/bin/env python3
"""Request/reply through a real broker (issue 21): round-trip latency of one request at
a time, and requests per second with many in flight, a responder in another process.

  .venv/bin/python bench/request_reply.py                  (SQLite, fsync: the default)
  .venv/bin/python bench/request_reply.py --durability interval --requests 5000

Each request is two durable publishes (the request, then the reply, each confirmed
only once on the disk with the default durability), two deliveries and two acks. The
broker is a fresh ``minou start`` (authenticated clients under a rule, as deployed);
the responder (``client.serve``) runs in a process of its own, the requester here.
Printed: a table with the medians of ``--runs`` runs and their spread.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402

CHANNEL = "bench/v1/quote"


def respond(url: str, ready: Any) -> None:
    async def main() -> None:
        client = await minou.connect(url, client_id="bench-responder", key=_process_key())
        await client.serve("bench/v1/*", lambda msg: {"price": msg.payload["qty"] * 2},
                           group="responders", prefetch=256)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(url: str, requests: int, concurrency: int) -> dict[str, float]:
    client = await minou.connect(url, client_id="bench-requester", key=_process_key())
    try:
        for _ in range(50):  # warm up: the inbox, the responder's group, the caches
            await client.request(CHANNEL, {"qty": 1})
        one: list[float] = []
        for n in range(min(requests, 2000)):
            t0 = time.perf_counter()
            await client.request(CHANNEL, {"qty": n})
            one.append(time.perf_counter() - t0)
        one.sort()
        left = iter(range(requests))

        async def worker() -> None:
            for n in left:
                await client.request(CHANNEL, {"qty": n})

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        rate = requests / (time.perf_counter() - t0)
    finally:
        await client.close()
    return {"p50_ms": one[len(one) // 2] * 1000, "p99_ms": one[int(len(one) * 0.99)] * 1000,
            "rate": rate}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests in the rate row")
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--durability", choices=("fsync", "interval"), default="fsync")
    args = ap.parse_args()
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="minou-rr-", dir=HERE / "results") as work:
        broker = MinouBroker(Path(work), durability=args.durability)
        try:
            for _ in range(args.runs):
                url = broker.start()
                ready = mp.Event()
                responder = mp.Process(target=respond, args=(url, ready), daemon=True)
                responder.start()
                if not ready.wait(30):
                    raise SystemExit("the responder did not start")
                try:
                    results.append(asyncio.run(measure(url, args.requests,
                                                       args.concurrency)))
                finally:
                    responder.kill()
                    responder.join(5)
        finally:
            broker.close()

    def cell(key: str, fmt: str) -> str:
        values = sorted(r[key] for r in results)
        return (f"{format(statistics.median(values), fmt)} "
                f"({format(values[0], fmt)} - {format(values[-1], fmt)})")

    print(f"request/reply, {args.durability}, medians of {args.runs} runs (min - max)")
    print("| row | minou |\n|---|---|")
    print(f"| one request at a time: round trip p50 (ms) | {cell('p50_ms', '.2f')} |")
    print(f"| one request at a time: round trip p99 (ms) | {cell('p99_ms', '.2f')} |")
    print(f"| {args.concurrency} in flight (requests/s) | {cell('rate', ',.0f')} |")


if __name__ == "__main__":
    main()
