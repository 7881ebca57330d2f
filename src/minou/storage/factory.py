"""Which storage a broker runs on: ``Settings.storage``, a URL, picks the backend.

``""`` (the default) is the embedded SQLite file in the data directory;
``sqlite:///abs/path/minou.db`` puts it elsewhere; ``memory://name`` keeps everything
in this process (tests, the simulator: reopening the same name finds what was
committed); ``redis://[:password@]host:port/db`` and ``rediss://`` (TLS) keep it in
Redis (storage/redis: several brokers can share it; ``?password_file=``, ``?prefix=``,
``?replicas=``), and ``redis+sentinel://h1:26379,h2:26379/service/db`` in the Redis
that those Sentinels name the primary of (following it when they fail it over);
``redis+cluster://h1:7000,h2:7001`` shards queues over a Redis Cluster's nodes. The
server receives what this returns and never builds a backend itself.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from ..config import Settings
from ..errors import ConfigError
from .base import Storage

REDIS_SCHEMES = ("redis", "rediss", "redis+sentinel", "redis+cluster")
SCHEMES = ("sqlite", "memory", *REDIS_SCHEMES)


def check_url(url: str) -> str:
    """``url`` if it names a backend this version has, else ConfigError saying which do."""
    if not url:
        return url
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigError(f"storage.url {url!r}: unknown backend {scheme or '(none)'!r}; "
                          "known: sqlite:///path/to/minou.db, redis://host:6379/0, "
                          "rediss://host:6380/0, "
                          "redis+sentinel://h1:26379,h2:26379/mymaster/0, "
                          "redis+cluster://h1:7000,h2:7001, memory://name (tests)")
    if scheme == "sqlite" and not urlsplit(url).path.strip("/"):
        raise ConfigError(f"storage.url {url!r}: give the database file, "
                          "e.g. sqlite:///var/lib/minou/minou.db")
    if scheme in REDIS_SCHEMES:
        from .redis.url import parse

        parse(url)  # ConfigError naming what is wrong, the password never shown
    return url


def open_storage(settings: Settings) -> Storage:
    url = check_url(settings.storage)
    scheme = urlsplit(url).scheme if url else "sqlite"
    if scheme == "memory":
        from .memory import MemoryStorage

        return MemoryStorage(urlsplit(url).netloc or "default",
                             max_size=settings.storage_max_size,
                             reserve=settings.storage_reserve)
    if scheme in REDIS_SCHEMES:
        from .redis import RedisStorage

        return RedisStorage(url, max_size=settings.storage_max_size,
                            reserve=settings.storage_reserve,
                            replicas=settings.storage_replicas)
    from .sqlite import SQLiteStorage

    # Its directory is made by the server's lock on it (a failed first start then
    # leaves nothing behind); SQLite opens the file at open().
    where = Path(urlsplit(url).path) if url else Path(settings.data_dir) / "minou.db"
    return SQLiteStorage(where.parent, filename=where.name, max_size=settings.storage_max_size,
                         wal_limit=settings.storage_wal_checkpoint,
                         reserve=settings.storage_reserve)
