"""Embedded storage: one SQLite file in WAL mode, one transaction per batch.

``synchronous=FULL`` makes every commit fsync the WAL, so a batch is on disk
when ``apply`` returns; the broker confirms publishes only after that. The
writer and the reader each use their own connection (WAL lets reads run
beside the writer); every method is called from one thread per connection.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import msgspec

from ..core.group import GroupDef
from ..core.log import Msg
from ..core.writes import WriteBatch
from ..errors import StorageUnavailable
from .base import ChannelRecord, Snapshot

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS channels(
    cid INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, next_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS messages(
    rid INTEGER PRIMARY KEY, id TEXT NOT NULL, data BLOB NOT NULL,
    raw INTEGER NOT NULL, headers BLOB, priority INTEGER NOT NULL, published_at REAL NOT NULL,
    expires_at REAL, deliver_at REAL, key TEXT);
CREATE INDEX IF NOT EXISTS messages_expiry ON messages(expires_at)
    WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS messages_special ON messages(rid)
    WHERE priority > 0 OR deliver_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS groups(
    key TEXT PRIMARY KEY, kind TEXT NOT NULL, patterns TEXT NOT NULL, start TEXT NOT NULL)
    WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_states(
    grp TEXT NOT NULL, channel TEXT NOT NULL, floor INTEGER NOT NULL, state BLOB NOT NULL,
    PRIMARY KEY (grp, channel)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dedup(
    channel TEXT NOT NULL, key TEXT NOT NULL, expires_at REAL NOT NULL, seq INTEGER NOT NULL,
    id TEXT NOT NULL, PRIMARY KEY (channel, key)) WITHOUT ROWID;
"""

# A message's row id is its channel id and seq in one integer (cid << 40 | seq): the
# table's own B-tree is the (channel, seq) index, a channel's messages are one key range,
# and appends land at the end of it. Rows up to ~4 KiB stay inline on their page.
SEQ_BITS = 40
SEQ_MASK = (1 << SEQ_BITS) - 1
_COLUMNS = (f"rid & {SEQ_MASK}, id, data, raw, headers, priority, published_at, expires_at, "
            "deliver_at, key")
_INSERT_COLUMNS = "rid, id, data, raw, headers, priority, published_at, expires_at, deliver_at, key"


def _rid(cid: int, seq: int) -> int:
    return (cid << SEQ_BITS) | seq
_enc = msgspec.msgpack.Encoder()
_headers_dec = msgspec.msgpack.Decoder(dict[str, str])


def _msg(channel: str, row: Any) -> Msg:
    seq, ident, data, raw, h, prio, pub, exp, dl, key = row
    return Msg(channel, seq, ident, data, bool(raw), _headers_dec.decode(h) if h else None,
               prio, pub, exp, dl, key)


class SQLiteStorage:
    def __init__(self, data_dir: str | os.PathLike[str], *, filename: str = "minou.db") -> None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        self.path = str(Path(data_dir).resolve() / filename)
        self._local = threading.local()
        self._cids: dict[str, int] = {}
        self._cid_lock = threading.Lock()
        self._commits = 0

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
                db.execute("PRAGMA busy_timeout=5000")
                db.execute("PRAGMA cache_size=-8000")  # KiB; bodies are cached by the core
                # Checkpoints run beside the writer (``checkpoint``), not inside its commits,
                # so a commit's latency is one WAL append and one fsync.
                db.execute("PRAGMA wal_autocheckpoint=0")
                db.execute("PRAGMA journal_size_limit=67108864")
            except sqlite3.Error as exc:
                raise StorageUnavailable(f"cannot open {self.path}: {exc}") from exc
            self._local.db = db
        return db

    def open(self, now: float) -> Snapshot:
        db = self._db()
        try:
            db.executescript(SCHEMA)
            return self._snapshot(db, now)
        except sqlite3.DatabaseError as exc:
            raise StorageUnavailable(f"cannot read {self.path}: {exc}") from exc

    def _snapshot(self, db: sqlite3.Connection, now: float) -> Snapshot:
        snap = Snapshot()
        names: dict[int, str] = {}
        for cid, name, next_seq in db.execute("SELECT cid, name, next_seq FROM channels"):
            names[cid] = name
            self._cids[name] = cid
            lo, hi = _rid(cid, 0), _rid(cid, SEQ_MASK)
            row = db.execute(
                "SELECT min(rid), max(rid), count(*) FROM messages WHERE rid BETWEEN ? AND ?",
                (lo, hi),
            ).fetchone()
            if row[1] is not None:
                next_seq = max(next_seq, (row[1] & SEQ_MASK) + 1)
            first = row[0] & SEQ_MASK if row[0] is not None else next_seq
            rec = ChannelRecord(name, next_seq, first, row[2])
            if rec.count < next_seq - first:  # holes (TTL, dead-lettered): name them
                present = {r & SEQ_MASK for (r,) in db.execute(
                    "SELECT rid FROM messages WHERE rid BETWEEN ? AND ?", (lo, hi))}
                rec.gone = [s for s in range(first, next_seq) if s not in present]
            snap.channels.append(rec)
        for rid, priority, deliver_at in db.execute(
            "SELECT rid, priority, deliver_at FROM messages "
            "WHERE priority > 0 OR deliver_at IS NOT NULL"
        ):
            snap.specials.append((names[rid >> SEQ_BITS], rid & SEQ_MASK, priority, deliver_at))
        groups = db.execute("SELECT key, kind, patterns, start FROM groups")
        for key, kind, patterns, start in groups:
            snap.groups.append(GroupDef(key, kind, tuple(msgspec.json.decode(patterns)), start))
        snap.group_states = [
            tuple(r) for r in db.execute("SELECT grp, channel, floor, state FROM group_states")
        ]  # type: ignore[misc]
        snap.dedup = [
            tuple(r)
            for r in db.execute(
                "SELECT channel, key, expires_at, seq, id FROM dedup WHERE expires_at > ?", (now,)
            )
        ]  # type: ignore[misc]
        return snap

    def _cid(self, db: sqlite3.Connection, name: str, next_seq: int) -> int:
        cid = self._cids.get(name)
        if cid is None:
            cur = db.execute(
                "INSERT INTO channels(name, next_seq) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET next_seq = max(next_seq, excluded.next_seq) "
                "RETURNING cid",
                (name, next_seq),
            )
            cid = cur.fetchone()[0]
            with self._cid_lock:
                self._cids[name] = cid
        return cid

    def apply(self, batch: WriteBatch) -> None:
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            known = set(self._cids)
            try:
                self._apply(db, batch)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                with self._cid_lock:  # channels created in the rolled-back transaction
                    for name in set(self._cids) - known:
                        del self._cids[name]
                raise
        except sqlite3.Error as exc:
            raise StorageUnavailable(f"commit failed: {exc}") from exc
        self._commits += 1

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
        if batch.messages:
            cids = self._cids
            db.executemany(
                f"INSERT OR REPLACE INTO messages({_INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                [
                    ((cids[m.channel] << SEQ_BITS) | m.seq, m.id, m.data, m.raw,
                     _enc.encode(m.headers) if m.headers else None, m.priority,
                     m.published_at, m.expires_at, m.deliver_at, m.key)
                    for m in batch.messages
                ],
            )
        if batch.deletes:
            db.executemany(
                "DELETE FROM messages WHERE rid = ?",
                [(_rid(self._cids[c], s),) for c, s in batch.deletes if c in self._cids],
            )
        for name, first in batch.truncates.items():
            cid = self._cids[name]
            db.execute("DELETE FROM messages WHERE rid >= ? AND rid < ?",
                       (_rid(cid, 0), _rid(cid, first)))
        for key, gdef in batch.group_defs.items():
            if gdef is None:
                db.execute("DELETE FROM groups WHERE key = ?", (key,))
                db.execute("DELETE FROM group_states WHERE grp = ?", (key,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO groups(key, kind, patterns, start) VALUES (?,?,?,?)",
                    (key, gdef.kind, msgspec.json.encode(list(gdef.patterns)).decode(),
                     gdef.start),
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

    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int) -> list[Msg]:
        cid = self._cids.get(channel)
        if cid is None:
            return []
        rows = self._db().execute(
            f"SELECT {_COLUMNS} FROM messages WHERE rid >= ? AND rid < ? ORDER BY rid LIMIT ?",
            (_rid(cid, max(from_seq, 0)), _rid(cid, min(to_seq, SEQ_MASK)), limit),
        )
        return [_msg(channel, row) for row in rows]

    def expired(self, now: float, limit: int) -> list[Msg]:
        names = {cid: name for name, cid in list(self._cids.items())}
        rows = self._db().execute(
            f"SELECT rid >> {SEQ_BITS}, {_COLUMNS} FROM messages "
            "WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT ?",
            (now, limit),
        )
        return [_msg(names[cid], row) for cid, *row in rows if cid in names]

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        """The seq after the last message below ``below`` published before ``cutoff``."""
        cid = self._cids.get(channel)
        if cid is None:
            return None
        db = self._db()

        def first_at_or_after(seq: int) -> tuple[int, float] | None:
            row = db.execute(
                "SELECT rid, published_at FROM messages WHERE rid >= ? AND rid < ? "
                "ORDER BY rid LIMIT 1", (_rid(cid, seq), _rid(cid, below))).fetchone()
            return (row[0] & SEQ_MASK, row[1]) if row else None

        # Publish times grow with seq: binary search on the primary key, no scan.
        first = first_at_or_after(0)
        if first is None or first[1] >= cutoff:
            return None
        lo, hi = first[0], below  # lo is known old; the answer lies in (lo, hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = first_at_or_after(mid)
            if found is not None and found[1] < cutoff:
                lo = found[0]  # an old live message at or after mid
            else:
                hi = mid  # nothing old in [mid, hi)
        return lo + 1

    def checkpoint(self, truncate: bool = False) -> None:
        """Copy committed WAL pages into the database file without blocking the writer;
        with ``truncate`` (the broker is idle) also shrink the WAL file to nothing."""
        db = self._db()
        db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        if truncate and os.path.exists(self.path + "-wal") and \
                os.path.getsize(self.path + "-wal") > (4 << 20):
            db.execute("PRAGMA busy_timeout=50")  # never hold a waking writer back long
            try:
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.OperationalError:
                pass  # busy: try again next time
            finally:
                db.execute("PRAGMA busy_timeout=5000")

    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.path.getsize(self.path + suffix)
        return total

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
