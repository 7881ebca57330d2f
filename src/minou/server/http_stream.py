"""``/v1/stream``: subscribe, receive and settle over one WebSocket, in JSON.

For browsers and scripts that cannot speak the binary native frames
(``/v1/ws``). Client -> broker text messages::

    {"op": "consume" | "listen", "pattern": "orders/v1/*", "group": "g",
     "prefetch": 10, "start": "oldest", "name": "...", "ref": "any"}
    {"op": "ack", "receipt": "3.17"}
    {"op": "nack", "receipt": "3.17", "delay": 5, "front": false}
    {"op": "publish", "channel": "orders/v1/1", "payload": {...}, "headers": {"k": "v"},
     "priority": 0, "ttl": 60, "delay": 5, "dedup": "...", "key": "...", "ref": "any"}
    {"op": "unsubscribe", "sid": 3}

Broker -> client: ``{"type": "subscribed", "sid", "ref"}``, ``{"type": "message",
"sid", "receipt", ...}``, ``{"type": "settled", "receipt", "op"}`` and
``{"type": "published", "seq", "id", "channel", "ref"}`` (both after the commit),
``{"type": "error", "code", "reason", "message", "ref"}``. Authentication is the
HTTP one (``Authorization: Bearer`` or ``?access_token=``); rules apply as on
every other interface. The prefetch bounds what is in flight per subscription.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..core.broker import Session
from ..errors import (
    BadRequest,
    RequestError,
    TooManyConnections,
    UnknownDelivery,
    error_from_code,
)
from ..limits import MAX_STREAM_PREFETCH, SLOW_CONSUMER_GRACE_S
from ..payloads import decode_json
from ..protocol import frames as f
from ..protocol.frames import Outcome
from . import oplog
from .front import REMOTE_TAGS
from .http_api import delivery_view
from .wire import internal_error, stream_error

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .http_api import HttpApi
    from .ports import Server

log = logging.getLogger("minou.stream")
_encode = msgspec.json.encode
# What a publish op takes: the fields of an HTTP publish (POST /v1/messages), by name.
PUBLISH_FIELDS = ("channel", "payload", "headers", "priority", "ttl", "delay", "dedup", "key")


class StreamSession:
    """The broker's view of one /v1/stream socket (what the pump writes to)."""

    def __init__(self, server: Server, identity: Identity) -> None:
        self.server = server
        self.engine = server.engine
        self.identity = identity
        self.out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.queued = 0  # bytes in ``out``: bounded like a TCP connection's buffer
        self.closed = False
        self.task: asyncio.Task[Any] | None = None  # the socket's reader, ended by a cut
        self.reading = asyncio.Event()  # cleared while the disk is behind (flow control)
        self.reading.set()
        self.session = Session(identity.client_id, self, access=server.access_for(identity),
                               admin=identity.admin)
        self.next_sid = 1
        # Queues spread over brokers: subscriptions are made on the others too, and
        # their deliveries come through here under tags of the front's (front.py).
        spread = server.spread
        self.front = spread.front_for(self) if spread is not None else None

    def silence_is_ours(self) -> bool:
        """Not reading the socket on purpose (the disk is behind): see connection.py."""
        return not self.reading.is_set()

    def send_deliveries(self, sid: int, items: list[f.Delivery]) -> None:
        for d in items:
            self.emit({"type": "message", "sid": sid,
                       **delivery_view(d, f"{sid}.{d.tag}")})

    def flush(self) -> None:  # what a front's links call after their input
        pass

    def send(self, frame: Any) -> None:
        if isinstance(frame, f.Error):
            reason = frame.detail.get("reason") if frame.detail else None
            self.emit({"type": "error", "code": frame.code, "reason": reason,
                       "message": frame.message, "sid": frame.detail.get("sid")})

    def emit(self, value: dict[str, Any]) -> None:
        if self.closed:
            return
        data = _encode(value)
        self.queued += len(data)
        self.out.put_nowait(data)
        if self.queued > self.server.settings.slow_consumer_bytes:
            self.server.slow_consumers += 1
            self.end(1008, f"slow consumer: {self.queued} bytes waiting to be read (limit "
                           f"{self.server.settings.slow_consumer_bytes})", "slow_consumer")

    # Publisher flow control, as for a TCP connection (Engine.publish).
    def pause_reading(self) -> None:
        self.reading.clear()

    def resume_reading(self) -> None:
        self.reading.set()

    def end(self, code: int, message: str, reason: str) -> None:
        """Close the stream from the broker's side: a last error message replaces what
        is still queued, its deliveries go back to their groups, and the socket closes
        (at once, or after a grace if the client does not read the error)."""
        if self.closed:
            return
        self.closed = True
        while not self.out.empty():
            self.out.get_nowait()
        self.out.put_nowait(_encode({"type": "error", "code": code, "reason": reason,
                                     "message": message}))
        self.out.put_nowait(None)
        self.engine.close(self.session)
        if self.front is not None:
            self.front.close()
        if self.task is not None:
            asyncio.get_running_loop().call_later(SLOW_CONSUMER_GRACE_S, self.task.cancel)

    def reapply_access(self, now: float) -> list[dict[str, Any]]:
        """After a reload: the live rules for this client; subscriptions they forbid end
        with an error message (the stream stays)."""
        self.identity = self.server.http_identity(self.identity)
        self.session.access = self.server.access_for(self.identity)
        self.session.admin = self.identity.admin
        closed = []
        for sid, sub in list(self.session.subs.items()):
            try:
                for pattern in sub.group.patterns:
                    self.server.core.check_read(self.session, pattern.text)
            except RequestError as exc:
                self.server.core.unsubscribe(self.session, sid, now)
                self.emit({"type": "error", "code": int(exc.code), "reason": exc.reason,
                           "message": f"subscription {sid} ended by a reload: {exc.message}",
                           "sid": sid})
                closed.append({"client_id": self.session.client_id, "sid": sid,
                               "reason": exc.message})
        return closed

    def error(self, exc: RequestError, ref: Any = None, *, counted: bool = False) -> None:
        if not counted:
            self.server.core.counters.refuse(exc.reason)
        self.emit(stream_error(exc, ref))

    # ----------------------------------------------------------------- ops
    def handle(self, api: HttpApi, raw: str | bytes) -> None:
        ref = None
        if self.closed:
            return
        try:
            msg = decode_json(raw, what="stream message", malformed=BadRequest)
            if not isinstance(msg, dict):
                raise BadRequest("a stream message is a JSON object with an 'op'")
            ref = msg.get("ref")
            op = msg.get("op")
            fields = _OP_FIELDS.get(op) if isinstance(op, str) else None
            if fields is not None:
                # A misspelt option would be dropped, and the op run with its default
                # (a "strat" that starts from new, a "prefecth" of 10): refused instead.
                unknown = [k for k in msg if k not in fields]
                if unknown:
                    raise BadRequest(f"unknown field {unknown[0]!r} in a {op} (it takes "
                                     f"{', '.join(sorted(fields - {'op', 'ref'}))})")
            if op in ("consume", "listen"):
                self._subscribe(op, msg, ref)
            elif op in ("ack", "nack"):
                self._settle(op, msg)
            elif op == "publish":
                self._publish(msg, ref)
            elif op == "unsubscribe":
                sid = _int(msg, "sid")
                self.engine.unsubscribe(self.session, sid)
                if self.front is not None:
                    self.front.unsubscribe(f.Unsubscribe(0, sid))
                self.emit({"type": "unsubscribed", "sid": sid, "ref": ref})
            else:
                raise BadRequest(f"unknown op {op!r} (consume, listen, ack, nack, publish, "
                                 "unsubscribe)")
        except RequestError as exc:
            self.error(exc, ref)
        except Exception:  # a bug must cost this message, not the stream or the broker
            log.exception("stream message failed")
            self.error(internal_error("internal error handling this message"), ref)
        self.engine.after_input()

    def _subscribe(self, kind: str, msg: dict[str, Any], ref: Any) -> None:
        pattern = msg.get("pattern")
        if not isinstance(pattern, str):
            raise BadRequest("give pattern")
        prefetch = _int(msg, "prefetch", 10)
        if not 1 <= prefetch <= MAX_STREAM_PREFETCH:
            raise BadRequest(f"prefetch must be 1..{MAX_STREAM_PREFETCH}")
        lease = msg.get("lease", 0.0)  # seconds; 0: the broker's default_lease
        if not isinstance(lease, int | float) or isinstance(lease, bool):
            raise BadRequest(f"lease must be a number of seconds, not {_shown(lease)}")
        sid = self.next_sid
        group, start, name = _str(msg, "group"), _str(msg, "start") or "", _str(msg, "name")
        self.engine.subscribe(self.session, sid, kind=kind, patterns=[pattern], group=group,
                              start=start, prefetch=prefetch, name=name, lease=float(lease))
        self.next_sid += 1
        if self.front is not None:  # the same subscription on every other broker
            self.front.subscribe(f.Subscribe(0, sid, kind, [pattern], group, start, prefetch,
                                             float(lease), name), f.Result(0, None))
        # Now, not after the commit: the broker picks the sid, so the client must learn
        # it before the first message that carries it (which may come before the commit).
        self.emit({"type": "subscribed", "sid": sid, "pattern": pattern, "ref": ref})

    def _settle(self, op: str, msg: dict[str, Any]) -> None:
        receipt = msg.get("receipt")
        if not isinstance(receipt, str):
            raise BadRequest(f"a {op} needs the receipt (a string) of the delivery")
        sid, _, tag = receipt.partition(".")
        if not (sid.isascii() and sid.isdigit() and tag.isascii() and tag.isdigit()):
            raise UnknownDelivery(f"receipt {receipt!r} is not one of this stream's",
                                  receipt=str(receipt))
        kw: dict[str, Any] = {}
        if op == "nack":
            delay = msg.get("delay") or 0.0
            if not isinstance(delay, int | float) or isinstance(delay, bool):
                raise BadRequest("delay must be a number of seconds")
            front = msg.get("front", True)
            if not isinstance(front, bool):
                raise BadRequest(f"front must be true or false, got {front!r:.40}")
            kw = {"delay": float(delay), "front": front}
        reply = {"type": "settled", "receipt": receipt, "op": op}
        if self.front is not None and int(tag) >= REMOTE_TAGS:
            self._settle_remote(op, int(tag), reply, **kw)
            return
        failed = self.engine.settle(self.session, op, [int(tag)], None, **kw)
        if failed:
            raise UnknownDelivery(f"receipt {receipt!r}: {failed[0][2]}", receipt=str(receipt))
        self.engine.after_commit(lambda: self.emit(reply), lambda exc: self.error(type(exc)(
            f"{op} not made durable: {exc.message}", receipt=str(receipt))))

    def _settle_remote(self, op: str, tag: int, reply: dict[str, Any], **kw: Any) -> None:
        """A delivery from another broker: settled there, answered once it answered."""
        assert self.front is not None
        receipt = reply["receipt"]

        def done(failed: list[tuple[int, int, str]]) -> None:
            if not failed:
                self.emit(reply)
                return
            _, code, text = failed[0]
            self.error(error_from_code(code, f"receipt {receipt!r}: {text}",
                                       {"receipt": str(receipt)}))

        frame = f.Ack(0, [tag]) if op == "ack" else f.Nack(0, [tag], **kw)
        self.front.settle(frame, [tag], done)

    def _publish(self, msg: dict[str, Any], ref: Any) -> None:
        """One publish path for every door (engine.publish): headers, TTL, delay, dedup
        and key as over HTTP; this stream is paused like a socket while the disk is
        behind."""

        def published(outcomes: list[Outcome], failure: RequestError | None) -> None:
            out = outcomes[0]
            if out.code:  # the engine counted it
                exc = failure if failure is not None else \
                    error_from_code(out.code, out.error, {"channel": out.channel})
                self.error(exc, ref, counted=True)
                return
            self.emit({"type": "published", "channel": out.channel, "seq": out.seq,
                       "id": out.id, "duplicate": out.duplicate, "fanout": out.fanout,
                       "ref": ref})

        send = publish_send(msg)
        spread = self.server.spread
        if spread is not None and spread.http_front(self.identity).publish_sends(
                [send], lambda outcomes: published(outcomes, None), publisher=self):
            return  # queues spread over brokers: it went to its queue's owner
        self.engine.publish([send], self.session.access, published, publisher=self)


# The scope key under which a WebSocket route leaves what holds the socket's session.
WS_OWNER = "minou.owner"


# The fields each op takes (publish checks its own, publish_send below).
_OP_FIELDS: dict[str, frozenset[str]] = {
    "consume": frozenset({"op", "ref", "pattern", "group", "prefetch", "start", "name",
                          "lease"}),
    "listen": frozenset({"op", "ref", "pattern", "group", "prefetch", "start", "name",
                         "lease"}),
    "ack": frozenset({"op", "ref", "receipt"}),
    "nack": frozenset({"op", "ref", "receipt", "delay", "front"}),
    "unsubscribe": frozenset({"op", "ref", "sid"}),
}


async def serve_stream(api: HttpApi, ws: WebSocket) -> None:
    server = api.server
    try:
        identity = api.auth.identify(ws.headers.get("authorization"),
                                     ws.query_params.get("access_token"), ws.client)
    except RequestError as exc:
        server.core.counters.refuse(exc.reason)
        await ws.close(code=4401, reason=exc.message[:120])
        return
    token = object()  # what the client's count of connections knows this socket by
    try:
        server.admission.enter_client(token, identity, oplog.peer_text(ws.client, "ws"))
    except TooManyConnections as exc:  # max_connections_per_client (counted, logged)
        await ws.close(code=1013, reason=exc.message[:120])  # try again later
        return
    try:
        await _serve_stream(api, ws, identity)
    finally:
        server.admission.leave_client(token)


async def _serve_stream(api: HttpApi, ws: WebSocket, identity: Identity) -> None:
    server = api.server
    await ws.accept()
    stream = StreamSession(server, identity)
    stream.task = asyncio.current_task()
    ws.scope[WS_OWNER] = stream  # for the protocol's keepalive: whose socket went quiet
    server.streams.add(stream)

    async def pump_out() -> None:
        while (data := await stream.out.get()) is not None:
            stream.queued -= len(data)
            await ws.send_text(data.decode())
        if stream.closed:  # ended by the broker: say so, then close
            with contextlib.suppress(Exception):
                await ws.close(code=1008)

    sender = asyncio.create_task(pump_out())
    try:
        while True:
            await stream.reading.wait()
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            text = message.get("text")
            if text is None:
                stream.error(BadRequest("send stream messages as text (JSON); binary "
                                        "messages carry native frames, on /v1/ws"))
                continue
            stream.handle(api, text)
    except (WebSocketDisconnect, asyncio.CancelledError):
        pass
    finally:
        server.streams.discard(stream)
        if not stream.closed:
            stream.closed = True
            server.engine.close(stream.session)
            if stream.front is not None:
                stream.front.close()
            stream.out.put_nowait(None)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(sender, 2)


def publish_send(msg: dict[str, Any]) -> f.Send:
    """The message a publish op asks for: the fields of an HTTP publish, checked as there
    (the core checks the limits every interface shares: header count and size, key
    lengths, priority, ttl and delay). An unknown field is refused: dropped, it would
    store another message than the one asked for (a ``tll`` would never expire)."""
    unknown = sorted(set(msg) - {"op", "ref", *PUBLISH_FIELDS})
    if unknown:
        raise BadRequest(f"a publish takes no field {unknown[0]!r}; its fields are "
                         f"{', '.join(PUBLISH_FIELDS)} and ref")
    channel = msg.get("channel")
    if not isinstance(channel, str) or "payload" not in msg:
        raise BadRequest("publish needs channel and payload")
    return f.Send(channel, _encode(msg["payload"]), False, _headers(msg),
                  _int(msg, "priority", 0), _number(msg, "ttl"), _number(msg, "delay"),
                  _str(msg, "dedup") or None, _str(msg, "key") or None)


def _headers(msg: dict[str, Any]) -> dict[str, str] | None:
    value = msg.get("headers")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("headers must be an object of strings, e.g. {\"trace\": \"a1\"}")
    for name, text in value.items():
        if not isinstance(text, str):
            raise BadRequest(f"header {name!r} must be a string, not {_shown(text)}")
    return value or None


def _number(msg: dict[str, Any], name: str) -> float | None:
    """A number of seconds, or None; the same refusals as the HTTP query's ``?ttl=``."""
    value = msg.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest(f"{name} must be a number, not {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer past what a float holds
        number = math.inf
    if not math.isfinite(number):
        raise BadRequest(f"{name} must be a finite number")
    return number


def _int(msg: dict[str, Any], name: str, default: int | None = None) -> int:
    value = msg.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{name} must be an integer, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value for an error message, cut short: the client sent it, it may be large."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _str(msg: dict[str, Any], name: str) -> str | None:
    value = msg.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value
