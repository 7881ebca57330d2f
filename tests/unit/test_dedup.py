"""The dedup window (core/dedup.py): exact expiry, forget, eviction under max_keys,
restore, ids rebuilt from their hash, many generations, and its memory per key."""

from __future__ import annotations

import logging
import random
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minou.core.dedup import RESTORE_STEP, DedupRows, DedupWindow

CH = "orders/v1/1"
T0 = 1_000_000.0


def mid(seq: int, h: int = 0x1234_5678_9ABC_DEF0) -> str:
    """An id as Broker.new_id makes it."""
    return f"{h:016x}{seq:x}"


def fill(w: DedupWindow, n: int, *, window: float = 100.0, step: float = 1.0,
         channel: str = CH) -> None:
    for i in range(n):
        w.put(channel, f"k{i}", T0 + i * step + window, i + 1, mid(i + 1))


# -------------------------------------------------------------------- the window
def test_a_key_is_a_duplicate_until_it_expires_and_not_a_moment_after() -> None:
    w = DedupWindow()
    assert w.get(CH, "k", T0) is None
    w.put(CH, "k", T0 + 120, 7, mid(7))
    assert w.get(CH, "k", T0) == (7, mid(7))
    assert w.get(CH, "k", T0 + 119.999) == (7, mid(7))
    assert w.get(CH, "k", T0 + 120) is None  # expires_at is the first instant it is gone
    assert w.get("orders/v1/2", "k", T0) is None  # per channel
    assert w.get(CH, "K", T0) is None
    assert len(w) == 1
    w.expire(T0 + 119)
    assert len(w) == 1
    w.expire(T0 + 120)
    assert len(w) == 0 and w.evicted == 0


def test_channel_and_key_do_not_run_into_each_other() -> None:
    w = DedupWindow()
    w.put("a", "bc", T0 + 10, 1, mid(1))
    assert w.get("ab", "c", T0) is None
    w.put("a\udc80", "k\0x\udcff", T0 + 10, 2, mid(2))  # lone surrogates, NUL: no crash
    assert w.get("a\udc80", "k\0x\udcff", T0) == (2, mid(2))
    assert w.get("a\udc80", "k\0x", T0) is None


def test_a_key_named_like_a_channel_is_still_a_key_of_its_own_channel() -> None:
    w = DedupWindow()
    w.put("a/v1/1", "b/v1/1", T0 + 10, 1, mid(1))
    assert w.get("b/v1/1", "b/v1/1", T0) is None
    assert w.get("a/v1/1", "b/v1/1", T0) == (1, mid(1))


def test_digests_are_keyed_per_window() -> None:
    """Keyed with a secret drawn per process: no client can compute the digest of a
    key, so none can craft a key colliding with another client's."""
    import hashlib

    a, b = DedupWindow(), DedupWindow()
    assert a.digest(CH, "k") != b.digest(CH, "k")
    plain = hashlib.blake2b(f"{CH}\0k".encode(), digest_size=8).digest()
    assert a.digest(CH, "k") not in (int.from_bytes(plain, "little"),
                                     int.from_bytes(plain, "big"))
    same = bytes(range(32))
    assert DedupWindow(secret=same).digest(CH, "k") == DedupWindow(secret=same).digest(CH, "k")


@pytest.mark.parametrize("generation", [0, 1, 3, 6, 100])
def test_a_generation_size_that_is_not_a_power_of_two_is_refused(generation: int) -> None:
    with pytest.raises(ValueError):
        DedupWindow(generation=generation)


def test_a_key_put_again_after_expiry_gets_its_new_outcome() -> None:
    w = DedupWindow(generation=4)
    w.put(CH, "k", T0 + 10, 1, mid(1))
    fill(w, 9, channel="other")  # the first entry is now in a sealed generation
    assert w.get(CH, "k", T0 + 11) is None
    w.put(CH, "k", T0 + 30, 2, mid(2))
    assert w.get(CH, "k", T0 + 12) == (2, mid(2))


def test_forget_undoes_only_the_entry_it_names() -> None:
    w = DedupWindow()
    w.put(CH, "k", T0 + 60, 5, mid(5))
    w.forget(CH, "k", 4, mid(4))  # another publish's outcome: kept
    w.forget(CH, "k", 5, mid(5, 0xFF))
    assert w.get(CH, "k", T0) == (5, mid(5))
    w.forget(CH, "k", 5, mid(5))
    assert w.get(CH, "k", T0) is None
    assert len(w) == 0
    w.forget(CH, "k", 5, mid(5))  # twice: nothing more
    w.forget(CH, "never", 1, mid(1))
    assert len(w) == 0
    w.put(CH, "k", T0 + 60, 6, mid(6))  # the retry of the failed publish
    assert w.get(CH, "k", T0) == (6, mid(6))
    w.expire(T0 + 61)
    assert len(w) == 0


def test_forget_in_a_sealed_generation_keeps_the_rest_exact() -> None:
    w = DedupWindow(generation=8)
    fill(w, 20)
    w.forget(CH, "k3", 4, mid(4))
    assert w.get(CH, "k3", T0) is None
    assert w.get(CH, "k2", T0) == (3, mid(3)) and w.get(CH, "k4", T0) == (5, mid(5))
    assert len(w) == 19
    w.expire(T0 + 100 + 5)  # k0..k5 expired: five held (k3 was forgotten)
    assert len(w) == 14
    assert [w.get(CH, f"k{i}", T0 + 105) is not None for i in range(20)] == \
        [False] * 6 + [True] * 14
    assert w.evicted == 0


# ---------------------------------------------------------------- max_keys
def test_past_max_keys_the_oldest_keys_expire_early_and_are_counted() -> None:
    w = DedupWindow(max_keys=3)
    w.get(CH, "-", T0)  # the clock
    fill(w, 5)
    assert len(w) == 3 and w.evicted == 2
    assert [w.get(CH, f"k{i}", T0) for i in range(5)] == \
        [None, None, (3, mid(3)), (4, mid(4)), (5, mid(5))]


def test_keys_already_expired_are_not_counted_as_evicted() -> None:
    w = DedupWindow(max_keys=2)
    fill(w, 2, window=1.0)  # expire at T0 + 1 and T0 + 2
    w.get(CH, "-", T0 + 1.5)  # k0 has expired (not yet passed by expire())
    w.put(CH, "k2", T0 + 50, 3, mid(3))
    assert len(w) == 2 and w.evicted == 0
    w.put(CH, "k3", T0 + 50, 4, mid(4))
    assert len(w) == 2 and w.evicted == 1  # k1 was live
    assert w.get(CH, "k1", T0 + 1.5) is None


def test_max_keys_applies_at_once_when_lowered_and_raising_it_brings_nothing_back() -> None:
    w = DedupWindow(max_keys=100, generation=4)
    w.expire(T0)
    fill(w, 30)
    assert len(w) == 30 and w.evicted == 0
    w.max_keys = 10
    assert len(w) == 10 and w.evicted == 20
    assert w.get(CH, "k19", T0) is None and w.get(CH, "k20", T0) == (21, mid(21))
    w.max_keys = 1000
    assert len(w) == 10 and w.get(CH, "k19", T0) is None
    fill(w, 40)  # k0..k39 again: k20..k29 were there, kept, then put again
    assert w.get(CH, "k0", T0) == (1, mid(1))
    with pytest.raises(ValueError):
        w.max_keys = 0


def test_eviction_follows_insertion_order_across_generations() -> None:
    w = DedupWindow(max_keys=1000, generation=16)
    w.expire(T0)
    fill(w, 200)
    w.max_keys = 50
    assert w.evicted == 150
    live = [i for i in range(200) if w.get(CH, f"k{i}", T0) is not None]
    assert live == list(range(150, 200))


# -------------------------------------------------------------------- ids
def test_ids_are_rebuilt_from_their_hash_and_seq() -> None:
    w = DedupWindow()
    cases = [
        ("a", 1, mid(1)),
        ("b", 0x1F3A, mid(0x1F3A, 0xFFFF_FFFF_FFFF_FFFF)),
        ("c", 1, mid(1, 1)),
        ("broadcast-to-none", 0, ""),  # a broadcast that reached no channel
        ("old-format", 3, "a1b2c3d4e50000000003"),  # not <hash><seq>: kept whole
        ("odd", 9, "id-9"),
        ("seq-mismatch", 9, mid(8)),
        ("upper", 10, mid(10).upper()),
        ("zero-hash", 4, "0" * 16 + "4"),
        ("sign", 5, "+" + "1" * 15 + "5"),
        ("huge-seq", 1 << 64, mid(1 << 64)),
    ]
    for key, seq, ident in cases:
        w.put(CH, key, T0 + 10, seq, ident)
    for key, seq, ident in cases:
        assert w.get(CH, key, T0) == (seq, ident), key
    w.forget(CH, "odd", 9, "id-9")
    assert w.get(CH, "odd", T0) is None
    w.put(CH, "old-format", T0 + 20, 4, mid(4))  # replaced by a regular id
    assert w.get(CH, "old-format", T0) == (4, mid(4))
    w.expire(T0 + 11)
    assert w.get(CH, "old-format", T0 + 11) == (4, mid(4)) and len(w) == 1
    assert not w._odd  # the odd ones went with their window


def test_a_broadcast_outcome_round_trips() -> None:
    """A broadcast stores its first target's seq and id under the broadcast name."""
    w = DedupWindow()
    first = mid(42, 0x0BAD_CAFE_0000_0001)
    w.put("orders/v1/*", "k", T0 + 10, 42, first)
    assert w.get("orders/v1/*", "k", T0) == (42, first)
    assert w.get("orders/v1/1", "k", T0) is None


# --------------------------------------------------------------- generations
def test_many_keys_across_generations() -> None:
    rnd = random.Random(7)
    w = DedupWindow(max_keys=10**6, generation=64)
    n = 5000
    keys = [f"key-{rnd.getrandbits(48):x}-{i}" for i in range(n)]
    w.expire(T0)
    for i, k in enumerate(keys):
        w.put(f"ch/{i % 7}", k, T0 + 100 + i * 0.01, i + 1, mid(i + 1, 0xABC + i % 7))
    assert len(w._sealed) > 50
    for i, k in enumerate(keys):
        assert w.get(f"ch/{i % 7}", k, T0) == (i + 1, mid(i + 1, 0xABC + i % 7))
    assert all(w.get("ch/0", f"missing-{i}", T0) is None for i in range(2000))
    cut = T0 + 100 + 2500 * 0.01  # half expired, mid-generation
    w.expire(cut)
    assert len(w) == sum(1 for i in range(n) if T0 + 100 + i * 0.01 > cut)
    for i, k in enumerate(keys):
        assert (w.get(f"ch/{i % 7}", k, cut) is not None) == (T0 + 100 + i * 0.01 > cut)
    w.expire(T0 + 1000)
    assert len(w) == 0 and not w._sealed and w.evicted == 0


def test_a_new_key_is_ruled_out_by_the_filter_in_most_generations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the module promises a lookup costs: a new key (a miss everywhere, the common
    case) needs a bisect in ~6 % of the sealed generations only, and a bisect covers
    the ~16 digests of one directory slot, not the generation's 1,024."""
    from minou.core import dedup

    w = DedupWindow(max_keys=10**6, generation=1024)
    fill(w, 32 * 1024 + 1)
    assert len(w._sealed) == 32
    spans: list[int] = []
    bisect_right = dedup.bisect_right

    def counted(a: Any, x: Any, lo: int = 0, hi: int | None = None) -> int:
        spans.append((len(a) if hi is None else hi) - lo)
        return bisect_right(a, x, lo, hi if hi is not None else len(a))

    monkeypatch.setattr(dedup, "bisect_right", counted)
    misses = 2000
    assert all(w.get(CH, f"new{i}", T0) is None for i in range(misses))
    assert len(spans) <= 0.09 * misses * 32, f"{len(spans)} bisects"
    assert sum(spans) / len(spans) <= 24, f"{sum(spans) / len(spans):.1f} digests a bisect"
    assert w.get(CH, "k5000", T0) == (5001, mid(5001))


def test_keys_put_in_expiry_order_expire_by_a_bisect_not_a_scan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Expiries that never go down (one window; keys of a burst share one) are passed
    by a bisect: an expiry's cost does not grow with the keys it lets go."""
    from minou.core import dedup

    w = DedupWindow(generation=64)
    for i in range(100):
        w.put(CH, f"k{i}", T0 + 10 + i // 10, i + 1, mid(i + 1))
    calls: list[int] = []
    bisect_right = dedup.bisect_right

    def counted(a: Any, x: Any, lo: int = 0, hi: int | None = None) -> int:
        calls.append(1)
        return bisect_right(a, x, lo, len(a) if hi is None else hi)

    monkeypatch.setattr(dedup, "bisect_right", counted)
    w.expire(T0 + 10)  # the first ten, in the sealed generation
    w.expire(T0 + 17)  # the sealed one whole and the active one's head
    assert len(calls) == 2 and len(w) == 20
    assert w.get(CH, "k80", T0 + 17) == (81, mid(81))


def test_a_keyed_publish_hashes_its_key_once_and_its_channel_once() -> None:
    """A publish looks its key up, then puts it (the same strings): one hash of the key;
    the channel's part of the hash is made once per channel."""
    made = [0, 0]  # channel parts, keys

    class Counted:
        def __init__(self, inner: Any, depth: int) -> None:
            self.inner, self.depth = inner, depth

        def copy(self) -> Counted:
            made[self.depth] += 1
            return Counted(self.inner.copy(), self.depth + 1)

        def update(self, data: bytes) -> None:
            self.inner.update(data)

        def digest(self) -> bytes:
            return self.inner.digest()

    w = DedupWindow()
    w._hasher = Counted(w._hasher, 0)  # type: ignore[assignment]
    channels = ["a/v1/1", "b/v1/1", "c/v1/1"]
    for i in range(30):
        channel, key = channels[i % 3], f"key-{i}"
        assert w.get(channel, key, T0) is None
        w.put(channel, key, T0 + 10, i + 1, mid(i + 1))
    assert made == [3, 30]
    assert w.get("b/v1/1", "key-4", T0) == (5, mid(5))


def test_a_shorter_window_after_a_longer_one_stays_exact() -> None:
    """Expiries going down (dedup_window reloaded lower): no bisect over them."""
    w = DedupWindow(generation=8)
    for i in range(12):
        w.put(CH, f"long{i}", T0 + 1000, i + 1, mid(i + 1))
    for i in range(12):
        w.put(CH, f"short{i}", T0 + 10 + i, 100 + i, mid(100 + i))
    w.expire(T0 + 15)
    for i in range(12):
        assert w.get(CH, f"long{i}", T0 + 15) == (i + 1, mid(i + 1))
        assert (w.get(CH, f"short{i}", T0 + 15) is not None) == (T0 + 10 + i > T0 + 15)
    w.expire(T0 + 30)  # every short one expired: the generation of short4.. went whole;
    assert len(w) == 16  # short0..3 share one with long8..11, and are held as long
    assert all(w.get(CH, f"short{i}", T0 + 30) is None for i in range(12))
    w.expire(T0 + 1000)
    assert len(w) == 0


def test_channels_with_different_windows_each_keep_their_whole_window() -> None:
    """Publishes to a channel with a 10 s window and one with a 100 s window, mixed in
    one generation: a key of the long window is a duplicate for its 100 s, however the
    short window's keys around it expire."""
    w = DedupWindow()
    w.put("short/v1/1", "a", T0 + 10, 1, mid(1))
    w.put("long/v1/1", "b", T0 + 100, 2, mid(2))
    w.put("short/v1/1", "c", T0 + 11, 3, mid(3))
    w.put("short/v1/1", "d", T0 + 12, 4, mid(4))
    w.put("long/v1/1", "e", T0 + 101, 5, mid(5))
    w.expire(T0 + 11.5)
    assert w.get("long/v1/1", "b", T0 + 11.5) == (2, mid(2))
    assert w.get("short/v1/1", "c", T0 + 11.5) is None
    assert w.get("short/v1/1", "d", T0 + 11.5) == (4, mid(4))
    assert len(w) == 4 and w.evicted == 0  # c, expired behind b, is let go after it
    w.expire(T0 + 12)
    assert w.get("long/v1/1", "b", T0 + 12) == (2, mid(2))
    assert w.get("long/v1/1", "e", T0 + 100.5) == (5, mid(5))


def test_a_lookup_after_the_wall_clock_stepped_back_answers() -> None:
    """time.time() may step back (an NTP correction) past keys whose window was seen to
    pass, their id kept aside already let go: a lookup still answers. Which answer is
    not promised (the key is a duplicate or not, either is right then)."""
    w = DedupWindow()
    w.put("long/v1/1", "head", T0 + 100, 1, mid(1))
    w.put(CH, "odd", T0 + 10, 2, "id-2")
    w.put(CH, "regular", T0 + 10, 3, mid(3))
    w.expire(T0 + 20)
    assert w.get(CH, "odd", T0 + 5) in (None, (2, "id-2"))
    assert w.get(CH, "regular", T0 + 5) in (None, (3, mid(3)))
    assert w.get("long/v1/1", "head", T0 + 5) == (1, mid(1))


def test_digests_that_collide_the_newest_entry_decides() -> None:
    class Colliding(DedupWindow):
        def digest(self, channel: str, key: str) -> int:
            return 5  # every key the same digest

    w = Colliding(generation=4)
    w.put(CH, "a", T0 + 10, 1, mid(1))
    fill(w, 6, channel="x")
    w.put(CH, "b", T0 + 20, 2, mid(2))
    assert w.get(CH, "a", T0) == (2, mid(2))  # a false duplicate: what 64 bits make rare


def test_a_key_is_found_whatever_its_digest() -> None:
    """Digests at the ends of 64 bits and on the boundaries a sealed generation's
    directory splits them at: each key is found in its sealed generation."""
    edges = [0, 1, (1 << 62) - 1, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 63) + 1,
             3 << 62, (1 << 64) - 2, (1 << 64) - 1]
    chosen = {f"k{i}": d for i, d in enumerate(edges)}

    class Chosen(DedupWindow):
        def digest(self, channel: str, key: str) -> int:
            return chosen[key] if key in chosen else super().digest(channel, key)

    for generation in (4, 1 << 10):
        w = Chosen(generation=generation)
        for i, key in enumerate(chosen):
            w.put(CH, key, T0 + 10, i + 1, mid(i + 1))
        for j in range(generation):  # the keys above now in sealed generations
            w.put(CH, f"filler{j}", T0 + 5, 99, mid(99))
        w.expire(T0 + 5)
        assert [w.get(CH, key, T0 + 5) for key in chosen] == \
            [(i + 1, mid(i + 1)) for i in range(len(edges))]


def test_many_channels_keep_a_bounded_cache() -> None:
    """A hasher is kept per channel of a keyed publish; keys of many channels (ids
    as channels) must not keep one each."""
    w = DedupWindow()
    for i in range(3000):
        w.put(f"ch/v1/{i}", "k", T0 + 10, i + 1, mid(i + 1))
        assert len(w._bases) <= 1024
    assert w.get("ch/v1/7", "k", T0) == (8, mid(8))


# ------------------------------------------------------------------ restore
def restoring(w: DedupWindow, limit: int = 1000) -> Iterator[None]:
    """``while w.restoring``, failing rather than looping for ever if it never ends."""
    for _ in range(limit):
        if not w.restoring:
            return
        yield
    raise AssertionError("restoring never ends")


def rows(n: int, *, now: float = T0, window: float = 100.0) -> list[tuple[str, str, float,
                                                                          int, str]]:
    out = [(f"ch/{i % 3}", f"k{i:05d}", now + window * (i + 1) / n, i + 1, mid(i + 1))
           for i in range(n)]
    return sorted(out)  # as SQLite returns them: by (channel, key)


def test_load_answers_at_once_and_after_its_rows_are_built() -> None:
    entries = rows(500)
    entries.append(("ch/0", "expired", T0 - 1, 9, mid(9)))
    entries.append(("ch/0", "odd", T0 + 50, 9, "id-9"))
    entries.append(("ch/0", "none", T0 + 50, 0, ""))
    w = DedupWindow(generation=64)
    w.load(list(reversed(entries)), T0)  # not in (channel, key) order: sorted
    assert len(w) == 502 and w.restoring

    def check(now: float) -> None:
        for ch, key, exp, seq, ident in entries:
            assert w.get(ch, key, now) == ((seq, ident) if exp > now else None), key

    check(T0)  # from the rows themselves
    steps = 0
    for _ in restoring(w):
        w.expire(T0)
        steps += 1
        check(T0)
    assert steps >= 8 and len(w._sealed) >= 8 and len(w) == 502
    check(T0 + 50)
    w.expire(T0 + 50)
    assert len(w) == 250  # k's expiring after T0 + 50
    assert w.evicted == 0


def test_keys_put_after_a_restore_are_newer_than_restored_ones() -> None:
    w = DedupWindow(generation=16)
    w.load(rows(100), T0)
    w.put("ch/0", "k00000", T0 + 500, 1000, mid(1000))  # a restored key, replaced
    w.put("ch/0", "new", T0 + 500, 1001, mid(1001))
    for _ in range(3):
        w.expire(T0)
    assert w.get("ch/0", "k00000", T0 + 1) == (1000, mid(1000))
    for _ in restoring(w):
        w.expire(T0)
    assert w.get("ch/0", "k00000", T0 + 1) == (1000, mid(1000))
    w.get("ch/0", "k00000", T0)  # clock
    w.max_keys = 2  # the oldest go first: the restored ones, then the new
    assert w.get("ch/0", "new", T0) == (1001, mid(1001))
    assert w.get("ch/0", "k00000", T0) == (1000, mid(1000))
    assert w.get("ch/1", "k00099", T0) is None
    assert w.evicted == 99


def test_eviction_during_a_restore_takes_the_oldest_restored_keys() -> None:
    w = DedupWindow(max_keys=1000, generation=16)
    entries = rows(100)
    w.load(entries, T0)
    w.expire(T0)  # one step built
    w.max_keys = 30
    assert len(w) == 30 and w.evicted == 70
    by_expiry = sorted(entries, key=lambda r: r[2])
    for ch, key, *_ in by_expiry[:70]:
        assert w.get(ch, key, T0) is None
    for ch, key, _, seq, ident in by_expiry[70:]:
        assert w.get(ch, key, T0) == (seq, ident)


def test_rows_that_expire_during_the_restore_are_skipped() -> None:
    w = DedupWindow(generation=16)
    w.load(rows(100, window=10.0), T0)
    w.expire(T0 + 5)  # half of them expired
    assert len(w) <= 50 + 16
    for _ in restoring(w):
        w.expire(T0 + 5)
    assert len(w) == 50
    w.expire(T0 + 10)
    assert len(w) == 0 and not w._sealed


def test_equal_expiries_are_never_split_between_built_and_not() -> None:
    entries = [("c", f"k{i:03d}", T0 + 10 + i // 40, i + 1, mid(i + 1)) for i in range(200)]
    w = DedupWindow(generation=16)
    w.load(entries, T0)
    for _ in restoring(w):
        for ch, key, _, seq, ident in entries:
            assert w.get(ch, key, T0) == (seq, ident)
        w.expire(T0)
    for ch, key, _, seq, ident in entries:
        assert w.get(ch, key, T0) == (seq, ident)


@pytest.mark.parametrize("n", [40_000, (1 << 16) + 1])
def test_a_restore_of_a_burst_stored_with_one_expiry_keeps_every_key(n: int) -> None:
    """A burst of keyed publishes in one instant: restored, its keys share one expiry,
    and a run of equal expiries is never split, so one generation may take more keys
    than ``GENERATION_KEYS``; every key still answers with its own outcome. The rows
    are hashed ``RESTORE_STEP`` a tick all the same, so that no tick takes long."""
    entries = sorted((CH, f"k{i:06d}", T0 + 100, i + 1, mid(i + 1)) for i in range(n))
    w = DedupWindow()
    w.load(entries, T0)
    ticks = 0
    for _ in restoring(w):
        w.expire(T0)
        ticks += 1
    assert ticks > n // RESTORE_STEP
    assert len(w) == n
    for ch, key, _, seq, ident in entries:
        assert w.get(ch, key, T0) == (seq, ident), key
    assert w.get(CH, "missing", T0) is None
    w.expire(T0 + 100)
    assert len(w) == 0 and w.get(CH, entries[0][1], T0 + 100) is None


def test_rows_almost_in_order_are_found_while_restoring() -> None:
    """Two neighbours out of (channel, key) order: the rows are sorted all the same, or
    a lookup before they are built would miss a key."""
    entries = rows(40)
    entries[10], entries[11] = entries[11], entries[10]
    w = DedupWindow(generation=16)
    w.load(entries, T0)
    assert w.restoring
    for ch, key, _, seq, ident in entries:
        assert w.get(ch, key, T0) == (seq, ident), key


def test_eviction_takes_the_oldest_restored_keys_after_new_keys_expired_whole() -> None:
    """Keys of a short window put just after a restart expire, their generation whole,
    before the restored keys are all built: past max_keys, the restored keys that
    expire first still go first."""
    entries = sorted((CH, f"r{i:02d}", T0 + 100 + i, i + 1, mid(i + 1)) for i in range(12))
    w = DedupWindow(generation=4)
    w.load(entries, T0)
    for i in range(5):  # a generation of them sealed, one more in the active one
        w.put(CH, f"new{i}", T0 + 5, 100 + i, mid(100 + i))
    w.expire(T0 + 10)  # both of them expired whole
    for _ in range(4):  # two generations of restored keys built; four rows are not
        w.expire(T0 + 10)
    assert w.restoring and len(w) == 12
    w.max_keys = 8
    assert w.evicted == 4 and len(w) == 8
    assert [w.get(CH, f"r{i:02d}", T0 + 10) is not None for i in range(12)] == \
        [False] * 4 + [True] * 8


def test_an_empty_or_all_expired_load_restores_nothing() -> None:
    w = DedupWindow()
    w.load([], T0)
    w.load(rows(10), T0 + 1000)
    assert len(w) == 0 and not w.restoring


# -------------------------------------------------------------------- memory
def outcome(i: int, broadcast_to_none: bool) -> tuple[int, str]:
    """The outcome of the ``i``-th keyed publish: a message's seq and id, or those of
    a broadcast that reached no channel (seq 0, id "")."""
    return (0, "") if broadcast_to_none else (i + 1, mid(i + 1))


@pytest.mark.parametrize("broadcast_to_none", [False, True])
def test_a_key_costs_at_most_64_bytes(broadcast_to_none: bool) -> None:
    """Measured: ~38 bytes at 300,000 keys (~37 at a million; restored ones the same).
    The columns cost the same per key whatever the generation's size, and a
    generation's fixed parts (table, filter, directory) scale with it: ten sealed
    generations of 256 keys and an active one measure it in a fraction of a second
    (300,000 keys under tracemalloc took a minute)."""
    n = 10 * 256 + 100
    keys = [f"order-{i}-{random.getrandbits(40):x}" for i in range(n)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        w = DedupWindow(generation=256)
        for i, k in enumerate(keys):
            w.put(CH, k, T0 + 120 + i / 6000, *outcome(i, broadcast_to_none))
        per_key = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(w) == n
    assert per_key <= 64, f"{per_key:.1f} bytes per key"
    assert w.get(CH, keys[1234], T0) == outcome(1234, broadcast_to_none)


# -------------------------------------------------------------- in the server
def test_max_dedup_keys_is_configured_reloaded_and_its_evictions_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from minou.config import load_settings
    from minou.errors import ConfigError
    from minou.server.app import BrokerServer

    cfg = tmp_path / "minou.toml"
    cfg.write_text(f'data_dir = "{tmp_path / "data"}"\nmax_dedup_keys = 5\n')
    server = BrokerServer(load_settings(cfg))
    dedup = server.core.dedup
    assert dedup.max_keys == 5
    dedup.get(CH, "-", T0)
    fill(dedup, 8)
    assert dedup.evicted == 3
    with caplog.at_level(logging.WARNING, logger="minou.server"):
        server._warn_dedup_evictions(T0)
        fill(dedup, 12)
        server._warn_dedup_evictions(T0 + 30)  # within the minute: nothing more
        server._warn_dedup_evictions(T0 + 61)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("dedup window narrowed: 3 keys expired early because "
                               "max_dedup_keys=5 was reached")
    assert lines[1].startswith("dedup window narrowed: 12 keys expired early")
    server._warn_dedup_evictions(T0 + 200)  # no new eviction: quiet
    assert len(caplog.records) == 2

    cfg.write_text(f'data_dir = "{tmp_path / "data"}"\nmax_dedup_keys = 3\n')
    assert "max_dedup_keys" in server.reload(by="test")["changed"]
    assert dedup.max_keys == 3 and len(dedup) == 3
    for bad in ("0", "-1", "1.5", '"many"'):
        cfg.write_text(f"max_dedup_keys = {bad}\n")
        with pytest.raises(ConfigError, match="max_dedup_keys: expected an integer >= 1"):
            load_settings(cfg)


# ------------------------------------------------------------ against a model
class Model:
    """What the window promises, kept the slow way: every put in order, the newest of a
    key decides, expiry is exact, forget undoes only the outcome it names, and past
    ``max_keys`` the oldest held entries go first (counted as evicted when they had not
    expired by the latest time seen)."""

    def __init__(self, max_keys: int) -> None:
        self.entries: list[list] = []  # [channel, key, expires_at, seq, id, forgotten]
        self.start = 0  # entries before it are gone
        self.held = 0
        self.evicted = 0
        self.clock = float("-inf")
        self.max_keys = max_keys

    def newest(self, channel: str, key: str) -> int | None:
        for i in range(len(self.entries) - 1, -1, -1):
            if self.entries[i][0] == channel and self.entries[i][1] == key:
                return i
        return None

    def get(self, channel: str, key: str, now: float) -> tuple[int, str] | None:
        self.clock = max(self.clock, now)
        i = self.newest(channel, key)
        if i is None or i < self.start:
            return None
        _, _, exp, seq, ident, forgotten = self.entries[i]
        return None if forgotten or exp <= now else (seq, ident)

    def put(self, channel: str, key: str, exp: float, seq: int, ident: str) -> None:
        self.entries.append([channel, key, exp, seq, ident, False])
        self.held += 1
        self.trim()

    def forget(self, channel: str, key: str, seq: int, ident: str) -> None:
        i = self.newest(channel, key)
        if i is None or i < self.start:
            return
        e = self.entries[i]
        if not e[5] and (e[3], e[4]) == (seq, ident):
            e[5] = True
            self.held -= 1

    def expire(self, now: float) -> None:
        self.clock = max(self.clock, now)
        while self.start < len(self.entries):
            e = self.entries[self.start]
            if not e[5] and e[2] > now:
                break
            self.pass_one()

    def pass_one(self) -> None:
        e = self.entries[self.start]
        self.start += 1
        if not e[5]:
            self.held -= 1
            if e[2] > self.clock:
                self.evicted += 1

    def trim(self) -> None:
        while self.held > self.max_keys:
            self.pass_one()


def operations(rnd: random.Random) -> list[tuple]:
    """A history of keyed publishes (regular ids, odd ones, seqs out of range), gets,
    forgets (of earlier outcomes mostly), expiries and max_keys changes; expiries never
    go down (one dedup window)."""
    keys = [(ch, k) for ch in ("a/v1/1", "a/v1/2") for k in "pqrs"]
    window = rnd.choice([0.5, 1.0, 3.0])
    now, ops, puts = 0.0, [], []
    for _ in range(rnd.randint(1, 60)):
        kind = rnd.choice(["put", "put", "put", "get", "forget", "expire", "max"])
        now += rnd.choice([0.0, 0.0, 0.25, 0.5, 1.0])
        if kind == "put":
            seq = rnd.choice([rnd.randint(0, 40), rnd.randint(0, 40), 2**64 - 1, 2**64])
            head = rnd.choice([f"{rnd.getrandbits(64) or 1:016x}"] * 4 +
                              ["", "id-", "0" * 16, "+" + "1" * 15, "ABCDEF0123456789"])
            ident = f"{head}{seq:x}" if len(head) == 16 or head == "id-" else head
            puts.append((*rnd.choice(keys), now + window, seq, ident))
            ops.append(("publish", now, *puts[-1]))
        elif kind == "forget":  # mostly the outcome of an earlier put (a failed commit)
            if puts and rnd.random() < 0.7:
                ch, key, _, seq, ident = rnd.choice(puts)
                ops.append(("forget", ch, key, seq, ident))
            else:
                ops.append(("forget", *rnd.choice(keys), rnd.randint(0, 3), ""))
        elif kind == "max":
            ops.append(("max", rnd.randint(1, 12)))
        else:
            ops.append((kind, now))
    return ops


@pytest.mark.parametrize("generation", [2, 4, 8])
def test_the_window_agrees_with_a_model(generation: int) -> None:
    """100 seeded random histories per generation size (a loop: ~0.1 s, where Hypothesis
    drawing each operation took ten times as long)."""
    for seed in range(100):
        rnd = random.Random(seed)
        max_keys = rnd.randint(1, 12)
        check_history(operations(rnd), DedupWindow(max_keys, generation=generation),
                      Model(max_keys))


def check_history(ops: list[tuple], w: DedupWindow, m: Model) -> None:
    keys = [(ch, k) for ch in ("a/v1/1", "a/v1/2") for k in "pqrs"]
    for op in ops:
        if op[0] == "publish":  # as the broker does: a key is put only if it is not held
            _, now, ch, key, *outcome = op
            found = w.get(ch, key, now)
            assert found == m.get(ch, key, now)
            if found is None:
                w.put(ch, key, *outcome)
                m.put(ch, key, *outcome)
        elif op[0] == "forget":
            w.forget(*op[1:])
            m.forget(*op[1:])
        elif op[0] == "max":
            w.max_keys = m.max_keys = op[1]
            m.trim()
        elif op[0] == "expire":
            w.expire(op[1])
            m.expire(op[1])
        else:
            now = op[1]
            assert [w.get(ch, k, now) for ch, k in keys] == [m.get(ch, k, now) for ch, k in keys]
        assert (len(w), w.evicted) == (m.held, m.evicted), op


# ------------------------------------------------------------- restore, exactly
ODD_CASES = [  # key, seq, id; the odd ones cannot be rebuilt from (hash, seq)
    ("a", 1, mid(1), False),
    ("b", 0x1F3A, mid(0x1F3A, 0xFFFF_FFFF_FFFF_FFFF), False),
    ("c", 1, mid(1, 1), False),
    ("broadcast-to-none", 0, "", False),
    ("old-format", 3, "a1b2c3d4e50000000003", True),
    ("odd", 9, "id-9", True),
    ("short", 9, "abc", True),
    ("seq-mismatch", 9, mid(8), True),
    ("upper", 10, mid(10).upper(), True),
    ("zero-hash", 4, "0" * 16 + "4", True),
    ("sign", 5, "+" + "1" * 15 + "5", True),
    ("huge-seq", 1 << 64, mid(1 << 64), True),
    ("marker-seq", (1 << 64) - 1, mid((1 << 64) - 1), True),
    ("negative-seq", -1, "x", True),
    ("empty-huge-seq", 1 << 64, "", True),
    ("empty-marker-seq", (1 << 64) - 1, "", True),
]


@pytest.mark.parametrize("generation", [2, 64])
def test_restored_ids_come_back_exactly_and_only_odd_ones_are_kept_whole(generation: int
                                                                          ) -> None:
    entries = sorted((CH, key, T0 + 10 + i, seq, ident)
                     for i, (key, seq, ident, _) in enumerate(ODD_CASES))
    w = DedupWindow(generation=generation)
    w.load(entries, T0)
    while True:
        for ch, key, _, seq, ident in entries:
            assert w.get(ch, key, T0) == (seq, ident), key
        if not w.restoring:
            break
        w.expire(T0)
    # Ids of the form new_id makes cost 8 bytes (their hash); the rest are kept whole.
    assert sorted(ident for _, ident, _ in w._odd.values()) == \
        sorted(ident for _, _, ident, odd in ODD_CASES if odd)
    w.forget(CH, "odd", 9, "id-9")
    w.forget(CH, "a", 1, mid(1))
    assert w.get(CH, "odd", T0) is None and w.get(CH, "a", T0) is None
    assert len(w) == len(ODD_CASES) - 2


def test_expired_restored_rows_are_let_go_and_counted_exactly() -> None:
    """Times near 0 and seqs above them: an expiry is never mistaken for a seq."""
    entries = sorted(("c", f"k{i:03d}", 1.0 + i, 1000 + i, mid(1000 + i)) for i in range(100))
    w = DedupWindow(generation=16)
    w.load(entries, 0.0)
    assert len(w) == 100
    w.expire(1.0)  # k000 expires exactly then
    assert len(w) == 99
    w.expire(10.0)  # k000..k009 expired (k009 exactly at 10.0); those being built (in
    w.expire(10.0)  # the generation not yet sealed) go a tick later
    assert len(w) == 90
    w.expire(50.0)  # some rows built, more of them expired, some not built yet
    w.expire(50.0)
    assert len(w) == 50
    for _ in restoring(w):
        w.expire(50.0)
        assert len(w) == 50
    assert [w.get("c", f"k{i:03d}", 50.0) is not None for i in range(100)] == \
        [False] * 50 + [True] * 50
    assert w.evicted == 0


def test_a_restored_key_is_gone_at_its_expiry_while_restoring() -> None:
    w = DedupWindow(generation=16)
    w.load(rows(100), T0)
    assert w.restoring
    for ch, key, exp, seq, ident in rows(100):
        assert w.get(ch, key, exp) is None
        assert w.get(ch, key, exp - 0.001) == (seq, ident)


def test_restored_keys_evicted_while_restoring_do_not_come_back() -> None:
    entries = rows(100)
    by_expiry = sorted(entries, key=lambda r: r[2])
    w = DedupWindow(generation=16)
    w.load(entries, T0)
    w.expire(T0)  # the first 16 rows by expiry: hashed
    w.expire(T0)  # ... and sealed
    assert w.restoring
    w.get("-", "-", T0)  # the clock
    w.max_keys = 84  # exactly those 16 go
    assert w.evicted == 16 and len(w) == 84
    for ch, key, _, seq, ident in by_expiry:
        assert w.get(ch, key, T0) == (None if (ch, key) in
                                      {r[:2] for r in by_expiry[:16]} else (seq, ident))


def test_after_a_restore_eviction_takes_the_keys_that_expire_first() -> None:
    entries = rows(100)
    w = DedupWindow(generation=16)
    w.load(entries, T0)
    for _ in restoring(w):
        w.expire(T0)
    w.put("ch/0", "new", T0 + 500, 1, mid(1))
    w.get("-", "-", T0)
    w.max_keys = 31
    assert w.evicted == 70
    by_expiry = sorted(entries, key=lambda r: r[2])
    assert [w.get(ch, key, T0) is not None for ch, key, *_ in by_expiry] == \
        [False] * 70 + [True] * 30
    assert w.get("ch/0", "new", T0) == (1, mid(1))


# ------------------------------------------------------------ restored rows, exactly
def build(w: DedupWindow, now: float) -> None:
    """Ticks until the restored rows are built."""
    for _ in restoring(w):
        w.expire(now)


@pytest.mark.parametrize("broadcast_to_none", [False, True])
def test_a_restored_key_costs_at_most_64_bytes_too(broadcast_to_none: bool) -> None:
    """Restored ids (``f"{hash:016x}{seq:x}"``, or "") are kept as their hash, like put
    ones, not whole."""
    entries = [(ch, key, exp, *outcome(i, broadcast_to_none))
               for i, (ch, key, exp, *_) in enumerate(rows(10 * 256 + 100, window=1000.0))]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        w = DedupWindow(generation=256)
        w.load(entries, T0)
        build(w, T0)
        per_key = (tracemalloc.get_traced_memory()[0] - before) / len(entries)
    finally:
        tracemalloc.stop()
    assert len(w) == len(entries)
    assert per_key <= 64, f"{per_key:.1f} bytes per key"
    channel, key, _, seq, ident = entries[1234]
    assert w.get(channel, key, T0) == (seq, ident)


@pytest.mark.parametrize("ident", ["0000000000000000" + "5", "zzzzzzzzzzzzzzzz5", "abc", "",
                                   "0000000000000001" + "5"])
def test_a_restored_id_of_any_form_comes_back_as_it_was_stored(ident: str) -> None:
    w = DedupWindow(generation=4)
    w.load([(CH, "k", T0 + 100, 5, ident), (CH, "other", T0 + 100, 6, mid(6))], T0)
    assert w.get(CH, "k", T0) == (5, ident)  # while restoring
    build(w, T0)
    assert w.get(CH, "k", T0) == (5, ident)  # built


def test_a_restored_key_not_yet_built_is_a_duplicate_until_it_expires_not_at_it() -> None:
    w = DedupWindow()
    w.load(rows(50), T0)
    channel, key, expires, seq, ident = rows(50)[7]
    assert w.restoring
    assert w.get(channel, key, expires - 0.001) == (seq, ident)
    assert w.get(channel, key, expires) is None


def test_restored_keys_evicted_early_are_gone_while_the_rest_is_restored() -> None:
    """The first generation built (4 keys expiring together) is evicted by max_keys;
    the rows it was built from must not answer for them any more."""
    entries = sorted([(CH, f"a{i}", T0 + 10, i + 1, mid(i + 1)) for i in range(4)]
                     + [(CH, f"b{i}", T0 + 20, i + 5, mid(i + 5)) for i in range(4)])
    w = DedupWindow(generation=4)
    w.load(entries, T0)
    w.expire(T0)  # hashes the first 4 (by expiry)
    w.expire(T0)  # seals them
    assert w.restoring
    w.max_keys = 4
    assert w.evicted == 4 and len(w) == 4
    assert [w.get(CH, f"a{i}", T0) for i in range(4)] == [None] * 4
    assert w.get(CH, "b0", T0) == (5, mid(5))


def test_restored_rows_that_expire_before_they_are_built_leave_the_count() -> None:
    """Seqs above the clock's value, so that no seq is mistaken for a time."""
    big = 10**8
    entries = sorted([(CH, f"{t}-{i}", T0 + t, big + t + i, mid(big + t + i))
                      for t in (10, 20, 30) for i in range(4)])
    w = DedupWindow(generation=4)
    w.put(CH, "new", T0 + 100, 1, mid(1))
    w.load(entries, T0)
    assert len(w) == 13
    w.expire(T0)
    w.expire(T0)  # the keys expiring at T0 + 10 are built
    w.expire(T0 + 20)  # those go whole; those at T0 + 20 expire unbuilt, exactly then
    assert len(w) == 5
    assert w.get(CH, "30-0", T0 + 20) == (big + 30, mid(big + 30))
    assert w.get(CH, "20-0", T0 + 20) is None


def test_evicting_past_forgotten_keys_counts_only_the_unexpired_live_ones() -> None:
    w = DedupWindow()
    for i in range(7):
        w.put(CH, f"k{i}", T0 + i, i + 1, mid(i + 1))
    w.forget(CH, "k6", 7, mid(7))  # a failed commit's key: not counted
    assert w.get(CH, "k1", T0 + 1) is None  # the clock is T0 + 1: k0 and k1 expired
    w.max_keys = 1  # k0 to k4 go: k2, k3, k4 early
    assert w.evicted == 3 and len(w) == 1
    assert w.get(CH, "k5", T0 + 1) == (6, mid(6))


@pytest.mark.parametrize("seq", [0, 2**63, 2**64 - 2, 2**64 - 1, 2**64, -1])
def test_a_restored_row_with_any_seq_comes_back_as_stored(seq: int) -> None:
    w = DedupWindow(generation=4)
    ident = f"{0x1234_5678_9ABC_DEF0:016x}{seq:x}"
    w.load([(CH, "k", T0 + 100, seq, ident), (CH, "other", T0 + 100, 6, mid(6))], T0)
    assert w.get(CH, "k", T0) == (seq, ident)  # from the rows, while restoring
    build(w, T0)
    assert w.get(CH, "k", T0) == (seq, ident)


def test_load_takes_any_iterable_of_rows() -> None:
    """Storage may hand its rows as an iterator (a cursor), not a list."""
    entries = rows(20)
    w = DedupWindow(generation=4)
    w.load(iter(entries), T0)
    channel, key, _, seq, ident = entries[7]
    assert len(w) == 20 and w.get(channel, key, T0) == (seq, ident)
    build(w, T0)
    assert w.get(channel, key, T0) == (seq, ident)


# ------------------------------------------------- the rows storage reads at a start
# SQLite reads the dedup table a page at a time (DEDUP_READ_PAGE rows) into DedupRows,
# in (channel, key) order: the rows must come back exactly whatever the pages, a key
# must be found only on its own channel, and rows that are not in order must be sorted
# before a restore bisects them.
PAGED = sorted([
    ("a/v1/1", "k1", T0 + 10, 1, mid(1)),
    ("a/v1/1", "k3", T0 + 11, 2, mid(2)),
    ("a/v1/1", "k5", T0 + 12, 3, mid(3)),
    ("a/v1/2", "k2", T0 + 13, 4, mid(4)),
    ("a/v1/2", "k4", T0 + 14, 0, ""),  # a broadcast that reached no channel
    ("a/v1/2", "k6", T0 + 15, 6, "id-6"),  # an id of an older form: kept whole
    ("b/v1/1", "é", T0 + 16, 7, mid(7)),  # keys are any text: UTF-8 bytes sort as text
    ("b/v1/1", "\ud800", T0 + 17, 8, mid(8)),  # a lone surrogate (JSON can carry one)
    ("b/v1/1", "z" * 300, T0 + 18, 2**64, mid(2**64)),  # a seq no column holds
])
ABSENT = [  # (channel, key): none of them is stored
    ("a/v1/1", "k0"), ("a/v1/1", "k2"), ("a/v1/1", "k6"),  # before, between, after its keys
    ("a/v1/1", "k4"),  # a key only the next channel holds
    ("a/v1/2", "k1"), ("a/v1/2", "k5"),  # keys only the channel before holds
    ("b/v1/1", "\uffff"), ("b/v1/1", "z" * 301),  # past the last row of all
    ("a/v1/0", "k1"), ("c/v1/1", "k1"), ("", ""),  # channels with no row
]


def pages(entries: list, size: int) -> list[list]:
    return [entries[i:i + size] for i in range(0, len(entries), size)]


@pytest.mark.parametrize("size", [1, 2, 4, len(PAGED)])
def test_rows_read_a_page_at_a_time_are_the_rows_read_at_once(size: int) -> None:
    read = DedupRows()
    for page in pages(PAGED, size):
        read.extend(page)
    read.extend([])  # a cursor's last, empty page
    assert read.ordered and len(read) == len(PAGED)
    assert list(read) == PAGED and [read[i] for i in range(len(PAGED))] == PAGED
    assert read == PAGED and read == tuple(PAGED) and read == DedupRows(PAGED)
    assert read != PAGED[:-1] and read != PAGED[::-1]
    assert read.__eq__(5) is NotImplemented and read != "rows" and read != set(PAGED)
    assert DedupRows.of(read) is read  # in order: taken as it is, not copied
    assert DedupRows(iter(PAGED)) == PAGED  # a cursor, not a list
    for i, (channel, key, *_) in enumerate(PAGED):
        assert read.find(channel, key) == i, (channel, key)
    for channel, key in ABSENT:
        assert read.find(channel, key) == -1, (channel, key)


SHUFFLED = {  # rows storage might hand over out of (channel, key) order
    "channels": PAGED[3:6] + PAGED[:3] + PAGED[6:],  # a channel's rows after the next's
    "neighbours": PAGED[:1] + PAGED[2:3] + PAGED[1:2] + PAGED[3:],  # two keys swapped
}


@pytest.mark.parametrize("size", [1, 3, len(PAGED)])
@pytest.mark.parametrize("how", sorted(SHUFFLED))
def test_rows_out_of_order_are_sorted_before_a_restore_bisects_them(how: str,
                                                                     size: int) -> None:
    """Rows out of order, across pages or within one: the window's restore sorts them,
    and finds each key while restoring and after."""
    shuffled = SHUFFLED[how]
    read = DedupRows()
    for page in pages(shuffled, size):
        read.extend(page)
    assert not read.ordered and list(read) == shuffled
    assert list(DedupRows.of(read)) == PAGED
    w = DedupWindow(generation=4)
    w.load(read, T0)
    assert w.restoring
    while True:
        for channel, key, _, seq, ident in PAGED:
            assert w.get(channel, key, T0) == (seq, ident), (channel, key)
        for channel, key in ABSENT:
            assert w.get(channel, key, T0) is None, (channel, key)
        if not w.restoring:
            break
        w.expire(T0)


def test_while_restoring_a_new_key_is_no_duplicate_whatever_its_neighbours_hold() -> None:
    """Right after a restart the stored keys are looked up in the rows themselves (they
    are built over the next ticks): a key that is not stored, on a channel with stored
    keys around it, after them or only on another channel, or on a channel with none,
    is no duplicate; its publish goes through and is remembered."""
    w = DedupWindow()
    w.load(DedupRows(PAGED), T0)
    assert w.restoring
    for n, (channel, key) in enumerate(ABSENT, 100):
        assert w.get(channel, key, T0) is None, (channel, key)
        w.put(channel, key, T0 + 50, n, mid(n))
        assert w.get(channel, key, T0) == (n, mid(n))
    assert w.restoring
    for channel, key, _, seq, ident in PAGED:
        assert w.get(channel, key, T0) == (seq, ident)
