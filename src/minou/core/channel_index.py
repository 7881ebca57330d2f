"""The channels a wildcard pattern matches, found without trying every channel.

A group made with ``orders/v1/*`` (or given it later) reads every channel whose name
starts with that prefix. Trying each of 100,000 channels (DEFAULT_MAX_CHANNELS) took
~25 ms per wildcard, a stall of the whole broker, and one SUBSCRIBE may name hundreds.

Channels are filed by their name cut after its last "/" (``orders/v1/``,
``_dead/orders/v1/``: one entry a channel), and each such prefix under the prefixes
cut after each earlier "/" (``orders/``, ``_dead/orders/``, ``_dead/``): a pattern's
prefix ends in "/", so its channels are those filed under it or under what it holds.
Only prefixes that hold a channel are kept: the index never outgrows the channels.

Each channel also gets a number in the order it was kept (``ChannelLog.order``), so a
wildcard over several queues attaches its channels in the order a scan of
``BrokerState.channels`` (insertion order) did.
"""

from __future__ import annotations

from .log import ChannelLog


def _parent(prefix: str) -> str | None:
    """``a/b/`` -> ``a/``; None for a prefix with one "/"."""
    cut = prefix.rfind("/", 0, len(prefix) - 1)
    return prefix[:cut + 1] if cut >= 0 else None


def _order(log: ChannelLog) -> int:
    return log.order


class ChannelIndex:
    __slots__ = ("_below", "_filed", "_orders")

    def __init__(self) -> None:
        # name cut after its last "/" -> the channels so named, in the order kept
        self._filed: dict[str, dict[str, ChannelLog]] = {}
        # prefix -> the longer prefixes, one "/" more, that hold channels
        self._below: dict[str, dict[str, None]] = {}
        self._orders = 0

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._filed.values())

    def prefixes(self) -> set[str]:
        """Every prefix the index keeps (each holds a channel: the bound on its size)."""
        return set(self._filed) | set(self._below)

    def buckets(self) -> list[tuple[str, dict[str, ChannelLog]]]:
        """Each name cut after its last "/" (``orders/v1/``) with its channels: a list
        taken now of the live buckets, for a walk of every channel a queue at a time."""
        return list(self._filed.items())

    def add(self, log: ChannelLog) -> None:
        self._orders += 1
        log.order = self._orders
        name = log.name
        where = name[:name.rfind("/") + 1]
        bucket = self._filed.get(where)
        if bucket is None:
            self._filed[where] = {name: log}
            self._link(where)
        else:
            bucket[name] = log

    def remove(self, log: ChannelLog) -> None:
        name = log.name
        where = name[:name.rfind("/") + 1]
        bucket = self._filed.get(where)
        if bucket is None or bucket.get(name) is not log:
            return
        del bucket[name]
        if not bucket:
            del self._filed[where]
            self._unlink(where)

    def _link(self, prefix: str) -> None:
        """File ``prefix`` (it holds a channel now) under its parents, up to the first
        parent that was filed already."""
        below = self._below
        while (parent := _parent(prefix)) is not None:
            kids = below.get(parent)
            if kids is not None:
                kids[prefix] = None
                return
            below[parent] = {prefix: None}
            prefix = parent

    def _unlink(self, prefix: str) -> None:
        """Unfile ``prefix`` (it may hold nothing now), and each parent left empty."""
        below, filed = self._below, self._filed
        while prefix not in below and prefix not in filed:
            parent = _parent(prefix)
            if parent is None:
                return
            kids = below[parent]
            del kids[prefix]
            if kids:
                return
            del below[parent]
            prefix = parent

    def matching(self, prefix: str) -> list[ChannelLog]:
        """The channels whose name starts with ``prefix`` (a wildcard's: it ends in
        "/"), in the order they were kept."""
        found: list[ChannelLog] = []
        buckets = 0
        todo = [prefix]
        while todo:
            at = todo.pop()
            bucket = self._filed.get(at)
            if bucket:
                found.extend(bucket.values())
                buckets += 1
            kids = self._below.get(at)
            if kids:
                todo.extend(kids)
        if buckets > 1:
            found.sort(key=_order)
        return found
