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
  .venv/bin/python bench/many_channels.py --channels 20000 --retention 3600 --idle 20
      (every message settled and kept for replay: the idle broker's CPU)
  PYTHONPATH=/other/checkout/src .venv/bin/python bench/many_channels.py
      (the broker runs the code on PYTHONPATH: compare two versions)
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, pid: int, channels: int, args: argparse.Namespace
                  ) -> tuple[float, float | None, float, float, float]:
    async with await minou.connect(url, client_id="bench-many", key=_process_key()) as c:
        settled = 0
        if args.retention is not None:  # a group settles everything: retention keeps it

            async def ack(message: minou.Message) -> None:
                nonlocal settled
                settled += 1
                message.ack()

            await c.consume("bench/v1/*", ack, group="bench-settles", prefetch=1000)
        began = time.perf_counter()
        for start in range(0, channels, BATCH):
            await c.send_many([(channel_name(i, args.queues), 1)
                               for i in range(start, min(start + BATCH, channels))])
        while args.retention is not None and settled < channels:
            await asyncio.sleep(0.05)
        filled = time.perf_counter() - began
        idle = None
        if args.idle:
            await asyncio.sleep(5.0)  # the fill's last commits and checkpoint
            before, at = cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(args.idle)
            idle = (cpu_seconds(pid) - before) / (time.monotonic() - at)
        took = []
        for i in range(args.sends):
            began = time.perf_counter()
            await c.send(channel_name(0, args.queues), i)
            took.append(time.perf_counter() - began)
    took.sort()
    return filled, idle, took[len(took) // 2], took[int(len(took) * 0.99)], took[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", default="100,99999",
                        help="comma-separated sizes (max_channels is 100,000 by default)")
    parser.add_argument("--sends", type=int, default=500)
    parser.add_argument("--expire-idle", type=float, default=None,
                        help="give the channels this expire_idle (s): idle expiry watches "
                             "each of them")
    parser.add_argument("--retention", type=float, default=None,
                        help="give the channels this retention (s), and have a group "
                             "settle every message: retention keeps them all")
    parser.add_argument("--queues", action="store_true",
                        help="each channel in a queue of its own (bench<i>/v1/c): the "
                             "per-queue rate gauges and charts hold one entry per channel")
    parser.add_argument("--idle", type=float, default=0.0,
                        help="after the fill, the broker's CPU over this many seconds "
                             "with nothing sent (%% of one core)")
    args = parser.parse_args()
    if args.queues and (args.expire_idle is not None or args.retention is not None):
        parser.error("--expire-idle and --retention configure bench/v1: not with --queues")
    options = "" if args.expire_idle is None and args.retention is None else \
        '[channels."bench/v1"]\n'
    if args.expire_idle is not None:
        options += f"expire_idle = {args.expire_idle}\n"
    if args.retention is not None:
        options += f"retention = {args.retention}\n"

    rows = []
    with tempfile.TemporaryDirectory(prefix="minou-many-") as tmp:
        for n in (int(x) for x in args.channels.split(",")):
            broker = MinouBroker(Path(tmp) / f"n{n}", name=f"minou-{n}",
                                 extra_config=options)
            (Path(tmp) / f"n{n}").mkdir()
            url = broker.start()
            try:
                assert broker.proc is not None
                rows.append((n, *asyncio.run(measure(url, broker.proc.pid, n, args))))
            finally:
                broker.close()
    watched = "" if args.expire_idle is None else \
        f", each with expire_idle = {args.expire_idle:g} s"
    if args.retention is not None:
        watched += f", each with retention = {args.retention:g} s and every message settled"
    if args.queues:
        watched += ", each channel a queue of its own"
    print(f"\n{args.sends} sends one at a time, each confirmed (fsync), to one channel of a "
          f"broker holding N channels{watched}\n")
    print("| channels | fill (s) | idle CPU (% of a core) | confirm p50 (ms) | "
          "confirm p99 (ms) | max (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, filled, idle, p50, p99, most in rows:
        idle_text = "-" if idle is None else f"{idle * 100:.0f}"
        print(f"| {n:,} | {filled:.1f} | {idle_text} | {p50 * 1e3:.2f} | {p99 * 1e3:.2f} "
              f"| {most * 1e3:.1f} |")


if __name__ == "__main__":
    main()
