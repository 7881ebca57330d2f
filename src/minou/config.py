"""Settings: one frozen value, the only module that reads config files or env.

A config file is TOML (``.toml``) or JSON (anything else). Unknown keys and
bad values are refused with a message naming the key, e.g.
``channels."orders/v1".prefetch: expected an integer >= 1, got "x"``.
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from . import limits
from .core.log import ChannelOptions
from .errors import ConfigError

_CHANNEL_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "prefetch": (int, "an integer >= 1"),
    "ttl": ((int, float), "a number of seconds > 0"),
    "max_items": (int, "an integer >= 1"),
    "overflow": (str, "'refuse' or 'drop_oldest'"),
    "requeue_limit": (int, "an integer >= 0"),
    "dead_letter": (bool, "true or false"),
    "retention": ((int, float), "a number of seconds > 0"),
    "schema": ((dict, str), "a JSON Schema object or a file path"),
}


@dataclass(frozen=True)
class Settings:
    broker_id: str = "minou"
    host: str = limits.DEFAULT_HOST
    port: int = limits.DEFAULT_PORT
    http_port: int | None = limits.DEFAULT_HTTP_PORT
    data_dir: str = limits.DEFAULT_DATA_DIR
    max_message_size: int = limits.MAX_MESSAGE_SIZE
    max_connections: int = 10_000
    default_lease: float = limits.DEFAULT_LEASE_S
    dedup_window: float = limits.DEFAULT_DEDUP_WINDOW_S
    publish_pause_bytes: int = limits.PUBLISH_PAUSE_BYTES
    slow_consumer_bytes: int = limits.CONSUMER_HARD_LIMIT
    hello_timeout: float = limits.HELLO_TIMEOUT_S
    channels: dict[str, ChannelOptions] = field(default_factory=dict)
    config_path: str | None = None

    def channel_options(self, key: str) -> ChannelOptions:
        """Options for ``endpoint/version`` (falling back to ``endpoint/*``, then defaults)."""
        found = self.channels.get(key)
        if found is None:
            found = self.channels.get(key.split("/", 1)[0] + "/*", ChannelOptions())
        return found


_TOP_KEYS = {
    "broker_id": (str, "a string"),
    "host": (str, "a host name or address"),
    "port": (int, "a port number 0..65535"),
    "http_port": (int, "a port number 0..65535"),
    "data_dir": (str, "a directory path"),
    "max_message_size": (int, "a number of bytes >= 1"),
    "max_connections": (int, "an integer >= 1"),
    "default_lease": ((int, float), "a number of seconds > 0"),
    "dedup_window": ((int, float), "a number of seconds >= 0"),
    "publish_pause_bytes": (int, "a number of bytes >= 1"),
    "slow_consumer_bytes": (int, "a number of bytes >= 1"),
    "hello_timeout": ((int, float), "a number of seconds > 0"),
}


def _expect(key: str, value: Any, types: Any, what: str) -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{key}: expected {what}, got {json.dumps(value)}")
    if not isinstance(value, types):
        raise ConfigError(f"{key}: expected {what}, got {json.dumps(value, default=str)}")


def _channel_options(name: str, raw: Any, base_dir: Path) -> ChannelOptions:
    where = f'channels."{name}"'
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
            continue  # validated and compiled by the schema layer (issue #3)
        if key in ("prefetch", "max_items") and value < 1:
            raise ConfigError(f"{where}.{key}: expected {what}, got {value}")
        if key in ("ttl", "retention") and value <= 0:
            raise ConfigError(f"{where}.{key}: expected {what}, got {value}")
        if key == "requeue_limit" and value < 0:
            raise ConfigError(f"{where}.{key}: expected {what}, got {value}")
        if key == "overflow" and value not in ("refuse", "drop_oldest"):
            raise ConfigError(f"{where}.{key}: expected {what}, got {json.dumps(value)}")
        kwargs[key] = value
    return ChannelOptions(**kwargs)


def _check_channel_key(name: str) -> None:
    parts = name.split("/")
    if len(parts) != 2 or not parts[0] or not (parts[1] == "*" or parts[1].startswith("v")):
        raise ConfigError(
            f'channels."{name}": channel options are keyed by "endpoint/version" '
            f'(e.g. "orders/v1") or "endpoint/*"'
        )


def parse_settings(raw: dict[str, Any], *, base_dir: Path, path: str | None = None) -> Settings:
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a table at the top level")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "channels":
            if not isinstance(value, dict):
                raise ConfigError("channels: expected a table keyed by endpoint/version")
            channels = {}
            for name, opts in value.items():
                _check_channel_key(name)
                channels[name] = _channel_options(name, opts, base_dir)
            values["channels"] = channels
            continue
        if key not in _TOP_KEYS:
            known = ", ".join(sorted([*_TOP_KEYS, "channels"]))
            raise ConfigError(f"{key}: unknown setting (known: {known})")
        types, what = _TOP_KEYS[key]
        _expect(key, value, types, what)
        if key in ("port", "http_port") and not 0 <= value <= 65535:
            raise ConfigError(f"{key}: expected {what}, got {value}")
        if (("bytes" in what or key == "max_connections") and value < 1) or (
                key == "hello_timeout" and value <= 0):
            raise ConfigError(f"{key}: expected {what}, got {value}")
        values[key] = value
    if "data_dir" in values and not os.path.isabs(values["data_dir"]):
        values["data_dir"] = str(base_dir / values["data_dir"])
    return Settings(**values, config_path=path)


def load_settings(path: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Read ``path`` (TOML or JSON) and apply command-line ``overrides`` (None = unset)."""
    settings = Settings()
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
        try:
            raw = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: "
                              f"{exc}") from exc
        settings = parse_settings(raw, base_dir=p.resolve().parent, path=str(p))
    known = {f.name for f in fields(Settings)}
    clean = {k: v for k, v in overrides.items() if v is not None and k in known}
    return replace(settings, **clean)
