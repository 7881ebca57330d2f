"""``POST /v1/request/{endpoint}/{version}/{id}``: a request over HTTP, answered with
the reply's body (docs/requests.md).

The broker is the requester here: the request names the caller's HTTP inbox
(``_inbox/v1/<client>!http``) and a fresh correlation id, and the engine calls back
when a reply with that id is committed to that inbox (``Engine.reply_waiters``); no
listener is needed, and replies nobody waits for any more expire with the inbox's TTL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.responses import Response

from ..core.log import Msg
from ..core.session import Session
from ..errors import BadRequest, ReplyTimeout, RequestError, ResponderError, error_from_code
from ..limits import DEFAULT_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S
from ..names import CORRELATION_ID, REPLY_ERROR, REPLY_TO, inbox_of
from ..protocol.frames import Outcome, Send

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server

HTTP_INBOX = "http"  # the instance part of the inbox HTTP requests are answered on


def request_timeout(raw: str | None) -> float:
    """``?timeout=`` in seconds: the default, or a number in (0, MAX_REQUEST_TIMEOUT_S]."""
    if raw is None or raw == "":
        return DEFAULT_REQUEST_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_REQUEST_TIMEOUT_S:  # NaN fails this too
        raise BadRequest(f"timeout must be a number of seconds > 0 and <= "
                         f"{MAX_REQUEST_TIMEOUT_S:g}, not {raw!r}")
    return value


async def ask(server: Server, identity: Identity, channel: str, data: bytes,
              headers: Iterable[tuple[str, str]], timeout: float) -> Response:
    """Publish the request, wait for its reply, answer with the reply's body."""
    if server.spread is not None:
        raise BadRequest("HTTP requests need [storage] placement = \"primary\" (with queues "
                         "spread over brokers the reply may commit on another one); use "
                         "the native client's request()")
    engine = server.engine
    inbox = inbox_of(identity.client_id, HTTP_INBOX)
    correlation = uuid.uuid4().hex
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Msg] = loop.create_future()
    key = (inbox, correlation)

    def replied(msg: Msg) -> None:
        if not fut.done():
            fut.set_result(msg)

    def published(outcomes: list[Outcome], failure: RequestError | None) -> None:
        out = outcomes[0]
        if out.code and not fut.done():
            fut.set_exception(failure if failure is not None else
                              error_from_code(out.code, out.error, {"channel": out.channel}))

    send = Send(channel, data, False, {**dict(headers), REPLY_TO: inbox,
                                       CORRELATION_ID: correlation}, 0, timeout)
    session = Session(identity.client_id, access=server.access_for(identity),
                      admin=identity.admin)
    engine.reply_waiters[key] = replied
    try:
        engine.publish([send], session.access, published, session=session)
        async with asyncio.timeout(timeout):
            reply = await fut
    except TimeoutError:
        raise ReplyTimeout(f"no reply to the request on {channel!r} within {timeout:g} s "
                           "(it expires unserved after that long)", channel=channel,
                           timeout=timeout) from None
    finally:
        engine.reply_waiters.pop(key, None)
    reply_headers = reply.headers or {}
    failure = reply_headers.get(REPLY_ERROR)
    if failure is not None:
        raise ResponderError(f"the responder failed on {channel!r}: {failure}",
                             type=failure, channel=channel,
                             reply=reply.data.decode("utf-8", "replace")[:1000])
    return Response(reply.data, status_code=200,
                    media_type="application/octet-stream" if reply.raw else "application/json",
                    headers={"x-minou-correlation-id": correlation, "x-minou-reply-id": reply.id})
