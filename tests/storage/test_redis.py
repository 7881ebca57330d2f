"""What only the Redis backend has: epochs and fencing, the key layout, Redis's own
bad days (killed, out of memory, a wrong password, no AOF), WAIT for replicas.
Everything it shares with the other backends is in test_contract.py."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from minou.core.group import GroupDef
from minou.core.log import Msg
from minou.core.writes import WriteBatch
from minou.errors import StorageError, StorageFenced, StorageFull, StorageUnavailable
from minou.storage.redis import RedisStorage
from minou.storage.redis.keys import queue_of
from minou.storage.redis.store import OPEN_PAGE_BYTES, OPEN_PAGE_CHANNELS, OPEN_PAGE_ENTRIES
from minou.storage.sqlite import SQLiteStorage
from tests.redis_server import RedisServer
from tests.storage.test_contract import NOW, batch_of, msg, records, seqs

A, B = "orders/v1/1", "audit/v2/7"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, to kill, fill or lock."""
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


def test_queues_are_endpoint_version_and_dead_letters_stay_in_theirs() -> None:
    assert queue_of("orders/v1/42") == "orders/v1"
    assert queue_of("_dead/orders/v1/42") == "orders/v1"
    assert queue_of("orders/v1/*") == "orders/v1"
    assert queue_of("orders/*") is None


# ------------------------------------------------------------------- fencing
def test_a_claim_fences_the_earlier_writer_for_that_queue_only(redis_url: str) -> None:
    first = RedisStorage(redis_url)
    first.open(NOW)
    first.apply(batch_of(msg(A, 1), msg(B, 1)))
    assert first.epochs == {"orders/v1": 1, "audit/v2": 1}
    second = RedisStorage(redis_url, claim=False)
    second.open(NOW)
    assert second.claim("orders/v1") == 2
    with pytest.raises(StorageFenced) as info:
        first.apply(batch_of(msg(A, 2), msg(B, 2)))
    assert isinstance(info.value, StorageError)
    assert info.value.queues == {"orders/v1": 2} and "orders/v1" in str(info.value)
    snap = RedisStorage(redis_url, claim=False).open(NOW)
    assert records(snap)[A].count == 1  # nothing for the fenced queue
    assert records(snap)[B].count == 2  # the other queue was written
    second.apply(batch_of(msg(A, 2, b"mine")))  # the claimant writes
    assert [m.data for m in second.read_range(A, 1, 10, 10)] == [b"1", b"mine"]
    with pytest.raises(StorageFenced):  # and the fenced one stays fenced
        first.apply(batch_of(msg(A, 3)))


def test_open_claims_every_queue_it_finds(redis_url: str) -> None:
    old = RedisStorage(redis_url)
    old.open(NOW)
    old.apply(batch_of(msg(A, 1), msg(B, 1)))
    new = RedisStorage(redis_url)  # a restarted broker: the old one may still be running
    new.open(NOW)
    assert new.epochs == {"orders/v1": 2, "audit/v2": 2}
    with pytest.raises(StorageFenced) as info:
        old.apply(batch_of(msg(A, 2), msg(B, 2)))
    assert set(info.value.queues) == {"orders/v1", "audit/v2"}
    new.apply(batch_of(msg(A, 2)))
    assert seqs(new.read_range(A, 1, 10, 10)) == [1, 2]


# ---------------------------------------------------------------- key layout
def test_every_key_of_a_queue_carries_its_hash_tag(redis_url: str) -> None:
    prefix = redis_url.rsplit("prefix=", 1)[1]
    st = RedisStorage(redis_url)
    st.open(NOW)
    g = GroupDef("consume:g", "consume", ("orders/*",))
    st.apply(batch_of(
        msg(A, 1, priority=2, expires_at=NOW + 5), msg("_dead/orders/v1/1", 1), msg(B, 1),
        deletes=[(A, 1)], group_defs={g.key: g},
        group_states={(g.key, A): (1, b"s"), (g.key, B): (1, b"t")},
        dedup=[(A, "k", NOW + 9, 1, "id"), ("orders/*", "k", NOW + 9, 0, "")],
        fences={("w1", A): 3}, writers={"w1": "alice"}, clients={"alice": b"c"},
        producers={("alice", "p", A): ("alice", "p", A, 1, 1, 1, 1, "h", NOW, None)},
        used_tokens=[("jti", NOW + 60)], reservations={B: "alice"}, meta={"m": "1"},
        staged=[("alice", "t1", 1, [], NOW)],
    ))
    client = redis.Redis.from_url(redis_url.split("?")[0])
    found = sorted(k.decode(errors="backslashreplace")  # txn keys hold msgpack
                   for k in client.scan_iter(match=f"{prefix}:*", count=1000))
    tags = {k.split("{", 1)[1].split("}", 1)[0] for k in found}
    assert tags == {"orders/v1", "audit/v2", "shared"}
    assert all(k.startswith(f"{prefix}:{{") for k in found)
    orders = [k for k in found if "{orders/v1}" in k]
    # The queue's messages, dead letters, states, dedup, producers and fences: one slot.
    assert {f"{prefix}:{{orders/v1}}:{name}" for name in (
        f"b:{A}", "b:_dead/orders/v1/1", f"r:{A}", "gs:consume:g", "dedup", "prod",
        "fw:w1", "epoch", "exp", "spec")} <= set(orders)
    assert len({key_slot(k.encode()) for k in orders}) == 1
    assert f"{prefix}:{{shared}}:queues" in found
    assert {m.decode() for m in client.smembers(f"{prefix}:{{shared}}:queues")} == {
        "orders/v1", "audit/v2"}


# --------------------------------------------------------------- bad days
def test_redis_killed_then_restarted_from_its_aof_loses_nothing_confirmed(
    own_redis: RedisServer,
) -> None:
    own_redis.start()
    st = RedisStorage(own_redis.url)
    st.open(NOW)
    st.apply(batch_of(*(msg(A, s) for s in range(1, 51))))
    own_redis.kill()
    with pytest.raises(StorageUnavailable) as info:
        st.apply(batch_of(msg(A, 51)))
    assert own_redis.url.split("/0")[0] in str(info.value)
    own_redis.start()  # the same port and directory: it reads its AOF back
    st.apply(batch_of(msg(A, 51)))  # the same instance resumes (its scripts loaded again)
    again = RedisStorage(own_redis.url)
    snap = again.open(NOW)
    assert records(snap)[A].count == 51
    assert seqs(again.read_range(A, 1, 100, 100)) == list(range(1, 52))


def test_unreachable_redis_at_open_names_the_url_not_the_password() -> None:
    st = RedisStorage("redis://:hunter2@127.0.0.1:1/0")
    with pytest.raises(StorageUnavailable) as info:
        st.open(NOW)
    text = str(info.value)
    assert "redis://:***@127.0.0.1:1/0" in text and "hunter2" not in text


def test_a_wrong_password_is_a_clear_refusal(own_redis: RedisServer, tmp_path: Path) -> None:
    own_redis.extra = ["--requirepass", "right-one"]
    own_redis.start()
    url = own_redis.url.replace("redis://", "redis://:wrong-one@")
    with pytest.raises(StorageUnavailable) as info:
        RedisStorage(url).open(NOW)
    assert "password" in str(info.value) and "wrong-one" not in str(info.value)
    secret = tmp_path / "redis.password"
    secret.write_text("right-one\n")
    st = RedisStorage(f"{own_redis.url}?password_file={secret}")
    st.open(NOW)
    st.apply(batch_of(msg(A, 1)))
    assert "right-one" not in st.path


def test_out_of_memory_refuses_publishes_whole_but_lets_acks_through(
    own_redis: RedisServer,
) -> None:
    own_redis.start()
    client = redis.Redis(port=own_redis.port)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + (2 << 20))
    st = RedisStorage(own_redis.url)
    st.open(NOW)
    g = GroupDef("consume:g", "consume", (A,))
    st.apply(WriteBatch(channels={A: 1, B: 1}, group_defs={g.key: g}))
    seq = 0
    with pytest.raises(StorageFull) as info:
        while seq < 10_000:
            st.apply(batch_of(*(msg(A, seq + i, b"x" * (16 << 10)) for i in (1, 2, 3, 4)),
                              msg(B, seq // 4 + 1)))
            seq += 4
    assert "maxmemory" in info.value.message and "nothing was stored" in info.value.message
    assert own_redis.url in info.value.message
    snap = RedisStorage(own_redis.url, claim=False).open(NOW)
    assert records(snap)[A].count == seq and records(snap)[B].count == seq // 4
    # Acks still land: group states and removals, on a full Redis.
    st.apply(WriteBatch(group_states={(g.key, A): (seq + 1, b"acked")},
                        truncates={A: seq + 1}, channels={A: seq + 1}))
    assert RedisStorage(own_redis.url, claim=False).open(NOW).group_states == [
        (g.key, A, seq + 1, b"acked")]
    room, _ = st.probe()
    assert room
    st.apply(batch_of(msg(A, seq + 1)))  # publishes are taken again


def test_replicas_not_reached_fail_the_commit(redis_url: str) -> None:
    st = RedisStorage(redis_url + "&replicas=1", wait_timeout_ms=50)
    assert st.replicas == 1
    st.open(NOW)
    with pytest.raises(StorageUnavailable) as info:
        st.apply(batch_of(msg(A, 1)))
    assert "0 of 1 replica" in str(info.value) and "not confirmed" in str(info.value)


def test_a_claim_is_used_only_once_the_replicas_have_it(redis_url: str) -> None:
    """A claim a failover could lose would let the promoted replica hand the same epoch
    to another broker: both would pass the fence. So claims WAIT as commits do."""
    RedisStorage(redis_url).apply(batch_of(msg(A, 1)))  # a queue to claim at open
    st = RedisStorage(redis_url + "&replicas=1", wait_timeout_ms=50)
    with pytest.raises(StorageUnavailable) as info:
        st.open(NOW)  # claims every queue it finds
    assert "claiming orders/v1 reached 0 of 1 replica(s)" in str(info.value)
    assert st.epochs == {}
    with pytest.raises(StorageUnavailable) as info:
        st.claim("orders/v1")
    assert "the claim of orders/v1 reached 0 of 1 replica(s)" in str(info.value)
    with pytest.raises(StorageUnavailable) as info:
        st.apply(batch_of(msg(B, 1)))  # a queue's first write claims it
    assert "claiming audit/v2 reached 0 of 1" in str(info.value)
    assert st.epochs == {}  # none of these epochs is written under


def test_open_warns_when_redis_would_lose_confirmed_messages(
    own_redis: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    own_redis.start()
    client = redis.Redis(port=own_redis.port)
    client.config_set("appendonly", "no")
    client.config_set("maxmemory-policy", "allkeys-lru")
    with caplog.at_level(logging.WARNING, logger="minou.storage"):
        RedisStorage(own_redis.url).open(NOW)
    text = caplog.text
    assert "appendonly no" in text and "maxmemory-policy allkeys-lru" in text


# ------------------------------------------------------------ start in pages
def _both(redis_url: str, tmp_path: Path) -> tuple[RedisStorage, SQLiteStorage]:
    """A Redis store and a SQLite one, to be given the same batches: SQLite reads a
    start back in one pass, the oracle for what Redis reads back in pages."""
    st, lite = RedisStorage(redis_url), SQLiteStorage(tmp_path / "oracle")
    st.open(NOW)
    lite.open(NOW)
    return st, lite


def _evalsha_calls(redis_url: str) -> int:
    stats = redis.Redis.from_url(redis_url.split("?")[0]).info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def test_a_start_reads_special_segments_in_pages_and_gives_back_every_message(
    redis_url: str, tmp_path: Path,
) -> None:
    """A start used to read every special segment's body (segments holding priority or
    delayed messages) of every queue in one reply: as much memory as the data, and one
    script blocking Redis all along. Now pages of about OPEN_PAGE_BYTES, read for the
    messages' seq, priority and delay, and every one of those comes back exactly."""
    st, lite = _both(redis_url, tmp_path)
    a2, size = "orders/v1/2", 4096
    sent: list[Msg] = []
    for k in range(200):  # segments of 8 messages of 4 KiB: 32 KiB each, 5 MiB of specials
        plain = k % 5 == 4  # a segment with no special message is not read at all
        msgs = []
        for s in range(8 * k + 1, 8 * k + 9):
            kw: dict[str, Any] = {}
            if not plain and s % 3 == 1:
                kw["priority"] = s % 9 + 1
            elif not plain and s % 3 == 2:
                kw["deliver_at"] = NOW + s + 0.25
                kw["priority"] = s % 2  # a delayed one keeps its priority too
            msgs.append(msg(A, s, bytes([s % 251]) * size, **kw))
        msgs.append(msg(a2 if k % 2 else B, k // 2 + 1, priority=k % 9 + 1))
        sent += msgs
        for store in (st, lite):
            store.apply(batch_of(*msgs))
    deleted = [(A, s) for s in range(1, 1601, 7)]  # removed seqs inside special segments
    for store in (st, lite):
        store.apply(WriteBatch(deletes=deleted, truncates={A: 40}, channels={A: 1601}))
    gone = set(deleted)
    expected = sorted((m.channel, m.seq, m.priority, m.deliver_at) for m in sent
                      if m.special and (m.channel, m.seq) not in gone
                      and not (m.channel == A and m.seq < 40))
    specials_bytes = sum(len(m.data) for m in sent if m.channel == A)
    st.close()

    before = _evalsha_calls(redis_url)
    again = RedisStorage(redis_url)
    snap = again.open(NOW)
    calls = _evalsha_calls(redis_url) - before
    assert snap.specials == expected
    oracle = lite.open(NOW)
    assert snap.specials == sorted(oracle.specials)
    assert records(snap) == records(oracle)
    # Paged: Redis ran a script call per ~OPEN_PAGE_BYTES of special segments (4 of
    # the 5 MiB are in them), none answering much more than that; the old start read
    # each queue in one call (2 calls here, with the claims).
    assert calls >= specials_bytes * 4 // 5 // OPEN_PAGE_BYTES + 2, calls
    assert again.open_pages >= 4
    assert OPEN_PAGE_BYTES // 2 < again.open_largest <= OPEN_PAGE_BYTES + (8 << 10) * 8
    # And the store goes on from there: its next write lands after what it read.
    again.apply(batch_of(msg(A, 1601, priority=9)))
    assert (A, 1601, 9, None) in RedisStorage(redis_url, claim=False).open(NOW).specials


def test_a_start_pages_many_segments_removed_seqs_channels_and_dedup_entries(
    redis_url: str, tmp_path: Path,
) -> None:
    """More segments, removed seqs and dedup entries in a queue than a page holds, and
    more channels in it than a page names, beside more small queues than a round trip
    reads (each read whole): read back as SQLite reads them."""
    st, lite = _both(redis_url, tmp_path)
    many = "wide/v1/many"
    step = OPEN_PAGE_ENTRIES * 5 // 2
    # every other seq: each message a segment of its own, the seqs between never stored
    first = [msg(many, s, priority=s % 3) for s in range(1, 2 * step, 2)]
    wide = [msg(f"wide/v1/c{i:04}", 1, deliver_at=NOW + i if i % 2 else None)
            for i in range(OPEN_PAGE_CHANNELS + 20)]
    deletes = [(many, s) for s in range(1, 2 * step, 4)]  # OPEN_PAGE_ENTRIES x 1.25
    dedup = [(many, f"k{s}", NOW + (60 if s % 4 == 1 else -60), s, f"id{s}")  # half expired
             for s in range(1, 2 * step, 2)]
    small = [msg(f"small{i:02}/v1/c", 1, priority=1 + i % 9) for i in range(40)]
    small_dedup = [(m.channel, "k", NOW + 60, 1, "id") for m in small]
    for store in (st, lite):
        store.apply(batch_of(*first, dedup=dedup))
        store.apply(batch_of(*wide))
        store.apply(WriteBatch(deletes=deletes, channels={many: 2 * step}))
        store.apply(batch_of(*small, dedup=small_dedup))
        store.apply(WriteBatch(deletes=[(small[0].channel, 1)], channels={small[0].channel: 2}))
    st.close()
    again = RedisStorage(redis_url)
    snap = again.open(NOW)
    oracle = lite.open(NOW)
    assert records(snap) == records(oracle)
    assert len(records(snap)) == OPEN_PAGE_CHANNELS + 21 + 40
    assert records(snap)[many].count == step - len(deletes)
    assert snap.specials == sorted(oracle.specials)
    assert len(snap.specials) == len([m for m in first if m.special
                                      and (many, m.seq) not in set(deletes)]) + \
        (OPEN_PAGE_CHANNELS + 20) // 2 + 39
    assert sorted(snap.dedup) == sorted(oracle.dedup)
    assert len(snap.dedup) == step // 2 + 40
