"""Request/reply on the client: ``Client.request`` and ``Client.serve`` (docs/requests.md).

A requester listens on an inbox of its own (one per client object: processes that
share a client id never take each other's replies), publishes the request with the
inbox and a correlation id in its headers and a TTL of its timeout (a request nobody
took in time expires instead of being served late), and waits for the reply with that
id. A responder consumes the request channel in a competing group, runs the handler,
publishes its return value (or its error) to the inbox, and acks the request only once
the broker confirmed the reply: a responder that dies in between leaves the request to
be delivered again. The broker stores a reply once per request (its dedup key), and
marks a request delivered again after its reply was stored (``x-replied``): with
``idempotent=True`` the handler does not run a second time.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import MinouError, ResponderError, Timeout
from ..limits import MAX_REQUEST_TIMEOUT_S
from ..names import (
    CORRELATION_ID,
    REPLIED,
    REPLY_ERROR,
    REPLY_TO,
    REPLY_TOKEN,
    REQUEST_ID,
    inbox_of,
)
from .message import Message

if TYPE_CHECKING:
    from .aio import Client, Subscription

log = logging.getLogger("minou.client")
RequestHandler = Callable[[Message], Awaitable[Any] | Any]


class Requester:
    """One client's inbox and the requests waiting on it."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.inbox = inbox_of(client.client_id, uuid.uuid4().hex[:12])
        self._sub: Subscription | None = None
        self._opening = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[Message]] = {}

    async def _listening(self) -> None:
        if self._sub is not None:
            return
        async with self._opening:
            if self._sub is None:
                # A durable listener: replies that arrive while the connection is down
                # wait for it (the inbox's own options bound them: TTL, max_items).
                self._sub = await self.client.listen(self.inbox, self._on_reply, start="new")

    def _on_reply(self, msg: Message) -> None:
        fut = self._waiting.pop((msg.headers or {}).get(CORRELATION_ID, ""), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)
        msg.ack()  # a late reply (its request timed out) is dropped too

    async def request(self, channel: str, payload: Any, *, timeout: float,
                      headers: dict[str, str] | None = None) -> Any:
        if not 0 < timeout <= MAX_REQUEST_TIMEOUT_S:
            raise ValueError(f"timeout must be > 0 and <= {MAX_REQUEST_TIMEOUT_S:g} s, "
                             f"not {timeout!r}")
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        correlation = uuid.uuid4().hex
        self._waiting[correlation] = fut
        try:
            async with asyncio.timeout(timeout):
                await self._listening()
                await self.client.send(channel, payload, ttl=timeout, headers={
                    **(headers or {}), REPLY_TO: self.inbox, CORRELATION_ID: correlation})
                reply = await fut
        except TimeoutError as exc:
            if isinstance(exc, Timeout):
                raise
            raise Timeout(f"no reply to the request on {channel!r} within {timeout:g} s "
                          "(it expires unserved after that long)") from None
        finally:
            self._waiting.pop(correlation, None)
        failure = (reply.headers or {}).get(REPLY_ERROR)
        if failure is not None:
            body = reply.payload
            text = body.get("error") if isinstance(body, dict) else None
            raise ResponderError(f"the responder failed on {channel!r}: {failure}: {text}",
                                 type=failure, channel=channel)
        return reply.payload


async def serve_each(sub: Subscription, respond: Callable[[Message], Awaitable[None]]
                     ) -> None:
    """Answer each request of ``sub`` in a task of its own: as many at once as the
    broker hands out (the subscription's prefetch bounds them)."""
    running: set[asyncio.Task[None]] = set()
    try:
        async for msg in sub:
            task = asyncio.create_task(respond(msg))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()


def make_responder(client: Client, handler: RequestHandler, *,
                   idempotent: bool) -> Callable[[Message], Awaitable[None]]:
    """The consume handler that answers each request with ``handler``'s result."""

    async def respond(msg: Message) -> None:
        headers = msg.headers or {}
        reply_to, correlation = headers.get(REPLY_TO), headers.get(CORRELATION_ID)
        if not reply_to or not correlation:
            log.warning("message %s on %s is no request (no %s): acked, not answered",
                        msg.id, msg.channel, REPLY_TO)
            msg.ack()
            return
        if idempotent and headers.get(REPLIED):
            msg.ack()  # answered before: only the ack was lost
            return
        extra: dict[str, str] = {}
        try:
            result = handler(msg)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the requester gets it as ResponderError
            log.warning("request handler failed on %s: %r", msg.channel, exc)
            result = {"error": str(exc) or type(exc).__name__}
            extra[REPLY_ERROR] = type(exc).__name__
        try:
            await client.send(reply_to, result, headers={
                CORRELATION_ID: correlation, REQUEST_ID: msg.id,
                REPLY_TOKEN: headers.get(REPLY_TOKEN, ""), **extra})
        except MinouError as exc:
            # Not answered: the request goes back (nack) or comes again after the
            # lease (the connection is gone); another responder may answer it.
            log.warning("the reply to request %s was not stored: %s", msg.id, exc)
            msg.nack(front=False)
            return
        msg.ack()

    return respond
