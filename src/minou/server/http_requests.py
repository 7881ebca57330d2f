"""``POST /v1/request/{endpoint}/{version}/{id}``: a request over HTTP, answered with
the reply's body (docs/requests.md).

The broker is the requester here: the request names the caller's HTTP inbox
(``_inbox/v1/<client>!http``) and a fresh correlation id, and the engine calls back
when a reply with that id is committed to that inbox (``Engine.reply_waiters``); no
listener is needed, and replies nobody waits for any more expire with the inbox's TTL.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.responses import Response

from ..core.log import Msg
from ..core.session import Session
from ..errors import (
    BadRequest,
    NotAuthorized,
    ReplyTimeout,
    RequestError,
    ResponderError,
    error_from_code,
)
from ..limits import DEFAULT_REQUEST_TIMEOUT_S, MAX_REQUEST_TIMEOUT_S
from ..names import CORRELATION_ID, REPLY_ERROR, REPLY_TO, inbox_of
from ..protocol import frames as f
from ..protocol.frames import Outcome, Send

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server

HTTP_INBOX = "http"  # the instance part of the inbox HTTP requests are answered on
# A request waiting for its reply holds its connection up to MAX_REQUEST_TIMEOUT_S: it is
# one of its client's long polls (server/long_polls.py), else one client whose requests
# nobody answers held every connection the broker has and had every other refused.
WAITING = "HTTP requests"
# Queues spread over brokers: the ADMIN op a broker sends the one holding the inboxes to
# make an HTTP request there (its reply commits there), and how much longer than the
# request's own timeout the asking broker waits for that answer.
REQUEST_OP = "link.request"
LINK_MARGIN_S = 5.0


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
    """Publish the request, wait for its reply, answer with the reply's body. With
    queues spread over brokers the broker owning the inboxes (queue ``_inbox/v1``)
    waits for the reply, since it commits there: another broker asks it to
    (``REQUEST_OP`` over the link) and relays its answer."""
    with server.engine.long_polls.slot(WAITING, identity):
        return await _ask(server, identity, channel, data, headers, timeout)


async def _ask(server: Server, identity: Identity, channel: str, data: bytes,
               headers: Iterable[tuple[str, str]], timeout: float) -> Response:
    spread = server.spread
    if spread is not None:
        front = spread.http_front(identity)
        inbox = inbox_of(identity.client_id, HTTP_INBOX)
        adopting = front.adoption_for(inbox)
        if adopting is not None:  # this broker is to hold the inboxes: once it does
            await adopting
        owner = front.owner_link(inbox)
        if owner is not None:
            reply = await _ask_owner(server, owner, channel, data, dict(headers), timeout)
            return _response(reply)
    return _response(await ask_here(server, identity, channel, data, dict(headers), timeout))


def _response(reply: dict[str, Any]) -> Response:
    return Response(base64.b64decode(reply["data"]), status_code=200,
                    media_type="application/octet-stream" if reply["raw"]
                    else "application/json",
                    headers={"x-minou-correlation-id": reply["correlation"],
                             "x-minou-reply-id": reply["reply_id"]})


async def ask_here(server: Server, identity: Identity, channel: str, data: bytes,
                   headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """The request published (forwarded to its channel's owner if that is another
    broker), its reply awaited on this broker: ``{data (base64), raw, correlation,
    reply_id}``, or NoResponders, ReplyTimeout, ResponderError, any refusal."""
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

    send = Send(channel, data, False, {**headers, REPLY_TO: inbox,
                                       CORRELATION_ID: correlation}, 0, timeout)
    session = Session(identity.client_id, access=server.access_for(identity),
                      admin=identity.admin)
    engine.reply_waiters[key] = replied
    server.http_asks.add(fut)
    try:
        spread = server.spread
        if spread is None or not spread.http_front(identity).publish_sends(
                [send], lambda outcomes: published(outcomes, None), session=session):
            engine.publish([send], session.access, published, session=session)
        async with asyncio.timeout(timeout):
            reply = await fut
    except TimeoutError:
        raise ReplyTimeout(f"no reply to the request on {channel!r} within {timeout:g} s "
                           "(it expires unserved after that long)", channel=channel,
                           timeout=timeout) from None
    finally:
        engine.reply_waiters.pop(key, None)
        server.http_asks.discard(fut)
    reply_headers = reply.headers or {}
    failure = reply_headers.get(REPLY_ERROR)
    if failure is not None:
        raise ResponderError(f"the responder failed on {channel!r}: {failure}",
                             type=failure, channel=channel,
                             reply=reply.data.decode("utf-8", "replace")[:1000])
    return {"data": base64.b64encode(reply.data).decode(), "raw": reply.raw,
            "correlation": correlation, "reply_id": reply.id}


async def _ask_owner(server: Server, owner: Any, channel: str, data: bytes,
                     headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """Have the broker owning the inboxes make the request (``REQUEST_OP``)."""
    answer: asyncio.Future[f.Frame] = asyncio.get_running_loop().create_future()
    server.http_asks.add(answer)  # ended at once if this broker stops meanwhile
    owner.request(f.Admin(0, REQUEST_OP, {
        "channel": channel, "data": base64.b64encode(data).decode(),
        "headers": msgspec.json.encode(headers).decode(), "timeout": timeout}),
        lambda ev: answer.done() or answer.set_result(ev))
    try:
        async with asyncio.timeout(timeout + LINK_MARGIN_S):
            ev = await answer
    except TimeoutError:
        raise ReplyTimeout(f"no reply to the request on {channel!r} within {timeout:g} s "
                           "(the broker holding the inboxes did not answer)",
                           channel=channel, timeout=timeout) from None
    finally:
        server.http_asks.discard(answer)
    if isinstance(ev, f.Error):
        raise error_from_code(ev.code, ev.message, ev.detail)
    assert isinstance(ev, f.Result)
    return ev.value  # type: ignore[no-any-return]


async def request_op(server: Server, args: dict[str, Any], caller: Identity | None
                     ) -> dict[str, Any]:
    """``REQUEST_OP``: another broker of the cluster asks this one, which holds the
    inboxes, to make an HTTP client's request (the link carries that client's identity,
    so its rules apply)."""
    if caller is None or caller.method != "link":
        raise NotAuthorized(f"{REQUEST_OP!r} is for the brokers' own links", op=REQUEST_OP)
    channel, data, headers = args.get("channel"), args.get("data"), args.get("headers")
    timeout = args.get("timeout")
    if not (isinstance(channel, str) and isinstance(data, str) and isinstance(headers, str)
            and isinstance(timeout, int | float)):
        raise BadRequest(f"{REQUEST_OP}: channel, data (base64), headers (JSON), timeout")
    try:
        body = base64.b64decode(data, validate=True)
        extra = msgspec.json.decode(headers, type=dict[str, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise BadRequest(f"{REQUEST_OP}: {exc}") from None
    with server.engine.long_polls.slot(WAITING, caller):  # as on the broker asked first
        return await ask_here(server, caller, channel, body, extra,
                              request_timeout(str(timeout)))
