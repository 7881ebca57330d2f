"""Long polls waiting for a commit (``channels.wait``: federation links, the Redis
door's XREAD BLOCK): who waits for which channels. No I/O: the engine wakes them after
each commit, the poll forgets itself when it times out or is cancelled.

Both must cost what they touch, not everything that waits: 10,000 polls of 256
patterns each, tried one by one against a commit of 100 channels, held the event loop
17.6 s (another client's PING waited that long), and forgetting 10,000 polls that
timed out, each by rebuilding the list of the others, is quadratic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..names import Pattern, match_keys

Wake = Callable[[], None]


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
