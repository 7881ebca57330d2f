"""Commits held back by WAL checkpoints (and by interval syncs), without a broker: one
writer applies one-message batches to ``SQLiteStorage`` at a steady pace (each with the
ack state a consumer's previous ack stores, as at 2,000 msg/s under test c), while a
second thread checkpoints the way the broker does (every 0.25 s once the WAL file is
past half its threshold) and, with ``--durability interval``, a third syncs the WAL
every 50 ms. Prints the commits' apply time (p50 / p99 / p99.9 / max), how many took
over 2 ms, and how many times the WAL was started over.

    .venv/bin/python bench/checkpoint_stalls.py [--durability fsync|interval] [-n 16000]
    PYTHONPATH=<other tree>/src .venv/bin/python bench/checkpoint_stalls.py   # A/B

The WAL is filled to past half the threshold first, so the whole run is in the
broker's steady state (every tick checkpoints).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from minou.core.log import Msg
from minou.core.writes import WriteBatch
from minou.storage.sqlite import SQLiteStorage

CHANNEL = "stalls/v1/1"
TICK_S = 0.25  # the broker's ticker
SYNC_S = 0.05  # the default sync_interval


def batch(seq: int, interval: bool) -> WriteBatch:
    """A publish, with the group state and truncation of the previous message's ack."""
    b = WriteBatch(sync_within=SYNC_S if interval else None)
    b.messages.append(Msg(CHANNEL, seq, f"id-{seq}", b"x" * 100, published_at=time.time()))
    b.channels[CHANNEL] = seq + 1
    if seq > 2:
        b.group_states[("consume:g", CHANNEL)] = (seq - 1, b"\x93\x90\x80\x90")
        b.truncates[CHANNEL] = seq - 1
    return b


def run(interval: bool, n: int, rate: float) -> str:
    with tempfile.TemporaryDirectory(prefix="minou-stalls-") as tmp:
        store = SQLiteStorage(Path(tmp))
        store.open(time.time())
        seq = 0
        while store.wal_bytes() <= store.wal_limit // 2:  # the steady state
            seq += 1
            store.apply(batch(seq, interval))
        stop = threading.Event()

        def checkpoints() -> None:
            while not stop.wait(TICK_S):
                if store.wal_bytes() > store.wal_limit // 2:
                    store.checkpoint()

        def syncs() -> None:
            while not stop.wait(SYNC_S):
                store.sync()

        threads = [threading.Thread(target=checkpoints, daemon=True)]
        if interval:
            threads.append(threading.Thread(target=syncs, daemon=True))
        with open(store.path + "-wal", "rb") as wal:
            restarts0 = int.from_bytes(wal.read(16)[12:16], "big")
        for t in threads:
            t.start()
        took: list[float] = []
        t0 = time.perf_counter()
        for i in range(n):
            due = t0 + i / rate
            while (left := due - time.perf_counter()) > 0:
                time.sleep(min(left, 0.0002))
            seq += 1
            b = batch(seq, interval)
            start = time.perf_counter()
            store.apply(b)
            took.append(time.perf_counter() - start)
        stop.set()
        for t in threads:
            t.join()
        with open(store.path + "-wal", "rb") as wal:
            restarts = int.from_bytes(wal.read(16)[12:16], "big") - restarts0
        store.close()
    took.sort()

    def ms(q: float) -> float:
        return took[min(len(took) - 1, int(len(took) * q))] * 1e3

    slow = sum(1 for t in took if t > 0.002)
    return (f"apply p50 {ms(0.5):.3f} / p99 {ms(0.99):.3f} / p99.9 {ms(0.999):.2f} / max "
            f"{took[-1] * 1e3:.1f} ms; {slow} of {n} over 2 ms; WAL started over "
            f"{restarts} times in {n / rate:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--durability", choices=["fsync", "interval"], default="fsync")
    ap.add_argument("-n", type=int, default=16_000)
    ap.add_argument("--rate", type=float, default=2000.0)
    args = ap.parse_args()
    print(f"{args.durability}, {args.rate:g} commits/s: "
          f"{run(args.durability == 'interval', args.n, args.rate)}")


if __name__ == "__main__":
    main()
