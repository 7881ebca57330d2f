"""What the core-alone benches share (core_deliver_ack.py, core_publish.py): their
options, and this thread's CPU time per message of a piece of work run with the
collector off (CPU time, not wall time: other work on a shared machine moves it less)."""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable


def parser(doc: str | None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    return ap


def cpu_us_per_message(work: Callable[[], None], n: int) -> float:
    """Microseconds of this thread's CPU a message, ``work`` handling ``n`` messages."""
    gc.disable()
    try:
        t0 = time.thread_time()
        work()
        return (time.thread_time() - t0) / n * 1e6
    finally:
        gc.enable()


def summary(times: list[float]) -> str:
    times = sorted(times)
    return f"median {times[len(times) // 2]:.3f} µs/msg (best {times[0]:.3f})"
