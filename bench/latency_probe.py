"""A quick end-to-end latency probe against a running broker (no peers, no spawn).

One producer paced at --rate msg/s and one consumer (prefetch 100, acking each) in
one process; prints p50 / p99 from the publish call to the message in hand.

    .venv/bin/python bench/latency_probe.py minou://127.0.0.1:7700 --rate 2000 -n 4000
"""

from __future__ import annotations

import argparse
import asyncio
import time

import minou


async def probe(url: str, rate: float, n: int) -> tuple[float, float]:
    producer = await minou.connect(url, client_id="latency-probe-p")
    consumer = await minou.connect(url, client_id="latency-probe-c")
    sub = await consumer.consume("latency-probe/v1/1", prefetch=100)
    latencies: list[float] = []

    async def consume() -> None:
        while len(latencies) < n:
            msg = await sub.get(10)
            latencies.append(time.perf_counter() - msg.payload)
            msg.ack()

    task = asyncio.create_task(consume())
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        # What is due, then a sleep of at least a millisecond: uvloop rounds a shorter one
        # down to none and the loop would spin a core the broker needs (bench/peers.py's
        # `pace` sleeps in the kernel instead, which a one-process probe cannot: it would
        # hold its own consumer back).
        due = min(n, int((time.perf_counter() - t0) * rate) + 1)
        while sent < due:
            producer.send("latency-probe/v1/1", time.perf_counter())
            sent += 1
        await asyncio.sleep(max(0.001, t0 + sent / rate - time.perf_counter()))
    await task
    await producer.close()
    await consumer.close()
    latencies.sort()
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="minou://127.0.0.1:7700")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("-n", type=int, default=4000)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    p50, p99 = asyncio.run(probe(args.url, args.rate, args.n))
    print(f"p50 {p50 * 1e3:.2f} ms  p99 {p99 * 1e3:.2f} ms  ({args.n} msgs at {args.rate:g}/s)")


if __name__ == "__main__":
    main()
