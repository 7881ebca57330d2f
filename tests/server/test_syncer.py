"""The fsync that follows "interval" commits (server/syncer.py), on a real SQLite store."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from minou.server.syncer import IntervalSync
from minou.storage.sqlite import SQLiteStorage

from ..storage.test_contract import batch_of, msg


def _store(tmp_path: Path) -> SQLiteStorage:
    store = SQLiteStorage(tmp_path)
    store.open(0.0)
    return store


async def _seconds_until_synced(store: SQLiteStorage, since: float) -> float:
    while store.unsynced():
        await asyncio.sleep(0.002)
    return time.monotonic() - since


def test_an_interval_commit_is_synced_within_its_interval_with_those_after_it(
        tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def run() -> tuple[float, int]:
        failures: list[BaseException] = []
        sync = IntervalSync(store, asyncio.get_running_loop(), failures.append)
        store.apply(batch_of(msg("m/v1/a", 1), sync_within=0.05))
        t0 = time.monotonic()
        sync.committed(0.05)
        store.apply(batch_of(msg("m/v1/a", 2), sync_within=0.05))
        sync.committed(0.05)  # armed already, sooner: it goes with the first
        assert store.unsynced()
        took = await _seconds_until_synced(store, t0)
        await asyncio.sleep(0.1)
        await sync.close()
        assert not failures
        return took, sync.syncs

    took, syncs = asyncio.run(run())
    assert 0.04 <= took < 1.0, took
    assert syncs == 1  # one fdatasync for both commits
    store.close()


def test_a_shorter_interval_brings_the_armed_sync_forward(tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def run() -> float:
        sync = IntervalSync(store, asyncio.get_running_loop(), lambda exc: None)
        store.apply(batch_of(msg("slow/v1/a", 1), sync_within=5.0))
        t0 = time.monotonic()
        sync.committed(5.0)
        store.apply(batch_of(msg("fast/v1/a", 1), sync_within=0.02))
        sync.committed(0.02)
        took = await _seconds_until_synced(store, t0)
        await sync.close()
        return took

    assert asyncio.run(run()) < 1.0
    store.close()


def test_closing_syncs_what_is_left_at_once(tmp_path: Path) -> None:
    store = _store(tmp_path)

    async def run() -> int:
        sync = IntervalSync(store, asyncio.get_running_loop(), lambda exc: None)
        store.apply(batch_of(msg("m/v1/a", 1), sync_within=10.0))
        sync.committed(10.0)
        await asyncio.wait_for(sync.close(), 2)  # not 10 s
        sync.committed(0.01)  # after close: nothing armed, no error
        return sync.syncs

    assert asyncio.run(run()) == 0  # the last sync is close's own, not a timed one
    assert not store.unsynced()
    store.close()


def test_a_failed_fsync_is_reported_once_and_stops_syncing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.apply(batch_of(msg("m/v1/a", 1), sync_within=0.01))
    store._wal_fd = 987654  # a descriptor that is not open: fdatasync fails (EBADF)

    async def run() -> list[BaseException]:
        failures: list[BaseException] = []
        sync = IntervalSync(store, asyncio.get_running_loop(), failures.append)
        sync.committed(0.01)
        await asyncio.sleep(0.2)
        sync.committed(0.01)  # closed by the failure: not armed again
        await asyncio.sleep(0.05)
        sync.abandon()
        return failures

    failures = asyncio.run(run())
    assert len(failures) == 1 and isinstance(failures[0], OSError), failures
    assert store.unsynced()
    store._wal_fd = None
    store.close()
