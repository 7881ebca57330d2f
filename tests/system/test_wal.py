"""The WAL stays near its checkpoint threshold under a steady consume+ack load (a real
broker process; the threshold is set low so a short run crosses it many times)."""

from __future__ import annotations

import threading
import time

import pytest

from minou.errors import Timeout

pytestmark = pytest.mark.sqlite_only

THRESHOLD = 8 << 20
# The load runs until the WAL was started over this many times (each a checkpoint past
# half the threshold, taken in by the next commit) and this many messages were acked:
# work done, counted, not a time (the 10 s this ran for did more than 2,000 acks on an
# idle machine; at a load average of 10, 2,000 took 14-20 s). The deadline is only for
# a broker that stopped.
RESTARTS = 4
ACKS = 2000
DEADLINE_S = 240.0


def wal_restarts(wal) -> int | None:
    """The WAL header's checkpoint sequence number: SQLite counts in it each time the WAL
    is started over from its beginning (None: no WAL yet, or its header not written)."""
    try:
        with open(wal, "rb") as file:
            header = file.read(16)
    except FileNotFoundError:
        return None
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else None


def test_the_wal_stays_within_one_and_a_half_thresholds(broker_factory, tmp_path):
    cfg = tmp_path / "wal.toml"
    cfg.write_text(f"[storage]\nwal_checkpoint = {THRESHOLD}\n")
    b = broker_factory.make(config=cfg).start()
    wal = b.data_dir / "minou.db-wal"
    samples: list[int] = []
    restarts: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(wal.stat().st_size if wal.exists() else 0)
            seen = wal_restarts(wal)
            if seen is not None:
                restarts.append(seen)
            time.sleep(0.05)

    def started_over() -> int:
        return restarts[-1] - restarts[0] if restarts else 0

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    acked = 0
    with b.connect_sync("wal-p") as p, b.connect_sync("wal-c") as c:
        sub = c.consume("wal/v1/*", group="g", prefetch=1000)
        deadline = time.monotonic() + DEADLINE_S
        i = 0
        while started_over() < RESTARTS or acked < ACKS:
            assert time.monotonic() < deadline, \
                f"in {DEADLINE_S:g} s: {acked} acked, the WAL started over {started_over()} times"
            assert max(samples, default=0) <= 1.5 * THRESHOLD, \
                f"WAL reached {max(samples) / (1 << 20):.1f} MiB (no checkpoint held it)"
            p.send_many([(f"wal/v1/{(i + k) % 16}", "x" * 98) for k in range(200)])
            i += 200
            while True:
                try:
                    msg = sub.get(timeout=0.001)
                except Timeout:
                    break
                msg.ack()
                acked += 1
    stop.set()
    sampler.join(2)
    print(f"{acked} acked, the WAL started over {started_over()} times")
    # the load ran (messages stored, delivered, acked) and crossed the threshold's
    # checkpoint point RESTARTS times: the loop's condition
    assert max(samples) <= 1.5 * THRESHOLD, f"WAL reached {max(samples) / (1 << 20):.1f} MiB"


def test_a_failing_checkpoint_is_one_log_line_not_a_traceback_a_tick(tmp_path, caplog):
    """Out of descriptors (say), the checkpoint thread cannot open the database: the
    next tick tries again, and the log says so in a line, rate-limited, instead of an
    asyncio "exception was never retrieved" traceback for every tick."""
    import asyncio
    import logging

    from minou.config import Settings
    from minou.errors import StorageUnavailable
    from minou.server.app import BrokerServer

    async def scenario() -> None:
        server = BrokerServer(Settings(data_dir=str(tmp_path / "d"), port=0, http_port=None,
                                       auth_mode="off"))
        await server.start()
        try:
            def broken(truncate: bool = False, *, restart: bool = False) -> None:
                raise StorageUnavailable("cannot open minou.db: unable to open database file")

            server.storage.checkpoint = broken  # type: ignore[method-assign]
            server.storage.wal_bytes = lambda: 1 << 20  # type: ignore[method-assign]
            for tick in range(3):
                server._maybe_checkpoint(time.time() + 10 + tick)  # idle: it checkpoints
                await asyncio.sleep(0.05)
        finally:
            await server.stop()

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    failed = [r for r in caplog.records if "WAL checkpoint failed" in r.getMessage()]
    assert len(failed) == 3 and "unable to open database file" in failed[0].getMessage()
    assert not any("never retrieved" in r.getMessage() for r in caplog.records)


def test_an_idle_broker_folds_the_kept_wal_in_once_per_idle_spell(tmp_path):
    """The WAL written out ahead is kept while idle (the disk has room): the first idle
    tick folds it in, the next ones have nothing to do until a commit comes again."""
    import asyncio

    from minou.config import Settings
    from minou.server.app import BrokerServer

    calls: list[bool] = []

    async def scenario() -> None:
        server = BrokerServer(Settings(data_dir=str(tmp_path / "d"), port=0, http_port=None,
                                       auth_mode="off"))
        await server.start()
        try:
            assert server.storage.keeps_wal() and server.storage.wal_bytes() > 0
            assert server.status()["storage"]["wal_bytes"] == server.storage.wal_bytes()
            while server.engine.committing:  # what the start stored
                await asyncio.sleep(0.01)
            checkpoint = server.storage.checkpoint

            def counted(truncate: bool = False, *, restart: bool = False) -> None:
                calls.append(truncate)
                checkpoint(truncate, restart=restart)

            server.storage.checkpoint = counted  # type: ignore[method-assign]

            async def tick(at: float) -> None:
                server._maybe_checkpoint(at)
                if server._checkpoint is not None:
                    await server._checkpoint  # its done callback runs on the next turn
                    await asyncio.sleep(0)

            for n in range(3):
                await tick(time.time() + 10 + n)
            assert calls == [True]
            server._last_commit_at = time.time()  # a commit: the next idle spell folds again
            await tick(time.time() + 10)
            assert calls == [True, True]
            assert server.storage.wal_bytes() > 0  # kept
        finally:
            await server.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("durability", ["fsync", "interval"])
def test_a_stopped_broker_leaves_no_wal_behind(broker_factory, tmp_path, durability):
    """A stop closes every connection the broker opened, the event loop's own (small
    commits are made there) first: the last close folds the WAL into the
    database and removes it, and what the loop committed is there after a restart."""
    cfg = tmp_path / "stop.toml"
    cfg.write_text(f'[channels."stop/v1"]\ndurability = "{durability}"\n')
    b = broker_factory.make(config=cfg).start()
    with b.connect_sync("stop-p") as p:
        for i in range(20):
            p.send("stop/v1/1", {"i": i})
    with _admin(b) as admin:
        on_loop = admin.admin("status")["storage"]["commits_on_loop"]
    assert on_loop > 0
    assert (b.data_dir / "minou.db-wal").exists()
    assert b.stop() == 0, b.output
    assert not (b.data_dir / "minou.db-wal").exists()
    with b.start().connect_sync("stop-c") as c:
        sub = c.consume("stop/v1/*", group="g", prefetch=100)
        assert sorted(sub.get(timeout=10).payload["i"] for _ in range(20)) == list(range(20))


def _admin(b):
    import minou

    return minou.connect_sync(b.url, **b.admin_auth())
