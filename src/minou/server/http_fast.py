"""The HTTP protocol: uvicorn's httptools protocol, with two changes made for the
small requests a broker lives on.

* Writes made in one turn of the loop leave in one ``send()`` (uvicorn writes a
  response's head and body separately; the second syscall was a tenth of each
  small request's cost).
* The hot routes -- publish, batch publish, ack, nack and consume -- are answered by
  the protocol itself, as the parser hands it the request, from a callback (the
  commit, or a delivery for a consume's long poll): no ASGI task, no
  ``Request``/``Response`` objects, no ASGI messages. They call the very operations
  the Starlette routes call (``HttpApi.publish_now`` and friends), so answers,
  errors and counters are the same on both paths; everything else (admin,
  pipelined requests, ``Expect: 100-continue``, upgrades) goes through uvicorn's
  cycle to the ASGI app as before. This took the
  single-message HTTP publish from ~10.5k to ~16.5k msg/s (docs/benchmarks.md).

It also bounds what a connection may hold: each socket is counted in the broker's
connection limit (admission.py; past it, a 503 and the close), a request's headers must
arrive within ``http_header_timeout`` (then a 408 and the close), and an idle keep-alive
connection is closed after ``http_idle_timeout`` (uvicorn's keep-alive timer). One lazy
timer per connection watches the header deadline, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote

import httptools
import msgspec
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ..errors import BadRequest, InputBusy, NotAuthenticated, RequestError, RequestTimeout
from ..limits import HTTP_LINGER_S as LINGER_S
from ..limits import (
    INPUT_GRACE_S,
    INPUT_MIN_RATE,
    INPUT_SMALL_BYTES,
    MAX_HTTP_HEAD_BYTES,
    MAX_HTTP_PIPELINE,
    REFUSAL_WAIT_S,
)
from . import oplog
from .http_api import HEADER_PREFIX, body_too_large, hot_route, raw_channel_id
from .wire import http_error

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from ..errors import TooManyConnections
    from ..protocol.frames import Delivery
    from .http_api import HttpApi
    from .http_consumers import HttpConsumer

log = logging.getLogger("minou.http")
_encode = msgspec.json.encode
HOT_KINDS = frozenset(("publish", "publish_batch", "ack", "nack", "consume",
                       "consume_dead"))
# Routes whose URL names a receipt, used once: not kept as the connection's last URL
# (a consumer's next consume would parse its own URL again behind every ack).
_ONE_USE_KINDS = frozenset(("ack", "nack"))
_MESSAGE_HEADER = HEADER_PREFIX.encode("latin-1")
_JSON_HEAD = b"content-type: application/json\r\ncontent-length: "
_INTERNAL_ERROR = (b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; "
                   b"charset=utf-8\r\ncontent-length: 21\r\nconnection: close\r\n\r\n"
                   b"Internal Server Error")


def query_params(raw: bytes) -> dict[str, str]:
    """``parse_qsl(keep_blank_values=True)`` as a dict (the last of a repeated name), without
    its cost for the plain queries of hot requests (``group=g&wait=5``): nothing to
    unquote."""
    text = raw.decode("latin-1")
    if "%" in text or "+" in text:
        return dict(parse_qsl(text, keep_blank_values=True))
    out: dict[str, str] = {}
    for part in text.split("&"):
        if part:
            name, _, value = part.partition("=")
            out[name] = value
    return out


class CoalescingTransport:
    """The real transport, but writes made in one turn of the loop leave together."""

    __slots__ = ("_buf", "_loop", "_transport", "outstanding")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._buf: list[bytes] = []
        # Bytes written since the socket's buffer was last empty: what the answers not
        # yet read hold (an answer is held whole until written out; http_unread).
        self.outstanding = 0

    def _counted(self, data: bytes) -> None:
        if not self._transport.get_write_buffer_size():
            self.outstanding = 0
        self.outstanding += len(data)
        self._transport.write(data)

    @property
    def socket(self) -> asyncio.Transport:
        """The transport it wraps: what the connection limit counts."""
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._buf:
            self._loop.call_soon(self._flush)
        self._buf.append(bytes(data))

    def write_now(self, data: bytes) -> None:
        """One whole response: out at once, after anything still buffered."""
        if self._buf:
            self._flush()
        if not self._transport.is_closing():
            self._counted(data)

    def writelines(self, items: Any) -> None:
        for data in items:
            self.write(data)

    def _flush(self) -> None:
        if self._buf:
            data = b"".join(self._buf)
            self._buf.clear()
            if not self._transport.is_closing():
                self._counted(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    # Asked several times a request: a method of its own, not a miss of the attribute
    # lookup that ``__getattr__`` then answers (a failed lookup costs about a microsecond).
    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _NoEvent:
    """uvicorn's protocol wakes a cycle's reader through ``message_event.set()``; a
    hot cycle has no reader to wake."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class HotTarget:
    """What a hot request's URL says, parsed once per URL a connection sends: a
    keep-alive client mostly posts to the same one again (its query and path
    parameters are only read, never changed)."""

    __slots__ = ("channel", "kind", "params", "query", "raw_path", "takes_body")

    def __init__(self, kind: str, params: dict[str, str], raw_path: bytes,
                 query: bytes) -> None:
        self.kind, self.params, self.raw_path = kind, params, raw_path
        self.query = query_params(query) if query else {}
        # As on Starlette's path, only publishes read their body (and not with ?payload=):
        # any other body is let pass unread and unlimited, never kept.
        self.takes_body = kind == "publish_batch" or (
            kind == "publish" and "payload" not in self.query)
        self.channel = (f"{params['endpoint']}/{params['version']}/"
                        f"{raw_channel_id(raw_path, params)}") if kind == "publish" else ""


class HotCycle:
    """One hot request, answered by the protocol. Has what uvicorn's protocol reads of
    its ``RequestResponseCycle`` (body, more_body, response_complete, disconnected,
    keep_alive, message_event) so the protocol's own bookkeeping works unchanged."""

    __slots__ = ("body", "disconnected", "give_up", "headers", "keep_alive", "kind", "limit",
                 "message_event", "more_body", "params", "protocol", "query", "raw_path",
                 "response_complete", "takes_body", "target")

    def __init__(self, protocol: MinouHttpProtocol, target: HotTarget,
                 keep_alive: bool) -> None:
        self.protocol = protocol
        self.target = target
        self.kind, self.params, self.raw_path = target.kind, target.params, target.raw_path
        self.query = target.query
        self.takes_body = target.takes_body
        self.headers: list[tuple[bytes, bytes]] = protocol.headers
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.more_body = True
        self.response_complete = False
        self.disconnected = False
        self.message_event = _NO_EVENT
        self.give_up: Callable[[], object] | None = None  # a consume that waits
        self.limit = protocol.api.body_limit(one_message=self.kind == "publish")

    def add_body(self, chunk: bytes) -> None:
        if self.response_complete or not self.takes_body:
            return
        self.body += chunk
        if len(self.body) > self.limit:
            # Refused before the rest arrives, and the connection closed: reading on
            # to keep it alive would take the whole oversized upload.
            self.keep_alive = False
            self.refuse(body_too_large(len(self.body), self.limit,
                                       one_message=self.kind == "publish"))

    def run(self) -> None:
        """The whole request is here: do it, and answer now or after the commit."""
        if self.response_complete:
            return
        self.more_body = False
        api = self.protocol.api
        query = self.query
        try:
            # Checked at its headers in this same read (nothing ran since), or now.
            identity = self.protocol.identity
            if identity is None:
                authorization = next((v.decode("latin-1") for k, v in self.headers
                                      if k == b"authorization"), None)
                identity = api.auth.identify(authorization, query.get("access_token"),
                                             getattr(self.protocol, "client", None))
            if self.kind == "publish":
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self.headers
                           if k.startswith(_MESSAGE_HEADER)]  # the only ones it reads
                api.publish_now(identity, self.target.channel, query, headers,
                                bytes(self.body), self.answer_json, self.refuse)
            elif self.kind == "publish_batch":
                api.publish_batch_now(identity, bytes(self.body), self.answer_json,
                                      self.refuse)
            elif self.kind in ("consume", "consume_dead"):
                p = self.params
                consumer, seconds = api.consumer_for(
                    identity, p, raw_channel_id(self.raw_path, p), query,
                    dead=self.kind == "consume_dead")
                self.protocol.waiting = self
                self.give_up = consumer.take(seconds, partial(self.delivered, consumer))
                return
            else:
                api.settle_now(identity, self.params["receipt"], self.kind, query,
                               self.answer_json, self.refuse)
        except RequestError as exc:
            self.refuse(exc)
        except Exception:
            self._failed()

    def answer_json(self, status: int, value: Any) -> None:
        """The route's answer (now, or once its commit is durable)."""
        try:
            body = _encode(value)
        except Exception:
            self._failed()
            return
        self.answer(status, body)

    def _failed(self) -> None:
        """A bug on this path: the client gets a 500 and the connection ends; the
        broker and the other requests carry on."""
        log.exception("HTTP %s failed", self.kind)
        self.keep_alive = False
        self._send(_INTERNAL_ERROR)

    def delivered(self, consumer: HttpConsumer, delivery: Delivery | None) -> None:
        self.give_up = None
        if self.protocol.waiting is self:
            self.protocol.waiting = None
        if self.response_complete or self.disconnected or \
                self.protocol.transport.is_closing():
            if delivery is not None:
                consumer.give_back(delivery)  # nobody to answer: back to the queue
            return
        try:
            status, value = self.protocol.api.delivered(consumer, delivery)
            self.answer(status, None if value is None else _encode(value))
        except Exception:
            if delivery is not None:
                consumer.give_back(delivery)
            self._failed()

    def refuse(self, exc: RequestError) -> None:
        self.protocol.api.count_refusal(exc)
        status, body, headers = http_error(exc)
        self.answer(status, body, headers)

    def answer(self, status: int, body: bytes | None,
               headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """``body`` None: no content (a 204). Never raises: it runs in commit callbacks,
        where an exception would cost the other requests of the batch their answers."""
        try:
            self._answer(status, body, headers)
        except Exception:
            self._failed()

    def _answer(self, status: int, body: bytes | None,
                headers: list[tuple[bytes, bytes]] | None) -> None:
        protocol = self.protocol
        if headers:  # an error's own headers (retry-after...): made for this answer
            before, after = ResponseHeads.parts(protocol, status, body is not None,
                                                self.keep_alive, headers)
        else:
            before, after = protocol.heads.get(protocol, status, body is not None,
                                               self.keep_alive)
        self._send(before + b"%d\r\n" % len(body) + after + body if body is not None
                   else before + after)

    def _send(self, response: bytes) -> None:
        if self.response_complete:
            return
        self.response_complete = True
        protocol = self.protocol
        transport = protocol.transport
        if self.disconnected or transport.is_closing():
            return
        transport.write_now(response)  # type: ignore[attr-defined]
        if not self.keep_alive:
            protocol.finish(lingering=self.more_body)
        protocol.hot_response_complete()


class ResponseHeads:
    """The head of a hot answer without headers of its own, in two parts around its
    content-length value, made once per status and kind of answer until uvicorn's
    default headers change (a new date header each second)."""

    __slots__ = ("_defaults", "_heads")

    def __init__(self) -> None:
        self._defaults: object = None
        self._heads: dict[tuple[int, bool, bool], tuple[bytes, bytes]] = {}

    def get(self, protocol: MinouHttpProtocol, status: int, body: bool,
            keep_alive: bool) -> tuple[bytes, bytes]:
        """(everything before the content-length value, or the whole head without a
        body; what follows that value, up to the body)."""
        defaults = protocol.server_state.default_headers
        if defaults is not self._defaults:
            self._defaults = defaults
            self._heads.clear()
        key = (status, body, keep_alive)
        found = self._heads.get(key)
        if found is None:
            found = self._heads[key] = self.parts(protocol, status, body, keep_alive)
        return found

    @staticmethod
    def parts(protocol: MinouHttpProtocol, status: int, body: bool, keep_alive: bool,
              extra: list[tuple[bytes, bytes]] | None = None) -> tuple[bytes, bytes]:
        """The two parts of a head, ``extra`` headers after the content-length."""
        before = [STATUS_LINE[status]]
        for name, value in protocol.server_state.default_headers:
            before += (name, b": ", value, b"\r\n")
        after: list[bytes] = []
        if body:
            before.append(_JSON_HEAD)
        for name, value in (*(extra or ()), *protocol.security_headers):
            after += (name, b": ", value, b"\r\n")
        if not keep_alive:
            after.append(b"connection: close\r\n")
        after.append(b"\r\n")
        if not body:
            return b"".join(before + after), b""
        return b"".join(before), b"".join(after)


class _Done:
    """The cycle of a request that is ignored: uvicorn's callbacks see it complete."""

    __slots__ = ()
    response_complete = True
    disconnected = True
    keep_alive = False
    more_body = False
    message_event = _NO_EVENT


_DONE = _Done()


class _Upgraded(asyncio.Protocol):
    """The protocol a WebSocket upgrade handed the socket to, unchanged but for one
    thing: the socket leaves the connection limit when it closes (uvicorn never tells
    the HTTP protocol that its connection is gone)."""

    __slots__ = ("left", "protocol")
    upgraded = True  # its unsent bytes are the WebSocket's to bound (http_unread)

    def __init__(self, protocol: asyncio.Protocol, left: Callable[[], None]) -> None:
        self.protocol, self.left = protocol, left

    def data_received(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def eof_received(self) -> bool | None:
        return self.protocol.eof_received()

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self.protocol.connection_lost(exc)
        finally:
            self.left()


class MinouHttpProtocol(HttpToolsProtocol):
    """uvicorn's protocol with coalesced writes and the hot routes answered in place."""

    api: HttpApi  # set by protocol_class
    security_headers: list[tuple[bytes, bytes]]
    waiting: HotCycle | None = None  # a consume's long poll, even behind pipelined requests
    socket: asyncio.Transport | None = None  # the real transport: what the limit counts
    refusal: TooManyConnections | None = None  # over the connection limit: answer this
    deadline: float | None = None  # loop time by which the headers being read must be in
    reading = False  # a request has begun and its headers are not complete
    head_bytes = 0  # bytes of its head received since then (one read's may be uncounted)
    head_tail = b""  # the last bytes read while in a head: a blank line may span two reads
    idle = False  # ``deadline`` is the idle timeout after a hot answer, not a head's
    _watchdog: asyncio.TimerHandle | None = None
    heads: ResponseHeads  # set by protocol_class: one per server
    # The identity checked at the headers of the request being read, kept only until
    # the end of the read that brought them (a revocation may come before the next).
    identity: Identity | None = None
    _hot_url: bytes | None = None  # the last URL a hot request had, and its target
    _hot_target: HotTarget | None = None

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # answered with "connection: close": read and dropped until closed
        if self.reading:
            # The parser keeps a header's pieces until the header is whole: bounded here,
            # not by time alone (a fast sender filled memory within the header timeout).
            # Only what comes before the blank line counts: a body may share the read.
            probe = self.head_tail + data
            end = probe.find(b"\r\n\r\n")
            self.head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self.head_tail))
            self.head_tail = probe[-3:]
            if self.head_bytes > MAX_HTTP_HEAD_BYTES:
                self._head_too_large()
                return
        try:
            super().data_received(data)
        finally:
            self.identity = None

    def _head_too_large(self) -> None:
        exc = BadRequest(f"the request line and headers are over {MAX_HTTP_HEAD_BYTES} bytes "
                         "(MAX_HTTP_HEAD_BYTES)", limit=MAX_HTTP_HEAD_BYTES)
        self.api.count_refusal(exc)
        oplog.request_head_too_large(self.client, MAX_HTTP_HEAD_BYTES)
        self.reading, self.deadline = False, None
        self._refuse_now_or_after(exc)

    def _refuse_now_or_after(self, exc: RequestError) -> None:
        """Answer ``exc`` and close; behind a request still being answered (pipelined),
        that answer goes out first and the connection closes after it, this request
        unanswered (as after a 408): an answer must never overtake an earlier one."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            self.closing = True  # the rest is read and dropped
        else:
            self.close_with(exc)

    def on_message_begin(self) -> None:
        # uvicorn arms the keep-alive timer when an answer completes and cancels it when
        # data arrives; an answer given while this read is parsed must not leave it
        # armed over the next request.
        self._unset_keepalive_if_required()
        self.reading, self.head_bytes, self.head_tail = True, 0, b""
        self.identity = None  # a pipelined request's own headers are checked for it
        if self.idle:  # the idle deadline of a hot answer ends: the headers' begins now
            self.idle, self.deadline = False, None
        self.expect_headers(self.api.server.settings.http_header_timeout)
        # What uvicorn's on_message_begin resets; its ASGI scope is made only for a
        # request that goes to the app (``_make_scope``): hot ones never read it.
        self.url, self.expect_100_continue, self.headers = b"", False, []

    def _make_scope(self) -> None:
        """uvicorn's scope for the request whose head was just read, as its
        ``on_message_begin`` makes it (keeping what the parser gave since)."""
        url, expect, headers = self.url, self.expect_100_continue, self.headers
        super().on_message_begin()
        self.url, self.expect_100_continue, self.headers = url, expect, headers
        self.scope["headers"] = headers

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]
        server = self.api.server
        self.socket = transport
        self.timeout_keep_alive = server.settings.http_idle_timeout  # type: ignore[assignment]
        self.refusal = server.admission.enter(transport, "http", self.client)
        if self.refusal is None:
            server.admission.idle(transport, transport.close)  # until a request's headers
            self.expect_headers(server.settings.http_header_timeout)
        elif not transport.is_closing():
            self.expect_headers(REFUSAL_WAIT_S)  # for a request to answer with a 503

    # ------------------------------------------------ the header deadline (slowloris)
    def expect_headers(self, seconds: float) -> None:
        """The headers being read (or the next request's) must be complete within
        ``seconds``, or sooner if an earlier deadline still runs: a new connection's
        first request has ``seconds`` from the connect, not from its first byte."""
        deadline = self.loop.time() + seconds
        if self.deadline is None or deadline < self.deadline:
            self.deadline = deadline
        self._watch()

    def _watch(self) -> None:
        """The one timer watches ``deadline``: armed if none is, re-armed if it would
        ring after it (it rings early otherwise, and the check re-arms it)."""
        watchdog = self._watchdog
        if watchdog is not None:
            if watchdog.when() <= self.deadline:  # type: ignore[operator]
                return
            watchdog.cancel()
        self._watchdog = self.loop.call_at(self.deadline, self._check_deadline)  # type: ignore[arg-type]

    def _check_deadline(self) -> None:
        self._watchdog = None
        deadline = self.deadline
        if deadline is None or self.closing or self.transport.is_closing():
            return
        if self.loop.time() < deadline:  # moved since the timer was armed
            self._watchdog = self.loop.call_at(deadline, self._check_deadline)
            return
        self.deadline = None
        if not self.reading:
            self.transport.close()  # sent no request (or only blank lines): idle
        elif self.refusal is not None:
            self.close_with(self.refusal, (b"retry-after", b"1"))
        else:
            self._too_slow()

    def _too_slow(self) -> None:
        seconds = self.api.server.settings.http_header_timeout
        exc = RequestTimeout(f"the request's headers were not complete within {seconds:g} s "
                             f"(http_header_timeout)", limit=seconds)
        self.api.count_refusal(exc)
        oplog.request_too_slow(self.client, seconds)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # the request before this one is answered, then close
        else:
            self.close_with(exc)

    def close_with(self, exc: RequestError, *headers: tuple[bytes, bytes]) -> None:
        """Answer ``exc`` (a refusal, a 408) to the request being read and close: after
        lingering, as its client may still be sending."""
        status, body, extra = http_error(exc)
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *extra, *headers,
                            *self.security_headers):
            head += (name, b": ", value, b"\r\n")
        head += (_JSON_HEAD, b"%d\r\nconnection: close\r\n\r\n" % len(body), body)
        self.cycle = _DONE  # type: ignore[assignment]
        self.transport.write_now(b"".join(head))  # type: ignore[attr-defined]
        self.finish(lingering=True)

    def hot_response_complete(self) -> None:
        """A hot answer went out: what uvicorn's ``on_response_complete`` does, but the
        idle timeout is the connection's one lazy deadline (``_check_deadline``), not a
        timer made and cancelled per request."""
        if self.pipeline:  # requests queued behind it go to the app: uvicorn's way
            self.on_response_complete()
            return
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        self.idle, self.deadline = True, self.loop.time() + self.timeout_keep_alive
        self._watch()
        socket = self.socket
        self.api.server.admission.idle(socket, socket.close)  # type: ignore[union-attr]

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.pipeline and not self.transport.is_closing():
            # uvicorn reads on after every answer, however many requests still wait: a
            # client pipelining without reading the answers grew the queue by a read's
            # worth of requests per answer. Read on once they are all answered.
            self.flow.pause_reading()
        if not self.pipeline and self.cycle is not None and self.cycle.response_complete \
                and not self.transport.is_closing():
            socket = self.socket
            self.api.server.admission.idle(socket, socket.close)  # type: ignore[union-attr]
        if self.timeout_keep_alive_task is not None:  # idle now, nothing in the pipeline
            # Data cancels uvicorn's idle timer even if it begins no request (blank
            # lines): the next request's headers are due by idle + header timeout.
            self.expect_headers(self.timeout_keep_alive
                                + self.api.server.settings.http_header_timeout)

    def handle_websocket_upgrade(self) -> None:
        if self.closing or self.transport.is_closing():
            return  # refused (answered with a 503), or behind a "connection: close"
        self.deadline = None
        self.api.server.admission.busy(self.socket)
        super().handle_websocket_upgrade()
        socket = self.socket
        assert socket is not None
        socket.set_protocol(_Upgraded(socket.get_protocol(),  # type: ignore[arg-type]
                                      partial(self.api.server.admission.leave, socket)))

    closing = False  # answered with "connection: close"; nothing more is done

    def finish(self, *, lingering: bool) -> None:
        """Close after an answer with "connection: close". With the request's body
        still arriving (a 413), read and drop it for a moment first: closing with
        unread data makes the kernel send a reset, which can destroy the answer
        before the client reads it (nginx's lingering close)."""
        self.closing = True
        if lingering:
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def on_headers_complete(self) -> None:
        self.reading, self.deadline = False, None
        self.api.server.admission.busy(self.socket)  # being answered: keeps its place
        if self.refusal is not None and not self.closing:
            self.close_with(self.refusal, (b"retry-after", b"1"))
        elif self.closing or self.transport.is_closing():
            # Requests behind one answered with "connection: close" (or a 413): the
            # client must assume they were not done, so none is.
            self.cycle = _DONE  # type: ignore[assignment]
        elif self._refused_before_body() or self._no_room_for_body():
            self.cycle = _DONE  # type: ignore[assignment]
        elif len(self.pipeline) >= MAX_HTTP_PIPELINE:
            self._pipeline_full()
        elif self._hot_cycle() is None:
            self._make_scope()
            super().on_headers_complete()

    def _pipeline_full(self) -> None:
        """MAX_HTTP_PIPELINE requests wait behind the one being answered: they are
        answered, the last with the close, and nothing after them is done (a read
        parsed whole may hold thousands; the client sends them again, as after any
        close). An answer here would overtake the ones queued."""
        limit = MAX_HTTP_PIPELINE
        self.api.count_refusal(BadRequest(
            f"over {limit} HTTP requests pipelined (MAX_HTTP_PIPELINE)", limit=limit))
        oplog.request_pipeline_full(self.client, limit)
        self.pipeline[0][0].keep_alive = False  # the newest: answered last, then the close
        self.closing = True  # the rest is read and dropped
        self.cycle = _DONE  # type: ignore[assignment]

    def _refused_before_body(self) -> bool:
        """A request with a body and no valid token is answered 401 at its headers: its
        body is not waited for (bodies have no time limit, so a stranger sending one
        slowly held a connection slot for as long as it liked). Every route that takes
        a body needs a token; the check is cached per token like the route's own."""
        api = self.api
        cycle = self.cycle
        if api.server.settings.auth_mode == "off" or (
                cycle is not None and not cycle.response_complete):
            return False  # behind a request being answered, the route checks it after
        authorization = None
        body = False
        for name, value in self.headers:
            if name == b"authorization":
                if authorization is None:  # the first, as the routes take it
                    authorization = value.decode("latin-1")
            elif (name == b"content-length" and value.strip(b" \t0")) \
                    or name == b"transfer-encoding":
                body = True
        if not body:
            return False
        query_token = None
        if not authorization:  # as the routes: an empty header gives way to the query
            try:
                query = httptools.parse_url(self.url).query or b""
            except httptools.HttpParserInvalidURLError:
                query = b""
            query_token = dict(parse_qsl(query.decode("latin-1"))).get("access_token")
        try:
            self.identity = api.auth.identify(authorization, query_token, self.client)
        except NotAuthenticated as exc:
            api.count_refusal(exc)
            self.close_with(exc)
            return True
        return False

    body_reserved = False  # room reserved for the body being read (input_budget.py)

    def _no_room_for_body(self) -> bool:
        """A body over INPUT_SMALL_BYTES is read only with room reserved for it in the
        broker's budget of unfinished input: else the request is answered 503 at its
        headers (a socket client waits instead; an HTTP client retries, and the body it
        has not sent yet is not held meanwhile)."""
        size = 0
        for name, value in self.headers:
            if name == b"content-length":
                try:
                    size = int(value)
                except ValueError:
                    return False  # the parser refuses it
            elif name == b"transfer-encoding":
                size = self.api.body_limit(one_message=False)  # no length known: the most
        if size <= INPUT_SMALL_BYTES:
            return False
        size = min(size, self.api.body_limit(one_message=False) + 1)  # refused past it
        server = self.api.server
        budget = server.input_budget
        identity = self.identity
        client = identity.client_id if identity is not None else oplog.peer_host(
            oplog.peer_text(self.client))
        if budget.reserve(self, client, size, time.monotonic()):
            self.body_reserved = True
            return False
        oplog.input_budget_full(self.client, identity.client_id if identity else None, size,
                                budget.stats())
        exc = InputBusy(
            f"the broker is taking in {budget.used} bytes of bodies and frames over "
            f"{INPUT_SMALL_BYTES} bytes (its limit {budget.total}, one client's "
            f"{budget.per_client}): try again", limit=budget.total, retry_after=1)
        self.api.count_refusal(exc)
        budget.waits += 1
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            self._refuse_now_or_after(exc)  # an earlier request's answer goes first
        else:
            self.close_with(exc)  # with Retry-After (detail.retry_after)
        return True

    def release_body(self) -> None:
        if self.body_reserved:
            self.body_reserved = False
            self.api.server.input_done(self)

    def input_granted(self) -> None:  # never queued: refused with a 503 instead
        pass

    def input_too_slow(self) -> None:
        """The body did not arrive in the time its reservation gave: a 408 and the
        close (a route waiting for the body is told its client is gone)."""
        budget = self.api.server.input_budget
        size = budget.reserved(self)
        seconds = budget.allowed_seconds(size)
        self.release_body()
        if self.closing or self.transport.is_closing():
            return
        exc = RequestTimeout(
            f"a request body of {size} bytes did not arrive within {seconds:.0f} s: bodies "
            f"over {INPUT_SMALL_BYTES} bytes must come at {INPUT_MIN_RATE >> 10} KiB/s or "
            f"faster after the first {INPUT_GRACE_S:g} s", limit=seconds)
        self.api.count_refusal(exc)
        oplog.input_too_slow(self.client, None, "request body", size, seconds)
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle, HotCycle) \
                and not cycle.response_complete:
            cycle.disconnected = True  # its route stops waiting for the body
            cycle.message_event.set()
        self.close_with(exc)

    def _hot_cycle(self) -> HotCycle | None:
        parser = self.parser
        if (self.expect_100_continue or self.limit_concurrency is not None
                or (self.cycle is not None and not self.cycle.response_complete)
                or parser.get_method() != b"POST" or parser.should_upgrade()):
            return None
        if self.url == self._hot_url:
            target = self._hot_target
        else:
            target = _hot_target(self.url)
            if target is None or target.kind not in _ONE_USE_KINDS:
                self._hot_url, self._hot_target = self.url, target
        if target is None:
            return None
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        self.cycle = HotCycle(self, target, keep_alive)  # type: ignore[assignment]
        return self.cycle  # type: ignore[return-value]

    def connection_lost(self, exc: Exception | None) -> None:
        self.api.server.admission.leave(self.socket)
        self.release_body()
        if self._watchdog is not None:
            self._watchdog.cancel()
        waiting = self.waiting
        if waiting is not None and waiting.give_up is not None:
            waiting.give_up()  # a consume stops waiting for a client that is gone
        super().connection_lost(exc)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if isinstance(cycle, HotCycle):
            cycle.add_body(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self.body_reserved:  # the body is whole: what it holds now is the request's
            self.release_body()
        cycle = self.cycle
        if isinstance(cycle, HotCycle):
            cycle.run()
        else:
            super().on_message_complete()


def _hot_target(url: bytes) -> HotTarget | None:
    """The hot route a POST to ``url`` takes, or None: uvicorn's cycle and the app
    answer it (any other route, or a URL uvicorn must refuse)."""
    try:
        parsed = httptools.parse_url(url)
        path = parsed.path.decode("ascii")
    except (httptools.HttpParserInvalidURLError, UnicodeDecodeError):
        return None  # uvicorn's own handling answers it
    found = hot_route(unquote(path) if "%" in path else path)
    if found is None or found[0] not in HOT_KINDS:
        return None
    return HotTarget(found[0], found[1], parsed.path, parsed.query or b"")


def protocol_class(api: HttpApi, security_headers: list[tuple[bytes, bytes]]) -> type:
    """The protocol for ``uvicorn.Config(http=...)``; AttributeError if this uvicorn's
    protocol lacks what the fast path uses."""
    for name in ("on_response_complete", "on_headers_complete", "on_body",
                 "on_message_complete", "connection_made"):
        getattr(HttpToolsProtocol, name)
    return type("MinouHttpProtocol", (MinouHttpProtocol,),
                {"api": api, "security_headers": security_headers,
                 "heads": ResponseHeads()})
