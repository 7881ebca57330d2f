"""What a channel's deleted seqs (``ChannelLog.gone``) hold in memory, the broker core
alone (no sockets, no storage): traced bytes (tracemalloc) of the broker once filled,
less those of the same broker with no deletion, per deleted seq; and, for comparison,
what a bitmap of the same seqs (1 bit per seq in [first_seq, end)) would take.

Cases (a key-value bucket, history 1: each update deletes the key's older revision):
``hot``        1 cold key written once (it pins ``first_seq``), then a hot key updated
               ``-n`` times: the deletions are one run.
``alternate``  ``-n`` rounds of a new key then an update of the hot key: every other seq
               is deleted (the worst case for runs; the live keys are as many).

Usage:  .venv/bin/python bench/gone_memory.py [-n 200000] [--cases hot,alternate]
        (PYTHONPATH=<other checkout>/src to measure another version)
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

from minou.core.broker import Broker
from minou.protocol.frames import Send

CH = "_kv/v1/bench"
BATCH = 1000


def fill(case: str, n: int) -> Broker:
    b, now = Broker(), 1000.0
    b.publish([Send(CH, b"1", key="cold")], now)
    b.on_committed(b.take_writes(), now)
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        if case == "hot":
            sends = [Send(CH, b"2", key="hot") for _ in range(k)]
        else:
            sends = [s for i in range(start, start + k)
                     for s in (Send(CH, b"3", key=f"k{i}"), Send(CH, b"2", key="hot"))]
        b.publish(sends, now)
        b.on_committed(b.take_writes(), now)
    return b


def traced(case: str, n: int) -> tuple[int, Broker, float]:
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    b = fill(case, n)
    took = time.perf_counter() - t0
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size, b, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--cases", default="hot,alternate")
    args = ap.parse_args()
    print(f"{'case':10} {'n':>9} {'deleted':>9} {'live':>8} {'traced MiB':>10} "
          f"{'B/deleted':>9} {'bitmap KiB':>10} {'fill s':>7}")
    for case in args.cases.split(","):
        size, b, took = traced(case, args.n)
        # the same bucket filled with no deletion: what the live keys hold
        base, _, _ = traced(case, 0) if case == "hot" else (0, None, 0)
        log = b.state.channels[CH]
        deleted = len(log.gone)
        if case == "alternate":  # its live keys hold as many: a second bucket without
            b2, now = Broker(), 1000.0  # the hot key's deletions, to subtract
            gc.collect()
            tracemalloc.start()
            for start in range(0, args.n, BATCH):
                b2.publish([Send(CH, b"3", key=f"k{i}")
                            for i in range(start, min(args.n, start + BATCH))], now)
                b2.on_committed(b2.take_writes(), now)
            gc.collect()
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
        per = (size - base) / deleted if deleted else 0.0
        bitmap = (log.end - log.first_seq + 7) // 8 / 1024
        print(f"{case:10} {args.n:>9} {deleted:>9} {log.count:>8} "
              f"{size / 2**20:>10.1f} {per:>9.1f} {bitmap:>10.1f} {took:>7.2f}")


if __name__ == "__main__":
    main()
