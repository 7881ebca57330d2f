"""The storage contract: every backend, through the Storage interface only.

Each test gets a fresh store of each backend (``backend`` builds instances on one
place: a directory for SQLite, a unique name for memory) and reads back through a new
instance on that place (``reopen``), as the broker does after a restart. What only
one backend has (SQLite's WAL and files, memory's registry) is tested beside it
(test_sqlite.py) or at the end here.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from minou.config import Settings
from minou.core.group import GroupDef
from minou.core.log import Msg, page_end, read_weight
from minou.core.writes import WriteBatch
from minou.errors import ErrorCode, StorageError, StorageFull, StorageUnavailable
from minou.protocol.frames import Send
from minou.storage.base import ChannelRecord, Snapshot, Storage
from minou.storage.factory import open_storage
from minou.storage.memory import MemoryStorage
from minou.storage.redis import RedisStorage
from minou.storage.sqlite import SQLiteStorage

CH = "orders/v1/1"
CH2 = "orders/v1/2"
NOW = 1_000.0
# "sqlite-bodies": SQLite with every segment's body in a body file, files of 4 KiB.
BACKENDS = ["sqlite", "sqlite-bodies", "memory", "redis", "sentinel", "cluster"]

Factory = Callable[..., Storage]  # keyword arguments: the backend's (max_size, reserve)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    name = f"contract-{uuid.uuid4().hex}"
    opened: list[Storage] = []

    def make(**kw: Any) -> Storage:
        if request.param == "sqlite":
            st: Storage = SQLiteStorage(tmp_path / "data", **kw)
        elif request.param == "sqlite-bodies":
            st = SQLiteStorage(tmp_path / "data", body_file_min=1, body_file_limit=4096, **kw)
        elif request.param == "redis":
            # A fresh key prefix per test. Instances claim a queue at their first write
            # only: ``peek`` opens one beside the running store, which must not fence it
            # (claiming at open, the default, is tested in test_redis.py).
            url = request.getfixturevalue("redis_url")
            st = RedisStorage(url, claim=False, **kw)
        elif request.param == "sentinel":
            # The same through Sentinel, every commit and claim waiting for the replica.
            st = RedisStorage(request.getfixturevalue("sentinel_url"), claim=False, **kw)
        elif request.param == "cluster":
            # The same over a Redis Cluster of three primaries: queues in their slots.
            st = RedisStorage(request.getfixturevalue("cluster_url"), claim=False, **kw)
        else:
            st = MemoryStorage(name, **kw)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()
    MemoryStorage.forget(name)


@pytest.fixture
def store(backend: Factory) -> Storage:
    st = backend()
    st.open(NOW)
    return st


def reopen(backend: Factory, old: Storage, now: float = NOW, **kw: Any
           ) -> tuple[Storage, Snapshot]:
    """A restart: close ``old``, open a new instance on the same place."""
    old.close()
    st = backend(**kw)
    return st, st.open(now)


def peek(backend: Factory, now: float = NOW) -> Snapshot:
    """What a restart would find now, leaving the running instance alone."""
    st = backend()
    try:
        return st.open(now)
    finally:
        st.close()


def msg(channel: str, seq: int, data: bytes | None = None, **kw: Any) -> Msg:
    return Msg(channel, seq, f"id-{channel}-{seq}", data if data is not None else b"%d" % seq,
               **kw)


def batch_of(*msgs: Msg, **kw: Any) -> WriteBatch:
    """A batch as the core makes one: each channel's next seq beside its messages."""
    channels: dict[str, int] = {}
    for m in msgs:
        channels[m.channel] = max(channels.get(m.channel, 1), m.seq + 1)
    channels.update(kw.pop("channels", {}))
    return WriteBatch(messages=list(msgs), channels=channels, **kw)


def records(snap: Snapshot) -> dict[str, ChannelRecord]:
    return {r.name: r for r in snap.channels}


def fields(m: Msg) -> tuple[Any, ...]:
    return (m.channel, m.seq, m.id, m.data, m.raw, m.headers, m.priority, m.published_at,
            m.expires_at, m.deliver_at, m.key)


def seqs(msgs: list[Msg]) -> list[int]:
    return [m.seq for m in msgs]


def keys(msgs: list[Msg]) -> list[tuple[str, int]]:
    return sorted((m.channel, m.seq) for m in msgs)


# --------------------------------------------------------------------- basics
def test_backend_and_path_name_the_store(backend: Factory, store: Storage) -> None:
    assert store.backend in ("sqlite", "memory", "redis")  # "sentinel" is a redis store
    assert isinstance(store.path, str) and store.path
    assert store.max_size is None
    again = backend(max_size=5 << 20)
    assert (again.path, again.backend, again.max_size) == (store.path, store.backend, 5 << 20)


def test_a_fresh_store_is_empty(store: Storage) -> None:
    assert store.open(NOW) == Snapshot()
    assert store.read_range(CH, 1, 100, 10) == []
    assert store.expired(NOW, 10) == []
    assert store.retained_until(CH, 100, NOW) is None
    assert store.size_bytes() >= 0


def test_open_changes_nothing(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1, priority=2), dedup=[(CH, "k", NOW + 5, 1, "id")]))
    first = store.open(NOW)
    assert store.open(NOW) == first
    assert peek(backend) == first


# ------------------------------------------------------------------- messages
def test_messages_round_trip_through_a_new_instance(backend: Factory, store: Storage) -> None:
    full = msg(CH, 1, b'{"a": 1}', raw=False, headers={"h": "v", "x": ""}, priority=0,
               published_at=10.5, expires_at=100.0, deliver_at=None, key="k1")
    raw = msg(CH, 2, b"\x00\xff", raw=True, priority=7, published_at=11.0, deliver_at=50.0)
    other = msg(CH2, 1, b"2")
    store.apply(batch_of(full, raw, other))
    st, snap = reopen(backend, store)
    assert records(snap) == {
        CH: ChannelRecord(CH, 3, 1, 2), CH2: ChannelRecord(CH2, 2, 1, 1),
    }
    assert [fields(m) for m in st.read_range(CH, 1, 100, 100)] == [fields(full), fields(raw)]
    assert [fields(m) for m in st.read_range(CH2, 1, 100, 100)] == [fields(other)]


def test_read_messages_are_copies(store: Storage) -> None:
    # The core changes what it holds; storage keeps what was committed.
    m = msg(CH, 1, headers={"h": "1"})
    store.apply(batch_of(m))
    assert m.headers is not None
    m.headers["h"] = "changed"
    got = store.read_range(CH, 1, 10, 10)
    assert got[0].headers == {"h": "1"}
    assert got[0].headers is not None
    got[0].headers["h"] = "again"
    assert store.read_range(CH, 1, 10, 10)[0].headers == {"h": "1"}


def test_channels_keep_creation_order(backend: Factory, store: Storage) -> None:
    names = ["b/v1/1", "a/v1/1", "c/v1/1"]
    for name in names:
        store.apply(batch_of(msg(name, 1)))
    _, snap = reopen(backend, store)
    assert [r.name for r in snap.channels] == names


def test_channel_without_messages_and_next_seq_never_goes_down(
    backend: Factory, store: Storage
) -> None:
    store.apply(WriteBatch(channels={CH: 1}))
    store.apply(batch_of(msg(CH2, 1), msg(CH2, 2), msg(CH2, 3)))
    store.apply(WriteBatch(channels={CH2: 2}))  # a stale, lower value is ignored
    _, snap = reopen(backend, store)
    assert records(snap) == {CH: ChannelRecord(CH, 1, 1, 0), CH2: ChannelRecord(CH2, 4, 1, 3)}


def test_next_seq_comes_from_stored_messages_and_survives_removing_them(
    backend: Factory, store: Storage
) -> None:
    store.apply(WriteBatch(channels={CH: 1}))  # later publishes need not rewrite it
    store.apply(WriteBatch(messages=[msg(CH, s) for s in (1, 2, 3)]))
    store, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 4, 1, 3)]
    # Removing every message stores the next seq with the removal: no seq is reused.
    store.apply(WriteBatch(truncates={CH: 4}, channels={CH: 4}))
    store, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 4, 4, 0)]


def test_reapplying_a_message_is_idempotent(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1, b"1")))
    store.apply(batch_of(msg(CH, 1, b"1")))
    st, snap = reopen(backend, store)
    assert records(snap)[CH].count == 1
    assert seqs(st.read_range(CH, 1, 10, 10)) == [1]


def test_a_later_copy_of_a_seq_in_one_batch_wins(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1), Msg(CH, 1, "second", b"2"), msg(CH, 2)))
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 3, 1, 2)
    assert [(m.seq, m.id) for m in st.read_range(CH, 1, 10, 10)] == [(1, "second"),
                                                                      (2, f"id-{CH}-2")]


# ------------------------------------------------------ deletes and truncates
def test_deletes_and_truncates(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(*(msg(CH, s) for s in range(1, 8)), *(msg(CH2, s) for s in (1, 2))))
    store.apply(WriteBatch(deletes=[(CH, 5), (CH2, 1), ("orders/v1/unknown", 1)],
                           truncates={CH: 3}, channels={CH: 8, CH2: 3}))
    st, snap = reopen(backend, store)
    assert records(snap) == {
        CH: ChannelRecord(CH, 8, 3, 4, gone=[5]),  # holes inside [first_seq, next_seq)
        CH2: ChannelRecord(CH2, 3, 2, 1),  # a leading deleted seq moves first_seq
    }
    assert "orders/v1/unknown" not in records(snap)
    assert seqs(st.read_range(CH, 1, 100, 100)) == [3, 4, 6, 7]


def test_a_delete_and_a_truncate_in_the_publishing_batch(backend: Factory,
                                                         store: Storage) -> None:
    # drop_oldest deletes a message of the very batch that stores it.
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), msg(CH, 3), deletes=[(CH, 2)]))
    store.apply(batch_of(msg(CH, 4), msg(CH, 5), truncates={CH: 5}))
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 6, 5, 1)
    assert seqs(st.read_range(CH, 1, 100, 100)) == [5]


def test_deleting_every_message_leaves_an_empty_channel(backend: Factory,
                                                        store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), msg(CH, 3)))
    store.apply(WriteBatch(deletes=[(CH, 1), (CH, 2), (CH, 3)], channels={CH: 4}))
    st, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 4, 4, 0)]
    assert st.read_range(CH, 1, 100, 100) == []


def test_seqs_never_stored_between_batches_are_gone(
    backend: Factory, store: Storage
) -> None:
    # Seqs whose publishes failed (StorageFull) are never stored: gaps, not messages.
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), msg(CH, 3), deletes=[(CH, 2)]))
    store.apply(batch_of(msg(CH, 6), msg(CH, 7)))
    store.apply(batch_of(msg(CH2, 1)))
    store.apply(batch_of(msg(CH2, 10)))
    st, snap = reopen(backend, store)
    assert seqs(st.read_range(CH, 1, 100, 100)) == [1, 3, 6, 7]
    assert seqs(st.read_range(CH2, 1, 100, 100)) == [1, 10]
    assert snap.channels == [ChannelRecord(CH, 8, 1, 4, gone=[2, 4, 5]),
                             ChannelRecord(CH2, 11, 1, 2, gone=list(range(2, 10)))]


def test_seqs_never_stored_after_the_last_message_are_gone(
    backend: Factory, store: Storage
) -> None:
    # Regression: seq 3's publish failed, then a removal stored next seq 4. Only holes
    # between segments were gone: a restarted broker counted 3 as a live message.
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), msg(CH2, 1)))
    store.apply(WriteBatch(deletes=[(CH, 1), (CH2, 1)], channels={CH: 4, CH2: 3}))
    _, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 4, 2, 1, gone=[3]),
                             ChannelRecord(CH2, 3, 3, 0)]


def test_a_truncate_inside_a_batch_hides_what_is_below(backend: Factory,
                                                       store: Storage) -> None:
    store.apply(batch_of(*(msg(CH, s, priority=1, expires_at=NOW + 1) for s in range(1, 11))))
    store.apply(WriteBatch(truncates={CH: 5}, channels={CH: 11}))
    st, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 11, 5, 6)]
    assert seqs(st.read_range(CH, 1, 100, 100)) == list(range(5, 11))
    assert seqs(st.read_range(CH, 1, 100, 2)) == [5, 6]
    assert [s for _, s, _, _ in snap.specials] == list(range(5, 11))
    assert keys(st.expired(NOW + 1, 100)) == [(CH, s) for s in range(5, 11)]


def test_truncating_everything_keeps_the_channel_and_its_next_seq(
    backend: Factory, store: Storage
) -> None:
    store.apply(batch_of(msg(CH, 1), msg(CH, 2)))
    store.apply(WriteBatch(truncates={CH: 3}, channels={CH: 3}))
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 3, 3, 0)
    assert st.read_range(CH, 1, 100, 100) == []


def test_a_forgotten_channel_leaves_nothing_and_may_be_made_again(
    backend: Factory, store: Storage
) -> None:
    store.apply(batch_of(msg(CH, 1), msg(CH, 2, data=b"x" * 5000), msg(CH2, 1)))
    store.apply(WriteBatch(deletes=[(CH, 1)], truncates={CH: 3}, channels={CH: 3},
                           forgets=[CH]))
    assert CH not in records(peek(backend))
    assert records(peek(backend))[CH2] == ChannelRecord(CH2, 2, 1, 1,
                                                        records(peek(backend))[CH2].bytes)
    # Made and forgotten in one batch (an inbox that came and went between commits).
    store.apply(WriteBatch(channels={"tmp/v1/x": 1}, forgets=["tmp/v1/x"]))
    assert "tmp/v1/x" not in records(peek(backend))
    # Made again later: a new channel from seq 1.
    store.apply(batch_of(msg(CH, 1, data=b"again")))
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 2, 1, 1, records(snap)[CH].bytes)
    assert [m.data for m in st.read_range(CH, 1, 10, 10)] == [b"again"]


def test_a_truncate_never_moves_first_seq_back(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(*(msg(CH, s) for s in range(1, 6))))
    store.apply(WriteBatch(truncates={CH: 4}, channels={CH: 6}))
    store.apply(WriteBatch(truncates={CH: 2}, channels={CH: 6}))
    _, snap = reopen(backend, store)
    assert snap.channels == [ChannelRecord(CH, 6, 4, 2)]


# ------------------------------------------------------------------- specials
def test_specials_are_the_live_priority_and_delayed_messages(
    backend: Factory, store: Storage
) -> None:
    store.apply(batch_of(
        msg(CH, 1, priority=3), msg(CH, 2), msg(CH, 3, deliver_at=NOW + 9),
        msg(CH, 4, priority=5, deliver_at=NOW + 1), msg(CH, 5, priority=4),
        msg(CH2, 1, deliver_at=NOW + 2),
    ))
    store.apply(WriteBatch(deletes=[(CH, 4)], channels={CH: 6}))
    store, snap = reopen(backend, store)
    assert sorted(snap.specials) == [
        (CH, 1, 3, None), (CH, 3, 0, NOW + 9), (CH, 5, 4, None), (CH2, 1, 0, NOW + 2),
    ]
    store.apply(WriteBatch(truncates={CH: 2}, channels={CH: 6}))
    _, snap = reopen(backend, store)
    assert sorted(snap.specials) == [(CH, 3, 0, NOW + 9), (CH, 5, 4, None),
                                     (CH2, 1, 0, NOW + 2)]


# ----------------------------------------------------------------- read_range
@pytest.fixture
def ten(store: Storage) -> Storage:
    # Applied out of order and with a gap at 5, in two batches.
    store.apply(batch_of(*(msg(CH, s) for s in (7, 3, 10, 1, 9))))
    store.apply(batch_of(*(msg(CH, s) for s in (2, 8, 4, 6, 5))))
    store.apply(WriteBatch(deletes=[(CH, 5)], channels={CH: 11}))
    store.apply(batch_of(msg(CH2, 4)))
    return store


@pytest.mark.parametrize(
    ("lo", "hi", "limit", "expected"),
    [
        (1, 11, 100, [1, 2, 3, 4, 6, 7, 8, 9, 10]),
        (3, 7, 100, [3, 4, 6]),  # upper bound exclusive, deleted seq skipped
        (1, 11, 3, [1, 2, 3]),
        (4, 100, 2, [4, 6]),
        (10, 11, 5, [10]),
        (11, 20, 5, []),
        (5, 6, 5, []),
        (7, 7, 5, []),
        (8, 3, 5, []),
        (0, 2, 5, [1]),
        (-5, 3, 5, [1, 2]),
        (1, 11, 0, []),
    ],
)
def test_read_range_bounds_limit_and_order(
    ten: Storage, lo: int, hi: int, limit: int, expected: list[int]
) -> None:
    got = ten.read_range(CH, lo, hi, limit)
    assert seqs(got) == expected
    assert all(m.channel == CH for m in got)


def test_read_range_of_unknown_channel(ten: Storage) -> None:
    assert ten.read_range("orders/v1/none", 1, 100, 10) == []
    assert seqs(ten.read_range(CH2, 1, 100, 10)) == [4]


def test_read_range_pages_through_many_batches(backend: Factory, store: Storage) -> None:
    for first in range(1, 100, 7):
        store.apply(batch_of(*(msg(CH, s) for s in range(first, first + 7))))
    store.apply(WriteBatch(deletes=[(CH, 50), (CH, 51)], truncates={CH: 20},
                           channels={CH: 106}))
    st, _ = reopen(backend, store)
    got: list[int] = []
    nxt = 1
    while page := st.read_range(CH, nxt, 106, 9):
        got += seqs(page)
        nxt = page[-1].seq + 1
    assert got == [s for s in range(20, 106) if s not in (50, 51)]


@pytest.mark.parametrize("max_bytes", [1, 612, 1224, 1225, 100_000])
def test_read_range_stops_at_max_bytes_with_at_least_one_message(
    backend: Factory, store: Storage, max_bytes: int,
) -> None:
    """A page ends with the message that brings its ``read_weight`` to ``max_bytes``
    (so it has one at least), in the body cache's seqs and across segments and a removed one;
    ``page_end`` then says where the next page starts, and paging gets them all."""
    for first in range(1, 40, 8):  # 100 B each, 8 to a segment
        store.apply(batch_of(*(msg(CH, s, b"%03d" % s + b"." * 97)
                               for s in range(first, first + 8))))
    store.apply(WriteBatch(deletes=[(CH, 5)], channels={CH: 41}))
    st, _ = reopen(backend, store)
    live = [s for s in range(1, 41) if s != 5]
    weights = [read_weight(m) for m in st.read_range(CH, 1, 41, 1000)]
    per_page, total = 0, 0
    while per_page < len(live) and total < max_bytes:  # through the one reaching it
        total += weights[per_page]
        per_page += 1
    page = st.read_range(CH, 1, 41, 1000, max_bytes)
    assert seqs(page) == live[:per_page]
    nxt = page_end(page, 1000, max_bytes, 41)
    assert nxt == (live[per_page - 1] + 1 if per_page < len(live) else 41)
    got, nxt = [], 1
    while nxt < 41:
        page = st.read_range(CH, nxt, 41, 1000, max_bytes)
        got += seqs(page)
        nxt = page_end(page, 1000, max_bytes, 41)
    assert got == live
    assert seqs(st.read_range(CH, 1, 41, 3, max_bytes)) == live[:min(3, per_page)]
    assert seqs(st.read_range(CH, 1, 41, 1000)) == live  # no byte limit: as before


def test_read_range_by_bytes_gets_past_removed_seqs_and_holes(
    backend: Factory, store: Storage,
) -> None:
    """1 MiB messages a segment each, a removed one and a seq never stored (a failed
    publish's hole) before more: paging by bytes ends, with every live one, also from
    a start inside the hole (where a read begins at the segment before it)."""
    big = b"x" * (1 << 20)
    for s in range(1, 9):
        store.apply(batch_of(msg(CH, s, big)))
    store.apply(WriteBatch(deletes=[(CH, 8)], channels={CH: 10}))  # 9: never stored
    store.apply(batch_of(*(msg(CH, s, big) for s in (10, 11, 12))))
    st, _ = reopen(backend, store)
    for start, live in ((1, [*range(1, 8), 10, 11, 12]), (8, [10, 11, 12]),
                        (9, [10, 11, 12])):
        got, nxt = [], start
        for _ in range(20):  # a read that makes no progress would spin
            if nxt >= 13:
                break
            page = st.read_range(CH, nxt, 13, 2000, 8 << 20)
            got += seqs(page)
            nxt = page_end(page, 2000, 8 << 20, 13)
        assert got == live, start


def test_read_range_by_bytes_counts_headers_and_names(backend: Factory, store: Storage) -> None:
    """Tiny payloads with 8 KiB of headers each: a page stops by what they weigh in a
    frame (``read_weight``), not by their payloads alone."""
    headers = {f"h{i:02d}": "v" * 250 for i in range(32)}
    store.apply(batch_of(*(msg(CH, s, b"1", headers=headers) for s in range(1, 201))))
    st, _ = reopen(backend, store)
    page = st.read_range(CH, 1, 201, 1000, 100_000)
    weight = read_weight(page[0])
    assert weight > 8_000
    assert len(page) == -(-100_000 // weight)
    assert page_end(page, 1000, 100_000, 201) == len(page) + 1


# --------------------------------------------------------------------- groups
def test_group_definitions_and_states(backend: Factory, store: Storage) -> None:
    g1 = GroupDef("consume:g", "consume", ("orders/v1/*", "other/v1/1"))
    g2 = GroupDef("listen:c:audit", "listen", ("orders/*",))
    store.apply(batch_of(
        msg(CH, 1), msg(CH2, 1),
        group_defs={g1.key: g1, g2.key: g2},
        group_states={("consume:g", CH): (1, b"\x93\x90\x80\x90"), ("consume:g", CH2): (2, b""),
                      ("listen:c:audit", CH): (1, b"state")},
    ))
    st, snap = reopen(backend, store)
    assert sorted(snap.groups, key=lambda g: g.key) == [g1, g2]
    assert sorted(snap.group_states) == [
        ("consume:g", CH, 1, b"\x93\x90\x80\x90"), ("consume:g", CH2, 2, b""),
        ("listen:c:audit", CH, 1, b"state"),
    ]
    # Replace a definition and a state, drop a state, delete a group with its states.
    g1b = GroupDef("consume:g", "consume", ("orders/v1/*",))
    st.apply(WriteBatch(
        group_defs={g1.key: g1b, g2.key: None},
        group_states={("consume:g", CH): (5, b"new"), ("consume:g", CH2): None},
    ))
    st, snap = reopen(backend, st)
    assert snap.groups == [g1b]
    assert snap.group_states == [("consume:g", CH, 5, b"new")]
    # Deleting a group drops its states first: states in the same batch stay.
    st.apply(WriteBatch(group_defs={g1.key: None},
                        group_states={("consume:g", CH2): (7, b"again")}))
    _, snap = reopen(backend, st)
    assert snap.groups == [] and snap.group_states == [("consume:g", CH2, 7, b"again")]


# ---------------------------------------------------------------------- dedup
def test_dedup_entries_survive_until_they_expire(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1), dedup=[
        (CH, "k1", NOW + 100, 1, "id-1"), (CH, "k2", NOW + 10, 1, "id-1"),
        ("orders/v1/*", "k1", NOW + 100, 0, ""),
    ]))
    store.apply(WriteBatch(dedup=[(CH, "k2", NOW + 50, 1, "id-1")]))  # refreshed
    st, snap = reopen(backend, store, now=NOW + 20)
    assert sorted(snap.dedup) == sorted([
        (CH, "k1", NOW + 100, 1, "id-1"), (CH, "k2", NOW + 50, 1, "id-1"),
        ("orders/v1/*", "k1", NOW + 100, 0, ""),
    ])
    st, snap = reopen(backend, st, now=NOW + 50)  # expires_at itself is past
    assert sorted(snap.dedup) == sorted([(CH, "k1", NOW + 100, 1, "id-1"),
                                         ("orders/v1/*", "k1", NOW + 100, 0, "")])
    _, snap = reopen(backend, st, now=NOW + 100)
    assert snap.dedup == []


# --------------------------------------------------- registry and ownership
def test_clients_and_credentials_put_replace_and_drop(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(clients={"alice": b"a1", "bob": b"b1"},
                           credentials={"c1": b"cred-1", "c2": b"cred-2"}))
    store.apply(WriteBatch(clients={"alice": b"a2", "bob": None, "nobody": None},
                           credentials={"c1": None, "c3": b"cred-3"}))
    _, snap = reopen(backend, store)
    assert snap.clients == [b"a2"]
    assert sorted(snap.credentials) == [b"cred-2", b"cred-3"]


def test_reservations_put_and_drop(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(reservations={CH: "alice", CH2: "bob"}))
    store.apply(WriteBatch(reservations={CH: "carol", CH2: None}))
    _, snap = reopen(backend, store)
    assert snap.reservations == {CH: "carol"}


def test_writers_fences_and_dropped_fences(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(writers={"w1": "alice", "w2": "bob"},
                           fences={("w1", CH): 1, ("w1", CH2): 2, ("w2", CH): 7}))
    store.apply(WriteBatch(fences={("w1", CH): 3}))  # replaced
    store, snap = reopen(backend, store)
    assert sorted(snap.fences) == [("w1", CH, 3), ("w1", CH2, 2), ("w2", CH, 7)]
    assert snap.writers == {"w1": "alice", "w2": "bob"}
    # A writer freed: its fences go; fences set in the same batch are kept.
    store.apply(WriteBatch(writers={"w1": None}, dropped_fences=["w1", "w9"]))
    store.apply(WriteBatch(dropped_fences=["w2"], fences={("w2", CH2): 1}))
    _, snap = reopen(backend, store)
    assert snap.fences == [("w2", CH2, 1)]
    assert snap.writers == {"w2": "bob"}


def test_meta_put_and_replace(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(meta={"listen_keys": "escaped", "lineage:w1": ""}))
    store.apply(WriteBatch(meta={"lineage:w1": "w0"}))
    _, snap = reopen(backend, store)
    assert snap.meta == {"listen_keys": "escaped", "lineage:w1": "w0"}


def test_a_meta_row_set_to_none_is_dropped(backend: Factory, store: Storage) -> None:
    """Explicit stream ids' points (core/stream_ids.py) are dropped as their messages go."""
    store.apply(WriteBatch(meta={"resp-id/a/v1/x/3": "9-0", "resp-id/a/v1/x/7": "12-4"}))
    store.apply(WriteBatch(meta={"resp-id/a/v1/x/3": None}))
    _, snap = reopen(backend, store)
    assert snap.meta == {"resp-id/a/v1/x/7": "12-4"}


def test_used_tokens_are_returned_until_they_expire(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(used_tokens=[("jti-1", NOW + 10), ("jti-2", NOW + 60)]))
    store.apply(WriteBatch(used_tokens=[("jti-3", NOW + 30)]))
    st, snap = reopen(backend, store)
    assert sorted(snap.used_tokens) == [("jti-1", NOW + 10), ("jti-2", NOW + 60),
                                        ("jti-3", NOW + 30)]
    st, snap = reopen(backend, st, now=NOW + 30)  # the expiry itself is past
    assert snap.used_tokens == [("jti-2", NOW + 60)]


def producer(client: str, channel: str, last: int, used: float = NOW,
             refused: bytes | None = None) -> tuple[Any, ...]:
    """A core.producers.ProducerState.row()."""
    return (client, "p1", channel, last, 1, last, 10, "hash", used, refused)


def test_producers_rows_put_replace_and_drop(backend: Factory, store: Storage) -> None:
    a, b = producer("alice", CH, 3), producer("bob", CH, 1, refused=b"\x91\x93\x01\x02\xcd")
    store.apply(WriteBatch(producers={("alice", "p1", CH): a, ("bob", "p1", CH): b}))
    store, snap = reopen(backend, store)
    assert sorted(snap.producers) == [a, b]
    a2 = producer("alice", CH, 9, used=NOW + 5)
    store.apply(WriteBatch(producers={("alice", "p1", CH): a2, ("bob", "p1", CH): None}))
    _, snap = reopen(backend, store)
    assert snap.producers == [a2]


# ------------------------------------------------------- staged transactions
SENDS_1 = [Send(CH, b'{"n": 1}', headers={"h": "v"}, pseq=4), Send(CH2, b"\x00", raw=True)]
SENDS_2 = [Send(CH, b"2", priority=3, ttl=5.0, delay=1.5, dedup="d", key="k")]


def test_staged_parts_unstaged_and_answers(backend: Factory, store: Storage) -> None:
    store.apply(WriteBatch(staged=[("alice", "t1", 1, SENDS_1, NOW),
                                   ("alice", "t1", 2, SENDS_2, NOW + 1),
                                   ("alice", "t2", 1, SENDS_2, NOW + 2),
                                   ("bob", "t1", 1, SENDS_1, NOW + 3)]))
    store, snap = reopen(backend, store)
    assert snap.staged == [  # in (owner, txn, part) order, sends as they were staged
        ("alice", "t1", 1, SENDS_1, NOW), ("alice", "t1", 2, SENDS_2, NOW + 1),
        ("alice", "t2", 1, SENDS_2, NOW + 2), ("bob", "t1", 1, SENDS_1, NOW + 3),
    ]
    # t1 commits: its parts go and its answer stays as part 0; t2 is aborted.
    answer = {"stored": [[CH, 5, "id-5"], [CH2, 1, "id-1"]], "n": 2}
    store.apply(WriteBatch(unstaged=[("alice", "t1"), ("alice", "t2")],
                           txn_done=[("alice", "t1", answer, NOW + 4)]))
    store, snap = reopen(backend, store)
    assert snap.staged == [("alice", "t1", 0, answer, NOW + 4),
                           ("bob", "t1", 1, SENDS_1, NOW + 3)]
    # Staged, unstaged and answered in one batch: only the answer remains; dropping the
    # transaction later drops its answer too.
    store.apply(WriteBatch(staged=[("bob", "t2", 1, SENDS_2, NOW + 5)],
                           unstaged=[("bob", "t2"), ("alice", "t1")],
                           txn_done=[("bob", "t2", {"n": 1}, NOW + 5)]))
    _, snap = reopen(backend, store)
    assert snap.staged == [("bob", "t1", 1, SENDS_1, NOW + 3), ("bob", "t2", 0, {"n": 1},
                                                                NOW + 5)]


# -------------------------------------------------------------------- expired
def test_expired(backend: Factory, store: Storage) -> None:
    first = msg(CH, 1, b'"a"', headers={"h": "1"}, published_at=5.0, expires_at=NOW + 1,
                key="k")
    store.apply(batch_of(
        first, msg(CH, 2), msg(CH, 3, expires_at=NOW + 5),
        msg(CH2, 1, expires_at=NOW + 2), msg(CH, 4, expires_at=NOW + 100),
    ))
    assert store.expired(NOW, 10) == []
    got = store.expired(NOW + 1, 10)
    assert [fields(m) for m in got] == [fields(first)]  # with the body, to dead-letter it
    assert keys(store.expired(NOW + 5, 10)) == [(CH, 1), (CH, 3), (CH2, 1)]
    assert keys(store.expired(NOW + 5, 10)) == [(CH, 1), (CH, 3), (CH2, 1)]  # until removed
    assert len(store.expired(NOW + 5, 2)) == 2
    store.apply(WriteBatch(deletes=[(CH, 1)], channels={CH: 5}))
    assert keys(store.expired(NOW + 5, 10)) == [(CH, 3), (CH2, 1)]
    st, _ = reopen(backend, store)
    assert keys(st.expired(NOW + 5, 10)) == [(CH, 3), (CH2, 1)]
    st.apply(WriteBatch(truncates={CH: 4}, deletes=[(CH2, 1)], channels={CH: 5, CH2: 2}))
    assert st.expired(NOW + 5, 10) == []
    assert keys(st.expired(NOW + 100, 10)) == [(CH, 4)]
    st.apply(batch_of(msg(CH, 5, expires_at=NOW + 3)))  # newer, due sooner
    assert keys(st.expired(NOW + 100, 10)) == [(CH, 4), (CH, 5)]


# ------------------------------------------------------------------ retention
@pytest.fixture
def published(store: Storage) -> Storage:
    # Seqs 1..9 published at t = seq, in three batches.
    for first in (1, 4, 7):
        store.apply(batch_of(*(msg(CH, s, published_at=float(s))
                               for s in range(first, first + 3))))
    return store


@pytest.mark.parametrize(
    ("below", "cutoff", "expected"),
    [
        (10, 100.0, 10),  # everything is old enough
        (10, 5.0, 5),  # 1..4 published before 5
        (10, 5.5, 6),
        (10, 4.0, 4),  # at a batch's first message
        (10, 1.0, None),  # nothing published before the cutoff
        (10, 0.5, None),
        (5, 100.0, 5),  # never past ``below``
        (4, 100.0, 4),
        (2, 100.0, 2),
        (1, 100.0, None),
    ],
)
def test_retained_until(published: Storage, below: int, cutoff: float,
                        expected: int | None) -> None:
    assert published.retained_until(CH, below, cutoff) == expected


def test_retained_until_after_removals_and_restart(backend: Factory,
                                                   published: Storage) -> None:
    assert published.retained_until("orders/v1/none", 10, 100.0) is None
    published.apply(WriteBatch(truncates={CH: 4}, channels={CH: 10}))
    st, _ = reopen(backend, published)
    assert st.retained_until(CH, 10, 6.5) == 7
    assert st.retained_until(CH, 10, 3.5) is None  # what was published before is gone


# ----------------------------------------------------------------------- size
def _settled_size(store: Storage) -> int:
    """``size_bytes`` once what a WAL holds is in the database file: SQLite's WAL is
    written out ahead (zeros), so commits fill it without the file growing."""
    checkpoint = getattr(store, "checkpoint", None)
    if checkpoint is not None:
        checkpoint(truncate=True)
    return store.size_bytes()


def test_size_bytes_grows_with_data(store: Storage) -> None:
    before = _settled_size(store)
    store.apply(batch_of(*(msg(CH, s, b"x" * 4096) for s in range(1, 51))))
    assert _settled_size(store) > before + 50 * 4096 // 2


def _check_space(space: dict[str, Any], max_size: int | None) -> None:
    assert space["max_size"] == max_size and space["used"] >= 0 and space["disk_free"] >= 0
    room = space["disk_free"] if max_size is None else max(0, max_size - space["used"])
    assert space["free"] == min(space["disk_free"], room)


@pytest.mark.parametrize("max_size", [None, 4 << 20])
def test_space(backend: Factory, max_size: int | None) -> None:
    st = backend(max_size=max_size, reserve=0)
    st.open(NOW)
    before = st.space()
    _check_space(before, max_size)
    st.apply(batch_of(*(msg(CH, s, b"x" * 4096) for s in range(1, 101))))
    after = st.space()
    _check_space(after, max_size)
    assert after["used"] >= before["used"] + 100 * 4096
    if max_size is not None:
        assert after["free"] <= before["free"] - 100 * 4096


# ------------------------------------------------------ restoring everything
def _everything() -> tuple[WriteBatch, Snapshot]:
    """A batch with every kind of record, and what a restart finds of it."""
    g = GroupDef("consume:g", "consume", ("orders/v1/*",))
    m1 = msg(CH, 1, headers={"a": "b"}, priority=2, published_at=NOW, expires_at=NOW + 60)
    m2 = msg(CH, 2, deliver_at=NOW + 5, key="k")
    answer = {"stored": [[CH, 1, m1.id]]}
    prod = producer("alice", CH, 2)
    batch = batch_of(
        m1, m2, msg(CH, 3), msg(CH2, 1), deletes=[(CH, 3)], channels={"empty/v1/1": 1},
        group_defs={g.key: g}, group_states={(g.key, CH): (1, b"pending")},
        dedup=[(CH, "d1", NOW + 60, 1, m1.id), (CH, "d0", NOW - 1, 2, m2.id)],
        clients={"alice": b"client"}, credentials={"cr": b"credential"},
        reservations={CH2: "alice"}, fences={("w1", CH): 4}, writers={"w1": "alice"},
        meta={"format": "2"}, used_tokens=[("j1", NOW + 60), ("j0", NOW - 1)],
        producers={prod[:3]: prod},
        staged=[("alice", "t1", 1, SENDS_1, NOW), ("alice", "t2", 1, SENDS_2, NOW)],
        txn_done=[("alice", "t0", answer, NOW)],
    )
    snap = Snapshot(
        channels=[ChannelRecord(CH, 4, 1, 2, gone=[3]), ChannelRecord(CH2, 2, 1, 1),
                  ChannelRecord("empty/v1/1", 1, 1, 0)],
        specials=[(CH, 1, 2, None), (CH, 2, 0, NOW + 5)],
        groups=[g], group_states=[(g.key, CH, 1, b"pending")],
        dedup=[(CH, "d1", NOW + 60, 1, m1.id)],
        clients=[b"client"], credentials=[b"credential"], reservations={CH2: "alice"},
        fences=[("w1", CH, 4)], writers={"w1": "alice"}, meta={"format": "2"},
        used_tokens=[("j1", NOW + 60)], producers=[prod],
        staged=[("alice", "t0", 0, answer, NOW), ("alice", "t1", 1, SENDS_1, NOW),
                ("alice", "t2", 1, SENDS_2, NOW)],
    )
    return batch, snap


def test_a_restart_restores_everything(backend: Factory, store: Storage) -> None:
    batch, expected = _everything()
    store.apply(batch)
    st, snap = reopen(backend, store)
    assert snap == expected
    assert seqs(st.read_range(CH, 1, 10, 10)) == [1, 2]
    st, snap = reopen(backend, st)  # and again: opening changed nothing
    assert snap == expected


def test_a_crash_loses_nothing_committed(backend: Factory, store: Storage) -> None:
    batch, expected = _everything()
    store.apply(batch)
    survivor = backend()  # the old instance is never closed
    assert survivor.open(NOW) == expected


# ---------------------------------------------------------------- atomicity
def _bad_batch() -> WriteBatch:
    """Every kind of record, and a message that cannot be stored: nothing may stay."""
    batch, _ = _everything()
    batch.messages.append(Msg(CH, 4, "id-bad", object()))  # type: ignore[arg-type]
    batch.channels["new/v1/1"] = 1
    batch.truncates[CH2] = 2
    batch.dropped_fences.append("w0")
    batch.unstaged.append(("alice", "t9"))
    batch.group_defs["consume:old"] = None
    return batch


def _seed(store: Storage) -> None:
    g = GroupDef("consume:old", "consume", (CH,))
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), msg(CH2, 1), group_defs={g.key: g},
                         group_states={(g.key, CH): (1, b"")}, fences={("w0", CH): 1},
                         staged=[("alice", "t9", 1, SENDS_1, NOW)]))


def test_a_failing_batch_changes_nothing_and_raises(backend: Factory, store: Storage) -> None:
    _seed(store)
    before = peek(backend)
    size = store.size_bytes()
    with pytest.raises(StorageUnavailable) as info:
        store.apply(_bad_batch())
    assert isinstance(info.value, StorageError)
    assert seqs(store.read_range(CH, 1, 100, 100)) == [1, 2]
    assert store.size_bytes() == size
    st, snap = reopen(backend, store)
    assert snap == before
    assert seqs(st.read_range(CH, 1, 100, 100)) == [1, 2]


def test_the_same_instance_works_after_a_failed_batch(backend: Factory, store: Storage) -> None:
    _seed(store)
    with pytest.raises(StorageUnavailable):
        store.apply(_bad_batch())
    store.apply(batch_of(msg(CH, 3)))
    _, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 4, 1, 3)


def test_a_channel_created_in_a_failed_batch_can_be_created_again(
    backend: Factory, store: Storage
) -> None:
    new = "orders/v1/new"
    with pytest.raises(StorageUnavailable):
        store.apply(batch_of(Msg(new, 1, "id-bad", object())))  # type: ignore[arg-type]
    assert new not in records(peek(backend))
    store.apply(batch_of(msg(new, 1)))
    st, snap = reopen(backend, store)
    assert new in records(snap)
    assert seqs(st.read_range(new, 1, 10, 10)) == [1]


@pytest.mark.parametrize("what", ["messages", "truncates"])
def test_a_batch_naming_an_unknown_channel_fails_as_a_storage_error(
    backend: Factory, store: Storage, what: str
) -> None:
    _seed(store)
    before = peek(backend)
    bad = WriteBatch(group_states={("consume:old", CH): (9, b"x")})
    if what == "messages":  # with no next seq: the batch does not create the channel
        bad.messages.append(msg("never/v1/1", 1))
    else:
        bad.truncates["never/v1/1"] = 3
    with pytest.raises(StorageError):
        store.apply(bad)
    assert peek(backend) == before


# ------------------------------------------------------------------ quota
def _fill(store: Storage, channel: str = CH, first: int = 1,
          size: int = 16 << 10) -> tuple[int, StorageError]:
    """Commit batches of four ``size``-byte messages until one fails: (the last seq
    stored, the error)."""
    seq = first - 1
    while True:
        try:
            store.apply(batch_of(*(msg(channel, seq + i, b"x" * size) for i in (1, 2, 3, 4))))
        except StorageError as exc:
            return seq, exc
        seq += 4
        assert seq < 10_000, "max_size never filled"


def test_max_size_refuses_a_batch_whole_and_says_so(backend: Factory) -> None:
    store = backend(max_size=2 << 20, reserve=256 << 10)
    store.open(NOW)
    _seed(store)
    last, exc = _fill(store, first=3)
    assert isinstance(exc, StorageFull) and isinstance(exc, StorageError)
    assert exc.code == ErrorCode.STORAGE_FULL
    assert "max_size" in exc.message and "nothing was stored" in exc.message
    assert exc.detail["free_bytes"] >= 0 and exc.detail["disk_free_bytes"] >= 0
    assert exc.detail["reserve_released"] is True and exc.detail["max_size"] == 2 << 20
    assert exc.detail["cause"]
    # Exactly what was committed, nothing of the failed batch.
    st = backend()
    snap = st.open(NOW)
    assert records(snap)[CH].count == last and records(snap)[CH].next_seq == last + 1
    assert seqs(st.read_range(CH, last - 1, last + 10, 10)) == [last - 1, last]
    assert snap.group_states == [("consume:old", CH, 1, b"")]
    # Then a smaller batch (what acks write) finds room: the reserve was given back.
    store.apply(WriteBatch(group_states={("consume:old", CH): (7, b"state")}))
    assert peek(backend).group_states == [("consume:old", CH, 7, b"state")]
    # Until the reserve is used up too; it is given back only once.
    _, again = _fill(store, CH2, first=2)
    assert isinstance(again, StorageFull) and again.detail["reserve_released"] is False
    room, space = store.probe()
    assert not room and space["used"] > 0
    _check_space(space, 2 << 20)


def test_a_full_store_refuses_every_kind_of_record(backend: Factory) -> None:
    store = backend(max_size=2 << 20, reserve=0)
    store.open(NOW)
    _seed(store)
    _fill(store, first=3)
    before = peek(backend)
    big = b"x" * (64 << 10)
    with pytest.raises(StorageFull):
        store.apply(WriteBatch(group_states={("consume:old", CH2): (1, big)},
                               clients={"alice": big}, meta={"m": "v"},
                               used_tokens=[("j", NOW + 9)], unstaged=[("alice", "t9")]))
    assert peek(backend) == before


def test_probe_finds_room_once_messages_are_removed(backend: Factory) -> None:
    store = backend(max_size=2 << 20, reserve=256 << 10)
    store.open(NOW)
    last, exc = _fill(store)
    assert isinstance(exc, StorageFull)
    assert store.probe()[0] is False
    store.apply(WriteBatch(truncates={CH: last + 1}, channels={CH: last + 1}))  # all settled
    room, space = store.probe()
    assert room and space["free"] > 1 << 20
    more, exc = _fill(store, first=last + 1)  # the room is used again
    assert isinstance(exc, StorageFull) and more - last > last // 2
    assert exc.detail["reserve_released"] is True  # probe took the reserve back


def test_raising_max_size_on_a_running_store_makes_room(backend: Factory) -> None:
    store = backend(max_size=1 << 20, reserve=0)
    store.open(NOW)
    last, exc = _fill(store)
    assert isinstance(exc, StorageFull) and store.probe()[0] is False
    store.max_size = 4 << 20  # what a reload does
    assert store.probe()[0] is True
    store.apply(batch_of(msg(CH, last + 1, b"y" * (64 << 10))))


def test_full_message_names_the_store_and_its_space(backend: Factory) -> None:
    store = backend(max_size=2 << 20, reserve=0)
    store.open(NOW)
    text = store.full_message(store.space(), "the cause")
    assert "(the cause)" in text and "max_size" in text and "nothing was stored" in text
    where = str(Path(store.path).parent) if store.backend == "sqlite" else store.path
    assert where in text  # the data directory (SQLite), the store's URL (memory, Redis)
    unlimited = backend()
    assert "[storage] max_size" not in unlimited.full_message(unlimited.space(), "full")


# -------------------------------------------------------------- concurrency
def test_a_reader_thread_sees_whole_batches(backend: Factory, store: Storage) -> None:
    """The writer thread applies while a reader thread reads: never half a batch."""
    started, done = threading.Event(), threading.Event()
    seen: list[list[int]] = []

    def read() -> None:
        while True:
            stop = done.is_set()
            seen.append(seqs(store.read_range(CH, 1, 1_000, 1_000)))
            started.set()
            if stop:
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        started.wait(10)
        for first in range(1, 150, 5):
            store.apply(batch_of(*(msg(CH, s) for s in range(first, first + 5))))
    finally:
        done.set()
        reader.join()
    assert all(len(s) % 5 == 0 and s == list(range(1, len(s) + 1)) for s in seen)
    assert len(seen[-1]) == 150


# ------------------------------------------------------- memory: the registry
def test_memory_stores_are_per_name_and_outlive_instances() -> None:
    a, b = f"reg-{uuid.uuid4().hex}", f"reg-{uuid.uuid4().hex}"
    try:
        MemoryStorage(a).apply(batch_of(msg(CH, 1)))
        assert records(MemoryStorage(a).open(NOW))[CH].count == 1
        assert MemoryStorage(b).open(NOW) == Snapshot()
        via_url = open_storage(Settings(storage=f"memory://{a}"))
        assert via_url.path == f"memory://{a}" and records(via_url.open(NOW))[CH].count == 1
    finally:
        MemoryStorage.forget(a)
        MemoryStorage.forget(b)


def test_memory_forget_loses_the_store_and_drop_all_every_store() -> None:
    name = f"forget-{uuid.uuid4().hex}"
    old = MemoryStorage(name)
    old.apply(batch_of(msg(CH, 1)))
    MemoryStorage.forget(name)
    assert MemoryStorage(name).open(NOW) == Snapshot()  # a new, empty disk
    old.apply(batch_of(msg(CH, 2)))  # the crashed process writes where nobody looks
    assert MemoryStorage(name).open(NOW) == Snapshot()
    MemoryStorage(name).apply(batch_of(msg(CH2, 1)))
    MemoryStorage.drop_all()
    assert MemoryStorage(name).open(NOW) == Snapshot()
    MemoryStorage.forget(name)
