"""Messages near the 1 MiB limit, many at once: every frame either side sends stays
under MAX_FRAME_SIZE, and what the broker reads back from storage for them is held a
bounded page at a time (a page of 2,000 such messages was 2 GiB)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from minou.limits import MAX_FRAME_SIZE, STORAGE_READ_BYTES

MB = 1_000_000


def _rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


def _bodies(n: int) -> list[bytes]:
    return [i.to_bytes(4, "big") + os.urandom(MB - 4) for i in range(n)]


def test_a_burst_of_large_sends_is_split_into_frames_the_broker_takes(broker):
    """40 x 1 MB sent at once: one frame would be 40 MB (the broker drops a connection
    sending a frame over 16 MiB); the client splits them, all are confirmed in order."""
    bodies = _bodies(40)

    async def run() -> None:
        async with await broker.connect("burst") as c:
            receipts = await asyncio.gather(*(c.send("large/v1/1", b) for b in bodies))
            assert [r.seq for r in receipts] == list(range(1, 41))
            staged = await c.stage("big-txn", [("large/v1/2", b) for b in bodies[:20]])
            assert staged == 20  # staging splits the same way

    asyncio.run(asyncio.wait_for(run(), 60))


def test_a_read_of_large_messages_answers_pages_that_fit_one_frame(broker):
    """READ of 40 x 1 MB asked at once: a page holds at most STORAGE_READ_BYTES of
    payloads, its next_seq says where the next starts, and paging gets every one --
    from the body cache and from storage alike."""
    bodies = _bodies(40)
    per_page = -(-STORAGE_READ_BYTES // MB)
    assert per_page * MB < MAX_FRAME_SIZE

    async def run() -> None:
        async with await broker.connect("reader") as c:
            for i in range(0, 40, 8):
                await asyncio.gather(*(c.send("large/v1/r", b) for b in bodies[i:i + 8]))
            # Push them out of the body cache (48 MiB): the later reads come from storage.
            filler = os.urandom(MB)
            for _ in range(8):
                await asyncio.gather(*(c.send("large/v1/filler", filler) for _ in range(8)))
            for _ in range(2):  # from storage, then again (nothing cached by reading)
                page, nxt = await c.read("large/v1/r", 1, limit=40)
                assert [m.seq for m in page] == list(range(1, per_page + 1))
                assert nxt == per_page + 1
                seen, seq = [], 1
                while seq <= 40:
                    page, seq = await c.read("large/v1/r", seq, limit=40)
                    assert page and len(page) <= per_page
                    seen += [m.payload for m in page]
                assert seen == bodies
            # The newest, still in the body cache, are paged the same way.
            page, nxt = await c.read("large/v1/filler", 1, limit=64)
            assert len(page) == per_page and nxt == per_page + 1

    asyncio.run(asyncio.wait_for(run(), 120))


def test_a_backlog_of_large_messages_is_read_back_a_bounded_page_at_a_time(broker):
    """600 MB stored, far past the body cache, then consumed: the broker reads it back
    STORAGE_READ_BYTES at a time. Before, a page was 2,000 messages: its RSS rose by
    the whole backlog (+403 MiB here), and by 2 GiB for a longer one."""
    n = 600
    body = os.urandom(MB)

    async def run() -> None:
        async with await broker.connect("backlog") as c:
            for _ in range(n // 8):
                await asyncio.gather(*(c.send("large/v1/backlog", body) for _ in range(8)))
            baseline = _rss_mib(broker.proc.pid)
            peak = [baseline]
            stop = threading.Event()

            def watch() -> None:
                while not stop.is_set():
                    peak[0] = max(peak[0], _rss_mib(broker.proc.pid))
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                sub = await c.consume("large/v1/backlog", group="g", prefetch=4)
                for i in range(n):
                    m = await sub.get(30)
                    assert m.seq == i + 1 and m.payload == body
                    m.ack()
            finally:
                stop.set()
                watcher.join()
            assert peak[0] - baseline < 250, (baseline, peak[0])

    asyncio.run(asyncio.wait_for(run(), 180))
