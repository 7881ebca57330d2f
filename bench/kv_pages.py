#!/usr/bin/env python3
"""What listing a big KV bucket costs the broker: ``kv.keys`` page by page and the
bucket list (``kv.buckets``, which counts each bucket's keys), as the broker's own CPU
time (``/proc/<pid>/stat``), not a clock, so a busy machine moves it little.

  .venv/bin/python bench/kv_pages.py                      (90,000 keys, 30 bucket lists)
  .venv/bin/python bench/kv_pages.py --keys 300000 --lists 10

Before the KV index kept its keys in order, every page sorted the whole bucket and every
bucket list every key of every bucket, on the event loop (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=90_000)
    parser.add_argument("--lists", type=int, default=30)
    args = parser.parse_args()
    broker = MinouBroker(Path(tempfile.mkdtemp(prefix="minou-kvpages-")), name="kvpages",
                         extra_config=f'[kv."*"]\nmax_items = {2 * args.keys}\n')
    try:
        url = broker.start()
        keys = [f"user/{i * 7919 % args.keys:07d}" for i in range(args.keys)]
        with minou.connect_sync(url, client_id="bench-kvpages", key=_process_key()) as c:
            for start in range(0, len(keys), 10_000):
                c.send_many([{"channel": "_kv/v1/big", "payload": 1, "key": k}
                             for k in keys[start:start + 10_000]])
            kv = c.kv("big")
            assert broker.pid is not None
            before = cpu_seconds(broker.pid)
            listed = kv.keys()
            paged = cpu_seconds(broker.pid)
            for _ in range(args.lists):
                c.admin("kv.buckets")
            listed_buckets = cpu_seconds(broker.pid)
        assert len(listed) == len(set(keys))
        print("| keys | pages | broker CPU for every page (s) | bucket lists | "
              "broker CPU for them (s) |\n|---:|---:|---:|---:|---:|")
        print(f"| {args.keys:,} | {-(-args.keys // 1000)} | {paged - before:.2f} | "
              f"{args.lists} | {listed_buckets - paged:.2f} |")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
