"""Broker memory while one client extends the same delivery's lease again and again
(a long job's heartbeat gone wrong, or a hostile client): a dev broker from this tree,
one message consumed, then N extends, each a little longer. Prints the broker's RSS
before and after. Each extend used to leave its expiry on the broker's lease heap
until its time (up to 12 h); now at most twice the live ones stay (docs/testing.md,
"Settlement, runs from the cursor and the group pump").

    .venv/bin/python bench/lease_extends.py [-n 300000]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import minou
from bench_servers import start_dev_broker
from silent_consumers import rss_mib


async def extend_loop(url: str, pid: int, n: int) -> None:
    client = await minou.connect(url, client_id="lease-extender")
    await client.send("extends/v1/1", {"job": 1})
    sub = await client.consume("extends/v1/1", prefetch=1)
    msg = await sub.get(10)
    before, t0 = rss_mib(pid), time.monotonic()
    window: list = []
    for i in range(n):
        window.append(msg.extend(3600 + i / 1000))
        if len(window) >= 1000:  # a thousand in flight, as a pipelining client would
            await asyncio.gather(*window)
            window.clear()
    await asyncio.gather(*window)
    print(f"{n:,} extends in {time.monotonic() - t0:.1f} s; broker RSS {before:.1f} -> "
          f"{rss_mib(pid):.1f} MiB")
    await client.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=300_000)
    args = ap.parse_args()
    proc, url, _ = start_dev_broker("minou-extends-")
    try:
        asyncio.run(extend_loop(url, proc.pid, args.n))
    finally:
        proc.terminate()
        proc.wait(15)


if __name__ == "__main__":
    main()
