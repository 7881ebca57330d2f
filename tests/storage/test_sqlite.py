"""The storage contract, run against SQLiteStorage.

Every test writes through ``apply`` and reads back through a *new* storage instance
on the same directory (``reopen``), as the broker does after a restart. The
``backend`` fixture is parametrized so other backends can join the same contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from minou.core.group import GroupDef
from minou.core.log import Msg
from minou.core.writes import WriteBatch
from minou.errors import ErrorCode, StorageError, StorageFull, StorageUnavailable
from minou.storage.base import ChannelRecord, Snapshot, Storage
from minou.storage.sqlite import RESERVE_FILE, SQLiteStorage

CH = "orders/v1/1"
CH2 = "orders/v1/2"
NOW = 1_000.0

Factory = Callable[[], Storage]


@pytest.fixture(params=["sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    opened: list[Storage] = []

    def make() -> Storage:
        if request.param == "sqlite":
            st: Storage = SQLiteStorage(tmp_path / "data")
        else:  # pragma: no cover - other backends join here
            raise AssertionError(request.param)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


@pytest.fixture
def store(backend: Factory) -> Storage:
    st = backend()
    st.open(NOW)
    return st


def reopen(backend: Factory, old: Storage, now: float = NOW) -> tuple[Storage, Snapshot]:
    old.close()
    st = backend()
    return st, st.open(now)


def msg(channel: str, seq: int, data: bytes | None = None, **kw) -> Msg:
    return Msg(channel, seq, f"id-{channel}-{seq}", data if data is not None else b"%d" % seq,
               **kw)


def batch_of(*msgs: Msg, **kw) -> WriteBatch:
    channels: dict[str, int] = {}
    for m in msgs:
        channels[m.channel] = max(channels.get(m.channel, 1), m.seq + 1)
    channels.update(kw.pop("channels", {}))
    return WriteBatch(messages=list(msgs), channels=channels, **kw)


def records(snap: Snapshot) -> dict[str, ChannelRecord]:
    return {r.name: r for r in snap.channels}


def fields(m: Msg) -> tuple:
    return (m.channel, m.seq, m.id, m.data, m.raw, m.headers, m.priority, m.published_at,
            m.expires_at, m.deliver_at, m.key)


# ------------------------------------------------------------------- round trip
def test_a_fresh_store_is_empty(store: Storage) -> None:
    snap = store.open(NOW)
    assert snap.channels == [] and snap.groups == [] and snap.group_states == []
    assert snap.specials == [] and snap.dedup == [] and snap.tail == []
    assert store.read_range(CH, 1, 100, 10) == []
    assert store.expired(NOW, 10) == []


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
    assert sorted(snap.specials) == [(CH, 2, 7, 50.0)]
    got = st.read_range(CH, 1, 100, 100)
    assert [fields(m) for m in got] == [fields(full), fields(raw)]
    assert [fields(m) for m in st.read_range(CH2, 1, 100, 100)] == [fields(other)]


def test_channel_without_messages_and_next_seq_never_goes_down(
    backend: Factory, store: Storage
) -> None:
    store.apply(WriteBatch(channels={CH: 1}))
    store.apply(batch_of(msg(CH2, 1), msg(CH2, 2), msg(CH2, 3)))
    store.apply(WriteBatch(channels={CH2: 2}))  # a stale, lower value is ignored
    _, snap = reopen(backend, store)
    recs = records(snap)
    assert recs[CH] == ChannelRecord(CH, 1, 1, 0)
    assert recs[CH2].next_seq == 4


def test_reapplying_a_message_is_idempotent(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1, b"1")))
    store.apply(batch_of(msg(CH, 1, b"1")))
    st, snap = reopen(backend, store)
    assert records(snap)[CH].count == 1
    assert len(st.read_range(CH, 1, 10, 10)) == 1


# ------------------------------------------------------------ deletes/truncates
def test_deletes_and_truncates(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(*(msg(CH, s) for s in range(1, 8)), *(msg(CH2, s) for s in (1, 2))))
    store.apply(WriteBatch(deletes=[(CH, 5), (CH2, 1), ("orders/v1/unknown", 1)],
                           truncates={CH: 3}))
    st, snap = reopen(backend, store)
    recs = records(snap)
    assert (recs[CH].first_seq, recs[CH].count, recs[CH].next_seq) == (3, 4, 8)
    assert recs[CH].gone == [5]  # the holes inside [first_seq, next_seq) are named
    assert (recs[CH2].first_seq, recs[CH2].count, recs[CH2].gone) == (2, 1, [])
    assert [m.seq for m in st.read_range(CH, 1, 100, 100)] == [3, 4, 6, 7]


def test_truncating_everything_keeps_the_channel_and_its_next_seq(
    backend: Factory, store: Storage
) -> None:
    store.apply(batch_of(msg(CH, 1), msg(CH, 2)))
    store.apply(WriteBatch(truncates={CH: 3}))
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 3, 3, 0)
    assert st.read_range(CH, 1, 100, 100) == []


def test_deleted_special_message_is_no_longer_special(backend: Factory, store: Storage) -> None:
    store.apply(batch_of(msg(CH, 1, priority=3), msg(CH, 2, priority=4)))
    store.apply(WriteBatch(deletes=[(CH, 1)]))
    _, snap = reopen(backend, store)
    assert snap.specials == [(CH, 2, 4, None)]


# ----------------------------------------------------------------------- groups
def test_group_definitions_and_states(backend: Factory, store: Storage) -> None:
    g1 = GroupDef("consume:g", "consume", ("orders/v1/*", "other/v1/1"), "oldest")
    g2 = GroupDef("listen:c:audit", "listen", ("orders/*",), "new")
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
    # Update one state, drop another, delete a whole group.
    g1b = GroupDef("consume:g", "consume", ("orders/v1/*",), "oldest")
    st.apply(WriteBatch(
        group_defs={g1.key: g1b, g2.key: None},
        group_states={("consume:g", CH): (5, b"new"), ("consume:g", CH2): None},
    ))
    _, snap = reopen(backend, st)
    assert snap.groups == [g1b]
    assert snap.group_states == [("consume:g", CH, 5, b"new")]


# ------------------------------------------------------------------------ dedup
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
    _, snap = reopen(backend, st, now=NOW + 100)
    assert snap.dedup == []


# ------------------------------------------------------------------- read_range
@pytest.fixture
def ten(store: Storage) -> Storage:
    # Applied out of order and with a gap at 5, in two batches.
    store.apply(batch_of(*(msg(CH, s) for s in (7, 3, 10, 1, 9))))
    store.apply(batch_of(*(msg(CH, s) for s in (2, 8, 4, 6, 5))))
    store.apply(WriteBatch(deletes=[(CH, 5)]))
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
        (0, 2, 5, [1]),
    ],
)
def test_read_range_bounds_limit_and_order(
    ten: Storage, lo: int, hi: int, limit: int, expected: list[int]
) -> None:
    got = ten.read_range(CH, lo, hi, limit)
    assert [m.seq for m in got] == expected
    assert all(m.channel == CH for m in got)


def test_read_range_of_unknown_channel(ten: Storage) -> None:
    assert ten.read_range("orders/v1/none", 1, 100, 10) == []
    assert [m.seq for m in ten.read_range(CH2, 1, 100, 10)] == [4]


# ---------------------------------------------------------------------- expired
def keys(msgs: list[Msg]) -> list[tuple[str, int]]:
    return sorted((m.channel, m.seq) for m in msgs)


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
    assert len(store.expired(NOW + 5, 2)) == 2
    store.apply(WriteBatch(deletes=[(CH, 1)]))
    st, _ = reopen(backend, store)
    assert keys(st.expired(NOW + 5, 10)) == [(CH, 3), (CH2, 1)]


# ---------------------------------------------------------------------- failure
def _bad_batch() -> WriteBatch:
    # The second message cannot be stored: the whole transaction fails.
    return batch_of(msg(CH, 3), Msg(CH, 4, "id-bad", object()),  # type: ignore[arg-type]
                    deletes=[(CH, 1)], truncates={CH: 2},
                    group_defs={"consume:g": None},
                    group_states={("consume:g", CH): (9, b"x")},
                    dedup=[(CH, "k", NOW + 100, 3, "id")])


def _seed(store: Storage) -> None:
    g = GroupDef("consume:g", "consume", (CH,), "oldest")
    store.apply(batch_of(msg(CH, 1), msg(CH, 2), group_defs={g.key: g},
                         group_states={("consume:g", CH): (1, b"")}))


def test_a_failing_batch_changes_nothing_and_raises(backend: Factory, store: Storage) -> None:
    _seed(store)
    with pytest.raises(StorageUnavailable) as info:
        store.apply(_bad_batch())
    assert isinstance(info.value, StorageError)
    assert info.value.__cause__ is not None
    assert [m.seq for m in store.read_range(CH, 1, 100, 100)] == [1, 2]
    st, snap = reopen(backend, store)
    assert records(snap)[CH] == ChannelRecord(CH, 3, 1, 2)
    assert [g.key for g in snap.groups] == ["consume:g"]
    assert snap.group_states == [("consume:g", CH, 1, b"")]
    assert snap.dedup == []
    assert [m.seq for m in st.read_range(CH, 1, 100, 100)] == [1, 2]


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
    # Regression: the cid of a channel created in a rolled-back transaction stayed cached,
    # so later messages were written under a cid with no channels row.
    new = "orders/v1/new"
    with pytest.raises(StorageUnavailable):
        store.apply(batch_of(Msg(new, 1, "id-bad", object())))  # type: ignore[arg-type]
    store.apply(batch_of(msg(new, 1)))
    st, snap = reopen(backend, store)
    assert new in records(snap)
    assert [m.seq for m in st.read_range(new, 1, 10, 10)] == [1]


def test_open_of_a_corrupt_file_raises_storage_unavailable(tmp_path: Path) -> None:
    data = tmp_path / "bad"
    data.mkdir()
    (data / "minou.db").write_bytes(b"this is not a database" * 100)
    st = SQLiteStorage(data)
    try:
        with pytest.raises(StorageUnavailable):
            st.open(NOW)
    finally:
        st.close()


# ------------------------------------------------------------------------- misc
def test_size_bytes_grows_with_data(store: Storage) -> None:
    before = store.size_bytes()
    assert before > 0
    store.apply(batch_of(*(msg(CH, s, b"x" * 4096) for s in range(1, 51))))
    assert store.size_bytes() > before + 50 * 4096 // 2


def test_path_names_the_database_file(tmp_path: Path) -> None:
    st = SQLiteStorage(tmp_path / "d", filename="x.db")
    try:
        st.open(NOW)
        assert st.path == str(tmp_path / "d" / "x.db")
        assert Path(st.path).exists()
    finally:
        st.close()


def test_next_seq_comes_from_stored_messages_and_survives_removing_them(
    backend: Factory, store: Storage
) -> None:
    # Created with next seq 1; later publishes need not rewrite the channel row.
    store.apply(WriteBatch(channels={CH: 1}))
    store.apply(WriteBatch(messages=[msg(CH, s) for s in (1, 2, 3)]))
    store, snap = reopen(backend, store)
    assert [(c.name, c.next_seq, c.count) for c in snap.channels] == [(CH, 4, 3)]
    # Removing every message stores the next seq with the removal: no seq is reused.
    store.apply(WriteBatch(truncates={CH: 4}, channels={CH: 4}))
    store, snap = reopen(backend, store)
    assert [(c.name, c.next_seq, c.first_seq, c.count) for c in snap.channels] == [
        (CH, 4, 4, 0)]


# -------------------------------------------------------------------- full disk
def _fill(store: SQLiteStorage, channel: str = CH, size: int = 16 << 10) -> tuple[int, Exception]:
    """Commit batches of ``size``-byte messages until one fails; (last stored seq, error)."""
    seq = 0
    while True:
        try:
            store.apply(batch_of(*(msg(channel, seq + i, b"x" * size) for i in (1, 2, 3, 4))))
        except StorageError as exc:
            return seq, exc
        seq += 4
        assert seq < 10_000, "max_size never filled"


def _integrity(path: str) -> str:
    import sqlite3

    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def test_max_size_fails_like_a_full_disk_and_keeps_every_committed_batch(
    tmp_path: Path,
) -> None:
    data = tmp_path / "quota"
    store = SQLiteStorage(data, max_size=2 << 20, reserve=256 << 10)
    store.open(NOW)
    assert (data / RESERVE_FILE).stat().st_size == 256 << 10
    last, exc = _fill(store)
    # The precise error, with SQLite's own words as the cause (not "cannot rollback").
    assert isinstance(exc, StorageFull) and isinstance(exc, StorageError)
    assert exc.code == ErrorCode.STORAGE_FULL
    assert "database or disk is full" in str(exc.__cause__)
    assert str(data) in exc.message and "max_size" in exc.message
    assert exc.detail["data_dir"] == str(data) and exc.detail["free_bytes"] >= 0
    assert exc.detail["reserve_released"] is True
    assert not (data / RESERVE_FILE).exists()  # given back for the writes that must go on
    # The reserve's pages let small state writes through; the same connection works on.
    store.apply(WriteBatch(group_states={("consume:g", CH): (1, b"state")}))
    # Within the reserve's pages, until they are used up too; no reserve is given twice.
    more, again = _fill(store, CH2)
    assert isinstance(again, StorageFull) and again.detail["reserve_released"] is False
    room, space = store.probe()
    assert not room and space["used"] > 0
    st = SQLiteStorage(data)
    try:
        snap = st.open(NOW)
        # Exactly what was committed, nothing of the failed batches.
        assert (records(snap)[CH].count, records(snap)[CH2].count) == (last, more)
        assert snap.group_states == [("consume:g", CH, 1, b"state")]
    finally:
        st.close()
    assert _integrity(store.path) == "ok"
    store.close()


def test_probe_finds_room_once_pages_are_freed_and_takes_the_reserve_back(
    tmp_path: Path,
) -> None:
    data = tmp_path / "quota"
    store = SQLiteStorage(data, max_size=2 << 20, reserve=256 << 10)
    store.open(NOW)
    last, exc = _fill(store)
    assert isinstance(exc, StorageFull)
    store.apply(WriteBatch(truncates={CH: last + 1}, channels={CH: last + 1}))  # all settled
    room, space = store.probe()
    assert room and space["free"] > 1 << 20
    assert (data / RESERVE_FILE).stat().st_size == 256 << 10 and not store.reserve_released
    more, exc = _fill(store)  # SQLite reuses the freed pages
    assert isinstance(exc, StorageFull) and more > last // 2
    assert _integrity(store.path) == "ok"
    store.close()


def test_raising_max_size_on_a_running_store_makes_room(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path / "quota", max_size=1 << 20, reserve=0)
    store.open(NOW)
    last, exc = _fill(store)
    assert isinstance(exc, StorageFull) and store.probe()[0] is False
    store.max_size = 4 << 20  # what a reload does
    assert store.probe()[0] is True
    store.apply(batch_of(msg(CH, last + 1, b"y" * (64 << 10))))
    store.close()
