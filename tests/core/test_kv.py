"""Key-value buckets in the core (core/kv.py): a put is a message keyed by the KV key,
its seq the revision; compare-and-set is checked when staged (counting staged puts)
and undone with a failed commit; a key keeps its last ``history`` revisions; readers
never truncate a bucket; the index follows deletes (TTL, purge) and is rebuilt from
storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from minou.config import parse_settings
from minou.core.broker import Broker, Session
from minou.errors import ErrorCode, StorageFull
from minou.names import KV_DELETE, KV_EXPECT, KV_OP, kv_channel
from minou.storage.memory import MemoryStorage

from .helpers import Harness, send

CFG = kv_channel("config")
FULL = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)


def harness(kv: dict | None = None, storage: MemoryStorage | None = None) -> Harness:
    settings = parse_settings({"kv": kv or {}}, base_dir=Path("."))
    return Harness(broker=Broker(channel_options=settings.channel_options), storage=storage)


def put(key: str, value: object, expect: int | None = None, **kw: object):
    headers = {KV_EXPECT: str(expect)} if expect is not None else None
    return send(CFG, value, key=key, headers=headers, **kw)


def delete(key: str, expect: int | None = None):
    headers = {KV_OP: KV_DELETE}
    if expect is not None:
        headers[KV_EXPECT] = str(expect)
    return send(CFG, None, key=key, headers=headers)


def index(h: Harness):
    return h.broker.channels[CFG].kv


def test_a_put_is_a_revision_and_the_latest_one_is_the_value() -> None:
    h = harness()
    a, b = h.publish(put("limit", 1), put("currency", "EUR"))
    (c,) = h.publish(put("limit", 2))
    assert (a.seq, b.seq, c.seq) == (1, 2, 3)
    kv = index(h)
    assert kv.latest("limit", h.now) == 3
    assert kv.latest("currency", h.now) == 2
    assert kv.latest("nothing", h.now) == 0
    assert kv.keys("", h.now) == ["currency", "limit"]
    assert kv.keys("l", h.now) == ["limit"]
    # History 1 (the default): the older revision of "limit" is deleted from storage.
    assert kv.history("limit") == [3]
    h.commit()
    assert [m.seq for m in h.storage.read_range(CFG, 1, 10, 10)] == [2, 3]
    # The stored revision carries no expected-revision header (a condition, not data).
    (d,) = h.publish(put("limit", 3, expect=3))
    assert d.code == 0
    assert h.storage.read_range(CFG, d.seq, d.seq + 1, 1)[0].headers is None


def test_compare_and_set_refuses_a_stale_revision_and_counts_what_is_staged() -> None:
    h = harness()
    (first,) = h.publish(put("limit", 1, expect=0))  # create: no value yet
    assert first.code == 0
    (again,) = h.publish(put("limit", 2, expect=0))
    assert again.code == ErrorCode.REVISION_MISMATCH
    assert "revision 1, not 0" in again.error
    # Two writers staged in one batch with the same expected revision: one wins.
    outcomes = h.publish(put("limit", 2, expect=1), put("limit", 3, expect=1))
    assert [o.code for o in outcomes] == [0, ErrorCode.REVISION_MISMATCH]
    assert index(h).latest("limit", h.now) == outcomes[0].seq
    assert h.broker.counters.refused["revision_mismatch"] == 2


def test_a_delete_is_a_tombstone_and_a_create_may_follow_it() -> None:
    h = harness({"config": {"history": 3}})
    h.publish(put("k", 1))
    (gone,) = h.publish(delete("k", expect=1))
    assert gone.code == 0
    kv = index(h)
    assert kv.latest("k", h.now) == 0
    assert kv.keys("", h.now) == []
    assert kv.history("k") == [1, 2]
    assert (h.publish(delete("k", expect=1))[0].code == ErrorCode.REVISION_MISMATCH)
    assert h.publish(put("k", 5, expect=0))[0].code == 0


def test_a_failed_commit_undoes_its_staged_revisions() -> None:
    h = harness()
    h.publish(put("k", 1))
    h.broker.publish([put("k", 2, expect=1)], h.now)
    batch = h.broker.take_writes()
    h.broker.on_failed(batch, FULL)
    kv = index(h)
    assert kv.staged == {}
    assert kv.latest("k", h.now) == 1
    # The put that failed did not move the key: the same compare-and-set succeeds now.
    (o,) = h.publish(put("k", 2, expect=1))
    assert o.code == 0


def test_history_depth_keeps_the_last_revisions_and_readers_never_truncate() -> None:
    h = harness({"config": {"history": 2}})
    reader = Session("r")
    sub = h.subscribe(reader, kind="listen", patterns=CFG, start="oldest", prefetch=100)
    for v in range(5):
        h.publish(put("k", v))
    items = h.take(sub)
    h.ack(reader, items)
    h.commit()
    kv = index(h)
    assert kv.history("k") == [4, 5]
    # Every reader settled everything, and the bucket still holds its value.
    assert [m.seq for m in h.storage.read_range(CFG, 1, 10, 10)] == [4, 5]
    assert h.broker.channels[CFG].first_seq <= 4


def test_ttl_expiry_and_purge_remove_revisions_from_the_index() -> None:
    h = harness({"config": {"ttl": 10}})
    h.publish(put("k", 1))
    kv = index(h)
    assert kv.latest("k", h.now) == 1
    assert kv.latest("k", h.now + 11) == 0  # past its TTL: no value, even before removal
    assert kv.keys("", h.now + 11) == []
    h.broker.expire([(CFG, 1)], h.now + 11)
    assert kv.history("k") == [] and len(kv) == 0
    h.publish(put("a", 1), put("b", 2))
    h.broker.channels[CFG].truncate_below(h.broker.channels[CFG].end)
    assert len(kv) == 0 and kv.revisions == {}


def test_bad_writes_to_a_bucket_are_refused_precisely() -> None:
    h = harness()
    cases = [
        (send(CFG, 1), "names its key"),
        (send(CFG, 1, key="a b"), "invalid KV key"),
        (send(CFG, 1, key="/a"), "invalid KV key"),
        (send(CFG, 1, key="k", delay=5), "no delay"),
        (send(CFG, 1, key="k", headers={KV_OP: "drop"}), "only operation"),
        (send(CFG, 1, key="k", headers={KV_EXPECT: "-1"}), "must be a revision"),
        (send("_kv/v1/*", 1, key="k"), "not broadcast"),
    ]
    for s, text in cases:
        (o,) = h.publish(s)
        assert o.code == ErrorCode.BAD_REQUEST, s
        assert text in o.error
    assert CFG not in h.broker.channels  # nothing made the bucket


def test_a_bucket_is_not_written_in_a_transaction() -> None:
    h = harness()
    with pytest.raises(Exception, match="not staged in a transaction") as refused:
        h.broker.txn_publishing.stage(Session("w"), "t1", [put("k", 1)], h.now)
    assert refused.value.detail["channel"] == put("k", 1).channel


def test_the_index_is_rebuilt_from_storage_after_a_restart() -> None:
    store = MemoryStorage("kv-restart")
    MemoryStorage.forget("kv-restart")
    store = MemoryStorage("kv-restart")
    store.open(0.0)
    h = harness({"config": {"history": 2}}, storage=store)
    for v in range(3):
        h.publish(put("k", v))
    h.publish(put("other", 1), delete("other"))
    settings = parse_settings({"kv": {"config": {"history": 1}}}, base_dir=Path("."))
    broker = Broker(channel_options=settings.channel_options)
    broker.restore(store.open(h.now), h.now)
    log = broker.channels[CFG]
    broker.index_bucket(CFG, store.read_range(CFG, log.first_seq, log.end, 1000))
    kv = log.kv
    assert kv.latest("k", h.now) == 3
    assert kv.latest("other", h.now) == 0
    # The smaller history now applies: older revisions are deleted with the next commit.
    assert kv.history("k") == [3] and kv.history("other") == [5]
    assert sorted(broker.batch.deletes) == [(CFG, 2), (CFG, 4)]


def test_the_revisions_of_every_bucket_together_are_bounded(monkeypatch) -> None:
    from minou.core import kv

    h = harness()
    monkeypatch.setattr(kv, "MAX_KV_REVISIONS_TOTAL", 3)
    h.publish(put("a", 1), send(kv_channel("other"), 2, key="b"))
    assert h.broker.state.kv_count.total == 2
    (ok,) = h.publish(put("c", 3))
    assert ok.code == 0
    (full,) = h.publish(send(kv_channel("third"), 4, key="d"))
    assert full.code == ErrorCode.QUEUE_FULL
    assert full.error == ("the buckets of this broker hold 3 revisions, the limit is 3: "
                          "delete keys, or lower history")
    h.publish(delete("a"))  # a delete is a revision too: refused while full
    h.broker.channels[CFG].truncate_below(h.broker.channels[CFG].end)
    assert h.broker.state.kv_count.total == 1
    assert h.publish(put("e", 5))[0].code == 0


def test_the_keys_of_every_bucket_together_are_bounded_by_their_bytes(monkeypatch) -> None:
    from minou.core import kv

    store = MemoryStorage("kv-key-bytes")
    MemoryStorage.forget("kv-key-bytes")
    store = MemoryStorage("kv-key-bytes")
    store.open(0.0)
    h = harness({"config": {"history": 4}}, storage=store)
    monkeypatch.setattr(kv, "MAX_KV_KEY_BYTES", 10)
    h.publish(put("abcd", 1), send(kv_channel("other"), 2, key="efgh"))
    assert h.broker.state.kv_count.key_bytes == 8
    assert h.publish(put("ab", 3))[0].code == 0  # 10: at the limit, not past it
    (full,) = h.publish(send(kv_channel("third"), 4, key="x"))
    assert full.code == ErrorCode.QUEUE_FULL
    assert full.error == ("the keys of this broker's buckets hold 10 bytes, a new key of 1 "
                          "would pass the limit of 10: use shorter keys, or fewer (a deleted "
                          "key stays, as its delete marker, until its bucket is purged)")
    assert h.broker.state.counters.refused["queue_full"] == 1
    with pytest.raises(kv.QueueFull) as refused:
        kv.checked_put(put("x", 4), index(h), h.now)
    assert refused.value.detail == {"limit": 10}
    # Keys already indexed take more revisions, and deletes, however full.
    assert [o.code for o in h.publish(put("abcd", 5), put("abcd", 6), delete("ab"))] == [0] * 3
    assert h.broker.state.kv_count.key_bytes == 10  # each key once, whatever its revisions
    h.commit()
    # A restart counts them again from storage.
    h2 = harness({"config": {"history": 4}}, storage=store)
    h2.broker.restore(store.open(h.now), h.now)
    for name in (CFG, kv_channel("other")):
        log = h2.broker.channels[name]
        h2.broker.index_bucket(name, store.read_range(name, log.first_seq, log.end, 1000))
    assert h2.broker.state.kv_count.key_bytes == 10
    assert h2.publish(put("x", 7))[0].code == ErrorCode.QUEUE_FULL
    # A purge of the bucket frees its keys: only "efgh" stays.
    log = h2.broker.channels[CFG]
    log.truncate_below(log.end)
    assert h2.broker.state.kv_count.key_bytes == 4
    assert h2.publish(put("x", 8))[0].code == 0


def test_the_index_holds_a_key_once_whatever_its_revisions() -> None:
    """Each revision arrives with its own copy of the key's text (decoded per message):
    the index keeps one, so 64 revisions of a 256-character key cost their entries,
    not 64 keys (~300 B more each)."""
    import tracemalloc

    from minou.core.kv import KvIndex

    kv = KvIndex()
    text = "k" * 256
    kv.commit(_msg(1, text), 64)  # the key's first revision holds its string
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for seq in range(2, 2002):
            kv.commit(_msg(seq, (text + ".")[:-1]), 10_000)  # an equal, distinct string
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kv.history(text) == list(range(1, 2002))
    assert grown / 2000 < 200, f"{grown / 2000:.0f} B a revision"  # a key's copy: 305


def test_a_bucket_schema_validates_values_but_not_deletes() -> None:
    h = harness({"config": {"schema": {"type": "object", "required": ["max"]}}})
    (bad,) = h.publish(put("limit", {"min": 1}))
    assert bad.code == ErrorCode.SCHEMA_MISMATCH
    assert "kv/config" in bad.error
    (ok,) = h.publish(put("limit", {"max": 1}))
    assert ok.code == 0
    (gone,) = h.publish(delete("limit"))
    assert gone.code == 0


def _msg(seq: int, key: str, *, deleted: bool = False, expires: float | None = None):
    from minou.core.log import Msg

    headers = {KV_OP: KV_DELETE} if deleted else None
    return Msg(CFG, seq, f"id{seq}", b"1", False, headers, 0, 0.0, expires, None, key)


def test_the_index_alone_reads_writes_and_forgets_exactly() -> None:
    from minou.core.kv import KvIndex

    kv = KvIndex()
    for seq, key in ((1, "a"), (2, "b"), (3, "c")):
        assert kv.commit(_msg(seq, key), 1) == []
    assert kv.commit(_msg(4, "a", expires=100.0), 2) == []
    assert kv.commit(_msg(5, "a", deleted=True), 2) == [1]  # past history 2: the oldest
    kv.forget(1)
    assert kv.count.total == 4
    assert kv.keys("", 0.0) == ["b", "c"]  # "a" is deleted
    assert kv.keys("", 0.0, after="b") == ["c"]  # after is exclusive
    assert kv.keys("", 0.0, limit=1) == ["b"]
    kv.forget(5)  # the delete goes: "a" is at revision 4 again, until it expires
    assert kv.tombstones == set()
    assert kv.latest("a", 99.0) == 4
    assert kv.latest("a", 100.0) == 0  # expired at exactly its time
    kv.forget(4)
    assert kv.expires == {} and "a" not in kv.revisions
    kv.forget(42)  # unknown: nothing happens
    assert kv.count.total == 2
    kv.forget_below(3)  # 3 stays: below means below
    assert kv.history("c") == [3] and kv.history("b") == []
    # Indexing the same stored messages again (a page read twice) changes nothing.
    assert kv.rebuild([_msg(3, "c"), _msg(6, "c")], 5) == []
    assert kv.rebuild([_msg(3, "c"), _msg(6, "c")], 5) == []
    assert kv.history("c") == [3, 6] and kv.count.total == 2


def test_compare_and_set_after_a_staged_delete_and_on_an_expired_value() -> None:
    h = harness({"config": {"ttl": 10}})
    h.publish(put("k", 1))
    outcomes = h.publish(delete("k", expect=1), put("k", 2, expect=1), put("k", 3, expect=0),
                         commit=False)
    assert [o.code for o in outcomes] == [0, ErrorCode.REVISION_MISMATCH, 0]
    assert "has no value (revision 0), not revision 1" in outcomes[1].error
    h.commit()
    h.advance(11)  # the value of revision 3 expired: no value, so revision 0 matches
    (o,) = h.publish(put("k", 4, expect=0))
    assert o.code == 0


def test_expected_revision_bounds_and_the_messages_name_the_bucket() -> None:
    from minou.limits import MAX_KV_REVISION

    h = harness()
    (top,) = h.publish(put("k", 1, expect=MAX_KV_REVISION))
    assert top.code == ErrorCode.REVISION_MISMATCH  # a revision, just not this one
    (over,) = h.publish(put("k", 1, expect=MAX_KV_REVISION + 1))
    assert over.code == ErrorCode.BAD_REQUEST
    assert over.error == f"x-kv-expect must be a revision (an integer >= 0), not " \
                         f"'{MAX_KV_REVISION + 1}'"
    (nokey,) = h.publish(send(CFG, 1))
    assert nokey.error == "a write to bucket 'config' names its key (the message key)"
    (op,) = h.publish(send(CFG, 1, key="k", headers={KV_OP: "x" * 60}))
    assert op.error == f"x-kv-op is {'x' * 40!r}: the only operation is 'del'"


def test_a_put_staged_in_the_same_batch_is_the_revision_to_compare_with() -> None:
    h = harness()
    first, second = h.publish(put("k", 1), put("k", 2, expect=1), commit=False)
    assert (first.code, second.code) == (0, 0)
    (long,) = h.publish(put("k", 3, expect=int("9" * 60)))
    assert long.error.endswith(f"not {'9' * 40!r}")


def test_staged_revisions_leave_in_order_and_a_dropped_one_from_anywhere() -> None:
    """A batch of several updates of one key: each commit takes the oldest staged
    revision off (commits come in seq order), one that will never be committed (a failed
    commit, an overflow) goes from wherever it is, and a compare-and-set counts what is
    left."""
    from minou.core.kv import KvIndex
    from minou.core.log import Msg

    kv = KvIndex()
    msgs = [Msg("_kv/v1/b", seq, f"id{seq}", b"1", key="k") for seq in range(1, 6)]
    for m in msgs:
        kv.stage(m)
    kv.check("k", 5, 0.0)  # the newest staged revision
    kv.unstage(msgs[2])  # seq 3 dropped from the middle
    assert [s for s, _ in kv.staged["k"]] == [1, 2, 4, 5]
    kv.commit(msgs[0], history=10)
    kv.commit(msgs[1], history=10)
    assert [s for s, _ in kv.staged["k"]] == [4, 5]
    kv.unstage(msgs[4])  # the newest dropped: the one before it is the latest staged
    kv.check("k", 4, 0.0)
    kv.commit(msgs[3], history=10)
    assert kv.staged == {}
    assert kv.history("k") == [1, 2, 4] and kv.latest("k", 0.0) == 4


def test_a_watch_is_woken_once_by_the_commit_that_brings_its_bucket_a_revision() -> None:
    """A KV watch (server/kv.py) waits in Engine.channel_waiters, by channel."""
    h = harness()
    other = kv_channel("other")
    woken: list[str] = []
    h.engine.channel_waiters[CFG] = {lambda: woken.append("a"): None,
                                     lambda: woken.append("b"): None}
    h.engine.channel_waiters[other] = {lambda: woken.append("other"): None}
    h.publish(put("limit", 1), commit=False)
    assert woken == []  # staged is not durable: a watch reading now would find nothing
    h.commit()
    assert sorted(woken) == ["a", "b"] and list(h.engine.channel_waiters) == [other]
    h.publish(put("limit", 2), send("q/v1/1", 1))
    assert sorted(woken) == ["a", "b"]  # woken once: the next revision is a new wait
    h.publish(send(other, 1, key="k"), put("x", 3))
    assert sorted(woken) == ["a", "b", "other"] and h.engine.channel_waiters == {}


@pytest.mark.parametrize("stale_kept", [1_000, 3])
def test_keys_and_their_count_are_what_walking_every_key_finds(monkeypatch,
                                                               stale_kept) -> None:
    """``keys`` reads its page from the keys kept in order (added since: merged at the
    next read; gone: skipped, then dropped), and ``live_keys`` counts without walking
    them: both must answer what sorting every key of the index answers, through puts,
    deletes, TTLs, history compaction, forgets and keys that come back."""
    import random

    from minou.core.kv import KvIndex

    def naive(kv: KvIndex, prefix: str, now: float, after: str, limit: int) -> list[str]:
        found = sorted(k for k in kv.revisions if k.startswith(prefix) and k > after
                       and kv.latest(k, now))
        return found[:limit] if limit else found

    monkeypatch.setattr("minou.core.kv.STALE_KEPT", stale_kept)
    rng = random.Random(7)
    kv = KvIndex()
    names = [f"{p}/{i:02d}" for p in ("a", "ab", "b") for i in range(40)]
    seq = 0
    for step in range(6_000):
        roll = rng.random()
        if roll < 0.55 or not kv.key_of:
            seq += 1
            key = rng.choice(names)
            expires = float(rng.randint(1, 50)) if rng.random() < 0.2 else None
            for old in kv.commit(_msg(seq, key, deleted=rng.random() < 0.25,
                                      expires=expires), rng.randint(1, 3)):
                kv.forget(old)
        elif roll < 0.9:
            kv.forget(rng.choice(list(kv.key_of)))
        else:
            kv.forget_below(rng.randint(seq - 30, seq))
        now = float(rng.randint(0, 60))
        prefix = rng.choice(["", "a", "ab/", "b/1", "c"])
        after = rng.choice(["", "a/10", "ab/05", "b/39", "zz"])
        limit = rng.choice([0, 1, 3, 50])
        assert kv.keys(prefix, now, after, limit) == naive(kv, prefix, now, after, limit), step
        assert kv.live_keys(now) == len(naive(kv, "", now, "", 0)), step
