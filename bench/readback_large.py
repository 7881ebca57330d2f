#!/usr/bin/env python3
"""A consumer catching up on a backlog of large messages, past the broker's body cache:
how fast it reads them back, and how much memory the broker holds meanwhile.

  .venv/bin/python bench/readback_large.py [--messages 2500] [--size 1000000] [--runs 3]

Each run starts a fresh broker (bench_servers.MinouBroker, as `make bench` does), stores
``--messages`` x ``--size`` random bytes (sends 8 at a time), then one consumer (prefetch
4) reads and acks them all. Prints MB/s and the broker's RSS before and at its peak
while reading back (sampled every 20 ms from /proc), medians over the runs. Needs about
``messages x size`` of free disk in the temp directory.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
# The broker this starts runs the same source as this script (a checkout's bench/ beside
# its src/: how an older commit is compared).
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(HERE.parent / "src"), os.environ.get("PYTHONPATH")) if p)

import bench_servers  # noqa: E402
import minou  # noqa: E402
from minou.auth import keys  # noqa: E402


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


async def one_run(n: int, size: int) -> tuple[float, int, int]:
    work = Path(tempfile.mkdtemp(prefix="minou-readback-"))
    broker = bench_servers.MinouBroker(work, python=sys.executable)
    url = broker.start()
    try:
        c = await minou.connect(url, client_id="bench-readback", key=keys.generate(),
                                reconnect=False)
        body = os.urandom(size)
        for i in range(0, n, 8):
            await asyncio.gather(*(c.send("bench/v1/q", body) for _ in range(min(8, n - i))))
        pid = broker.pid
        assert pid is not None
        before = rss_mib(pid)
        peak = [before]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mib(pid))
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sub = await c.consume("bench/v1/q", group="g", prefetch=4)
        t0 = time.monotonic()
        for _ in range(n):
            m = await sub.get(60)
            m.ack()
        wall = time.monotonic() - t0
        stop.set()
        watcher.join()
        await c.close()
        return n * size / wall / 1e6, before, peak[0]
    finally:
        broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2500)
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    results = [asyncio.run(one_run(a.messages, a.size)) for _ in range(a.runs)]
    for i, (mbs, before, peak) in enumerate(results, 1):
        print(f"run {i}: {mbs:,.0f} MB/s; broker RSS {before} MiB stored, {peak} MiB at the "
              f"peak of the read-back (+{peak - before})")
    med = [statistics.median(r[k] for r in results) for k in range(3)]
    print(f"\n| messages | MB/s (median) | RSS stored (MiB) | RSS peak (MiB) | growth (MiB) |\n"
          f"|---|---:|---:|---:|---:|\n"
          f"| {a.messages:,} x {a.size:,} B | {med[0]:,.0f} | {med[1]:.0f} | {med[2]:.0f} | "
          f"{med[2] - med[1]:+.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
