"""Small commits made on the event loop (``BrokerServer._write_here``: SQLite's writes to
the OS; an fsync channel's fdatasync still on the writer thread), on a real SQLite
store: which commits go there, and the way back to the writer thread when they get
slow (a slow disk or page cache must not hold every connection)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from minou.config import load_settings
from minou.core.writes import WriteBatch
from minou.limits import COMMIT_HERE_MAX_MESSAGES, COMMIT_HERE_SLOW_S, COMMIT_HERE_STALL_S
from minou.protocol import frames as f
from minou.server import app as app_module
from minou.server.app import BrokerServer
from minou.storage.sqlite import SQLiteStorage

from .conftest import Harness

pytestmark = pytest.mark.anyio

FAST, SAFE = "fast/v1/1", "safe/v1/1"


class DiskClock:
    """The clock the broker times its commits on (``time.perf_counter`` in the server
    module): it moves only by the delays the storage below adds, so that a commit the
    test means to be fast is never measured slow because a loaded machine took the
    loop's CPU (that made the counts flaky in a full ``make test``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


class SlowableStorage(SQLiteStorage):
    """SQLite whose next commits made with ``apply_now`` take ``delay`` seconds longer
    on the broker's commit clock: a disk or page cache that makes the loop wait. The
    threads that made each commit are kept."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.delays: list[float] = []
        self.threads: list[str] = []
        self.clock = DiskClock()

    def apply(self, batch: WriteBatch) -> None:
        self.threads.append(threading.current_thread().name)
        super().apply(batch)

    def apply_now(self, batch: WriteBatch) -> bool:
        self.threads.append(threading.current_thread().name)
        if self.delays:
            self.clock.now += self.delays.pop(0)
        return super().apply_now(batch)


@pytest.fixture
async def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    cfg = tmp_path / "minou.toml"
    cfg.write_text('[channels."fast/v1"]\ndurability = "interval"\n')
    settings = load_settings(cfg, host="127.0.0.1", port=0, http_port=None, auth_mode="off",
                             data_dir=str(tmp_path / "data"))
    storage = SlowableStorage(tmp_path / "data")
    monkeypatch.setattr(app_module, "time", storage.clock)
    server = BrokerServer(settings, storage=storage)
    await server.open()
    yield Harness(server, storage)  # type: ignore[arg-type]
    await server.stop()


async def publisher(broker: Harness) -> object:
    """A connected publisher whose first commit (it also stores the client's
    registration: fsync'd, by the writer) is behind it; the counters start from it."""
    peer = await broker.connect("publisher")
    await publish(peer, 100, SAFE)
    server = broker.server
    server.commits = server.commits_here = server.commits_here_slow = 0
    broker.storage.threads.clear()  # type: ignore[attr-defined]
    return peer


async def publish(peer: object, req: int, channel: str, n: int = 1) -> None:
    peer.send(f.Publish(req, [f.Send(channel, json.dumps(i).encode())  # type: ignore[attr-defined]
                              for i in range(n)]))
    confirm = await peer.expect(f.Confirm)  # type: ignore[attr-defined]
    assert confirm.req == req and all(o.code == 0 for o in confirm.outcomes)


async def test_small_interval_commits_are_made_on_the_loop_and_the_rest_by_the_writer(
        broker: Harness) -> None:
    peer = await publisher(broker)
    storage: SlowableStorage = broker.storage  # type: ignore[assignment]
    loop_thread = threading.current_thread().name
    await publish(peer, 1, FAST)
    await publish(peer, 2, SAFE)  # fsync: written here, confirmed after the fdatasync
    assert not storage.unsynced()  # the WAL was on the disk before the confirm
    await publish(peer, 3, FAST, COMMIT_HERE_MAX_MESSAGES + 1)  # too big for the loop
    await publish(peer, 4, SAFE, COMMIT_HERE_MAX_MESSAGES + 1)
    await publish(peer, 5, FAST, COMMIT_HERE_MAX_MESSAGES)
    assert [t == loop_thread for t in storage.threads] == [True, True, False, False, True]
    assert broker.server.commits_here == 3
    status = broker.server._sync_status()
    assert (status["commits_on_loop"], status["commits_on_loop_slow"]) == (3, 0)


async def test_a_few_slow_commits_close_together_send_them_to_the_writer_for_a_while(
        broker: Harness, caplog: pytest.LogCaptureFixture) -> None:
    peer = await publisher(broker)
    storage: SlowableStorage = broker.storage  # type: ignore[assignment]
    server: BrokerServer = broker.server
    slow = COMMIT_HERE_SLOW_S + 0.002
    storage.delays = [slow, slow]
    await publish(peer, 1, FAST)
    await publish(peer, 2, FAST)
    await publish(peer, 3, FAST)
    # Two slow ones: the loop losing its CPU now and then looks the same; still here.
    assert (server.commits_here, server.commits_here_slow) == (3, 2)
    storage.delays = [slow]
    with caplog.at_level(logging.INFO, logger="minou.server"):
        await publish(peer, 4, FAST)  # the third within the window: off the loop
        await publish(peer, 5, FAST)
        await publish(peer, 6, FAST)
    assert (server.commits_here, server.commits_here_slow) == (4, 3)
    assert server.commits == 6  # the last two by the writer thread
    assert any("the writer thread makes them for the next" in r.getMessage()
               for r in caplog.records)


async def test_one_commit_that_stalled_the_loop_sends_them_to_the_writer_at_once(
        broker: Harness) -> None:
    peer = await publisher(broker)
    storage: SlowableStorage = broker.storage  # type: ignore[assignment]
    server: BrokerServer = broker.server
    storage.delays = [COMMIT_HERE_STALL_S + 0.01]
    await publish(peer, 1, FAST)
    await publish(peer, 2, FAST)
    assert (server.commits_here, server.commits_here_slow, server.commits) == (1, 1, 2)


@pytest.mark.parametrize("channel", [FAST, SAFE])
async def test_a_commit_that_would_wait_for_a_checkpoint_goes_to_the_writer_instead(
        broker: Harness, channel: str) -> None:
    """While a checkpoint shuts writers out (it holds the writers' gate), the loop does
    not wait for it: the batch goes to the writer thread, which waits, and is confirmed
    once the checkpoint lets it in."""
    import asyncio

    peer = await publisher(broker)
    storage: SlowableStorage = broker.storage  # type: ignore[assignment]
    loop_thread = threading.current_thread().name
    storage._writers_gate.acquire()  # as a RESTART checkpoint does
    try:
        peer.send(f.Publish(1, [f.Send(channel, b"1")]))  # type: ignore[attr-defined]
        for _ in range(100):
            if len(storage.threads) == 2:
                break
            await asyncio.sleep(0.01)
        assert [t == loop_thread for t in storage.threads] == [True, False]
        await asyncio.sleep(0.05)
        assert peer.frames() == []  # type: ignore[attr-defined]  # held by the checkpoint
    finally:
        storage._writers_gate.release()
    confirm = await peer.expect(f.Confirm)  # type: ignore[attr-defined]
    assert confirm.req == 1 and confirm.outcomes[0].code == 0
    assert broker.server.commits_here == 0
