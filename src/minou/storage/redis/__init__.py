"""Storage on Redis (``redis://``, ``rediss://``): see store.py."""

from __future__ import annotations

try:
    import redis as _redis  # noqa: F401 - only to say how to install it
except ImportError as exc:  # pragma: no cover - the extra is installed in tests
    raise ImportError("Redis storage needs: pip install 'minou[redis]'") from exc

from .store import RedisStorage

__all__ = ["RedisStorage"]
