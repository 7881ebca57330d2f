"""Plain keys, transactions and Lua for the Redis protocol door (docs/redis-protocol.md).

What frameworks use around streams: locks and markers (``SET k v NX PX 30000``, ``GET``,
``DEL``, ``EXPIRE``, ``TTL``...), ``MULTI``/``EXEC``, and Lua scripts (redis-py's lock
releases with one). Plain keys live in the KV bucket ``redis`` (channel
``_kv/v1/redis``): durable like any message (a ``SET`` is answered once fsync'd), under
the same rules (``kv/redis`` in a rule), a value's expiry its message's TTL, ``NX`` a
compare-and-set on "no value". A key that is not a KV key as it is (``[A-Za-z0-9_=./:@-]``,
no leading ``/`` or ``=``, no ``//``) is stored as ``=`` + its URL-safe base64.

Every command here is a coroutine over the connection's inner native connection
(``RespConnection.request``): ``MULTI``'s queue runs them in order at ``EXEC``, and a
Lua script's ``redis.call`` runs them from the script's thread, waiting for each.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import threading
import time
from typing import Any

from ..errors import BadRequest, ErrorCode
from ..limits import MAX_KEY_LENGTH
from ..names import KV_DELETE, KV_EXPECT, KV_OP, KV_PREFIX
from ..protocol import frames as f
from ..protocol.resp import OK, Bool, Double, Error, Map, NullArray, Push, Set, Simple, Verbatim
from ..protocol.resp_streams import StreamKeyError, key_to_channel

REVISION_MISMATCH = int(ErrorCode.REVISION_MISMATCH)

# The Redis connection (resp.RespConnection, which imports this module): what is used of
# it is ``request``, ``call``, ``_req`` and ``server``.
RespConnection = Any

BUCKET = "redis"
CHANNEL = KV_PREFIX + BUCKET
_PLAIN = re.compile(rb"[A-Za-z0-9_.:@-][A-Za-z0-9_=./:@-]{0,255}")
_PLAIN_CHARS = re.compile(rb"[A-Za-z0-9_.:@-][A-Za-z0-9_=./:@-]*")
# the bytes of a key stored encoded ("=" + URL-safe base64 without padding) at most
MAX_ENCODED_KEY = (MAX_KEY_LENGTH - 1) * 3 // 4
MAX_SCRIPTS = 1000  # SCRIPT LOAD / EVAL keep at most this many scripts (then the oldest go)
MAX_SCRIPT_BYTES = 64 * 1024
SCRIPT_TIME_S = 5.0  # a script running longer is stopped with an error (Redis: BUSY)
# What a script's Lua may hold (its tables, its strings, what redis.call returned):
# without it 300 string.rep of 10 MB held 2.9 GB of the broker's memory.
SCRIPT_MEMORY_BYTES = 64 << 20
CALL_TIMEOUT_S = 30.0  # one redis.call's command, from the script's thread


def kv_key(key: bytes) -> str:
    if _PLAIN.fullmatch(key) and b"//" not in key:
        return key.decode()
    return "=" + base64.urlsafe_b64encode(key).decode().rstrip("=")


def stored_key(key: bytes) -> str:
    """``kv_key(key)``, or the refusal of a key too long to store, naming its length as
    the client sent it and the limit for its kind (not the encoded key's length)."""
    stored = kv_key(key)
    if len(stored) <= MAX_KEY_LENGTH:
        return stored
    if _PLAIN_CHARS.fullmatch(key) and b"//" not in key:
        raise BadRequest(f"key is {len(key)} bytes, the limit is {MAX_KEY_LENGTH} (for a "
                         "key of letters, digits and _=./:@-)", limit=MAX_KEY_LENGTH)
    raise BadRequest(f"key is {len(key)} bytes, the limit is {MAX_ENCODED_KEY} for a key "
                     "with other bytes, a leading '/' or '=', or '//' (stored encoded; "
                     f"{MAX_KEY_LENGTH} for a key of letters, digits and _=./:@-)",
                     limit=MAX_ENCODED_KEY)


class Value:
    """A key's value as ``kv.get`` answered it."""

    __slots__ = ("data", "expires_at", "revision")

    def __init__(self, data: bytes, revision: int, expires_at: float | None) -> None:
        self.data, self.revision, self.expires_at = data, revision, expires_at


async def get(c: RespConnection, key: bytes) -> Value | None:
    reply = await c.request(f.Admin(next(c._req), "kv.get",
                                    {"bucket": BUCKET, "key": stored_key(key)}))
    reads = c.script_reads
    if isinstance(reply, f.Error):
        if reply.code == 212:  # NOT_FOUND: no value
            if reads is not None:
                reads.setdefault(key, 0)
            return None
        raise Failed(reply)
    view = reply.value
    data = base64.b64decode(view["value_base64"]) if view.get("value_base64") is not None \
        else _json_bytes(view.get("value"))
    value = Value(data, int(view["revision"]), view.get("expires_at"))
    if reads is not None:
        reads.setdefault(key, value.revision)
    return value


def _json_bytes(value: Any) -> bytes:
    import msgspec

    if isinstance(value, f.JsonText):  # the text as stored
        return bytes(value.text)
    return msgspec.json.encode(value)


async def put(c: RespConnection, key: bytes, data: bytes, *, expect: int | None = None,
              ttl: float | None = None, delete: bool = False) -> f.Outcome:
    # In a script, a write is a compare-and-set on what the script read of the key:
    # another client's write in between fails the script instead of being lost.
    reads = c.script_reads
    fenced = expect is None and reads is not None and key in reads
    if fenced:
        assert reads is not None
        expect = reads[key]
    headers: dict[str, str] = {}
    if expect is not None:
        headers[KV_EXPECT] = str(expect)
    if delete:
        headers[KV_OP] = KV_DELETE
    send = f.Send(CHANNEL, b"" if delete else data, True, headers or None, 0, ttl, None,
                  None, stored_key(key))
    reply = await c.request(f.Publish(next(c._req), [send]))
    if isinstance(reply, f.Error):
        raise Failed(reply)
    outcome: f.Outcome = reply.outcomes[0]
    if reads is not None:
        if fenced and outcome.code == REVISION_MISMATCH:
            raise Failed(f.Error(0, REVISION_MISMATCH, (
                f"key {key[:64].decode(errors='replace')!r} was changed by another client "
                "while the script ran (a script's writes are compare-and-set on what it "
                "read): run it again")))
        if not outcome.code:
            reads[key] = 0 if delete else outcome.seq
    return outcome


class Failed(Exception):
    """An error answer from the broker, to turn into the Redis error."""

    def __init__(self, frame: f.Error) -> None:
        self.frame = frame


def _stream_exists(c: RespConnection, key: bytes) -> bool:
    """Whether ``key`` is a stream this client may read. One it may not read counts as
    none, whether it exists or not (the plain key of that name is looked for, under
    the rules of the bucket): nothing tells the client whether it is there, as XREAD's
    patterns skip the streams a client may not read."""
    try:
        channel = key_to_channel(key)
    except StreamKeyError:
        return False
    core = c.server.core
    return channel in core.channels and core.may_read(c.inner.session, channel)


# ------------------------------------------------------------------ commands
async def cmd_get(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) != 2:
        return _wrong("get")
    if _stream_exists(c, args[1]):
        return _wrongtype()
    value = await get(c, args[1])
    return value.data if value is not None else None


async def cmd_set(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) < 3:
        return _wrong("set")
    key, data = args[1], args[2]
    nx = xx = keepttl = want_old = False
    ttl: float | None = None
    i = 3
    while i < len(args):
        opt = args[i].upper()
        if opt in (b"NX", b"XX"):
            nx, xx = nx or opt == b"NX", xx or opt == b"XX"
            i += 1
        elif opt in (b"EX", b"PX", b"EXAT", b"PXAT") and i + 1 < len(args):
            try:
                n = int(args[i + 1])
            except ValueError:
                return Error("ERR value is not an integer or out of range")
            if n <= 0:
                return Error("ERR invalid expire time in 'set' command")
            now = time.time()
            ttl = {b"EX": n, b"PX": n / 1000, b"EXAT": n - now, b"PXAT": n / 1000 - now}[opt]
            i += 2
        elif opt == b"KEEPTTL":
            keepttl, i = True, i + 1
        elif opt == b"GET":
            want_old, i = True, i + 1
        else:
            return Error("ERR syntax error")
    if (nx and xx) or (keepttl and ttl is not None):
        return Error("ERR syntax error")
    if ttl is not None and ttl <= 0:
        return OK if not want_old else None  # already expired: Redis sets then drops it
    old = await get(c, key) if (xx or want_old or keepttl) else None
    if xx and old is None:
        return None
    if keepttl and old is not None and old.expires_at is not None:
        ttl = max(0.001, old.expires_at - time.time())
    expect = 0 if nx else (old.revision if xx and old is not None else None)
    outcome = await put(c, key, data, expect=expect, ttl=ttl)
    if outcome.code == REVISION_MISMATCH:  # NX found a value (or XX lost it)
        return None
    if outcome.code:
        raise Failed(f.Error(0, outcome.code, outcome.error))
    if want_old:
        return old.data if old is not None else None
    return OK


async def cmd_del(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) < 2:
        return _wrong("del")
    removed = 0
    for key in args[1:]:
        if _stream_exists(c, key):
            return Error("ERR DEL of a stream is not supported: minou removes messages "
                         "once every group settled them; an admin purges a channel "
                         "(minou purge)")
        old = await get(c, key)
        if old is not None:
            outcome = await put(c, key, b"", expect=old.revision, delete=True)
            if not outcome.code:
                removed += 1
    return removed


async def cmd_exists(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) < 2:
        return _wrong("exists")
    n = 0
    for key in args[1:]:
        if _stream_exists(c, key) or await get(c, key) is not None:
            n += 1
    return n


async def cmd_type(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) != 2:
        return _wrong("type")
    if _stream_exists(c, args[1]):
        return Simple("stream")
    return Simple("string" if await get(c, args[1]) is not None else "none")


async def cmd_expire(c: RespConnection, args: list[bytes]) -> Any:
    name = args[0].upper()
    if len(args) < 3:
        return _wrong(name.decode().lower())
    try:
        n = int(args[2])
    except ValueError:
        return Error("ERR value is not an integer or out of range")
    seconds = n / 1000 if name in (b"PEXPIRE", b"PEXPIREAT") else float(n)
    if name in (b"EXPIREAT", b"PEXPIREAT"):
        seconds -= time.time()
    old = await get(c, args[1])
    if old is None:
        return 0
    if seconds <= 0:
        outcome = await put(c, args[1], b"", expect=old.revision, delete=True)
    else:
        outcome = await put(c, args[1], old.data, expect=old.revision, ttl=seconds)
    return 0 if outcome.code else 1


async def cmd_persist(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) != 2:
        return _wrong("persist")
    old = await get(c, args[1])
    if old is None or old.expires_at is None:
        return 0
    outcome = await put(c, args[1], old.data, expect=old.revision)
    return 0 if outcome.code else 1


async def cmd_ttl(c: RespConnection, args: list[bytes]) -> Any:
    if len(args) != 2:
        return _wrong(args[0].decode().lower())
    if _stream_exists(c, args[1]):
        return -1
    old = await get(c, args[1])
    if old is None:
        return -2
    if old.expires_at is None:
        return -1
    left = max(0.0, old.expires_at - time.time())
    return int(left * 1000) if args[0].upper() == b"PTTL" else round(left)


def _wrong(name: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{name}' command")


def _wrongtype() -> Error:
    return Error("WRONGTYPE Operation against a key holding the wrong kind of value")


KEY_COMMANDS = {
    "GET": cmd_get, "SET": cmd_set, "DEL": cmd_del, "UNLINK": cmd_del,
    "EXISTS": cmd_exists, "TYPE": cmd_type, "EXPIRE": cmd_expire, "PEXPIRE": cmd_expire,
    "EXPIREAT": cmd_expire, "PEXPIREAT": cmd_expire, "PERSIST": cmd_persist,
    "TTL": cmd_ttl, "PTTL": cmd_ttl,
}


# ----------------------------------------------------------------------- Lua
class Scripts:
    """Scripts by SHA1, server-wide (SCRIPT LOAD, then EVALSHA from any connection)."""

    def __init__(self) -> None:
        self.by_sha: dict[str, bytes] = {}

    def add(self, body: bytes) -> str:
        sha = hashlib.sha1(body).hexdigest()
        if sha not in self.by_sha:
            while len(self.by_sha) >= MAX_SCRIPTS:
                del self.by_sha[next(iter(self.by_sha))]
            self.by_sha[sha] = body
        return sha


# The time limit is wall-clock time, as Redis's: Lua's os.clock counts the CPU time of
# every thread of the process, so a busy broker spent a script's budget for it, and a
# loaded machine stretched 5 s of it to 28 s of a client's wait. ``clock`` is Python's
# time.monotonic (cheaper than os.clock's clock() call, measured).
_SANDBOX = b"""
local error, clock, deadline = error, ...
debug.sethook(function()
  if clock() > deadline then error("BUSY script ran longer than its time limit", 0) end
end, "", 1000)
os, io, package, require, dofile, loadfile, load, loadstring, debug = nil
"""


def run_script(c: RespConnection, loop: asyncio.AbstractEventLoop, body: bytes,
               keys: list[bytes], argv: list[bytes]) -> Any:
    """Run a Lua script (in a thread of its own): ``redis.call`` runs a command on this
    connection, waiting for its answer. Redis's conversions both ways."""
    try:  # Lua 5.1, as Redis runs scripts (unpack, getn...), when lupa has it
        import lupa.lua51 as lupa
    except ImportError:
        import lupa  # type: ignore[no-redef]

    lua = lupa.LuaRuntime(encoding=None, register_eval=False, register_builtins=False,
                          unpack_returned_tuples=True, max_memory=SCRIPT_MEMORY_BYTES)
    lua.execute(_SANDBOX, time.monotonic, time.monotonic() + SCRIPT_TIME_S)
    runtime = [lua]  # emptied when the script ends (see the end)

    def table(value: Any) -> Any:
        return runtime[0].table_from(value)

    def to_lua(reply: Any) -> Any:
        """A reply as Redis hands it to a script: in its RESP2 shape, whatever the
        connection speaks (a map is a flat table, a null false, a boolean 1 or 0)."""
        if reply is None or isinstance(reply, NullArray):
            return False
        if isinstance(reply, Simple):
            return table({b"ok": reply.text.encode()})
        if isinstance(reply, Error):
            return table({b"err": reply.text.encode()})
        if isinstance(reply, list | tuple):
            return table([to_lua(x) for x in reply])
        if isinstance(reply, Map):
            return table([to_lua(x) for pair in reply.pairs for x in pair])
        if isinstance(reply, Set | Push):
            return table([to_lua(x) for x in reply.items])
        if isinstance(reply, Bool):
            return int(reply.value)
        if isinstance(reply, Double):
            return repr(reply.value).encode()
        if isinstance(reply, Verbatim):
            return reply.text.encode()
        if isinstance(reply, str):
            return reply.encode()
        return reply

    def call(raising: bool, *parts: Any) -> Any:
        args = [p if isinstance(p, bytes) else str(p).encode() for p in parts]
        if not args:
            raise lupa.LuaError("Please specify at least one argument for this redis lib call")
        name = args[0].upper().decode(errors="replace")
        if name in ("EVAL", "EVALSHA", "SCRIPT", "MULTI", "EXEC", "BLPOP") or \
                (name == "XREADGROUP" and b"BLOCK" in [a.upper() for a in args]):
            reply: Any = Error("ERR This Redis command is not allowed from script")
        else:
            reply = asyncio.run_coroutine_threadsafe(c.call(args), loop).result(CALL_TIMEOUT_S)
        if raising and isinstance(reply, Error):
            raise lupa.LuaError(reply.text)
        return to_lua(reply)

    redis = table({
        b"call": lambda *a: call(True, *a),
        b"pcall": lambda *a: call(False, *a),
        b"status_reply": lambda s: table({b"ok": s}),
        b"error_reply": lambda s: table({b"err": s}),
        b"sha1hex": lambda s: hashlib.sha1(s).hexdigest().encode(),
        b"log": lambda *a: None,
    })
    g = lua.globals()
    g[b"redis"] = redis
    g[b"KEYS"] = table(keys)
    g[b"ARGV"] = table(argv)
    try:
        try:
            result = lua.execute(body)
        except lupa.LuaMemoryError:
            c.server.core.counters.refuse("script_memory")
            return Error("ERR Error running script: not enough memory (a script may hold "
                         f"{SCRIPT_MEMORY_BYTES >> 20} MiB)")
        except lupa.LuaError as exc:
            text = str(exc)
            if text.startswith("BUSY"):
                return Error(text)
            return Error(f"ERR Error running script: {text}")
        return from_lua(result, lupa)
    finally:
        # The functions handed to Lua hold the runtime (through ``runtime``): a cycle,
        # which the cyclic GC frees only when it runs, rarely with GC_THRESHOLD (each
        # script left ~40 KB behind). Emptying it cuts the cycle: the runtime goes now.
        runtime.clear()


def from_lua(value: Any, lupa: Any) -> Any:
    if value is None or value is False:
        return None
    if value is True:
        return 1
    if isinstance(value, float):
        return int(value)
    if isinstance(value, int | bytes):
        return value
    if lupa.lua_type(value) == "table":
        ok, err = value[b"ok"], value[b"err"]
        if err is not None:
            return Error(err.decode(errors="replace") if isinstance(err, bytes) else str(err))
        if ok is not None:
            return Simple(ok.decode(errors="replace") if isinstance(ok, bytes) else str(ok))
        out = []
        i = 1
        while (item := value[i]) is not None:  # up to the first nil, as Redis does
            out.append(from_lua(item, lupa))
            i += 1
        return out
    return None


_LUA_LOCK = threading.Lock()  # one script at a time per broker: they are not isolated
