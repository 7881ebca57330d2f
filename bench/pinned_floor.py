#!/usr/bin/env python3
"""One message that waits pins a consumer group's floor: what every ack after it costs.

The broker core in-process, no sockets and no storage: a group of one member (prefetch
1,000) reads ``-n`` messages of one channel; the first delivery is nacked with a delay
(``--pin nack``: a "retry later" of 10^6 s) or the first message is published with a
publish-time delay (``--pin sched``), or nothing waits (``--pin none``); every other
message is acked. Printed: acks per second (this thread's CPU time over the delivery
loop, commits included), the group-state bytes of the first and the last commits, the
bytes of all of them, and what the group holds for its acks at the end (the
``GroupChannel`` entries: set members plus ranges).

``--broker``: a real broker (SQLite, fsync) over a real connection: ``-n`` messages
published, the first delivery nacked with a one-hour delay (``--pin nack``; none with
``--pin none``), every other one acked by a consumer of prefetch 1,000. Printed: acks
per second (wall), storage commits per second over the acks (``minou_storage_commits``),
the broker's RSS at the end, and the group's state row in the database.

Usage:  .venv/bin/python bench/pinned_floor.py [-n 199000] [--pin nack|sched|none]
        .venv/bin/python bench/pinned_floor.py --broker [-n 200000] [--pin nack|none]
        (PYTHONPATH=<other checkout>/src to measure another version: the broker runs
        the code on PYTHONPATH too)
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from minou.core.broker import Broker, Session  # noqa: E402
from minou.protocol.frames import Send  # noqa: E402


def held(gc: object) -> int:
    """Entries the group holds for its acks: set members, plus ranges where kept."""
    n = len(gc.acked)  # type: ignore[attr-defined]
    runs = getattr(gc, "acked_runs", None)  # None before runs; count_runs() before SeqRuns
    if runs is None:                         # served the channel's deleted seqs too
        return n
    return n + (runs.run_count() if hasattr(runs, "run_count") else runs.count_runs())


def run(n: int, pin: str) -> dict[str, float]:
    b = Broker()
    now = 1000.0
    s = Session("c")
    b.subscribe(s, 1, kind="consume", patterns=["o/v1/1"], group="g", prefetch=1000, now=now)
    total = n + 1
    if pin == "sched":
        b.publish([Send("o/v1/1", b"0", delay=1e6)], now)
        b.on_committed(b.take_writes(), now)
        total -= 1
    for i in range(0, total, 1000):
        b.publish([Send("o/v1/1", b"1") for _ in range(min(1000, total - i))], now)
        b.on_committed(b.take_writes(), now)
    first = pin == "nack"
    done = 0
    sizes: list[int] = []
    t0 = time.thread_time()
    while done < n:
        out, loads = b.pump(now)
        assert not loads
        if not out:
            break
        for _sub, items in out.items():
            tags = [d.tag for d in items]
            if first:
                b.nack(s, tags[:1], delay=1e6, front=False, now=now)
                tags = tags[1:]
                first = False
            b.ack(s, tags, now)
            done += len(tags)
        w = b.take_writes()
        sizes += [len(v[1]) for v in w.group_states.values() if v]
        b.on_committed(w, now)
    cpu = time.thread_time() - t0
    gc = b.state.groups["consume:g"].gcs["o/v1/1"]
    return {"acks": done, "acks_s": done / cpu, "first": sizes[0], "last": sizes[-1],
            "total_mb": sum(sizes) / 1e6, "held": held(gc), "floor": gc.compute_floor()}


# ------------------------------------------------------------------ a real broker
def _metric(http_url: str, admin_key: str, name: str) -> float:
    from minou.auth import keys
    from minou.auth.tokens import make_token

    token = make_token("admin", keys.load_private(admin_key), "minou", ttl=600)
    req = urllib.request.Request(f"{http_url}/metrics",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"no {name} in /metrics")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _drive(url: str, http_url: str, admin_key: str, n: int, pin: str
                 ) -> tuple[float, float]:
    import minou
    from bench_clients import _process_key

    ch = "bench/v1/pin"
    async with await minou.connect(url, client_id="bench-pin", key=_process_key()) as c:
        for start in range(0, n, 5_000):
            await c.send_many([(ch, i) for i in range(start, min(start + 5_000, n))])
        sub = await c.consume(ch, group="g", prefetch=1_000)
        first = await sub.get(timeout=30)
        if pin == "nack":
            await first.nack(delay=3600.0)
            todo = n - 1
        else:
            first.ack()
            todo = n - 1
        commits0 = _metric(http_url, admin_key, "minou_storage_commits_total")
        t0 = time.monotonic()
        last = None
        for i in range(todo):
            msg = await sub.get(timeout=30)
            last = msg.ack()
            if i % 1_000 == 999:
                await last
        if last is not None:
            await last
        took = time.monotonic() - t0
        commits = _metric(http_url, admin_key, "minou_storage_commits_total") - commits0
    return todo / took, commits / took


def run_broker(n: int, pin: str) -> None:
    from bench_servers import MinouBroker

    with tempfile.TemporaryDirectory(prefix="pinned-floor-") as work:
        broker = MinouBroker(Path(work), name="pinned")
        try:
            url = broker.start()
            assert broker.http_url is not None and broker.pid is not None
            assert broker.admin_key is not None
            acks_s, commits_s = asyncio.run(_drive(url, broker.http_url, broker.admin_key,
                                                   n, pin))
            time.sleep(1.0)
            rss = _rss_mib(broker.pid)
            assert broker.data_dir is not None
            db = sqlite3.connect(f"file:{broker.data_dir / 'minou.db'}?mode=ro", uri=True)
            rows = db.execute("SELECT floor, length(state) FROM group_states "
                              "WHERE channel = 'bench/v1/pin'").fetchall()
            db.close()
            print(f"broker, pin {pin}: {n - 1} acks, {acks_s:,.0f} acks/s, "
                  f"{commits_s:,.0f} commits/s; RSS {rss:.0f} MiB at the end; "
                  f"group state row (floor, bytes): {rows}")
        finally:
            broker.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=199_000)
    ap.add_argument("--pin", choices=("nack", "sched", "none"), default="nack")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--broker", action="store_true", help="through a real broker")
    args = ap.parse_args()
    if args.broker:
        run_broker(args.n, args.pin)
        return
    results = [run(args.n, args.pin) for _ in range(args.runs)]
    rates = sorted(r["acks_s"] for r in results)
    r = results[-1]
    print(f"pin {args.pin}: {r['acks']:.0f} acks, median {rates[len(rates) // 2]:,.0f} acks/s "
          f"(CPU); group state per commit: first {r['first']:.0f} B, last {r['last']:.0f} B,"
          f" {r['total_mb']:.1f} MB in all; entries held {r['held']:.0f}; "
          f"floor {r['floor']:.0f}")


if __name__ == "__main__":
    main()
