"""Which broker owns which queue: rendezvous (highest random weight) hashing. No I/O.

Every broker computes the same answer from the same two inputs, the queue names and the
live members (the ``{shared}alive`` set in Redis), with no coordinator: a queue goes to
the member with the highest ``weight(member, queue)``. When a member joins, only the
queues it now ranks first for move (to it, about ``1/n`` of them); when one leaves,
only its own queues move, each to its second choice. That is what keeps a handoff
small: ``moves`` lists exactly those.

The weight is an unkeyed 64-bit BLAKE2b of ``member NUL queue``: stable across
processes, machines and Python versions (``hash()`` is salted per process), and a
client cannot steer it beyond choosing queue names, which moves load, not safety
(ownership is still fenced by epochs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(member: str, queue: str) -> int:
    """How much ``member`` wants ``queue``: the highest weight owns it."""
    digest = hashlib.blake2b(f"{member}\0{queue}".encode("utf-8", "surrogatepass"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(queue: str, members: Iterable[str]) -> list[str]:
    """``members`` from first to last choice for ``queue`` (ties, never seen in 64 bits,
    go to the smaller name so that every broker agrees)."""
    return sorted(set(members), key=lambda m: (-weight(m, queue), m))


def owner(queue: str, members: Iterable[str]) -> str | None:
    """The member ``queue`` belongs to, or None when there is none."""
    best: tuple[int, str] | None = None
    for m in set(members):
        w = weight(m, queue)
        if best is None or w > best[0] or (w == best[0] and m < best[1]):
            best = (w, m)
    return None if best is None else best[1]


def assign(queues: Iterable[str], members: Iterable[str]) -> dict[str, list[str]]:
    """Member -> the queues it owns (sorted); every member appears, even with none."""
    live = sorted(set(members))
    out: dict[str, list[str]] = {m: [] for m in live}
    if not live:
        return out
    for q in sorted(set(queues)):
        out[owner(q, live)].append(q)  # type: ignore[index]
    return out


def moves(queues: Iterable[str], before: Iterable[str], after: Iterable[str]
          ) -> list[tuple[str, str | None, str | None]]:
    """The handoffs a change of members asks for: (queue, from, to), sorted by queue;
    ``from`` None: nobody owned it; ``to`` None: nobody is left to."""
    old, new = set(before), set(after)
    out = []
    for q in sorted(set(queues)):
        a, b = owner(q, old), owner(q, new)
        if a != b:
            out.append((q, a, b))
    return out
