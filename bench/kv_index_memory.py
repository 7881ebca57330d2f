#!/usr/bin/env python3
"""What a KV revision costs the broker in memory, short keys against the longest ones
(``MAX_KEY_LENGTH``): the broker indexes every stored revision (core/kv.py), so
``MAX_KV_REVISIONS_TOTAL`` revisions must fit in what docs/kv.md promises.

  .venv/bin/python bench/kv_index_memory.py                 (200,000 revisions a case)
  .venv/bin/python bench/kv_index_memory.py --revisions 400000 --cases long-h64

Each case is a real broker on a fresh data dir (SQLite), filled through the native
client (``send_many`` to ``_kv/v1/<bucket>``, a 1-byte value, batches of 5,000) over
buckets of at most 100,000 revisions; its RSS (VmRSS) is read before and after, and
again after a restart (the index rebuilt from storage, no value cached). Cases:
``short``/``long`` keys (8 / 256 characters), ``h1`` every revision its own key
(history 1), ``h64`` 64 revisions of each key (history 64). Printed: bytes per
revision (RSS grown / revisions), and with the body cache (48 MiB of values at most,
held after a fill, empty after a restart) that is why the restart row is the index's.
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
from minou.limits import MAX_KEY_LENGTH  # noqa: E402

PER_BUCKET = 100_000  # the default max_items of a bucket
BATCH = 5_000
CASES = {"short-h1": (8, 1), "long-h1": (MAX_KEY_LENGTH, 1),
         "short-h64": (8, 64), "long-h64": (MAX_KEY_LENGTH, 64)}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def key_name(i: int, length: int) -> str:
    """Key ``i``, padded to ``length`` characters (distinct in its first ones)."""
    return f"k{i:07d}".ljust(length, "x")


async def settle(pid: int) -> int:
    """RSS once the broker is idle (its commits and compactions done)."""
    await asyncio.sleep(2.0)
    return rss_bytes(pid)


async def revisions_held(client: minou.Client) -> int:
    answer = await client.admin("kv.buckets")
    buckets = answer["buckets"] if isinstance(answer, dict) else answer
    return sum(b["revisions"] for b in buckets)


async def fill(url: str, revisions: int, length: int, history: int) -> int:
    async with await minou.connect(url, client_id="bench-kvmem", key=_process_key()) as c:
        done = 0
        for start in range(0, revisions, BATCH):
            items = []
            for n in range(start, min(start + BATCH, revisions)):
                bucket = f"_kv/v1/mem{n // PER_BUCKET}"
                # the revisions of a key in one bucket: key i's h-th revision is n
                key = key_name((n % PER_BUCKET) % max(1, PER_BUCKET // history) if history > 1
                               else n, length)
                items.append({"channel": bucket, "payload": 1, "key": key})
            await c.send_many(items)
            done += len(items)
        return await revisions_held(c)


async def held(url: str) -> int:
    async with await minou.connect(url, client_id="bench-kvmem", key=_process_key()) as c:
        return await revisions_held(c)


def run_case(name: str, revisions: int, work: Path) -> None:
    length, history = CASES[name]
    broker = MinouBroker(work, name=name, extra_config=(
        f'[kv."*"]\nhistory = {history}\nmax_items = {2 * PER_BUCKET}\n'))
    try:
        url = broker.start()
        base = asyncio.run(settle(broker.pid))
        t0 = time.monotonic()
        stored = asyncio.run(fill(url, revisions, length, history))
        took = time.monotonic() - t0
        after = asyncio.run(settle(broker.pid))
        url = broker.start(fresh=False)
        base2 = base  # a fresh start of the same broker: the same base
        rebuilt = asyncio.run(held(url))
        restarted = asyncio.run(settle(broker.pid))
        print(f"{name:10} {length:4} {history:3} {stored:9,} {base / 2**20:7.1f} "
              f"{after / 2**20:8.1f} {(after - base) / stored:9.0f} "
              f"{restarted / 2**20:9.1f} {(restarted - base2) / max(1, rebuilt):9.0f} "
              f"{rebuilt:9,}  ({took:.0f} s to fill)", flush=True)
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--revisions", type=int, default=200_000)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="minou-kvmem-"))
    print("case       keylen hist   revisions base MiB  full MiB  B/rev full "
          "restarted  B/rev rest  rebuilt")
    for name in args.cases.split(","):
        run_case(name, args.revisions, work)


if __name__ == "__main__":
    main()
