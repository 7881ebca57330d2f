"""The dedup window: the (channel, dedup key) pairs published lately, with the seq and
id of their first publish, in about 36 bytes per key. No I/O.

A dict of ``(channel, key) -> (expires, seq, id)`` cost ~0.5 KB per key (two tuples,
three strings, a float and an int, each a separate object) and its rebuild on every
tick was O(keys). Here a key is a keyed 64-bit digest and everything lives in
``array`` columns, in generations:

* the *active* generation takes new keys: columns in insertion order plus an
  open-addressing table (``array('I')``, half full at most) to find a digest;
* once it holds ``generation`` keys it is *sealed*: its digests are sorted (C-speed
  ``bisect`` finds one), ``perm`` maps a sorted position back to the insertion
  order, and the table is dropped. 36 bytes a key: digest 8, perm 2, id hash 8,
  seq 8, expiry 8 and a 2-byte Bloom-style filter that answers "not here" for most
  generations without the bisect (a new key, the common case, is a miss in all of
  them), plus a 16 KB directory per generation that narrows its bisect;
* the columns stay in insertion order, so the oldest keys of a generation are at
  its ``start``: expiry advances ``start`` (a bisect while expiries only grow), an
  early eviction (``max_keys``) advances it further, and a generation goes whole
  once ``start`` reaches its end or its newest expiry passed. Nothing is scanned
  per tick beyond what expires;
* a lookup checks the newest generation first; the newest entry of a key decides,
  as the dict's last assignment did. Each entry's expiry is checked, so the window
  is exact.

A message id is ``f"{channel hash:016x}{seq:x}"`` (``Broker.new_id``; "" for a
broadcast that reached no channel): the id is kept as its 64-bit hash and rebuilt
from it and the seq. An id of any other form (older versions) is kept in a small
dict instead.

Restoring (``load``) only sorts the stored rows' order by expiry: until they are
built into generations (``RESTORE_STEP`` rows per ``expire``, i.e. per tick), a
lookup bisects the rows themselves, which storage returns sorted by (channel, key).
So a restart does not wait for hashing and sorting hundreds of thousands of keys.
Storage reads them into ``DedupRows``, columns of ~44 bytes a row plus its key's:
as tuples (three strings, a float and an int each) 2,000,000 keys held ~1.1 GB at a
start, fifteen times what they take once built.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate, compress, count, groupby, islice, repeat
from operator import eq, itemgetter, le, methodcaller, not_

from ..limits import MAX_DEDUP_KEYS

Entry = tuple[str, str, float, int, str]  # channel, key, expires_at, seq, id (storage)

# Keys per generation: sealing one (a sort) holds the loop ~30-40 ms, once per 65,536
# keyed publishes; smaller ones would make more generations for a lookup to check.
GENERATION_KEYS = 1 << 16
FILTER_BITS_PER_KEY = 16  # 2 bytes a key: ~6% of generations need a bisect for a miss
RESTORE_STEP = 16_384  # restored rows hashed per expire() (tick): ~15-30 ms of the loop
_ODD = (1 << 64) - 1  # seq column marker: seq and id are in DedupWindow._odd
_PK = itemgetter(0, 1)
_ID = "%016x%x"


class _Gen:
    """One generation. Active: ``digests`` in insertion order and ``slots`` (a
    position + 1 per digest, 0 = empty). Sealed: ``digests`` sorted and ``perm``."""

    __slots__ = (
        "bloom",
        "digests",
        "directory",
        "exps",
        "ids",
        "killed",
        "max_exp",
        "monotone",
        "perm",
        "seqs",
        "slots",
        "start",
    )

    def __init__(self) -> None:
        self.digests = array("Q")
        self.slots: array[int] | None = None
        self.perm: array[int] | None = None
        self.directory = array("I")  # sealed: where digests of each top-bits prefix start
        self.bloom = bytearray()
        self.ids = array("Q")  # the id's 64-bit hash; 0: the id is ""
        self.seqs = array("Q")
        self.exps = array("d")  # expiry (wall clock); -1.0 once forgotten
        self.start = 0  # entries before it are gone (expired or evicted)
        # when it passes, the whole generation goes
        self.max_exp = float("-inf")  # pragma: no mutate
        self.monotone = True  # expiries never decrease along the columns: bisect them
        self.killed = 0  # forgotten entries at or after start (no longer counted)

    def __len__(self) -> int:  # positions, gone ones included
        return len(self.exps)


class _Memo(dict[str, int]):
    """An id's 16 hex digits -> their value (-1 if they are not hex): restored ids of
    one channel share them, so each is parsed once."""

    def __missing__(self, prefix: str) -> int:
        try:
            value = int(prefix, 16) if len(prefix) == 16 else -1
        except ValueError:
            value = -1
        self[prefix] = value = value if value > 0 else -1
        return value


_ENCODE = methodcaller("encode", "utf-8", "surrogatepass")


class _KeyView:
    """The keys of ``DedupRows`` as a sequence of their UTF-8 bytes, for ``bisect``
    (UTF-8 bytes sort as their strings do)."""

    __slots__ = ("rows",)

    def __init__(self, rows: DedupRows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows.ends)

    def __getitem__(self, i: int) -> bytes:
        return self.rows.key_bytes(i)


class DedupRows:
    """Stored dedup entries (channel, key, expires_at, seq, id) in columns, in
    (channel, key) order: what a restart holds until ``DedupWindow`` has built them into
    generations. A row costs its key's UTF-8 bytes and ~36 bytes of columns; the id is
    kept as the hash it is made of (``_id_hash``), whole only for the odd ones. Read as
    tuples, 2,000,000 rows (MAX_DEDUP_KEYS) held ~1.1 GB at a start."""

    __slots__ = ("_index", "_last", "_memo", "chan", "ends", "exps", "hashes", "keys", "names",
                 "odd", "ordered", "seqs", "spans")

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.names: list[str] = []  # channels, in order
        self._index: dict[str, int] = {}  # channel -> its place in names
        self.spans: dict[str, tuple[int, int]] = {}  # channel -> its rows [lo, hi)
        self.chan = array("I")  # row -> its channel in names
        self.keys = bytearray()  # the keys' UTF-8 bytes, back to back
        self.ends = array("Q")  # row -> where its key ends in keys
        self.exps = array("d")
        self.seqs = array("Q")  # 0 for an odd row
        self.hashes = array("Q")  # the id's 64-bit hash; 0: the id is "" (or odd)
        self.odd: dict[int, tuple[int, str]] = {}  # row -> (seq, id) not rebuildable
        self.ordered = True  # rows came in (channel, key) order
        self._last: tuple[str, str] | None = None
        self._memo = _Memo()
        self.extend(entries)

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> DedupRows:
        """``entries`` in any order, as rows in (channel, key) order."""
        if isinstance(entries, DedupRows):
            if entries.ordered:
                return entries
            entries = list(entries)
        rows = list(entries)
        if not all(map(le, rows, islice(rows, 1, None))):
            rows.sort()
        return cls(rows)

    def extend(self, entries: Iterable[Entry]) -> None:
        """Append a page of rows (storage reads them a page at a time)."""
        page = entries if isinstance(entries, list) else list(entries)
        if not page:
            return
        start = len(self.exps)
        # Whole rows compared: (channel, key) pairs made per row would be kept by
        # CPython's tuple free list.
        if (self._last is not None and _PK(page[0]) < self._last) or \
                not all(map(le, page, islice(page, 1, None))):
            self.ordered = False
        self._last = _PK(page[-1])
        self._channels(list(map(itemgetter(0), page)), start)
        keys = list(map(_ENCODE, map(itemgetter(1), page)))
        end = self.ends[-1] if self.ends else 0
        self.keys += b"".join(keys)
        self.ends.extend(accumulate(map(len, keys), initial=end))
        del self.ends[start]  # the initial one: the previous row's end
        self.exps.extend(map(itemgetter(2), page))
        self._outcomes(list(map(itemgetter(3), page)), list(map(itemgetter(4), page)),
                       start)

    def _channels(self, chans: list[str], start: int) -> None:
        pos = start
        for name, run in groupby(chans):
            n = len(list(run))
            span = self.spans.get(name)
            if span is None:
                self.spans[name] = (pos, pos + n)
                self._index[name] = len(self.names)
                self.names.append(name)
            elif span[1] == pos:
                self.spans[name] = (span[0], pos + n)
            else:  # the channel's rows are not together: not in order. extend()'s checks
                # found that first (rows in order keep each channel's rows together).
                self.ordered = False  # pragma: no mutate
            self.chan.extend(repeat(self._index[name], n))
            pos += n

    def _outcomes(self, seqs: list[int], ids: list[str], start: int) -> None:
        """The seq and id columns: an id made by ``new_id`` is kept as its hash."""
        hashes = list(map(self._memo.__getitem__, map(itemgetter(slice(0, 16)), ids)))
        ok = map(eq, map(_ID.__mod__, zip(hashes, seqs, strict=True)), ids)
        bad = set(compress(count(), map(not_, ok)))
        if min(seqs) < 0 or max(seqs) >= _ODD:
            bad.update(i for i, seq in enumerate(seqs) if not 0 <= seq < _ODD)
        for i in bad:
            seq, ident = seqs[i], ids[i]
            if ident == "" and 0 <= seq < _ODD:
                hashes[i] = 0
            else:
                self.odd[start + i] = (seq, ident)
                hashes[i], seqs[i] = 0, 0
        self.seqs.extend(seqs)
        self.hashes.extend(hashes)

    def __len__(self) -> int:
        return len(self.exps)

    def key_bytes(self, i: int) -> bytes:
        return bytes(self.keys[self.ends[i - 1] if i else 0:self.ends[i]])

    def outcome(self, i: int) -> tuple[int, str]:
        """(seq, id) of row ``i``."""
        if self.odd and i in self.odd:
            return self.odd[i]
        seq, h = self.seqs[i], self.hashes[i]
        return seq, _ID % (h, seq) if h else ""

    def find(self, channel: str, key: str) -> int:
        """The row of ``key`` on ``channel``; -1 if none (rows in order only)."""
        span = self.spans.get(channel)
        if span is None:
            return -1
        lo, hi = span
        kb = _ENCODE(key)
        i = bisect_left(_KeyView(self), kb, lo, hi)
        return i if i < hi and self.key_bytes(i) == kb else -1

    def __getitem__(self, i: int) -> Entry:
        return (self.names[self.chan[i]], self.key_bytes(i).decode("utf-8", "surrogatepass"),
                self.exps[i], *self.outcome(i))

    def __iter__(self) -> Iterator[Entry]:
        return map(self.__getitem__, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DedupRows | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class DedupWindow:
    """Which dedup keys were published in the window, and their first outcome.

    False duplicates: two different (channel, key) pairs share a digest with odds of
    1 in 2**64 per pair; a new key meets one of ``n`` live keys with odds n / 2**64,
    i.e. at 2 million live keys and 6,000 keyed publishes a second, one expected
    false duplicate in ~48 years (135 at 720,000 keys). The digest is keyed with a
    secret drawn per process, so no client can compute, let alone craft, a key
    colliding with another client's (which would drop its message as a duplicate).
    """

    def __init__(self, max_keys: int = MAX_DEDUP_KEYS, *, generation: int = GENERATION_KEYS,
                 secret: bytes | None = None) -> None:
        if generation < 2 or generation & (generation - 1):
            raise ValueError("generation must be a power of two >= 2")  # pragma: no mutate
        self._gen_keys = generation
        # Filter bit of a digest: its top bits (the table uses the low ones); a sealed
        # generation's directory narrows its bisect to ~16 digests by fewer top bits.
        self._shift = 64 - ((generation * FILTER_BITS_PER_KEY).bit_length() - 1)
        self._dir_shift = 64 - max(1, generation.bit_length() - 5)
        self._hasher = hashlib.blake2b(digest_size=8, key=secret or os.urandom(32))
        self._bases: dict[str, hashlib.blake2b] = {}  # channel -> hasher fed "channel\0"
        # channel -> times its queue moved to another broker (``retire``): part of the
        # digest, so entries put before a move are unreachable after it
        self._incarnation: dict[str, int] = {}
        self._last: tuple[str | None, str | None, int] = (None, None, 0)
        self._active = _Gen()
        self._sealed: list[_Gen] = []  # oldest first; the first _restored are restored
        self._restored = 0
        self._odd: dict[int, tuple[int, str, float]] = {}  # digest -> seq, id, expiry
        self._held = 0  # entries not yet gone (expired ones until expire() passes them)
        # the latest `now` seen: evictions of expired keys
        self._clock = float("-inf")  # pragma: no mutate
        self._max_keys = max_keys  # are not counted
        self.evicted = 0  # unexpired keys dropped early because of max_keys
        # Restored rows not yet built into generations (see load()).
        self._rows: DedupRows | None = None
        self._order = array("I")  # row indexes by expiry
        self._cursor = 0  # next of _order to take
        # rows expiring at or before it are built (or gone)
        self._floor = float("-inf")  # pragma: no mutate
        self._pending_gen = _Gen()  # rows taken and hashed, not yet sealed

    # ------------------------------------------------------------------ size
    def __len__(self) -> int:
        """Keys held: the live ones, and expired ones until ``expire`` passes them."""
        return self._held

    @property
    def max_keys(self) -> int:
        return self._max_keys

    @max_keys.setter
    def max_keys(self, value: int) -> None:
        if value < 1:
            raise ValueError("max_keys must be >= 1")  # pragma: no mutate
        self._max_keys = value
        self._trim()

    @property
    def restoring(self) -> bool:
        """Restored rows are still being built into generations."""
        return self._rows is not None

    # ---------------------------------------------------------------- lookups
    def digest(self, channel: str, key: str) -> int:
        """The keyed digest of ``key`` on ``channel``. The last one is kept: a publish
        looks its key up, then puts it (the same string objects)."""
        if key is self._last[1] and channel is self._last[0]:
            return self._last[2]
        d = self._digest_bytes(channel, _ENCODE(key))
        self._last = (channel, key, d)
        return d

    def _digest_bytes(self, channel: str, key: bytes) -> int:
        """``digest`` of a key given as its UTF-8 bytes."""
        base = self._bases.get(channel)
        if base is None:
            if len(self._bases) >= 1024:  # many channels: a bounded cache
                self._bases.clear()
            base = self._hasher.copy()
            base.update(_ENCODE(channel) + b"\0")
            if channel in self._incarnation:
                base.update(b"%d\0" % self._incarnation[channel])
            self._bases[channel] = base
        h = base.copy()
        h.update(key)
        return int.from_bytes(h.digest(), "little")

    def _find(self, d: int) -> tuple[_Gen, int] | None:
        """The generation and position of the newest entry of digest ``d``."""
        g = self._active
        slots = g.slots
        if slots is not None:
            mask = len(slots) - 1
            i = d & mask
            digests = g.digests
            while p := slots[i]:
                if digests[p - 1] == d:
                    return g, p - 1
                i = (i + 1) & mask
        b = d >> self._shift
        byte, bit = b >> 3, 1 << (b & 7)
        t = d >> self._dir_shift
        for g in reversed(self._sealed):
            if g.bloom[byte] & bit:
                digests, directory = g.digests, g.directory
                i = bisect_right(digests, d, directory[t], directory[t + 1]) - 1
                if i >= 0 and digests[i] == d:  # equal digests: the last is the newest
                    return g, g.perm[i]  # type: ignore[index]
        return None

    def get(self, channel: str, key: str, now: float) -> tuple[int, str] | None:
        """(seq, id) of the unexpired entry of ``key`` on ``channel``, if any."""
        if now > self._clock:
            self._clock = now
        d = self.digest(channel, key)
        found = self._find(d)
        if found is None:
            return self._get_row(channel, key, now) if self._rows is not None else None
        g, pos = found
        if pos < g.start or g.exps[pos] <= now:
            return None  # the newest entry is gone: older ones (if any) are older still
        seq = g.seqs[pos]
        if seq == _ODD:
            odd = self._odd.get(d)
            return (odd[0], odd[1]) if odd is not None else None
        h = g.ids[pos]
        return seq, _ID % (h, seq) if h else ""

    def _get_row(self, channel: str, key: str, now: float) -> tuple[int, str] | None:
        rows = self._rows
        assert rows is not None
        i = rows.find(channel, key)
        if i >= 0 and rows.exps[i] > now and rows.exps[i] > self._floor:
            return rows.outcome(i)
        return None

    # ---------------------------------------------------------------- changes
    def put(self, channel: str, key: str, expires_at: float, seq: int, msg_id: str) -> None:
        """Remember ``key`` on ``channel`` until ``expires_at``, with its outcome."""
        d = self.digest(channel, key)
        g = self._active
        if len(g.exps) >= self._gen_keys:
            self._seal()
            g = self._active
        if g.slots is None:  # allocated on the first key: an idle window costs nothing
            g.slots = array("I", bytes(8 * self._gen_keys))  # 2 slots a key
            g.bloom = bytearray(self._gen_keys * FILTER_BITS_PER_KEY // 8)
        h = _id_hash(msg_id, seq)
        if h < 0:  # not an id new_id makes: kept aside, whole
            self._odd[d] = (seq, msg_id, expires_at)
            h, seq = 0, _ODD
        elif self._odd:
            self._odd.pop(d, None)
        pos = len(g.exps)
        if pos and expires_at < g.exps[-1]:
            g.monotone = False
        g.digests.append(d)
        g.ids.append(h)
        g.seqs.append(seq)
        g.exps.append(expires_at)
        if expires_at > g.max_exp:
            g.max_exp = expires_at
        slots, digests = g.slots, g.digests
        mask = len(slots) - 1
        i = d & mask
        while (p := slots[i]) and digests[p - 1] != d:
            i = (i + 1) & mask
        slots[i] = pos + 1
        b = d >> self._shift
        g.bloom[b >> 3] |= 1 << (b & 7)
        self._held += 1
        if self._held > self._max_keys:
            self._trim()

    def forget(self, channel: str, key: str, seq: int, msg_id: str) -> None:
        """Undo the entry of a publish whose commit failed: only if ``key`` still maps
        to that ``seq`` and ``msg_id`` (a later publish may have replaced it)."""
        d = self.digest(channel, key)
        found = self._find(d)
        if found is None:
            return
        g, pos = found
        if pos < g.start or g.exps[pos] < 0:
            return
        stored = g.seqs[pos]
        if stored == _ODD:
            odd = self._odd.get(d)
            if odd is None or odd[:2] != (seq, msg_id):
                return
            del self._odd[d]
        else:
            h = g.ids[pos]
            if stored != seq or (_ID % (h, stored) if h else "") != msg_id:
                return
        g.exps[pos] = -1.0
        g.monotone = False
        g.killed += 1
        self._held -= 1

    def retire(self, channels: Iterable[str], now: float) -> None:
        """The queue of ``channels`` moved to another broker, which answers for their
        keys from now on: make every entry held for them unreachable here. They stay
        counted until they expire with the window; if the queue comes back, what its
        storage holds then is ``put`` anew. Restored rows are built first: a lookup
        could otherwise still find one of them by name."""
        while self._rows is not None:
            self._restore_step(now, finish=True)
        for channel in channels:
            self._incarnation[channel] = self._incarnation.get(channel, 0) + 1
            self._bases.pop(channel, None)
        self._last = (None, None, 0)

    def expire(self, now: float) -> None:
        """Let go of what expired by ``now``; build a step of restored rows. Called every
        tick: its cost is that of what expires (plus a check per generation)."""
        if now > self._clock:
            self._clock = now
        for g in list(self._sealed):
            if g.max_exp <= now:
                self._drop(g)
            else:
                self._expire_head(g, now)
        g = self._active
        if len(g):
            if g.max_exp <= now:
                self._drop(g)
            else:
                self._expire_head(g, now)
        if self._rows is not None:
            self._restore_step(now, finish=False)
        if self._odd:
            self._odd = {d: v for d, v in self._odd.items() if v[2] > now}
        self._trim()

    def _expire_head(self, g: _Gen, now: float) -> None:
        start, exps = g.start, g.exps
        end = len(exps)
        if start >= end or exps[start] > now:
            return
        if g.monotone:
            upto = bisect_right(exps, now, start, end)
        else:  # forgotten entries (-1) or an expiry that went down (a shorter window)
            upto = start
            while upto < end and exps[upto] <= now:
                upto += 1
        self._advance(g, upto, evicting=False)
        if g.start >= end:
            self._drop(g)

    def _advance(self, g: _Gen, upto: int, *, evicting: bool) -> None:
        """Move ``g.start`` to ``upto``: those entries are gone."""
        start = g.start
        if g.killed:
            clock = self._clock
            for e in g.exps[start:upto]:
                if e < 0:
                    g.killed -= 1
                else:
                    self._held -= 1
                    if evicting and e > clock:
                        self.evicted += 1
        else:
            self._held -= upto - start
            if evicting:
                if g.monotone:
                    self.evicted += upto - max(start, bisect_right(g.exps, self._clock,
                                                                   start, upto))
                else:
                    self.evicted += sum(map(self._clock.__lt__, g.exps[start:upto]))
        g.start = upto

    def _drop(self, g: _Gen) -> None:
        """``g`` goes whole (emptied, or all of it expired)."""
        self._held -= len(g) - g.start - g.killed
        if g is self._active:
            self._active = _Gen()
            return
        i = self._sealed.index(g)
        del self._sealed[i]
        if i < self._restored:
            self._restored -= 1

    def _trim(self) -> None:
        """Past ``max_keys``, the oldest keys expire early (counted in ``evicted``)."""
        while self._held > self._max_keys:
            g = self._oldest()
            if g is None:
                break
            end = len(g)
            self._advance(g, min(end, g.start + self._held - self._max_keys), evicting=True)
            if g.start >= end:
                self._drop(g)

    def _oldest(self) -> _Gen | None:
        """The generation holding the oldest keys: restored ones first (restored rows
        not yet built are built now), then the sealed ones, then the active one."""
        if not self._restored and self._rows is not None:
            self._restore_step(self._clock, finish=True)
        if self._sealed:
            return self._sealed[0]
        return self._active if len(self._active) else None

    def _seal(self) -> None:
        g = self._active
        self._active = _Gen()
        start = g.start
        if start >= len(g):
            return
        sealed = _sealed(g.digests[start:], g.bloom, self._dir_shift)
        sealed.ids, sealed.seqs, sealed.exps = g.ids[start:], g.seqs[start:], g.exps[start:]
        sealed.max_exp, sealed.monotone, sealed.killed = g.max_exp, g.monotone, g.killed
        self._sealed.append(sealed)

    # -------------------------------------------------------------- restoring
    def load(self, entries: Iterable[Entry] | DedupRows, now: float) -> None:
        """Restore the stored entries (channel, key, expires_at, seq, id), older than
        anything put since. Only their order by expiry is computed here; ``expire``
        builds them into generations, ``RESTORE_STEP`` at a time, and lookups bisect
        the rows meanwhile (kept as ``DedupRows``, as storage reads them)."""
        if self._rows is not None:
            raise ValueError("load() is already restoring entries")  # pragma: no mutate
        rows = DedupRows.of(entries)  # SQLite gives (channel, key) order
        if not len(rows):
            return
        expiry = rows.exps
        order = array("I", sorted(range(len(rows)), key=expiry.__getitem__))
        first = bisect_right(order, now, key=expiry.__getitem__)  # the expired are skipped
        if first == len(order):
            return
        if now > self._clock:
            self._clock = now
        self._rows, self._order, self._cursor = rows, order, first
        self._floor = float("-inf")  # pragma: no mutate
        self._pending_gen = _Gen()
        self._held += len(order) - first
        self._trim()

    def _restore_step(self, now: float, *, finish: bool) -> None:
        """Build restored rows, in expiry order: hash up to ``RESTORE_STEP`` of them into
        the pending generation, or, once it is full (or the rows ran out), seal it: one
        or the other per tick, so that no tick takes long. ``finish`` (an eviction needs
        the oldest keys in a generation) fills and seals it at once."""
        rows, order = self._rows, self._order
        assert rows is not None
        exps = rows.exps
        n, cur, g = len(order), self._cursor, self._pending_gen
        if cur < n and exps[order[cur]] <= now:  # expired meanwhile: let go
            skip = bisect_right(order, now, cur, n, key=exps.__getitem__)
            self._held -= skip - cur
            cur = self._cursor = skip
        room = self._gen_keys - len(g)
        if cur < n and room > 0:
            take = order[cur:cur + (room if finish else min(room, RESTORE_STEP))]
            cur += len(take)
            if len(take) == room or cur >= n:  # the generation is complete; never split a
                last = exps[take[-1]]  # run of equal expiries: _floor separates them
                while cur < n and exps[order[cur]] == last:
                    take.append(order[cur])
                    cur += 1
            self._cursor = cur
            self._hash_rows(rows, take, g)
            if not finish:
                return
        if len(g):
            sealed = _sealed(g.digests, g.bloom, self._dir_shift)
            # Copies: exactly the size of their contents (growing left up to 1/8 spare).
            sealed.ids, sealed.seqs, sealed.exps = g.ids[:], g.seqs[:], g.exps[:]
            sealed.max_exp = g.exps[-1]  # taken in expiry order: monotone
            self._sealed.insert(self._restored, sealed)
            self._restored += 1
            self._pending_gen = _Gen()
        if cur:
            self._floor = exps[order[cur - 1]]  # rows up to it are built or gone
        if cur >= n:
            self._rows, self._order = None, array("I")

    def _hash_rows(self, rows: DedupRows, take: array[int], g: _Gen) -> None:
        """Append rows ``take`` to the pending generation ``g``."""
        if not g.bloom:
            g.bloom = bytearray(self._gen_keys * FILTER_BITS_PER_KEY // 8)
        digests, bloom, shift, digest = g.digests, g.bloom, self._shift, self._digest_bytes
        base = len(digests)
        names, chan, key_bytes = rows.names, rows.chan, rows.key_bytes
        for i in take:
            d = digest(names[chan[i]], key_bytes(i))
            digests.append(d)
            b = d >> shift
            bloom[b >> 3] |= 1 << (b & 7)
        exps = array("d", map(rows.exps.__getitem__, take))
        seqs = array("Q", map(rows.seqs.__getitem__, take))
        hashes = array("Q", map(rows.hashes.__getitem__, take))
        if rows.odd:  # ids not rebuildable from (hash, seq): kept aside, whole
            odd = rows.odd
            for j, i in enumerate(take):
                if i in odd:
                    seq, ident = odd[i]
                    self._odd[digests[base + j]] = (seq, ident, exps[j])
                    seqs[j] = _ODD
        g.exps.extend(exps)
        g.seqs.extend(seqs)
        g.ids.extend(hashes)


def _id_hash(msg_id: str, seq: int) -> int:
    """The 64-bit hash ``msg_id`` is made of (0 for ""), or -1 if ``msg_id`` is not
    ``f"{hash:016x}{seq:x}"`` (then it cannot be rebuilt from the two)."""
    if not 0 <= seq < _ODD:
        return -1
    if not msg_id:
        return 0
    try:
        h = int(msg_id[:16], 16)
    except ValueError:
        return -1
    return h if h > 0 and _ID % (h, seq) == msg_id else -1


def _sealed(digests: array[int], bloom: bytearray, dir_shift: int) -> _Gen:
    """A sealed generation of ``digests`` (insertion order): sorted, with ``perm``."""
    n = len(digests)
    bits = max(16, (n - 1).bit_length())
    mask = (1 << bits) - 1
    # One sort of (digest, position) packed in an int: equal digests keep their order.
    packed = sorted([d << bits | i for i, d in enumerate(digests)])
    g = _Gen()
    g.digests = array("Q", [p >> bits for p in packed])
    g.perm = array("H" if n <= 1 << 16 else "I", [p & mask for p in packed])
    g.bloom = bloom
    step = 1 << dir_shift
    g.directory = array("I", map(bisect_left, repeat(g.digests),
                                 range(0, (1 << 64) + step, step)))
    return g
