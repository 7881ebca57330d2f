#!/usr/bin/env python3
"""Large bodies through the SQLite store alone, in this process: commits of large
messages through ``SQLiteStorage.apply`` (no broker, no sockets), in MiB/s and ms per
commit. What the store can take, to compare with test a's large-message rows (where
the broker's loop, the client and the round trips come on top).

  .venv/bin/python bench/large_bodies.py                       (1 MiB, 1/4/8 per commit)
  .venv/bin/python bench/large_bodies.py --size 64KiB --per-commit 64 --total 256MiB
  .venv/bin/python bench/large_bodies.py --body-file-min 0      (bodies in SQLite's pages)

The data directory is a fresh temporary one beside the repository's ``bench/results``
(the disk the broker would use), deleted after; ``--dir`` picks another.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from minou.config import parse_size  # noqa: E402
from minou.core.log import Msg  # noqa: E402
from minou.core.writes import WriteBatch  # noqa: E402
from minou.storage.sqlite import SQLiteStorage  # noqa: E402


def run_once(where: Path, size: int, per_commit: int, total: int, body_file_min: int
             ) -> tuple[float, float]:
    """(MiB/s, ms per commit) of one run on a fresh store."""
    data_dir = Path(tempfile.mkdtemp(prefix="storage-apply-", dir=where))
    store = SQLiteStorage(data_dir, body_file_min=body_file_min or (1 << 62))
    try:
        store.open(0.0)
        payload = b"x" * size
        commits = max(1, total // (size * per_commit))
        seq = 0
        started = time.perf_counter()
        for _ in range(commits):
            msgs = [Msg("bench/v1/1", seq + i + 1, f"id-{seq + i}", payload)
                    for i in range(per_commit)]
            seq += per_commit
            store.apply(WriteBatch(messages=msgs, channels={"bench/v1/1": seq + 1}))
        took = time.perf_counter() - started
    finally:
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    return commits * per_commit * size / took / (1 << 20), took / commits * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1MiB", help="message size (default 1MiB)")
    ap.add_argument("--per-commit", default="1,4,8",
                    help="messages per commit, comma-separated (default 1,4,8)")
    ap.add_argument("--total", default="512MiB", help="bytes per run (default 512MiB)")
    ap.add_argument("--runs", type=int, default=3, help="runs per row; medians (default 3)")
    ap.add_argument("--body-file-min", default="256KiB",
                    help="segments this large go to body files; 0: never (default 256KiB)")
    ap.add_argument("--dir", default=str(HERE / "results"),
                    help="where the temporary data directories go")
    args = ap.parse_args()
    size, total = parse_size("--size", args.size), parse_size("--total", args.total)
    body_file_min = (parse_size("--body-file-min", args.body_file_min)
                     if args.body_file_min != "0" else 0)
    where = Path(args.dir)
    where.mkdir(parents=True, exist_ok=True)
    print(f"SQLiteStorage.apply, {args.size} messages, {args.total} per run, "
          f"body_file_min {args.body_file_min}, medians of {args.runs} (min - max)")
    print("| messages per commit | MiB/s | ms per commit |")
    print("|---:|---:|---:|")
    for per_commit in (int(n) for n in args.per_commit.split(",")):
        rates, costs = [], []
        for _ in range(args.runs):
            rate, cost = run_once(where, size, per_commit, total, body_file_min)
            rates.append(rate)
            costs.append(cost)
        print(f"| {per_commit} | {statistics.median(rates):,.0f} ({min(rates):,.0f} - "
              f"{max(rates):,.0f}) | {statistics.median(costs):.2f} |", flush=True)


if __name__ == "__main__":
    main()
