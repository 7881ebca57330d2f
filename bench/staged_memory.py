#!/usr/bin/env python3
"""What staged pages (the exactly-once sink's STAGE, a federation link's pages) hold
in the broker, against what the broker counts for them (``staged_bytes``, the bound
MAX_STAGED_BYTES_PER_CLIENT is held to).

  PYTHONPATH=<tree>/src .venv/bin/python bench/staged_memory.py
  PYTHONPATH=<tree>/src .venv/bin/python bench/staged_memory.py --pages 5000 --runs 5

Two parts:

* in process (the core alone): ``--pages`` STAGE frames of each shape decoded as a
  connection decodes them and staged; the memory they hold, traced (tracemalloc),
  against the count; and the time to stage a message (the count included), median of
  ``--runs``;
* a real broker (SQLite, key auth): one client stages ``--pages`` federation pages (10
  messages of 100 B, the two headers a link adds, a key) and leaves them staged, as a
  dropped link does; the broker's anonymous memory before and after, against the
  ``staged_bytes`` its status reports; then they are aborted.

The tree measured is the one on PYTHONPATH (this repository's src otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent / "src"))  # after PYTHONPATH: the tree asked for wins
sys.path.insert(0, str(HERE))

import minou  # noqa: E402
from bench_clients import _process_key  # noqa: E402
from bench_servers import MinouBroker  # noqa: E402
from federation_reconnect_loop import broker_numbers, status  # noqa: E402
from minou.core.transactions import Transactions  # noqa: E402
from minou.names import FEDERATED_FROM, FEDERATED_SEQ  # noqa: E402
from minou.protocol import frames as f  # noqa: E402
from minou.protocol.reader import FrameReader  # noqa: E402


def federation_page(n: int) -> list[f.Send]:
    return [f.Send(f"fed-orders/v1/{n % 4}", b"x" * 100, True,
                   {FEDERATED_FROM: "remote-broker",
                    FEDERATED_SEQ: f"orders/v1/{n % 4}:{n * 10 + i}"}, 0, None, None, None,
                   f"k{i}") for i in range(10)]


SHAPES: dict[str, Callable[[int], list[f.Send]]] = {
    "federation page (10 x 100 B, 2 headers, key)": federation_page,
    "10 x 100 B, headers {} (federation_reconnect_loop's)": lambda n: [
        f.Send(f"bench/v1/{n % 4}", b"x" * 100, True, {}) for _ in range(10)],
    "one empty message": lambda n: [f.Send("a/v1/1", b"", True)],
}


def txn_id(n: int) -> str:
    return f"fed:probe:push:orders/v1/{n % 4}:{n}:0a1b2c3d"


def in_process(pages: int, runs: int) -> None:
    print(f"in process, {pages} pages a shape:")
    print("| shape | held a page | counted a page | counted / held | µs to stage a message |")
    print("|---|---:|---:|---:|---:|")
    for name, shape in SHAPES.items():
        frames = [f.encode(f.Stage(n + 1, txn_id(n), shape(n))) for n in range(pages)]
        per_msg = pages * len(shape(0))
        times = []
        for _ in range(runs):
            decoded = []
            reader = FrameReader()
            for data in frames:
                reader.receive_data(data)
                decoded.append(reader.next_event())
            t = Transactions()
            gc.collect()
            gc.disable()  # the cyclic GC's passes over what is held are not the count's
            t0 = time.perf_counter()
            for frame in decoded:
                t.stage("bridge", frame.txn, list(frame.msgs), 0.0)
            times.append((time.perf_counter() - t0) / per_msg * 1e6)
            gc.enable()
        t = Transactions()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        reader = FrameReader()
        for data in frames:
            reader.receive_data(data)
            frame = reader.next_event()
            t.stage("bridge", frame.txn, list(frame.msgs), 0.0)
        del reader, frame
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        print(f"| {name} | {held / pages:,.0f} B | {t.bytes / pages:,.0f} B | "
              f"{t.bytes / held:.2f} | {statistics.median(times):.2f} |")


async def on_broker(url: str, pid: int, pages: int) -> None:
    client = await minou.connect(url, client_id="bench-bridge", key=_process_key())
    try:
        await client.ping()
        gc.collect()
        await asyncio.sleep(1.0)
        before = broker_numbers(pid)["anonymous_mib"]
        txns = [txn_id(n) for n in range(pages)]

        async def stage_all(again: str) -> None:
            for lo in range(0, pages, 64):  # 64 STAGEs in flight: the commits batch
                await asyncio.gather(*(client.stage_sends(txns[n] + again, federation_page(n))
                                       for n in range(lo, min(pages, lo + 64))))
            await asyncio.sleep(1.0)

        async def abort_all(again: str) -> None:
            for lo in range(0, pages, 1000):
                await client.abort_transactions([t + again for t in txns[lo:lo + 1000]])
            await asyncio.sleep(1.0)

        await stage_all("")
        after = broker_numbers(pid)["anonymous_mib"]
        counted = (await status(url))["transactions"]["staged_bytes"]
        await abort_all("")
        aborted = broker_numbers(pid)["anonymous_mib"]
        left = (await status(url))["transactions"]["staged_bytes"]
        await stage_all(":again")  # the room the first pages left is taken again
        again = broker_numbers(pid)["anonymous_mib"]
        await abort_all(":again")
    finally:
        await client.close()
    grew = (after - before) * (1 << 20)
    print(f"\nbroker, {pages} federation pages staged and left: anonymous memory "
          f"{before} -> {after} MiB ({grew / pages:,.0f} B a page), counted "
          f"{counted / (1 << 20):.1f} MiB ({counted / pages:,.0f} B a page, "
          f"{counted / grew if grew else 0:.2f} of the growth); aborted: {aborted} MiB, "
          f"{left} B counted; as many staged again: {again} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=5, help="timings, the median shown")
    ap.add_argument("--no-broker", action="store_true", help="the in-process part alone")
    args = ap.parse_args()
    print(f"minou from {Path(minou.__file__).parent}")
    in_process(args.pages, args.runs)
    if args.no_broker:
        return
    with tempfile.TemporaryDirectory(prefix="minou-staged-") as tmp:
        broker = MinouBroker(Path(tmp), name="staged")
        url = broker.start()
        try:
            assert broker.pid is not None
            asyncio.run(on_broker(url, broker.pid, args.pages))
        finally:
            broker.close()


if __name__ == "__main__":
    main()
