"""Key-value reads (docs/kv.md): the operations behind ``client.kv()``, the HTTP routes
under ``/v1/kv`` and ``minou kv``. Writes are publishes (core/kv.py checks them).

Every operation needs the right to read the bucket's channel (``_kv/v1/<bucket>``), the
caller's own rules deciding, admin or not. Values are read by revision: from memory
when cached, else one storage read. ``kv.read`` is the watch's long poll: the changes
after a revision, waiting (at most ``MAX_KV_WAIT_S``) for the next commit when there
are none yet.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..core.kv import KvIndex, Revision, is_tombstone, revision_of
from ..core.log import ChannelLog, Msg, page_end, read_weight
from ..core.paging import page_args, page_of
from ..errors import BadRequest, NotFound
from ..limits import (
    DEFAULT_KV_PAGE,
    KV_PAGE_BYTES,
    MAX_KV_PAGE,
    MAX_KV_REVISION,
    MAX_KV_WAIT_S,
    STORAGE_READ_BYTES,
    STORAGE_READ_PAGE,
)
from ..names import KV_PREFIX, is_kv, kv_bucket, kv_channel, validate_kv_key
from ..protocol.frames import JsonText

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from ..core.snapshot import Snapshot
    from ..storage.base import Storage
    from .ports import Server

# Every bucket is in one queue (_kv/v1): with queues spread over brokers, its owner
# answers them all (front.ask_owner).
KV_OPS = frozenset({"kv.buckets", "kv.get", "kv.keys", "kv.history", "kv.read"})
_EMPTY = KvIndex()


class PollDoor(Protocol):
    """How a watch's long poll (``kv.read`` with ``wait``) tells the native connection
    that runs it when it holds an answer: its page (up to KV_PAGE_BYTES) counts as a
    read (READS_PER_CONNECTION, and none while 16 MiB wait unread), except while it
    waits for a commit, which the long-poll bound counts. Uncounted, 200 polls with
    revisions to answer, from a client reading nothing, held ~800 MB of answers."""

    def waiting(self) -> None:
        """It waits for a commit: it holds no answer meanwhile."""

    async def answering(self) -> None:
        """Woken: it is to build an answer again, once its connection has room."""


# Set by the native connection around the task running a poll (the task copies it).
POLL_DOOR: ContextVar[PollDoor | None] = ContextVar("minou_poll_door", default=None)


def _text(args: dict[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise BadRequest(f"give {name} (a string)")
    return value


def _number(args: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = args.get(name, default)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise BadRequest(f"{name} must be a number {lo:g}..{hi:g}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be a number {lo:g}..{hi:g}")
    return value


def bucket_of(server: Server, args: dict[str, Any], caller: Identity | None
              ) -> tuple[str, ChannelLog | None]:
    """The bucket's channel (read-checked for ``caller``) and its log, if it exists."""
    channel = kv_channel(_text(args, "bucket"))
    if caller is not None:
        server.access_for(caller).check_read(channel)
    return channel, server.core.channels.get(channel)


def stored_json(data: bytes) -> msgspec.Raw | None:
    """``data`` as one JSON value's text, or None if it is not one. Decoding into Raw
    checks the syntax without building a Python object (~2 ms a MiB, where decoding
    60 MiB of ``[[],[],...]`` took 1.5 GB and 6 s): the answer may embed it as is."""
    try:
        return msgspec.json.decode(data, type=msgspec.Raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def entry_view(msg: Msg) -> dict[str, Any]:
    """A stored revision as an answer: the value as its JSON text (``JsonText``: each
    door writes it, never decoded here) or base64 (raw bytes)."""
    deleted = is_tombstone(msg.headers)
    value: JsonText | None = None
    value_base64: str | None = None
    if not deleted:
        # Published JSON was checked then; bytes that are not JSON (stored otherwise,
        # or damaged) are answered as bytes rather than spliced into a JSON answer.
        text = None if msg.raw else stored_json(msg.data)
        if text is None:
            value_base64 = base64.b64encode(msg.data).decode()
        else:
            value = JsonText(text)
    return {"key": msg.key, "revision": msg.seq, "op": "del" if deleted else "put",
            "value": value, "value_base64": value_base64, "created": msg.published_at,
            "expires_at": msg.expires_at}


async def _revision(server: Server, log: ChannelLog, seq: int) -> Msg | None:
    found = log.lookup(seq)
    if isinstance(found, Msg):
        return found
    msgs = await server.read_messages(log.name, seq, seq + 1, 1)
    return msgs[0] if msgs and msgs[0].seq == seq else None


def kv_buckets(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """A page of the buckets the caller may read (core/paging.py: ``limit``, ``after``
    a bucket name; ``more``, ``next``, ``total``), sorted by name: each one's keys,
    revisions held and options."""
    after, limit = page_args(args)
    access = server.access_for(caller) if caller is not None else None
    channels = server.core.channels
    readable = [name for name, log in channels.items() if log.kv is not None
                and (access is None or access.may_read(name))]
    # Every bucket's channel is KV_PREFIX + bucket: the same order. The cursor is any
    # string (a bucket forgotten since, or none at all), not checked as a bucket name.
    names, more = page_of(readable, KV_PREFIX + after, limit)
    now = time.time()
    out = []
    for name in names:
        log = channels[name]
        index = log.kv if log.kv is not None else _EMPTY
        opts = log.options
        out.append({"bucket": kv_bucket(name), "keys": index.live_keys(now),
                    "revisions": len(index), "revision": log.end - 1,
                    "history": opts.history, "ttl": opts.ttl, "max_revisions": opts.max_items,
                    "schema": opts.schema.key if opts.schema is not None else None,
                    "active_at": log.touched or None})
    return {"buckets": out, "more": more, "next": out[-1]["bucket"] if out else after,
            "total": len(readable)}


async def kv_get(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    channel, log = bucket_of(server, args, caller)
    key = validate_kv_key(args.get("key"))
    wanted = int(_number(args, "revision", 0, 0, MAX_KV_REVISION))
    index = log.kv if log is not None and log.kv is not None else _EMPTY
    if wanted:
        if wanted not in index.history(key):
            raise NotFound(f"revision {wanted} of key {key!r} is not stored in bucket "
                           f"{kv_bucket(channel)!r} (see its history)", key=key)
        seq = wanted
    else:
        seq = index.latest(key, time.time())
        if not seq:
            raise NotFound(f"key {key!r} has no value in bucket {kv_bucket(channel)!r}", key=key)
    msg = await _revision(server, log, seq) if log is not None else None
    if msg is None:  # removed between the lookup and the read (a TTL, a purge)
        raise NotFound(f"key {key!r} has no value in bucket {kv_bucket(channel)!r}", key=key)
    return {"bucket": kv_bucket(channel), **entry_view(msg)}


def kv_keys(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    channel, log = bucket_of(server, args, caller)
    prefix = _text(args, "prefix", "")
    after = _text(args, "after", "")
    limit = int(_number(args, "limit", DEFAULT_KV_PAGE, 1, MAX_KV_PAGE))
    index = log.kv if log is not None and log.kv is not None else _EMPTY
    keys = index.keys(prefix, time.time(), after, limit + 1)
    return {"bucket": kv_bucket(channel), "keys": keys[:limit], "more": len(keys) > limit,
            "revision": log.end - 1 if log is not None else 0}


def _no_revision(channel: str, key: str) -> NotFound:
    return NotFound(f"key {key!r} has no revision in bucket {kv_bucket(channel)!r}", key=key)


async def kv_history(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """The stored revisions of ``key`` after revision ``after``, oldest first, a page at
    a time: at most ``limit`` of them and KV_PAGE_BYTES of ``read_weight`` (always one).
    ``more``: others follow, asked for with ``after=next`` (the last one answered)."""
    channel, log = bucket_of(server, args, caller)
    key = validate_kv_key(args.get("key"))
    after = int(_number(args, "after", 0, 0, MAX_KV_REVISION))
    limit = int(_number(args, "limit", DEFAULT_KV_PAGE, 1, MAX_KV_PAGE))
    seqs = log.kv.history(key) if log is not None and log.kv is not None else []
    if log is None or not seqs:
        raise _no_revision(channel, key)
    entries: list[dict[str, Any]] = []
    size, nxt, more = 0, after, False
    for seq in seqs:
        if seq <= after:
            continue
        if len(entries) >= limit:
            more = True
            break
        msg = await _revision(server, log, seq)
        if msg is None:  # removed meanwhile (a TTL, a purge)
            continue
        weight = read_weight(msg)
        if entries and size + weight > KV_PAGE_BYTES:
            more = True  # (read again by the next page: at most one value read twice)
            break
        entries.append(entry_view(msg))
        size += weight
        nxt = seq
    if not entries and not after:  # every one removed meanwhile
        raise _no_revision(channel, key)
    return {"bucket": kv_bucket(channel), "key": key, "entries": entries, "next": nxt,
            "more": more}


async def kv_read(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """The revisions after ``after`` whose key starts with ``prefix``, in order; with
    ``latest``, only the keys' current values (a snapshot, page by page). ``next`` is
    the revision to go on after; ``wait`` seconds: wait for a commit when none is there."""
    channel, log = bucket_of(server, args, caller)
    after = int(_number(args, "after", 0, 0, MAX_KV_REVISION))
    prefix = _text(args, "prefix", "")
    limit = int(_number(args, "limit", DEFAULT_KV_PAGE, 1, MAX_KV_PAGE))
    latest = bool(args.get("latest", False))
    wait = _number(args, "wait", 0, 0, MAX_KV_WAIT_S)
    deadline = time.monotonic() + wait
    while True:
        log = server.core.channels.get(channel)
        end = log.end if log is not None else 1
        if log is not None and after + 1 < end:
            # KV_PAGE_BYTES, not STORAGE_READ_BYTES: the page must fit a frame as msgpack.
            msgs = log.cached_range(max(after + 1, log.first_seq), end, limit,
                                    KV_PAGE_BYTES)
            if msgs is None:
                msgs = await server.read_messages(channel, max(after + 1, log.first_seq),
                                                  end, limit, KV_PAGE_BYTES)
            nxt = page_end(msgs, limit, KV_PAGE_BYTES, end) - 1
            now = time.time()
            kv = log.kv if log.kv is not None else _EMPTY
            picked = [m for m in msgs if m.key is not None and m.key.startswith(prefix)
                      and (not latest or kv.latest(m.key, now) == m.seq)]
            if picked or not wait or latest:
                return {"bucket": kv_bucket(channel), "entries": [entry_view(m) for m in picked],
                        "next": nxt, "revision": end - 1}
            after = nxt
            continue
        left = deadline - time.monotonic()
        if left <= 0 or latest or server.closing:  # (stopping: answered now)
            return {"bucket": kv_bucket(channel), "entries": [], "next": max(after, end - 1),
                    "revision": end - 1}
        await _next_commit(server, channel, left, caller)


async def _next_commit(server: Server, channel: str, timeout: float,
                       caller: Identity | None) -> None:
    waiters = server.engine.channel_waiters

    def add(wake: Callable[[], None]) -> None:
        waiters.setdefault(channel, {})[wake] = None

    def forget(wake: Callable[[], None]) -> None:
        mine = waiters.get(channel)
        if mine is not None:
            mine.pop(wake, None)
            if not mine:
                del waiters[channel]

    door = POLL_DOOR.get()
    with server.engine.long_polls.slot("KV watches", caller):
        if door is not None:
            door.waiting()
        await woken(add, forget, timeout)
    if door is not None:
        await door.answering()


async def woken(add: Callable[[Callable[[], None]], None],
                remove: Callable[[Callable[[], None]], None], timeout: float) -> None:
    """Wait until the callback given to ``add`` is called, or ``timeout`` passed; it is
    ``remove``d either way (the long polls of KV watches and federation links)."""
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    add(wake)
    try:
        await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        pass
    finally:
        remove(wake)


def read_buckets(storage: Storage, snap: Snapshot) -> dict[str, list[Revision]]:
    """Every stored revision of the buckets in ``snap``, as the index reads it (on the
    writer's thread, before the core takes the snapshot, so its index is whole before
    any write reaches it). Values are read a page (STORAGE_READ_BYTES) at a time and
    left out: only the index's part of each revision is kept until it is indexed."""
    out: dict[str, list[Revision]] = {}
    for rec in snap.channels:
        if not is_kv(rec.name):
            continue
        revisions = out[rec.name] = []
        keys: dict[str, str] = {}
        seq = rec.first_seq
        while seq < rec.next_seq:
            page = storage.read_range(rec.name, seq, rec.next_seq, STORAGE_READ_PAGE,
                                      STORAGE_READ_BYTES)
            if not page:
                break
            revisions += [revision_of(msg, keys) for msg in page]
            seq = page[-1].seq + 1
    return out


OPERATIONS = {"kv.buckets": kv_buckets, "kv.get": kv_get, "kv.keys": kv_keys,
              "kv.history": kv_history, "kv.read": kv_read}
