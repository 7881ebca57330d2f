"""What a restarted broker holds while it reads its state back, against what it held
running: a broker that ran for weeks within its bounds must start again within them.
Each test fills a real broker's storage to a running bound and reads the peak memory
(VmHWM) of the broker restarted on it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from minou.core.writes import WriteBatch
from minou.storage.sqlite import SQLiteStorage

from ..conftest import TEST_STORAGE

pytestmark = pytest.mark.skipif(TEST_STORAGE == "redis", reason="reads SQLite's tables")


def peak_rss_mib(pid: int) -> int:
    """The most memory the process has held (VmHWM): what a start reads and frees
    before it serves counts too."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def dedup_key(i: int) -> str:
    return f"order-{i:08d}-2f6e1c9a-4b7d-8e3f-a1c5"  # 36 characters, as a UUID


def dedup_id(channel: int, seq: int) -> str:
    return f"{0x5A17C0DE00000000 + channel:016x}{seq:x}"  # as Broker.new_id makes them


def test_a_restart_reads_the_dedup_window_in_columns(broker_factory):
    """400,000 keys of an hour's dedup window (MAX_DEDUP_KEYS is 2,000,000): running,
    the window holds ~36 B a key; read back as a tuple of strings per key, a start held
    ~450 B a key (+178 MiB here, ~1.1 GB at the bound) before it served; in columns
    +70 MiB here (the rows, their order by expiry, the window they are built into)."""
    broker = broker_factory.make().start()
    fresh = peak_rss_mib(broker.proc.pid)
    broker.stop()
    n, now = 400_000, time.time()
    storage = SQLiteStorage(broker.data_dir)
    storage.open(now)
    for start in range(0, n, 50_000):
        storage.apply(WriteBatch(dedup=[
            (f"orders/v1/c{i % 8}", dedup_key(i), now + 3000 + i / 1000, i // 8 + 1,
             dedup_id(i % 8, i // 8 + 1)) for i in range(start, start + 50_000)]))
    storage.close()
    broker.start(timeout=120)
    with broker.connect_sync("app") as app:
        for i in (0, 123_457, n - 1):  # found while the rows are built, and after
            receipt = app.send(f"orders/v1/c{i % 8}", "again", dedup=dedup_key(i))
            assert receipt.duplicate
            assert (receipt.seq, receipt.id) == (i // 8 + 1, dedup_id(i % 8, i // 8 + 1))
        assert not app.send("orders/v1/c0", "new", dedup=dedup_key(n)).duplicate
        time.sleep(3.0)  # the rows are built into the window over the next ticks
        receipt = app.send("orders/v1/c1", "again", dedup=dedup_key(9))
        assert (receipt.duplicate, receipt.seq) == (True, 2)
        grown = peak_rss_mib(broker.proc.pid) - fresh
    assert grown < 120, f"{grown} MiB more than a fresh broker at its peak"
