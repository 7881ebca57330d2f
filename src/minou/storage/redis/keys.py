"""Where each record lives in Redis: the key layout, one hash tag per queue.

The unit of ownership is the queue, ``endpoint/version``: every channel
``endpoint/version/id`` and its dead-letter twin ``_dead/endpoint/version/id`` belong
to it (dead-lettering then moves a message inside one queue, so inside one atomic
script). Every key of a queue carries the tag ``{endpoint/version}``, so Redis Cluster
keeps a queue in one slot and a queue's script touches that slot only.

Under ``<prefix>:{<queue>}:``

=================  =====================================================================
``epoch``          the queue's fencing epoch (INCR at each claim)
``term``           Redis Cluster: the lease term that claimed the queue last
``used``           bytes the queue's records take, as the quota counts them
``next``           hash channel -> next seq (a channel's existence)
``first``          hash channel -> first seq (only once truncated; 1 otherwise)
``born``           hash channel -> creation order (snapshots list channels in it)
``s:<channel>``    zset of segment first seqs (score = member)
``b:<channel>``    hash first seq -> the segment's encoded messages
``m:<channel>``    hash first seq -> "<last seq> <published_at>"
``r:<channel>``    zset of seqs removed from inside a segment
``exp``            zset "<channel>\\0<first>" by the segment's earliest expiry (TTL scan)
``spec``           set "<channel>\\0<first>" of segments holding priority/delayed messages
``groups``         set of groups with a state in this queue
``gs:<group>``     hash channel -> "<floor>:<state>"
``dedup``          hash msgpack [channel, key] -> msgpack [expires_at, seq, id]
``dedupx``         zset of those fields by expiry (pruning)
``prod``           hash msgpack [client, producer, channel] -> msgpack rest of the row
``fencers``        set of writers with a fence in this queue
``fw:<writer>``    hash channel -> the writer's last batch number
``ids``            hash "resp-id/<channel>/<seq>" -> "<ms>-<n>": stream ids clients gave
                   (core/stream_ids.py; storage meta rows on other backends)
=================  =====================================================================

Shared state, written by every broker, under ``<prefix>:{shared}:`` (one slot: it
is small, read whole at start, and what it holds is not per queue):
``queues`` (the registry of queues, a set), ``primary`` (the lease) and ``term``
(raised by each broker that takes it), ``groups`` (definitions: a group's
patterns may span queues), ``clients``, ``credentials``, ``reservations`` (``!``
channels, reserved across the whole installation), ``writers``, ``meta``,
``tokens`` (zset jti by expiry: a token is used once on any broker), ``txns`` (set of
staged transactions) with ``txn:<msgpack [owner, txn]>`` (hash part -> parts: a
transaction spans queues), ``dedup``/``dedupx`` (the rare entries whose channel is a
pattern of no single queue) and ``used``.
"""

from __future__ import annotations

from ...names import DEAD_PREFIX

SHARED = "shared"  # no queue name is this: queues always hold a "/"
SEP = "\0"  # between a channel and a seq in a member: channels never hold it


def queue_of(channel: str) -> str | None:
    """The queue ``channel`` belongs to, or None for a pattern of no single queue
    (``orders/*``): ``orders/v1/7`` and ``_dead/orders/v1/7`` -> ``orders/v1``."""
    parts = channel.removeprefix(DEAD_PREFIX).split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1] or parts[1] == "*":
        return None
    return f"{parts[0]}/{parts[1]}"


def check_prefix(prefix: str) -> str:
    """``prefix`` if usable: braces would move the hash tag."""
    if not prefix or "{" in prefix or "}" in prefix:
        raise ValueError(f"Redis key prefix {prefix!r}: give a non-empty name without braces")
    return prefix


def queue_base(prefix: str, queue: str) -> str:
    return f"{prefix}:{{{queue}}}:"


def shared_base(prefix: str) -> str:
    return f"{prefix}:{{{SHARED}}}:"


def member(channel: str, first: int) -> str:
    """A segment's name in the per-queue ``exp`` and ``spec`` sets."""
    return f"{channel}{SEP}{first}"


def split_member(raw: bytes | str) -> tuple[str, int]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    channel, first = text.rsplit(SEP, 1)
    return channel, int(first)
