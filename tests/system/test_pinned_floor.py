"""A delayed retry pins a consumer group's floor: the acks after it are stored as ranges
(core/group.py, core/seq_runs.py), and a kill -9 and a restart lose none of them and
keep the delayed one for its time. A real broker, a real client, its SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from ..conftest import TEST_STORAGE

pytestmark = pytest.mark.timeout(120)

CH = "pin/v1/1"
N = 10_000
DELAY = 12.0  # long enough for the acks, a kill and a restart


def _group_state(broker) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
    """(floor, bytes) of the group's stored state; None on a storage other than SQLite."""
    if TEST_STORAGE:
        return None
    db = sqlite3.connect(f"file:{broker.data_dir / 'minou.db'}?mode=ro", uri=True)
    try:
        (row,) = db.execute("SELECT floor, length(state) FROM group_states WHERE channel = ?",
                            (CH,)).fetchall()
    finally:
        db.close()
    return row


def test_acks_after_a_delayed_retry_survive_a_kill_and_stay_small(broker) -> None:
    async def before_kill() -> int:
        c = await broker.connect("pinner")
        for start in range(0, N, 2_000):
            await c.send_many([(CH, i) for i in range(start, start + 2_000)])
        sub = await c.consume(CH, group="g", prefetch=1_000)
        first = await sub.get(10)
        assert await first.nack(delay=DELAY)
        last = None
        for i in range(N - 1):
            msg = await sub.get(10)
            assert msg.seq != first.seq  # not back before its time
            last = msg.ack()
            if i % 500 == 499:
                assert await last
        assert last is not None and await last
        await c.close()
        return first.seq

    first = asyncio.run(asyncio.wait_for(before_kill(), 60))
    state = _group_state(broker)
    if state is not None:
        floor, size = state
        assert floor == first
        # As a list of seqs (before runs) 9,999 acks took ~30 KB, rewritten at each commit
        assert size < 8_000, size

    broker.kill()
    broker.start()

    async def after_restart() -> list[tuple[int, int]]:
        c = await broker.connect("pinner")
        sub = await c.consume(CH, group="g", prefetch=1_000)
        got = []
        msg = await sub.get(DELAY + 30)
        got.append((msg.seq, msg.attempts))
        assert await msg.ack()
        try:  # nothing else: every other message was acked before the kill
            extra = await sub.get(1.0)
            got.append((extra.seq, extra.attempts))
        except TimeoutError:
            pass
        await c.close()
        return got

    got = asyncio.run(asyncio.wait_for(after_restart(), DELAY + 60))
    assert got == [(first, 2)]
    state = _group_state(broker)
    if state is not None:
        assert state[0] == N + 1  # everything settled: nothing held above the floor
        assert state[1] < 16
