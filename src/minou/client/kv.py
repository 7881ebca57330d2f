"""Key-value buckets and persistent objects for the asyncio client (docs/kv.md).

``client.kv("config")`` is a ``KeyValue``: ``put`` publishes to the bucket's channel
with the key as the message key (a compare-and-set carries the expected revision in
a header), the reads are broker operations checked against the caller's read rules.
``watch`` is an async iterator: the current values first, then every change, over
long polls that survive reconnects. ``client.persist(name, fields)`` is a
``PersistentObject`` on bucket ``name``, one key per field.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from ..errors import ConnectionClosed, RevisionMismatch, Standby, StorageUnavailable, Timeout
from ..limits import MAX_KV_WAIT_S
from ..names import KV_DELETE, KV_EXPECT, KV_OP, kv_channel, validate_kv_key

if TYPE_CHECKING:
    from .aio import Client

WATCH_POLL_S = min(25.0, MAX_KV_WAIT_S)  # each long poll waits this long at most
WATCH_RETRY_S = 0.5  # after a lost connection, before the next poll


class Entry(NamedTuple):
    """One revision of a key: ``op`` is ``"put"`` or ``"del"`` (then ``value`` is None)."""

    key: str
    value: Any
    revision: int
    op: str = "put"
    created: float = 0.0
    expires_at: float | None = None

    @property
    def deleted(self) -> bool:
        return self.op == "del"


def _entry(view: dict[str, Any]) -> Entry:
    value = view.get("value")
    if view.get("value_base64") is not None:
        value = base64.b64decode(view["value_base64"])
    return Entry(view["key"], value, view["revision"], view["op"], view["created"],
                 view.get("expires_at"))


def _missing(exc: Exception) -> bool:
    from ..errors import NotFound

    return isinstance(exc, NotFound)


class KeyValue:
    """A bucket: values by key, each write a new revision (its message's seq)."""

    def __init__(self, client: Client, bucket: str) -> None:
        self.client = client
        self.bucket = bucket
        self.channel = kv_channel(bucket)

    async def put(self, key: str, value: Any, *, revision: int | None = None,
                  ttl: float | None = None) -> int:
        """Store ``value`` (any JSON value, or bytes) under ``key``; return its revision.
        With ``revision``, only if the key is still at that revision (0: has no value),
        else ``RevisionMismatch``. ``ttl``: the value expires after that many seconds
        (default: the bucket's ttl)."""
        validate_kv_key(key)
        headers = {KV_EXPECT: str(revision)} if revision is not None else None
        receipt = await self.client.send(self.channel, value, key=key, headers=headers,
                                         ttl=ttl)
        return receipt.seq

    async def create(self, key: str, value: Any) -> int:
        """``put`` only if ``key`` has no value (``RevisionMismatch`` otherwise)."""
        return await self.put(key, value, revision=0)

    async def delete(self, key: str, *, revision: int | None = None) -> int:
        """Delete ``key`` (its history stays, ending with the delete); return the
        delete's revision. ``revision``: only if the key is still at it."""
        validate_kv_key(key)
        headers = {KV_OP: KV_DELETE}
        if revision is not None:
            headers[KV_EXPECT] = str(revision)
        receipt = await self.client.send(self.channel, None, key=key, headers=headers)
        return receipt.seq

    async def get(self, key: str, *, revision: int | None = None) -> Entry | None:
        """The key's value and revision, or None when it has none (never set, deleted,
        expired). ``revision``: that stored revision of it instead (a delete too)."""
        args: dict[str, Any] = {"bucket": self.bucket, "key": key}
        if revision:
            args["revision"] = revision
        try:
            return _entry(await self.client.admin("kv.get", **args))
        except Exception as exc:
            if _missing(exc):
                return None
            raise

    async def keys(self, prefix: str = "") -> list[str]:
        """Every key with a value, starting with ``prefix``, sorted."""
        out: list[str] = []
        after = ""
        while True:
            page = await self.client.admin("kv.keys", bucket=self.bucket, prefix=prefix,
                                           after=after)
            out += page["keys"]
            if not page["more"] or not page["keys"]:
                return out
            after = page["keys"][-1]

    async def history(self, key: str) -> list[Entry]:
        """Every stored revision of ``key``, oldest first (the bucket keeps ``history``
        of them per key); empty if it has none. Read page by page: the broker answers
        a few MiB of values at a time."""
        out: list[Entry] = []
        after = 0
        while True:
            try:
                res = await self.client.admin("kv.history", bucket=self.bucket, key=key,
                                              after=after)
            except Exception as exc:
                if _missing(exc):  # (a later page: its revisions went meanwhile)
                    return out
                raise
            out += [_entry(e) for e in res["entries"]]
            # A broker before pages answered everything, without "more".
            if not res.get("more") or not res["entries"]:
                return out
            after = res["next"]

    async def items(self, prefix: str = "") -> dict[str, Entry]:
        """The current value of every key starting with ``prefix``."""
        found, _ = await self._snapshot(prefix)
        return {e.key: e for e in found}

    async def _snapshot(self, prefix: str) -> tuple[list[Entry], int]:
        """The current values, read page by page up to the revision of the first page."""
        out: list[Entry] = []
        after, upto = 0, None
        while True:
            res = await self.client.admin("kv.read", bucket=self.bucket, after=after,
                                          prefix=prefix, latest=True)
            if upto is None:
                upto = res["revision"]
            out += [_entry(e) for e in res["entries"] if e["revision"] <= upto]
            after = res["next"]
            if after >= upto:
                return out, upto

    def watch(self, prefix: str = "", *, initial: bool = True) -> Watch:
        """An async iterator of the bucket's changes under ``prefix``: the current
        values first (unless ``initial=False``), then each put and delete as it is
        committed (a delete is an Entry with ``op == "del"``)."""
        return Watch(self, prefix, initial)


class Watch:
    """``async for entry in kv.watch(prefix)``; ``revision`` is the last one seen."""

    def __init__(self, kv: KeyValue, prefix: str, initial: bool) -> None:
        self.kv = kv
        self.prefix = prefix
        self.initial = initial
        self.revision = -1  # not started
        self._queue: list[Entry] = []
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Entry]:
        return self

    async def __anext__(self) -> Entry:
        while not self._queue:
            if self._closed:
                raise StopAsyncIteration
            await self._fill()
        return self._queue.pop(0)

    def close(self) -> None:
        """End the iteration (after the poll in progress, if any)."""
        self._closed = True

    async def _fill(self) -> None:
        client = self.kv.client
        try:
            if self.revision < 0:
                if self.initial:
                    self._queue, self.revision = await self.kv._snapshot(self.prefix)
                else:
                    res = await client.admin("kv.keys", bucket=self.kv.bucket, limit=1)
                    self.revision = res["revision"]
                return
            # Each poll is answered well within the client's request timeout.
            wait = max(0.5, min(WATCH_POLL_S, client.request_timeout * 0.8))
            res = await client.admin("kv.read", bucket=self.kv.bucket, after=self.revision,
                                     prefix=self.prefix, wait=round(wait, 3))
        except (ConnectionClosed, Standby, StorageUnavailable, Timeout):
            if client._closing:
                self._closed = True
                return
            await asyncio.sleep(WATCH_RETRY_S)  # the client reconnects meanwhile
            return
        self._queue = [_entry(e) for e in res["entries"]]
        self.revision = max(self.revision, res["next"])


class PersistentObject:
    """An object whose fields live in bucket ``name``, one key each (busmq's
    ``persistify``). ``save()`` writes only the fields changed since the last
    ``load()`` or ``save()``, so two processes saving different fields both keep
    theirs; ``save(check=True)`` refuses (``RevisionMismatch``) to overwrite a field
    someone else saved since this object loaded it."""

    def __init__(self, client: Client, name: str, fields: Iterable[str]) -> None:
        object.__setattr__(self, "_kv", KeyValue(client, name))
        names = list(dict.fromkeys(fields))
        if not names:
            raise ValueError("a persistent object has at least one field")
        for field in names:
            validate_kv_key(field)
            if field.startswith("_") or field in _RESERVED:
                raise ValueError(f"field {field!r}: fields may not start with '_' nor be "
                                 f"one of {', '.join(sorted(_RESERVED))}")
        object.__setattr__(self, "_fields", names)
        object.__setattr__(self, "_values", dict.fromkeys(names))
        object.__setattr__(self, "_saved", {f: _encode(None) for f in names})
        object.__setattr__(self, "_revisions", dict.fromkeys(names, 0))

    @property
    def name(self) -> str:
        return self._kv.bucket

    @property
    def fields(self) -> list[str]:
        return list(self._fields)

    @property
    def revisions(self) -> dict[str, int]:
        """Each field's revision as last loaded or saved (0: no stored value)."""
        return dict(self._revisions)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} {self.name!r} has no field {name!r} "
                             f"(fields: {', '.join(self._fields)})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"{name!r} is not a field of {self.name!r} "
                                 f"(fields: {', '.join(self._fields)})")
        self._values[name] = value

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def changed(self) -> list[str]:
        """The fields whose value differs from the one last loaded or saved."""
        return [f for f in self._fields if _encode(self._values[f]) != self._saved[f]]

    async def load(self) -> PersistentObject:
        """Read every field's stored value (None for a field never saved)."""
        found = await self._kv.items()
        for field in self._fields:
            entry = found.get(field)
            value = entry.value if entry is not None else None
            self._values[field] = value
            self._saved[field] = _encode(value)
            self._revisions[field] = entry.revision if entry is not None else 0
        return self

    async def save(self, *, check: bool = False) -> list[str]:
        """Write the changed fields; return their names. ``check``: each only if it is
        still at the revision this object last saw (else ``RevisionMismatch``, and the
        fields written before it stay written)."""
        changed = self.changed()
        for field in changed:
            value = self._values[field]
            revision = self._revisions[field] if check else None
            self._revisions[field] = await self._kv.put(field, value, revision=revision)
            self._saved[field] = _encode(value)
        return changed

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={self._values[f]!r}" for f in self._fields)
        return f"PersistentObject({self.name!r}, {shown})"


_RESERVED = frozenset({"name", "fields", "revisions", "as_dict", "changed", "load", "save"})


def _encode(value: Any) -> bytes:
    return msgspec.json.encode(value)


__all__ = ["Entry", "KeyValue", "PersistentObject", "RevisionMismatch", "Watch"]
