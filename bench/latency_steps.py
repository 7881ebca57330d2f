"""Where each message's end-to-end time goes, step by step, as test c runs it: a dev
broker whose publish, confirm and delivery are time-stamped per message from outside
(patched here: nothing in src/ changes), one paced producer process and one consumer
process (prefetch 100, an ack per message), joined by seq. For issue 19's latency work.

    .venv/bin/python bench/latency_steps.py                       # fsync (the default)
    .venv/bin/python bench/latency_steps.py --durability interval

Steps (CLOCK_MONOTONIC in every process): stamp -> the broker has the publish frame
(the producer's client, the socket, the broker's loop getting to it); -> its confirm is
written (the commit: hand-off to the writer, SQLite, back to the loop); -> the delivery
is written; -> the consumer has it in hand. Printed: p50 / p90 / p99 of each, and the
mean of each over the slowest 1 % of messages (what the p99 is made of).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHANNEL = "latency-steps/v1/1"
STAMP = struct.Struct("<q")
STEPS = ("total", "stamp -> broker has it", "-> confirmed (commit)",
         "-> delivery written", "-> consumer has it")


def serve(config: str, out: str) -> None:
    """The broker, patched to time-stamp CHANNEL's messages; writes them at exit."""
    from minou.cli import main as minou_main
    from minou.server import connection as connmod

    now = time.monotonic_ns
    per_seq: dict[int, list[int]] = {}  # seq -> [received, confirmed, delivered]
    received: dict[tuple[int, int], int] = {}  # (connection, req) -> publish received
    publish_here = connmod.NativeConnection.publish_here
    send = connmod.NativeConnection.send
    send_deliveries = connmod.NativeConnection.send_deliveries

    def traced_publish_here(self: Any, frame: Any) -> None:
        if frame.msgs and frame.msgs[0].channel == CHANNEL:
            received[(id(self), frame.req)] = now()
        publish_here(self, frame)

    def traced_send(self: Any, frame: Any) -> None:
        t0 = received.pop((id(self), getattr(frame, "req", None)), None)
        if t0 is not None and hasattr(frame, "outcomes"):
            t1 = now()
            for outcome in frame.outcomes:
                per_seq.setdefault(outcome.seq, [0, 0, 0])[:2] = [t0, t1]
        send(self, frame)

    def traced_send_deliveries(self: Any, sid: int, items: Any) -> None:
        t = now()
        for d in items:
            if d.channel == CHANNEL:
                per_seq.setdefault(d.seq, [0, 0, 0])[2] = t
        send_deliveries(self, sid, items)

    connmod.NativeConnection.publish_here = traced_publish_here  # type: ignore[method-assign]
    connmod.NativeConnection.send = traced_send  # type: ignore[method-assign]
    connmod.NativeConnection.send_deliveries = traced_send_deliveries  # type: ignore[method-assign]
    atexit.register(lambda: Path(out).write_text(json.dumps(per_seq)))
    sys.argv = ["minou", "start", "--dev", "--config", config, "--log-level", "warning"]
    minou_main()


def _uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


async def _produce(url: str, rate: float, n: int) -> None:
    import minou
    from peers import pace  # bench/, beside this file

    client = await minou.connect(url, client_id="latency-steps-p")
    await asyncio.sleep(0.5)
    pad = b"x" * 92
    futs, sent, t0 = [], 0, time.monotonic()
    while sent < n:  # paced as bench/bench_clients.py paces test c's producer
        due = min(n, int((time.monotonic() - t0) * rate) + 1)
        while sent < due:
            futs.append(client.send(CHANNEL, STAMP.pack(time.monotonic_ns()) + pad))
            sent += 1
        await pace(t0, sent, rate)
    await asyncio.gather(*futs)
    await client.close()


def produce(url: str, rate: float, n: int) -> None:
    _uvloop()
    asyncio.run(_produce(url, rate, n))


async def _consume(url: str, n: int, out: Any) -> None:
    import minou

    client = await minou.connect(url, client_id="latency-steps-c")
    sub = await client.consume(CHANNEL, prefetch=100)
    got: list[tuple[int, int, int]] = []
    while len(got) < n:
        msg = sub.get_nowait() or await sub.get(30)
        got.append((STAMP.unpack_from(msg.data)[0], time.monotonic_ns(), msg.seq))
        msg.ack()
    out.put(got)
    await client.close()


def consume(url: str, n: int, out: Any) -> None:
    _uvloop()
    asyncio.run(_consume(url, n, out))


def report(got: list[tuple[int, int, int]], per_seq: dict[str, list[int]]) -> str:
    rows = []
    for stamp, in_hand, seq in got:
        times = per_seq.get(str(seq))
        if times and all(times):
            received, confirmed, delivered = times
            rows.append((in_hand - stamp, received - stamp, confirmed - received,
                         delivered - confirmed, in_hand - delivered))
    if not rows:
        return "no message was traced"

    def pct(values: list[int], p: float) -> float:
        return sorted(values)[min(len(values) - 1, int(p * len(values)))] / 1e6

    slowest = sorted(rows, reverse=True)[:max(1, len(rows) // 100)]
    lines = [f"{len(rows):,} messages traced",
             "| step | p50 ms | p90 ms | p99 ms | mean over the slowest 1 % (ms) |",
             "|---|---:|---:|---:|---:|"]
    for i, step in enumerate(STEPS):
        col = [r[i] for r in rows]
        tail = sum(r[i] for r in slowest) / len(slowest) / 1e6
        lines.append(f"| {step} | {pct(col, .5):.3f} | {pct(col, .9):.3f} | "
                     f"{pct(col, .99):.3f} | {tail:.3f} |")
    return "\n".join(lines)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durability", choices=["fsync", "interval"], default="fsync")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("-n", type=int, default=10_000)
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    with tempfile.TemporaryDirectory(prefix="minou-steps-") as tmp:
        port = free_port()
        config, out = Path(tmp, "minou.toml"), Path(tmp, "broker.json")
        config.write_text(f'port = {port}\nhttp_port = {free_port()}\ndata_dir = "{tmp}/data"\n'
                          f'[channels."latency-steps/v1"]\ndurability = "{args.durability}"\n')
        broker = subprocess.Popen([sys.executable, __file__, "--serve", str(config), str(out)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert broker.stdout is not None
            for line in broker.stdout:  # the banner: ready once it names the data file
                if "minou.db" in line:
                    break
            url = f"minou://127.0.0.1:{port}"
            ctx = mp.get_context("spawn")
            results = ctx.Queue()
            consumer = ctx.Process(target=consume, args=(url, args.n, results))
            consumer.start()
            time.sleep(1.0)
            producer = ctx.Process(target=produce, args=(url, args.rate, args.n))
            producer.start()
            got = results.get(timeout=args.n / args.rate + 60)
            producer.join()
            consumer.join()
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait(30)
        print(f"durability {args.durability}, {args.rate:g} msg/s, {args.n:,} x 100 B, "
              f"pid {os.getpid()}")
        print(report(got, json.loads(out.read_text())))


if __name__ == "__main__":
    main()
