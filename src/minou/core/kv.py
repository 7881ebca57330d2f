"""Key-value buckets on the one model: a bucket is a channel, a put a message. No I/O.

Bucket ``config`` is the channel ``_kv/v1/config``. A put of ``limit`` is a message
whose ``key`` is ``limit``; its seq is the value's **revision**. A delete is a message
with header ``x-kv-op: del`` (a tombstone: the key's latest revision says "no value").
So a bucket is durable, replicated and guarded by rules exactly as any channel.

What the core adds is an index per bucket (``KvIndex``, on ``ChannelLog.kv``): for each
key its revisions still stored, oldest first. It serves

* **compare-and-set**: a put or delete carrying ``x-kv-expect: R`` is stored only if the
  key's latest revision, counting the ones staged and not yet committed, is ``R`` (``0``:
  the key has no value). Checked when staged, in the core's one thread, so two
  concurrent writers cannot both win; a staged revision whose commit fails is undone
  (``unstage``), so the next check sees what is really stored;
* **history depth**: once committed, a key keeps its last ``history`` revisions (the
  bucket's option, default 1); older ones are deleted from the channel (``commit``
  returns them). Readers never truncate a bucket: its revisions are its state;
* reads (``get``, ``keys``, ``history``) by the adapter, which loads bodies by seq.

Revisions leave the index only with their message (``ChannelLog.delete_one`` and
``truncate_below`` call ``forget``): a TTL expiry, a purge, overflow, idle expiry. The
index is rebuilt from storage at start and when a broker adopts a spread queue
(``rebuild``): it holds no state that storage does not.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from typing import Protocol

import msgspec

from ..errors import BadRequest, QueueFull, RevisionMismatch
from ..limits import MAX_KV_KEY_BYTES, MAX_KV_REVISION, MAX_KV_REVISIONS_TOTAL
from ..names import KV_DELETE, KV_EXPECT, KV_OP, kv_bucket, validate_kv_key
from ..protocol.frames import Send


class Msg(Protocol):
    """What the index reads of a stored message (``log.Msg``, which imports this)."""

    @property
    def seq(self) -> int: ...
    @property
    def key(self) -> str | None: ...
    @property
    def headers(self) -> dict[str, str] | None: ...
    @property
    def expires_at(self) -> float | None: ...


class Revision(msgspec.Struct, array_like=True, gc=False):
    """What the index reads of a stored revision, its value left out: a bucket's
    revisions are read whole before they are indexed (``rebuild``), and with their
    values that was every value of every bucket in memory at once at each start."""

    seq: int
    key: str | None
    headers: dict[str, str] | None  # TOMBSTONE (one dict for all) or None
    expires_at: float | None


TOMBSTONE = {KV_OP: KV_DELETE}
# Keys gone from an index that its ordered list may still hold (skipped by reads) before
# they are left out of it; or half of those listed, if more.
STALE_KEPT = 1_000


def revision_of(msg: Msg, keys: dict[str, str]) -> Revision:
    """``msg``'s part in the index; its key as ``keys`` has it (one string per key while a
    bucket is read, as the index keeps one: not one per revision until it is indexed)."""
    key = msg.key if msg.key is None else keys.setdefault(msg.key, msg.key)
    return Revision(msg.seq, key, TOMBSTONE if is_tombstone(msg.headers) else None,
                    msg.expires_at)


def is_tombstone(headers: dict[str, str] | None) -> bool:
    return bool(headers) and headers.get(KV_OP) == KV_DELETE  # type: ignore[union-attr]


class KvCount:
    """The revisions indexed over every bucket of a broker, and the characters of their
    keys (each key once): both cost memory."""

    __slots__ = ("key_bytes", "total")

    def __init__(self) -> None:
        self.total = 0
        self.key_bytes = 0  # keys are ASCII (validate_kv_key): a character is a byte


class KvIndex:
    """The revisions of one bucket's keys (see the module docstring)."""

    __slots__ = ("added", "count", "deleted", "expires", "key_of", "ordered", "revisions",
                 "staged", "stale", "tombstones")

    def __init__(self) -> None:
        self.count = KvCount()  # the broker's (BrokerState.kv_count) once attached
        self.revisions: dict[str, list[int]] = {}  # committed and stored, oldest first
        self.key_of: dict[int, str] = {}  # every revision above -> its key
        self.tombstones: set[int] = set()  # revisions that are deletes
        self.expires: dict[int, float] = {}  # revisions with a TTL -> when they expire
        # Staged, not committed yet: key -> [(seq, is a delete)] in seq order.
        self.staged: dict[str, deque[tuple[int, bool]]] = {}  # by seq: oldest first
        # The keys in order, for a page of ``keys`` without sorting the bucket: sorting
        # every key for each page held the event loop ~90 ms a page of a 100,000-key
        # bucket (listing it whole: 100 pages, ~9 s; 1,000,000 keys: ~20 min). Keys
        # made since are ``added`` (merged at the next read: one pass, a sorted run and
        # a short tail); keys gone since are ``stale`` in ``ordered`` (skipped, dropped
        # once they are many). ``deleted``: keys whose latest revision is a delete.
        self.ordered: list[str] = []
        self.added: list[str] = []
        self.stale: set[str] = set()
        self.deleted = 0

    def __len__(self) -> int:
        return len(self.key_of)

    # ---------------------------------------------------------------- reads
    def latest(self, key: str, now: float) -> int:
        """The committed revision holding ``key``'s value, or 0: none, deleted or expired."""
        revs = self.revisions.get(key)
        if not revs:
            return 0
        seq = revs[-1]
        if seq in self.tombstones:
            return 0
        expires = self.expires.get(seq)
        return 0 if expires is not None and expires <= now else seq

    def history(self, key: str) -> list[int]:
        """Every stored revision of ``key``, deletes included, oldest first."""
        return list(self.revisions.get(key, ()))

    def keys(self, prefix: str, now: float, after: str = "", limit: int = 0) -> list[str]:
        """The keys with a value, starting with ``prefix``, sorted, after ``after``: at
        most ``limit`` (0: all), found from where the page starts (``ordered``)."""
        ordered = self._ordered()
        i = max(bisect_right(ordered, after), bisect_left(ordered, prefix))
        found: list[str] = []
        revisions = self.revisions
        while i < len(ordered) and (not limit or len(found) < limit):
            key = ordered[i]
            if not key.startswith(prefix):
                break  # sorted: the keys with the prefix are together
            if key in revisions and self.latest(key, now):
                found.append(key)
            i += 1
        return found

    def live_keys(self, now: float) -> int:
        """How many keys have a value (``len(keys("", now))``, without walking them):
        those not deleted, less those whose value expired and is not removed yet."""
        expired = 0
        for seq, when in self.expires.items():
            if when <= now and seq not in self.tombstones:
                key = self.key_of.get(seq)
                if key is not None and self.revisions[key][-1] == seq:
                    expired += 1
        return len(self.revisions) - self.deleted - expired

    def _ordered(self) -> list[str]:
        if self.added:
            self.ordered += self.added
            self.ordered.sort()  # a sorted run and a short tail: about one pass
            self.added.clear()
        return self.ordered

    def _drop_stale(self) -> None:
        """Once the keys gone are many (as many as half those listed), leave them out:
        checked as they go, so keys made and removed without a read in between (a TTL)
        are not kept for ever."""
        if len(self.stale) > max(STALE_KEPT, (len(self.ordered) + len(self.added)) // 2):
            stale = self.stale
            self.ordered = [k for k in self._ordered() if k not in stale]
            self.stale = set()

    # ------------------------------------------------------------- writes
    def check(self, key: str, expect: int, now: float) -> None:
        """Refuse a compare-and-set unless ``key`` is at revision ``expect`` now, counting
        what is staged (0: no value)."""
        staged = self.staged.get(key)
        if staged:
            seq, deleted = staged[-1]
            current = 0 if deleted else seq
        else:
            current = self.latest(key, now)
        if current != expect:
            raise RevisionMismatch(
                f"key {key!r} is at revision {current}, not {expect}" if current else
                f"key {key!r} has no value (revision 0), not revision {expect}",
                key=key, revision=current)

    def stage(self, msg: Msg) -> None:
        self.staged.setdefault(msg.key or "", deque()).append(
            (msg.seq, is_tombstone(msg.headers)))

    def unstage(self, msg: Msg) -> None:
        """``msg`` will never be committed (its commit failed, or overflow dropped it),
        or is committed now (``commit``)."""
        key = msg.key or ""
        staged = self.staged.get(key)
        if staged:
            if staged[0][0] == msg.seq:  # commits come in seq order: the oldest staged
                staged.popleft()
            else:  # a failed or dropped one, anywhere: rebuilding the whole queue of a
                # key per committed message made a batch of n updates of one key n^2
                kept = [s for s in staged if s[0] != msg.seq]
                staged.clear()
                staged.extend(kept)
            if not staged:
                del self.staged[key]

    def commit(self, msg: Msg, history: int) -> list[int]:
        """``msg`` is durable and visible: make it its key's latest revision; return the
        revisions past ``history`` that must now be deleted from the channel."""
        self.unstage(msg)
        key = msg.key or ""
        revs = self.revisions.get(key)
        if revs is None:
            revs = self.revisions[key] = []
            self.count.key_bytes += len(key)
            if key in self.stale:  # gone, then back: still in ``ordered``
                self.stale.discard(key)
            else:
                self.added.append(key)
        else:
            self.deleted -= revs[-1] in self.tombstones
            # The key's one string, as its oldest revision holds it: each message brings
            # its own copy, and keeping that per revision held a 256-character key
            # again for each of its revisions (~300 B each).
            key = self.key_of[revs[0]]
        revs.append(msg.seq)
        self.key_of[msg.seq] = key
        self.count.total += 1
        if is_tombstone(msg.headers):
            self.tombstones.add(msg.seq)
            self.deleted += 1
        if msg.expires_at is not None:
            self.expires[msg.seq] = msg.expires_at
        return revs[:-history] if len(revs) > history else []

    def forget(self, seq: int) -> None:
        """Revision ``seq`` was deleted from the channel."""
        key = self.key_of.pop(seq, None)
        if key is None:
            return
        self.count.total -= 1
        revs = self.revisions[key]
        if revs[-1] == seq:  # its latest: the key's state is the one before, or none
            self.deleted -= seq in self.tombstones
            self.deleted += len(revs) > 1 and revs[-2] in self.tombstones
        self.tombstones.discard(seq)
        self.expires.pop(seq, None)
        revs.remove(seq)
        if not revs:
            del self.revisions[key]
            self.count.key_bytes -= len(key)
            self.stale.add(key)
            self._drop_stale()

    def uncount(self) -> None:
        """This bucket leaves the broker (its queue handed on, ``ownership.release``):
        its revisions and keys no longer count against the broker's bounds."""
        self.count.total -= len(self.key_of)
        self.count.key_bytes -= sum(map(len, self.revisions))

    def forget_below(self, seq: int) -> None:
        for old in [s for s in self.key_of if s < seq]:
            self.forget(old)

    def rebuild(self, msgs: Sequence[Msg], history: int) -> list[int]:
        """Index stored messages (in seq order, after a start or an adoption); return
        the revisions past ``history`` to delete (the option may have shrunk)."""
        drop: list[int] = []
        for msg in msgs:
            if msg.seq not in self.key_of and msg.key:
                drop += self.commit(msg, history)
        return drop


def check_key_room(count: KvCount, key: str) -> None:
    """Refuse a new ``key`` if the keys indexed would pass MAX_KV_KEY_BYTES with it
    (checked when staged, as the revisions are: a batch being written may pass it a
    little)."""
    if count.key_bytes + len(key) > MAX_KV_KEY_BYTES:
        raise QueueFull(f"the keys of this broker's buckets hold {count.key_bytes} bytes, "
                        f"a new key of {len(key)} would pass the limit of "
                        f"{MAX_KV_KEY_BYTES}: use shorter keys, or fewer (a deleted key "
                        "stays, as its delete marker, until its bucket is purged)",
                        limit=MAX_KV_KEY_BYTES)


def checked_put(send: Send, index: KvIndex, now: float) -> Send:
    """Check a write to a bucket (a key, no delay or priority, a well-formed
    compare-and-set) against ``index``; return it as it is stored (without the
    expected revision, which is a condition, not data)."""
    bucket = kv_bucket(send.channel)
    if index.count.total >= MAX_KV_REVISIONS_TOTAL:
        raise QueueFull(f"the buckets of this broker hold {index.count.total} revisions, "
                        f"the limit is {MAX_KV_REVISIONS_TOTAL}: delete keys, or lower "
                        "history", limit=MAX_KV_REVISIONS_TOTAL)
    if send.key is None:
        raise BadRequest(f"a write to bucket {bucket!r} names its key (the message key)")
    validate_kv_key(send.key)
    if send.key not in index.revisions:
        check_key_room(index.count, send.key)
    if send.delay or send.priority:
        raise BadRequest(f"a write to bucket {bucket!r} has no delay and no priority")
    headers = send.headers
    if not headers:
        return send
    op = headers.get(KV_OP)
    if op is not None and op != KV_DELETE:
        raise BadRequest(f"{KV_OP} is {op[:40]!r}: the only operation is {KV_DELETE!r}")
    expect = headers.get(KV_EXPECT)
    if expect is None:
        return send
    if not (expect.isascii() and expect.isdigit()) or int(expect) > MAX_KV_REVISION:
        raise BadRequest(f"{KV_EXPECT} must be a revision (an integer >= 0), not "
                         f"{expect[:40]!r}")
    index.check(send.key, int(expect), now)
    rest = {k: v for k, v in headers.items() if k != KV_EXPECT}
    return msgspec.structs.replace(send, headers=rest or None)
