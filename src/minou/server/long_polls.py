"""Long polls waiting for a commit (KV watches; ``channels.wait``: federation links,
the Redis door's XREAD BLOCK), and HTTP requests waiting for their reply (counted
only): how many may wait, and who waits for which channels. No I/O: the engine wakes
them after each commit, a poll forgets itself when it times out or is cancelled.

Both must cost what they touch, not everything that waits: 10,000 polls of 256
patterns each, tried one by one against a commit of 100 channels, held the event loop
17.6 s (another client's PING waited that long), and forgetting 10,000 polls that
timed out, each by rebuilding the list of the others, is quadratic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..errors import TooManyConnections
from ..limits import MAX_KV_WAITERS, MAX_LONG_POLLS_PER_CLIENT
from ..names import Pattern, match_keys

if TYPE_CHECKING:
    from ..auth.registry import Identity

Wake = Callable[[], None]


class LongPolls:
    """How many polls wait at once: of each kind at most ``per_kind`` (the broker's
    bound), and of one client's, both kinds together, at most ``per_client``: else one
    client (one connection pipelining polls) could take every slot and have every other
    refused. Admins, and the broker itself (no caller), are bounded in all only, as
    for the groups a client makes (``MAX_GROUPS_PER_CLIENT``)."""

    def __init__(self, *, per_kind: int = MAX_KV_WAITERS,
                 per_client: int = MAX_LONG_POLLS_PER_CLIENT) -> None:
        self.per_kind = per_kind
        self.per_client = per_client
        self.kinds: Counter[str] = Counter()
        self.clients: Counter[str] = Counter()

    @contextmanager
    def slot(self, kind: str, caller: Identity | None) -> Iterator[None]:
        """Hold a slot while the poll waits; ``TooManyConnections`` past either bound
        (counted by whoever answers it, as every refusal)."""
        if self.kinds[kind] >= self.per_kind:
            raise TooManyConnections(
                f"{self.kinds[kind]:,} {kind} wait already, as many as the broker holds at "
                f"once (MAX_KV_WAITERS): try again later", limit=self.per_kind)
        client = None if caller is None or caller.admin else caller.client_id
        if client is not None and self.clients[client] >= self.per_client:
            raise TooManyConnections(
                f"client {client!r} has {self.clients[client]} long polls waiting (KV "
                f"watches, channels.wait and HTTP requests waiting for their reply together, "
                f"over all its connections); a client "
                f"may have {self.per_client} at once (max_long_polls_per_client), so that "
                f"no one takes all {self.per_kind:,} the broker holds: let one be answered "
                "(or close a watch) before starting another", limit=self.per_client,
                client=client)
        self.kinds[kind] += 1
        if client is not None:
            self.clients[client] += 1
        try:
            yield
        finally:
            _give_back(self.kinds, kind)
            if client is not None:
                _give_back(self.clients, client)


def _give_back(counts: Counter[str], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:  # gone: a client id seen once is not kept for ever
        del counts[key]


class PatternWaiters:
    """Polls each waiting for a commit to any channel its patterns match, indexed by
    the patterns' ``prefix`` (a concrete channel's name, or what the channels of
    ``endpoint/*`` and ``endpoint/version/*`` start with, ``_dead/`` included): a
    commit looks up the few keys of each channel it wrote (``match_keys``)."""

    def __init__(self) -> None:
        self._by_key: dict[str, dict[Wake, None]] = {}  # a dict: ordered, O(1) removal
        self._keys: dict[Wake, tuple[str, ...]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, patterns: Iterable[Pattern], wake: Wake) -> None:
        """``wake`` is called once, by the first commit to a channel ``patterns`` match."""
        keys = tuple(dict.fromkeys(p.prefix for p in patterns))  # a pattern given twice
        self._keys[wake] = keys
        for key in keys:
            self._by_key.setdefault(key, {})[wake] = None

    def remove(self, wake: Wake) -> None:
        """Forget ``wake`` (woken, timed out or cancelled; again is a no-op)."""
        for key in self._keys.pop(wake, ()):
            mine = self._by_key[key]
            del mine[wake]
            if not mine:
                del self._by_key[key]

    def wake(self, channels: Iterable[str]) -> None:
        """Wake, once each, the polls some of whose patterns match one of ``channels``
        (the channels a commit wrote to) and forget them."""
        woken: dict[Wake, None] = {}
        by_key = self._by_key
        for channel in channels:
            for key in match_keys(channel):
                found = by_key.get(key)
                if found:
                    woken.update(found)
        for wake in woken:  # all forgotten before any is called: none is walked twice
            self.remove(wake)
        for wake in woken:
            wake()
