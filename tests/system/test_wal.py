"""The WAL stays near its checkpoint threshold under a steady consume+ack load (a real
broker process; the threshold is set low so a short run crosses it many times)."""

from __future__ import annotations

import threading
import time

import pytest

from minou.errors import Timeout

pytestmark = pytest.mark.sqlite_only

THRESHOLD = 8 << 20


def test_the_wal_stays_within_one_and_a_half_thresholds(broker_factory, tmp_path):
    cfg = tmp_path / "wal.toml"
    cfg.write_text(f"[storage]\nwal_checkpoint = {THRESHOLD}\n")
    b = broker_factory.make(config=cfg).start()
    wal = b.data_dir / "minou.db-wal"
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(wal.stat().st_size if wal.exists() else 0)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    acked = 0
    with b.connect_sync("wal-p") as p, b.connect_sync("wal-c") as c:
        sub = c.consume("wal/v1/*", group="g", prefetch=1000)
        deadline = time.monotonic() + 10
        i = 0
        while time.monotonic() < deadline:
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
    assert acked > 2000  # the load ran: messages were stored, delivered and acked
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
            def broken(truncate: bool = False) -> None:
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
