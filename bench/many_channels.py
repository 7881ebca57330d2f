#!/usr/bin/env python3
"""A broker that holds many channels: does a commit cost more for every channel it
knows? A real broker (SQLite) is filled with ``--channels`` channels of one message
each (``send_many`` in batches of 5,000), then one client sends ``--sends`` messages
one at a time to one of them, each waited for: printed, the fill's seconds and the
confirm's p50 / p99 for each size. The broker's CPU per commit should not grow with
the channels it holds (it did: a copy of every channel's name per commit).

  .venv/bin/python bench/many_channels.py                      # 100 and 99,999
  .venv/bin/python bench/many_channels.py --channels 1000,50000
  .venv/bin/python bench/many_channels.py --queues          # a queue per channel
  PYTHONPATH=/other/checkout/src .venv/bin/python bench/many_channels.py
      (the broker runs the code on PYTHONPATH: compare two versions)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402

BATCH = 5_000


def channel_name(i: int, queues: bool) -> str:
    """``bench/v1/c<i>``: channels of one queue; ``bench<i>/v1/c``: a queue each."""
    return f"bench{i}/v1/c" if queues else f"bench/v1/c{i}"


async def measure(url: str, channels: int, sends: int, queues: bool
                  ) -> tuple[float, float, float, float]:
    async with await minou.connect(url, client_id="bench-many", key=_process_key()) as c:
        began = time.perf_counter()
        for start in range(0, channels, BATCH):
            await c.send_many([(channel_name(i, queues), 1)
                               for i in range(start, min(start + BATCH, channels))])
        filled = time.perf_counter() - began
        took = []
        for i in range(sends):
            began = time.perf_counter()
            await c.send(channel_name(0, queues), i)
            took.append(time.perf_counter() - began)
    took.sort()
    return filled, took[len(took) // 2], took[int(len(took) * 0.99)], took[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", default="100,99999",
                        help="comma-separated sizes (max_channels is 100,000 by default)")
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--expire-idle", type=float, default=None,
                        help="give the channels this expire_idle (s): idle expiry watches "
                             "each of them")
    parser.add_argument("--queues", action="store_true",
                        help="each channel in a queue of its own (bench<i>/v1/c): the "
                             "per-queue rate gauges and charts hold one entry per channel")
    args = parser.parse_args()
    options = "" if args.expire_idle is None else \
        f'[channels."bench/v1"]\nexpire_idle = {args.expire_idle}\n'

    rows = []
    with tempfile.TemporaryDirectory(prefix="minou-many-") as tmp:
        for n in (int(x) for x in args.channels.split(",")):
            broker = MinouBroker(Path(tmp) / f"n{n}", name=f"minou-{n}",
                                 extra_config=options)
            (Path(tmp) / f"n{n}").mkdir()
            url = broker.start()
            try:
                rows.append((n, *asyncio.run(measure(url, n, args.sends, args.queues))))
            finally:
                broker.close()
    watched = "" if args.expire_idle is None else \
        f", each with expire_idle = {args.expire_idle:g} s"
    if args.queues:
        watched += ", each channel a queue of its own"
    print(f"\n{args.sends} sends one at a time, each confirmed (fsync), to one channel of a "
          f"broker holding N channels{watched}\n")
    print("| channels | fill (s) | confirm p50 (ms) | confirm p99 (ms) | max (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for n, filled, p50, p99, most in rows:
        print(f"| {n:,} | {filled:.1f} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} | {most * 1e3:.1f} |")


if __name__ == "__main__":
    main()
