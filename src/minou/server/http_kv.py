"""The HTTP routes of key-value buckets (docs/kv.md, docs/http.md "Key-value buckets").

``GET /v1/kv`` lists the buckets, ``GET /v1/kv/{bucket}`` a bucket's keys,
``GET|PUT|DELETE /v1/kv/{bucket}/{key}`` one key (its revision in ``ETag``; a write with
``If-Match: "<revision>"`` is a compare-and-set, ``If-None-Match: *`` a create), and
``GET /v1/kv-watch/{bucket}`` the changes after a revision, as a long poll. Reads are
the broker operations of ``server/kv.py``; writes are publishes, checked by the core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import BadRequest, RequestError
from ..limits import MAX_DELAY_S
from ..names import KV_DELETE, KV_EXPECT, KV_OP, kv_bucket, kv_channel, validate_kv_key
from ..protocol.frames import Outcome, Send

if TYPE_CHECKING:
    from ..auth.registry import Identity

Answer = Callable[[int, Any], None]
Refuse = Callable[[RequestError], None]
_TRUE = ("1", "true", "yes")


def expected_revision(if_match: str | None, if_none_match: str | None) -> int | None:
    """The revision a write expects from its ``If-Match`` (``"7"`` or ``7``) or
    ``If-None-Match: *`` (0: the key has no value); None: an unconditional write."""
    if if_match is not None and if_none_match is not None:
        raise BadRequest("give If-Match or If-None-Match, not both")
    if if_none_match is not None:
        if if_none_match.strip() != "*":
            raise BadRequest('If-None-Match takes "*" only (create: the key has no value)')
        return 0
    if if_match is None:
        return None
    text = if_match.strip()
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        text = text[1:-1]
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise BadRequest(f"If-Match takes one revision, e.g. \"7\" (the ETag of a GET), "
                         f"not {if_match[:40]!r}")
    return int(text)


class HttpKv:
    def __init__(self, api: Any, json: Callable[..., Response]) -> None:
        # ``api``: the http_api.HttpApi these routes belong to (its guard, body limits,
        # admin operations and publishing), not imported: it imports this module.
        self.api = api
        self.json = json  # http_api.json_response, the one JSON writer of the HTTP API

    def routes(self) -> list[BaseRoute]:
        g = self.api.guard
        key = "/v1/kv/{bucket}/{key:path}"
        return [
            Route("/v1/kv", g(self.buckets), methods=["GET"]),
            Route("/v1/kv/{bucket}", g(self.keys), methods=["GET"]),
            Route(key, g(self.get), methods=["GET"]),
            Route(key, g(self.put), methods=["PUT"]),
            Route(key, g(self.delete), methods=["DELETE"]),
            Route("/v1/kv-watch/{bucket}", g(self.watch), methods=["GET"]),
        ]

    async def buckets(self, request: Request, identity: Identity) -> Response:
        q = request.query_params  # a page (core/paging.py)
        args = {k: q[k] for k in ("after", "limit") if k in q}
        return self.json(await self.api.admin_op("kv.buckets", args, identity))

    async def keys(self, request: Request, identity: Identity) -> Response:
        q = request.query_params
        args = {"bucket": request.path_params["bucket"], "prefix": q.get("prefix", ""),
                "after": q.get("after", "")}
        if "limit" in q:
            args["limit"] = q["limit"]
        return self.json(await self.api.admin_op("kv.keys", args, identity))

    async def get(self, request: Request, identity: Identity) -> Response:
        p, q = request.path_params, request.query_params
        args: dict[str, Any] = {"bucket": p["bucket"], "key": p["key"]}
        if q.get("history", "").lower() in _TRUE:  # a page of them: after=, limit=
            for name in ("after", "limit"):
                if name in q:
                    args[name] = q[name]
            return self.json(await self.api.admin_op("kv.history", args, identity))
        if q.get("revision"):
            args["revision"] = q["revision"]
        entry = await self.api.admin_op("kv.get", args, identity)
        response = self.json(entry)
        response.headers["etag"] = f'"{entry["revision"]}"'
        return response

    async def put(self, request: Request, identity: Identity) -> Response:
        body = await self.api.body(request, one_message=True)
        if not body:
            raise BadRequest("give the value as a JSON body")
        ttl = request.query_params.get("ttl")
        try:
            seconds = float(ttl) if ttl else None
        except ValueError:
            seconds = float("nan")
        if seconds is not None and not 0 < seconds <= MAX_DELAY_S:  # NaN fails this too
            raise BadRequest(f"ttl must be a number of seconds > 0 and <= {MAX_DELAY_S:g}, "
                             f"not {str(ttl)[:40]!r}")
        return await self._write(request, identity, body, {}, seconds)

    async def delete(self, request: Request, identity: Identity) -> Response:
        return await self._write(request, identity, b"null", {KV_OP: KV_DELETE}, None)

    async def _write(self, request: Request, identity: Identity, data: bytes,
                     headers: dict[str, str], ttl: float | None) -> Response:
        p = request.path_params
        channel = kv_channel(p["bucket"])
        key = validate_kv_key(p["key"])
        expect = expected_revision(request.headers.get("if-match"),
                                   request.headers.get("if-none-match"))
        if expect is not None:
            headers[KV_EXPECT] = str(expect)
        send = Send(channel, data, False, headers or None, 0, ttl, None, None, key)
        stored: list[int] = []
        response = await self.api.answered(partial(self._publish, identity, send, stored))
        response.headers["etag"] = f'"{stored[0]}"'
        return response

    def _publish(self, identity: Identity, send: Send, stored: list[int], answer: Answer,
                 refuse: Refuse) -> None:
        def done(out: Outcome) -> None:
            stored.append(out.seq)
            answer(200, {"bucket": kv_bucket(send.channel), "key": send.key,
                         "revision": out.seq})

        self.api.publish_send(identity, send, done, refuse)

    async def watch(self, request: Request, identity: Identity) -> Response:
        q = request.query_params
        args: dict[str, Any] = {"bucket": request.path_params["bucket"],
                                "prefix": q.get("prefix", ""),
                                "latest": q.get("latest", "").lower() in _TRUE}
        for name in ("after", "wait", "limit"):
            if name in q:
                args[name] = q[name]
        answer = await while_connected(request, self.api.admin_op("kv.read", args, identity))
        return Response(status_code=204) if answer is None else self.json(answer)


async def while_connected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s answer, or None once the client disconnected: then it is cancelled.
    uvicorn does not cancel a request whose client left: a long poll (a KV watch) held
    its client's slot (MAX_LONG_POLLS_PER_CLIENT) until it timed out."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():  # the client left (or this request is cancelled): give up
            task.cancel()
    return task.result() if task.done() else None


async def disconnected(request: Request) -> None:
    """Returns once the client of ``request`` (read whole) has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass

