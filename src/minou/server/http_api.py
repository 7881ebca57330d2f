"""The HTTP API: routes over the same broker core, the same identities and rules.

Every route that shows or changes messages needs ``Authorization: Bearer``
(see ``http_auth``); admin routes need an admin identity. Errors are JSON
``{"error": {"code", "reason", "message", "detail"}}`` with the HTTP status of
the error table, and are counted like native refusals. The OpenAPI document
(``openapi.py``) describes exactly these routes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import inspect
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from ..auth.registry import Identity
from ..core.broker import Session
from ..errors import (
    ERROR_TABLE,
    BadRequest,
    ErrorCode,
    FrameTooLarge,
    InvalidChannel,
    MessageTooLarge,
    NotAuthenticated,
    NotAuthorized,
    RequestError,
    error_from_code,
)
from ..limits import MAX_BATCH_HTTP
from ..limits import MAX_HTTP_WAIT_S as MAX_WAIT_S
from ..names import validate_channel
from ..payloads import check_depth, decode_json, not_utf8, undecodable
from ..protocol.frames import Admin, Delivery, Error, Outcome, Result, Send, json_text_hook
from . import nagios
from .admin import refuse_credential
from .front import MERGED_OPS, OWNER_OPS
from .http_auth import HttpAuth
from .http_consumers import HttpConsumer
from .http_kv import HttpKv, disconnected
from .http_requests import ask, request_timeout
from .kv import KV_OPS
from .wire import http_error, internal_error

if TYPE_CHECKING:
    from .ports import Server

_encode = msgspec.json.encode
_decode = msgspec.json.decode
_encode_answer = msgspec.json.Encoder(enc_hook=json_text_hook).encode  # KV values as stored


class BatchMessage(msgspec.Struct, forbid_unknown_fields=True):
    """One message of ``POST /v1/messages``."""

    channel: str
    payload: Any
    headers: dict[str, str] | None = None
    priority: int = 0
    ttl: float | None = None
    delay: float | None = None
    dedup: str | None = None
    key: str | None = None


# Lenient on numbers: JSON Schema counts 8.0 as an integer, and so does this.
_batch_decode = msgspec.json.Decoder(list[BatchMessage], strict=False).decode
PAGE_QUERY = ("after", "limit")  # an admin listing's page (core/paging.py)
HEADER_PREFIX = "x-minou-header-"
Handler = Callable[[Request], Awaitable[Response]]
# How the message routes answer (both the Starlette routes and the fast path): a status
# and a JSON value, or a refusal that came after the request was taken (its commit
# failed: a full disk). Refusals found at once are raised.
Answer = Callable[[int, Any], None]
Refuse = Callable[[RequestError], None]


def json_response(value: Any, status: int = 200) -> Response:
    return Response(_encode_answer(value), status_code=status, media_type="application/json")


def body_too_large(size: int, limit: int, *, one_message: bool) -> RequestError:
    if one_message:
        return MessageTooLarge(f"message of at least {size} bytes is over the {limit} byte "
                               "limit", limit=limit)
    return FrameTooLarge(f"request body over the {limit} byte limit: send fewer messages "
                         "per request", limit=limit)


def error_response(exc: RequestError) -> Response:
    status, body, headers = http_error(exc)
    response = Response(body, status_code=status, media_type="application/json")
    response.raw_headers.extend(headers)
    return response


class HttpApi:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.core = server.core
        self.engine = server.engine
        self.auth = HttpAuth(server)

    # ------------------------------------------------------------- plumbing
    def guard(self, handler: Callable[[Request, Identity], Awaitable[Response]], *,
              admin: bool = False) -> Handler:
        """Authenticate, authorize, and turn every refusal into a counted JSON error."""

        async def run(request: Request) -> Response:
            try:
                identity = self.auth.identify(request.headers.get("authorization"),
                                              request.query_params.get("access_token"),
                                              request.client)
                if admin and not identity.admin:
                    raise NotAuthorized(
                        f"this route needs an admin identity (auth.admins); "
                        f"{identity.client_id!r} is not one")
                if admin and identity.method == "credential":
                    # An admin's credential says admin (it reads as the admin) but
                    # carries no admin right: not every admin route runs an operation.
                    raise NotAuthorized(
                        "this route needs an admin identity: this request presented a "
                        "delegated credential, which never carries admin rights")
                return await handler(request, identity)
            except RequestError as exc:
                self.count_refusal(exc)
                return error_response(exc)

        return run

    async def committed(self) -> None:
        """Wait until what the request changed is durable (settlements only mark group
        states dirty: those count too); a failed commit (a full disk) raises: a 507."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def failed(exc: RequestError) -> None:
            if not fut.done():
                fut.set_exception(copy.copy(exc))

        self.engine.when_durable(lambda: fut.done() or fut.set_result(None), failed)
        await fut

    async def admin_op(self, op: str, args: dict[str, Any], identity: Identity) -> Any:
        refuse_credential(op, identity)  # before the queue's owner is asked
        spread = self.server.spread
        front = spread.http_front(identity) if spread is not None else None
        if front is not None and op in KV_OPS:
            waiting = front.adopting(Admin(0, op, args))
            if waiting is not None:  # this broker is to hold the bucket: once it does
                await waiting
        if front is not None and op in OWNER_OPS:
            there = front.ask_owner(Admin(0, op, args))
            if there is not None:  # queues spread over brokers: its owner answers
                answer = await there
                if isinstance(answer, Error):
                    raise error_from_code(answer.code, answer.message, answer.detail)
                return answer.value if isinstance(answer, Result) else None
        result = self.server.admin(op, args, identity)
        if inspect.isawaitable(result):
            result = await result
        if op not in KV_OPS:  # those read committed state only
            await self.committed()
        if front is not None and op in MERGED_OPS and not args.get("here"):
            result = await front.ask_everywhere(Admin(0, op, args), result, MERGED_OPS[op])
        return result

    def count_refusal(self, exc: RequestError) -> None:
        if not getattr(exc, "counted", False):
            self.core.counters.refuse(exc.reason)

    # ------------------------------------------------- messages (no I/O: both paths)
    # The Starlette routes below and the protocol's fast path (http_fast) call these;
    # each answers through ``answer`` once what it changed is durable.
    def publish_now(self, identity: Identity, channel: str, q: Mapping[str, str],
                    headers: Iterable[tuple[str, str]], body: bytes, answer: Answer,
                    refuse: Refuse) -> None:
        if "payload" in q:
            data = _encode(q["payload"])
        else:
            data = body
            if not data:
                raise BadRequest("give the message as a JSON body, or a string as ?payload=")
        message_headers = {k[len(HEADER_PREFIX):]: v for k, v in headers
                           if k.startswith(HEADER_PREFIX)} or None
        send = Send(channel, data, False, message_headers, _int(q, "priority", 0),
                    _float(q, "ttl"), _float(q, "delay"), q.get("dedup") or None,
                    q.get("key") or None) if q else Send(channel, data, False, message_headers)

        self.publish_send(identity, send, lambda out: answer(201, {
            "channel": out.channel, "seq": out.seq, "id": out.id,
            "duplicate": out.duplicate, "fanout": out.fanout}), refuse)

    def publish_send(self, identity: Identity, send: Send, stored: Callable[[Outcome], None],
                     refuse: Refuse) -> None:
        """Publish one message for an HTTP request: ``stored`` with its outcome once
        durable, or ``refuse`` with the (counted) error."""
        def published(outcomes: list[Outcome], failure: RequestError | None) -> None:
            out = outcomes[0]
            if out.code:  # the engine counted it
                exc = copy.copy(failure) if failure is not None else \
                    error_from_code(out.code, out.error, {"channel": out.channel})
                exc.counted = True  # type: ignore[attr-defined]
                refuse(exc)
                return
            stored(out)

        if self._forwarded(identity, [send], published):
            return
        # Refused whole while stopping, full or behind (a request cannot be paused).
        self.engine.publish([send], self.server.access_for(identity), published)

    def publish_batch_now(self, identity: Identity, body: bytes, answer: Answer,
                          refuse: Refuse) -> None:
        """Many messages in one request: one outcome each, in order, once all are durable;
        a refused message fails alone (its outcome carries the error)."""
        check_depth(body, what="a message's payload", outer=2)  # [{"payload": ...}]
        try:
            items = _batch_decode(body)
        except msgspec.ValidationError as exc:
            raise BadRequest(f"body must be a JSON array of messages: {exc}") from None
        except msgspec.DecodeError as exc:
            raise undecodable(exc, body, "body", BadRequest) from None
        except UnicodeError as exc:
            raise not_utf8(exc, "body") from None
        if not 1 <= len(items) <= MAX_BATCH_HTTP:
            raise BadRequest(f"send 1..{MAX_BATCH_HTTP} messages per request, not {len(items)}")
        sends = [Send(m.channel, _encode(m.payload), False, m.headers, m.priority, m.ttl,
                      m.delay, m.dedup, m.key) for m in items]

        def published(outcomes: list[Outcome], failure: RequestError | None) -> None:
            out = []
            for o in outcomes:
                if o.code:
                    info = ERROR_TABLE[ErrorCode(o.code)]
                    out.append({"channel": o.channel, "error": {
                        "code": o.code, "reason": info.reason, "message": o.error,
                        "detail": {}}})
                else:
                    out.append({"channel": o.channel, "seq": o.seq, "id": o.id,
                                "duplicate": o.duplicate, "fanout": o.fanout})
            answer(200, {"results": out})

        if self._forwarded(identity, sends, published):
            return
        # The whole request is refused while full: a 507, not 200 with every item refused.
        self.engine.publish(sends, self.server.access_for(identity), published)

    def _forwarded(self, identity: Identity, sends: list[Send],
                   published: Callable[[list[Outcome], RequestError | None], None]) -> bool:
        """Queues spread over brokers: messages for queues owned elsewhere go to their
        owners (front.py); True if that took the publish (``published`` is called)."""
        spread = self.server.spread
        if spread is None:
            return False
        return bool(spread.http_front(identity).publish_sends(
            sends, lambda outcomes: published(outcomes, None)))

    def settle_now(self, identity: Identity, receipt: str, op: str, q: Mapping[str, str],
                   answer: Answer, refuse: Refuse) -> None:
        kw: dict[str, Any] = {}
        if op == "nack":
            kw = {"delay": _float(q, "delay") or 0.0,
                  "front": q.get("front", "true").lower() not in ("false", "0", "no")}
        there = self.server.http_consumers.settle(identity, receipt, op, **kw)
        if there is None:
            self.engine.when_durable(lambda: answer(200, {"receipt": receipt, "settled": op}),
                                     refuse)
            return

        def answered(fut: asyncio.Future[None]) -> None:  # settled on another broker
            exc = fut.exception()
            if isinstance(exc, RequestError):
                refuse(exc)
            elif exc is not None:
                refuse(internal_error(f"{op} failed: {exc}"))
            else:
                answer(200, {"receipt": receipt, "settled": op})

        there.add_done_callback(answered)

    def consumer_for(self, identity: Identity, p: Mapping[str, str], raw_id: str,
                     q: Mapping[str, str], dead: bool) -> tuple[HttpConsumer, float]:
        """The HTTP consumer a consume request waits on, and how long it may wait."""
        pattern = f"{'_dead/' if dead else ''}{p['endpoint']}/{p['version']}/{raw_id}"
        wait = min(_float(q, "wait") or 0.0, MAX_WAIT_S)
        lease = _float(q, "lease")
        consumer = self.server.http_consumers.get(identity, pattern, q.get("group") or None,
                                                  lease)
        return consumer, wait

    @staticmethod
    def delivered(consumer: HttpConsumer, delivery: Delivery | None) -> tuple[int, Any]:
        """200 with the message and its receipt, or 204 (None) if none came."""
        if delivery is None:
            return 204, None
        return 200, delivery_view(delivery, f"{consumer.token}.{delivery.tag}")

    # ------------------------------------------------------- messages (Starlette)
    def body_limit(self, one_message: bool) -> int:
        return self.core.max_message_size if one_message else self.server.max_frame_size

    async def body(self, request: Request, *, one_message: bool = False) -> bytes:
        """The request body, refused as soon as it is over the limit (a message's for
        one message, the frame limit for anything else): no upload can take the
        broker's memory."""
        limit = self.body_limit(one_message)
        chunks = bytearray()
        async for chunk in request.stream():
            chunks += chunk
            if len(chunks) > limit:
                raise body_too_large(len(chunks), limit, one_message=one_message)
        return bytes(chunks)

    @staticmethod
    async def answered(start: Callable[[Answer, Refuse], None]) -> Response:
        """Run a message route (``start(answer, refuse)``) and wait for its answer."""
        fut: asyncio.Future[tuple[int, Any]] = asyncio.get_running_loop().create_future()

        def answer(status: int, value: Any) -> None:
            if not fut.done():
                fut.set_result((status, value))

        def refuse(exc: RequestError) -> None:
            if not fut.done():
                fut.set_exception(copy.copy(exc))

        start(answer, refuse)
        status, value = await fut
        return json_response(value, status)

    async def publish(self, request: Request, identity: Identity) -> Response:
        p = request.path_params
        channel = f"{p['endpoint']}/{p['version']}/{_raw_id(request)}"
        q = request.query_params
        body = b"" if "payload" in q else await self.body(request, one_message=True)
        return await self.answered(partial(self.publish_now, identity, channel, q,
                                           request.headers.items(), body))

    async def request_reply(self, request: Request, identity: Identity) -> Response:
        p = request.path_params
        channel = f"{p['endpoint']}/{p['version']}/{_raw_id(request)}"
        q = request.query_params
        timeout = request_timeout(q.get("timeout"))
        data = _encode(q["payload"]) if "payload" in q else \
            await self.body(request, one_message=True)
        if not data:
            raise BadRequest("give the request as a JSON body, or a string as ?payload=")
        headers = [(k[len(HEADER_PREFIX):], v) for k, v in request.headers.items()
                   if k.startswith(HEADER_PREFIX)]
        return await ask(self.server, identity, channel, data, headers, timeout)

    async def publish_batch(self, request: Request, identity: Identity) -> Response:
        return await self.answered(partial(self.publish_batch_now, identity,
                                           await self.body(request)))

    async def consume(self, request: Request, identity: Identity, dead: bool = False
                      ) -> Response:
        p = request.path_params
        consumer, wait = self.consumer_for(identity, p, _raw_id(request),
                                           request.query_params, dead)
        status, value = self.delivered(consumer, await _next_while_connected(
            request, consumer, wait))
        return Response(status_code=204) if value is None else json_response(value, status)

    async def ack(self, request: Request, identity: Identity) -> Response:
        return await self.answered(partial(self.settle_now, identity,
                                           request.path_params["receipt"], "ack",
                                           request.query_params))

    async def nack(self, request: Request, identity: Identity) -> Response:
        return await self.answered(partial(self.settle_now, identity,
                                           request.path_params["receipt"], "nack",
                                           request.query_params))

    async def receipt(self, request: Request, identity: Identity) -> Response:
        message_id = request.path_params["message_id"]
        found = self.core.find_message(message_id)
        if not identity.admin and found is not None:
            # A receipt is a read of its channel (the one check, reservations included;
            # it claims nothing), or its publisher's question.
            session = Session(identity.client_id, access=self.server.access_for(identity))
            name = found[0].name
            refusal = self.core.read_refusal(session, name)
            if refusal is not None and not session.access.may_write(name):
                raise NotAuthorized(f"client {identity.client_id!r} may not see messages "
                                    f"of {name!r}: {refusal.message}", channel=name)
        return json_response(await self.server.message_receipt(message_id))

    # ----------------------------------------------------------------- admin
    async def queues(self, request: Request, identity: Identity) -> Response:
        return json_response(await self.admin_op("queues", {}, identity))

    async def queue(self, request: Request, identity: Identity, dead: bool = False
                    ) -> Response:
        q = request.query_params
        args = {"queue": _queue(request, dead), "channel": q.get("channel"),
                "group": q.get("group")}
        return json_response(await self.admin_op("queue", args, identity))

    async def browse(self, request: Request, identity: Identity, dead: bool = False
                     ) -> Response:
        q = request.query_params
        args = {"channel": f"{_queue(request, dead)}/{_raw_id(request, tail='/messages')}",
                "from_seq": _int(q, "from_seq", 0), "limit": _int(q, "limit", 50)}
        return json_response(await self.admin_op("browse", args, identity))

    async def delete_message(self, request: Request, identity: Identity, dead: bool = False
                             ) -> Response:
        seq = request.path_params["seq"]
        tail = f"/messages/{seq}"
        args = {"channel": f"{_queue(request, dead)}/{_raw_id(request, tail=tail)}",
                "seqs": seq}
        return json_response(await self.admin_op("messages.delete", args, identity))

    async def _no_ignored_arguments(self, request: Request, query: tuple[str, ...],
                                    body: bool) -> None:
        """Refuse what an admin route that changes state would not read: a query
        parameter it does not take, or a body where it takes none. Ignored, a purge
        given ``{"channel": "1"}`` as a body, or ``?chanel=1``, emptied every channel
        of the queue, and a requeue given ``{"seqs": "3"}`` moved every dead letter."""
        takes = ", ".join(query) or "none"
        for name in request.query_params:
            if name not in query and name != "access_token":
                raise BadRequest(f"{request.method} {request.url.path} takes no query "
                                 f"parameter {name[:64]!r} (it takes: {takes}); nothing "
                                 "was done", parameter=name[:64])
        if not body and await self.body(request):
            raise BadRequest(f"{request.method} {request.url.path} takes no body: its "
                             f"arguments go in the query string (it takes: {takes}); "
                             "nothing was done")

    def admin_route(self, op: str, *, query: tuple[str, ...] = (),
                    queue: bool = False, body: bool = False,
                    self_service: bool = False) -> Handler:
        async def run(request: Request, identity: Identity) -> Response:
            if request.method != "GET":
                await self._no_ignored_arguments(request, query, body)
            args: dict[str, Any] = {k: request.query_params[k] for k in query
                                    if k in request.query_params}
            args.update({k: v for k, v in request.path_params.items()
                         if k not in ("endpoint", "version")})
            if queue:
                args["queue"] = _queue(request)
            if body:
                raw = await self.body(request)
                extra = decode_json(raw, what="body", malformed=BadRequest) if raw else {}
                if not isinstance(extra, dict):
                    raise BadRequest("body must be a JSON object")
                args.update(extra)
            if "force" in args:
                args["force"] = str(args["force"]).lower() in ("1", "true", "yes")
            return json_response(await self.admin_op(op, args, identity))

        # Self-service operations act on the caller's own identity (admin.SELF_SERVICE_OPS).
        return self.guard(run, admin=not self_service)

    # ------------------------------------------------------------ monitoring
    async def metrics(self, request: Request, identity: Identity) -> Response:
        body = await self.server.render_metrics()
        return Response(body, media_type=self.server.metrics.content_type)

    async def nagios(self, request: Request, identity: Identity) -> Response:
        q = request.query_params
        minutes = _float(q, "minutes")
        minutes = 10.0 if minutes is None else minutes
        queue, channel = _split_queue(request.path_params["queue"])
        try:
            stats = await self.admin_op("queue", {"queue": queue, "channel": channel,
                                                  "group": q.get("group")}, identity)
        except RequestError as exc:
            result = nagios.unknown(exc.message)
        else:
            if q.get("group") and not any(g["group"] == q["group"] for g in stats["groups"]):
                result = nagios.unknown(f"no group {q['group']!r} reads {queue}")
            else:
                result = nagios.check_queue(stats, minutes=minutes, group=q.get("group"))
        return PlainTextResponse(result.text + "\n",
                                 headers={"X-Nagios-Exit": str(result.code)})

    async def federation_nagios(self, request: Request, identity: Identity) -> Response:
        """A federation link's state and lag as a Nagios check (``?minutes=``, 10)."""
        minutes = _float(request.query_params, "minutes")
        name = request.path_params["link"]
        links = {ln["name"]: ln for ln in self.server.federation.view()["links"]}
        result = nagios.check_federation(links[name], minutes=10.0 if minutes is None
                                         else minutes) if name in links else \
            nagios.unknown(f"no federation link {name!r} ([[federation]] in the config)")
        return PlainTextResponse(result.text + "\n",
                                 headers={"X-Nagios-Exit": str(result.code)})

    async def queue_status(self, request: Request, identity: Identity) -> Response:
        queue, channel = _split_queue(request.path_params["queue"])
        args = {"queue": queue, "channel": channel, "group": request.query_params.get("group")}
        return json_response(await self.admin_op("queue", args, identity))

    async def health(self, request: Request) -> Response:
        server = self.server
        failed, full = server.scheduler.stopped, server.storage_full
        down = server.storage_down
        ok = server.accepting and not failed and full is None and down is None
        body: dict[str, Any] = {
            "status": "ok" if ok else "failing" if failed else "storage_full" if full
            else "storage_unavailable" if down else "stopping",
            "storage": "failed" if failed else "full" if full else "unavailable" if down
            else "ok",
            "auth": server.settings.auth_mode,
            "accepting": server.accepting,
            "uptime_s": round(time.time() - server.started_at, 3)}
        # How other brokers tell a partition from Redis down (peer_reach.py).
        role = getattr(server, "spread", None) or getattr(server, "primary", None)
        if role is not None:
            body["redis_seen_s"] = round(role.redis_seen_s(), 3)
        if failed:
            body["reason"] = server.stop_reason
        elif full is not None:  # deliveries and acks go on; publishes are refused
            body.update(reason=full.message, data_dir=full.detail.get("data_dir"),
                        free_bytes=full.detail.get("free_bytes"),
                        since=round(server.storage_full_since, 3))
        elif down is not None:  # deliveries and acks of what memory holds go on
            body.update(reason=down.message, since=round(server.storage_down_since, 3))
        return json_response(body, 200 if ok else 503)

    # ---------------------------------------------------------------- routes
    def routes(self) -> list[BaseRoute]:
        g = self.guard
        msg = "/{endpoint}/{version}/{id:path}"
        queue = "/{endpoint}/{version}"
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", g(self.metrics, admin=True), methods=["GET"]),
            Route("/statistics", g(self.metrics, admin=True), methods=["GET"]),
            Route("/status/nagios/{queue:path}", g(self.nagios, admin=True), methods=["GET"]),
            Route("/status/queues/{queue:path}", g(self.queue_status, admin=True),
                  methods=["GET"]),
            Route("/v1/messages", g(self.publish_batch), methods=["POST"]),
            Route("/v1/messages" + msg, g(self.publish), methods=["POST"]),
            Route("/v1/messages/{message_id}/receipt", g(self.receipt), methods=["GET"]),
            Route("/v1/request" + msg, g(self.request_reply), methods=["POST"]),
            Route("/v1/consume" + msg, g(self.consume), methods=["POST"]),
            Route("/v1/consume/_dead" + msg, g(partial(self.consume, dead=True)),
                  methods=["POST"]),
            Route("/v1/ack/{receipt}", g(self.ack), methods=["POST"]),
            Route("/v1/nack/{receipt}", g(self.nack), methods=["POST"]),
            Route("/v1/status", self.admin_route("status"), methods=["GET"]),
            Route("/v1/cluster", self.admin_route("cluster"), methods=["GET"]),
            Route("/v1/federation", self.admin_route("federation"), methods=["GET"]),
            Route("/status/federation/{link}", g(self.federation_nagios, admin=True),
                  methods=["GET"]),
            Route("/v1/whoami", g(self.whoami), methods=["GET"]),
            Route("/v1/queues", g(self.queues, admin=True), methods=["GET"]),
            Route("/v1/rates/history", g(self.rate_history, admin=True), methods=["GET"]),
            Route("/v1/queues" + queue, g(self.queue, admin=True), methods=["GET"]),
            Route("/v1/queues/_dead" + queue, g(partial(self.queue, dead=True), admin=True),
                  methods=["GET"]),
            # The _dead route first: the generic one would read "_dead" as an endpoint.
            Route("/v1/queues/_dead" + msg + "/messages",
                  g(partial(self.browse, dead=True), admin=True), methods=["GET"]),
            Route("/v1/queues" + msg + "/messages", g(self.browse, admin=True),
                  methods=["GET"]),
            Route("/v1/queues/_dead" + msg + "/messages/{seq}",
                  g(partial(self.delete_message, dead=True), admin=True), methods=["DELETE"]),
            Route("/v1/queues" + msg + "/messages/{seq}", g(self.delete_message, admin=True),
                  methods=["DELETE"]),
            Route("/v1/queues" + queue + "/purge",
                  self.admin_route("purge", query=("channel",), queue=True), methods=["POST"]),
            Route("/v1/dead" + queue + "/requeue",
                  self.admin_route("dead.requeue", query=("channel", "limit", "seqs"),
                                   queue=True),
                  methods=["POST"]),
            Route("/v1/dead" + queue + "/purge",
                  self.admin_route("dead.purge", query=("channel",), queue=True),
                  methods=["POST"]),
            Route("/v1/groups/{group:path}",
                  self.admin_route("group.delete", query=("force",)), methods=["DELETE"]),
            Route("/v1/clients", self.admin_route("clients.list", query=PAGE_QUERY),
                  methods=["GET"]),
            Route("/v1/reservations/{channel:path}/release",
                  self.admin_route("reservations.release"), methods=["POST"]),
            Route("/v1/clients/{client_id}/approve", self.admin_route("clients.approve"),
                  methods=["POST"]),
            Route("/v1/clients/{client_id}/revoke", self.admin_route("clients.revoke"),
                  methods=["POST"]),
            Route("/v1/clients/{client_id}/forget", self.admin_route("clients.forget"),
                  methods=["POST"]),
            Route("/v1/clients/{client_id}/rotate",
                  self.admin_route("clients.rotate", body=True), methods=["POST"]),
            Route("/v1/credentials",
                  self.admin_route("credentials.issue", body=True, self_service=True),
                  methods=["POST"]),
            Route("/v1/credentials", self.admin_route("credentials.list", query=PAGE_QUERY,
                                                      self_service=True),
                  methods=["GET"]),
            Route("/v1/credentials/{id}/renew",
                  self.admin_route("credentials.renew", body=True, self_service=True),
                  methods=["POST"]),
            Route("/v1/credentials/{id}",
                  self.admin_route("credentials.revoke", self_service=True),
                  methods=["DELETE"]),
            Route("/v1/admin/reload", self.admin_route("reload"), methods=["POST"]),
            Route("/v1/admin/soft-stop", self.admin_route("soft_stop"), methods=["POST"]),
            *HttpKv(self, json_response).routes(),
        ]

    async def whoami(self, request: Request, identity: Identity) -> Response:
        return json_response(self.server.admin("whoami", {}, identity))

    async def rate_history(self, request: Request, identity: Identity) -> Response:
        """The last minutes of publish, deliver and ack rates (one sample a second), of
        the broker or of ``?queue=endpoint/version``: the dashboard's charts start here."""
        queue = request.query_params.get("queue") or None
        return json_response({"queue": queue, "now": time.time(),
                              **self.server.metrics.history.series(queue)})


def delivery_view(d: Delivery, receipt: str) -> dict[str, Any]:
    if d.raw:
        payload, payload_base64 = None, base64.b64encode(d.data).decode()
    else:
        payload, payload_base64 = _decode(d.data), None
    return {"receipt": receipt, "channel": d.channel, "seq": d.seq, "id": d.id,
            "payload": payload, "payload_base64": payload_base64, "headers": d.headers or {},
            "attempts": d.attempts, "published_at": d.published_at, "priority": d.priority,
            "key": d.key}


async def _next_while_connected(request: Request, consumer: HttpConsumer, wait: float
                                ) -> Delivery | None:
    """``consumer.next(wait)``, given up as soon as the client disconnects. uvicorn does
    not cancel a request whose client left and drops what it answers: a message handed
    to it would stay leased to nobody until its lease ran out."""
    taking = asyncio.ensure_future(consumer.next(wait))
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait((taking, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        left = gone.done() and not gone.cancelled()
        gone.cancel()
    if not taking.done():
        taking.cancel()  # gives up waiting
        with contextlib.suppress(asyncio.CancelledError):
            await taking
        return None
    item = taking.result()
    if item is not None and left:
        consumer.give_back(item)
        return None
    return item


def _queue(request: Request, dead: bool = False) -> str:
    p = request.path_params
    queue = f"{p['endpoint']}/{p['version']}"
    try:
        validate_channel(f"{queue}/x")
    except InvalidChannel as exc:
        raise InvalidChannel(exc.message.replace("/x'", "'")) from None
    return "_dead/" + queue if dead else queue


def _raw_id(request: Request, tail: str = "") -> str:
    raw = request.scope.get("raw_path")
    if not raw:
        return str(request.path_params["id"])
    return raw_channel_id(raw, request.path_params, tail)


def _split_queue(text: str) -> tuple[str, str | None]:
    """``[_dead/]endpoint/version[/id]`` -> (queue, channel id or None)."""
    dead = text.startswith("_dead/")
    parts = text[len("_dead/"):].split("/", 2) if dead else text.split("/", 2)
    queue = ("_dead/" if dead else "") + "/".join(parts[:2])
    return queue, (parts[2] if len(parts) > 2 else None)


def _float(q: Any, name: str) -> float | None:
    raw = q.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a number, not {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise BadRequest(f"{name} must be a finite number")
    return value


def _int(q: Any, name: str, default: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, not {raw!r}") from None


__all__ = ["HttpApi", "NotAuthenticated", "error_response", "json_response"]


def hot_route(path: str) -> tuple[str, dict[str, str]] | None:
    """The hot POST routes by their (decoded) path, without the router: ``publish``,
    ``publish_batch``, ``consume``, ``consume_dead``, ``ack`` or ``nack`` with their
    path parameters; None for any other path."""
    parts = path.split("/", 5)
    if len(parts) < 3 or parts[1] != "v1" or (len(parts) == 3 and parts[2] != "messages"):
        return None
    kind = parts[2]
    if kind in ("ack", "nack") and len(parts) == 4 and parts[3]:
        return kind, {"receipt": parts[3]}
    if kind == "messages" and len(parts) == 3:
        return "publish_batch", {}
    if kind == "consume" and parts[3] == "_dead":
        parts = ["", "v1", "consume", *path.split("/", 6)[4:]]
        kind = "consume_dead"
    elif kind == "messages":
        kind = "publish"
    elif kind != "consume":
        return None
    if len(parts) != 6 or not parts[3] or not parts[4] or not parts[5]:
        return None
    return kind, {"endpoint": parts[3], "version": parts[4], "id": parts[5]}


def raw_channel_id(raw_path: bytes, params: dict[str, str], tail: str = "") -> str:
    """The channel id exactly as sent: ids are URL-encoded inside channel names, so an
    id ``a%2Fb`` must not become ``a/b`` (routers see the decoded path)."""
    path = raw_path.decode("latin-1").split("?", 1)[0]
    if tail and path.endswith(tail):
        path = path[: -len(tail)]
    # /v1/<route>[/_dead]/<endpoint>/<version>/<id...>
    endpoint, version = params["endpoint"], params["version"]
    head, found, rest = path.partition(f"/{endpoint}/{version}/")
    if found and "%" not in head:
        return rest
    # The endpoint or the version sent percent-encoded ("n%61mes"): the id follows the
    # first two segments that decode to them. (Matched as sent, the id fell back to its
    # decoded form: "a%252F" named the channel "a%2F", and "a%2Fb" was refused as "a/b".)
    segments = path.split("/")
    for i in range(len(segments) - 2):
        if unquote(segments[i]) == endpoint and unquote(segments[i + 1]) == version:
            return "/".join(segments[i + 2:]) or str(params["id"])
    return str(params["id"])


class FastLane:
    """ASGI front for the hot routes (publish, consume, ack, nack): they skip the
    router and the middleware stack, which cost a quarter of each request here. The
    handlers are the same ones the Starlette routes use (and the OpenAPI describes).
    Most requests to them do not even get here: the HTTP protocol answers them itself
    (http_fast); this lane serves the pipelined ones and ``Expect: 100-continue``."""

    SECURITY_HEADERS: list[tuple[bytes, bytes]] = []  # set by http.build_app

    def __init__(self, api: HttpApi, app: Any) -> None:
        self.api, self.app = api, app
        g = api.guard
        self.handlers: dict[str, Handler] = {
            "publish": g(api.publish), "publish_batch": g(api.publish_batch),
            "consume": g(api.consume), "consume_dead": g(partial(api.consume, dead=True)),
            "ack": g(api.ack), "nack": g(api.nack),
        }

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            found = hot_route(scope["path"])
            if found is not None:
                kind, params = found
                scope["path_params"] = params
                response = await self.handlers[kind](Request(scope, receive))
                response.raw_headers.extend(self.SECURITY_HEADERS)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
