#!/usr/bin/env python3
"""A Prometheus scrape of a broker holding many channels: how long ``/metrics`` takes,
how big it is, and how long confirmed sends wait meanwhile. A real broker (SQLite) is
filled with ``--channels`` channels of one message (one queue, or with ``--queues`` a
queue each: one series per queue and metric), then one client sends one message at a
time while ``--scrapes`` scrapes are made a second apart.

  .venv/bin/python bench/scrape_many.py                  # 99,999 channels of one queue
  .venv/bin/python bench/scrape_many.py --queues         # 99,999 queues (the first 10,000
                                                          # with series: metrics_max_queues)
  .venv/bin/python bench/scrape_many.py --queues --max-series 1000000   # every one: 34 MB
  PYTHONPATH=/other/checkout/src .venv/bin/python bench/scrape_many.py
      (the broker runs the code on PYTHONPATH: compare two versions)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402
from many_channels import BATCH, channel_name  # noqa: E402
from minou.auth import keys as keyfiles  # noqa: E402
from minou.auth.tokens import make_token  # noqa: E402


async def measure(url: str, http: str, admin: dict[str, str], args: argparse.Namespace
                  ) -> tuple[list[tuple[float, int]], list[float]]:
    async with await minou.connect(url, client_id="bench-scrape", key=_process_key()) as c:
        for start in range(0, args.channels, BATCH):
            await c.send_many([(channel_name(i, args.queues), 1)
                               for i in range(start, min(start + BATCH, args.channels))])
        await asyncio.sleep(5.0)  # the fill's last commits and checkpoint
        took: list[float] = []
        stop = asyncio.Event()

        async def sends() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                await c.send(channel_name(0, args.queues), 1)
                took.append(time.perf_counter() - began)

        sending = asyncio.create_task(sends())
        await asyncio.sleep(1.0)
        scrapes = []
        async with httpx.AsyncClient(timeout=300) as client:
            for _ in range(args.scrapes):
                began = time.perf_counter()
                answer = await client.get(http + "/metrics", headers=admin)
                answer.raise_for_status()
                scrapes.append((time.perf_counter() - began, len(answer.content)))
                await asyncio.sleep(1.0)
        stop.set()
        await sending
    return scrapes, sorted(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=99_999)
    parser.add_argument("--queues", action="store_true",
                        help="each channel a queue of its own (bench<i>/v1/c)")
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--max-series", type=int, default=None,
                        help="the broker's metrics_max_queues (default: its default, 10,000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="minou-scrape-") as tmp:
        extra = ("" if args.max_series is None
                 else f"metrics_max_queues = {args.max_series}\n")
        broker = MinouBroker(Path(tmp) / "data", name="minou-scrape", extra_config=extra)
        (Path(tmp) / "data").mkdir()
        url = broker.start()
        try:
            assert broker.admin_key is not None and broker.http_url is not None
            token = make_token("admin", keyfiles.load_private(broker.admin_key), "minou",
                               ttl=600)
            scrapes, took = asyncio.run(measure(url, broker.http_url,
                                                {"Authorization": f"Bearer {token}"}, args))
        finally:
            broker.close()
    kind = "queues" if args.queues else "channels of one queue"
    cap = "its default" if args.max_series is None else f"{args.max_series:,}"
    print(f"\n{args.scrapes} scrapes of /metrics, a second apart, of a broker holding "
          f"{args.channels:,} {kind} (metrics_max_queues: {cap}); one client sending "
          "meanwhile, each send confirmed\n")
    print("| scrape (s) | size (MB) | confirms | confirm p50 (ms) | p99 (ms) | max (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    seconds = " / ".join(f"{s:.2f}" for s, _ in scrapes)
    print(f"| {seconds} | {scrapes[0][1] / 1e6:.1f} | {len(took):,} | "
          f"{took[len(took) // 2] * 1e3:.2f} | {took[int(len(took) * 0.99)] * 1e3:.1f} | "
          f"{took[-1] * 1e3:.0f} |")


if __name__ == "__main__":
    main()
