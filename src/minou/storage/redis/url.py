"""``redis://`` and ``rediss://`` storage URLs: what redis-py is given, and what may be
shown (never the password).

``redis://[[user]:password@]host[:port][/db][?query]``; ``rediss://`` is the same over
TLS. minou's own query keys, taken out before redis-py sees the rest:
``password_file`` (the password is the file's first line, so it stays out of
configs and process lists), ``prefix`` (of every key, default ``minou``: several
installations can share one Redis) and ``replicas`` (WAIT for that many replicas
before a commit counts). Other keys go to redis-py as it reads them
(``socket_timeout``, ``ssl_ca_certs``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ...errors import ConfigError
from .keys import check_prefix

SCHEMES = ("redis", "rediss")
DEFAULT_PREFIX = "minou"
OWN_KEYS = ("password_file", "prefix", "replicas")


@dataclass(frozen=True)
class RedisURL:
    client_url: str  # for redis-py: the URL without minou's query keys
    shown: str  # the URL with the password replaced by "***"
    password: str | None  # from password_file (the URL's own is in client_url)
    prefix: str
    replicas: int


def parse(url: str) -> RedisURL:
    """Read ``url``; ConfigError naming what is wrong (the password never shown)."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ConfigError(f"storage.url: {parts.scheme!r} is not a Redis URL scheme")
    shown = _shown(url)
    if not parts.hostname:
        raise ConfigError(f"storage.url {shown!r}: give the Redis host, "
                          "e.g. redis://127.0.0.1:6379/0")
    try:
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as exc:
        raise ConfigError(f"storage.url {shown!r}: {exc}") from exc
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"storage.url {shown!r}: the path is the database number, "
                          f"not {db!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_KEYS}
    rest = [(k, v) for k, v in query if k not in OWN_KEYS]
    password = None
    if "password_file" in own:
        try:
            password = Path(own["password_file"]).read_text().splitlines()[0].strip()
        except (OSError, IndexError) as exc:
            raise ConfigError(f"storage.url {shown!r}: cannot read password_file "
                              f"{own['password_file']!r}: {exc}") from exc
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
    client = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    return RedisURL(client, shown, password, prefix, replicas)


def _shown(url: str) -> str:
    """``url`` with its password (if any) replaced: for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query,
                       parts.fragment))
