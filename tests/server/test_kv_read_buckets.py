"""What a start reads of the buckets to index them (server/kv.py ``read_buckets``):
every stored revision, its key, whether it is a delete and its expiry, never its value,
read a bounded page at a time, and one string per key however many its revisions."""

from __future__ import annotations

from pathlib import Path

from minou.config import parse_settings
from minou.core.broker import Broker
from minou.core.kv import Revision
from minou.names import KV_DELETE, KV_OP, kv_channel
from minou.server import kv as server_kv
from minou.storage.memory import MemoryStorage
from tests.core.helpers import Harness, send

CFG = kv_channel("config")


def test_revisions_are_read_page_by_page_without_their_values(monkeypatch) -> None:
    MemoryStorage.forget("kv-read-buckets")
    store = MemoryStorage("kv-read-buckets")
    store.open(0.0)
    settings = parse_settings({"kv": {"config": {"history": 8}}}, base_dir=Path("."))
    h = Harness(broker=Broker(channel_options=settings.channel_options), storage=store)
    for _ in range(5):
        h.publish(send(CFG, "v" * 1000, key="limit"))
    h.publish(send(CFG, None, key="limit", headers={KV_OP: KV_DELETE}),
              send(CFG, 1, key="ttl", ttl=60.0))
    h.commit()
    monkeypatch.setattr(server_kv, "STORAGE_READ_BYTES", 1)  # a revision a page
    (revisions,) = server_kv.read_buckets(store, store.open(h.now)).values()
    assert all(type(r) is Revision for r in revisions)  # no value held
    assert [(r.seq, r.key) for r in revisions] == [(n, "limit") for n in range(1, 7)] + [
        (7, "ttl")]
    assert [r.headers for r in revisions][-2:] == [{KV_OP: KV_DELETE}, None]
    assert revisions[-1].expires_at == h.now + 60.0
    assert len({id(r.key) for r in revisions}) == 2  # one string per key
