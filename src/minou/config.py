"""Settings: one frozen value, the only module that reads config files or env.

A config file is TOML (``.toml``) or JSON (anything else). Unknown keys and
bad values are refused with a message naming the key, e.g.
``channels."orders/v1".prefetch: expected an integer >= 1, got "x"``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from . import limits
from .auth.rules import Rules
from .core.log import ChannelOptions
from .errors import BadRequest, ConfigError, InvalidChannel
from .names import (
    INBOX_ENDPOINT,
    KV_ENDPOINT,
    KV_PREFIX,
    check_label,
    kv_channel,
    parse_pattern,
)
from .schemas import (
    Compatibility,
    CompiledSchema,
    compatibility_report,
    compile_schema,
    load_schema,
)

AUTH_MODES = ("keys", "token", "off")
DEFAULT_OPTIONS = ChannelOptions()
# Inboxes (request/reply) unless channels."_inbox/v1" says otherwise: a reply nobody
# reads (its requester timed out and left) expires, without a dead letter, and a
# requester that never reads cannot make its inbox grow without bound.
INBOX_OPTIONS = ChannelOptions(prefetch=limits.INBOX_PREFETCH, ttl=limits.INBOX_TTL_S,
                               max_items=limits.INBOX_MAX_ITEMS, overflow="drop_oldest",
                               dead_letter=False, expire_idle=limits.INBOX_EXPIRE_IDLE_S)
# Key-value buckets unless kv."<bucket>" (or kv."*") says otherwise: one revision per
# key, a bounded number of revisions (the core indexes each one), no dead letters.
KV_OPTIONS = ChannelOptions(max_items=limits.KV_MAX_REVISIONS, dead_letter=False,
                            history=limits.KV_HISTORY)
_KV_KEYS = ("history", "ttl", "max_items", "schema", "durability", "sync_interval")
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
# Integers without a maximum of their own: what SQLite, msgpack (a WELCOME carries
# max_message_size) and Redis hold; a larger one loaded, then failed every HELLO.
MAX_SETTING_INT = 2**63 - 1
# A delivery (the message, its headers, channel and ids) must fit one frame of
# MAX_FRAME_SIZE, the most a client reads: 64 KiB is left for all but the payload.
MAX_MESSAGE_SIZE_SETTING = limits.MAX_FRAME_SIZE - (64 << 10)
# Seconds without a maximum of their own: ten years is surely a mistake beyond (as a
# message's ttl and delay); NaN and infinity are refused with them.
MAX_SETTING_SECONDS = limits.MAX_DELAY_S
_MAX_SECONDS_TEXT = f"{MAX_SETTING_SECONDS:.0f} (ten years)"
# Kernel pseudo-filesystems: a data directory there fails at start, or writes to devices.
# /dev/shm is an ordinary tmpfs, kept for data that may vanish with the machine.
_PSEUDO_FS = ("/proc", "/sys", "/dev")
_DEV_SHM = "/dev/shm"

_CHANNEL_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "prefetch": (int, f"an integer >= 1 and <= {limits.MAX_PREFETCH}"),
    "ttl": ((int, float), f"a number of seconds > 0 and <= {_MAX_SECONDS_TEXT}"),
    "max_items": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "overflow": (str, "'refuse' or 'drop_oldest'"),
    "requeue_limit": (int, f"an integer >= 0 and <= {MAX_SETTING_INT}"),
    "dead_letter": (bool, "true or false"),
    "retention": ((int, float), f"a number of seconds > 0 and <= {_MAX_SECONDS_TEXT}"),
    "schema": ((dict, str), "a JSON Schema object or a file path"),
    "durability": (str, "'fsync' or 'interval'"),
    "expire_idle": ((int, float), f"a number of seconds > 0 and <= {_MAX_SECONDS_TEXT}"),
    "history": (int, f"an integer 1..{limits.MAX_KV_HISTORY}"),
    "sync_interval": ((int, float), "milliseconds, > 0 and <= "
                      f"{int(limits.MAX_SYNC_INTERVAL_S * 1000)}"),
}
# What each number may be, as (lowest, highest, whether the lowest itself is refused);
# the comparisons also refuse NaN.
_Range = tuple[float, float, bool]
_CHANNEL_RANGES: dict[str, _Range] = {
    "prefetch": (1, limits.MAX_PREFETCH, False),
    "ttl": (0, MAX_SETTING_SECONDS, True),
    "max_items": (1, MAX_SETTING_INT, False),
    "requeue_limit": (0, MAX_SETTING_INT, False),
    "retention": (0, MAX_SETTING_SECONDS, True),
    "expire_idle": (0, MAX_SETTING_SECONDS, True),
    "history": (1, limits.MAX_KV_HISTORY, False),
    "sync_interval": (0, limits.MAX_SYNC_INTERVAL_S * 1000, True),
}


def _in_range(value: float, where: _Range) -> bool:
    low, high, open_low = where
    return (low < value <= high) if open_low else (low <= value <= high)


@dataclass(frozen=True)
class FederationLink:
    """One ``[[federation]]`` link (docs/federation.md): this broker is a client of
    ``remote`` with its own identity; ``push`` patterns go there, ``pull`` ones come
    here, into the same channel names under ``prefix``."""

    name: str
    remote: str
    push: tuple[str, ...] = ()
    pull: tuple[str, ...] = ()
    prefix: str = ""  # put before the endpoint of every channel on the destination
    client_id: str | None = None  # the link's identity on the remote
    key: str | None = None
    broker_token: str | None = None
    tls_fingerprint: str | None = None
    cafile: str | None = None


@dataclass(frozen=True)
class Settings:
    broker_id: str = "minou"
    host: str = limits.DEFAULT_HOST
    port: int = limits.DEFAULT_PORT
    http_port: int | None = limits.DEFAULT_HTTP_PORT
    resp_port: int | None = None  # the Redis protocol (docs/redis-protocol.md): off unless set
    data_dir: str = limits.DEFAULT_DATA_DIR
    max_message_size: int = limits.MAX_MESSAGE_SIZE
    max_connections: int = limits.DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = limits.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    default_lease: float = limits.DEFAULT_LEASE_S
    dedup_window: float = limits.DEFAULT_DEDUP_WINDOW_S
    max_dedup_keys: int = limits.MAX_DEDUP_KEYS  # past it the oldest keys expire early
    max_channels: int = limits.DEFAULT_MAX_CHANNELS  # past it a new channel is refused
    max_clients: int = limits.DEFAULT_MAX_CLIENTS  # past it a new client id is refused
    # long polls (KV watches, XREAD BLOCK, federation pulls) one client may have waiting
    max_long_polls_per_client: int = limits.MAX_LONG_POLLS_PER_CLIENT
    # OFFSETS with "at" (each matches and looks up many channels) one client may have
    # being answered at once, over all its connections
    max_offsets_at_per_client: int = limits.MAX_OFFSETS_AT_PER_CLIENT
    # queues (and reader groups) whose own series a scrape lists at most (by name)
    metrics_max_queues: int = limits.DEFAULT_METRICS_MAX_QUEUES
    publish_pause_bytes: int = limits.PUBLISH_PAUSE_BYTES
    slow_consumer_bytes: int = limits.CONSUMER_HARD_LIMIT
    slow_consumer_seconds: float = limits.CONSUMER_STALL_S
    delivery_buffer_bytes: int = limits.DELIVERY_BUFFER_BUDGET
    in_flight_bytes: int = limits.IN_FLIGHT_BYTES  # unsettled deliveries' messages (all)
    hello_timeout: float = limits.HELLO_TIMEOUT_S
    http_header_timeout: float = limits.HTTP_HEADER_TIMEOUT_S
    http_idle_timeout: float = limits.HTTP_IDLE_TIMEOUT_S
    # WebSocket routes (/v1/ws, /v1/stream): a ping every this many seconds; no pong
    # within as long again closes the socket (native clients negotiate their own)
    websocket_heartbeat: float = limits.DEFAULT_HEARTBEAT_S
    strict_schemas: bool = False
    channels: dict[str, ChannelOptions] = field(default_factory=dict)
    kv: dict[str, ChannelOptions] = field(default_factory=dict)  # bucket (or "*") -> options
    federation: tuple[FederationLink, ...] = ()
    # [auth]: "keys" (every client proves itself with its key pair), "token" (the shared
    # broker token alone; its holders are admins) or "off" (development, loopback only)
    auth_mode: str = "keys"
    broker_token: str | None = None
    admins: frozenset[str] = frozenset({"admin"})
    rules: Rules = field(default_factory=lambda: Rules.parse(None))
    # [tls]: files, or a self-signed pair in the data dir; None = self-signed unless the
    # broker listens on loopback only
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_self_signed: bool | None = None
    # [storage] url: the backend (storage/factory.py); "" is SQLite in the data dir
    storage: str = ""
    # [storage]: max_size caps the database (past it SQLite fails exactly as on a full
    # disk: publishes are refused with STORAGE_FULL); reserve is held back for acks
    storage_max_size: int | None = None
    storage_reserve: int = limits.STORAGE_RESERVE_BYTES
    # the WAL size past which it is copied into the database (and what it shrinks to)
    storage_wal_checkpoint: int = limits.CHECKPOINT_WAL_BYTES
    # Several brokers on one Redis: the primary's lease (a standby takes over this long
    # after the primary stops renewing it), and replicas a commit waits for (WAIT; None:
    # the URL's ?replicas=, else 0)
    storage_owner_lease: float = limits.OWNER_LEASE_S
    storage_replicas: int | None = None
    # What a standby does with the clients that reach it: "relay" them to the primary
    # (every broker serves every client) or "redirect" them there.
    storage_standby: str = "relay"
    # How brokers on one Redis share the queues: "primary" (one serves them all, the
    # others relay to it) or "spread" (each owns its share by rendezvous hashing, a
    # front forwards to the owner: docs/cluster.md, "Queues spread over the brokers").
    storage_placement: str = "primary"
    schema_report: tuple[Compatibility, ...] = ()
    config_path: str | None = None

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS

    @property
    def tls_enabled(self) -> bool:
        if self.tls_cert:
            return True
        return self.tls_self_signed if self.tls_self_signed is not None else not self.loopback

    def schemas(self) -> dict[str, CompiledSchema]:
        return {k: o.schema for k, o in self.channels.items() if o.schema is not None}

    @property
    def any_interval(self) -> bool:
        """Whether some channel's (or bucket's) durability is "interval"."""
        return any(o.durability == "interval"
                   for o in (*self.channels.values(), *self.kv.values()))

    def channel_options(self, key: str) -> ChannelOptions:
        """Options for ``endpoint/version`` (falling back to ``endpoint/*``, then defaults),
        or for a bucket's channel (``_kv/v1/<bucket>``: ``kv."<bucket>"``, ``kv."*"``)."""
        if key.startswith(KV_ENDPOINT + "/"):
            bucket = key[len(KV_PREFIX):] if key.startswith(KV_PREFIX) else "*"
            return self.kv.get(bucket) or self.kv.get("*") or KV_OPTIONS
        found = self.channels.get(key)
        if found is None:
            endpoint = key.split("/", 1)[0]
            found = self.channels.get(endpoint + "/*") or (
                INBOX_OPTIONS if endpoint == INBOX_ENDPOINT else DEFAULT_OPTIONS)
        return found


_SECONDS = ((int, float), f"a number of seconds > 0 and <= {_MAX_SECONDS_TEXT}")
_BYTES = (int, f"a number of bytes >= 1 and <= {MAX_SETTING_INT}")
_TOP_KEYS = {
    "broker_id": (str, "a string"),
    "host": (str, "a host name or address"),
    "port": (int, "a port number 0..65535"),
    "http_port": (int, "a port number 0..65535"),
    "resp_port": (int, "a port number 0..65535"),
    "data_dir": (str, "a directory path"),
    "max_message_size": (int, f"a number of bytes >= 1 and <= {MAX_MESSAGE_SIZE_SETTING} "
                         f"(a message fits one {limits.MAX_FRAME_SIZE >> 20} MiB frame)"),
    "max_connections": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "max_connections_per_client": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "default_lease": ((int, float), f"a number of seconds > 0 and <= {limits.MAX_LEASE_S:g}"),
    "dedup_window": ((int, float), f"a number of seconds >= 0 and <= {_MAX_SECONDS_TEXT}"),
    "max_dedup_keys": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "max_channels": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "max_clients": (int, f"an integer >= 1 and <= {MAX_SETTING_INT}"),
    "max_long_polls_per_client": (int, f"an integer >= 1 and <= {limits.MAX_KV_WAITERS}"),
    "max_offsets_at_per_client": (int, f"an integer >= 1 and <= "
                                  f"{limits.MAX_OFFSETS_AT_PER_CLIENT_SETTING}"),
    "metrics_max_queues": (int, f"an integer >= 0 and <= {MAX_SETTING_INT}"),
    "publish_pause_bytes": _BYTES,
    "slow_consumer_bytes": _BYTES,
    "slow_consumer_seconds": _SECONDS,
    "delivery_buffer_bytes": _BYTES,
    "in_flight_bytes": _BYTES,
    "hello_timeout": _SECONDS,
    "http_header_timeout": _SECONDS,
    "http_idle_timeout": _SECONDS,
    "websocket_heartbeat": ((int, float), f"a number of seconds > 0 and <= "
                            f"{limits.MAX_HEARTBEAT_S:g}"),
    "strict_schemas": (bool, "true or false"),
}
_TOP_RANGES: dict[str, _Range] = {
    "port": (0, 65535, False),
    "http_port": (0, 65535, False),
    "resp_port": (0, 65535, False),
    "max_message_size": (1, MAX_MESSAGE_SIZE_SETTING, False),
    "max_connections": (1, MAX_SETTING_INT, False),
    "max_connections_per_client": (1, MAX_SETTING_INT, False),
    "default_lease": (0, limits.MAX_LEASE_S, True),
    "dedup_window": (0, MAX_SETTING_SECONDS, False),
    "max_dedup_keys": (1, MAX_SETTING_INT, False),
    "max_channels": (1, MAX_SETTING_INT, False),
    "max_clients": (1, MAX_SETTING_INT, False),
    "max_long_polls_per_client": (1, limits.MAX_KV_WAITERS, False),
    "max_offsets_at_per_client": (1, limits.MAX_OFFSETS_AT_PER_CLIENT_SETTING, False),
    "metrics_max_queues": (0, MAX_SETTING_INT, False),
    "publish_pause_bytes": (1, MAX_SETTING_INT, False),
    "slow_consumer_bytes": (1, MAX_SETTING_INT, False),
    "slow_consumer_seconds": (0, MAX_SETTING_SECONDS, True),
    "delivery_buffer_bytes": (1, MAX_SETTING_INT, False),
    "in_flight_bytes": (1, MAX_SETTING_INT, False),
    "hello_timeout": (0, MAX_SETTING_SECONDS, True),
    "http_header_timeout": (0, MAX_SETTING_SECONDS, True),
    "http_idle_timeout": (0, MAX_SETTING_SECONDS, True),
    "websocket_heartbeat": (0, limits.MAX_HEARTBEAT_S, True),
}
_TABLES = ("auth", "channels", "federation", "kv", "rules", "storage", "tls")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def _expect(key: str, value: Any, types: Any, what: str) -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{key}: expected {what}, got {json.dumps(value)}")
    if not isinstance(value, types):
        raise ConfigError(f"{key}: expected {what}, got {json.dumps(value, default=str)}")


def _channel_options(name: str, raw: Any, base_dir: Path, where: str = "") -> ChannelOptions:
    where = where or f'channels."{name}"'
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table of channel options")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _CHANNEL_KEYS:
            known = ", ".join(sorted(_CHANNEL_KEYS))
            raise ConfigError(f"{where}.{key}: unknown option (known: {known})")
        types, what = _CHANNEL_KEYS[key]
        _expect(f"{where}.{key}", value, types, what)
        if key == "schema":
            kwargs[key] = compile_schema(load_schema(value, key=name, base_dir=base_dir),
                                         key=name)
            continue
        if key in _CHANNEL_RANGES and not _in_range(value, _CHANNEL_RANGES[key]):
            raise ConfigError(f"{where}.{key}: expected {what}, got {value}")
        if key == "overflow" and value not in ("refuse", "drop_oldest"):
            raise ConfigError(f"{where}.{key}: expected {what}, got {json.dumps(value)}")
        if key == "durability" and value not in ("fsync", "interval"):
            raise ConfigError(f"{where}.{key}: expected {what}, got {json.dumps(value)}")
        if key == "sync_interval":
            value = value / 1000  # seconds inside
        kwargs[key] = value
    return ChannelOptions(**kwargs)


def _kv_options(raw: Any, base_dir: Path) -> dict[str, ChannelOptions]:
    """The ``[kv."<bucket>"]`` tables: each bucket's options over the KV defaults."""
    if not isinstance(raw, dict):
        raise ConfigError('kv: expected a table keyed by bucket name (or "*"), e.g. '
                          '[kv."config"] history = 5')
    given: dict[str, dict[str, Any]] = {}
    for bucket, opts in raw.items():
        if bucket != "*":
            try:
                kv_channel(bucket)
            except InvalidChannel as exc:
                raise ConfigError(f'kv."{bucket}": {exc.message}') from None
        where = f'kv."{bucket}"'
        _check_table(where, opts, _KV_KEYS, "bucket options")
        parsed = _channel_options(f"kv/{bucket}", opts, base_dir, where)
        given[bucket] = {k: getattr(parsed, k) for k in opts}
    # A bucket's table is laid over kv."*", which is laid over the defaults.
    every = replace(KV_OPTIONS, **given.get("*", {}))
    return {bucket: replace(every, **opts) for bucket, opts in given.items()}


def _check_table(where: str, value: Any, known: tuple[str, ...], what: str) -> None:
    """``value`` is a table whose keys are all ``known``; else say which one is not."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table of {what}")
    for key in value:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown setting (known: "
                              f"{', '.join(sorted(known))})")


_LINK_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,32}")
_LINK_KEYS = ("name", "remote", "push", "pull", "prefix", "client_id", "key",
              "broker_token", "broker_token_file", "tls_fingerprint", "cafile")


def _federation(raw: Any, base_dir: Path) -> tuple[FederationLink, ...]:
    """The ``[[federation]]`` tables: each link checked whole, names unique."""
    from .names import parse_pattern

    if not isinstance(raw, list):
        raise ConfigError("federation: expected a list of tables ([[federation]])")
    links: list[FederationLink] = []
    for i, table in enumerate(raw):
        where = f"federation[{i}]"
        _check_table(where, table, _LINK_KEYS, "link settings")
        name = table.get("name")
        if not isinstance(name, str) or not _LINK_NAME.fullmatch(name):
            raise ConfigError(f"{where}.name: expected 1 to 64 letters, digits, '-' or '_', "
                              f"got {json.dumps(name, default=str)}")
        where = f'federation "{name}"'
        if any(link.name == name for link in links):
            raise ConfigError(f"{where}: a second link of that name")
        remote = table.get("remote")
        _expect(f"{where}.remote", remote, str, "a broker URL (minou://, minous://, ws://, "
                "wss://)")
        scheme = remote.split("://", 1)[0] if "://" in remote else ""
        if scheme not in ("minou", "minous", "ws", "wss") or not remote.split("://", 1)[1]:
            raise ConfigError(f"{where}.remote: expected minou://host:port, minous://host:port "
                              f"(TLS), ws://host:port/v1/ws or wss://..., got {remote!r}")
        patterns: dict[str, tuple[str, ...]] = {}
        for side in ("push", "pull"):
            value = table.get(side, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where}.{side}: expected a list of channel patterns")
            for pattern in value:
                try:
                    parse_pattern(pattern)
                except InvalidChannel as exc:
                    raise ConfigError(f"{where}.{side}: {exc.message}") from None
            patterns[side] = tuple(value)
        if not patterns["push"] and not patterns["pull"]:
            raise ConfigError(f"{where}: give push and/or pull patterns (what goes there, "
                              "what comes here)")
        prefix = table.get("prefix", "")
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ConfigError(f"{where}.prefix: up to 32 letters, digits, '-' or '_', put "
                              "before each channel's endpoint on the destination (a channel "
                              "is endpoint/version/id: \"eu-\" makes orders/v1/1 "
                              "eu-orders/v1/1)")
        key = table.get("key")
        if key is not None:
            _expect(f"{where}.key", key, str, "a private key file path")
            key = str(base_dir / key)
            if not Path(key).is_file():
                raise ConfigError(f"{where}.key: no file {key}")
        client_id = table.get("client_id")
        if client_id is not None:
            _expect(f"{where}.client_id", client_id, str, "a client id")
        elif key is not None:
            client_id = Path(key).stem
        for opt in ("tls_fingerprint", "cafile"):
            if table.get(opt) is not None:
                _expect(f"{where}.{opt}", table[opt], str, "a string")
        cafile = table.get("cafile")
        token_table = {k: v for k, v in table.items() if k.startswith("broker_token")}
        token = _secret(token_table, "broker_token", base_dir, where) if token_table else None
        links.append(FederationLink(
            name=name, remote=remote, push=patterns["push"], pull=patterns["pull"],
            prefix=prefix, client_id=client_id or f"federation-{name}", key=key,
            broker_token=token, tls_fingerprint=table.get("tls_fingerprint"),
            cafile=str(base_dir / cafile) if cafile else None))
    return tuple(links)


def _check_channel_key(name: str) -> None:
    parts = name.split("/")
    if len(parts) != 2 or not parts[0] or not (parts[1] == "*" or parts[1].startswith("v")):
        raise ConfigError(
            f'channels."{name}": channel options are keyed by "endpoint/version" '
            f'(e.g. "orders/v1") or "endpoint/*"'
        )
    # The endpoint and version as a channel must spell them: options under a key no
    # channel can have ("../v1", "orders /v1", "orders/v01") applied to nothing, silently
    # (a schema among them checked nothing).
    try:
        parse_pattern(name if parts[1] == "*" else f"{name}/*")
    except InvalidChannel as exc:
        reason = exc.message.split(": ", 1)[-1].split(" (", 1)[0]
        raise ConfigError(f'channels."{name}": {reason}') from None


def _secret(table: dict[str, Any], key: str, base_dir: Path, section: str = "auth"
            ) -> str | None:
    """A secret given inline or, better, in a file (``<key>_file``) kept out of the config."""
    inline, path = table.get(key), table.get(f"{key}_file")
    if inline is not None and path is not None:
        raise ConfigError(f"{section}.{key}: give {key} or {key}_file, not both")
    if path is not None:
        _expect(f"{section}.{key}_file", path, str, "a file path")
        try:
            inline = (base_dir / path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{section}.{key}_file: cannot read {path}: {exc.strerror}") from exc
    if inline is None:
        return None
    where = f"{section}.{key}_file" if path is not None else f"{section}.{key}"
    _expect(where, inline, str, f"a string of at least {limits.MIN_SECRET_CHARS} characters")
    if len(inline) < limits.MIN_SECRET_CHARS:
        raise ConfigError(f"{where}: expected a string of at least {limits.MIN_SECRET_CHARS} "
                          f"characters (got {len(inline)})")
    return str(inline)


def _auth(raw: Any, base_dir: Path) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("auth: expected a table (mode, broker_token, admins)")
    known = {"mode", "broker_token", "broker_token_file", "admins"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"auth.{key}: unknown setting (known: {', '.join(sorted(known))})")
    out: dict[str, Any] = {}
    if "mode" in raw:
        mode = raw["mode"]
        if mode not in AUTH_MODES:
            raise ConfigError(f"auth.mode: expected one of {', '.join(AUTH_MODES)}, got "
                              f"{json.dumps(mode)}")
        out["auth_mode"] = mode
    out["broker_token"] = _secret(raw, "broker_token", base_dir)
    if "admins" in raw:
        admins = raw["admins"]
        if not isinstance(admins, list) or not all(isinstance(a, str) and a for a in admins):
            raise ConfigError("auth.admins: expected a list of client ids")
        out["admins"] = frozenset(admins)
    return out


def _tls(raw: Any, base_dir: Path) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("tls: expected a table (cert, key, self_signed)")
    known = {"cert", "key", "self_signed"}
    for key in raw:
        if key not in known:
            raise ConfigError(f"tls.{key}: unknown setting (known: {', '.join(sorted(known))})")
    out: dict[str, Any] = {}
    if ("cert" in raw) != ("key" in raw):
        raise ConfigError("tls: give both cert and key (PEM files), or neither")
    for key in ("cert", "key"):
        if key in raw:
            _expect(f"tls.{key}", raw[key], str, "a PEM file path")
            out[f"tls_{key}"] = str(base_dir / raw[key])
    if "self_signed" in raw:
        _expect("tls.self_signed", raw["self_signed"], bool, "true or false")
        if raw["self_signed"] and "cert" in raw:
            raise ConfigError("tls.self_signed: cannot be true when cert and key are given")
        out["tls_self_signed"] = raw["self_signed"]
    return out


def parse_size(key: str, value: Any) -> int:
    """Bytes from an integer or a string such as "40MB" (10^6) or "512MiB" (2^20)."""
    what = 'a size: bytes, or a string such as "40MB" or "2GiB"'
    at_most = f"expected a size of at most {MAX_SETTING_INT} bytes"
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{key}: expected {what}, got {value}")
        if value > MAX_SETTING_INT:
            raise ConfigError(f"{key}: {at_most}, got {value}")
        return value
    m = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise ConfigError(f"{key}: expected {what}, got {json.dumps(value, default=str)}")
    size = float(m.group(1)) * _UNITS[(m.group(2) or "B").lower()]
    if not size <= MAX_SETTING_INT:  # also a float of 400 digits, which is infinity
        raise ConfigError(f"{key}: {at_most}, got {json.dumps(value)}")
    return int(size)


def _storage(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError("storage: expected a table (url, max_size, reserve, "
                          "wal_checkpoint, owner_lease, replicas, standby, placement)")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "url":
            if not isinstance(value, str):
                raise ConfigError(f"storage.url: expected a URL string, got {value!r}")
            from .storage.factory import check_url

            out["storage"] = check_url(value)
            continue
        if key == "owner_lease":
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not limits.MIN_OWNER_LEASE_S <= value <= limits.MAX_OWNER_LEASE_S):
                raise ConfigError(f"storage.owner_lease: expected seconds, "
                                  f"{limits.MIN_OWNER_LEASE_S:g}..{limits.MAX_OWNER_LEASE_S:g}, "
                                  f"got {value!r}")
            out["storage_owner_lease"] = float(value)
            continue
        if key == "standby":
            if value not in ("relay", "redirect"):
                raise ConfigError(f"storage.standby: expected \"relay\" (a standby passes "
                                  f"its clients' connections on to the primary) or "
                                  f"\"redirect\" (it sends them there), got {value!r}")
            out["storage_standby"] = value
            continue
        if key == "placement":
            if value not in ("primary", "spread"):
                raise ConfigError(f"storage.placement: expected \"primary\" (one broker "
                                  f"serves every queue) or \"spread\" (each broker owns "
                                  f"its share of the queues), got {value!r}")
            out["storage_placement"] = value
            continue
        if key == "replicas":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 16:
                raise ConfigError(f"storage.replicas: expected 0..16 (Redis replicas a "
                                  f"commit waits for), got {value!r}")
            out["storage_replicas"] = value
            continue
        if key not in ("max_size", "reserve", "wal_checkpoint"):
            raise ConfigError(f"storage.{key}: unknown setting (known: url, max_size, "
                              "reserve, wal_checkpoint, owner_lease, replicas, standby, placement)")
        size = parse_size(f"storage.{key}", value)
        if key == "wal_checkpoint" and size < limits.MIN_CHECKPOINT_WAL_BYTES:
            raise ConfigError(f"storage.wal_checkpoint: expected at least "
                              f"{limits.MIN_CHECKPOINT_WAL_BYTES >> 20} MiB, got {value!r}")
        if key == "max_size" and size < limits.MIN_STORAGE_MAX_SIZE:
            raise ConfigError(f"storage.max_size: expected at least "
                              f"{limits.MIN_STORAGE_MAX_SIZE >> 20} MiB, got {value!r}")
        out[f"storage_{key}"] = size
    return out


def _check_data_dir(data_dir: str, key: str, example: str = "./data") -> None:
    """The broker writes its database, admin key and a reserve file into ``data_dir``:
    refuse the filesystem root and kernel pseudo-filesystems (``key`` names the source)."""
    if not data_dir.strip():  # Path("") is the working directory: whatever else is there
        raise ConfigError(f"{key}: the data directory is empty; give a directory of its "
                          f"own, e.g. {example}")
    try:
        real = Path(data_dir).resolve()
    except (OSError, RuntimeError):  # a symlink loop: the lock names it at start
        return
    given = json.dumps(data_dir)
    shown = given if str(real) == data_dir else f"{given} (resolves to {real})"
    if real.parent == real:
        raise ConfigError(f"{key}: {shown} is the filesystem root; give a directory of its "
                          f"own, e.g. {example}")
    if real.exists() and not real.is_dir():
        raise ConfigError(f"{key}: {shown} is a file, not a directory; give a directory "
                          f"of its own, e.g. {example}")
    for top in _PSEUDO_FS:
        if real.is_relative_to(top) and not real.is_relative_to(_DEV_SHM):
            raise ConfigError(f"{key}: {shown} is inside {top}, a kernel pseudo-filesystem; "
                              f"give a directory of its own, e.g. {example}")


def _check_consistency(settings: Settings, data_dir_key: str = "data_dir") -> None:
    _check_data_dir(settings.data_dir, data_dir_key)
    url = urlsplit(settings.storage)
    if url.scheme == "sqlite":
        # The database's own directory takes the WAL and the reserve file just the same.
        _check_data_dir(str(Path(url.path).parent), "storage.url's directory",
                        "sqlite:///var/lib/minou/minou.db")
    if settings.auth_mode == "off" and not settings.loopback:
        raise ConfigError(f"auth.mode: 'off' (development mode) listens on loopback only; "
                          f"host is {settings.host!r}")
    if settings.auth_mode == "token" and not settings.broker_token:
        raise ConfigError("auth.mode: 'token' needs auth.broker_token (or broker_token_file)")
    if settings.storage_placement == "spread" and not settings.storage.startswith(
            ("redis://", "rediss://", "redis+sentinel://", "redis+cluster://")):
        raise ConfigError("storage.placement: \"spread\" shares the queues between brokers "
                          "on Redis: it needs storage.url redis://, rediss://, "
                          "redis+sentinel:// or redis+cluster://, not "
                          f"{settings.storage or 'SQLite'!r}")


def parse_settings(raw: dict[str, Any], *, base_dir: Path, path: str | None = None,
                   check: bool = True) -> Settings:
    """Settings from a parsed file; ``check=False`` leaves the cross-key checks to the
    caller (load_settings runs them after the command-line overrides)."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a table at the top level")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "auth":
            values.update(_auth(value, base_dir))
            continue
        if key == "tls":
            values.update(_tls(value, base_dir))
            continue
        if key == "storage":
            values.update(_storage(value))
            continue
        if key == "rules":
            values["rules"] = Rules.parse(value)
            continue
        if key == "kv":
            values["kv"] = _kv_options(value, base_dir)
            continue
        if key == "federation":
            values["federation"] = _federation(value, base_dir)
            continue
        if key == "channels":
            if not isinstance(value, dict):
                raise ConfigError("channels: expected a table keyed by endpoint/version")
            channels = {}
            for name, opts in value.items():
                _check_channel_key(name)
                if isinstance(opts, dict) and "history" in opts:
                    raise ConfigError(f'channels."{name}".history: a bucket option: set it '
                                      'in [kv."<bucket>"]')
                channels[name] = _channel_options(name, opts, base_dir)
            values["channels"] = channels
            continue
        if key not in _TOP_KEYS:
            known = ", ".join(sorted([*_TOP_KEYS, *_TABLES]))
            raise ConfigError(f"{key}: unknown setting (known: {known})")
        types, what = _TOP_KEYS[key]
        _expect(key, value, types, what)
        if key in _TOP_RANGES and not _in_range(value, _TOP_RANGES[key]):
            raise ConfigError(f"{key}: expected {what}, got {value}")
        if key == "broker_id":
            # Every token names it (aud) and every listing, log line and WELCOME shows it:
            # an empty one, or one with NUL or a line break, was taken as it was.
            try:
                check_label("broker_id", value, limits.MAX_CLIENT_ID, space=True)
            except BadRequest as exc:
                raise ConfigError(exc.message) from None
        values[key] = value
    if "data_dir" in values and not values["data_dir"].strip():
        _check_data_dir("", "data_dir")  # else the config file's own directory
    if "data_dir" in values and not os.path.isabs(values["data_dir"]):
        values["data_dir"] = str(base_dir / values["data_dir"])
    channels = values.get("channels", {})
    values["schema_report"] = tuple(compatibility_report(
        {k: o.schema.source for k, o in channels.items() if o.schema is not None}))
    settings = Settings(**values, config_path=path)
    if check:
        _check_consistency(settings)
    return settings


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as read, every key kept: json.loads would keep only a repeated key's
    last value, silently (TOML refuses a repeated key itself)."""


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _unique_keys(value: Any, path: Path, where: str) -> Any:
    """``value`` with its objects as dicts, refusing a key given twice in one of them."""
    if not isinstance(value, list):
        return value
    if not isinstance(value, _Pairs):
        return [_unique_keys(v, path, f"{where}[{i}]") for i, v in enumerate(value)]
    out: dict[str, Any] = {}
    for key, item in value:
        name = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
        inner = f"{where}.{name}" if where else name
        if key in out:
            raise ConfigError(f"{path}: {inner}: given twice in one object (JSON would keep "
                              "the last value silently); give each key once")
        out[key] = _unique_keys(item, path, inner)
    return out


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (TOML or JSON) and apply command-line ``overrides`` (None = unset)."""
    settings = Settings()
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
        except UnicodeDecodeError as exc:  # it was a traceback, at start and at reload
            raise ConfigError(f"{p}: not UTF-8 (TOML and JSON files are): byte "
                              f"0x{exc.object[exc.start]:02x} at offset {exc.start}") from None
        try:
            raw = (tomllib.loads(text) if p.suffix == ".toml"
                   else _unique_keys(json.loads(text, object_pairs_hook=_Pairs), p, ""))
            settings = parse_settings(raw, base_dir=p.resolve().parent, path=str(p),
                                      check=False)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: "
                              f"{exc}") from exc
        except RecursionError:  # the readers recurse per level: a traceback too
            raise ConfigError(f"{p}: arrays and tables nest too deep to read (a schema "
                              "file it names included)") from None
    known = {f.name for f in fields(Settings)}
    clean = {k: v for k, v in overrides.items() if v is not None and k in known}
    if "storage" in clean:
        from .storage.factory import check_url

        check_url(clean["storage"])
    for key, value in clean.items():  # ports from the command line: 70000 would wrap
        if key in _TOP_RANGES and not _in_range(value, _TOP_RANGES[key]):
            raise ConfigError(f"--{key.replace('_', '-')}: expected {_TOP_KEYS[key][1]}, "
                              f"got {value}")
    settings = replace(settings, **clean)
    _check_consistency(settings, "--data" if "data_dir" in clean else "data_dir")
    return settings
