"""What the client hands to the application: delivered messages and receipts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import ConnectionClosed, ErrorCode, error_from_code

if TYPE_CHECKING:
    from .aio import Client

_json_decode = msgspec.json.decode


class Receipt(msgspec.Struct, frozen=True, gc=False):
    """A confirmed publish: durable on the broker."""

    channel: str
    seq: int
    id: str
    duplicate: bool = False
    fanout: int = 1


# Storage refusals that leave a settlement undone for now, not wrong: a full disk, or a
# Redis that fails over (a replica short, the primary gone). The delivery stays out
# and comes again, as after a lost connection; raising would end a consumer's loop over
# what the broker rides out by itself.
_NOT_DURABLE = frozenset({ErrorCode.STORAGE_FULL, ErrorCode.STORAGE_UNAVAILABLE})


class Settlement:
    """Awaitable result of ack/nack: resolves once the broker has made it durable.

    Not awaiting it is fine (fire and forget). Awaiting returns True once the
    broker has made it durable, False if it was not (the connection was lost
    first, or the broker's storage is full or unreachable for the moment: the
    message may come again), and raises UnknownDelivery if the broker refused the
    tag (stale lease, already settled).
    """

    __slots__ = ("_fut", "_tag")

    def __init__(
        self, fut: asyncio.Future[list[tuple[int, int, str]] | None] | None, tag: int
    ) -> None:
        self._fut = fut
        self._tag = tag

    def __await__(self) -> Generator[Any, None, bool]:
        if self._fut is None:
            return False
        # Shielded: the future is shared by every ack of one frame, so one caller's
        # timeout must not cancel the others' answer.
        failed = yield from asyncio.shield(self._fut).__await__()
        if failed is None:
            return False  # the connection was lost before the broker answered
        for tag, code, text in failed:
            if tag == self._tag:
                if code in _NOT_DURABLE:
                    return False  # not durable: the broker may deliver it again
                raise error_from_code(code, text, {"tag": tag})
        return True


class Message:
    """A delivery. Settle it with ``ack()``, ``nack()``; ``extend()`` its lease.

    Its fields are read from the delivery as decoded (a consumer reads ~200,000 a
    second: copying eleven of them into each message was a sixth of the client's
    time per message)."""

    __slots__ = ("_client", "_d", "_epoch", "_headers", "_payload", "sid")

    def __init__(self, client: Client, epoch: int, sid: int, d: Any) -> None:
        self._client = client
        self._epoch = epoch
        self.sid = sid
        self._d = d  # a protocol Delivery (frozen)
        self._headers: dict[str, str] | None = None
        self._payload: Any = _UNSET

    tag: int = property(attrgetter("_d.tag"))  # type: ignore[assignment]
    channel: str = property(attrgetter("_d.channel"))  # type: ignore[assignment]
    seq: int = property(attrgetter("_d.seq"))  # type: ignore[assignment]
    id: str = property(attrgetter("_d.id"))  # type: ignore[assignment]
    data: bytes = property(attrgetter("_d.data"))  # type: ignore[assignment]
    raw: bool = property(attrgetter("_d.raw"))  # type: ignore[assignment]
    attempts: int = property(attrgetter("_d.attempts"))  # type: ignore[assignment]
    published_at: float = property(attrgetter("_d.published_at"))  # type: ignore[assignment]
    priority: int = property(attrgetter("_d.priority"))  # type: ignore[assignment]
    key: str | None = property(attrgetter("_d.key"))  # type: ignore[assignment]

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers ({} when it has none; the same dict at each read)."""
        headers = self._headers
        if headers is None:
            headers = self._headers = self._d.headers or {}
        return headers

    @property
    def payload(self) -> Any:
        """The JSON value (decoded on first use), or the bytes of a raw message."""
        if self._payload is _UNSET:
            self._payload = self.data if self.raw else _json_decode(self.data)
        return self._payload

    def ack(self) -> Settlement:
        return self._client._settle(self, "ack")

    def nack(self, *, delay: float = 0.0, front: bool = True) -> Settlement:
        """Return the message: to the front (retry now), the back, or after ``delay`` s."""
        return self._client._settle(self, "nack", delay=delay, front=front)

    def extend(self, seconds: float) -> Settlement:
        """Extend this delivery's lease to ``seconds`` from now."""
        return self._client._settle(self, "extend", seconds=seconds)

    def __repr__(self) -> str:
        return f"<Message {self.channel} seq={self.seq} attempts={self.attempts}>"


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


async def until_closed(get: Callable[[], Awaitable[Message]]) -> AsyncIterator[Message]:
    """Iterate ``get()`` until the subscription (or the client) is closed."""
    while True:
        try:
            yield await get()
        except ConnectionClosed:
            return
