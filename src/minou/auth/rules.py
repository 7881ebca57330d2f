"""Per-client read/write rules: who may publish where and listen to what.

The model, in the order the broker applies it:

* **No rules declared** (development mode, or a broker that trusts every
  authenticated client): every client may read and write every channel and
  nothing is exclusive. :meth:`Rules.for_client` returns an *unrestricted*
  :class:`Access` and :meth:`Rules.accepts` returns ``None`` so that the
  auto-accept decision is taken elsewhere.
* **Rules declared**: each ``[[rules]]`` table names a client id glob
  (``client``, where only ``*`` is special) and the channel patterns it may
  ``read`` and ``write``. A client gets the *union* of every rule whose glob
  matches its id; a client that matches no rule may do nothing.
* Channel patterns are ``*`` (everything, dead letters included), a concrete
  channel ``endpoint/version/id``, or a prefix ``endpoint/*`` /
  ``endpoint/version/*``, each optionally under ``_dead/``. A pattern *covers*
  a request (a concrete channel, a wildcard subscription or a broadcast target)
  when every channel the request can reach is matched by the pattern.
* A ``read`` entry written ``!pattern`` makes the channels under it
  *exclusive*: they may only be read by naming a concrete channel, and the
  first subscriber reserves the channel (the reservation table lives in the
  broker, not here). Exclusivity is global: the union of every rule's ``!``
  entries. Any wildcard subscription overlapping one of them is refused, for
  every client, because a wildcard would silently steal messages meant for
  whoever reserved the channel. An exclusive channel's dead letters
  (``_dead/...``) are exclusive with it: the same wildcards are refused there.

Everything here is pure (no I/O) and cheap: :class:`Access` objects are cached
per client id, and each one caches its answers per channel, because
:meth:`Access.check_write` runs for every published message. A configuration
reload builds a new :class:`Rules`, which drops every cache at once.

Names are validated by the caller (``minou.names``); a malformed channel or
pattern given to a restricted client's ``check_*`` raises ``InvalidChannel``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import ConfigError, InvalidChannel, NotAuthorized
from ..limits import RULES_CACHE_ENTRIES
from ..names import DEAD_PREFIX, Pattern, kv_channel, parse_pattern

__all__ = ["ALLOW_ALL", "Access", "Rule", "Rules", "covers", "overlaps"]

_KNOWN_KEYS = ("accept", "client", "read", "write")
_PATTERN_HELP = ('(use "*", "endpoint/*", "endpoint/version/*", "endpoint/version/id" or '
                 '"kv/<bucket>")')
_ANY = Pattern("*", "", concrete=False)  # prefix "" matches every channel, dead letters too
_MISS = object()


# --- patterns ----------------------------------------------------------------


def _parse(text: str) -> Pattern:
    """A rule pattern or a request: ``*`` or anything :func:`names.parse_pattern` accepts."""
    return _ANY if text == "*" else parse_pattern(text)


def _covers(rule: Pattern, requested: Pattern) -> bool:
    if rule.concrete:
        # An exact channel grants only itself, never a wildcard that contains it.
        return requested.concrete and requested.text == rule.text
    # A concrete channel's prefix is the channel itself, so one test serves
    # channels, ``e/*`` and ``e/v/*`` alike.
    return requested.prefix.startswith(rule.prefix)


def _overlaps(exclusive: Pattern, wildcard: Pattern) -> bool:
    if exclusive.concrete:
        # A concrete pattern's "prefix" is the whole channel; asking whether the
        # wildcard matches it keeps "a/v1/1" from being read as a prefix of "a/v1/12".
        return wildcard.matches(exclusive.text)
    if wildcard.concrete:
        return exclusive.matches(wildcard.text)
    return exclusive.prefix.startswith(wildcard.prefix) or wildcard.prefix.startswith(
        exclusive.prefix
    )


def covers(rule_pattern: str, requested: str) -> bool:
    """Whether a rule pattern grants every channel ``requested`` can reach.

    ``requested`` is a concrete channel, a wildcard subscription (``e/*``,
    ``e/v/*``) or a broadcast target (``e/v/*``). Raises ``InvalidChannel`` for
    malformed input.
    """
    return _covers(_parse(rule_pattern), _parse(requested))


def overlaps(exclusive: str, wildcard: str) -> bool:
    """Whether some channel is matched by both patterns."""
    return _overlaps(_parse(exclusive), _parse(wildcard))


def _example(pattern: Pattern) -> str:
    """A concrete channel shape under ``pattern``, for error messages."""
    if pattern.concrete:
        return pattern.text
    dead = "_dead/" if pattern.prefix.startswith("_dead/") else ""
    body = pattern.prefix[len(dead):]
    depth = body.count("/")
    if depth == 0:  # "*"
        return f"{dead}endpoint/v1/<id>"
    if depth == 1:  # "e/*": any version works, v1 always exists syntactically
        return f"{pattern.prefix}v1/<id>"
    return f"{pattern.prefix}<id>"


@lru_cache(maxsize=1024)
def _client_regex(glob: str) -> re.Pattern[str]:
    # Only '*' is special: client ids may legitimately contain '?' or '[' and a
    # rule must not grant more than it literally says.
    return re.compile(".*".join(re.escape(part) for part in glob.split("*")), re.DOTALL)


# --- rules -------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` table. ``read`` excludes the ``!`` entries, kept in ``exclusive``."""

    client: str
    read: tuple[str, ...]
    write: tuple[str, ...]
    exclusive: tuple[str, ...]
    accept: bool = True

    def matches(self, client_id: str) -> bool:
        return _client_regex(self.client).fullmatch(client_id) is not None

    def describe(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "read": [*self.read, *("!" + e for e in self.exclusive)],
            "write": list(self.write),
            "accept": self.accept,
        }


def _type_name(value: object) -> str:
    return {str: "string", bool: "boolean", int: "integer", float: "float", list: "list",
            tuple: "list", dict: "table"}.get(type(value), type(value).__name__)


def _parse_patterns(key: str, raw: object, *, allow_exclusive: bool
                    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Validate a ``read``/``write`` list; return (plain patterns, exclusive patterns)."""
    if not isinstance(raw, list | tuple):
        hint = f' (write {key.rsplit(".", 1)[-1]} = ["..."])' if isinstance(raw, str) else ""
        raise ConfigError(f"{key}: expected a list of channel patterns, got "
                          f"{_type_name(raw)}{hint}")
    plain: list[str] = []
    exclusive: list[str] = []
    for index, entry in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(entry, str):
            raise ConfigError(f"{where}: expected a channel pattern string, got "
                              f"{_type_name(entry)}")
        text, target = entry, plain
        if entry.startswith("!"):
            if not allow_exclusive:
                raise ConfigError(f"{where}: {entry!r}: '!' (exclusive) is only allowed in read")
            text, target = entry[1:], exclusive
        text = _bucket_alias(text)
        try:
            _parse(text)
        except InvalidChannel:
            raise ConfigError(f"{where}: {entry!r} is not a channel pattern {_PATTERN_HELP}"
                              ) from None
        if text not in target:
            target.append(text)
    return tuple(plain), tuple(exclusive)


def _bucket_alias(text: str) -> str:
    """``kv/<bucket>`` names bucket ``<bucket>``'s channel, ``_kv/v1/<bucket>``
    (docs/kv.md); any other text is itself. (``kv/*`` stays the endpoint ``kv``'s
    pattern: every bucket is ``_kv/v1/*``.)"""
    head, _, bucket = text.partition("/")
    if head != "kv" or not bucket or bucket == "*" or "/" in bucket:
        return text
    try:
        return kv_channel(bucket)
    except InvalidChannel:
        return text  # reported as the bad pattern it is


def _parse_rule(index: int, raw: object) -> Rule:
    key = f"rules[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}: expected a table, got {_type_name(raw)}")
    for name in raw:
        if name not in _KNOWN_KEYS:
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(_KNOWN_KEYS)})")
    if "client" not in raw:
        raise ConfigError(f'{key}.client: missing; every rule names the client ids it applies '
                          f'to, e.g. client = "billing-*" or client = "*"')
    client = raw["client"]
    if not isinstance(client, str):
        raise ConfigError(f"{key}.client: expected a string, got {_type_name(client)}")
    if not client:
        raise ConfigError(f'{key}.client: must not be empty (use "*" for every client)')
    read, exclusive = _parse_patterns(f"{key}.read", raw.get("read", []), allow_exclusive=True)
    write, _ = _parse_patterns(f"{key}.write", raw.get("write", []), allow_exclusive=False)
    accept = raw.get("accept", True)
    if not isinstance(accept, bool):
        raise ConfigError(f"{key}.accept: expected true or false, got {_type_name(accept)}")
    return Rule(client=client, read=read, write=write, exclusive=exclusive, accept=accept)


def _union(groups: Iterable[Iterable[str]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def _guarded(exclusive: Iterable[str]) -> tuple[tuple[str, Pattern], ...]:
    """Each exclusive pattern and its dead letters' twin, with the label errors show."""
    out: list[tuple[str, Pattern]] = []
    for text in exclusive:
        out.append((f"!{text}", _parse(text)))
        if text != "*" and not text.startswith(DEAD_PREFIX):  # "*" has them already
            out.append((f"the dead letters of !{text}", _parse(DEAD_PREFIX + text)))
    return tuple(out)


class Rules:
    """Every declared rule, with the per-client :class:`Access` derived from them."""

    __slots__ = ("_access", "_exclusive_patterns", "_exclusive_seen", "exclusive", "rules")

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self.exclusive: tuple[str, ...] = _union(rule.exclusive for rule in self.rules)
        self._exclusive_patterns = _guarded(self.exclusive)
        self._access: dict[str, Access] = {}
        self._exclusive_seen: dict[str, bool] = {}

    @classmethod
    def parse(cls, raw: object) -> Rules:
        """Build from the TOML value of ``rules`` (a list of tables) or ``None``."""
        if raw is None:
            return cls()
        if not isinstance(raw, list | tuple):
            raise ConfigError(f"rules: expected a list of tables ([[rules]]), got "
                              f"{_type_name(raw)}")
        return cls(_parse_rule(index, entry) for index, entry in enumerate(raw))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def matching(self, client_id: str) -> tuple[Rule, ...]:
        return tuple(rule for rule in self.rules if rule.matches(client_id))

    def for_client(self, client_id: str) -> Access:
        access = self._access.get(client_id)
        if access is None:
            access = self._build(client_id)
            if len(self._access) >= RULES_CACHE_ENTRIES:
                self._access.clear()
            self._access[client_id] = access
        return access

    def _build(self, client_id: str) -> Access:
        if not self.rules:
            return Access(client_id, unrestricted=True)
        matched = self.matching(client_id)
        return Access(
            client_id,
            read=_union(rule.read for rule in matched),
            write=_union(rule.write for rule in matched),
            exclusive=_union(rule.exclusive for rule in matched),
            global_exclusive=self.exclusive,
            matched=bool(matched),
        )

    def accepts(self, client_id: str) -> bool | None:
        """Whether a new client with this id is auto-registered; None when no rules exist."""
        if not self.rules:
            return None
        return any(rule.accept for rule in self.rules if rule.matches(client_id))

    def is_exclusive(self, channel: str) -> bool:
        """Whether a concrete channel lies under a (global) exclusive pattern (or is the
        dead-letter channel of one that does)."""
        seen = self._exclusive_seen.get(channel)
        if seen is None:
            seen = any(pattern.matches(channel) for _, pattern in self._exclusive_patterns)
            if len(self._exclusive_seen) >= RULES_CACHE_ENTRIES:
                self._exclusive_seen.clear()
            self._exclusive_seen[channel] = seen
        return seen

    def describe(self) -> list[dict[str, Any]]:
        return [rule.describe() for rule in self.rules]


# --- access ------------------------------------------------------------------


class Access:
    """What one client may do. Obtain it from :meth:`Rules.for_client`.

    ``read`` are the plain read patterns, ``exclusive`` this client's own ``!``
    patterns (concrete reads only), ``global_exclusive`` every rule's ``!``
    patterns (no wildcard may overlap them, whoever asks).
    """

    __slots__ = ("_exclusive", "_global", "_read", "_reads", "_write", "_writes",
                 "client_id", "exclusive", "global_exclusive", "matched", "read",
                 "unrestricted", "write")

    def __init__(self, client_id: str, *, read: Iterable[str] = (), write: Iterable[str] = (),
                 exclusive: Iterable[str] = (), global_exclusive: Iterable[str] = (),
                 unrestricted: bool = False, matched: bool = True) -> None:
        self.client_id = client_id
        self.unrestricted = unrestricted
        self.matched = matched or unrestricted
        self.read = tuple(read)
        self.write = tuple(write)
        self.exclusive = tuple(exclusive)
        self.global_exclusive = tuple(global_exclusive)
        self._read = tuple(_parse(p) for p in self.read)
        self._write = tuple(_parse(p) for p in self.write)
        self._exclusive = tuple(_parse(p) for p in self.exclusive)
        self._global = _guarded(self.global_exclusive)
        # target -> refusal message, or None when allowed.
        self._writes: dict[str, str | None] = {}
        self._reads: dict[str, str | None] = {}

    # The hot path: one dict lookup once a target has been seen.
    def check_write(self, target: str) -> None:
        """Raise NotAuthorized unless this client may publish to ``target``.

        ``target`` is a concrete channel or a broadcast pattern ``e/v/*``.
        """
        if self.unrestricted:
            return
        refusal = self._writes.get(target, _MISS)
        if refusal is _MISS:
            refusal = self._remember(self._writes, target, self._decide_write(target))
        if refusal is not None:
            raise NotAuthorized(refusal, channel=target, client=self.client_id)

    def check_read(self, pattern: str) -> None:
        """Raise NotAuthorized unless this client may subscribe to / read ``pattern``.

        ``pattern`` is a concrete channel (also for range reads) or a wildcard
        subscription. Whether a concrete exclusive channel is already reserved
        by another client is the broker's check, not this one.
        """
        if self.unrestricted:
            return
        refusal = self._reads.get(pattern, _MISS)
        if refusal is _MISS:
            refusal = self._remember(self._reads, pattern, self._decide_read(pattern))
        if refusal is not None:
            raise NotAuthorized(refusal, channel=pattern, client=self.client_id)

    def may_write(self, target: str) -> bool:
        """Like :meth:`check_write` but answers False instead of raising (also for bad names)."""
        try:
            self.check_write(target)
        except (NotAuthorized, InvalidChannel):
            return False
        return True

    def may_read(self, pattern: str) -> bool:
        """Like :meth:`check_read` but answers False instead of raising (also for bad names)."""
        try:
            self.check_read(pattern)
        except (NotAuthorized, InvalidChannel):
            return False
        return True

    def describe(self) -> dict[str, list[str]]:
        if self.unrestricted:
            return {"read": ["*"], "write": ["*"], "exclusive": []}
        return {"read": list(self.read), "write": list(self.write),
                "exclusive": list(self.exclusive)}

    # --- decisions (uncached) ---

    @staticmethod
    def _remember(cache: dict[str, str | None], key: str, refusal: str | None) -> str | None:
        if len(cache) >= RULES_CACHE_ENTRIES:
            cache.clear()
        cache[key] = refusal
        return refusal

    def _no_rule(self) -> str:
        return f"client {self.client_id!r} matches no rule: it may not read or write anything"

    def _read_listing(self) -> tuple[str, ...]:
        return (*self.read, *("!" + e for e in self.exclusive))

    @staticmethod
    def _listing(patterns: Iterable[str]) -> str:
        return ", ".join(patterns) or "nothing"

    def _decide_write(self, target: str) -> str | None:
        requested = _parse(target)  # InvalidChannel propagates: it is not a refusal
        if not self.matched:
            return self._no_rule()
        if any(_covers(rule, requested) for rule in self._write):
            return None
        return (f"client {self.client_id!r} may not write to {target!r} "
                f"(write allowed: {self._listing(self.write)})")

    def _decide_read(self, pattern: str) -> str | None:
        requested = _parse(pattern)
        if not self.matched:
            return self._no_rule()
        covered = any(_covers(rule, requested) for rule in self._read)
        # A '!' entry grants concrete channels; for a wildcard it still counts as
        # "covered" so the refusal explains exclusivity instead of "not allowed".
        covered = covered or any(_covers(rule, requested) for rule in self._exclusive)
        if not covered:
            return (f"client {self.client_id!r} may not read {pattern!r} "
                    f"(read allowed: {self._listing(self._read_listing())})")
        if requested.concrete:
            return None
        for label, exclusive in self._global:
            if not _overlaps(exclusive, requested):
                continue
            if _covers(exclusive, requested):
                what, example = "is exclusive", _example(requested)
            else:
                what, example = "includes exclusive channels", _example(exclusive)
            return (f"{pattern!r} {what} ({label}): listen on a concrete channel such as "
                    f"{example}, not a wildcard")
        return None


ALLOW_ALL = Access("*", unrestricted=True)
"""Every permission; for development mode and brokers with no rules."""
