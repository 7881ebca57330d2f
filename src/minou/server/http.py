"""The HTTP listener in the broker's own loop (uvicorn): the HTTP API
(``http_api``), the JSON stream (``http_stream``), the native protocol over
WebSocket (``/v1/ws``: binary messages carry native frames) and the OpenAPI
document.
"""

from __future__ import annotations

import asyncio
import contextlib
import dis
import importlib
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

import httptools
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..errors import StartupError
from ..limits import (
    CONSUMER_WRITE_HIGH,
    CONSUMER_WRITE_LOW,
    INPUT_SMALL_BYTES,
    INPUT_STEP_BYTES,
    MAX_HELLO_FRAME_SIZE,
)
from . import oplog
from .connection import NativeConnection

if TYPE_CHECKING:
    from .ports import Server

log = logging.getLogger("minou.http")

# The uvicorn releases the HTTP protocol (http_fast) is tested with: pyproject.toml pins
# the same range (tests/unit/test_http_fast_check.py checks that the two agree).
UVICORN_TESTED = ">=0.29,<0.55"
# What http_fast builds on in uvicorn, none of it public API: the names of uvicorn's
# httptools protocol module, the methods of its protocol that it overrides or calls, and
# the state of a connection it reads (set in the protocol's __init__, connection_made
# and on_message_begin, and in ServerState's __init__).
_FAST_PATH_MODULE = "uvicorn.protocols.http.httptools_impl"
_FAST_PATH_NAMES = ("HttpToolsProtocol", "STATUS_LINE")
_FAST_PATH_METHODS = ("connection_made", "connection_lost", "on_message_begin",
                      "on_headers_complete", "on_body", "on_message_complete",
                      "on_response_complete", "handle_websocket_upgrade",
                      "_unset_keepalive_if_required")
_FAST_PATH_STATE = ("loop", "parser", "transport", "client", "server_state", "cycle", "url",
                    "headers", "expect_100_continue", "limit_concurrency",
                    "timeout_keep_alive", "timeout_keep_alive_task", "flow", "pipeline",
                    "scope")
_STATE_SET_IN = ("__init__", "connection_made", "on_message_begin")
# ... and of httptools (public API, but the fast path reads the parser directly).
_PARSER_METHODS = ("get_method", "get_http_version", "should_keep_alive", "should_upgrade")


def _stored_attributes(*functions: Any) -> set[str]:
    """The ``self.<name> = ...`` (any ``<obj>.<name> = ...``) of these functions."""
    names: set[str] = set()
    for function in functions:
        code = getattr(function, "__code__", None)
        if code is not None:
            names.update(str(i.argval) for i in dis.get_instructions(code)
                         if i.opname == "STORE_ATTR")
    return names


def fast_path_missing() -> list[str]:
    """What the HTTP protocol (http_fast) needs of uvicorn and httptools that this
    install lacks, by name; empty when nothing is."""
    try:
        impl = importlib.import_module(_FAST_PATH_MODULE)
    except ImportError as exc:
        return [f"the module {_FAST_PATH_MODULE} ({exc})"]
    missing = [f"{_FAST_PATH_MODULE}.{name}" for name in _FAST_PATH_NAMES
               if not hasattr(impl, name)]
    protocol = getattr(impl, "HttpToolsProtocol", None)
    if protocol is not None:
        missing += [f"HttpToolsProtocol.{name}()" for name in _FAST_PATH_METHODS
                    if not callable(getattr(protocol, name, None))]
        stored = _stored_attributes(*(getattr(protocol, name, None) for name in _STATE_SET_IN))
        missing += [f"HttpToolsProtocol.{name} (set by none of {', '.join(_STATE_SET_IN)})"
                    for name in _FAST_PATH_STATE if name not in stored]
    status_line = getattr(impl, "STATUS_LINE", None)
    if status_line is not None and not (isinstance(status_line, dict)
                                        and isinstance(status_line.get(200), bytes)):
        missing.append(f"{_FAST_PATH_MODULE}.STATUS_LINE as a dict of status -> bytes")
    server_state = getattr(importlib.import_module("uvicorn.server"), "ServerState", None)
    if "default_headers" not in _stored_attributes(getattr(server_state, "__init__", None)):
        missing.append("uvicorn.server.ServerState.default_headers")
    missing += [f"httptools.HttpRequestParser.{name}()" for name in _PARSER_METHODS
                if not hasattr(httptools.HttpRequestParser, name)]
    missing += [f"httptools.{name}" for name in ("parse_url", "HttpParserInvalidURLError")
                if not hasattr(httptools, name)]
    return missing


def check_fast_path() -> None:
    """A StartupError naming this uvicorn's version and all that the HTTP protocol
    (http_fast) builds on and it lacks; nothing if it lacks nothing. The broker calls
    this before it locks its data directory, so such an install fails at once, loudly,
    rather than quietly serving HTTP some other way."""
    missing = fast_path_missing()
    if missing:
        raise StartupError(
            f"uvicorn {uvicorn.__version__} lacks what minou's HTTP protocol "
            f"(minou/server/http_fast.py) builds on: {'; '.join(missing)}. minou is tested "
            f"with uvicorn{UVICORN_TESTED}: install such a release "
            f"(pip install 'uvicorn{UVICORN_TESTED}')")


class _WebSocketTransport:
    """Gives NativeConnection the transport surface it expects, over a WebSocket: with
    the same write water marks as TCP (deliveries pause past CONSUMER_WRITE_HIGH and
    resume under CONSUMER_WRITE_LOW), and an abort that really ends the socket."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.buffered = 0
        self.closed = False
        self.paused = asyncio.Event()
        self.paused.set()
        self.conn: NativeConnection | None = None
        self.writing_paused = False
        self.task: asyncio.Task[Any] | None = None  # the socket's reader

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.buffered += len(data)
            self.queue.put_nowait(data)
            if not self.writing_paused and self.buffered > CONSUMER_WRITE_HIGH \
                    and self.conn is not None:
                self.writing_paused = True
                self.conn.set_paused(True)

    def sent(self, size: int) -> None:
        self.buffered -= size
        if self.writing_paused and self.buffered < CONSUMER_WRITE_LOW and self.conn is not None:
            self.writing_paused = False
            self.conn.set_paused(False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)

    def abort(self) -> None:
        """Drop what is queued and end the socket, even if its peer reads nothing."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.buffered = 0
        self.closed = True
        self.queue.put_nowait(None)
        if self.task is not None:
            self.task.cancel()

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None:
        self.paused.clear()

    def resume_reading(self) -> None:
        self.paused.set()


def build_app(server: Server) -> Any:
    from ..errors import BadRequest, NotFound, UnexpectedFrame
    from .http_api import FastLane, HttpApi, error_response
    from .http_stream import WS_OWNER, serve_stream
    from .openapi import document

    api = HttpApi(server)
    spec = document()

    async def openapi(request: Request) -> JSONResponse:
        return JSONResponse(spec)

    async def stream(ws: WebSocket) -> None:
        await serve_stream(api, ws)

    async def native_ws(ws: WebSocket) -> None:
        await ws.accept()
        transport = _WebSocketTransport(ws)
        conn = NativeConnection(server, transport, oplog.peer_text(ws.client, "ws"))
        ws.scope[WS_OWNER] = conn
        transport.conn, transport.task = conn, asyncio.current_task()
        server.admit(conn)
        socket_ = ws.scope.get(WS_SOCKET)
        if socket_ is not None:  # at the limit, its place may go to a newcomer until HELLO
            conn.admitted_as = socket_
            server.admission.idle(socket_, conn.evicted)

        async def pump_out() -> None:
            while (data := await transport.queue.get()) is not None:
                await ws.send_bytes(data)
                transport.sent(len(data))
            with contextlib.suppress(Exception):
                await ws.close()

        sender = asyncio.create_task(pump_out())
        try:
            while not transport.closed:
                await transport.paused.wait()
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("bytes")
                if data is None:
                    conn.refuse(UnexpectedFrame(
                        "/v1/ws carries native frames in binary messages, not text; JSON "
                        "messages go to /v1/stream"))
                    break
                conn.receive(data)
        except (WebSocketDisconnect, asyncio.CancelledError):
            pass
        finally:
            conn.lost()
            server.connections.discard(conn)
            transport.close()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(sender, 2)

    async def not_found(request: Request, exc: Exception) -> Response:
        return error_response(NotFound(f"no route {request.method} {request.url.path}"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(BadRequest(f"{request.method} is not allowed on "
                                         f"{request.url.path}"))

    routes: list[Any] = [
        *api.routes(),
        Route("/openapi.json", openapi, methods=["GET"]),
        WebSocketRoute("/v1/ws", native_ws),
        WebSocketRoute("/v1/stream", stream),
    ]
    from ..dashboard import STATIC_DIR

    if (STATIC_DIR / "index.html").exists():
        from .http_assets import DashboardAssets

        routes.append(Mount("/", app=DashboardAssets(STATIC_DIR), name="dashboard"))
    app = Starlette(exception_handlers={404: not_found, 405: not_allowed}, routes=routes)
    FastLane.SECURITY_HEADERS = _SecurityHeaders.HEADERS
    return FastLane(api, _SecurityHeaders(app))


class _SecurityHeaders:
    """Headers every response carries: the dashboard runs only its own scripts, is never
    framed, and leaks no URLs (ASGI middleware, so streaming and WebSockets pass)."""

    HEADERS = [
        (b"content-security-policy",
         b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
         b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
    ]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield  # the broker owns the process signals


def http_config(server: Server, **more: Any) -> uvicorn.Config:
    """uvicorn's configuration of the broker's HTTP listener. ``log_config=None``:
    uvicorn's own logging setup would give its loggers their own handlers and format;
    without it they go through the broker's (cli.py), one format in one log."""
    tls: dict[str, Any] = {}
    if server.tls is not None:
        tls = {"ssl_certfile": str(server.tls.cert), "ssl_keyfile": str(server.tls.key)}
    app = build_app(server)
    return uvicorn.Config(app, log_level="warning", lifespan="off",
                          http=_http_protocol(app),
                          ws=_ws_protocol(server),
                          access_log=False, server_header=False,
                          # A peer that answers no ping within two intervals is gone.
                          ws_ping_interval=server.settings.websocket_heartbeat,
                          ws_ping_timeout=server.settings.websocket_heartbeat,
                          # The protocol (http_fast) reads the live setting per connection.
                          timeout_keep_alive=server.settings.http_idle_timeout,  # type: ignore[arg-type]
                          # X-Forwarded-* are not trusted: nothing here reads the peer
                          # address, and the middleware cost 9 % of each request.
                          proxy_headers=False, log_config=None, **tls, **more)


async def start_http(server: Server, sock: socket.socket) -> tuple[Any, tuple[str, int]]:
    """Serve the HTTP API on ``sock`` (bound by the caller: see binding.py)."""
    config = http_config(server)
    if server.tls is not None:
        from ..tls import server_context
        from .oplog import watch_handshakes

        config.load()
        # Our context (hardened as the native one), reporting failed handshakes.
        config.ssl = watch_handshakes(server_context(server.tls), "HTTP",
                                      server.count_tls_failure)
    http = _EmbeddedServer(config)
    server.http_task = asyncio.create_task(http.serve(sockets=[sock]))
    while not http.started:
        if server.http_task.done():
            server.http_task.result()
        await asyncio.sleep(0.01)
    addr = sock.getsockname()
    return http, (addr[0], addr[1])


def _http_protocol(app: Any) -> Any:
    """minou's protocol (http_fast); a StartupError if this uvicorn lacks what it
    builds on (see check_fast_path: BrokerServer.start has called it already)."""
    check_fast_path()
    from .http_fast import protocol_class

    return protocol_class(app.api, _SecurityHeaders.HEADERS)


WS_SOCKET = "minou.socket"  # a WebSocket's transport, in its scope (admission.py)


def _ws_protocol(server: Server) -> Any:
    """uvicorn's sans-I/O WebSocket protocol, except that a text message that is not
    UTF-8 closes the socket with 1007 (RFC 6455) counted as ``invalid_payload``, and
    without the traceback uvicorn logs for it (a client can send those at will), and a
    socket cut for answering no ping is counted and logged as a dead connection;
    uvicorn's default if this uvicorn lacks that protocol."""
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )
        from websockets.protocol import State
        for name in ("send_receive_event_to_app", "handle_parser_exception"):
            getattr(WebSocketsSansIOProtocol, name)
    except (ImportError, AttributeError):
        return "auto"
    from .http_stream import WS_OWNER

    refuse = server.core.counters.refuse

    class MinouWebSocketProtocol(WebSocketsSansIOProtocol):
        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            if getattr(self, "scope", None):  # the route reaches the socket's admission
                self.scope[WS_SOCKET] = getattr(  # type: ignore[literal-required]
                    self.transport, "socket", self.transport)

        def keepalive_timeout(self) -> None:
            """No pong in time. uvicorn reads nothing (pongs included) while the route is
            not receiving: when the route paused on purpose (flow control), the silence
            is ours, and the socket is pinged again rather than cut, as the native
            heartbeat does. A socket that really went quiet is cut as uvicorn does, and
            counted and logged like a native connection missing its heartbeats (not
            when its route had closed it already: that was counted where it happened)."""
            owner = self.scope.get(WS_OWNER) if self.scope else None
            if owner is not None and not (self.close_sent or self.transport.is_closing()):
                if owner.silence_is_ours():
                    self.pong_timer = None
                    self.pending_ping_payload = None
                    self.schedule_ping()
                    return
                if not owner.closed:
                    session = owner.session
                    server.dead_connections += 1
                    oplog.connection_dead(
                        oplog.peer_text(self.client, "ws"),
                        session.client_id if session is not None else None,
                        (self.ping_interval or 0) + (self.ping_timeout or 0),
                        self.ping_interval or 0, len(session.leases) if session else 0)
                    super().keepalive_timeout()
                    # Not a close that waits for the peer to read what is buffered (it
                    # reads nothing): the deliveries it holds go back now.
                    self.transport.abort()
                    return
            super().keepalive_timeout()

        def data_received(self, data: bytes) -> None:
            """/v1/ws carries a native connection: until its HELLO is accepted a message is
            a HELLO's size, not ws_max_size (the native reader refuses larger frames, but
            websockets gathered a stranger's 16 MiB message whole first). So are frames
            that come with the upgrade request itself, before the path is known."""
            scope = getattr(self, "scope", None)
            if not scope:
                hello = True
            elif scope.get("path") == "/v1/ws":
                owner = scope.get(WS_OWNER)
                hello = owner is None or owner.identity is None
            else:
                hello = False
            # A message of one HELLO: the frame and its 4-byte length.
            self.conn.max_message_size = (MAX_HELLO_FRAME_SIZE + 4 if hello
                                          else self.config.ws_max_size)
            super().data_received(data)
            if not hello and (self.frames or self.input_reserved
                              or len(self.conn.reader.buffer) > INPUT_SMALL_BYTES):
                self._reserve_input(scope)

        input_reserved = 0  # bytes of the budget of unfinished input (input_budget.py)

        def _reserve_input(self, scope: Any) -> None:
            """A message still arriving holds room in the broker's budget of unfinished
            input past INPUT_SMALL_BYTES, grown a MiB at a time (its size is not known
            ahead); a socket that finds none is closed with 1013 (try again later), as an
            HTTP body is refused with a 503."""
            held = len(self.conn.reader.buffer) + sum(map(len, self.frames))
            if held <= INPUT_SMALL_BYTES:
                self.release_input()
                return
            if held <= self.input_reserved or self.close_sent:
                return
            step = INPUT_STEP_BYTES
            want = min(-(-held // step) * step, self.config.ws_max_size + 1)
            owner = scope.get(WS_OWNER) if scope else None
            identity = getattr(owner, "identity", None)
            client = identity.client_id if identity is not None else oplog.peer_host(
                oplog.peer_text(self.client))
            budget = server.input_budget
            if budget.grow(self, client, want, time.monotonic()):
                self.input_reserved = want
                return
            refuse("input_busy")
            budget.waits += 1
            oplog.input_budget_full(oplog.peer_text(self.client, "ws"), client, want,
                                    budget.stats())
            self.release_input()
            self._close_now(1013, "too many large messages arriving at once: try again")

        def release_input(self) -> None:
            if self.input_reserved:
                self.input_reserved = 0
                server.input_done(self)

        def input_granted(self) -> None:  # never queued: closed with 1013 instead
            pass

        def input_too_slow(self) -> None:
            """The message did not arrive in the time its reservation gave: closed with
            1008 (a policy), counted as a request timeout."""
            size = self.input_reserved
            self.release_input()
            if self.close_sent or self.transport.is_closing():
                return
            refuse("request_timeout")
            oplog.input_too_slow(oplog.peer_text(self.client, "ws"), None, "WebSocket message",
                                 size, server.input_budget.allowed_seconds(size))
            self._close_now(1008, "a message arrived too slowly (INPUT_MIN_RATE)")

        def _close_now(self, code: int, reason: str) -> None:
            self.frames = []
            if self.conn.state is State.OPEN:
                self.conn.send_close(code, reason)
                self.handle_parser_exception()
            else:
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self.release_input()
            super().connection_lost(exc)

        def send_receive_event_to_app(self) -> None:
            if self.input_reserved:  # a whole message: the next one's clock starts anew
                self.release_input()
            if getattr(self, "curr_msg_data_type", None) == "text" and not self.close_sent:
                data = b"".join(self.frames)
                try:
                    data.decode()
                except UnicodeDecodeError:
                    self.frames = []
                    refuse("invalid_payload")
                    if self.conn.state is State.OPEN:  # else a close is under way already
                        self.conn.send_close(1007, "a text message must be UTF-8")
                        self.handle_parser_exception()
                    return
                self.frames = [data]
            super().send_receive_event_to_app()

    return MinouWebSocketProtocol
