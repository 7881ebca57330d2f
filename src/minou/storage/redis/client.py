"""The redis-py client a RedisStorage talks through: one Redis (``redis://``,
``rediss://``) or, for ``redis+sentinel://``, whichever Redis the Sentinels name as the
primary now.

Under Sentinel, redis-py's SentinelConnectionPool asks the Sentinels for the primary's
address each time it opens a connection, and drops idle connections to an address
that is no longer the primary's. So after a failover the next commit fails (its
connection died with the old primary, or the Sentinels have not promoted anybody
yet: StorageUnavailable to the broker, which refuses publishes and probes) and a
later one connects to the promoted replica: the storage follows the new primary by
itself. A primary demoted while still up answers writes with READONLY, which redis-py
turns into a ConnectionError and a fresh look-up.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

from .url import RedisURL


def connect(where: RedisURL, **options: Any) -> redis.Redis:
    """A client for ``where``; ``options`` (timeouts, retry, password) apply to every
    connection to a data node, the URL's own query keys taking precedence as
    ``Redis.from_url`` does."""
    if not where.sentinels:
        return redis.Redis.from_url(where.client_url, **options)
    options.update(parse_url(where.client_url))
    for placeholder in ("host", "port"):
        options.pop(placeholder, None)
    # The Sentinels get the timeouts (an unreachable Sentinel must not hang a commit)
    # and their own password, never the data nodes'.
    asking: dict[str, Any] = {k: v for k, v in options.items()
                              if k.startswith("socket_")}
    if where.sentinel_password is not None:
        asking["password"] = where.sentinel_password
    sentinel = Sentinel(list(where.sentinels), sentinel_kwargs=asking)
    return sentinel.master_for(where.service, **options)


def primary_address(client: redis.Redis) -> str | None:
    """``host:port`` of the Redis a Sentinel-managed ``client`` last connected to as the
    primary (for messages: which Redis refused); None for a plain client."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool) or pool.master_address is None:
        return None
    host, port = pool.master_address
    return f"{host}:{port}"


def close(client: redis.Redis) -> None:
    """Close ``client`` and, under Sentinel, the connections to the Sentinels too."""
    pool = client.connection_pool
    client.close()
    if isinstance(pool, SentinelConnectionPool):
        pool.sentinel_manager.close()
