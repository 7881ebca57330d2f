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
