"""Broker memory when consumers read but never ack: N consumers (each in its own group,
prefetch P) take 1 MB messages and settle none, while a producer publishes M of them.
Prints the broker's RSS as they come, the deliveries each consumer got and the bytes the
broker counts unsettled (status ``flow.in_flight_bytes``; ``in_flight_bytes`` bounds it).

Usage:  .venv/bin/python bench/unacked_consumers.py [--consumers 1] [--prefetch 1500]
            [--messages 1500] [--size 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import minou
from bench_servers import start_dev_broker


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run(url: str, pid: int, args: argparse.Namespace) -> None:
    body = os.urandom(args.size)
    got = [0] * args.consumers
    held: list[list[minou.Message]] = [[] for _ in range(args.consumers)]  # never acked
    async with await minou.connect(url, client_id="producer") as p:
        subs = []
        readers = [await minou.connect(url, client_id=f"reader-{i}")
                   for i in range(args.consumers)]
        for i, r in enumerate(readers):
            subs.append(await r.consume("big/v1/1", group=f"g{i}", prefetch=args.prefetch))

        async def take(i: int) -> None:
            while True:
                m = await subs[i].get()
                held[i].append(m)
                got[i] += 1

        tasks = [asyncio.create_task(take(i)) for i in range(args.consumers)]
        before = rss_mib(pid)
        print(f"{args.consumers} consumer(s), prefetch {args.prefetch}, none acking; "
              f"{args.messages} x {args.size / 1e6:g} MB published; broker RSS {before:.0f} MiB")
        print("  published  RSS MiB  delivered (per consumer)  in flight MiB")
        peak = before
        for start in range(0, args.messages, 8):
            await asyncio.gather(*(p.send("big/v1/1", body)
                                   for _ in range(min(8, args.messages - start))))
            peak = max(peak, rss_mib(pid))
            if (start + 8) % 250 < 8 or start + 8 >= args.messages:
                await asyncio.sleep(1.0)  # let deliveries catch up
                flow = (await p.admin("status"))["flow"]
                rss = rss_mib(pid)
                peak = max(peak, rss)
                unsettled = flow.get("in_flight_bytes", 0) / 2**20  # (older brokers: none)
                print(f"  {min(start + 8, args.messages):9d}  {rss:7.0f}  "
                      f"{'/'.join(map(str, got)):>24}  {unsettled:13.1f}", flush=True)
        print(f"peak RSS {peak:.0f} MiB (+{peak - before:.0f}); deliveries held unsettled: "
              f"{sum(got)}")
        for t in tasks:
            t.cancel()
        for r in readers:
            await r.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumers", type=int, default=1)
    ap.add_argument("--prefetch", type=int, default=1500)
    ap.add_argument("--messages", type=int, default=1500)
    ap.add_argument("--size", type=int, default=1_000_000)
    args = ap.parse_args()
    proc, url, _ = start_dev_broker("minou-unacked-")
    try:
        asyncio.run(run(url, proc.pid, args))
        return 0
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
