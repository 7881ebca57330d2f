"""WAL size under a steady consume+ack load: does it stay near its checkpoint threshold?

Starts a development broker on a temp dir, publishes at --rate msg/s (100 B) while one
consumer acks everything, samples the size of minou.db-wal every 0.25 s, and prints
the median, p99 and max against the threshold.

Usage:  .venv/bin/python bench/wal_soak.py [--rate 5000] [--seconds 60] [--wal-mb 64]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import minou


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=5000, help="messages per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--wal-mb", type=float, default=64.0,
                    help="the broker's checkpoint threshold (storage.wal_checkpoint)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="minou-wal-"))
    extra = []
    if args.wal_mb != 64:  # the default needs no config (and runs on older versions too)
        cfg = work / "wal.toml"
        cfg.write_text(f'[storage]\nwal_checkpoint = "{args.wal_mb}MiB"\n')
        extra = ["--config", str(cfg)]
    log = open(work / "broker.log", "w")  # noqa: SIM115 (the broker writes it until the end)
    proc = subprocess.Popen([sys.executable, "-m", "minou", "start", "--dev", "--data",
                             str(work / "data"), "--port", "0", "--http-port", "0", *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        url = ""
        for _ in range(200):
            text = (work / "broker.log").read_text()
            for line in text.splitlines():
                if line.strip().startswith("native"):
                    url = line.split()[1]
            if url:
                break
            time.sleep(0.05)
        wal = work / "data" / "minou.db-wal"
        stop = threading.Event()
        acked = [0]

        def consume() -> None:
            async def run() -> None:
                client = await minou.connect(url, client_id="soak-c")
                pending: set[asyncio.Task[bool]] = set()

                async def handle(msg: minou.Message) -> None:
                    task = asyncio.ensure_future(msg.ack())  # acks go out in batches
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                    acked[0] += 1

                await client.consume("soak/v1/*", handle, group="g", prefetch=1000)
                while not stop.is_set():
                    await asyncio.sleep(0.1)
                await asyncio.gather(*pending, return_exceptions=True)
                await client.close()

            asyncio.run(run())

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        samples: list[int] = []
        sent = 0
        with minou.connect_sync(url, client_id="soak-p") as p:
            start = time.monotonic()
            next_sample = start
            body = "x" * 98
            while (now := time.monotonic()) - start < args.seconds:
                due = int((now - start) * args.rate)
                if due > sent:
                    batch = min(due - sent, 500)
                    p.send_many([(f"soak/v1/{(sent + i) % 16}", body) for i in range(batch)])
                    sent += batch
                if now >= next_sample:
                    samples.append(wal.stat().st_size if wal.exists() else 0)
                    next_sample += 0.25
                time.sleep(0.001)
        stop.set()
        consumer.join(5)
        threshold = args.wal_mb * (1 << 20)
        mib = 1 << 20
        ordered = sorted(samples)
        p99 = ordered[int(len(ordered) * 0.99) - 1] if ordered else 0
        print(f"rate {args.rate} msg/s for {args.seconds:.0f} s: sent {sent}, acked {acked[0]}")
        print(f"WAL  median {statistics.median(samples) / mib:.1f} MiB  p99 {p99 / mib:.1f} MiB"
              f"  max {max(samples) / mib:.1f} MiB  (threshold {args.wal_mb:g} MiB, "
              f"max/threshold {max(samples) / threshold:.2f})")
        return 0
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()
        if os.environ.get("KEEP") is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
