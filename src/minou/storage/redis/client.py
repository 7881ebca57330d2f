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

Under Redis Cluster (``redis+cluster://``), redis-py's RedisCluster learns which node
serves which slot from the nodes named and routes each command (a script by its first
key) to its node. What must reach one node in order (a commit's MULTI/EXEC and the WAIT
after it) goes through that node's own client (``node_client``).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

from .url import RedisURL


def connect(where: RedisURL, **options: Any) -> Any:
    """A client for ``where`` (a ``redis.Redis``, or a ``RedisCluster``); ``options``
    (timeouts, retry, password) apply to every connection to a data node, the URL's own
    query keys taking precedence as ``Redis.from_url`` does."""
    if not where.sentinels and not where.cluster_nodes:
        return redis.Redis.from_url(where.client_url, **options)
    options.update(parse_url(where.client_url))
    for placeholder in ("host", "port"):
        options.pop(placeholder, None)
    if where.cluster_nodes:
        options.pop("db", None)  # a cluster has only database 0
        return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in where.cluster_nodes],
                            **options)
    # The Sentinels get the timeouts (an unreachable Sentinel must not hang a commit)
    # and their own password, never the data nodes'.
    asking: dict[str, Any] = {k: v for k, v in options.items()
                              if k.startswith("socket_")}
    if where.sentinel_password is not None:
        asking["password"] = where.sentinel_password
    sentinel = Sentinel(list(where.sentinels), sentinel_kwargs=asking)
    return sentinel.master_for(where.service, **options)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


def node_client(client: Any, key: str) -> redis.Redis:
    """The client of the one Redis that holds ``key``: ``client`` itself unless it is a
    RedisCluster, then the client of the node serving ``key``'s slot."""
    if not isinstance(client, RedisCluster):
        return client
    return client.get_redis_connection(client.get_node_from_key(key))


def relearn(client: Any) -> None:
    """After a MOVED or ASK (slots moved, a node failed over): read the slot map again."""
    if isinstance(client, RedisCluster):
        client.nodes_manager.initialize()


def data_nodes(client: Any) -> list[redis.Redis]:
    """A client of each Redis that holds data: ``client`` itself, or each cluster
    primary's (for INFO and CONFIG, which are per node)."""
    if not isinstance(client, RedisCluster):
        return [client]
    return [client.get_redis_connection(n) for n in client.get_primaries()]


def primary_address(client: redis.Redis) -> str | None:
    """``host:port`` of the Redis a Sentinel-managed ``client`` last connected to as the
    primary (for messages: which Redis refused); None for a plain client."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool) or pool.master_address is None:
        return None
    host, port = pool.master_address
    return f"{host}:{port}"


def close(client: redis.Redis) -> None:
    """Close ``client`` and, under Sentinel, the connections to the Sentinels too."""
    pool = getattr(client, "connection_pool", None)
    client.close()
    if isinstance(pool, SentinelConnectionPool):
        pool.sentinel_manager.close()
