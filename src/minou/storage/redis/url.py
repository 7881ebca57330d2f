"""Redis storage URLs: what redis-py is given, and what may be shown (never the password).

``redis://[[user]:password@]host[:port][/db][?query]``; ``rediss://`` is the same over
TLS. ``redis+sentinel://[[user]:password@]h1[:port],h2[:port]/<service>[/<db>][?query]``
names the Sentinels (port 26379 by default) that know which Redis is the primary of
``service`` now: the user and password are the primary's (as for ``redis://``), the
Sentinels are asked without one unless ``sentinel_password_file`` is given (they usually
sit on the same trusted network, and redis-py sends the data nodes' password only to
the data nodes). ``redis+cluster://[[user]:password@]h1[:port],h2[:port][?query]`` names
some nodes of a Redis Cluster (port 6379 by default; the others are found from them):
every queue's keys share a hash tag, so the cluster shards by queue; a Cluster has only
database 0.

minou's own query keys, taken out before redis-py sees the rest: ``password_file``
(the password is the file's first line, so it stays out of configs and process
lists), ``sentinel_password_file`` (the same, for the Sentinels), ``prefix`` (of every
key, default ``minou``: several installations can share one Redis) and ``replicas``
(WAIT for that many replicas before a commit counts). Other keys go to redis-py as it
reads them (``socket_timeout``, ``ssl_ca_certs``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import ConfigError
from .keys import check_prefix

SENTINEL = "redis+sentinel"
CLUSTER = "redis+cluster"
SCHEMES = ("redis", "rediss", SENTINEL, CLUSTER)
SENTINEL_PORT = 26379
REDIS_PORT = 6379
DEFAULT_PREFIX = "minou"
OWN_KEYS = ("password_file", "sentinel_password_file", "prefix", "replicas")


@dataclass(frozen=True)
class RedisURL:
    client_url: str  # for redis-py: the URL without minou's query keys
    shown: str  # the URL with the password replaced by "***"
    password: str | None  # from password_file (the URL's own is in client_url)
    prefix: str
    replicas: int
    # redis+sentinel:// only: the Sentinels, the service they watch, the database.
    # client_url is then redis://[user:password@]sentinel/<db>?<redis-py's keys>: what
    # each connection to the primary is made with, once Sentinel says where it is.
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_password: str | None = None
    # redis+cluster:// only: the nodes to learn the cluster from; client_url is then
    # redis://[user:password@]cluster/0?<redis-py's keys>, each node's connection options.
    cluster_nodes: tuple[tuple[str, int], ...] = ()


def parse(url: str) -> RedisURL:
    """Read ``url``; ConfigError naming what is wrong (the password never shown)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"storage.url: {parts.scheme!r} is not a Redis URL scheme")
    shown = _shown(url)
    sentinels: tuple[tuple[str, int], ...] = ()
    service = ""
    nodes: tuple[tuple[str, int], ...] = ()
    path = parts.path
    if parts.scheme == CLUSTER:
        nodes = _hosts(parts.netloc.rpartition("@")[2], shown, REDIS_PORT, "Redis Cluster node",
                       "redis+cluster://h1:7000,h2:7001")
        db = parts.path.strip("/")
        if db not in ("", "0"):
            raise ConfigError(f"storage.url {shown!r}: a Redis Cluster has only database 0, "
                              f"not {db!r}")
        path = "/0"
    elif parts.scheme == SENTINEL:
        sentinels = _hosts(parts.netloc.rpartition("@")[2], shown, SENTINEL_PORT, "Sentinel",
                           "redis+sentinel://h1:26379,h2:26379/mymaster/0")
        service, _, db = parts.path.removeprefix("/").partition("/")
        db = db.rstrip("/")
        if not service:
            raise ConfigError(f"storage.url {shown!r}: give the service name Sentinel "
                              "monitors, e.g. redis+sentinel://h1:26379,h2:26379/mymaster/0")
        path = "/" + db
    else:
        if not parts.hostname:
            raise ConfigError(f"storage.url {shown!r}: give the Redis host, "
                              "e.g. redis://127.0.0.1:6379/0")
        try:
            parts.port  # noqa: B018 - a bad port raises here
        except ValueError as exc:
            raise ConfigError(f"storage.url {shown!r}: {exc}") from exc
        db = parts.path.strip("/")
    if db and not db.isdigit():
        where = "after the service name" if sentinels else "the path"
        raise ConfigError(f"storage.url {shown!r}: {where} is the database number, "
                          f"not {db!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_KEYS}
    rest = [(k, v) for k, v in query if k not in OWN_KEYS]
    password = _read_secret(own, "password_file", shown)
    sentinel_password = _read_secret(own, "sentinel_password_file", shown)
    if sentinel_password is not None and not sentinels:
        raise ConfigError(f"storage.url {shown!r}: sentinel_password_file is for "
                          "redis+sentinel:// URLs")
    try:
        replicas = int(own.get("replicas", "0"))
        if replicas < 0:
            raise ValueError("below 0")
    except ValueError as exc:
        raise ConfigError(f"storage.url {shown!r}: replicas must be a whole number "
                          f">= 0 ({exc})") from exc
    try:
        prefix = check_prefix(own.get("prefix", DEFAULT_PREFIX))
    except ValueError as exc:
        raise ConfigError(f"storage.url {shown!r}: {exc}") from exc
    if sentinels or nodes:
        # Where the primary is (the nodes are) comes from Sentinel (the cluster) at each
        # connect: the host here is a placeholder redis-py's URL reader needs; only the
        # rest of this URL is used.
        auth = parts.netloc.rpartition("@")[0]
        host = "sentinel" if sentinels else "cluster"
        client = urlunsplit(("redis", (auth + "@" if auth else "") + host, path,
                             urlencode(rest), ""))
    else:
        client = urlunsplit((parts.scheme, parts.netloc, path, urlencode(rest), ""))
    return RedisURL(client, shown, password, prefix, replicas, sentinels, service,
                    sentinel_password, nodes)


def _hosts(hosts: str, shown: str, default_port: int, what: str, example: str
           ) -> tuple[tuple[str, int], ...]:
    """``h1[:port],h2[:port],[::1]:port`` as (host, port) pairs."""
    out = []
    for item in hosts.split(","):
        host, port = item.strip(), str(default_port)
        if host.startswith("["):  # [ipv6]:port
            host, _, after = host[1:].partition("]")
            if after:
                port = after.removeprefix(":")
        elif ":" in host:
            host, _, port = host.rpartition(":")
        if not host:
            raise ConfigError(f"storage.url {shown!r}: give the {what}s as "
                              f"host:port,host:port, e.g. {example}")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"storage.url {shown!r}: {what} {item.strip()!r} has a "
                              "bad port")
        out.append((host, int(port)))
    return tuple(out)


def _read_secret(own: dict[str, str], key: str, shown: str) -> str | None:
    """The first line of the file query key ``key`` names, if given."""
    if key not in own:
        return None
    try:
        return Path(own[key]).read_text().splitlines()[0].strip()
    except (OSError, IndexError) as exc:
        raise ConfigError(f"storage.url {shown!r}: cannot read {key} "
                          f"{own[key]!r}: {exc}") from exc


def _shown(url: str) -> str:
    """``url`` with its password (if any) replaced: for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query,
                       parts.fragment))
