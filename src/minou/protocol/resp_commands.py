"""What the Redis port says about its own commands: ``COMMAND [INFO|DOCS|COUNT|LIST]``.

``redis-cli`` builds its help and its argument hints from ``COMMAND DOCS``; cluster-aware
clients read key positions from ``COMMAND INFO``. Both come from one table here, each
command's syntax written once as Redis's manual writes it and turned into Redis's argument
tree by a small parser. No I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .resp import Simple


@dataclass(frozen=True, slots=True)
class CommandDoc:
    name: str
    arity: int  # Redis's: negative means "at least"
    flags: tuple[str, ...]
    first_key: int
    last_key: int
    step: int
    group: str
    since: str
    summary: str
    syntax: str  # the arguments, as the Redis manual writes them

    def info(self) -> list[Any]:
        """``COMMAND INFO``'s entry: name, arity, flags, keys, ACL categories, tips,
        key specs, subcommands."""
        return [self.name.lower(), self.arity, [Simple(f) for f in self.flags],
                self.first_key, self.last_key, self.step, [Simple(f"@{self.group}")], [], [],
                []]

    def docs(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"summary": self.summary, "since": self.since,
                               "group": self.group}
        if self.syntax:
            doc["arguments"] = parse_syntax(self.syntax)
        return doc


_W, _R, _F = ("write", "denyoom"), ("readonly",), ("fast",)
_TABLE: tuple[tuple[Any, ...], ...] = (
    # name, arity, flags, first, last, step, group, since, summary, syntax
    ("PING", -1, _F, 0, 0, 0, "connection", "1.0.0", "Answers PONG (or the message).",
     "[message]"),
    ("ECHO", 2, _F, 0, 0, 0, "connection", "1.0.0", "Returns the given string.", "message"),
    ("QUIT", -1, _F, 0, 0, 0, "connection", "1.0.0", "Closes the connection.", ""),
    ("RESET", 1, _F, 0, 0, 0, "connection", "6.2.0", "Resets the connection.", ""),
    ("SELECT", 2, _F, 0, 0, 0, "connection", "1.0.0", "Database 0 only.", "index"),
    ("AUTH", -2, _F, 0, 0, 0, "connection", "1.0.0",
     "Authenticates: a client's JWT as the password (user: its client id).",
     "[username] password"),
    ("HELLO", -1, _F, 0, 0, 0, "connection", "6.0.0",
     "Handshake: protocol version, authentication, connection name.",
     "[protover [AUTH username password] [SETNAME clientname]]"),
    ("CLIENT", -2, (), 0, 0, 0, "connection", "2.4.0",
     "SETNAME, GETNAME, ID, INFO, SETINFO.", "subcommand [argument...]"),
    ("INFO", -1, (), 0, 0, 0, "server", "1.0.0", "The broker's status in INFO sections.",
     "[section...]"),
    ("COMMAND", -1, (), 0, 0, 0, "server", "2.8.13", "What this port's commands are.",
     "[INFO|DOCS|COUNT|LIST] [command-name...]"),
    ("XADD", -5, _W, 1, 1, 1, "stream", "5.0.0",
     "Publishes a message (answered once fsync'd); minou assigns the id.",
     "key [NOMKSTREAM] [(MAXLEN|MINID) [=|~] threshold] *|id (field value)..."),
    ("XLEN", 2, _R + _F, 1, 1, 1, "stream", "5.0.0", "The messages a channel holds.", "key"),
    ("XRANGE", -4, _R, 1, 1, 1, "stream", "5.0.0", "Entries between two ids.",
     "key start end [COUNT count]"),
    ("XREVRANGE", -4, _R, 1, 1, 1, "stream", "5.0.0", "Entries between two ids, newest first.",
     "key end start [COUNT count]"),
    ("XREAD", -4, _R, 0, 0, 0, "stream", "5.0.0", "Entries after ids, waiting for new ones.",
     "[COUNT count] [BLOCK milliseconds] STREAMS key... id..."),
    ("XDEL", -3, _W + _F, 1, 1, 1, "stream", "5.0.0", "Deletes entries (a write).",
     "key id..."),
    ("XTRIM", -4, _W, 1, 1, 1, "stream", "5.0.0",
     "Approximate trims only (retention keeps a channel's size).",
     "key (MAXLEN|MINID) [=|~] threshold [LIMIT count]"),
    ("XGROUP", -2, (), 0, 0, 0, "stream", "5.0.0",
     "CREATE, DESTROY, SETID, CREATECONSUMER, DELCONSUMER.",
     "subcommand key group [argument...]"),
    ("XREADGROUP", -7, _W, 0, 0, 0, "stream", "5.0.0",
     "Messages for a consumer group (leased for 600 s until XACK).",
     "GROUP group consumer [COUNT count] [BLOCK milliseconds] [NOACK] "
     "STREAMS key... id..."),
    ("XACK", -4, _W + _F, 1, 1, 1, "stream", "5.0.0", "Settles pending entries.",
     "key group id..."),
    ("XPENDING", -3, _R, 1, 1, 1, "stream", "5.0.0", "A group's pending entries.",
     "key group [[IDLE min-idle-time] start end count [consumer]]"),
    ("XCLAIM", -6, _W + _F, 1, 1, 1, "stream", "5.0.0",
     "Moves idle pending entries to another consumer.",
     "key group consumer min-idle-time id... [JUSTID]"),
    ("XAUTOCLAIM", -6, _W + _F, 1, 1, 1, "stream", "6.2.0",
     "Moves idle pending entries to another consumer, scanning.",
     "key group consumer min-idle-time start [COUNT count] [JUSTID]"),
    ("XINFO", -2, (), 0, 0, 0, "stream", "5.0.0", "STREAM, GROUPS, CONSUMERS.",
     "subcommand key [group]"),
    ("PUBLISH", 3, _W, 0, 0, 0, "pubsub", "2.0.0",
     "miniqueue's durable publish (not Redis pub/sub).", "channel message"),
    ("SUBSCRIBE", -2, (), 0, 0, 0, "pubsub", "2.0.0",
     "miniqueue's consumer: then INIT, ACK, NACK, BACK, DACK.", "channel"),
    ("MULTI", 1, _F, 0, 0, 0, "transactions", "1.2.0", "Starts a transaction.", ""),
    ("EXEC", 1, (), 0, 0, 0, "transactions", "1.2.0", "Runs the queued commands.", ""),
    ("DISCARD", 1, _F, 0, 0, 0, "transactions", "2.0.0", "Drops the queued commands.", ""),
    ("WATCH", -2, _F, 1, -1, 1, "transactions", "2.2.0", "Refused (no optimistic locks).",
     "key..."),
    ("UNWATCH", 1, _F, 0, 0, 0, "transactions", "2.2.0", "Nothing is watched.", ""),
    ("EVAL", -3, (), 0, 0, 0, "scripting", "2.6.0",
     "Runs Lua; redis.call reaches this table's commands, within 5 s.",
     "script numkeys [key...] [arg...]"),
    ("EVALSHA", -3, (), 0, 0, 0, "scripting", "2.6.0", "Runs a loaded script.",
     "sha1 numkeys [key...] [arg...]"),
    ("EVAL_RO", -3, (), 0, 0, 0, "scripting", "7.0.0", "EVAL.",
     "script numkeys [key...] [arg...]"),
    ("EVALSHA_RO", -3, (), 0, 0, 0, "scripting", "7.0.0", "EVALSHA.",
     "sha1 numkeys [key...] [arg...]"),
    ("SCRIPT", -2, (), 0, 0, 0, "scripting", "2.6.0", "LOAD, EXISTS, FLUSH.",
     "subcommand [argument...]"),
    ("GET", 2, _R + _F, 1, 1, 1, "string", "1.0.0", "A plain key's value (KV bucket redis).",
     "key"),
    ("SET", -3, _W, 1, 1, 1, "string", "1.0.0", "Sets a plain key (answered once fsync'd).",
     "key value [NX|XX] [GET] [(EX seconds)|(PX milliseconds)|(EXAT unix-time-seconds)|"
     "(PXAT unix-time-milliseconds)|KEEPTTL]"),
    ("DEL", -2, _W, 1, -1, 1, "keyspace", "1.0.0", "Deletes plain keys.", "key..."),
    ("UNLINK", -2, _W + _F, 1, -1, 1, "keyspace", "4.0.0", "Deletes plain keys.",
     "key..."),
    ("EXISTS", -2, _R + _F, 1, -1, 1, "keyspace", "1.0.0", "How many of the keys exist.",
     "key..."),
    ("TYPE", 2, _R + _F, 1, 1, 1, "keyspace", "1.0.0", "stream, string or none.", "key"),
    ("EXPIRE", -3, _W + _F, 1, 1, 1, "keyspace", "1.0.0", "Sets a key's time to live.",
     "key seconds [NX|XX|GT|LT]"),
    ("PEXPIRE", -3, _W + _F, 1, 1, 1, "keyspace", "2.6.0", "Sets a key's time to live.",
     "key milliseconds [NX|XX|GT|LT]"),
    ("EXPIREAT", -3, _W + _F, 1, 1, 1, "keyspace", "1.2.0", "Sets a key's expiry time.",
     "key unix-time-seconds [NX|XX|GT|LT]"),
    ("PEXPIREAT", -3, _W + _F, 1, 1, 1, "keyspace", "2.6.0", "Sets a key's expiry time.",
     "key unix-time-milliseconds [NX|XX|GT|LT]"),
    ("PERSIST", 2, _W + _F, 1, 1, 1, "keyspace", "2.2.0", "Removes a key's expiry.", "key"),
    ("TTL", 2, _R + _F, 1, 1, 1, "keyspace", "1.0.0", "A key's time to live, in seconds.",
     "key"),
    ("PTTL", 2, _R + _F, 1, 1, 1, "keyspace", "2.6.0", "A key's time to live, in ms.", "key"),
)
COMMAND_DOCS: dict[str, CommandDoc] = {row[0]: CommandDoc(*row) for row in _TABLE}

_TOKEN = re.compile(r"\.\.\.|[\[\]()|]|[^\s\[\]()|.]+")
_INTEGERS = {"count", "milliseconds", "seconds", "numkeys", "index", "protover",
             "min-idle-time", "threshold", "unix-time-seconds", "unix-time-milliseconds"}


def parse_syntax(syntax: str) -> list[dict[str, Any]]:
    """A syntax line -> Redis's argument tree (``COMMAND DOCS``). The line's grammar is
    the manual's, made unambiguous: ``[x]`` optional, ``(x y)`` a group, ``a|b`` one of
    the items beside the bar (binding tighter than a sequence), ``x...`` repeats x."""
    tokens = _TOKEN.findall(syntax)
    args, at = _sequence(tokens, 0, None)
    if at != len(tokens):
        raise ValueError(f"unbalanced syntax: {syntax!r}")
    return args


def _sequence(tokens: list[str], at: int, closer: str | None
              ) -> tuple[list[dict[str, Any]], int]:
    out: list[dict[str, Any]] = []
    while at < len(tokens) and tokens[at] != closer:
        arg, at = _alternatives(tokens, at)
        out.append(arg)
    if closer is None:
        return out, at
    if at >= len(tokens):
        raise ValueError(f"no {closer!r} to close a group")
    return out, at + 1


def _alternatives(tokens: list[str], at: int) -> tuple[dict[str, Any], int]:
    arg, at = _repeated(tokens, at)
    if at < len(tokens) and tokens[at] == "|":
        choices = [arg]
        while at < len(tokens) and tokens[at] == "|":
            other, at = _repeated(tokens, at + 1)
            choices.append(other)
        arg = {"name": "-".join(c["name"] for c in choices), "type": "oneof",
               "arguments": choices}
    return arg, at


def _repeated(tokens: list[str], at: int) -> tuple[dict[str, Any], int]:
    arg, at = _primary(tokens, at)
    if at < len(tokens) and tokens[at] == "...":
        _flag(arg, "multiple")
        at += 1
    return arg, at


def _primary(tokens: list[str], at: int) -> tuple[dict[str, Any], int]:
    if at >= len(tokens):
        raise ValueError("the syntax ends where an argument was expected")
    word = tokens[at]
    if word in ("[", "("):
        inner, at = _sequence(tokens, at + 1, "]" if word == "[" else ")")
        if not inner:
            raise ValueError("an empty group")
        arg = _group(inner)
        if word == "[":
            _flag(arg, "optional")
        return arg, at
    if word in ("]", ")", "|", "..."):
        raise ValueError(f"{word!r} where an argument was expected")
    return _word(word), at + 1


def _group(inner: list[dict[str, Any]]) -> dict[str, Any]:
    if len(inner) == 1:
        return inner[0]
    first = inner[0]
    if first["type"] == "pure-token":
        if len(inner) == 2 and inner[1]["type"] not in ("block", "oneof", "pure-token"):
            return {**inner[1], "token": first["token"]}  # COUNT count
        return {"name": first["name"], "type": "block", "token": first["token"],
                "arguments": inner[1:]}
    return {"name": "-".join(a["name"] for a in inner), "type": "block", "arguments": inner}


def _flag(arg: dict[str, Any], flag: str) -> None:
    flags = arg.setdefault("flags", [])  # status replies: redis-cli insists on it
    if Simple(flag) not in flags:
        flags.append(Simple(flag))


def _word(word: str) -> dict[str, Any]:
    if word.isupper() or word in ("*", "=", "~"):
        name = {"*": "auto-id", "=": "equal", "~": "approximately"}.get(word, word.lower())
        return {"name": name, "type": "pure-token", "token": word}
    if word == "key":
        return {"name": "key", "type": "key", "key_spec_index": 0}
    kind = "integer" if word in _INTEGERS else "string"
    return {"name": word, "type": kind}


def docs_reply(names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """``COMMAND DOCS [name ...]``: (name, doc) for the known ones, every one without names."""
    wanted = [n.upper() for n in names] or list(COMMAND_DOCS)
    return [(n.lower(), COMMAND_DOCS[n].docs()) for n in wanted if n in COMMAND_DOCS]


def info_reply(names: list[str]) -> list[list[Any] | None]:
    """``COMMAND INFO name...`` (nil for an unknown one); every command without names."""
    if not names:
        return [doc.info() for doc in COMMAND_DOCS.values()]
    return [COMMAND_DOCS[n.upper()].info() if n.upper() in COMMAND_DOCS else None
            for n in names]
