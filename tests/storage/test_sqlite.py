"""What only SQLiteStorage has: its file, a corrupt one, the quota as SQLite's page
limit and the reserve file. Everything every backend must do is the contract suite,
tests/storage/test_contract.py, which runs on SQLite too."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from minou.core.group import GroupDef
from minou.core.writes import WriteBatch
from minou.errors import ErrorCode, StorageError, StorageFull, StorageUnavailable
from minou.storage.sqlite import RESERVE_FILE, SQLiteStorage

from .test_contract import _fill, batch_of, msg, records

CH = "orders/v1/1"
CH2 = "orders/v1/2"
NOW = 1_000.0


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


def test_path_names_the_database_file(tmp_path: Path) -> None:
    st = SQLiteStorage(tmp_path / "d", filename="x.db")
    try:
        st.open(NOW)
        assert st.path == str(tmp_path / "d" / "x.db")
        assert Path(st.path).exists()
    finally:
        st.close()


def _integrity(path: str) -> str:
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
        counts = {r.name: r.count for r in snap.channels}
        assert (counts[CH], counts[CH2]) == (last, more)
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


def test_a_group_stored_with_its_start_by_an_older_version_loads_and_saves_again(
    tmp_path: Path,
) -> None:
    st = SQLiteStorage(tmp_path / "old")
    st.open(NOW)
    path = st.path
    st.close()
    # Older versions kept the group's `start`; where it stands is in group_states.
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("INSERT INTO groups(key, kind, patterns, start) "
                   "VALUES ('consume:g', 'consume', '[\"orders/v1/*\"]', 'seq:5')")
        db.execute("INSERT INTO group_states VALUES ('consume:g', ?, 5, x'')", (CH,))
    st = SQLiteStorage(tmp_path / "old")
    try:
        snap = st.open(NOW)
        assert snap.groups == [GroupDef("consume:g", "consume", ("orders/v1/*",))]
        assert snap.group_states == [("consume:g", CH, 5, b"")]
        st.apply(WriteBatch(group_defs={"consume:g": GroupDef("consume:g", "consume",
                                                              ("orders/v1/*", CH2))}))
    finally:
        st.close()
    st = SQLiteStorage(tmp_path / "old")
    try:
        assert st.open(NOW).groups == [GroupDef("consume:g", "consume", ("orders/v1/*", CH2))]
    finally:
        st.close()


def test_interval_commits_are_unsynced_until_a_sync_or_the_next_fsync_commit(
        tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path)
    store.open(0.0)
    assert not store.unsynced()
    store.apply(batch_of(msg("m/v1/a", 1), sync_within=0.05))
    store.apply(batch_of(msg("m/v1/a", 2), sync_within=0.05))
    assert store.unsynced()
    store.sync()
    assert not store.unsynced()
    store.sync()  # nothing to do: no error
    store.apply(batch_of(msg("m/v1/a", 3), sync_within=0.05))
    assert store.unsynced()
    store.apply(batch_of(msg("o/v1/a", 1)))  # synchronous=FULL: the WAL is synced through
    assert not store.unsynced()
    store.close()
    reopened = SQLiteStorage(tmp_path)
    snap = reopened.open(0.0)
    assert {c.name: c.count for c in snap.channels} == {"m/v1/a": 3, "o/v1/a": 1}
    assert [m.seq for m in reopened.read_range("m/v1/a", 1, 10, 10)] == [1, 2, 3]
    reopened.close()


def test_the_synchronous_mode_follows_each_batch(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path)
    store.open(0.0)
    mode = lambda: store._db().execute("PRAGMA synchronous").fetchone()[0]  # noqa: E731
    assert mode() == 2  # FULL
    store.apply(batch_of(msg("m/v1/a", 1), sync_within=0.05))
    assert mode() == 1  # NORMAL
    store.apply(batch_of(msg("m/v1/a", 2)))
    assert mode() == 2
    store.close()


def _removed_rows(path: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT count(*) FROM removed").fetchone()[0]


@pytest.mark.parametrize("reopen", [False, True])
def test_a_truncation_drops_the_removed_rows_below_it_also_after_a_restart(
    tmp_path: Path, reopen: bool,
) -> None:
    """The rows of removed messages go with the truncation that passes them, whether
    the deletes were made by this process or found at open; a channel that never had
    deletes is truncated as well."""
    data = tmp_path / "d"
    store = SQLiteStorage(data)
    store.open(NOW)
    store.apply(batch_of(*(msg(CH, s) for s in range(1, 6)), *(msg(CH2, s) for s in (1, 2))))
    store.apply(WriteBatch(deletes=[(CH, 2), (CH, 4)], channels={CH: 6}))
    assert _removed_rows(store.path) == 2
    if reopen:
        store.close()
        store = SQLiteStorage(data)
        store.open(NOW)
    try:
        store.apply(WriteBatch(truncates={CH: 3, CH2: 2}, channels={CH: 6, CH2: 3}))
        assert _removed_rows(store.path) == 1  # seq 4's row stays: it is above the cut
        store.apply(WriteBatch(truncates={CH: 6}, channels={CH: 6}))
        assert _removed_rows(store.path) == 0
    finally:
        store.close()
    st = SQLiteStorage(data)
    try:
        recs = records(st.open(NOW))
        assert (recs[CH].first_seq, recs[CH].next_seq, recs[CH].count) == (6, 6, 0)
        assert (recs[CH2].first_seq, recs[CH2].next_seq, recs[CH2].count) == (2, 3, 1)
    finally:
        st.close()


def test_a_channel_created_and_truncated_in_one_batch_keeps_its_first_seq(
    tmp_path: Path,
) -> None:
    data = tmp_path / "d"
    store = SQLiteStorage(data)
    store.open(NOW)
    try:
        store.apply(batch_of(*(msg(CH, s) for s in range(1, 4)), truncates={CH: 3}))
    finally:
        store.close()
    st = SQLiteStorage(data)
    try:
        rec = records(st.open(NOW))[CH]
        assert (rec.first_seq, rec.next_seq, rec.count) == (3, 4, 1)
    finally:
        st.close()


def _wal_restarts(store: SQLiteStorage) -> int:
    """The WAL header's checkpoint sequence: SQLite counts in it each time a writer
    starts the WAL over from its beginning."""
    with open(store.path + "-wal", "rb") as file:
        return int.from_bytes(file.read(16)[12:16], "big")


def test_a_checkpoint_starts_the_wal_over_only_as_it_nears_half_its_threshold(
        tmp_path: Path) -> None:
    """Every tick past half the threshold checkpoints (PASSIVE: the writer goes on), but
    the RESTART that shuts the writer out for a moment comes only when the WAL would
    hold half the threshold by the next call at the pace it grew since the last one,
    not on every call (4 a second, it held commits back 4 times a second: the p99 of a
    steady flow)."""
    store = SQLiteStorage(tmp_path, wal_limit=4 << 20)  # half: 509 frames of 4 KiB
    store.open(NOW)
    seq = 0

    def commit(n: int) -> None:
        nonlocal seq
        for _ in range(n):
            seq += 1
            store.apply(batch_of(msg(CH, seq, b"x" * 3000)))

    try:
        commit(10)  # a few frames each: far from half of 4 MiB
        store.checkpoint()
        assert store.restarts == 0
        commit(300)  # past half of it
        store.checkpoint()
        assert store.restarts == 1
        start = _wal_restarts(store)
        commit(1)  # the next commit writes the WAL from its start
        assert _wal_restarts(store) == start + 1
        commit(9)
        store.checkpoint()  # little since, and little more at that pace: no RESTART
        assert store.restarts == 1
        per_commit = store._wal_frames / 10
        commit(round(370 / per_commit))  # ~380 frames: under half, past it at that pace
        store.checkpoint()
        assert store.restarts == 2
        commit(5)
        store.checkpoint(restart=True)  # the WAL crowds the disk: now, however little
        assert store.restarts == 3
        assert [m.seq for m in store.read_range(CH, 1, seq + 1, seq + 1)] == \
            list(range(1, seq + 1))
    finally:
        store.close()


def test_a_commit_waits_at_the_gate_a_writer_blocking_checkpoint_holds(
        tmp_path: Path) -> None:
    """A RESTART or TRUNCATE checkpoint holds ``_writers_gate``: a commit that comes
    meanwhile waits on it (woken the moment it is released), not in SQLite's busy
    handler, whose sleeps grow to 10 and 20 ms."""
    import threading

    store = SQLiteStorage(tmp_path)
    store.open(NOW)
    done = threading.Event()
    try:
        with store._writers_gate:
            writer = threading.Thread(
                target=lambda: (store.apply(batch_of(msg(CH, 1))), done.set()))
            writer.start()
            assert not done.wait(0.3)  # held at the gate, not committed
        assert done.wait(10)
        writer.join(10)
        assert [m.seq for m in store.read_range(CH, 1, 2, 10)] == [1]
    finally:
        store.close()


def test_a_commit_made_now_from_another_thread_is_read_back_and_never_waits_at_the_gate(
        tmp_path: Path) -> None:
    """``apply_now`` (the event loop's "interval" commits): from a thread other than the
    writer's, on a connection of its own, read back like any commit; while a checkpoint
    holds the writers' gate it returns False at once and writes nothing (the batch then
    goes to the writer, which may wait)."""
    import threading

    store = SQLiteStorage(tmp_path)
    store.open(NOW)
    try:
        store.apply(batch_of(msg(CH, 1)))  # the writer's thread (here: this one)
        made: list[bool] = []

        def commit_here_then_close() -> None:
            made.append(store.apply_now(batch_of(msg(CH, 2), sync_within=0.05)))
            store.close_here()  # that thread's connection only

        other = threading.Thread(target=commit_here_then_close)
        other.start()
        other.join(10)
        assert made == [True] and store.unsynced()
        assert Path(store.path + "-wal").exists()  # the writer's connection is open still
        with store._writers_gate:
            assert store.apply_now(batch_of(msg(CH, 3), sync_within=0.05)) is False
        # Nor for SQLite's own write lock, held by another connection (a shell, a backup
        # tool): False, not the busy handler's 5 s wait and then SQLITE_BUSY raised.
        other_db = sqlite3.connect(store.path, isolation_level=None)
        other_db.execute("BEGIN IMMEDIATE")
        try:
            assert store.apply_now(batch_of(msg(CH, 3), sync_within=0.05)) is False
        finally:
            other_db.execute("ROLLBACK")
            other_db.close()
        assert [m.seq for m in store.read_range(CH, 1, 10, 10)] == [1, 2]
        store.apply(batch_of(msg(CH, 3)))  # the writer's connection sees the other's
        assert [m.seq for m in store.read_range(CH, 1, 10, 10)] == [1, 2, 3]
        store.sync()
        assert not store.unsynced()
        # A batch without sync_within is written to the OS here too, and on the disk
        # only once ``sync`` ran (the caller answers after it).
        assert store.apply_now(batch_of(msg(CH, 4))) is True
        assert store.unsynced()
        store.sync()
        assert not store.unsynced()
    finally:
        store.close()
    assert not Path(store.path + "-wal").exists()  # the last close folded it in
    again = SQLiteStorage(tmp_path)
    snap = again.open(NOW)
    try:
        assert [r.next_seq for r in snap.channels if r.name == CH] == [5]
    finally:
        again.close()


def _copy_as_after_a_crash(store: SQLiteStorage, to: Path) -> str:
    """The database, WAL and all, as a killed process leaves them (its connections
    never closed, so nothing was folded in): copied while the store is still open."""
    to.mkdir()
    for suffix in ("", "-wal"):
        Path(str(to / "minou.db") + suffix).write_bytes(Path(store.path + suffix).read_bytes())
    return str(to)


def test_the_wal_is_written_out_at_open_and_commits_write_over_it(tmp_path: Path) -> None:
    """Written out to half the checkpoint threshold at open, the WAL keeps its size
    while commits go in (they write over its zeros: no size for an fdatasync to make
    durable), and a store opened from it as a crash left it reads every commit."""
    store = SQLiteStorage(tmp_path / "a", wal_limit=8 << 20)
    store.open(NOW)
    try:
        assert store.wal_bytes() == 4 << 20
        for seq in range(1, 201):
            store.apply(batch_of(msg(CH, seq, b"x" * 300)))
        assert store.wal_bytes() == 4 << 20
        crashed = _copy_as_after_a_crash(store, tmp_path / "b")
    finally:
        store.close()
    again = SQLiteStorage(crashed, wal_limit=8 << 20)
    snap = again.open(NOW)
    try:
        assert [m.seq for m in again.read_range(CH, 1, 1000, 1000)] == list(range(1, 201))
        assert {r.name: r.next_seq for r in snap.channels}[CH] == 201
        again.apply(batch_of(msg(CH, 201, b"y")))  # what the crash left is written on
        assert [m.data for m in again.read_range(CH, 200, 202, 10)] == [b"x" * 300, b"y"]
    finally:
        again.close()
    assert _integrity(str(Path(crashed) / "minou.db")) == "ok"


def test_the_wal_a_crash_left_is_kept_and_only_grown(tmp_path: Path) -> None:
    """A WAL with commits in it (no clean stop) is never written over at open: the
    zeros go past its end, and every commit in it is read back."""
    store = SQLiteStorage(tmp_path / "a", wal_limit=1 << 20)  # written out to 512 KiB
    store.open(NOW)
    try:
        for seq in range(1, 301):  # ~1.2 MiB of frames: past what was written out
            store.apply(batch_of(msg(CH, seq, b"x" * 3000)))
        grown = store.wal_bytes()
        assert grown > 512 << 10
        crashed = _copy_as_after_a_crash(store, tmp_path / "b")
    finally:
        store.close()
    again = SQLiteStorage(crashed, wal_limit=8 << 20)  # a larger threshold now
    again.open(NOW)
    try:
        assert again.wal_bytes() == 4 << 20
        assert [m.seq for m in again.read_range(CH, 1, 1000, 1000)] == list(range(1, 301))
    finally:
        again.close()


def test_under_a_quota_the_wal_is_not_written_out(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, max_size=64 << 20)
    store.open(NOW)
    try:
        assert store.wal_bytes() < 1 << 20
    finally:
        store.close()


def test_an_idle_checkpoint_keeps_the_written_out_wal_while_the_disk_has_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle with room to spare: the WAL is folded in and started over, its file kept (the
    next commits write over it). On a crowded disk it is cut, and written out again
    at an idle moment once there is room."""
    store = SQLiteStorage(tmp_path, wal_limit=8 << 20)
    store.open(NOW)
    try:
        for seq in range(1, 51):
            store.apply(batch_of(msg(CH, seq, b"x" * 300)))
        start = _wal_restarts(store)
        store.checkpoint(truncate=True)
        assert store.wal_bytes() == 4 << 20
        store.apply(batch_of(msg(CH, 51, b"y")))
        assert _wal_restarts(store) == start + 1  # written from its start again
        monkeypatch.setattr(store, "keeps_wal", lambda: False)  # the disk fills up
        store.checkpoint(truncate=True)
        assert store.wal_bytes() == 0
        store.apply(batch_of(msg(CH, 52, b"z")))
        monkeypatch.undo()  # room again
        store.checkpoint(truncate=True)
        assert store.wal_bytes() == 4 << 20
        store.apply(batch_of(msg(CH, 53, b"w")))
        assert [m.seq for m in store.read_range(CH, 1, 100, 100)] == list(range(1, 54))
    finally:
        store.close()
    assert _integrity(store.path) == "ok"


def test_a_disk_that_fills_while_the_wal_is_written_out_leaves_it_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC part way: the zeros written are given back, storage opens all the same and
    commits go on (appending, as without the write-out)."""
    import errno
    import os as real_os

    from minou.storage import sqlite as sqlite_mod

    written = [0]
    pwrite = real_os.pwrite  # the module's own, before it is patched

    def filling(fd: int, data: bytes, offset: int) -> int:
        if real_os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
            if written[0] >= 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            written[0] += 1
        return pwrite(fd, data, offset)

    monkeypatch.setattr(sqlite_mod.os, "pwrite", filling)
    store = SQLiteStorage(tmp_path, wal_limit=8 << 20)
    store.open(NOW)
    monkeypatch.undo()
    try:
        assert written[0] == 2 and store.wal_bytes() < 1 << 20  # cut back to where it was
        for seq in range(1, 21):
            store.apply(batch_of(msg(CH, seq, b"x" * 300)))
        assert [m.seq for m in store.read_range(CH, 1, 100, 100)] == list(range(1, 21))
    finally:
        store.close()


def test_a_channel_created_by_a_failed_commit_is_created_again_by_the_next(
        tmp_path: Path) -> None:
    """The rolled-back transaction took the new channel's row with it: the store forgets
    that channel's id (and only that one), so its next commit inserts the row again."""
    data = tmp_path / "quota"
    store = SQLiteStorage(data, max_size=2 << 20, reserve=0)
    store.open(NOW)
    last, exc = _fill(store)
    assert isinstance(exc, StorageFull)
    with pytest.raises(StorageFull):  # a new channel with the full channel's message
        store.apply(batch_of(msg(CH2, 1, b"y" * (64 << 10)), msg(CH, last + 1)))
    store.max_size = 8 << 20  # what a reload does
    store.apply(batch_of(msg(CH2, 1), msg(CH, last + 1)))
    store.close()
    again = SQLiteStorage(data)
    try:
        counts = {r.name: r.count for r in again.open(NOW).channels}
        assert (counts[CH], counts[CH2]) == (last + 1, 1)
    finally:
        again.close()
