#!/usr/bin/env python3
"""What a broker on Redis holds while it starts, and how long Redis is busy for it: a
real broker on a real redis-server (AOF always, started here), filled through the
broker with messages that wait (half delayed a day, half with a priority), stopped,
then started again on the same Redis ``--restarts`` times. Printed per
start: the broker's peak RSS (VmHWM, read once it confirmed a publish and settled),
the seconds from the start to the first publish it confirms, and the longest single
command Redis ran from the start to then (SLOWLOG, every command logged meanwhile);
then the medians.

  .venv/bin/python bench/redis_start_memory.py --messages 100000 --size 2048
  PYTHONPATH=/other/checkout/src .venv/bin/python bench/redis_start_memory.py ...
      (the broker runs the code on PYTHONPATH: compare two versions)

The messages go to ``--queues`` queues (``bstartN/v1``) of ``--channels`` channels
each, ``--batch`` to a ``send_many`` (a segment per channel per commit: a batch of
500 over 8 channels is a few segments of ~60 messages each).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402
from restart_memory import status_mib  # noqa: E402

SLOWLOG_DEFAULT_US = 10_000


async def fill(url: str, args: argparse.Namespace) -> None:
    rng = random.Random(7)
    body = os.urandom(args.size)
    names = [f"bstart{q}/v1/c{c}" for q in range(args.queues) for c in range(args.channels)]
    async with await minou.connect(url, client_id="bench-fill", key=_process_key()) as c:
        for start in range(0, args.messages, args.batch):
            items: list[dict[str, Any]] = []
            for i in range(start, min(start + args.batch, args.messages)):
                item: dict[str, Any] = {"channel": names[i % len(names)], "payload": body}
                if i % 2:
                    item["priority"] = rng.randint(1, 9)
                else:
                    item["delay"] = 86_400.0
                items.append(item)
            await c.send_many(items)


async def first_publish(url: str, deadline: float) -> None:
    while True:
        try:
            async with await minou.connect(url, client_id="bench-first",
                                           key=_process_key()) as c:
                await c.send("bstart0/v1/c0", b"now")
                return
        except (OSError, minou.MinouError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def redis_client(broker: MinouBroker) -> Any:
    import redis

    assert broker.redis is not None
    return redis.Redis(port=broker.redis.port, socket_timeout=600)


def restart(broker: MinouBroker, settle: float) -> tuple[float, float, int, str]:
    """Stop the broker, start it again on its Redis: (peak MiB, seconds to the first
    confirmed publish, longest Redis command in µs, that command's name)."""
    r = redis_client(broker)
    broker.stop()  # SIGTERM: it hands the primary lease back (a kill -9 leaves the
    # next start waiting for the lease to run out, seconds that are not its own)
    r.config_set("slowlog-max-len", 1_000_000)
    r.config_set("slowlog-log-slower-than", 0)
    r.slowlog_reset()
    t0 = time.monotonic()
    url = broker.start(fresh=False, timeout=1800.0)
    asyncio.run(first_publish(url, time.monotonic() + 1800))
    took = time.monotonic() - t0
    r.config_set("slowlog-log-slower-than", SLOWLOG_DEFAULT_US)
    entries = r.slowlog_get(-1)
    r.slowlog_reset()
    time.sleep(settle)
    peak = status_mib(broker.pid, "VmHWM")
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    words = (command.decode(errors="replace") if isinstance(command, bytes)
             else str(command)).split(" ")
    if words[0].upper() == "EVALSHA":  # which script: by its arguments after the key
        words = [words[0], *words[4:7]]
    return peak, took, int(worst["duration"]), " ".join(words)[:60]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=2048, help="payload bytes")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--channels", type=int, default=2, help="channels per queue")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds after the first publish before VmHWM is read")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="minou-redis-start-"))
    broker = MinouBroker(work, name="redis-start", storage="redis")
    try:
        url = broker.start()
        t0 = time.monotonic()
        asyncio.run(fill(url, args))
        filled = time.monotonic() - t0
        time.sleep(2.0)  # its last commits
        running = status_mib(broker.pid, "VmRSS")
        used = redis_client(broker).info("memory")["used_memory"] / (1 << 20)
        print(f"{args.messages:,} messages of {args.size} B (half delayed, half with a "
              f"priority) over {args.queues} queues x {args.channels} channels, batches of "
              f"{args.batch}: filled in {filled:.0f} s; broker RSS running {running:.0f} MiB, "
              f"Redis used_memory {used:.0f} MiB", flush=True)
        print(f"{'start':>5} {'peak MiB':>9} {'1st pub s':>9} {'longest Redis cmd':>18}")
        rows = []
        for n in range(1, args.restarts + 1):
            peak, took, longest, name = restart(broker, args.settle)
            rows.append((peak, took, longest))
            print(f"{n:>5} {peak:9.0f} {took:9.2f} {longest / 1000:15.1f} ms  ({name})",
                  flush=True)
        peaks, tooks, longests = zip(*rows, strict=True)
        print(f"{'med':>5} {statistics.median(peaks):9.0f} {statistics.median(tooks):9.2f} "
              f"{statistics.median(longests) / 1000:15.1f} ms")
    finally:
        broker.close()


if __name__ == "__main__":
    main()
