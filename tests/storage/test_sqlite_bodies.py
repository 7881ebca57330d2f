"""Large segment bodies in body files beside the database (storage/bodies.py): what
goes there, that it reads back and survives a restart, that nothing is left behind by
a failed commit or by settled messages, and that ``max_size`` counts them. The whole
contract suite also runs with every body in a file (the "sqlite-bodies" backend of
test_contract.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from minou.core.writes import WriteBatch
from minou.errors import StorageFull
from minou.storage.sqlite import SQLiteStorage

from .test_contract import batch_of, msg

CH = "big/v1/1"
NOW = 1_000.0
BIG = 300 << 10  # over the default body_file_min (256 KiB)


def _files(store: SQLiteStorage) -> list[str]:
    return sorted(p.name for p in Path(store.bodies.directory).glob("*.bin"))


def _rows(store: SQLiteStorage) -> list[tuple[int, int | None]]:
    with contextlib.closing(sqlite3.connect(store.path)) as db:
        return list(db.execute("SELECT rid & ((1 << 40) - 1), body_file FROM segments "
                               "ORDER BY rid"))


def _payload(seq: int, size: int) -> bytes:
    return bytes([seq % 251]) * size  # each message's bytes its own


def test_a_large_segment_goes_to_a_body_file_and_a_small_one_stays_in_sqlite(
        tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, _payload(1, BIG))))
    store.apply(batch_of(msg(CH, 2, b"small")))
    rows = _rows(store)
    assert rows[0][0] == 1 and rows[0][1] is not None  # in a body file
    assert rows[1] == (2, None)  # in the row
    assert len(_files(store)) == 1
    # The database holds a reference, not the 300 KiB (the WAL folded in first: its
    # file is written out ahead, so its size says nothing).
    store.checkpoint(truncate=True)
    assert Path(store.path).stat().st_size < BIG
    got = store.read_range(CH, 1, 3, 10)
    assert [(m.seq, m.data) for m in got] == [(1, _payload(1, BIG)), (2, b"small")]
    store.close()


def test_bodies_survive_a_restart_and_a_new_file_starts_at_each_open(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, body_file_min=1024)
    store.open(NOW)
    for seq in (1, 2, 3):
        store.apply(batch_of(msg(CH, seq, _payload(seq, 4096), expires_at=NOW + 5,
                                 priority=3)))
    store.close()
    again = SQLiteStorage(tmp_path, body_file_min=1024)
    snap = again.open(NOW)
    assert {r.name: r.count for r in snap.channels} == {CH: 3}
    # Specials (priorities) are read from the bodies at open.
    assert sorted(s[1] for s in snap.specials) == [1, 2, 3]
    assert [m.data for m in again.read_range(CH, 1, 10, 10)] == \
        [_payload(s, 4096) for s in (1, 2, 3)]
    assert [m.seq for m in again.expired(NOW + 10, 10)] == [1, 2, 3]
    again.apply(batch_of(msg(CH, 4, _payload(4, 4096))))
    assert len(_files(again)) == 2  # never appended to a file a crash may have cut short
    again.close()


def test_a_failed_commit_leaves_no_body_bytes_and_no_orphan_file(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, body_file_min=1024, max_size=1 << 20, reserve=0)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, _payload(1, 200 << 10))))
    size = store.bodies.size_bytes()
    with pytest.raises(StorageFull) as info:  # the first body fits, the second does not
        store.apply(batch_of(msg(CH, 2, _payload(2, 100 << 10)),
                             msg("big/v1/2", 1, _payload(1, 900 << 10))))
    assert "max_size" in info.value.message
    assert store.bodies.size_bytes() == size  # the body written for it was cut off again
    assert sum(p.stat().st_size for p in Path(store.bodies.directory).glob("*.bin")) == size
    store.apply(batch_of(msg(CH, 2, _payload(2, 100 << 10))))  # what fits still goes in
    store.close()
    again = SQLiteStorage(tmp_path, body_file_min=1024)
    again.open(NOW)
    assert [(m.seq, len(m.data)) for m in again.read_range(CH, 1, 10, 10)] == \
        [(1, 200 << 10), (2, 100 << 10)]
    again.close()


def test_max_size_counts_the_body_files(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, max_size=2 << 20, reserve=0)
    store.open(NOW)
    seq = 0
    with pytest.raises(StorageFull):
        while seq < 100:
            seq += 1
            store.apply(batch_of(msg(CH, seq, _payload(seq, BIG))))
    stored = seq - 1
    assert 4 <= stored <= 7  # 2 MiB of 300 KiB bodies, the database's own pages beside
    space = store.space()
    assert space["used"] >= stored * BIG and space["free"] < BIG
    assert store.size_bytes() >= stored * BIG
    store.close()


def test_body_files_no_message_refers_to_are_deleted(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, body_file_min=1024, body_file_limit=8192)
    store.body_collect_interval = 0.0
    store.open(NOW)
    for seq in range(1, 9):  # two 4 KiB bodies a file: four files
        store.apply(batch_of(msg(CH, seq, _payload(seq, 4096))))
    assert len(_files(store)) == 4
    # Every reader is past 1-5: their segments go, and the files only they used.
    store.apply(WriteBatch(truncates={CH: 6}, channels={CH: 9}))
    assert _files(store) == ["00000003.bin", "00000004.bin"]  # 6 is in 3 with 5
    assert [m.seq for m in store.read_range(CH, 1, 10, 10)] == [6, 7, 8]
    store.apply(WriteBatch(truncates={CH: 9}, channels={CH: 9}))
    assert _files(store) == ["00000004.bin"]  # the current file stays, appended to next
    store.close()


def test_files_left_by_a_commit_that_never_happened_are_deleted_at_open(
        tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, body_file_min=1024)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, _payload(1, 4096))))
    store.close()
    bodies = Path(store.bodies.directory)
    (bodies / "00000007.bin").write_bytes(b"half a body a crash cut off")
    again = SQLiteStorage(tmp_path, body_file_min=1024)
    again.open(NOW)
    assert _files(again) == ["00000001.bin"]
    again.apply(batch_of(msg(CH, 2, _payload(2, 4096))))
    assert _files(again) == ["00000001.bin", "00000008.bin"]  # past every number seen
    assert len(again.read_range(CH, 1, 3, 10)) == 2
    again.close()


def test_interval_commits_leave_bodies_to_the_sync(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path, body_file_min=1024)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, _payload(1, 4096)), sync_within=0.05))
    assert store.bodies.dirty and store.unsynced()
    store.sync()
    assert not store.bodies.dirty and not store.unsynced()
    store.apply(batch_of(msg(CH, 2, _payload(2, 4096)), sync_within=0.05))
    assert store.bodies.dirty
    store.apply(batch_of(msg("other/v1/1", 1)))  # an fsync commit syncs them first
    assert not store.bodies.dirty and not store.unsynced()
    store.close()


def test_a_database_from_before_body_files_opens_and_gets_the_column(tmp_path: Path) -> None:
    store = SQLiteStorage(tmp_path)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, b"old")))
    store.close()
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:  # as older versions made it
        db.execute("DROP INDEX segments_body_file")
        db.execute("ALTER TABLE segments DROP COLUMN body_file")
    again = SQLiteStorage(tmp_path)
    again.open(NOW)
    again.apply(batch_of(msg(CH, 2, _payload(2, BIG))))
    assert [len(m.data) for m in again.read_range(CH, 1, 3, 10)] == [3, BIG]
    assert _rows(again)[0] == (1, None)
    again.close()


def test_a_missing_body_file_is_a_storage_error_not_a_crash(tmp_path: Path) -> None:
    from minou.errors import StorageUnavailable

    store = SQLiteStorage(tmp_path, body_file_min=1024)
    store.open(NOW)
    store.apply(batch_of(msg(CH, 1, _payload(1, 4096))))
    for path in Path(store.bodies.directory).glob("*.bin"):
        path.unlink()  # an operator's mistake
    with pytest.raises(StorageUnavailable) as info:
        store.read_range(CH, 1, 2, 10)
    assert "body file" in str(info.value)
    store.close()


def test_files_are_preallocated_only_while_the_disk_has_room(tmp_path: Path) -> None:
    """On a disk getting full, blocks held ahead by the current body file would be
    missed by the database (full sooner) and never given back: no preallocation below
    PREALLOCATE_ROOM files' worth of free space. A real small file system (a tmpfs)."""
    import subprocess

    from minou.storage.bodies import PREALLOCATE_ROOM, BodyFiles

    from ..system.test_full_disk import _mount_tmpfs

    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, "32m")
    opened: list[BodyFiles] = []
    try:
        def first_file(name: str, limit: int) -> int:
            bodies = BodyFiles(mnt / name, file_limit=limit)
            opened.append(bodies)
            bodies.open(set())
            bodies.append(b"x" * 4096)
            return bodies.path_of(bodies.current).stat().st_blocks * 512

        assert PREALLOCATE_ROOM * (8 << 20) > 32 << 20
        assert first_file("short", 8 << 20) < 1 << 20  # 32 MiB free: not 8 x 8 MiB
        assert PREALLOCATE_ROOM * (1 << 20) < 24 << 20
        assert first_file("roomy", 1 << 20) >= 1 << 20  # room for 8 x 1 MiB: held ahead
    finally:
        for bodies in opened:
            bodies.close()
        done = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
