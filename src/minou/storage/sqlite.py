"""Embedded storage: one SQLite file in WAL mode, one transaction per batch.

``synchronous=FULL`` makes every commit fsync the WAL, so a batch is on disk
when ``apply`` returns; the broker confirms publishes only after that. A batch
whose channels all have durability "interval" (``sync_within`` set) is committed
with ``synchronous=NORMAL`` instead: written to the OS (a killed broker loses
nothing), made durable by ``sync`` (an fdatasync of the WAL, from a thread of its
own) within ``sync_within``, or by the next ``FULL`` commit, which syncs the WAL and
so every frame before its own. The
writer and the reader each use their own connection (WAL lets reads run
beside the writer); every method is called from one thread per connection.

A full disk, or the ``max_size`` quota (SQLite's ``max_page_count``, which fails
exactly as a full disk does), makes ``apply`` raise ``StorageFull``: SQLite rolled
the transaction back, the file is intact, nothing of the batch was written. The
first time, the reserve is given back (a file of ``reserve`` bytes in the data dir,
and as many pages above ``max_size``) so that the small writes the broker must
still make (acks, group states) find room; ``probe`` tells when there is room
again and takes the reserve back.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import struct
import threading
import time
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar
from urllib.request import pathname2url

import msgspec

from ..core.dedup import DedupRows
from ..core.group import GroupDef
from ..core.log import READ_WEIGHT_BASE, Msg, read_weight
from ..core.seq_runs import SeqRuns
from ..core.snapshot import Snapshot
from ..core.writes import WriteBatch
from ..errors import StorageFull, StorageLocked, StorageUnavailable
from ..limits import (
    BODY_FILE_LIMIT_BYTES,
    BODY_FILE_MIN_BYTES,
    CHECKPOINT_WAL_BYTES,
    STORAGE_RESERVE_BYTES,
    STORAGE_RESUME_BYTES,
    WAL_HEADROOM_BYTES,
    WAL_PREFILL_BYTES,
)
from ..protocol.frames import Send
from . import segments
from .bodies import BodyFileError, BodyFileMissing, BodyFiles
from .holders import other_holders
from .segments import runs, size_text

SQLITE_FULL = 13  # sqlite3.Error.sqlite_errorcode (its low byte): disk or max_page_count
SQLITE_IOERR_SHMSIZE = 10 | (19 << 8)  # the WAL index could not grow: no room either
RESERVE_FILE = "minou.reserve"
WAL_FRAME_HEADER = 24  # bytes before each page in the WAL (sqlite.org/fileformat.html)
# How long a commit waits for SQLite's write lock held by another connection (a
# checkpoint, an operator's shell) before it is refused: StorageLocked.
BUSY_TIMEOUT_MS = 5000
log = logging.getLogger("minou.storage")
_T = TypeVar("_T")
# Dedup rows read at once at a start before they go into columns (core/dedup.DedupRows):
# ~10 MB of tuples at most (256-character keys), then freed.
DEDUP_READ_PAGE = 16_384

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS channels(
    cid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, next_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS segments(
    rid INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL, published_at REAL NOT NULL,
    expires_min REAL, special INTEGER, body BLOB NOT NULL, body_file INTEGER);
CREATE INDEX IF NOT EXISTS segments_expiry ON segments(expires_min)
    WHERE expires_min IS NOT NULL;
CREATE INDEX IF NOT EXISTS segments_special ON segments(rid) WHERE special IS NOT NULL;
CREATE INDEX IF NOT EXISTS segments_body_file ON segments(body_file)
    WHERE body_file IS NOT NULL;
CREATE TABLE IF NOT EXISTS removed(rid INTEGER PRIMARY KEY);
-- `start` is no longer read (where a group starts lives in group_states); every
-- database made before has the NOT NULL column, so it stays and is written ''.
CREATE TABLE IF NOT EXISTS groups(
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, patterns TEXT NOT NULL, start TEXT NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_states(
    grp TEXT NOT NULL, channel TEXT NOT NULL, floor INTEGER NOT NULL, state BLOB NOT NULL,
    PRIMARY KEY (grp, channel)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dedup(
    channel TEXT NOT NULL, key TEXT NOT NULL, expires_at REAL NOT NULL, seq INTEGER NOT NULL,
    id TEXT NOT NULL, PRIMARY KEY (channel, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS clients(client_id TEXT PRIMARY KEY, record BLOB NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS credentials(id TEXT PRIMARY KEY, record BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations(channel TEXT PRIMARY KEY, owner TEXT NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fences(writer TEXT NOT NULL, channel TEXT NOT NULL,
    batch INTEGER NOT NULL, PRIMARY KEY (writer, channel)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS writers(writer TEXT PRIMARY KEY, owner TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS used_tokens(jti TEXT PRIMARY KEY, expires REAL NOT NULL)
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS used_tokens_expiry ON used_tokens(expires);
CREATE TABLE IF NOT EXISTS staged(owner TEXT NOT NULL, txn TEXT NOT NULL, part INTEGER NOT NULL,
    body BLOB NOT NULL, touched REAL NOT NULL, PRIMARY KEY (owner, txn, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producers(client TEXT NOT NULL, producer TEXT NOT NULL,
    channel TEXT NOT NULL, last INTEGER NOT NULL, run_pseq INTEGER NOT NULL,
    run_last INTEGER NOT NULL, run_seq INTEGER NOT NULL, id_hash TEXT NOT NULL,
    used REAL NOT NULL, refused BLOB, PRIMARY KEY (client, producer, channel)) WITHOUT ROWID;
"""

# Messages are stored in segments: one row per channel per committed batch, holding
# consecutive seqs [first, last] as one MessagePack array of Msg structs (encoded and
# decoded by msgspec without Python per message). A row id is the channel id and the
# segment's first seq in one integer (cid << 40 | seq), so the table's own B-tree is
# the (channel, seq) index and a channel's segments are one key range. Single
# messages removed from inside a segment (TTL, overflow, dead-lettered) are listed in
# ``removed``; whole segments go once every reader is past them (``channels.first_seq``
# marks how far, within a segment, that is). A large segment's body is in a body file
# (bodies.py): ``body_file`` is its number and ``body`` holds where in it (offset, length).
SEQ_BITS = 40
SEQ_MASK = (1 << SEQ_BITS) - 1
_enc = msgspec.msgpack.Encoder()
_segment = msgspec.msgpack.Decoder(list[Msg])
_sends = msgspec.msgpack.Decoder(list[Send])
_BODY_REF = struct.Struct("<QQ")  # a body in a body file: offset, length
# Databases made before body files have no body_file column: added at open.
_MIGRATE_BODY_FILE = "ALTER TABLE segments ADD COLUMN body_file INTEGER"


def _rid(cid: int, seq: int) -> int:
    return (cid << SEQ_BITS) | seq


def _segment_row(cid: int, msgs: list[Msg]) -> tuple[Any, ...]:
    expires = [m.expires_at for m in msgs if m.expires_at is not None]
    special = any(m.priority or m.deliver_at is not None for m in msgs)
    return (_rid(cid, msgs[0].seq), msgs[-1].seq, msgs[0].published_at,
            min(expires) if expires else None, 1 if special else None, _enc.encode(msgs))


def _is_full(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == SQLITE_FULL or code == SQLITE_IOERR_SHMSIZE
    return "database or disk is full" in str(exc)


def _is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY past the busy timeout: another connection holds the write lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def _put_or_drop(db: sqlite3.Connection, table: str, key: str, value: str,
                 changes: dict[str, Any]) -> None:
    """Write ``changes`` to a two-column table: a value replaces the row, None drops it.
    (Table and column names are this module's constants, never input.)"""
    for k, v in changes.items():
        if v is None:
            db.execute(f"DELETE FROM {table} WHERE {key} = ?", (k,))
        else:
            db.execute(f"INSERT OR REPLACE INTO {table}({key}, {value}) VALUES (?, ?)", (k, v))


def _read_again_if_gone(read: Callable[..., _T], *args: Any) -> _T:
    """A read from a reader thread: the writer may have removed a segment and its body
    file between two of its lookups. Read again, from the state after (where the
    segment is gone too); a second miss is damage, not a race."""
    try:
        return read(*args)
    except BodyFileMissing:
        try:
            return read(*args)
        except BodyFileMissing as exc:
            raise StorageUnavailable(f"a body file is missing: {exc}") from exc


class _QuotaReached(Exception):
    """A body file would take the store past ``max_size``."""


class SQLiteStorage:
    backend = "sqlite"

    def __init__(self, data_dir: str | os.PathLike[str], *, filename: str = "minou.db",
                 max_size: int | None = None, reserve: int = STORAGE_RESERVE_BYTES,
                 wal_limit: int = CHECKPOINT_WAL_BYTES,
                 body_file_min: int = BODY_FILE_MIN_BYTES,
                 body_file_limit: int = BODY_FILE_LIMIT_BYTES) -> None:
        self.data_dir = str(Path(data_dir).resolve())
        self.path = str(Path(self.data_dir) / filename)
        self.body_file_min = body_file_min  # segments this large go to a body file
        self.bodies = BodyFiles(self.path + "-bodies", body_file_limit)
        self._collected_at = 0.0
        self.body_collect_interval = 0.5  # seconds between looks for unused body files
        self.max_size = max_size  # bytes of database pages (None: the disk is the limit)
        self.reserve = reserve
        self.wal_limit = wal_limit
        self._wal_prefill = min(WAL_PREFILL_BYTES, wal_limit // 2)  # _prefill_wal
        self.reserve_path = Path(self.data_dir) / RESERVE_FILE
        self.reserve_released = False  # since the last SQLITE_FULL, until probe() says room
        self._local = threading.local()
        self._cids: dict[str, int] = {}
        self._cid_lock = threading.Lock()
        self._commits = 0
        self._expiry_done: set[int] = set()  # segments with nothing left to expire
        # Commits made with synchronous=NORMAL so far, and how many of them are known to
        # be on the disk (a sync, or a FULL commit after them, wrote the WAL through).
        self._relaxed = 0
        self._synced = 0
        self._sync_lock = threading.Lock()
        self._wal_fd: int | None = None
        # Held by a checkpoint that shuts writers out (RESTART, TRUNCATE) and taken by the
        # writer before it begins: a commit waits exactly that long, not in SQLite's busy
        # handler, which polls with sleeps of 1, 2, 5, 10... ms (a 3 ms RESTART held a
        # commit up to 20 ms: docs/benchmarks.md, "Checkpoints that held commits back").
        self._writers_gate = threading.Lock()
        self.restarts = 0  # RESTART/TRUNCATE checkpoints run (the WAL started over)
        self._wal_frames = 0  # frames in the WAL at the last checkpoint
        # (device, inode) of the database file once opened: a file removed or replaced
        # under a running broker is noticed at the next commit (``_check_in_place``).
        self._identity: tuple[int, int] | None = None
        # ... and of its write-ahead log: SQLite writes on to a log removed under it
        # (``rm *-wal``), and what only the log holds is gone at the next start.
        self._wal_identity: tuple[int, int] | None = None

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                # Once open, a thread's connection must find the file, not make an empty
                # one where a removed database was (its data would seem to be gone).
                target = self.path if self._identity is None else \
                    f"file:{pathname2url(self.path)}?mode=rw"
                db = sqlite3.connect(target, isolation_level=None, check_same_thread=False,
                                     uri=self._identity is not None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                db.execute("PRAGMA cache_size=-8000")  # KiB; bodies are cached by the core
                # Checkpoints run beside the writer (``checkpoint``), not inside its commits,
                # so a commit's latency is one WAL append and one fsync.
                db.execute("PRAGMA wal_autocheckpoint=0")
                # After a WAL reset the file is cut back to the checkpoint threshold.
                db.execute(f"PRAGMA journal_size_limit={int(self.wal_limit)}")
                # Settled messages are removed in bulk: zeroing every freed page (the
                # SECURE_DELETE default of many builds) doubles the writes and, on a
                # full disk, makes the deletes that would free room need room first.
                db.execute("PRAGMA secure_delete=FAST")
                self._local.relaxed = False  # synchronous=NORMAL now (interval batches)
                self._local.busy_wait = True  # busy_timeout as set above
                self._local.unlimited = db.execute("PRAGMA max_page_count").fetchone()[0]
                self._local.page_limit = None
                self._local.page_size = None
            except sqlite3.Error as exc:
                raise StorageUnavailable(f"cannot open {self.path}: {exc}") from exc
            self._local.db = db
        return db

    def _limit(self, db: sqlite3.Connection) -> None:
        """This connection's page limit: ``max_size`` (plus the reserve once given back)."""
        self.bodies.preallocate = self.max_size is None
        if self.max_size is None:
            want = None
        else:
            if self._local.page_size is None:
                self._local.page_size = db.execute("PRAGMA page_size").fetchone()[0]
            extra = self.reserve if self.reserve_released else 0
            room = self.max_size + extra - self.bodies.size_bytes()
            want = max(1, room // self._local.page_size)
        if want != self._local.page_limit:
            db.execute(f"PRAGMA max_page_count={int(want or self._local.unlimited)}")
            self._local.page_limit = want

    def open(self, now: float) -> Snapshot:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.path) and not os.access(self.path, os.W_OK):
            # SQLite opens a file it may not write read-only, and says nothing until the
            # first write: the broker said it was ready, then stopped at the first publish
            # ("attempt to write a readonly database").
            raise StorageUnavailable(
                f"cannot open {self.path}: the file is read-only (its permissions, or a "
                f"read-only mount), and the broker writes to it")
        db = self._db()
        try:
            self._create_schema(db)
            snap = self._snapshot(db, now)
            self.bodies.open(self._referenced_body_files(db))
        except sqlite3.DatabaseError as exc:
            raise StorageUnavailable(f"cannot read {self.path}: {exc}") from exc
        except (BodyFileError, OSError) as exc:
            raise StorageUnavailable(f"cannot read the body files of {self.path}: {exc}"
                                     ) from exc
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        with contextlib.suppress(OSError):  # made by the first write (the schema's)
            st = os.stat(self.path + "-wal")
            self._wal_identity = (st.st_dev, st.st_ino)
        if not self._make_reserve():
            log.warning("no room for the %s reserve %s: if the disk fills up, acks may not "
                        "be recorded until space is freed", size_text(self.reserve),
                        self.reserve_path)
        self._prefill_wal(db)
        return snap

    def _prefill_wal(self, db: sqlite3.Connection) -> None:
        """Write the WAL file out with zeros up to ``WAL_PREFILL_BYTES`` (at most half
        the checkpoint threshold, where a RESTART starts it over; it then keeps that size,
        which ``journal_size_limit`` allows). An append to a file makes its fdatasync
        commit the new size through the file system's journal as well; a write over
        blocks the file holds does not: measured here, a one-row commit's p50 0.25-0.30
        -> 0.15-0.17 ms. Done under SQLite's write lock, past the file's end: SQLite
        writes nothing there meanwhile, and a WAL's reader stops at the first frame whose
        salt and checksum do not match (zeros never do), as it does past the frames of
        an older generation after a reset. Only while ``keeps_wal``."""
        target = self._wal_prefill
        if not self.keeps_wal() or self.wal_bytes() >= target:
            return
        with self._writers_gate:  # a commit meanwhile waits here, woken when it is done
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.Error:
                return
            try:
                fd = os.open(self.path + "-wal", os.O_WRONLY)
            except OSError:
                db.execute("ROLLBACK")
                return
            try:
                start = offset = os.fstat(fd).st_size
                zeros = bytes(1 << 20)
                try:
                    while offset < target:
                        offset += os.pwrite(fd, zeros[:target - offset], offset)
                    os.fdatasync(fd)
                except OSError as exc:  # a disk that filled up meanwhile: give it back
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    log.debug("the WAL was not written out to %s: %s",
                              size_text(target), exc)
            finally:
                os.close(fd)
                db.execute("ROLLBACK")

    def keeps_wal(self) -> bool:
        """Whether the WAL file is written out ahead and kept while the broker is idle
        (not cut: its commits keep writing over blocks it has): without a ``max_size``
        quota (the file counts against it), while the disk has room to spare."""
        if self.max_size is not None or self._wal_prefill <= 0:
            return False
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize >= 4 * self._wal_prefill + 8 * WAL_HEADROOM_BYTES

    @staticmethod
    def _create_schema(db: sqlite3.Connection) -> None:
        tables = {name for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "segments" in tables and "body_file" not in {
                row[1] for row in db.execute("PRAGMA table_info(segments)")}:
            db.execute(_MIGRATE_BODY_FILE)
        db.executescript(SCHEMA)

    @staticmethod
    def _referenced_body_files(db: sqlite3.Connection) -> set[int]:
        return {n for (n,) in db.execute(
            "SELECT DISTINCT body_file FROM segments WHERE body_file IS NOT NULL")}

    def _body(self, body: bytes, body_file: int | None) -> bytes:
        """A segment's encoded messages, from its row or from its body file."""
        if body_file is None:
            return body
        offset, length = _BODY_REF.unpack(body)
        try:
            return self.bodies.read(body_file, offset, length)
        except BodyFileMissing:
            raise
        except OSError as exc:
            raise StorageUnavailable(f"cannot read a body file: {exc}") from exc

    def _snapshot(self, db: sqlite3.Connection, now: float) -> Snapshot:
        snap = Snapshot()
        firsts: dict[str, int] = {}
        removed: dict[str, SeqRuns] = {}
        for cid, name, next_seq, first_seq in db.execute(
            "SELECT cid, name, next_seq, first_seq FROM channels"
        ):
            self._cids[name] = cid
            lo, hi = _rid(cid, 0), _rid(cid, SEQ_MASK)
            spans = [(r & SEQ_MASK, last) for r, last in db.execute(
                "SELECT rid, last_seq FROM segments WHERE rid BETWEEN ? AND ? ORDER BY rid",
                (lo, hi))]
            # Streamed into runs, in rid order (the primary key's): no set of them.
            removed_runs = SeqRuns.from_sorted(chain.from_iterable(db.execute(
                "SELECT rid & ? FROM removed WHERE rid BETWEEN ? AND ? ORDER BY rid",
                (SEQ_MASK, lo, hi))))
            rec = segments.channel_record(name, next_seq, first_seq, spans, removed_runs)
            snap.channels.append(rec)
            firsts[name], removed[name] = rec.first_seq, rec.gone
        for body, body_file in db.execute(
                "SELECT body, body_file FROM segments WHERE special IS NOT NULL"):
            for m in _segment.decode(self._body(body, body_file)):
                if m.special and m.seq >= firsts.get(m.channel, 0) and \
                        m.seq not in removed.get(m.channel, ()):
                    snap.specials.append((m.channel, m.seq, m.priority, m.deliver_at))
        groups = db.execute("SELECT key, kind, patterns FROM groups")
        for key, kind, patterns in groups:
            snap.groups.append(GroupDef(key, kind, tuple(msgspec.json.decode(patterns))))
        snap.group_states = [
            tuple(r) for r in db.execute("SELECT grp, channel, floor, state FROM group_states")
        ]  # type: ignore[misc]
        snap.dedup = self._dedup(db, now)
        snap.clients = [body for (body,) in db.execute("SELECT record FROM clients")]
        snap.credentials = [body for (body,) in db.execute("SELECT record FROM credentials")]
        snap.reservations = dict(db.execute("SELECT channel, owner FROM reservations"))
        snap.fences = [tuple(r) for r in db.execute(
            "SELECT writer, channel, batch FROM fences")]  # type: ignore[misc]
        snap.writers = dict(db.execute("SELECT writer, owner FROM writers"))
        snap.meta = dict(db.execute("SELECT key, value FROM meta"))
        snap.used_tokens = [tuple(r) for r in db.execute(
            "SELECT jti, expires FROM used_tokens WHERE expires > ?", (now,))]  # type: ignore[misc]
        snap.staged = [(owner, txn, part, _sends.decode(body) if part else
                        msgspec.msgpack.decode(body), touched)
                       for owner, txn, part, body, touched in db.execute(
                           "SELECT owner, txn, part, body, touched FROM staged "
                           "ORDER BY owner, txn, part")]
        snap.producers = [tuple(r) for r in db.execute(
            "SELECT client, producer, channel, last, run_pseq, run_last, run_seq, id_hash, "
            "used, refused FROM producers")]
        return snap

    @staticmethod
    def _dedup(db: sqlite3.Connection, now: float) -> DedupRows:
        """The unexpired dedup entries, read a page at a time into columns: as a list of
        tuples, MAX_DEDUP_KEYS of them held ~1.1 GB at a start (core/dedup.py)."""
        rows = DedupRows()
        cur = db.execute("SELECT channel, key, expires_at, seq, id FROM dedup "
                         "WHERE expires_at > ? ORDER BY channel, key", (now,))
        while page := cur.fetchmany(DEDUP_READ_PAGE):
            rows.extend(page)
        return rows

    def _cid(self, db: sqlite3.Connection, name: str, next_seq: int) -> int:
        cid = self._cids.get(name)
        if cid is None:
            cur = db.execute(
                "INSERT INTO channels(name, next_seq, first_seq) VALUES (?, ?, 1) "
                "ON CONFLICT(name) DO UPDATE SET next_seq = max(next_seq, excluded.next_seq) "
                "RETURNING cid",
                (name, next_seq),
            )
            cid = cur.fetchone()[0]
            with self._cid_lock:
                self._cids[name] = cid
        return cid

    def apply(self, batch: WriteBatch) -> None:
        """Make ``batch`` durable in one transaction. Raises StorageFull when the disk or
        ``max_size`` is full, StorageUnavailable for anything else; either way nothing
        of the batch was written."""
        self._commit(batch, wait=True)

    def apply_now(self, batch: WriteBatch) -> bool:
        """Commit ``batch`` to the OS only (no fsync, whatever its ``sync_within``),
        unless it would wait for a checkpoint that shuts writers out: False then, and
        nothing was done. ``sync`` makes it durable."""
        return self._commit(batch, wait=False, relaxed=True)

    def _commit(self, batch: WriteBatch, *, wait: bool, relaxed: bool = False) -> bool:
        db = self._db()
        relaxed = relaxed or batch.sync_within is not None
        try:
            self._limit(db)
            if batch.messages and self.max_size is None:
                self._check_headroom(db, batch)
            if relaxed != self._local.relaxed:
                db.execute(f"PRAGMA synchronous={'NORMAL' if relaxed else 'FULL'}")
                self._local.relaxed = relaxed
            if not self._writers_gate.acquire(blocking=wait):
                return False
            try:
                if wait:
                    self._busy_wait(db, True)
                    db.execute("BEGIN IMMEDIATE")
                elif not self._begin_now(db):
                    return False
            finally:
                self._writers_gate.release()
            # Only the batch's channels can be created by it: a copy of every name per
            # commit cost ~2 ms on the loop at 100,000 channels.
            created = [name for name in batch.channels if name not in self._cids]
            mark = self.bodies.mark()
            try:
                self._apply(db, batch)
                if not relaxed and self.bodies.dirty:
                    # Bodies first: a durable segment row must find its body on the disk.
                    self.bodies.sync()
                db.execute("COMMIT")
            except BaseException:
                self.bodies.undo(*mark)
                # SQLite has rolled back by itself after SQLITE_FULL and I/O errors: a
                # ROLLBACK then fails ("no transaction is active") and hid the cause.
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                with self._cid_lock:  # channels created in the rolled-back transaction
                    for name in created:
                        self._cids.pop(name, None)
                raise
        except sqlite3.Error as exc:
            if _is_full(exc):
                raise self._full(db, str(exc)) from exc
            if _is_busy(exc):
                raise self._locked() from exc
            name = getattr(exc, "sqlite_errorname", type(exc).__name__)
            raise StorageUnavailable(f"commit failed: {exc} ({name})") from exc
        except (msgspec.EncodeError, TypeError, ValueError) as exc:
            raise StorageUnavailable(f"commit failed: {exc}") from exc
        except _QuotaReached as exc:
            raise self._full(db, str(exc)) from None
        except OSError as exc:  # a body file
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise self._full(db, f"body file: {exc.strerror}") from exc
            raise StorageUnavailable(f"commit failed: body file: {exc}") from exc
        self._check_in_place()
        self.check_wal_in_place()
        self._commits += 1
        if batch.forgets:
            with self._cid_lock:
                for name in batch.forgets:
                    self._cids.pop(name, None)
        if batch.truncates or batch.forgets:
            self._collect_body_files(db)
        with self._sync_lock:
            if relaxed:
                self._relaxed += 1
            else:  # the WAL was synced through this commit: every frame before it too
                self._synced = self._relaxed
        return True

    def _locked(self) -> StorageLocked:
        """The refusal for a commit that found SQLite's write lock held by another
        process past the busy timeout, naming the processes that have the file open."""
        who = other_holders([self.path, self.path + "-wal", self.path + "-shm"])
        held = (f"the database is open in {', '.join(who)}" if who else
                "no other process of this user has the database open")
        return StorageLocked(
            f"its write lock was held past SQLite's {BUSY_TIMEOUT_MS / 1000:g} s busy "
            f"timeout; {held}: an sqlite3 shell inside a transaction, a VACUUM or a "
            "backup tool that writes holds it until it ends", storage=self.path,
            holders=who)

    def _check_unlocked(self) -> None:
        """Raise StorageLocked while another process holds the write lock (the probe
        after a commit that found it held), without waiting for it."""
        db = self._db()
        with self._writers_gate:
            try:
                if not self._begin_now(db):
                    raise self._locked()
                db.execute("ROLLBACK")
            except sqlite3.Error as exc:  # not a lock: the next commit says what
                log.debug("the probe's BEGIN IMMEDIATE failed: %s", exc)
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
            finally:  # the probe's thread reads too: those wait for a lock as before
                with contextlib.suppress(sqlite3.Error):
                    self._busy_wait(db, True)

    def _busy_wait(self, db: sqlite3.Connection, wait: bool) -> None:
        """This thread's connection waits up to the busy timeout for SQLite's locks, or
        not at all. Set only when it changes: the event loop's connection begins every
        commit without waiting, and two more statements a commit were ~4 % of the
        broker's CPU at 2,000 msg/s."""
        if self._local.busy_wait != wait:
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS if wait else 0}")
            self._local.busy_wait = wait

    def _begin_now(self, db: sqlite3.Connection) -> bool:
        """BEGIN IMMEDIATE without waiting: False if another connection holds SQLite's
        write lock (an operator's shell, a backup tool), which the busy handler would
        wait up to 5 s for: the caller's thread is the event loop. The connection stays
        without a wait until this thread's next waiting commit."""
        self._busy_wait(db, False)
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_BUSY:
                raise
            return False
        return True

    def wal_moved(self) -> str:
        """Why the write-ahead log at its path is not the one SQLite writes ("" while
        it is): removed (taken for a temporary file) or replaced. One ``stat``."""
        if self._wal_identity is None:
            return ""
        try:
            st = os.stat(self.path + "-wal")
        except OSError as exc:
            return exc.strerror or str(exc)
        return "" if (st.st_dev, st.st_ino) == self._wal_identity else \
            "another file is there now"

    def check_wal_in_place(self) -> None:
        """Raise StorageUnavailable if the write-ahead log was removed or replaced while
        the broker ran, once what it holds is copied into the database file: SQLite goes
        on writing to the removed file, so every commit since the last checkpoint, and
        every one after, would be gone at the next start. The broker stops (a connection
        opened since writes a new log beside the old one); started again, it has
        everything. Run on a thread whose connection is older than the removal (the
        writer's: it opened the storage), which still has the old log open."""
        why = self.wal_moved()
        if not why:
            return
        try:
            db = self._db()
            with self._writers_gate:
                busy, frames, copied = db.execute("PRAGMA wal_checkpoint(FULL)").fetchone()
            rescued = (f"what it held ({copied} page(s)) was copied into the database "
                       "file" if not busy and copied >= frames else
                       f"only {copied} of its {frames} page(s) could be copied into the "
                       "database file (a reader held them)")
        except sqlite3.Error as exc:
            rescued = f"what it held could NOT be copied into the database file ({exc})"
        self._wal_identity = None  # said once
        raise StorageUnavailable(
            f"the write-ahead log {self.path}-wal was removed or replaced while the broker "
            f"ran ({why}): {rescued}; this commit is not confirmed, and the broker stops "
            "(start it again: it has everything that was copied)")

    def _check_in_place(self) -> None:
        """Raise StorageUnavailable if the database file is no longer the one this
        broker opened (removed, or replaced: an operator's mistake, a restore run
        beside it). SQLite would go on writing to the removed file, and every publish
        confirmed from then on would be gone at the next start."""
        try:
            st = os.stat(self.path)
            moved = (st.st_dev, st.st_ino) != self._identity
        except OSError as exc:
            moved, why = True, exc.strerror or str(exc)
        else:
            why = "another file is there now"
        if moved and self._identity is not None:
            raise StorageUnavailable(
                f"the database file {self.path} was removed or replaced while the broker "
                f"ran ({why}): this commit is not where the broker reads at its next start, "
                "so it is not confirmed; the broker stops")

    # ------------------------------------------------------ interval durability
    def unsynced(self) -> bool:
        return self._relaxed > self._synced

    def sync(self) -> None:
        """fdatasync the WAL: every commit made so far is on the disk after it. (The
        same file as SQLite's own descriptor: a sync through any descriptor writes the
        file's pages through. SQLite keeps the WAL file while a connection is open, and
        a checkpoint's reset rewrites it in place.)"""
        with self._sync_lock:
            upto = self._relaxed
            if upto <= self._synced:
                return
        # Every body those commits refer to was appended before they committed.
        self.bodies.sync()
        with self._sync_lock:  # the writer's thread and the syncer's both sync
            if self._wal_fd is None:
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            fd = self._wal_fd
        os.fdatasync(fd)
        with self._sync_lock:
            self._synced = max(self._synced, upto)

    # ------------------------------------------------------------ full disk
    def _check_headroom(self, db: sqlite3.Connection, batch: WriteBatch) -> None:
        """Raise StorageFull before messages would leave the disk too little room to take
        the WAL into the database file. A WAL whose pages the file cannot grow to hold is
        never checkpointed nor reset, so every later commit (acks too) appends to it
        until the disk is full for good: the broker could neither store nor free
        anything until an operator made room. One ``statvfs`` when the disk has room."""
        try:
            st = os.statvfs(self.data_dir)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        wal = self.wal_bytes()
        if free >= 2 * wal + 8 * WAL_HEADROOM_BYTES:  # the common case: nothing to add up
            return
        size = sum(len(m.data) for m in batch.messages) + READ_WEIGHT_BASE * len(batch.messages)
        # Pages freed inside the database file take new pages without it growing.
        unused = db.execute("PRAGMA freelist_count").fetchone()[0] * \
            db.execute("PRAGMA page_size").fetchone()[0]
        if free + unused - size < wal + WAL_HEADROOM_BYTES // 4:
            raise _QuotaReached(
                f"the disk keeps room to take the write-ahead log ({size_text(wal)}) into "
                "the database file, so that acks can free space again")

    def _full(self, db: sqlite3.Connection, cause: str) -> StorageFull:
        """The StorageFull to raise for ``cause``; gives the reserve back (first time)."""
        try:
            space = self.space()
        except (OSError, sqlite3.Error):
            space = {"disk_free": 0, "used": 0, "free": 0, "max_size": self.max_size}
        released = not self.reserve_released and self.reserve > 0
        self._release_reserve()
        with contextlib.suppress(sqlite3.Error):
            self._limit(db)
        return StorageFull(self.full_message(space, cause), data_dir=self.data_dir,
                           free_bytes=space["free"], disk_free_bytes=space["disk_free"],
                           cause=cause, reserve_released=released,
                           **({"max_size": self.max_size} if self.max_size else {}))

    def full_message(self, space: dict[str, Any], cause: str = "database or disk is full"
                     ) -> str:
        """What a refused request is told: the data dir, the free space, and why."""
        return segments.full_text(cause, f"the data directory {self.data_dir}", space,
                                  "free on its disk")

    def space(self) -> dict[str, Any]:
        """Free space as the writer sees it (call from the writer's thread): ``free`` is
        what publishes may still use (the disk, and ``max_size`` when set)."""
        db = self._db()
        try:
            st = os.statvfs(self.data_dir)
            disk_free = st.f_bavail * st.f_frsize
        except OSError:
            disk_free = 0
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        unused = db.execute("PRAGMA freelist_count").fetchone()[0]
        used = (pages - unused) * page_size + self.bodies.size_bytes()
        out = {"disk_free": disk_free, "used": used, "free": disk_free,
               "max_size": self.max_size, "unused": unused * page_size}
        if self.max_size is not None:
            out["free"] = min(disk_free, max(0, self.max_size - used))
        return out

    def probe(self) -> tuple[bool, dict[str, Any]]:
        """After StorageFull: is there room again? If so, take the reserve back first.
        Returns (room, space). After StorageLocked: StorageLocked while still locked."""
        self._check_unlocked()
        space = self.space()
        need = STORAGE_RESUME_BYTES
        if self.max_size is not None:
            need = min(need, self.max_size // 4)
        try:  # the disk must also have room to hold the reserve again
            missing = max(0, self.reserve - self.reserve_path.stat().st_size)
        except OSError:
            missing = max(0, self.reserve)
        # Pages acks freed inside the database file take new messages without it
        # growing: room too, once the disk can hold the reserve again and the WAL can
        # still be taken into the file (``_check_headroom``).
        disk = space["disk_free"] - missing
        if self.max_size is None:
            headroom = disk + space["unused"] - self.wal_bytes() - WAL_HEADROOM_BYTES // 4
            # and room on the disk itself for a WAL's worth of commits (large bodies go
            # to files): else the next commit finds it full again, a new episode a probe
            room = disk >= need // 4 and headroom >= need
        else:
            room = disk >= need and self.max_size - space["used"] >= need
        if room:
            self.reserve_released = False
            self._make_reserve()
            self._limit(self._db())
        return room, space

    def _make_reserve(self) -> bool:
        """Hold ``reserve`` bytes of the disk in a file of the data dir (really allocated:
        a sparse file would hold nothing)."""
        if self.reserve <= 0:
            return True
        path = self.reserve_path
        with contextlib.suppress(OSError):
            if path.stat().st_size >= self.reserve:
                return True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
            return False

    def _release_reserve(self) -> None:
        self.reserve_released = True
        with contextlib.suppress(OSError):
            self.reserve_path.unlink()

    def _apply(self, db: sqlite3.Connection, batch: WriteBatch) -> None:
        # A channel's next seq is also max(seq) + 1 of its stored messages, so the row
        # needs updating only when messages are removed (one page less per commit).
        removing = set(batch.truncates) | {c for c, _ in batch.deletes}
        for name, next_seq in batch.channels.items():
            if name not in self._cids:
                self._cid(db, name, next_seq)
            elif name in removing:
                db.execute("UPDATE channels SET next_seq = max(next_seq, ?) WHERE cid = ?",
                           (next_seq, self._cids[name]))
        # (a set less a dict's keys walks every key: ~1.5 ms a commit at 100,000 channels)
        cids = self._cids
        unknown = {c for c in {m.channel for m in batch.messages} | set(batch.truncates)
                   if c not in cids}
        if unknown:  # a core bug: a channel's first write must carry its next seq
            raise StorageUnavailable(f"batch writes to channels storage does not know: "
                                     f"{sorted(unknown)[:5]} (no next_seq given)")
        if batch.messages:
            by_channel: dict[str, list[Msg]] = {}
            for m in batch.messages:
                by_channel.setdefault(m.channel, []).append(m)
            db.executemany(
                "INSERT OR REPLACE INTO segments(rid, last_seq, published_at, expires_min, "
                "special, body, body_file) VALUES (?,?,?,?,?,?,?)",
                [self._stored(db, _segment_row(self._cids[c], run))
                 for c, msgs in by_channel.items() for run in runs(msgs)],
            )
        if batch.deletes:
            db.executemany(
                "INSERT OR IGNORE INTO removed(rid) VALUES (?)",
                [(_rid(self._cids[c], s),) for c, s in batch.deletes if c in self._cids],
            )
        for name, first in batch.truncates.items():
            cid = self._cids[name]
            db.execute("UPDATE channels SET first_seq = max(first_seq, ?) WHERE cid = ?",
                       (first, cid))
            db.execute("DELETE FROM segments WHERE rid >= ? AND rid < ? AND last_seq < ?",
                       (_rid(cid, 0), _rid(cid, first), first))
            db.execute("DELETE FROM removed WHERE rid >= ? AND rid < ?",
                       (_rid(cid, 0), _rid(cid, first)))
        for name in batch.forgets:
            cid = self._cids.get(name)
            if cid is not None:  # its cid leaves _cids once committed (apply)
                db.execute("DELETE FROM segments WHERE rid >= ? AND rid < ?",
                           (_rid(cid, 0), _rid(cid + 1, 0)))
                db.execute("DELETE FROM removed WHERE rid >= ? AND rid < ?",
                           (_rid(cid, 0), _rid(cid + 1, 0)))
                db.execute("DELETE FROM channels WHERE cid = ?", (cid,))
        for key, gdef in batch.group_defs.items():
            if gdef is None:
                db.execute("DELETE FROM groups WHERE key = ?", (key,))
                db.execute("DELETE FROM group_states WHERE grp = ?", (key,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO groups(key, kind, patterns, start) VALUES (?,?,?,'')",
                    (key, gdef.kind, msgspec.json.encode(list(gdef.patterns)).decode()),
                )
        upserts = [(g, c, v[0], v[1]) for (g, c), v in batch.group_states.items() if v]
        if upserts:
            db.executemany(
                "INSERT OR REPLACE INTO group_states(grp, channel, floor, state) VALUES (?,?,?,?)",
                upserts,
            )
        removed = [(g, c) for (g, c), v in batch.group_states.items() if v is None]
        if removed:
            db.executemany("DELETE FROM group_states WHERE grp = ? AND channel = ?", removed)
        if batch.dedup:
            db.executemany(
                "INSERT OR REPLACE INTO dedup(channel, key, expires_at, seq, id) "
                "VALUES (?,?,?,?,?)",
                batch.dedup,
            )
            if self._commits % 1000 == 0:
                db.execute("DELETE FROM dedup WHERE expires_at < ?", (batch.dedup[0][2] - 3600,))
        _put_or_drop(db, "clients", "client_id", "record", batch.clients)
        _put_or_drop(db, "credentials", "id", "record", batch.credentials)
        for writer in batch.dropped_fences:
            db.execute("DELETE FROM fences WHERE writer = ?", (writer,))
        _put_or_drop(db, "writers", "writer", "owner", batch.writers)
        if batch.meta:
            _put_or_drop(db, "meta", "key", "value", batch.meta)
        if batch.fences:
            db.executemany(
                "INSERT OR REPLACE INTO fences(writer, channel, batch) VALUES (?, ?, ?)",
                [(w, c, b) for (w, c), b in batch.fences.items()])
        if batch.used_tokens:
            db.executemany("INSERT OR IGNORE INTO used_tokens(jti, expires) VALUES (?, ?)",
                           batch.used_tokens)
            # Every token lives at most an hour, so an expiry an hour before the oldest
            # one being stored is surely past (an index range, now and then).
            if self._commits % 64 == 0:
                db.execute("DELETE FROM used_tokens WHERE expires < ?",
                           (min(e for _, e in batch.used_tokens) - 3600,))
        _put_or_drop(db, "reservations", "channel", "owner", batch.reservations)
        if batch.staged:
            db.executemany("INSERT OR REPLACE INTO staged(owner, txn, part, body, touched) "
                           "VALUES (?,?,?,?,?)",
                           [(o, t, p, _enc.encode(sends), at) for o, t, p, sends, at in
                            batch.staged])
        if batch.unstaged:
            db.executemany("DELETE FROM staged WHERE owner = ? AND txn = ?", batch.unstaged)
        if batch.txn_done:  # part 0: the commit's answer, kept while it may be asked again
            db.executemany("INSERT OR REPLACE INTO staged(owner, txn, part, body, touched) "
                           "VALUES (?,?,0,?,?)",
                           [(o, t, _enc.encode(result), at) for o, t, result, at in
                            batch.txn_done])
        if batch.producers:
            rows = [row for row in batch.producers.values() if row is not None]
            if rows:
                db.executemany("INSERT OR REPLACE INTO producers(client, producer, channel, "
                               "last, run_pseq, run_last, run_seq, id_hash, used, refused) "
                               "VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            drop = [key for key, row in batch.producers.items() if row is None]
            if drop:
                db.executemany("DELETE FROM producers WHERE client = ? AND producer = ? AND "
                               "channel = ?", drop)

    def _stored(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """A segment row as stored: a large body goes to a body file, the row keeps
        where (body_file set); a small one stays in the row (body_file NULL)."""
        body = row[-1]
        if len(body) < self.body_file_min:
            return (*row, None)
        if self.max_size is not None:
            self._check_quota(db, len(body))
        number, offset = self.bodies.append(body)
        return (*row[:-1], _BODY_REF.pack(offset, len(body)), number)

    def _check_quota(self, db: sqlite3.Connection, adding: int) -> None:
        """``max_size`` counts body files too; SQLite's page limit sees only its pages."""
        assert self.max_size is not None
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        unused = db.execute("PRAGMA freelist_count").fetchone()[0]
        used = (pages - unused) * page_size + self.bodies.size_bytes()
        limit = self.max_size + (self.reserve if self.reserve_released else 0)
        if used + adding > limit:
            raise _QuotaReached(f"[storage] max_size: {size_text(used)} used, a body of "
                                f"{size_text(adding)} does not fit")

    def _collect_body_files(self, db: sqlite3.Connection) -> None:
        """Delete body files no segment refers to any more, after a commit that removed
        segments (at most twice a second: a look at one index). From the writer's
        thread only: it alone adds references, and only to the current file."""
        now = time.monotonic()
        if self.bodies.files() < 2 or now - self._collected_at < self.body_collect_interval:
            return
        self._collected_at = now
        with contextlib.suppress(sqlite3.Error, OSError):
            gone = self.bodies.collect(self._referenced_body_files(db))
            if gone:
                log.debug("deleted %d body file(s) no message refers to", gone)

    def _first_seq(self, db: sqlite3.Connection, cid: int) -> int:
        row = db.execute("SELECT first_seq FROM channels WHERE cid = ?", (cid,)).fetchone()
        return row[0] if row else 1

    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int,
                   max_bytes: int | None = None) -> list[Msg]:
        return _read_again_if_gone(self._read_range, channel, from_seq, to_seq, limit,
                                   max_bytes)

    def _read_range(self, channel: str, from_seq: int, to_seq: int, limit: int,
                    max_bytes: int | None) -> list[Msg]:
        cid = self._cids.get(channel)
        if cid is None or limit <= 0:
            return []
        db = self._db()
        lo = max(from_seq, self._first_seq(db, cid), 0)
        hi = min(to_seq, SEQ_MASK)
        if lo >= hi:
            return []
        start = db.execute(
            "SELECT max(rid) FROM segments WHERE rid >= ? AND rid <= ?", (_rid(cid, 0),
                                                                         _rid(cid, lo))
        ).fetchone()[0]
        removed = {r & SEQ_MASK for (r,) in db.execute(
            "SELECT rid FROM removed WHERE rid >= ? AND rid < ?", (_rid(cid, lo),
                                                                   _rid(cid, hi)))}
        out: list[Msg] = []
        size, most = 0, max_bytes if max_bytes is not None else 1 << 62
        for body, body_file in db.execute(
            "SELECT body, body_file FROM segments WHERE rid >= ? AND rid < ? ORDER BY rid",
            (start if start is not None else _rid(cid, lo), _rid(cid, hi)),
        ):
            for m in _segment.decode(self._body(body, body_file)):
                if lo <= m.seq < hi and m.seq not in removed:
                    out.append(m)
                    size += read_weight(m) if m.headers else len(m.data) + READ_WEIGHT_BASE
                    if len(out) >= limit or size >= most:
                        return out
        return out

    def expired(self, now: float, limit: int) -> list[Msg]:
        return _read_again_if_gone(self._expired, now, limit)

    def _expired(self, now: float, limit: int) -> list[Msg]:
        db = self._db()
        out: list[Msg] = []
        firsts: dict[int, int] = {}
        for rid, body, body_file in db.execute(
            "SELECT rid, body, body_file FROM segments WHERE expires_min IS NOT NULL "
            "AND expires_min <= ?", (now,),
        ):
            if rid in self._expiry_done:
                continue
            cid = rid >> SEQ_BITS
            if cid not in firsts:
                firsts[cid] = self._first_seq(db, cid)
            msgs = _segment.decode(self._body(body, body_file))
            removed = {r & SEQ_MASK for (r,) in db.execute(
                "SELECT rid FROM removed WHERE rid >= ? AND rid <= ?",
                (rid, _rid(cid, msgs[-1].seq)))}
            due = [m for m in msgs if m.expires_at is not None and m.expires_at <= now
                   and m.seq >= firsts[cid] and m.seq not in removed]
            if not due and all(m.expires_at is None or m.expires_at <= now for m in msgs):
                self._expiry_done.add(rid)  # nothing left to expire here: skip it from now on
            out.extend(due)
            if len(out) >= limit:
                break
        return out[:limit]

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        """The seq after the last message below ``below`` published before ``cutoff``."""
        return _read_again_if_gone(self._retained_until, channel, below, cutoff)

    def _retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        cid = self._cids.get(channel)
        if cid is None:
            return None
        db = self._db()

        def first_at_or_after(seq: int) -> tuple[int, float] | None:
            row = db.execute(
                "SELECT rid, published_at FROM segments WHERE rid >= ? AND rid < ? "
                "ORDER BY rid LIMIT 1", (_rid(cid, seq), _rid(cid, below))).fetchone()
            return (row[0] & SEQ_MASK, row[1]) if row else None

        def body_of(seq: int) -> bytes:
            row = db.execute("SELECT body, body_file FROM segments WHERE rid = ?",
                             (_rid(cid, seq),)).fetchone()
            return bytes(self._body(*row))

        return segments.retained_until(first_at_or_after, body_of, below, cutoff)

    def checkpoint(self, truncate: bool = False, *, restart: bool = False) -> None:
        """Copy committed WAL pages into the database file without blocking the writer
        (PASSIVE). Then, once the WAL would hold more than half its threshold by the next
        call at the pace it grew since the last one (or ``restart``: it crowds a nearly
        full disk), a RESTART checkpoint: it copies the few frames the writer appended
        meanwhile (holding the writer back for just that) so that the next commit
        writes the WAL from its start again. Without it a WAL under steady writes is
        never caught up with, never reset, and only grows; run on every call (every
        tick, 4 a second) it held the writer back 4 times a second for 2-12 ms, which
        made the commits' p99. The file keeps its size and is written over: cutting it
        (TRUNCATE) under load cost the writer 15-25 ms each time (freeing the file's
        blocks), so ``truncate`` is for an idle broker, to give the disk back (while the
        disk has room to spare the file is kept instead, written out ahead again if it
        was cut: ``keeps_wal``); ``journal_size_limit`` cuts it to the threshold at a
        reset too."""
        db = self._db()
        if not self._room_to_checkpoint(db):
            return
        try:
            _busy, frames, _copied = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.OperationalError as exc:
            if _is_full(exc):
                return  # no room to grow the database file: the pages wait in the WAL
            raise
        if self._local.page_size is None:
            self._local.page_size = db.execute("PRAGMA page_size").fetchone()[0]
        # What the WAL will hold at the next look if it grows as much as since the last
        # one: past half the threshold, it starts over now (the file stays within the
        # threshold and a half however fast commits come).
        grown = frames - self._wal_frames if frames >= self._wal_frames else frames
        self._wal_frames = frames
        soon = (frames + grown) * (self._local.page_size + WAL_FRAME_HEADER)
        if not (truncate or restart) and soon <= self.wal_limit // 2:
            return
        keep = truncate and self.keeps_wal()
        if self.wal_bytes() > 0:
            # Never hold a waking writer back long: a reader still on the old pages
            # makes it give up (busy), and the next tick tries again.
            db.execute(f"PRAGMA busy_timeout={50 if truncate else 5}")
            try:
                mode = "TRUNCATE" if truncate and not keep else "RESTART"
                with self._writers_gate:
                    busy = db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()[0]
                if not busy:
                    self.restarts += 1
            except sqlite3.OperationalError:
                pass  # busy: try again next time
            finally:
                db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
                self._local.busy_wait = True
        if keep:
            self._prefill_wal(db)  # cut before, while the disk was crowded

    def _room_to_checkpoint(self, db: sqlite3.Connection) -> bool:
        """Whether the disk can hold what the database file must grow by to take the WAL
        in. On a full disk a checkpoint that cannot finish would only eat the room left
        (the reserve given back for acks) and free nothing: the WAL stays until it can."""
        try:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            grow = pages * db.execute("PRAGMA page_size").fetchone()[0] \
                - os.path.getsize(self.path)
            if grow <= 0:
                return True
            st = os.statvfs(self.data_dir)
            return grow < st.f_bavail * st.f_frsize
        except (OSError, sqlite3.Error):
            return True

    def wal_bytes(self) -> int:
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total + self.bodies.size_bytes()

    def close(self) -> None:
        if self._wal_fd is not None:
            with contextlib.suppress(OSError):
                if self.unsynced():
                    os.fdatasync(self._wal_fd)
                os.close(self._wal_fd)
            self._wal_fd = None
        self.bodies.close()
        self.close_here()

    def close_here(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
