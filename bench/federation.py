#!/usr/bin/env python3
"""Federation through one link (issue 22): messages per second carried, and the latency
it adds, between two real brokers on this machine.

  .venv/bin/python bench/federation.py                 (SQLite, fsync: the default)
  .venv/bin/python bench/federation.py --runs 3 --messages 50000

Two fresh ``minou start`` processes (``eu`` with a ``[[federation]]`` link pushing
``bench/v1/*`` into ``us``), authenticated clients under rules as deployed. Rows:
the rate at which a backlog of ``--messages`` already stored in ``eu`` crosses into
``us`` (four channels, the link alone doing the work); then, one message at a time,
the time from its publish confirmed in ``eu`` to its arrival at a consumer in ``us``,
beside the same publish-to-consumer time inside ``us`` alone (what the link adds is
the difference). Printed: a table with the medians of ``--runs`` runs (min - max).
"""

from __future__ import annotations

import argparse
import asyncio
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

CHANNELS = 4


async def measure(eu: str, us: str, messages: int, probes: int) -> dict[str, float]:
    producer = await minou.connect(eu, client_id="bench-producer", key=_process_key())
    reader = await minou.connect(us, client_id="bench-reader", key=_process_key())
    try:
        # A consumer in us, started before anything crosses (it only counts).
        got: asyncio.Queue[Any] = asyncio.Queue()
        sub = await reader.consume("bench/v1/*", group="bench", prefetch=1000)

        async def count() -> None:
            async for msg in sub:
                msg.ack()
                await got.put((msg.payload, time.perf_counter()))

        counting = asyncio.create_task(count())
        t0 = time.perf_counter()
        for i in range(0, messages, 500):
            await producer.send_many([(f"bench/v1/{n % CHANNELS}", {"n": n})
                                      for n in range(i, min(messages, i + 500))])
        stored = time.perf_counter() - t0
        seen = 0
        while seen < messages:
            await got.get()
            seen += 1
        rate = messages / (time.perf_counter() - t0)
        # One at a time: publish confirmed in eu -> delivered in us.
        crossed: list[float] = []
        for n in range(probes):
            t = time.perf_counter()
            await producer.send("bench/v1/probe", {"probe": n})
            _, at = await got.get()
            crossed.append(at - t)
        # The same inside us alone: publish confirmed in us -> delivered in us.
        local: list[float] = []
        for n in range(probes):
            t = time.perf_counter()
            await reader.send("bench/v1/local", {"probe": n})
            _, at = await got.get()
            local.append(at - t)
        counting.cancel()
    finally:
        await producer.close()
        await reader.close()

    def q(xs: list[float], f: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(len(xs) * f))] * 1000

    return {"rate": rate, "stored": messages / stored, "x50": q(crossed, 0.5),
            "x99": q(crossed, 0.99), "l50": q(local, 0.5), "l99": q(local, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--probes", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="minou-fed-", dir=HERE / "results") as work:
        for run in range(args.runs):
            base = Path(work) / f"run{run}"
            base.mkdir()
            us = MinouBroker(base, name="us", extra_config='broker_id = "us"\n')
            us_url = us.start()
            from minou.auth import keys

            link_key, _ = keys.save(keys.generate(), base, "bench-link")
            eu = MinouBroker(base, name="eu", extra_config=(
                'broker_id = "eu"\n[[federation]]\nname = "bench"\n'
                f'remote = "{us_url}"\nkey = "{link_key}"\nclient_id = "bench-link"\n'
                'push = ["bench/v1/*"]\n'))
            try:
                eu_url = eu.start()
                results.append(asyncio.run(measure(eu_url, us_url, args.messages,
                                                   args.probes)))
            finally:
                eu.close()
                us.close()

    def cell(key: str, fmt: str) -> str:
        values = sorted(r[key] for r in results)
        return (f"{format(statistics.median(values), fmt)} "
                f"({format(values[0], fmt)} - {format(values[-1], fmt)})")

    print(f"federation, one link eu -> us, SQLite fsync, medians of {args.runs} runs "
          "(min - max)")
    print("| row | minou |\n|---|---|")
    print(f"| {args.messages} messages published in eu (msg/s) | {cell('stored', ',.0f')} |")
    print(f"| ... published in eu and consumed in us (msg/s) | {cell('rate', ',.0f')} |")
    print(f"| one message, eu publish -> us consumer: p50 (ms) | {cell('x50', '.2f')} |")
    print(f"| one message, eu publish -> us consumer: p99 (ms) | {cell('x99', '.2f')} |")
    print(f"| the same inside us alone: p50 (ms) | {cell('l50', '.2f')} |")
    print(f"| the same inside us alone: p99 (ms) | {cell('l99', '.2f')} |")


if __name__ == "__main__":
    main()
