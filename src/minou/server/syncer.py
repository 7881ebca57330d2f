"""Interval durability's second half: the fsync that follows "interval" commits.

A batch whose channels all have durability "interval" is committed to the OS only
(``WriteBatch.sync_within``) and answered at once; this makes it durable on the disk
within ``sync_within`` seconds, with every such commit before it in one fdatasync,
on a thread of its own so that the writer never waits for it. A sync that fails
(EIO: the kernel may have dropped the pages) is a storage failure: retrying the
fsync would report success for data that is gone, so the broker stops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ..storage.base import Syncing

log = logging.getLogger("minou.storage")


class IntervalSync:
    def __init__(self, storage: Syncing, loop: asyncio.AbstractEventLoop,
                 on_failure: Callable[[BaseException], None]) -> None:
        self.storage = storage
        self.loop = loop
        self.on_failure = on_failure
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="minou-sync")
        self._due: float | None = None  # monotonic deadline of the sync armed, if any
        self._handle: asyncio.TimerHandle | None = None
        self._running: asyncio.Future[None] | None = None
        self._closed = False
        self.syncs = 0
        self.sync_seconds = 0.0
        self.late = 0  # syncs that began after their deadline (a busy disk or loop)

    def committed(self, within: float) -> None:
        """An "interval" commit returned: it must be on the disk within ``within`` s."""
        if self._closed:
            return
        due = time.monotonic() + within
        if self._running is not None:  # the running sync may have started before it
            self._due = due if self._due is None else min(self._due, due)
            return
        if self._handle is not None and self._due is not None and self._due <= due:
            return  # a sync is armed sooner: it takes this commit along
        if self._handle is not None:
            self._handle.cancel()
        self._due = due
        self._handle = self.loop.call_at(self.loop.time() + within, self._start)

    def _start(self) -> None:
        self._handle = None
        if self._closed:
            return
        due, self._due = self._due, None
        if due is not None and time.monotonic() > due + 0.005:
            self.late += 1
        started = time.perf_counter()
        self._running = self.loop.run_in_executor(self._pool, self.storage.sync)
        self._running.add_done_callback(lambda fut: self._done(fut, started))

    def _done(self, fut: asyncio.Future[None], started: float) -> None:
        self._running = None
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            log.error("fsync of the interval commits failed: %s", exc)
            self._closed = True
            self.on_failure(exc)
            return
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - started
        if self._due is not None:  # commits came while it ran: their own deadline
            due, self._due = self._due, None
            self.committed(max(0.0, due - time.monotonic()))

    async def close(self) -> None:
        """The last sync (the broker stops): everything committed is on the disk after."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._running is not None:
            await asyncio.wait([self._running])
        try:
            if self.storage.unsynced():
                await self.loop.run_in_executor(self._pool, self.storage.sync)
        finally:
            self._pool.shutdown()

    def abandon(self) -> None:
        """The broker stops without waiting (a commit stuck): drop what is armed."""
        self._closed = True
        if self._handle is not None:
            self._handle.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
