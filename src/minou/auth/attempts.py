"""How often one key (a client id, an address) may try something: a fixed window.

Bounded memory: when it tracks too many keys it forgets the ones whose window ended,
and if all are live it refuses new keys until some end (a flood of ids is refused, not
remembered)."""

from __future__ import annotations

from ..limits import MAX_ATTEMPT_KEYS


class AttemptLimiter:
    def __init__(self, limit: int, window: float, *, max_keys: int = MAX_ATTEMPT_KEYS) -> None:
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._windows: dict[str, tuple[float, int]] = {}  # key -> (window start, count)

    def allow(self, key: str, now: float) -> bool:
        start, count = self._windows.get(key, (now, 0))
        if now - start >= self.window:
            start, count = now, 0
        if count >= self.limit:
            return False
        if key not in self._windows and len(self._windows) >= self.max_keys:
            self._windows = {k: v for k, v in self._windows.items()
                             if now - v[0] < self.window}
            if len(self._windows) >= self.max_keys:
                return False
        self._windows[key] = (start, count + 1)
        return True

    def used(self, key: str, now: float) -> int:
        """Tries ``key`` made in its current window: a refusal says which bound it met
        (its own limit, or too many keys at once)."""
        start, count = self._windows.get(key, (now, 0))
        return 0 if now - start >= self.window else count
