#!/usr/bin/env python3
"""A federation remote reconnecting in a tight loop, against one real broker: what it
costs the broker and the other clients.

  .venv/bin/python bench/federation_reconnect_loop.py
  .venv/bin/python bench/federation_reconnect_loop.py --seconds 20 --parallel 4

A minou link backs off (0.5 s doubling to 30 s) and cannot do this; another
implementation, an older one or a script can. ``--parallel`` loops, each as fast as it
can, each connection under the link's identity (``bench-bridge``, key auth): HELLO, then
what a link's pipe does on connecting (``txn.fences`` of its writer, ``OFFSETS`` of its
patterns, ``SET_POSITION`` of its group: a pull's handshake on its remote), then drops
the connection, one way per phase:

* ``close``: a clean close (BYE);
* ``abort``: the socket reset, no BYE (a crash, a cut);
* ``wait``: the pipe's long poll (``channels.wait``) pending, then the reset;
* ``stage``: a page of 10 messages staged (``STAGE``), then the reset before its commit.

Meanwhile another client pings the broker every 20 ms. Printed per phase: connections
made and refused (by reason), the other client's PING p50 / p99 / max, and after the
phase the broker's descriptors, RSS, connections, long polls waiting, transactions
staged (and their bytes), groups, and the lines its log gained (``--log-level info``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
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
from minou.protocol import frames as f  # noqa: E402

PATTERNS = ["bench/v1/*"]
WRITER = "fed:probe:push"
GROUP = "federation:probe:pull"
PHASES = ("close", "abort", "wait", "stage")


def broker_numbers(pid: int) -> dict[str, int]:
    """Its descriptors, and its resident memory in MiB: all of it, and the anonymous
    part (the heap; the rest is mapped files: SQLite's WAL index, libraries)."""
    out = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Rss", "Anonymous"):
            out[name.lower() + "_mib"] = int(value.split()[0]) // 1024
    return out


def drop(client: Any) -> None:
    """The connection reset, no BYE: as a crashed or cut remote."""
    proto = client._proto
    if proto is not None and proto.transport is not None:
        proto.transport.abort()


async def one(url: str, phase: str, n: int, client_id: str) -> None:
    client = await minou.connect(url, client_id=client_id, key=_process_key(),
                                 reconnect=False, request_timeout=10)
    try:
        await client.admin("txn.fences", writer_id=WRITER)
        offsets = await client.offsets(PATTERNS)
        if offsets:
            await client.set_position(GROUP, {ch: first for ch, (first, _) in offsets.items()})
        if phase == "wait":
            after = json.dumps({ch: nxt for ch, (_, nxt) in offsets.items()})
            poll = asyncio.ensure_future(client.admin(
                "channels.wait", patterns=json.dumps(PATTERNS), after=after, wait=5))
            await asyncio.sleep(0.005)  # the request is out, the broker waits on it
            poll.cancel()
        elif phase == "stage":
            sends = [f.Send(f"bench/v1/{n % 4}", b"x" * 100, True, {}, 0, None, None, None,
                            None) for _ in range(10)]
            await client.stage_sends(f"{WRITER}:bench/v1/{n % 4}:{n}", sends)
    finally:
        if phase == "close":
            await client.close()
        else:
            drop(client)
            await client.close()


async def loop(url: str, phase: str, until: float, made: collections.Counter[str],
               start: int, client_id: str) -> None:
    n = start
    while time.monotonic() < until:
        n += 1
        try:
            await one(url, phase, n, client_id)
            made["ok"] += 1
        except Exception as exc:  # counted by reason: the probe's result
            text = str(exc)
            made["refused: " + (text[:70] if text else type(exc).__name__)] += 1


async def pinger(url: str, until: float, out: list[float]) -> None:
    client = await minou.connect(url, client_id="bench-other", key=_process_key())
    try:
        while time.monotonic() < until:
            t = time.perf_counter()
            await client.ping()
            out.append(time.perf_counter() - t)
            await asyncio.sleep(0.02)
    finally:
        await client.close()


async def status(url: str) -> dict[str, Any]:
    admin_key = os.environ["MINOU_BENCH_ADMIN_KEY"]
    from minou.auth import keys

    async with await minou.connect(url, client_id="admin",
                                   key=keys.load_private(Path(admin_key))) as c:
        return await c.admin("status")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else 0.0


async def run(url: str, pid: int, log: Path, args: argparse.Namespace) -> None:
    producer = await minou.connect(url, client_id="bench-producer", key=_process_key())
    await producer.send_many([(f"bench/v1/{i}", b"m") for i in range(4)])
    await producer.close()
    idle: list[float] = []
    await pinger(url, time.monotonic() + 3, idle)
    base = broker_numbers(pid)
    print(f"idle: ping p50 {pct(idle, .5):.2f} ms p99 {pct(idle, .99):.2f} ms; "
          f"fds {base['fds']}, RSS {base['rss_mib']} MiB ({base['anonymous_mib']} anonymous)")
    phases = args.phases.split(",")
    for round_ in range(args.rounds):
        for phase in phases:
            # One identity for every loop (a real remote's), per phase and round unless
            # --same-identity: its replay-guard quota (5,000 a minute) is each phase's.
            who = "bench-bridge" if args.same_identity else f"bench-bridge-{phase}-{round_}"
            lines = len(log.read_text().splitlines())
            made: collections.Counter[str] = collections.Counter()
            pings: list[float] = []
            t0 = time.monotonic()
            until = t0 + args.seconds
            await asyncio.gather(pinger(url, until, pings),
                                 *(loop(url, phase, until, made, i * 1_000_000, who)
                                   for i in range(args.parallel)))
            took = time.monotonic() - t0
            await asyncio.sleep(1.0)  # the broker sees the last resets
            await report(url, pid, log, lines, f"{phase} ({who})", made, pings, took)
    if args.rest:
        print(f"\nidle {args.rest:.0f} s (the tokens' ids expire after a minute)")
        await asyncio.sleep(args.rest)
        await report(url, pid, log, len(log.read_text().splitlines()), "rest",
                     collections.Counter(), [], args.rest)


async def report(url: str, pid: int, log: Path, lines: int, name: str,
                 made: collections.Counter[str], pings: list[float], took: float) -> None:
    nums = broker_numbers(pid)
    st = await status(url)
    tx = st["transactions"]
    added = log.read_text().splitlines()[lines:]
    print(f"\n{name}: {made['ok']} connections in {took:.1f} s "
          f"({made['ok'] / took:.0f}/s), refused {sum(made.values()) - made['ok']}")
    for reason, count in made.most_common():
        if reason != "ok":
            print(f"   {count:>6}  {reason}")
    if pings:
        print(f"   other client's ping: p50 {pct(pings, .5):.2f} ms, p99 "
              f"{pct(pings, .99):.2f} ms, max {max(pings) * 1000:.1f} ms ({len(pings)})")
    print(f"   after: fds {nums['fds']}, RSS {nums['rss_mib']} MiB "
          f"({nums['anonymous_mib']} anonymous), connections "
          f"{st['connections']}, long polls {st['long_polls']}, staged "
          f"{tx['staged']} ({tx['staged_bytes']} B), groups {st['groups']}, "
          f"auth failures {sum(st['auth']['failures'].values())}")
    print(f"   log lines added: {len(added)}")
    for line, count in collections.Counter(ln.split(": ", 1)[-1][:90] for ln in added) \
            .most_common(3):
        print(f"      {count:>6}  {line}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="per phase")
    ap.add_argument("--parallel", type=int, default=4, help="loops at once")
    ap.add_argument("--phases", default=",".join(PHASES), help="of " + ", ".join(PHASES))
    ap.add_argument("--rounds", type=int, default=1, help="the phases this many times")
    ap.add_argument("--same-identity", action="store_true",
                    help="every phase under one client id (else one per phase and round)")
    ap.add_argument("--rest", type=float, default=0.0, help="idle seconds at the end")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="minou-fedloop-") as tmp:
        broker = MinouBroker(Path(tmp), name="us", log_level="info")
        url = broker.start()
        try:
            asyncio.run(run(url, broker.pid, Path(tmp) / "us-broker.log", args))
        finally:
            broker.close()


if __name__ == "__main__":
    main()
