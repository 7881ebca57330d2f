"""Messages near the 1 MiB limit, many at once: every frame either side sends stays
under MAX_FRAME_SIZE, and what the broker reads back from storage for them is held a
bounded page at a time (a page of 2,000 such messages was 2 GiB)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import minou
from minou.core.log import READ_WEIGHT_BASE, Msg, read_weight
from minou.limits import IN_FLIGHT_PER_SUBSCRIPTION, MAX_FRAME_SIZE, STORAGE_READ_BYTES

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


def test_many_large_dead_letters_are_all_requeued(broker_factory, tmp_path):
    """12 dead letters of 1 MB (more than one 8 MiB page): ``dead.requeue`` reads them a
    page at a time and moves every one back."""
    cfg = tmp_path / "dead.toml"
    cfg.write_text('[channels."large/v1"]\nrequeue_limit = 0\n')
    broker = broker_factory.make(config=cfg).start()
    bodies = _bodies(12)

    async def run() -> None:
        async with await broker.connect("deadly") as c:
            await asyncio.gather(*(c.send("large/v1/d", b) for b in bodies))
            sub = await c.consume("large/v1/d", group="g", prefetch=12)
            for _ in range(12):
                m = await sub.get(30)
                m.nack()  # requeue_limit 0: a dead letter at once
            await sub.close()
        async with await minou.connect(broker.url, **broker.admin_auth()) as admin:
            for _ in range(100):
                listing = await admin.admin("list", channel="_dead/large/v1/d")
                if listing["channels"] and listing["channels"][0]["depth"] == 12:
                    break
                await asyncio.sleep(0.1)
            out = await admin.admin("dead.requeue", queue="large/v1", channel="d")
            assert out["messages"] == 12 and out["more"] is False, out
            # Answered once the moves are durable (it was answered before their commit
            # when the writer was idle): a listing right after shows them.
            listing = await admin.admin("list", channel="large/v1/d")
        assert listing["channels"][0]["next_seq"] == 25, listing
        async with await broker.connect("deadly") as c:
            sub = await c.consume("large/v1/d", group="g2", start="oldest", prefetch=4)
            again = []
            for _ in range(12):
                m = await sub.get(30)
                again.append(m.payload)
                m.ack()
            assert sorted(again) == sorted(bodies)

    asyncio.run(asyncio.wait_for(run(), 120))


def test_a_read_of_messages_heavy_with_headers_fits_one_frame(broker):
    """2,200 messages of one payload byte and 8 KiB of headers: 18 MB in all, and READ
    asks for all of them at once. The page stops by what they weigh with their headers
    (it stopped by payload bytes alone before, and the answer was over 16 MiB)."""
    headers = {f"h{i:02d}": "v" * 250 for i in range(32)}

    async def run() -> None:
        async with await broker.connect("headers") as c:
            for i in range(0, 2200, 200):
                await asyncio.gather(*(c.send("large/v1/h", i + k, headers=headers)
                                       for k in range(200)))
            seen, seq = [], 1
            while seq <= 2200:
                page, seq = await c.read("large/v1/h", seq, limit=10_000)
                assert page and len(page) < 2200
                seen += [m.payload for m in page]
            assert seen == list(range(2200))

    asyncio.run(asyncio.wait_for(run(), 120))


async def _take_all(sub, quiet: float = 2.0) -> list:
    """Every delivery that comes until none has for ``quiet`` seconds (none is acked)."""
    got = []
    while True:
        try:
            got.append(await sub.get(quiet))
        except minou.Timeout:
            return got


def test_a_consumer_that_never_acks_large_messages_holds_a_bounded_amount(broker):
    """A consumer with prefetch 120 takes 1 MB messages and acks none: the broker stops
    at 64 MiB of unsettled messages for it (IN_FLIGHT_PER_SUBSCRIPTION; it handed out
    all 120, 120 MB kept in memory, and prefetch goes up to 100,000), and each ack lets
    one more come. A reader of another group is not held back by it."""
    n = 120
    body = os.urandom(MB)
    weight = MB + READ_WEIGHT_BASE
    bound = -(-IN_FLIGHT_PER_SUBSCRIPTION // weight)  # the delivery that reaches it goes

    async def run() -> None:
        async with await broker.connect("heavy") as c:
            for _ in range(n // 8):
                await asyncio.gather(*(c.send("large/v1/held", body) for _ in range(8)))
            sub = await c.consume("large/v1/held", group="g", prefetch=n)
            held = await _take_all(sub)
            assert len(held) == bound, (len(held), bound)
            async with await minou.connect(broker.url, **broker.admin_auth()) as admin:
                flow = (await admin.admin("status"))["flow"]
            assert flow["in_flight_bytes"] == bound * weight, flow
            for m in held[:10]:
                m.ack()
            more = await _take_all(sub)
            assert [m.seq for m in more] == list(range(bound + 1, bound + 11))
            async with await broker.connect("other") as o:
                other = await o.consume("large/v1/held", group="g2", prefetch=4)
                m = await other.get(10)  # the oldest kept (g acked 1..10, the only group)
                assert m.seq == 11 and m.payload == body

    asyncio.run(asyncio.wait_for(run(), 120))


def test_past_in_flight_bytes_a_heavy_reader_waits_and_a_light_one_goes_on(
        broker_factory, tmp_path):
    """in_flight_bytes = 4 MB: a reader that holds 8 of 500 KB messages reaches it and
    gets no more; a reader of another group gets messages up to its 1 MiB share, then
    waits too; once the heavy one acks, the light one gets more without acking."""
    cfg = tmp_path / "in_flight.toml"
    cfg.write_text("in_flight_bytes = 4000000\n")
    broker = broker_factory.make(config=cfg).start()
    body = os.urandom(500_000)

    async def run() -> None:
        async with await broker.connect("heavy") as h, await broker.connect("light") as li:
            await asyncio.gather(*(h.send("large/v1/pool", body) for _ in range(30)))
            heavy = await h.consume("large/v1/pool", group="ga", prefetch=30)
            taken = await _take_all(heavy)
            assert len(taken) == 8  # 8 x 500,512 bytes reach 4,000,000
            light = await li.consume("large/v1/pool", group="gb", prefetch=30)
            first = await _take_all(light)
            assert [m.seq for m in first] == [1, 2, 3]  # its share (1 MiB) reached
            for m in taken:
                m.ack()
            later = await _take_all(light)
            assert later and later[0].seq == 4, [m.seq for m in later]

    asyncio.run(asyncio.wait_for(run(), 120))


def test_a_consumer_that_never_acks_header_heavy_messages_holds_in_flight_bytes_of_memory(
        broker_factory, tmp_path):
    """Messages of 4 bytes with 64 headers and a key, ~10 KB each in memory by Msg.size,
    were weighed 1.5 KB (payload and the headers' text): in_flight_bytes = 16 MB let a
    consumer that never acks hold 10,841 of them. It gets what fills the bound by memory
    weight and no more, the broker's RSS grows within it, and the rest wait: once it
    acks they come, all of them."""
    limit, n = 16_000_000, 12_000
    cfg = tmp_path / "in_flight.toml"
    cfg.write_text(f"in_flight_bytes = {limit}\n")
    broker = broker_factory.make(config=cfg).start()

    def message(i: int) -> tuple[bytes, dict[str, str], str]:
        tail = f"{i:04x}"[-4:]  # distinct text per message, as real headers are
        return i.to_bytes(4, "big"), {f"h{j:02d}": tail for j in range(64)}, f"k{i:07d}"

    data, headers, key = message(0)
    weight = max(read_weight(Msg("", 0, "", data, headers=headers)),
                 Msg("", 0, "", data, headers=headers, key=key).size())
    bound = -(-limit // weight)  # the delivery that reaches it goes

    async def run() -> None:
        async with await broker.connect("heavy") as c:
            for i in range(0, n, 500):
                await asyncio.gather(*(c.send("large/v1/hh", d, headers=h, key=k)
                                       for d, h, k in map(message, range(i, i + 500))))
            before = _rss_mib(broker.proc.pid)
            sub = await c.consume("large/v1/hh", group="g", prefetch=n)
            held = await _take_all(sub)
            grown = _rss_mib(broker.proc.pid) - before
            # What they hold (Msg.size over-counts these), one page read back from
            # storage, and the delivery frames: 5-12 MiB here; weighed by read_weight,
            # 45-50 MiB.
            assert grown <= 2 * (limit >> 20), (grown, len(held))
            assert len(held) == bound, (len(held), bound)
            async with await minou.connect(broker.url, **broker.admin_auth()) as admin:
                flow = (await admin.admin("status"))["flow"]
            assert flow["in_flight_bytes"] == bound * weight, flow
            seen = set()
            for m in held:
                seen.add(m.seq)
                m.ack()
            while len(seen) < n:
                m = await sub.get(30)
                seen.add(m.seq)
                m.ack()
            assert seen == set(range(1, n + 1))

    asyncio.run(asyncio.wait_for(run(), 300))
