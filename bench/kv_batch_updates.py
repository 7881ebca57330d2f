#!/usr/bin/env python3
"""What a batch of many updates of one KV key costs the broker core (in-process, no
storage): a bucket with one key never updated and one hot key, updated in batches of
``--batch`` (one publish, one commit each). Prints µs of this thread's CPU time per
update, median of ``--runs``. Each commit takes its revision off the key's staged
queue: that used to rebuild the queue per message (n^2 in a batch of n).

  .venv/bin/python bench/kv_batch_updates.py [--batch 2000] [--batches 20] [--runs 5]
  PYTHONPATH=<other checkout>/src .venv/bin/python bench/kv_batch_updates.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from minou.core.broker import Broker
from minou.protocol.frames import Send


def run(batch: int, batches: int) -> float:
    b = Broker()
    now = 1000.0
    b.publish([Send("_kv/v1/b", b"1", key="cold")], now)
    b.on_committed(b.take_writes(), now)
    t0 = time.thread_time()
    for _ in range(batches):
        b.publish([Send("_kv/v1/b", b"2", key="hot") for _ in range(batch)], now)
        b.on_committed(b.take_writes(), now)
    return (time.thread_time() - t0) / (batch * batches) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    times = [run(args.batch, args.batches) for _ in range(args.runs)]
    print(f"batches of {args.batch:,} updates of one key: median "
          f"{statistics.median(times):.1f} µs per update (best {min(times):.1f})")


if __name__ == "__main__":
    main()
