#!/usr/bin/env python3
"""KV buckets through a real broker (issue 21), side by side with Redis in the same run.

  .venv/bin/python bench/kv.py                 (SQLite, fsync: the default)
  .venv/bin/python bench/kv.py --runs 3 --puts 5000

Rows: one put at a time (latency), one get at a time, a compare-and-set put, puts with
many in flight, and how soon a watcher sees a put. minou confirms a put once it is on
the disk (fsync); the Redis rows are ``SET``/``GET`` on a redis-server with
``appendfsync always`` (the same promise) and ``everysec`` (what most deploy: up to a
second of writes lost on a power cut). Redis has no revisions: its compare-and-set row
is a Lua script comparing a version field, its watch row a pub/sub message published
with the write. Printed: a table with the medians of ``--runs`` runs (min - max).
"""

from __future__ import annotations

import argparse
import asyncio
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
from bench_servers import MinouBroker, MinouRedis, PeerServer  # noqa: E402

KEYS = 100  # values cycle over this many keys
CAS = """
local v = redis.call('HGET', KEYS[1], 'rev')
if (v or '0') ~= ARGV[1] then return -1 end
return redis.call('HINCRBY', KEYS[1], 'rev', 1)
"""


def _ms(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))] * 1000


async def timed(n: int, call: Any) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - t0)
    return out


async def rate(n: int, concurrency: int, call: Any) -> float:
    left = iter(range(n))

    async def worker() -> None:
        for i in left:
            await call(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - t0)


async def measure_minou(url: str, n: int, concurrency: int) -> dict[str, float]:
    writer = await minou.connect(url, client_id="bench-kv", key=_process_key())
    watcher = await minou.connect(url, client_id="bench-kv-watch", key=_process_key())
    kv = writer.kv("bench")
    try:
        for i in range(KEYS):  # warm up: the bucket, every key
            await kv.put(f"k{i}", {"n": i, "pad": "x" * 80})
        put = await timed(n, lambda i: kv.put(f"k{i % KEYS}", {"n": i, "pad": "x" * 80}))
        get = await timed(n, lambda i: kv.get(f"k{i % KEYS}"))
        revs = {f"k{i}": (await kv.get(f"k{i}")).revision for i in range(KEYS)}

        async def cas(i: int) -> None:
            key = f"k{i % KEYS}"
            revs[key] = await kv.put(key, {"n": i}, revision=revs[key])

        swap = await timed(n, cas)
        many = await rate(n * 2, concurrency,
                          lambda i: kv.put(f"k{i % KEYS}", {"n": i, "pad": "x" * 80}))
        watch = watcher.kv("bench").watch("w", initial=False)
        seen: list[float] = []
        await anext_soon(watch, kv)
        for i in range(min(n, 300)):
            t0 = time.perf_counter()
            await kv.put("w", i)
            await anext(watch)
            seen.append(time.perf_counter() - t0)
        watch.close()
    finally:
        await writer.close()
        await watcher.close()
    return {"put": _ms(put, 0.5), "put99": _ms(put, 0.99), "get": _ms(get, 0.5),
            "cas": _ms(swap, 0.5), "rate": many, "watch": _ms(seen, 0.5)}


async def anext_soon(watch: Any, kv: Any) -> None:
    """Start the watch (its first poll) and let it see one put."""
    waiting = asyncio.ensure_future(anext(watch))
    await asyncio.sleep(0.2)
    await kv.put("w", -1)
    await waiting


async def measure_redis(url: str, n: int, concurrency: int) -> dict[str, float]:
    import redis.asyncio as aioredis

    r = aioredis.from_url(url)
    sub = aioredis.from_url(url)
    try:
        value = b'{"n": 1, "pad": "' + b"x" * 80 + b'"}'
        for i in range(KEYS):
            await r.set(f"k{i}", value)
        put = await timed(n, lambda i: r.set(f"k{i % KEYS}", value))
        get = await timed(n, lambda i: r.get(f"k{i % KEYS}"))
        script = r.register_script(CAS)
        revs = {f"v{i}": 0 for i in range(KEYS)}

        async def cas(i: int) -> None:
            key = f"v{i % KEYS}"
            revs[key] = int(await script(keys=[key], args=[revs[key]]))

        swap = await timed(n, cas)
        many = await rate(n * 2, concurrency, lambda i: r.set(f"k{i % KEYS}", value))
        pubsub = sub.pubsub()
        await pubsub.subscribe("w")
        await pubsub.get_message(timeout=1)  # the subscribe confirmation
        seen: list[float] = []
        for i in range(min(n, 300)):
            t0 = time.perf_counter()
            async with r.pipeline(transaction=True) as pipe:  # the write and its event
                await pipe.set("w", i).publish("w", i).execute()
            while await pubsub.get_message(timeout=5) is None:
                pass
            seen.append(time.perf_counter() - t0)
        await pubsub.aclose()
    finally:
        await r.aclose()
        await sub.aclose()
    return {"put": _ms(put, 0.5), "put99": _ms(put, 0.99), "get": _ms(get, 0.5),
            "cas": _ms(swap, 0.5), "rate": many, "watch": _ms(seen, 0.5)}


ROWS = [("put, one at a time: p50 (ms)", "put", ".2f"),
        ("put, one at a time: p99 (ms)", "put99", ".2f"),
        ("get, one at a time: p50 (ms)", "get", ".2f"),
        ("compare-and-set put: p50 (ms)", "cas", ".2f"),
        ("puts, {c} in flight (puts/s)", "rate", ",.0f"),
        ("a watcher sees a put: p50 (ms)", "watch", ".2f")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puts", type=int, default=2000, help="operations per latency row")
    ap.add_argument("--concurrency", type=int, default=64, help="puts in flight")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-redis", action="store_true", help="minou alone")
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"minou": []}
    with tempfile.TemporaryDirectory(prefix="minou-kv-", dir=HERE / "results") as work:
        broker = MinouBroker(Path(work))
        always = MinouRedis(Path(work), "always")
        everysec = PeerServer("redis-aof", Path(work))
        try:
            for _ in range(args.runs):
                url = broker.start()
                results["minou"].append(asyncio.run(
                    measure_minou(url, args.puts, args.concurrency)))
                if args.no_redis:
                    continue
                always.start()
                results.setdefault("Redis always", []).append(asyncio.run(
                    measure_redis(always.url, args.puts, args.concurrency)))
                always.close()
                everysec.start()
                results.setdefault("Redis everysec", []).append(asyncio.run(
                    measure_redis(f"redis://127.0.0.1:{everysec.port}/0", args.puts,
                                  args.concurrency)))
                everysec.stop()
        finally:
            broker.close()
            always.close()
            everysec.stop()

    def cell(name: str, key: str, fmt: str) -> str:
        values = sorted(r[key] for r in results[name])
        return (f"{format(statistics.median(values), fmt)} "
                f"({format(values[0], fmt)} - {format(values[-1], fmt)})")

    names = list(results)
    print(f"KV buckets, medians of {args.runs} runs (min - max)")
    print("| row | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for label, key, fmt in ROWS:
        print(f"| {label.format(c=args.concurrency)} | "
              + " | ".join(cell(n, key, fmt) for n in names) + " |")


if __name__ == "__main__":
    main()
