"""Long polls (KV watches, ``channels.wait``) against a real broker: many polls of
many patterns cost a commit what it wrote, not every pattern of every poll."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import minou


def run(coro: Any, timeout: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_many_polls_of_many_patterns_do_not_stall_a_commit(broker) -> None:
    """1,000 channels.wait of 256 patterns each (an admin's: not bounded per client),
    none of which a publish to 500 channels matches: each poll's patterns were tried
    against each channel (128 million tries: 15 s before another client's PING was
    answered); now the commit looks up each channel's few keys."""
    patterns = json.dumps([f"idle{j}/v1/*" if j % 2 else f"idle{j}/*" for j in range(256)])

    async def scenario() -> None:
        waiter = await minou.connect(broker.url, **broker.admin_auth())
        other = await broker.connect("pinger")
        try:
            polls = [asyncio.create_task(waiter.admin("channels.wait", patterns=patterns,
                                                      after="{}", wait=25))
                     for _ in range(1_000)]
            await asyncio.sleep(0)
            await waiter.ping()  # answered after the 1,000 polls were taken: all wait
            assert not any(p.done() for p in polls)
            t0 = time.monotonic()
            await other.send_many([(f"busy/v1/{n}", n) for n in range(500)])
            await other.ping()
            took = time.monotonic() - t0
            assert took < 5, f"a publish to 500 channels and a PING took {took:.1f} s"
            assert not any(p.done() for p in polls)  # none matched: none was woken
            await other.send("idle7/v1/x", 1)  # matches them all
            answers = await asyncio.wait_for(asyncio.gather(*polls), 20)
            assert all(a["ready"] for a in answers)
        finally:
            await waiter.close()
            await other.close()

    run(scenario())
