"""A blocking facade over the asyncio client, for scripts.

The asyncio client runs on its own event loop in a daemon thread; every call
here submits a coroutine to it and waits for the result. No call waits forever:
``send`` within ``confirm_timeout``, acks and requests within ``request_timeout``
(both 30 s), ``get`` within the timeout given; past them ``minou.Timeout``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

from ..errors import ConnectionClosed, Timeout
from .aio import Client, Subscription, connect
from .kv import Entry, KeyValue, PersistentObject
from .message import Message, Receipt
from .peers import Peer

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self.stopped = False
        self.thread = threading.Thread(target=self.loop.run_forever, name="minou-client",
                                       daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if self.stopped or os.getpid() != self.pid:
            coro.close()  # never run: no "was never awaited" warning either
            if self.stopped:
                raise ConnectionClosed("client closed")
            # The loop's thread and the connection stay in the parent: a call here would
            # wait for a thread this process does not have.
            raise ConnectionClosed(
                f"this client was connected in process {self.pid}, and this is process "
                f"{os.getpid()} (after os.fork()): connect again in this process")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.stopped = True
        if os.getpid() != self.pid:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()


class SyncMessage:
    """A delivered message; ``ack``/``nack``/``extend`` block until the broker has it."""

    def __init__(self, runner: _LoopThread, msg: Message) -> None:
        self._runner = runner
        self._msg = msg

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name)

    @property
    def payload(self) -> Any:
        return self._msg.payload

    def _settle(self, op: str, **kw: Any) -> bool:
        timeout = self._msg._client.request_timeout

        async def run() -> bool:
            # Bounded like every call: no answer within request_timeout is "not known
            # to be durable" (False), as a lost connection is; the message may come again.
            try:
                return await asyncio.wait_for(_awaited(getattr(self._msg, op)(**kw)), timeout)
            except TimeoutError:
                return False

        return self._runner.call(run())

    def ack(self) -> bool:
        return self._settle("ack")

    def nack(self, *, delay: float = 0.0, front: bool = True) -> bool:
        return self._settle("nack", delay=delay, front=front)

    def extend(self, seconds: float) -> bool:
        return self._settle("extend", seconds=seconds)

    def __repr__(self) -> str:
        return repr(self._msg)


async def _awaited(settlement: Any) -> bool:
    return bool(await settlement)


class SyncSubscription:
    def __init__(self, runner: _LoopThread, sub: Subscription) -> None:
        self._runner = runner
        self._sub = sub

    def get(self, timeout: float | None = None) -> SyncMessage:
        """The next message; raises minou.Timeout after ``timeout`` seconds."""
        return SyncMessage(self._runner, self._runner.call(self._sub.get(timeout)))

    def __iter__(self) -> Iterator[SyncMessage]:
        while True:
            try:
                yield self.get()
            except ConnectionClosed:
                return

    def iter(self, timeout: float) -> Iterator[SyncMessage]:
        """Iterate until no message arrives for ``timeout`` seconds."""
        while True:
            try:
                yield self.get(timeout)
            except (Timeout, ConnectionClosed):
                return

    def add_id(self, ident: str) -> None:
        self._runner.call(self._sub.add_id(ident))

    def remove_id(self, ident: str) -> None:
        self._runner.call(self._sub.remove_id(ident))

    def close(self) -> None:
        self._runner.call(self._sub.close())


class SyncPeer:
    """One side of a peer channel (``Client.peer``), blocking."""

    def __init__(self, runner: _LoopThread, peer: Peer) -> None:
        self._runner = runner
        self._peer = peer

    def send(self, payload: Any, **kw: Any) -> Receipt:
        return self._runner.call(self._peer.send(payload, **kw))

    def get(self, timeout: float | None = None) -> SyncMessage:
        """The next message from the other side (acking the one before)."""
        return SyncMessage(self._runner, self._runner.call(self._peer.get(timeout)))

    def close(self) -> None:
        self._runner.call(self._peer.close())


class SyncKeyValue:
    """A bucket, blocking (``Client.kv``): the same calls, each waiting for its answer."""

    def __init__(self, runner: _LoopThread, kv: KeyValue) -> None:
        self._runner = runner
        self._kv = kv
        self.bucket = kv.bucket

    def put(self, key: str, value: Any, **kw: Any) -> int:
        return self._runner.call(self._kv.put(key, value, **kw))

    def create(self, key: str, value: Any) -> int:
        return self._runner.call(self._kv.create(key, value))

    def get(self, key: str, **kw: Any) -> Entry | None:
        return self._runner.call(self._kv.get(key, **kw))

    def delete(self, key: str, **kw: Any) -> int:
        return self._runner.call(self._kv.delete(key, **kw))

    def keys(self, prefix: str = "") -> list[str]:
        return self._runner.call(self._kv.keys(prefix))

    def history(self, key: str) -> list[Entry]:
        return self._runner.call(self._kv.history(key))

    def items(self, prefix: str = "") -> dict[str, Entry]:
        return self._runner.call(self._kv.items(prefix))

    def watch(self, prefix: str = "", *, initial: bool = True) -> Iterator[Entry]:
        """The current values, then each change as it comes (blocks between them)."""
        watch = self._kv.watch(prefix, initial=initial)
        while True:
            try:
                yield self._runner.call(watch.__anext__())
            except StopAsyncIteration:
                return


class SyncPersistentObject:
    """``Client.persist``, blocking: fields read and set as attributes."""

    def __init__(self, runner: _LoopThread, obj: PersistentObject) -> None:
        object.__setattr__(self, "_runner", runner)
        object.__setattr__(self, "_obj", obj)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._obj, name, value)

    def load(self) -> SyncPersistentObject:
        self._runner.call(self._obj.load())
        return self

    def save(self, *, check: bool = False) -> list[str]:
        return self._runner.call(self._obj.save(check=check))

    def __repr__(self) -> str:
        return repr(self._obj)


class SyncClient:
    """Blocking client: ``with minou.connect_sync("minou://127.0.0.1:7700") as c: ...``"""

    def __init__(self, urls: str | list[str], **kw: Any) -> None:
        self._runner = _LoopThread()
        try:
            self._client: Client = self._runner.call(connect(urls, **kw))
        except BaseException:
            self._runner.stop()
            raise

    @property
    def client_id(self) -> str:
        return self._client.client_id

    def send(self, channel: str, payload: Any, **kw: Any) -> Receipt:
        """Publish and wait until the message is durable."""

        async def run() -> Receipt:
            return await self._client.send(channel, payload, **kw)

        return self._runner.call(run())

    def send_many(self, items: Iterable[tuple[str, Any] | dict[str, Any]]) -> list[Receipt]:
        return self._runner.call(self._client.send_many(list(items)))

    def listen(self, pattern: str | list[str], **kw: Any) -> SyncSubscription:
        return SyncSubscription(self._runner, self._runner.call(self._client.listen(pattern, **kw)))

    def consume(self, pattern: str | list[str], **kw: Any) -> SyncSubscription:
        return SyncSubscription(self._runner,
                                self._runner.call(self._client.consume(pattern, **kw)))

    def request(self, channel: str, payload: Any, **kw: Any) -> Any:
        """Send a request and wait for the reply's payload (``Client.request``)."""
        return self._runner.call(self._client.request(channel, payload, **kw))

    def serve(self, pattern: str | list[str], handler: Callable[[SyncMessage], Any],
              **kw: Any) -> SyncSubscription:
        """Answer requests with ``handler`` (``Client.serve``); it runs on worker
        threads (up to ``prefetch`` requests at once), so it may block."""

        async def run(msg: Message) -> Any:
            return await asyncio.to_thread(handler, SyncMessage(self._runner, msg))

        return SyncSubscription(self._runner,
                                self._runner.call(self._client.serve(pattern, run, **kw)))

    def peer(self, channel: str, *, role: str, **kw: Any) -> SyncPeer:
        """Take a role of a peer channel (``Client.peer``)."""
        return SyncPeer(self._runner, self._runner.call(self._client.peer(channel, role=role,
                                                                          **kw)))

    def kv(self, bucket: str) -> SyncKeyValue:
        """Bucket ``bucket`` (``Client.kv``)."""
        return SyncKeyValue(self._runner, self._client.kv(bucket))

    def persist(self, name: str, fields: Iterable[str]) -> SyncPersistentObject:
        """A persistent object, loaded (``Client.persist``)."""
        return SyncPersistentObject(self._runner,
                                    self._runner.call(self._client.persist(name, fields)))

    def read(self, channel: str, from_seq: int = 1, **kw: Any) -> tuple[list[Message], int]:
        return self._runner.call(self._client.read(channel, from_seq, **kw))

    def issue_credential(self, ttl: float | None = None, purpose: str = "") -> dict[str, Any]:
        kw: dict[str, Any] = {"purpose": purpose} if ttl is None else \
            {"ttl": ttl, "purpose": purpose}
        return self._runner.call(self._client.issue_credential(**kw))

    def renew_credential(self, credential_id: str, ttl: float | None = None
                         ) -> dict[str, Any]:
        kw: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
        return self._runner.call(self._client.renew_credential(credential_id, **kw))

    def revoke_credential(self, credential_id: str) -> dict[str, Any]:
        return self._runner.call(self._client.revoke_credential(credential_id))

    def admin(self, op: str, **args: Any) -> Any:
        return self._runner.call(self._client.admin(op, **args))

    def read_page(self, channel: str, from_seq: int = 1, **kw: Any) -> Any:
        return self._runner.call(self._client.read_page(channel, from_seq, **kw))

    def stage(self, txn: str, items: Iterable[tuple[str, Any] | dict[str, Any]]) -> int:
        return self._runner.call(self._client.stage(txn, list(items)))

    def commit_transactions(self, writer_id: str, batch_id: int,
                            txns: list[str], lineage: str = "",
                            after: int = -1) -> dict[str, Any]:
        return self._runner.call(self._client.commit_transactions(writer_id, batch_id, txns,
                                                                  lineage, after))

    def abort_transactions(self, txns: list[str]) -> int:
        return self._runner.call(self._client.abort_transactions(txns))

    def offsets(self, patterns: str | list[str]) -> dict[str, tuple[int, int]]:
        return self._runner.call(self._client.offsets(patterns))

    def offsets_at(self, patterns: str | list[str], at: float,
                   ) -> dict[str, tuple[int, int, int]]:
        return self._runner.call(self._client.offsets_at(patterns, at))

    def set_position(self, group: str, positions: dict[str, int]) -> dict[str, int]:
        return self._runner.call(self._client.set_position(group, positions))

    def close(self) -> None:
        """Close; again, or in a process forked after connecting, it does nothing."""
        runner = self._runner
        if runner.stopped or os.getpid() != runner.pid:
            runner.stopped = True
            return
        try:
            runner.call(self._client.close(), timeout=10)
        finally:
            runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_sync(urls: str | list[str] = "minou://127.0.0.1:7700", **kw: Any) -> SyncClient:
    """Blocking twin of ``minou.connect``."""
    return SyncClient(urls, **kw)
