"""The latency floor of any Python broker on this machine: what a relay with nothing in
it but the hops costs, so that minou's end-to-end latency (``make bench`` test c) can be
read against what Python itself allows here (issue 19, target 1).

Three processes, as in test c: a paced producer (2,000 msg/s of 100 B, each stamped
with CLOCK_MONOTONIC), a relay, and a consumer that takes the stamp off. All three run
uvloop. The relay does no parsing, no auth, no bookkeeping; it only batches what came
in and, depending on the mode, makes it durable before passing it on:

  relay         nothing: read, write to the consumer
  thread        one hop to a worker thread and back (what minou's writer costs, no disk)
  write         os.write to a file on the loop (no fsync)
  fsync         os.write + fdatasync on the loop (blocks the loop: a design minou avoids)
  fsync_thread  os.write + fdatasync on a worker thread, as minou commits
  sqlite        a SQLite transaction per batch on the loop (WAL, synchronous=NORMAL: the
                batch's rows and a channel row), then a confirm to the producer (8 B a
                message) and the delivery: the shape of an ``interval`` commit, with
                none of minou's own work around it (issue 19, target 2)
  sqlite_fsync  the same, then an fdatasync of the WAL on a worker thread before the
                confirm and the delivery: the shape of an ``fsync`` commit (target 1)

    .venv/bin/python bench/latency_floor.py --runs 3          # every mode, medians
    .venv/bin/python bench/latency_floor.py --modes fsync_thread --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import sqlite3
import statistics
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODES = ("relay", "thread", "write", "fsync", "fsync_thread", "sqlite", "sqlite_fsync")
CONFIRM = struct.Struct("<q")
STAMP = struct.Struct("<q")
SIZE = 100


def _uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


async def _relay(ready: Any, mode: str, path: str, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    consumers: list[asyncio.StreamWriter] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND) if mode in (
        "write", "fsync", "fsync_thread") else None
    pool = ThreadPoolExecutor(1)
    pending: list[bytes] = []
    busy = False
    producers: list[asyncio.StreamWriter] = []
    db: sqlite3.Connection | None = None
    wal_fd: int | None = None
    seq = 0
    if mode.startswith("sqlite"):
        db = sqlite3.connect(path + ".db", isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        # minou checkpoints on a thread of its own: none on the loop's commits here
        db.execute("PRAGMA wal_autocheckpoint=0")
        db.execute("CREATE TABLE m (seq INTEGER PRIMARY KEY, body BLOB)")
        db.execute("CREATE TABLE c (name TEXT PRIMARY KEY, last INTEGER)")
        db.execute("INSERT INTO c VALUES ('floor', 0)")
        # As minou writes its WAL out ahead: the run's frames go over written blocks
        # (25,000 pages, more than a run of 10,000 two-page commits writes), not appended.
        db.execute("CREATE TABLE warm (b BLOB)")
        db.execute("BEGIN")
        db.executemany("INSERT INTO warm VALUES (zeroblob(4000))", ([] for _ in range(25_000)))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(RESTART)")
        wal_fd = os.open(path + ".db-wal", os.O_RDONLY)

    def commit(data: bytes) -> int:
        # one row a message, as minou keeps a segment, and the channel's row
        nonlocal seq
        first = seq + 1
        rows = [(first + i, data[i * SIZE:(i + 1) * SIZE]) for i in range(len(data) // SIZE)]
        seq += len(rows)
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO m VALUES (?, ?)", rows)
        db.execute("UPDATE c SET last = ? WHERE name = 'floor'", (seq,))
        db.execute("COMMIT")
        return len(rows)
    tasks: set[asyncio.Task[None]] = set()

    def persist(data: bytes) -> None:
        if fd is not None:
            os.write(fd, data)
            if mode.startswith("fsync"):
                os.fdatasync(fd)

    async def flush() -> None:
        # One batch at a time, like a commit: what arrives meanwhile goes in the next.
        nonlocal busy
        while pending:
            data = b"".join(pending)
            pending.clear()
            if mode in ("thread", "fsync_thread"):
                await loop.run_in_executor(pool, persist, data)
            elif mode.startswith("sqlite"):
                count = commit(data)
                if mode == "sqlite_fsync":
                    await loop.run_in_executor(pool, os.fdatasync, wal_fd)
                for writer in producers:  # one producer: its confirms
                    writer.write(b"".join(CONFIRM.pack(seq - count + i + 1)
                                          for i in range(count)))
            else:
                persist(data)
            for writer in consumers:
                writer.write(data)
        busy = False

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal busy
        if await reader.readexactly(1) == b"c":
            consumers.append(writer)
            return
        producers.append(writer)
        while data := await reader.read(65536):
            pending.append(data)
            if not busy:
                busy = True
                task = loop.create_task(flush())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    ready.put(server.sockets[0].getsockname()[1])
    await asyncio.sleep(seconds + 10)


def relay(ready: Any, mode: str, path: str, seconds: float) -> None:
    _uvloop()
    asyncio.run(_relay(ready, mode, path, seconds))


async def _produce(port: int, rate: float, seconds: float) -> None:
    from peers import pace  # bench/, beside this file
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"p")

    async def confirms() -> None:  # read and dropped, as a client takes its confirms
        while await reader.read(65536):
            pass

    drain = asyncio.get_running_loop().create_task(confirms())
    await asyncio.sleep(0.5)
    total, sent, t0 = int(rate * seconds), 0, time.monotonic()
    pad = b"x" * (SIZE - STAMP.size)
    while sent < total:  # paced as bench/peers.py paces every peer's producer
        due = min(total, int((time.monotonic() - t0) * rate) + 1)
        while sent < due:
            writer.write(STAMP.pack(time.monotonic_ns()) + pad)
            sent += 1
        await pace(t0, sent, rate)
    await asyncio.sleep(1)
    drain.cancel()


def produce(port: int, rate: float, seconds: float) -> None:
    _uvloop()
    asyncio.run(_produce(port, rate, seconds))


async def _consume(port: int, total: int, out: Any) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"c")
    latencies: list[int] = []
    buf = b""
    while len(latencies) < total:
        buf += await reader.read(65536)
        now = time.monotonic_ns()
        while len(buf) >= SIZE:
            latencies.append(now - STAMP.unpack_from(buf)[0])
            buf = buf[SIZE:]
    out.put(latencies)


def consume(port: int, total: int, out: Any) -> None:
    _uvloop()
    asyncio.run(_consume(port, total, out))


def one_run(mode: str, rate: float, seconds: float, directory: str) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    path = os.path.join(directory, f"floor-{mode}.log")
    procs = [ctx.Process(target=relay, args=(ready, mode, path, seconds))]
    procs[0].start()
    port = ready.get(timeout=30)
    procs.append(ctx.Process(target=consume, args=(port, int(rate * seconds), out)))
    procs[1].start()
    time.sleep(0.3)
    procs.append(ctx.Process(target=produce, args=(port, rate, seconds)))
    procs[2].start()
    latencies = sorted(out.get(timeout=seconds + 60))
    for proc in procs:
        proc.kill()
        proc.join()
    for leftover in (path, path + ".db", path + ".db-wal", path + ".db-shm"):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    return (latencies[len(latencies) // 2] / 1e6, latencies[int(len(latencies) * 0.99)] / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--dir", default=None,
                        help="where the relay writes (default: a new directory in /tmp, "
                             "where make bench puts minou's data)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode!r}: expected some of {', '.join(MODES)}")
    with tempfile.TemporaryDirectory(prefix="minou-floor-", dir=args.dir) as directory:
        print(f"{args.rate:g} msg/s x {args.seconds:g} s of {SIZE} B, {args.runs} run(s) "
              f"per mode, writing in {directory}")
        print("| mode | p50 ms (min - max) | p99 ms (min - max) |\n|---|---:|---:|")
        for mode in modes:
            runs = [one_run(mode, args.rate, args.seconds, directory)
                    for _ in range(args.runs)]
            p50s, p99s = [r[0] for r in runs], [r[1] for r in runs]
            print(f"| {mode} | {statistics.median(p50s):.3f} ({min(p50s):.3f} - "
                  f"{max(p50s):.3f}) | {statistics.median(p99s):.3f} ({min(p99s):.3f} - "
                  f"{max(p99s):.3f}) |", flush=True)


if __name__ == "__main__":
    main()
