"""What every backend stores the same way: messages in segments (runs of consecutive
seqs, one encoded body each), the search retention makes over them, and how sizes are
said in messages. Shared so that the backends cannot drift apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..core.log import Msg
from ..core.seq_runs import SeqRuns
from ..core.snapshot import ChannelRecord

encode = msgspec.msgpack.Encoder().encode
decode_messages = msgspec.msgpack.Decoder(list[Msg]).decode


class Placed(msgspec.Struct, array_like=True, gc=False):
    """What a start needs of a stored message to schedule it (``Snapshot.specials``),
    decoded from a segment without its body: ``Msg``'s fields in ``Msg``'s order, the
    ones not needed as ``Raw`` (a view of the segment, nothing copied); the fields after
    ``deliver_at`` are skipped."""

    channel: str
    seq: int
    id: msgspec.Raw
    data: msgspec.Raw
    raw: msgspec.Raw
    headers: msgspec.Raw
    priority: int
    published_at: msgspec.Raw
    expires_at: msgspec.Raw
    deliver_at: float | None


# Read by position: a field added to Msg before deliver_at must be added here too.
if Msg.__struct_fields__[:len(Placed.__struct_fields__)] != Placed.__struct_fields__:
    raise RuntimeError("storage.segments.Placed no longer matches core.log.Msg's fields")
decode_placed = msgspec.msgpack.Decoder(list[Placed]).decode


def runs(msgs: list[Msg]) -> list[list[Msg]]:
    """Split one channel's messages into runs of consecutive seqs (a segment each).

    The broker hands them over in order and consecutive (one run); anything else is
    sorted and split, so a segment always covers exactly [first seq, last seq].
    """
    first = msgs[0].seq
    if msgs[-1].seq - first + 1 == len(msgs) and all(
        m.seq == first + i for i, m in enumerate(msgs)
    ):
        return [msgs]
    out: list[list[Msg]] = []
    for m in sorted({m.seq: m for m in msgs}.values(), key=lambda m: m.seq):
        if out and out[-1][-1].seq + 1 == m.seq:
            out[-1].append(m)
        else:
            out.append([m])
    return out


def channel_record(name: str, next_seq: int, first_seq: int, spans: list[tuple[int, int]],
                   removed: SeqRuns) -> ChannelRecord:
    """A channel as a restart reads it back, from its stored shape: ``spans`` are its
    segments' (first, last) seqs in order, ``removed`` the seqs deleted from inside
    them (taken over: it becomes the record's ``gone``, no copy of it is made). Seqs
    never stored (the holes failed publishes leave, between segments and after the
    last) are gone but were never counted; only removed seqs are taken off ``count``."""
    holes: list[tuple[int, int]] = []  # as runs: a failed batch leaves a long one
    first = next_seq
    if spans:
        next_seq = max(next_seq, spans[-1][1] + 1)
        first = max(first_seq, spans[0][0])
    expected, count = first, 0
    for start, last in spans:
        if last < first:
            continue
        start = max(start, first)
        if start > expected:
            holes.append((expected, start))
        count += last - start + 1
        expected = last + 1
    removed.drop_below(first)
    removed.drop_from(next_seq)
    count -= removed.count_between(first, expected) - \
        sum(removed.count_between(a, b) for a, b in holes)
    for a, b in holes:
        removed.add_run(a, b)
    # Past the last segment too: failed publishes, when a later removal stored next_seq.
    removed.add_run(expected, next_seq)
    first = removed.skip(first)  # leading removed messages: the channel starts after them
    removed.drop_below(first)
    return ChannelRecord(name, next_seq, first, count, gone=removed)


def retained_until(first_at_or_after: Callable[[int], tuple[int, float] | None],
                   body_of: Callable[[int], bytes], below: int, cutoff: float) -> int | None:
    """One past the last seq < ``below`` published before ``cutoff``, over a channel's
    segments: ``first_at_or_after(seq)`` gives the first segment starting at or after
    ``seq`` (and below ``below``) as (its first seq, its published_at), ``body_of`` a
    segment's encoded body. Publish times grow with seq and a segment's published_at
    is its first message's: a binary search for the last segment that starts before
    the cutoff (a few key lookups, no scan), then a look inside it."""
    first = first_at_or_after(0)
    if first is None or first[1] >= cutoff:
        return None
    lo, hi = first[0], below  # lo starts an old segment; none old starts in [hi, below)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        found = first_at_or_after(mid)
        if found is not None and found[1] < cutoff:
            lo = found[0]
        else:
            hi = mid
    old = [m.seq for m in decode_messages(body_of(lo))
           if m.seq < below and m.published_at < cutoff]
    return old[-1] + 1 if old else None


def full_text(cause: str, where: str, space: dict[str, Any], what: str) -> str:
    """A full store's refusal: ``where`` it is and its free room (``what`` says of
    what), the quota when one is set, and that nothing was stored."""
    text = f"storage full ({cause}): {where} has {size_text(space['disk_free'])} {what}"
    if space.get("max_size"):
        text += (f", and uses {size_text(space['used'])} of [storage] max_size "
                 f"{size_text(space['max_size'])}")
    return text + "; nothing was stored. Publishes are refused until space is freed."


def size_text(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover
