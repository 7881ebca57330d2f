"""What a broker's KV buckets hold in memory, against real brokers. The index is bounded
by its keys' bytes too (MAX_KV_KEY_BYTES): every revision is indexed in memory with its
key, so 2,000,000 keys of 256 characters (the longest a key may be) would hold ~1.3 GB.
Filled to the bound with the longest keys, a broker refuses a new key precisely (native
and HTTP), counted, while the keys it holds take new revisions; a restart counts the
keys again from storage. A restart indexes the revisions without holding their values."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

import minou
from minou import limits
from minou.limits import MAX_KEY_LENGTH

from ..conftest import OPEN_RULES
from .test_http_api import bearer

MAX_KV_KEY_BYTES = 128 << 20  # limits.MAX_KV_KEY_BYTES (checked below)
KEYS = MAX_KV_KEY_BYTES // MAX_KEY_LENGTH  # the longest keys that fill the bound exactly
BUCKET = "_kv/v1/wide"
REFUSED = (f"the keys of this broker's buckets hold {MAX_KV_KEY_BYTES} bytes, a new key "
           f"of 3 would pass the limit of {MAX_KV_KEY_BYTES}: use shorter keys, or fewer")


def key(i: int) -> str:
    return f"k{i:07d}".ljust(MAX_KEY_LENGTH, "x")


async def fill(broker) -> None:
    async with await broker.connect("filler") as c:
        for start in range(0, KEYS, 5_000):
            await c.send_many([{"channel": BUCKET, "payload": 1, "key": key(i)}
                               for i in range(start, min(start + 5_000, KEYS))])


def refused_queue_full(broker) -> int:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        return admin.admin("status")["counters"]["refused"].get("queue_full", 0)


def test_a_new_key_past_the_bytes_of_every_key_is_refused_and_a_restart_counts_again(
        broker_factory, tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text(f'[kv."*"]\nmax_items = {KEYS + 1_000}\n' + OPEN_RULES)
    broker = broker_factory.make(config=cfg).start(timeout=60)
    asyncio.run(asyncio.wait_for(fill(broker), 600))
    with broker.connect_sync("app") as app:
        kv = app.kv("wide")
        with pytest.raises(minou.errors.QueueFull, match=REFUSED):
            kv.put("new", 1)
        # The keys it holds take new revisions, and are read, as before.
        revision = kv.put(key(7), 2)
        assert kv.get(key(7)).revision == revision
        assert app.send("plain/v1/1", {"n": 1}).seq == 1  # and the broker serves on
    r = httpx.put(f"{broker.http}/v1/kv/wide/new", json=1, headers=bearer(broker, "web"),
                  timeout=30)
    assert r.status_code == 429 and "the limit of" in r.text, r.text
    assert refused_queue_full(broker) == 2
    broker.stop()
    broker.start(timeout=120)  # the index, and its keys' bytes, rebuilt from storage
    with broker.connect_sync("app") as app:
        kv = app.kv("wide")
        with pytest.raises(minou.errors.QueueFull, match=REFUSED):
            kv.put("new", 3)
        assert kv.put(key(8), 4) > revision
        assert kv.get(key(8)).value == 4
    assert limits.MAX_KV_KEY_BYTES == MAX_KV_KEY_BYTES


def peak_rss_mib(pid: int) -> int:
    """The most memory the process has held (VmHWM): values held for a moment at a
    start are freed before it serves."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def test_a_restart_indexes_the_revisions_without_holding_their_values(broker_factory,
                                                                      tmp_path):
    """240 revisions of 1 MB (4 keys, history 64): the index needs their keys, not their
    values; read whole before indexing, every value was in memory at once."""
    cfg = tmp_path / "kv.toml"
    cfg.write_text('[kv."big"]\nhistory = 64\n' + OPEN_RULES)
    broker = broker_factory.make(config=cfg).start()
    fresh = peak_rss_mib(broker.proc.pid)

    async def fill() -> None:
        async with await broker.connect("filler") as c:
            kv = c.kv("big")
            for i in range(0, 240, 8):
                await asyncio.gather(*(kv.put(f"k{n % 4}", os.urandom(1_000_000))
                                       for n in range(i, i + 8)))

    asyncio.run(asyncio.wait_for(fill(), 300))
    broker.stop()
    broker.start(timeout=120)
    grown = peak_rss_mib(broker.proc.pid) - fresh
    with broker.connect_sync("app") as app:
        kv = app.kv("big")
        assert len(kv.history("k1")) == 60  # every revision indexed
        assert len(kv.get("k3").value) == 1_000_000
    assert grown < 120, f"{grown} MiB more than a fresh broker at its peak"


def test_a_big_bucket_lists_whole_and_in_order_page_by_page(broker):
    """Every page of ``kv.keys`` sorted every key of the bucket, and the bucket list
    sorted every key of every bucket to count them, all in the event loop (~90 ms a
    page of a 100,000-key bucket). The index keeps its keys in order now; what that
    costs is measured by ``bench/kv_pages.py`` (docs/benchmarks.md). Here: keys stored
    out of order come back whole, in order, over 90 pages, and the bucket list counts
    them."""
    keys = [f"user/{i * 7919 % 90_000:06d}" for i in range(90_000)]
    with broker.connect_sync("app") as c:
        for start in range(0, len(keys), 10_000):
            c.send_many([{"channel": "_kv/v1/big", "payload": 1, "key": k}
                         for k in keys[start:start + 10_000]])
        kv = c.kv("big")
        assert kv.get("user/000001").value == 1
        listed = kv.keys()
        (bucket,) = [b for b in c.admin("kv.buckets")["buckets"] if b["bucket"] == "big"]
    assert listed == sorted(keys) and bucket["keys"] == 90_000
