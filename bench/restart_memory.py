#!/usr/bin/env python3
"""What a broker holds while it restarts, against what it held running: a real broker
(SQLite) filled to one of its running bounds, killed (kill -9), started again on its
data. Printed per case: RSS running (VmRSS once filled), the restarted broker's peak
(VmHWM, read once its state is restored) and RSS then, and the seconds from the
restart to the first publish it confirms.

  .venv/bin/python bench/restart_memory.py --cases dedup --dedup-keys 2000000
  .venv/bin/python bench/restart_memory.py --cases staged,groups
  .venv/bin/python bench/restart_memory.py --cases gone --updates 2000000
  PYTHONPATH=/other/checkout/src .venv/bin/python bench/restart_memory.py ...
      (the broker runs the code on PYTHONPATH: compare two versions)

Cases:
``dedup``   keyed publishes (36-character dedup keys, a one-hour window) up to
            ``--dedup-keys`` (MAX_DEDUP_KEYS is 2,000,000): the window holds ~36 B a key
            running (core/dedup.py); the stored rows are read back at a start.
``staged``  two clients each staging 120 MiB (MAX_STAGED_BYTES_PER_CLIENT is 128 MiB,
            MAX_STAGED_BYTES 256 MiB) in 64 KiB messages: held in memory running too.
``groups``  ``--groups`` durable listeners (MAX_GROUPS is 20,000) on ``--channels``
            channels (DEFAULT_MAX_CHANNELS 100,000), each reading one channel: a restart
            attaches every group to the channels it reads and were made after its last
            save.
``gone``    a key-value bucket (history 1): 1 cold key written once, then a hot key
            updated ``--updates`` times: the cold key pins the channel's first seq, so
            every older revision of the hot key stays a deleted seq inside the log
            (core/seq_runs.py), running and read back from the ``removed`` rows at a start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402

BATCH = 5_000


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


async def connect(url: str, who: str = "bench-restart") -> minou.Client:
    return await minou.connect(url, client_id=who, key=_process_key())


# ------------------------------------------------------------------ fillers
async def fill_dedup(url: str, n: int) -> None:
    async with await connect(url) as c:
        for start in range(0, n, BATCH):
            await c.send_many([{"channel": f"bench/v1/d{i % 10}", "payload": i,
                                "dedup": str(uuid.uuid4())}
                               for i in range(start, min(start + BATCH, n))])


async def fill_staged(url: str, _: int) -> None:
    body = os.urandom(64 << 10)
    for who in ("bench-stage-a", "bench-stage-b"):
        async with await connect(url, who) as c:
            for t in range(40):  # 40 transactions of 48 messages of 64 KiB: ~120 MiB
                await c.stage(f"t{t}", [("bench/v1/staged", body)] * 48)


async def fill_groups(url: str, groups: int, channels: int) -> None:
    async with await connect(url) as c:
        for start in range(0, channels, BATCH):
            await c.send_many([(f"bench/v1/g{i}", 1)
                               for i in range(start, min(start + BATCH, channels))])
    for first in range(0, groups, 2_000):  # MAX_GROUPS_PER_CLIENT
        async with await connect(url, f"bench-listener-{first}") as c:
            for g in range(first, min(first + 2_000, groups)):
                sub = await c.listen(f"bench/v1/g{g % channels}", name=f"l{g}")
                await sub.close()


async def fill_gone(url: str, updates: int) -> None:
    async with await connect(url) as c:
        await c.send("_kv/v1/bench", "cold", key="cold")
        for start in range(0, updates, BATCH):
            await c.send_many([{"channel": "_kv/v1/bench", "payload": i, "key": "hot"}
                               for i in range(start, min(start + BATCH, updates))])


# ------------------------------------------------------------------ restart
async def first_publish(url: str, deadline: float) -> None:
    while True:
        try:
            async with await connect(url) as c:
                await c.send("bench/v1/g0", 1)  # one that exists: channels may be full
                return
        except (OSError, minou.MinouError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def run_case(name: str, args: argparse.Namespace, work: Path) -> None:
    config = 'dedup_window = 3600\n' if name == "dedup" else ""
    broker = MinouBroker(work, name=name, extra_config=config)
    try:
        url = broker.start()
        t0 = time.monotonic()
        if name == "dedup":
            asyncio.run(fill_dedup(url, args.dedup_keys))
            size = f"{args.dedup_keys:,} keys"
        elif name == "gone":
            asyncio.run(fill_gone(url, args.updates))
            size = f"1 cold key, {args.updates:,} updates of a hot one"
        elif name == "staged":
            asyncio.run(fill_staged(url, 0))
            size = "2 x 120 MiB staged"
        else:
            asyncio.run(fill_groups(url, args.groups, args.channels))
            size = f"{args.groups:,} groups, {args.channels:,} channels"
        filled = time.monotonic() - t0
        time.sleep(2.0)  # its last commits
        running = status_mib(broker.pid, "VmRSS")
        broker.proc.send_signal(signal.SIGKILL)  # we started it: this one process
        broker.proc.wait()
        broker.proc = None
        t0 = time.monotonic()
        url = broker.start(fresh=False, timeout=1800.0)
        asyncio.run(first_publish(url, time.monotonic() + 600))
        took = time.monotonic() - t0
        time.sleep(args.settle)  # restored rows built over the ticks after the start
        peak = status_mib(broker.pid, "VmHWM")
        after = status_mib(broker.pid, "VmRSS")
        print(f"{name:7} {size:34} {running:8.0f} {peak:8.0f} {after:8.0f} {took:8.1f}"
              f"   (filled in {filled:.0f} s)", flush=True)
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="dedup,staged,groups")
    parser.add_argument("--dedup-keys", type=int, default=1_000_000)
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=2_000)
    parser.add_argument("--channels", type=int, default=50_000)
    parser.add_argument("--settle", type=float, default=40.0,
                        help="seconds after the first publish before VmHWM is read")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="minou-restart-"))
    print(f"{'case':7} {'filled with':34} {'run MiB':>8} {'peak MiB':>8} {'after':>8} "
          f"{'1st pub s':>8}")
    for name in args.cases.split(","):
        run_case(name, args, work)


if __name__ == "__main__":
    main()
