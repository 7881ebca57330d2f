"""The asyncio client.

Publishes are coalesced: every ``send`` made in one turn of the event loop
goes out in one PUBLISH frame, and its CONFIRM resolves each caller's future.
Acks are coalesced the same way. On a lost connection the client reconnects
to the next URL (with backoff), subscribes again and resends every publish
that was not confirmed; each publish carries its producer sequence, so a
resend the broker already stored is answered as a duplicate, not stored again.
While disconnected, sends wait in a bounded queue; past its limit ``send``
raises ``SendQueueFull``. Heartbeats tell a hung broker or a silent network
from a quiet one; ``confirm_timeout`` bounds every publish (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
import random
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast
from urllib.parse import urlsplit

import msgspec
from websockets.exceptions import InvalidHandshake, InvalidURI

from ..auth.keys import PrivateKey, load_private, public_pem
from ..auth.tokens import make_token
from ..errors import (
    BadRequest,
    ConfigError,
    ConnectionClosed,
    ErrorCode,
    FrameTooLarge,
    MinouError,
    NotAuthenticated,
    PendingApproval,
    RequestError,
    SendQueueFull,
    Standby,
    Timeout,
    describe,
    error_from_code,
)
from ..limits import (
    CLIENT_CONFIRM_TIMEOUT_S,
    CLIENT_FRAME_BYTES,
    CLIENT_FRAME_MESSAGES,
    CLIENT_HANDSHAKE_TIMEOUT_S,
    CLIENT_MAX_NUMBERED_CHANNELS,
    CLIENT_RECONNECT_MAX_S,
    CLIENT_RECONNECT_MIN_S,
    CLIENT_REQUEST_TIMEOUT_S,
    CLIENT_SEND_QUEUE,
    CLIENT_STANDBY_RETRY_S,
    DEFAULT_CREDENTIAL_TTL_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT_S,
    HEARTBEAT_MISSES,
    MAX_DELAY_S,
    MAX_FRAME_SIZE,
    MAX_PRIORITY,
    MIN_PRIORITY,
    PROTOCOL_VERSION,
)
from ..protocol import frames as f
from ..protocol.reader import BadFrame, FrameReader
from .kv import KeyValue, PersistentObject
from .message import Message, Receipt, Settlement, until_closed
from .peers import PEER_PREFETCH, Peer, peer_channels, peer_group
from .requests import Requester, RequestHandler, make_responder, serve_each

log = logging.getLogger("minou.client")
_json_encode = msgspec.json.encode
Handler = Callable[[Message], Awaitable[Any] | Any]


def parse_url(url: str) -> tuple[str, str, int, str]:
    """``minou://host:port`` (``minous://`` with TLS), ``host:port`` or
    ``ws://host:port[/v1/ws]`` (``wss://`` with TLS).

    Returns (scheme, host, port, path); ``ws``/``wss`` carry the same frames
    over WebSocket (for proxies and firewalls).
    """
    if "://" not in url:
        url = "minou://" + url
    parts = urlsplit(url)
    if parts.scheme in ("minou", "tcp", "minous"):
        scheme = "minous" if parts.scheme == "minous" else "minou"
        return scheme, parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT, ""
    if parts.scheme in ("ws", "wss"):
        default = 443 if parts.scheme == "wss" else 80
        return parts.scheme, parts.hostname or "127.0.0.1", parts.port or default, (
            parts.path or "/v1/ws")
    hint = ""
    if parts.scheme in ("http", "https"):
        hint = (f"; {parts.scheme}:// is the broker's HTTP API, the client speaks its native "
                "port (minou://host:7700) or WebSocket on the HTTP port "
                f"({'wss' if parts.scheme == 'https' else 'ws'}://host:port/v1/ws)")
    raise ConfigError(f"unsupported broker URL {url!r}: use minou://host:port, "
                      f"minous://host:port (TLS), ws:// or wss://{hint}")


class _WebSocketTransport:
    """The few transport methods the client uses, over a websockets connection."""

    def __init__(self, ws: Any, proto: _Protocol) -> None:
        self.ws = ws
        self.proto = proto
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.tasks = [asyncio.create_task(self._send_loop()), asyncio.create_task(self._recv())]

    def write(self, data: bytes) -> None:
        self.queue.put_nowait(data)

    def close(self) -> None:
        self.queue.put_nowait(None)

    def abort(self) -> None:
        self.ws.transport.abort()
        self.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    async def _send_loop(self) -> None:
        try:
            while (data := await self.queue.get()) is not None:
                await self.ws.send(data)
        except Exception:  # the receive side reports the loss
            pass
        finally:
            await self.ws.close()

    async def _recv(self) -> None:
        exc: Exception | None = None
        try:
            async for message in self.ws:
                self.proto.data_received(message if isinstance(message, bytes)
                                         else message.encode())
        except Exception as e:
            exc = e
        self.queue.put_nowait(None)
        self.proto.connection_lost(exc)


async def _connect_ws(client: Client, scheme: str, host: str, port: int, path: str) -> _Protocol:
    from websockets.asyncio.client import connect as ws_connect

    extra: dict[str, Any] = {"ssl": client._tls_context()} if scheme == "wss" else {}
    ws = await ws_connect(f"{scheme}://{host}:{port}{path}", max_size=None, compression=None,
                          **extra)
    if scheme == "wss" and client.tls_fingerprint:
        from ..tls import check_pin

        try:
            check_pin(ws.transport.get_extra_info("ssl_object"), client.tls_fingerprint)
        except BaseException:
            await ws.close()
            raise
    proto = _Protocol(client)
    proto.connection_made(_WebSocketTransport(ws, proto))  # type: ignore[arg-type]
    return proto


class _Protocol(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()
        self.where = ""  # the broker's URL, for errors and logs
        self.last_heard = time.monotonic()
        self.sent = 0  # bytes written: unchanged for an interval means a heartbeat is due
        self.heartbeat = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._due = self._send_due = 0.0
        self._sent_seen = 0

    def start_heartbeats(self, interval: float) -> None:
        """Keep the negotiated heartbeat: send one when nothing else went out for an
        interval; declare the broker dead when nothing came in for two."""
        if interval <= 0 or self.transport is None:
            return
        self.heartbeat = interval
        now = time.monotonic()
        self.last_heard = now
        self._send_due = now + interval / 2
        self._sent_seen = self.sent
        self._schedule(now)

    def _schedule(self, now: float) -> None:
        self._due = min(self._send_due, self.last_heard + HEARTBEAT_MISSES * self.heartbeat)
        self._timer = asyncio.get_running_loop().call_at(max(self._due, now), self._beat)

    def _beat(self) -> None:
        self._timer = None
        if self.transport is None or self.lost.done():
            return
        now = time.monotonic()
        interval = self.heartbeat
        if now - self._due > interval:
            self.last_heard = now  # this process was paused or its loop blocked: our silence
        silent = now - self.last_heard
        if silent >= HEARTBEAT_MISSES * interval:
            self.client._on_dead(self, silent)
            return
        if now >= self._send_due:
            if self.sent == self._sent_seen:
                self.transport.write(f.encode(f.Heartbeat()))
                self.sent += 1
            self._sent_seen = self.sent
            self._send_due = now + interval / 2
        self._schedule(now)

    def stop_heartbeats(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.last_heard = time.monotonic()
        self.reader.receive_data(data)
        try:
            while (ev := self.reader.next_event()) is not None:
                self.client._on_frame(self, ev)
        except MinouError as exc:
            log.error("broker sent an unreadable stream: %s", exc)
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_heartbeats()
        if not self.lost.done():
            self.lost.set_result(exc)
        self.client._on_lost(self)


class Subscription:
    """A listen or consume registration. Iterate it, or give it a handler."""

    def __init__(self, client: Client, sid: int, frame: f.Subscribe,
                 handler: Handler | None) -> None:
        self.client = client
        self.sid = sid
        self.frame = frame
        self.handler = handler
        self.patterns = list(frame.patterns)
        self._queue: deque[Message] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        self._ended: MinouError | None = None  # why the broker ended it (a reload's rules)
        self._task: asyncio.Task[None] | None = None
        if handler is not None:
            self._task = asyncio.create_task(self._run_handler())

    def _push(self, msgs: list[Message]) -> None:
        self._queue.extend(msgs)
        self._wakeup.set()

    async def get(self, timeout: float | None = None) -> Message:
        """The next message; raises Timeout after ``timeout`` seconds."""
        while not self._queue:
            if self._ended is not None:
                raise self._ended
            if self._closed:
                raise ConnectionClosed("subscription closed")
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                raise Timeout(f"no message within {timeout} s") from None
        return self._queue.popleft()

    def get_nowait(self) -> Message | None:
        return self._queue.popleft() if self._queue else None

    def __aiter__(self) -> AsyncIterator[Message]:
        return until_closed(self.get)

    def _end(self, why: MinouError) -> None:
        """The broker ended this subscription (a reload's rules no longer allow it):
        what came before is still handed out, then ``get`` and iteration raise ``why``."""
        self._ended = why
        self._closed = True
        self._wakeup.set()

    async def _run_handler(self) -> None:
        try:
            await self._handle_each()
        except MinouError as exc:
            log.error("subscription %d ended: %s", self.sid, exc)

    async def _handle_each(self) -> None:
        assert self.handler is not None
        async for msg in self:
            try:
                result = self.handler(msg)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("handler failed on %r; returning it to the back", msg)
                msg.nack(front=False)

    def _pattern_for(self, ident: str) -> str:
        if "/" in ident:
            return ident
        base = self.patterns[0]
        endpoint_version = base.rsplit("/", 1)[0] if base.count("/") >= 2 else None
        if endpoint_version is None:
            raise BadRequest(f"give a full channel: {base!r} does not name a version")
        return f"{endpoint_version}/{ident}"

    async def add_id(self, ident: str) -> None:
        """Also receive channel ``ident`` (an id under this subscription's version, or a
        full channel name)."""
        pattern = self._pattern_for(ident)
        await self.client._request(f.SubAdd(self.client._next_req(), self.sid, pattern))
        self.patterns.append(pattern)
        self.frame = f.Subscribe(**{**msgspec.structs.asdict(self.frame),
                                    "patterns": list(self.patterns)})

    async def remove_id(self, ident: str) -> None:
        pattern = self._pattern_for(ident)
        await self.client._request(f.SubRemove(self.client._next_req(), self.sid, pattern))
        self.patterns.remove(pattern)
        self.frame = f.Subscribe(**{**msgspec.structs.asdict(self.frame),
                                    "patterns": list(self.patterns)})

    async def close(self) -> None:
        """Stop receiving; undelivered messages stay on the broker."""
        if self._closed:
            return
        self._closed = True
        self._wakeup.set()
        self.client._subs.pop(self.sid, None)
        with contextlib.suppress(MinouError):
            await self.client._request(f.Unsubscribe(self.client._next_req(), self.sid))
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Client:
    """Connect with ``await minou.connect(...)``."""

    def __init__(
        self,
        urls: list[str],
        *,
        client_id: str | None = None,
        max_pending: int = CLIENT_SEND_QUEUE,
        request_timeout: float = CLIENT_REQUEST_TIMEOUT_S,
        reconnect: bool = True,
        key: str | os.PathLike[str] | PrivateKey | None = None,
        broker_token: str | None = None,
        tls_fingerprint: str | None = None,
        cafile: str | None = None,
        heartbeat: float | None = DEFAULT_HEARTBEAT_S,
        confirm_timeout: float | None = CLIENT_CONFIRM_TIMEOUT_S,
        idempotent: bool = True,
        credential: str | None = None,
    ) -> None:
        if not urls:
            raise ValueError("give at least one broker URL")
        if credential is not None and (key is not None or not client_id):
            raise ValueError("a credential stands in for the key: give client_id (whose "
                             "credential it is) and no key")
        self._credential = credential
        self.urls = [parse_url(u) for u in urls]
        self.client_id = client_id or f"{socket.gethostname()}-{os.getpid()}"
        self.key: PrivateKey | None = (
            load_private(key) if isinstance(key, str | os.PathLike) else key)
        self._public_pem = public_pem(self.key).decode() if self.key is not None else None
        self.broker_token = broker_token
        self.tls_fingerprint = tls_fingerprint
        self.cafile = cafile
        self._ssl: Any = None
        self._audiences: dict[int, str] = {}  # url index -> broker id (the token audience)
        self.max_pending = max_pending
        self.request_timeout = request_timeout
        self.reconnect = reconnect
        self.heartbeat = heartbeat or 0.0
        self.confirm_timeout = confirm_timeout
        self.idempotent = idempotent
        # Idempotent publishing: the broker's producer id for this client (kept across
        # reconnects) and the last sequence given per channel. Sequences are given when
        # a publish is first written and never reused, so a resend is recognised.
        self.producer_id = ""
        self._pseqs: dict[str, int] = {}
        self._gap_reset = ""  # the producer id a gap in sequences last replaced (once each)
        # Publishes made while none could be numbered (no connection) wait in the outbox
        # unnumbered: until it is drained, new ones are numbered in _flush, behind them.
        self._unnumbered = False
        self._watching = False  # the deadline task runs
        self._turn_deadline: float | None = None  # of the sends since the last flush
        self.dead_connections = 0  # connections declared dead after missed heartbeats
        self._deadlines: asyncio.Task[None] | None = None
        self.broker_id: str | None = None
        self.last_error: RequestError | None = None
        self._proto: _Protocol | None = None
        self._epoch = 0
        self._reqs = itertools.count(1)
        self._sids = itertools.count(1)
        self._requests: dict[int, tuple[f.Frame, asyncio.Future[Any]]] = {}
        # (send, future, deadline): waiting to be written / written and not confirmed
        self._outbox: list[_Pending] = []
        self._unconfirmed: dict[int, list[_Pending]] = {}
        self._pending_count = 0
        self._acks: list[int] = []
        self._ack_future: asyncio.Future[list[tuple[int, int, str]]] | None = None
        self._flush_scheduled = False
        self._subs: dict[int, Subscription] = {}
        self._connected = asyncio.Event()
        self._closing = False
        self._gone = False  # the connection was lost and reconnect=False: unusable
        self._supervisor: asyncio.Task[None] | None = None
        self._url_index = 0
        self._settle_waiters: dict[int, asyncio.Future[list[tuple[int, int, str]] | None]] = {}
        self._live = False  # handshake done on the current connection
        self._restoring: set[int] = set()  # re-subscribe requests of the current connection
        self._ever_connected = False  # until then a lost connection is connect()'s failure
        self._requester: Requester | None = None  # its inbox, made at the first request
        self._standby_seen = False  # a standby answered the last attempt to connect
        # The loop the connection runs on: asked for once, not on every send (asking
        # asyncio for the running loop costs ~180 ns, a tenth of a send).
        self._loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ connection
    async def _open(self) -> None:
        """Connect to the first URL that answers HELLO; raise ConnectionClosed if none."""
        loop = self._loop = asyncio.get_running_loop()
        errors = []
        refused: NotAuthenticated | None = None
        order = [(self._url_index + i) % len(self.urls) for i in range(len(self.urls))]
        tried: set[int] = set()
        while order:
            idx = order.pop(0)
            if idx in tried:
                continue
            tried.add(idx)
            scheme, host, port, path = self.urls[idx]
            where = f"{scheme}://{host}:{port}"
            try:
                if scheme in ("minou", "minous"):
                    tls = self._tls_context() if scheme == "minous" else None
                    transport, proto = await asyncio.wait_for(
                        loop.create_connection(lambda: _Protocol(self), host, port, ssl=tls,
                                               server_hostname=host if tls else None),
                        self.request_timeout,
                    )
                    if tls is not None and self.tls_fingerprint:
                        self._check_pin(transport)
                else:
                    proto = await asyncio.wait_for(_connect_ws(self, scheme, host, port, path),
                                                   self.request_timeout)
            except ConfigError:
                raise  # a local mistake (bad cafile or fingerprint): no broker to blame
            except ssl.SSLCertVerificationError as exc:
                errors.append(f"{where}: {_untrusted(exc)}")
                continue
            except (OSError, TimeoutError, InvalidURI, InvalidHandshake, MinouError) as exc:
                hint = await _plain_to_tls_hint(scheme, host, port, exc)
                why = hint if isinstance(hint, str) else \
                    f"no broker answered ({describe(exc)})"
                errors.append(f"{where}: {why}")
                continue
            self._proto = proto
            proto.where = where
            self._epoch += 1
            try:
                welcome = await self._handshake(proto, idx)
            except (TimeoutError, MinouError) as exc:
                self._requests.pop(0, None)
                if proto.transport is not None:
                    # Abort, not close: a TLS close waits for the broker's goodbye, and a
                    # failed connect() may stop this loop before it comes (a leaked socket).
                    proto.transport.abort()
                    await asyncio.sleep(0)
                self._proto = None
                if isinstance(exc, NotAuthenticated):
                    refused = refused or exc  # the broker answered: say why, not "no broker"
                elif isinstance(exc, Standby):
                    self._standby_seen = True
                    order[:0] = self._follow(exc)  # the primary next, then the others
                elif isinstance(exc, ConnectionClosed):
                    exc = await _plain_to_tls_hint(scheme, host, port, exc)
                if isinstance(exc, TimeoutError) and not str(exc):
                    exc = Timeout(  # a broker that took the connection but never answered
                        "no WELCOME within "
                        f"{min(self.request_timeout, CLIENT_HANDSHAKE_TIMEOUT_S):g} s: the "
                        "broker is paused, overloaded, or cannot check the key (its "
                        "storage unreachable?)")
                errors.append(f"{where}: {describe(exc)}")
                continue
            self.broker_id = welcome.broker_id
            self._url_index = idx
            if self.idempotent and welcome.producer_id:
                # The same id as before, or a new one from a broker that did not know it:
                # sequences go on from where they were either way (a broker accepts
                # any first sequence of a producer it does not know).
                self.producer_id = welcome.producer_id
            proto.start_heartbeats(welcome.heartbeat)
            self._live = True  # acks for this connection's deliveries may flow from now on
            try:
                await self._restore()
            except MinouError as exc:
                if self._proto is proto and proto.transport is not None:
                    proto.transport.close()
                self._proto = None
                self._live = False
                errors.append(f"{where}: {exc}")
                continue
            self._connected.set()
            self._ever_connected = True
            return
        if refused is not None:
            raise refused
        raise ConnectionClosed("cannot connect to " + "; ".join(errors))

    def _follow(self, standby: Standby) -> list[int]:
        """The primary a standby named, as an index of ``urls`` (added if new: later
        reconnects try it too); nothing if it named none."""
        target = standby.detail.get("primary")
        if not isinstance(target, str):
            return []
        try:
            parsed = parse_url(target)
        except ValueError:
            return []
        if parsed not in self.urls:
            self.urls.append(parsed)
        return [self.urls.index(parsed)]

    def _tls_context(self) -> Any:
        if self._ssl is None:
            from ..tls import client_context

            self._ssl = client_context(cafile=self.cafile, fingerprint=self.tls_fingerprint)
        return self._ssl

    def _check_pin(self, transport: asyncio.BaseTransport) -> None:
        from ..tls import check_pin

        try:
            check_pin(transport.get_extra_info("ssl_object"), str(self.tls_fingerprint))
        except BaseException:
            transport.abort()  # type: ignore[attr-defined]
            raise

    def _hello(self, idx: int) -> f.Hello:
        audience = self._audiences.get(idx)
        token = None
        if self.key is not None and audience is not None:
            # A fresh token per connection: short-lived, single use (jti).
            token = make_token(self.client_id, self.key, audience)
        return f.Hello(self.client_id, PROTOCOL_VERSION, token, None, self._public_pem,
                       self.broker_token, self.heartbeat,
                       self.producer_id if self.idempotent else "", self._credential)

    async def _handshake(self, proto: _Protocol, idx: int) -> f.Welcome:
        """HELLO until WELCOME: a broker that wants a token names itself (the audience)
        in a non-fatal NOT_AUTHENTICATED reply; sign for it and say HELLO again."""
        assert proto.transport is not None
        for _ in range(2):
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            hello = self._hello(idx)
            self._requests[0] = (hello, fut)
            proto.transport.write(f.encode(hello))
            try:
                # Bounded apart from request_timeout: a paused broker's kernel accepts
                # the connection, and only the missing WELCOME tells.
                return await asyncio.wait_for(
                    fut, min(self.request_timeout, CLIENT_HANDSHAKE_TIMEOUT_S))
            except NotAuthenticated as exc:
                audience = exc.detail.get("broker_id")
                if (exc.detail.get("why") != "token_required" or self.key is None
                        or hello.token is not None or not isinstance(audience, str)):
                    if exc.detail.get("why") == "token_required" and self.key is None:
                        raise NotAuthenticated(
                            f"broker {audience!r} requires a key: pass key= (a private key file "
                            f"made by `minou keygen {self.client_id}`)", why="no_key") from None
                    raise
                self._audiences[idx] = audience
        raise NotAuthenticated("broker kept asking for a token")

    async def _restore(self) -> None:
        """After a (re)connect: subscribe again, resend what was never confirmed."""
        # Deliveries may arrive before these replies (which wait for a commit);
        # their acks go out at once since the connection is live.
        for sub in list(self._subs.values()):
            req = sub.frame.req
            self._restoring.add(req)
            try:
                await self._request(sub.frame, wait_connected=False)
            finally:
                self._restoring.discard(req)
        resend = [item for req in sorted(self._unconfirmed) for item in self._unconfirmed[req]]
        self._unconfirmed.clear()
        self._outbox[:0] = resend
        pending = [(frame, fut) for req, (frame, fut) in self._requests.items() if req]
        for frame, _ in pending:
            self._write(f.encode(frame))
        self._schedule_flush()

    def _on_dead(self, proto: _Protocol, silent: float) -> None:
        """The broker sent nothing for two heartbeat intervals (a paused or hung
        process, a black-holed network): drop the connection and reconnect, next URL
        first; what was not confirmed is sent again (once, by its sequence)."""
        self.dead_connections += 1
        self.last_error = ConnectionClosed(
            f"broker {proto.where} sent nothing for {silent:.1f} s ({HEARTBEAT_MISSES} "
            f"heartbeat intervals of {proto.heartbeat:g} s): the connection is dead"
            + ("; reconnecting" if self.reconnect and not self._closing else ""))
        log.warning("%s", self.last_error)
        if proto.transport is not None:
            proto.transport.abort()

    def _on_lost(self, proto: _Protocol) -> None:
        proto.stop_heartbeats()
        if proto is not self._proto:
            return
        self._proto = None
        self._live = False
        self._connected.clear()
        lost = ConnectionClosed("connection lost")
        hello = self._requests.get(0)
        if hello is not None and not hello[1].done():
            hello[1].set_exception(lost)  # a handshake cut short fails now, not at a timeout
        for req in list(self._restoring):
            entry = self._requests.pop(req, None)
            if entry is not None and not entry[1].done():
                entry[1].set_exception(lost)
        # Settlements written on the lost connection: unknown, so "not done" (False).
        for fut in self._settle_waiters.values():
            if not fut.done():
                fut.set_result(None)
        self._settle_waiters.clear()
        self._ack_future_fail()
        for sub in self._subs.values():
            sub._queue.clear()  # their tags died with the connection; the broker redelivers
        if not self._ever_connected:
            return  # connect() is still trying its URLs and reports the failure itself
        if self._closing or not self.reconnect:
            self._gone = not self._closing
            self._fail_all(ConnectionClosed("connection closed"))
            return
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = asyncio.create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = CLIENT_RECONNECT_MIN_S
        while not self._closing:
            self._url_index = (self._url_index + 1) % len(self.urls)
            self._standby_seen = False
            try:
                await self._open()
                log.info("reconnected to %s", self.urls[self._url_index][1:])
                return
            except MinouError as exc:  # whatever failed, try again: never give up silently
                log.warning("reconnect failed: %s", exc)
            if self._standby_seen:
                # A standby answered: a takeover is under way (within owner_lease) and
                # serving starts any moment; a growing backoff would miss it by seconds,
                # and with it the window before the next failure.
                await asyncio.sleep(CLIENT_STANDBY_RETRY_S * (0.5 + random.random()))
                continue
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, CLIENT_RECONNECT_MAX_S)

    def _fail_all(self, exc: MinouError) -> None:
        for _, fut in self._requests.values():
            if not fut.done():
                fut.set_exception(exc)
        self._requests.clear()
        for items in [*self._unconfirmed.values(), self._outbox]:
            for _, fut, _ in items:
                if not fut.done():
                    fut.set_exception(exc)
        self._unconfirmed.clear()
        self._outbox.clear()
        self._pending_count = 0
        for sub in self._subs.values():
            sub._closed = True
            sub._wakeup.set()

    def _ack_future_fail(self) -> None:
        # Acks queued but never written: not done (the broker will redeliver).
        if self._ack_future is not None and not self._ack_future.done():
            self._ack_future.set_result(None)
        self._ack_future = None
        self._acks.clear()

    async def close(self) -> None:
        """Flush, wait for outstanding confirms (bounded), and disconnect."""
        if self._closing:
            return
        if self._proto is not None:
            self._flush()
            waiting = [fut for items in self._unconfirmed.values() for _, fut, _ in items
                       if not fut.done()]
            if waiting:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
        self._closing = True
        for sub in list(self._subs.values()):
            if sub._task is not None:
                sub._task.cancel()
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self._deadlines is not None:
            self._deadlines.cancel()
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.write(f.encode(f.Bye("client closed")))
            self._proto.transport.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._proto.lost, 2)
        self._fail_all(ConnectionClosed("client closed"))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._proto is not None and self._connected.is_set()

    # ----------------------------------------------------------- frames in
    def _on_frame(self, proto: _Protocol, ev: f.Frame | BadFrame) -> None:
        if isinstance(ev, BadFrame):
            log.error("unreadable frame from broker: %s", ev.error)
            return
        kind = type(ev)
        if kind is f.Deliver:
            sub = self._subs.get(ev.sid)
            if sub is not None:
                epoch = self._epoch
                sub._push([Message(self, epoch, ev.sid, d) for d in ev.items])
        elif kind is f.Confirm:
            self._on_confirm(ev)
        elif kind is f.Welcome:
            self._resolve(0, ev)
        elif kind is f.Error:
            self._on_error(ev)
        elif hasattr(ev, "req"):
            self._resolve(ev.req, ev)

    def _resolve(self, req: int, value: Any) -> None:
        entry = self._requests.pop(req, None)
        if entry is not None and not entry[1].done():
            entry[1].set_result(value)
        settle = self._settle_waiters.pop(req, None) if req else None
        if settle is not None and not settle.done():
            settle.set_result(value.failed if isinstance(value, f.Settled) else [])

    def _on_confirm(self, ev: f.Confirm) -> None:
        items = self._unconfirmed.pop(ev.req, None)
        if items is None:
            return
        self._pending_count -= len(items)
        again: list[tuple[f.Send, asyncio.Future[Receipt], float]] = []
        for (send, fut, deadline), out in zip(items, ev.outcomes, strict=False):
            if fut.done():
                continue
            if (out.code == ErrorCode.OUT_OF_SEQUENCE and send.pseq
                    and self._gap_reset != self.producer_id):
                again.append((msgspec.structs.replace(send, pseq=0), fut, deadline))
            elif out.code:
                fut.set_exception(error_from_code(out.code, out.error, {"channel": out.channel}))
            else:
                fut.set_result(Receipt(out.channel, out.seq, out.id, out.duplicate, out.fanout))
        if again:
            # The broker never saw sequences this client was answered for: refusals a
            # broker could not store before it died, or gave while it was being taken
            # over. Nothing is lost (each was answered), but the producer cannot go on:
            # start a new one and send these again (they were not stored), in order.
            log.warning("the broker expected earlier sequences on %s that were answered "
                        "already (refused by a broker that then stopped): starting a new "
                        "producer id; %d message(s) sent again", again[0][0].channel,
                        len(again))
            self._gap_reset = self.producer_id
            self._unconfirmed[ev.req] = again
            self._pending_count += len(again)
            self._new_producer()

    def _on_error(self, ev: f.Error) -> None:
        exc = error_from_code(ev.code, ev.message, dict(ev.detail))
        if ev.req and ev.req in self._requests:
            _, fut = self._requests.pop(ev.req)
            if not fut.done():
                fut.set_exception(exc)
            return
        if ev.req and ev.req in self._unconfirmed:
            items = self._unconfirmed.pop(ev.req)
            self._pending_count -= len(items)
            for _, fut, _ in items:
                if not fut.done():
                    fut.set_exception(exc)
            if any(send.pseq for send, _, _ in items):
                log.error("the broker refused a whole publish frame; starting a new "
                          "producer id")
                self._new_producer()
            return
        if 0 in self._requests and not self.connected:
            _, fut = self._requests.pop(0)
            if not fut.done():
                fut.set_exception(exc)
            return
        if ev.fatal and isinstance(exc, NotAuthenticated):
            log.error("the broker refused this client: %s", exc)
        sid = ev.detail.get("sid") if not ev.req else None
        sub = self._subs.pop(sid, None) if isinstance(sid, int) else None
        if sub is not None:  # ended by the broker: not subscribed again on a reconnect
            sub._end(exc)
        self.last_error = exc
        log.warning("broker error: %s", exc)

    # ---------------------------------------------------------- frames out
    def _next_req(self) -> int:
        return next(self._reqs)

    def _new_producer(self) -> None:
        """The numbered publishes of a refused PUBLISH frame (a bug on one side), or
        refusals the broker never stored, left a gap in this producer's sequences that
        later ones would be refused for. Start a new producer on a new connection: what
        is unconfirmed is numbered again under it."""
        self.producer_id = ""
        self._pseqs.clear()
        self._unnumbered = True
        for items in self._unconfirmed.values():
            items[:] = [(msgspec.structs.replace(send, pseq=0), fut, deadline)
                        for send, fut, deadline in items]
        self._outbox = [(msgspec.structs.replace(send, pseq=0), fut, deadline)
                        for send, fut, deadline in self._outbox]
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.abort()

    def _write(self, data: bytes) -> None:
        proto = self._proto
        if proto is not None and proto.transport is not None:
            proto.sent += len(data)
            proto.transport.write(data)

    async def _request(self, frame: f.Frame, *, wait_connected: bool = True) -> Any:
        if self._closing:
            raise ConnectionClosed("client closed")
        if self._gone:
            raise ConnectionClosed("the connection was lost and this client does not "
                                   "reconnect (reconnect=False): connect again")
        data = _request_bytes(frame)  # before it is kept: it is sent again after reconnects
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        req = frame.req  # type: ignore[attr-defined]
        self._requests[req] = (frame, fut)
        if self.connected or not wait_connected:
            self._write(data)
        try:
            return await asyncio.wait_for(fut, self.request_timeout)
        except TimeoutError:
            self._requests.pop(req, None)
            raise Timeout(f"no answer from {self._where()} to {type(frame).__name__.upper()} "
                          f"within {self.request_timeout:g} s (request_timeout)") from None

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            (self._loop or asyncio.get_running_loop()).call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._turn_deadline = None
        if not self._live:
            return
        out: list[bytes] = []
        # Publishes wait until re-subscription is done; acks need only a live connection.
        numbered = self.idempotent and bool(self.producer_id) and self._unnumbered
        pseqs, replace = self._pseqs, msgspec.structs.replace
        while self._outbox and self.connected:
            n = _frame_cut(self._outbox)
            chunk, self._outbox = self._outbox[:n], self._outbox[n:]
            if numbered:  # publishes made while there was no numbering connection
                for i, (send, fut, deadline) in enumerate(chunk):
                    if not send.pseq:  # first written now: its sequence, for good
                        last = pseqs.get(send.channel)
                        if last is None and len(pseqs) >= CLIENT_MAX_NUMBERED_CHANNELS:
                            continue  # bounded memory: at-least-once on further channels
                        pseq = pseqs[send.channel] = (last or 0) + 1
                        chunk[i] = (replace(send, pseq=pseq), fut, deadline)
            req = self._next_req()
            self._unconfirmed[req] = chunk
            out.append(f.encode(f.Publish(req, [s for s, _, _ in chunk])))
        if not self._outbox and self.idempotent and self.producer_id:
            self._unnumbered = False
        if self._acks:
            req = self._next_req()
            out.append(f.encode(f.Ack(req, self._acks)))
            if self._ack_future is not None:
                self._settle_waiters[req] = self._ack_future
            self._acks = []
            self._ack_future = None
        if out:
            self._write(b"".join(out))

    # -------------------------------------------------------------- publish
    def send(
        self,
        channel: str,
        payload: Any,
        *,
        headers: dict[str, str] | None = None,
        priority: int = 0,
        ttl: float | None = None,
        delay: float | None = None,
        dedup: str | None = None,
        key: str | None = None,
    ) -> asyncio.Future[Receipt]:
        """Publish; the returned future resolves to a Receipt once the message is durable.

        ``payload`` is any JSON value; ``bytes`` are sent raw. Sending to
        ``endpoint/v1/*`` broadcasts to every id of that version with a reader. A field
        of the wrong type raises TypeError, a value out of range BadRequest, here and
        before anything is sent.
        """
        raw = isinstance(payload, bytes | bytearray | memoryview)
        if raw:
            data = bytes(payload)
        else:  # _json_bytes, inline: this is the publish path
            data = _json_encode(payload)
            if b"null" in data and _non_finite(payload):
                raise ValueError(_NON_FINITE)
        if (type(channel) is not str or type(priority) is not int
                or not MIN_PRIORITY <= priority <= MAX_PRIORITY or ttl is not None
                or delay is not None or headers is not None or dedup is not None
                or key is not None):  # (the common publish skips the call)
            priority, ttl, delay = _checked_fields(channel, headers, priority, ttl, delay,
                                                   dedup, key)
        return self._enqueue(channel, data, raw, headers, priority, ttl, delay, dedup, key)

    def _enqueue(self, channel: str, data: bytes, raw: bool, headers: dict[str, str] | None,
                 priority: int, ttl: float | None, delay: float | None, dedup: str | None,
                 key: str | None) -> asyncio.Future[Receipt]:
        if self._closing:
            raise ConnectionClosed("client closed")
        if self._gone:
            raise ConnectionClosed("the connection was lost and this client does not "
                                   "reconnect (reconnect=False): connect again")
        if self._pending_count >= self.max_pending:
            raise SendQueueFull(
                f"{self._pending_count} messages are waiting to be sent or confirmed "
                f"(max_pending={self.max_pending}); is the broker reachable?"
            )
        loop = self._loop or asyncio.get_running_loop()
        deadline = self._turn_deadline
        if deadline is None:  # the first send since the last flush
            timeout = self.confirm_timeout
            # One clock reading per turn: the sends of one turn share their deadline.
            deadline = self._turn_deadline = loop.time() + timeout if timeout else _NEVER
            if timeout and not self._watching:
                self._watching = True
                self._deadlines = asyncio.create_task(self._watch_deadlines(timeout))
            self._schedule_flush()
        pseq = 0
        if self._live and not self._unnumbered and self.producer_id and self.idempotent:
            # Numbered now (it goes out at the end of this turn), unless publishes from
            # before are still unnumbered: _flush numbers those first, in order.
            last = self._pseqs.get(channel)
            if last is not None or len(self._pseqs) < CLIENT_MAX_NUMBERED_CHANNELS:
                pseq = self._pseqs[channel] = (last or 0) + 1
        else:
            self._unnumbered = True
        send = f.Send(channel, data, raw, headers, priority, ttl, delay, dedup, key, pseq)
        fut: asyncio.Future[Receipt] = loop.create_future()
        self._outbox.append((send, fut, deadline))
        self._pending_count += 1
        return fut

    async def _watch_deadlines(self, timeout: float) -> None:
        """Fail the publishes not confirmed within ``confirm_timeout``: those never
        written are dropped (certainly not stored); those written stay to be sent again
        after a reconnect (stored at most once, by their sequence), but their callers
        are told now."""
        try:
            await self._expire_publishes(timeout)
        finally:
            self._watching = False

    async def _expire_publishes(self, timeout: float) -> None:
        period = max(0.01, min(0.5, timeout / 10))
        loop = asyncio.get_running_loop()
        while not self._closing and self._pending_count:
            await asyncio.sleep(period)
            now = loop.time()
            where = self._where()
            for items in list(self._unconfirmed.values()):
                if items and items[0][2] > now:
                    break  # the oldest first: the rest are younger
                for send, fut, deadline in items:
                    if deadline <= now and not fut.done():
                        fut.set_exception(Timeout(
                            f"no confirm from {where} within {timeout:g} s for the publish "
                            f"to {send.channel!r}: it was sent and may still be stored (once:"
                            " the client sends it again after a reconnect)"))
            if self._outbox and self._outbox[0][2] <= now:
                keep = []
                for item in self._outbox:
                    send, fut, deadline = item
                    if deadline > now or send.pseq:
                        keep.append(item)  # written before: its sequence must go out
                        if deadline <= now and not fut.done():
                            fut.set_exception(Timeout(
                                f"no confirm from {where} within {timeout:g} s for the "
                                f"publish to {send.channel!r}: it was sent and may still be "
                                "stored (once: it is sent again when a broker answers)"))
                        continue
                    self._pending_count -= 1
                    if not fut.done():
                        fut.set_exception(Timeout(
                            f"no connection to {where} within {timeout:g} s: the publish to "
                            f"{send.channel!r} was not sent (and will not be)"))
                self._outbox = keep

    def _where(self) -> str:
        proto = self._proto
        if proto is not None and proto.where:
            return f"broker {proto.where}"
        scheme, host, port, _ = self.urls[self._url_index]
        return f"broker {scheme}://{host}:{port}"


    async def send_many(
        self, items: Iterable[tuple[str, Any] | dict[str, Any]]
    ) -> list[Receipt]:
        """Publish many messages in as few frames as possible; wait for all confirms.

        Every message is checked before any is sent (a wrong field raises, nothing
        sent). If the broker refuses some, the first refusal is raised once all are
        answered, its ``results`` holding each message's Receipt or error in order: the
        others are stored, and a retry should send only those refused.
        """
        prepared = [_prepared(**{"headers": None, "priority": 0, "ttl": None, "delay": None,
                                 "dedup": None, "key": None, **item})
                    if isinstance(item, dict) else _prepared(item[0], item[1], None, 0, None,
                                                             None, None, None)
                    for item in items]
        futs = [self._enqueue(*p) for p in prepared]
        results = await asyncio.gather(*futs, return_exceptions=True)
        for outcome in results:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, MinouError):
                    outcome.results = results  # type: ignore[attr-defined]
                raise outcome
        return cast(list[Receipt], results)

    # ---------------------------------------------------------- subscribing
    async def _subscribe(self, kind: str, patterns: str | list[str], handler: Handler | None,
                         **kw: Any) -> Subscription:
        if isinstance(patterns, str):
            patterns = [patterns]
        sid = next(self._sids)
        frame = f.Subscribe(self._next_req(), sid, kind, list(patterns), **kw)
        # Registered first: deliveries may arrive before the broker's reply does.
        sub = Subscription(self, sid, frame, handler)
        self._subs[sid] = sub
        try:
            await self._request(frame)
        except BaseException:
            self._subs.pop(sid, None)
            if sub._task is not None:
                sub._task.cancel()
            raise
        return sub

    async def listen(
        self,
        pattern: str | list[str],
        handler: Handler | None = None,
        *,
        name: str | None = None,
        start: str | int = "",
        prefetch: int = 0,
        lease: float = 0.0,
    ) -> Subscription:
        """Fan-out: this client gets its own copy of every message on ``pattern``.

        Durable per client id and ``name`` (default: the pattern). ``start`` is
        ``"new"`` (default), ``"oldest"`` or a seq to replay from.
        """
        return await self._subscribe("listen", pattern, handler, name=name,
                                     start=_start(start), prefetch=prefetch, lease=lease)

    async def consume(
        self,
        pattern: str | list[str],
        handler: Handler | None = None,
        *,
        group: str | None = None,
        start: str | int = "",
        prefetch: int = 0,
        lease: float = 0.0,
    ) -> Subscription:
        """Competing consumers: members of ``group`` (default: the pattern) share messages."""
        return await self._subscribe("consume", pattern, handler, group=group,
                                     start=_start(start), prefetch=prefetch, lease=lease)

    # ------------------------------------------------------- request/reply
    async def request(self, channel: str, payload: Any, *,
                      timeout: float = DEFAULT_REQUEST_TIMEOUT_S,
                      headers: dict[str, str] | None = None) -> Any:
        """Send a request and return the reply's payload (docs/requests.md).

        Raises ``NoResponders`` at once when no consumer or listener is connected to
        ``channel``, ``Timeout`` when no reply came within ``timeout`` seconds (the
        request then expires unserved), and ``ResponderError`` when the responder's
        handler raised.
        """
        if self._requester is None:
            self._requester = Requester(self)
        return await self._requester.request(channel, payload, timeout=timeout,
                                             headers=headers)

    async def serve(self, pattern: str | list[str], handler: RequestHandler, *,
                    group: str | None = None, idempotent: bool = False, prefetch: int = 0,
                    lease: float = 0.0) -> Subscription:
        """Answer the requests on ``pattern`` with ``handler(message)``'s return value
        (a raised exception goes back as the requester's ``ResponderError``), up to
        ``prefetch`` at once (default: the channel's prefetch, 1 unless configured).
        Responders in one ``group`` (default: the pattern) share the requests. ``idempotent``: a
        request delivered again after its reply was stored is acked without running the
        handler again (within the broker's dedup window)."""
        sub = await self.consume(pattern, group=group, prefetch=prefetch, lease=lease)
        sub._task = asyncio.create_task(
            serve_each(sub, make_responder(self, handler, idempotent=idempotent)))
        return sub

    async def peer(self, channel: str, *, role: str, prefetch: int = PEER_PREFETCH) -> Peer:
        """Take role ``"a"`` or ``"b"`` of peer channel ``channel``: ``send()`` to the
        other side, iterate (or ``get()``) what it sent, durable and in order
        (docs/peers.md). Refused (NotAuthorized) while another client holds the role,
        or another connection of this client does."""
        _, reading = peer_channels(channel, role)
        sub = await self._subscribe("consume", reading, None, group=peer_group(channel, role),
                                    start="oldest", prefetch=prefetch, exclusive=True)
        return Peer(self, channel, role, sub)

    # ------------------------------------------------------- key-value
    def kv(self, bucket: str) -> KeyValue:
        """Bucket ``bucket``: ``put``/``get``/``delete``/``keys``/``history``/``watch``
        (docs/kv.md). The bucket is made by its first put."""
        return KeyValue(self, bucket)

    async def persist(self, name: str, fields: Iterable[str]) -> PersistentObject:
        """An object whose ``fields`` are kept in bucket ``name``, loaded now;
        ``save()`` writes only the fields changed since (docs/kv.md)."""
        return await PersistentObject(self, name, fields).load()

    # ------------------------------------------------------------ settling
    def _settle(self, msg: Message, op: str, **kw: Any) -> Settlement:
        if msg._epoch != self._epoch or not self._live:
            # The connection this came on is gone: the broker requeued it already.
            return Settlement(None, msg.tag)
        if op == "ack":
            if self._ack_future is None:
                self._ack_future = asyncio.get_running_loop().create_future()
            tag = msg.tag
            acks = self._acks
            acks.append(tag)
            if len(acks) >= CLIENT_FRAME_MESSAGES:
                self._flush()  # a consumer working through a big batch frees credit early
            elif not self._flush_scheduled:  # (_schedule_flush, inlined: per ack)
                self._schedule_flush()
            return Settlement(self._ack_future, tag)
        fut: asyncio.Future[list[tuple[int, int, str]]] = (
            asyncio.get_running_loop().create_future()
        )
        req = self._next_req()
        self._settle_waiters[req] = fut
        if op == "nack":
            frame: f.Frame = f.Nack(req, [msg.tag], kw["delay"], kw["front"])
        else:
            frame = f.Extend(req, [msg.tag], kw["seconds"])
        self._flush()  # keep acks queued before this frame in order
        self._write(f.encode(frame))
        return Settlement(fut, msg.tag)

    # --------------------------------------------------------------- admin
    async def admin(self, op: str, **args: Any) -> Any:
        res = await self._request(f.Admin(self._next_req(), op, args))
        return res.value

    async def issue_credential(self, ttl: float = DEFAULT_CREDENTIAL_TTL_S,
                               purpose: str = "") -> dict[str, Any]:
        """A delegated credential for this client (which must have connected with its
        key): ``credential`` (the secret, shown once), ``id`` and ``expires_at``. Hand the
        secret to work running elsewhere: ``connect(url, client_id=..., credential=...)``
        acts as this client, under its rules, with no admin rights, until it expires."""
        return cast(dict[str, Any], await self.admin("credentials.issue", ttl=ttl,
                                                     purpose=purpose))

    async def renew_credential(self, credential_id: str,
                               ttl: float = DEFAULT_CREDENTIAL_TTL_S) -> dict[str, Any]:
        """Extend a credential this client issued to now + ``ttl``."""
        return cast(dict[str, Any], await self.admin("credentials.renew", id=credential_id,
                                                     ttl=ttl))

    async def revoke_credential(self, credential_id: str) -> dict[str, Any]:
        """Void a credential now; connections that presented it are closed."""
        return cast(dict[str, Any], await self.admin("credentials.revoke", id=credential_id))

    # ------------------------------------------- staged publishes, positions
    async def stage(self, txn: str, items: Iterable[tuple[str, Any] | dict[str, Any]]) -> int:
        """Stage messages under transaction ``txn`` (invisible until committed); return
        how many it holds (once stored: a broker restart keeps it). Staged data is held
        in the broker's memory too, and expires an hour after the last stage: commit
        soon."""
        return await self.stage_sends(txn, [
            _make_send(**i) if isinstance(i, dict) else _make_send(i[0], i[1])
            for i in items])

    async def stage_sends(self, txn: str, sends: list[f.Send]) -> int:
        """``stage`` of ready-made sends (bytes kept as they are: a federation link
        passes another broker's messages through untouched)."""
        total = 0
        while sends:
            n = _frame_cut(sends)
            res = await self._request(f.Stage(self._next_req(), txn, sends[:n]))
            sends = sends[n:]
            total = int(res.value["staged"])
        return total

    async def commit_transactions(self, writer_id: str, batch_id: int,
                                  txns: list[str], lineage: str = "",
                                  after: int = -1) -> dict[str, Any]:
        """Publish the staged transactions at once (durable when this returns), fenced per
        (writer_id, channel) on batch_id: a replayed batch is discarded, not duplicated.
        ``lineage`` names the run of batches (a streaming query's id): a writer id whose
        fences belong to another run refuses it, rather than discard its batches.
        ``after`` (when ``>= 0``): the fence the writer believes its channels are at; a
        channel already past it but short of batch_id is refused (``OutOfSequence``):
        another session of this writer committed part of the batch's range."""
        res = await self._request(f.TxnCommit(self._next_req(), writer_id, batch_id,
                                              list(txns), lineage, after))
        return dict(res.value)

    async def abort_transactions(self, txns: list[str]) -> int:
        res = await self._request(f.TxnAbort(self._next_req(), list(txns)))
        return int(res.value["aborted"])

    async def offsets(self, patterns: str | list[str]) -> dict[str, tuple[int, int]]:
        """``{channel: (first_seq, next_seq)}`` for every channel the patterns match."""
        if isinstance(patterns, str):
            patterns = [patterns]
        res = await self._request(f.Offsets(self._next_req(), list(patterns)))
        return {k: (int(v[0]), int(v[1])) for k, v in res.value.items()}

    async def offsets_at(self, patterns: str | list[str], at: float,
                         ) -> dict[str, tuple[int, int, int]]:
        """``{channel: (first_seq, next_seq, seq_at)}``: ``seq_at`` is the first seq
        published at or after ``at`` (seconds since the epoch; ``next_seq`` if none)."""
        if isinstance(patterns, str):
            patterns = [patterns]
        res = await self._request(f.Offsets(self._next_req(), list(patterns), float(at)))
        return {k: (int(v[0]), int(v[1]), int(v[2])) for k, v in res.value.items()}

    async def set_position(self, group: str, positions: dict[str, int]) -> dict[str, int]:
        """Tell the broker consumer ``group`` is done below ``positions[channel]`` (for
        retention and lag, when the reader keeps its own offsets); returns the lags."""
        res = await self._request(f.Position(self._next_req(), group, dict(positions)))
        return dict(res.value["lag"])

    async def read(self, channel: str, from_seq: int = 1, *, limit: int = 1000,
                   to_seq: int = 0) -> tuple[list[Message], int]:
        """Read retained messages of ``channel`` by seq (no delivery, no ack).

        Returns the messages and the seq to continue from.
        """
        page = await self.read_page(channel, from_seq, limit=limit, to_seq=to_seq)
        return page.messages, page.next_seq

    async def read_page(self, channel: str, from_seq: int = 1, *, limit: int = 1000,
                        to_seq: int = 0) -> ReadPage:
        """``read`` plus the channel's oldest retained seq at the time of the read, so a
        reader can tell that messages it wanted were removed (retention, purge)."""
        res = await self._request(f.Read(self._next_req(), channel, from_seq, limit, to_seq))
        return ReadPage([Message(self, -1, 0, d) for d in res.items], res.next_seq,
                        res.first_seq)

    async def ping(self) -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await self._request(f.Ping(self._next_req()))
        return loop.time() - t0


_NEVER = float("inf")
_Pending = tuple[f.Send, "asyncio.Future[Receipt]", float]


def _frame_cut(items: Sequence[Any]) -> int:
    """How many of the first publishes (``Send``s, or tuples starting with one) go in
    one frame: at most CLIENT_FRAME_MESSAGES and CLIENT_FRAME_BYTES of payload and
    headers, always at least one (a burst of 1 MiB messages would otherwise make one
    frame over MAX_FRAME_SIZE, and the broker would drop the connection)."""
    total = 0
    n = min(len(items), CLIENT_FRAME_MESSAGES)
    for i in range(n):
        send = items[i]
        if not isinstance(send, f.Send):
            send = send[0]
        total += len(send.data) + len(send.channel)
        if send.headers:
            total += sum(len(k) + len(v) for k, v in send.headers.items())
        if total > CLIENT_FRAME_BYTES and i:
            return i
    return n


class ReadPage(NamedTuple):
    messages: list[Message]
    next_seq: int  # where to read on from
    first_seq: int  # the oldest seq the channel retained (0 if the broker did not say)


def _make_send(channel: str, payload: Any, *, headers: dict[str, str] | None = None,
               priority: int = 0, ttl: float | None = None, delay: float | None = None,
               dedup: str | None = None, key: str | None = None, pseq: int = 0) -> f.Send:
    return f.Send(*_prepared(channel, payload, headers, priority, ttl, delay, dedup, key),
                  pseq)


# A publish checked and encoded, not yet numbered: Send's fields but the last (pseq).
_Ready = tuple[str, bytes, bool, "dict[str, str] | None", int, "float | None",
               "float | None", "str | None", "str | None"]


def _prepared(channel: str, payload: Any, headers: dict[str, str] | None, priority: int,
              ttl: float | None, delay: float | None, dedup: str | None,
              key: str | None) -> _Ready:
    data, raw = _payload(payload)
    priority, ttl, delay = _checked_fields(channel, headers, priority, ttl, delay, dedup, key)
    return channel, data, raw, headers, priority, ttl, delay, dedup, key


def _payload(payload: Any) -> tuple[bytes, bool]:
    """(the bytes sent, whether raw): ``bytes`` as they are, anything else as JSON."""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload), True
    return _json_bytes(payload), False


def _json_bytes(payload: Any) -> bytes:
    """``payload`` as JSON; ValueError if it holds NaN or an infinity, which the encoder
    would write as null (a value changed, silently). Looked for only when the text has a
    null in it."""
    data = _json_encode(payload)
    if b"null" in data and _non_finite(payload):
        raise ValueError(_NON_FINITE)
    return data


_NON_FINITE = ("payload holds NaN or an infinity, which JSON cannot carry (it would arrive "
               "as null); send a string or leave the field out")


def _non_finite(value: Any, depth: int = 0) -> bool:
    if isinstance(value, float):
        return value != value or value in (_NEVER, -_NEVER)
    if depth > 64:  # deeper than any broker accepts: the broker names that
        return False
    if isinstance(value, dict):
        return any(_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_non_finite(v, depth + 1) for v in value)
    return False


def _checked_fields(channel: Any, headers: Any, priority: Any, ttl: Any, delay: Any,
                    dedup: Any, key: Any) -> tuple[int, float | None, float | None]:
    """A publish's fields as the frame carries them, or TypeError / BadRequest naming the
    one that is wrong, before anything is sent."""
    if type(channel) is not str:
        raise TypeError(f"channel must be a string, got {type(channel).__name__}")
    if type(priority) is not int:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an integer {MIN_PRIORITY}..{MAX_PRIORITY}, "
                            f"got {priority!r}")
        priority = int(priority)
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise BadRequest(f"priority {priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}")
    if ttl is not None or delay is not None:
        ttl, delay = _seconds("ttl", ttl), _seconds("delay", delay)
    if headers is not None and (not isinstance(headers, dict) or not all(
            type(k) is str and type(v) is str for k, v in headers.items())):
        raise TypeError(f"headers must map strings to strings, got {headers!r:.200}")
    for label, text in (("dedup", dedup), ("key", key)):
        if text is not None and type(text) is not str:
            raise TypeError(f"{label} must be a string, got {type(text).__name__}")
    _text_ok("channel", channel)
    for label, text in (("dedup", dedup), ("key", key)):
        if text is not None:
            _text_ok(label, text)
    if headers:
        for name, value in headers.items():
            _text_ok("header name", name)
            _text_ok(f"header {name!r}", value)
    return priority, ttl, delay


def _request_bytes(frame: f.Frame) -> bytes:
    """``frame`` encoded, or BadRequest (it cannot be: an integer past 64 bits, text with
    a lone surrogate, an object) or FrameTooLarge (the broker would drop the connection
    on it). Either way it is not kept: a request that failed to encode stayed among
    those sent again after a reconnect, so every reconnect failed on it from then on
    and each later request of the client timed out."""
    name = type(frame).__name__.upper()
    try:
        data = f.encode(frame)
    except (OverflowError, UnicodeEncodeError, TypeError) as exc:
        raise BadRequest(f"{name} cannot be sent: {exc} (integers fit 64 bits, text is "
                         "valid Unicode)") from None
    if len(data) - 4 > MAX_FRAME_SIZE:
        raise FrameTooLarge(f"{name} would be a frame of {len(data) - 4} bytes, over the "
                            f"{MAX_FRAME_SIZE} byte limit: send less at once",
                            limit=MAX_FRAME_SIZE, size=len(data) - 4)
    return data


def _text_ok(label: str, text: str) -> None:
    """BadRequest unless ``text`` can be sent (UTF-8): a lone surrogate failed the
    encoding of the whole frame of publishes later, each of them left to time out."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            raise BadRequest(f"{label} {text[:80]!r} is not valid Unicode text (a lone "
                             f"surrogate at {exc.start})") from None


def _seconds(label: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{label} must be a number of seconds, got {value!r:.100}")
    try:
        return float(value)  # an integer past 64 bits fits a float (the broker names it)
    except OverflowError:
        raise BadRequest(f"{label} must be 0..{MAX_DELAY_S:g} seconds, got an integer of "
                         f"{value.bit_length()} bits") from None


def _start(start: str | int) -> str:
    if isinstance(start, int) and not isinstance(start, bool):
        return f"seq:{start}"
    return start


def _untrusted(exc: ssl.SSLCertVerificationError) -> str:
    return (f"the broker's TLS certificate is not trusted ({exc.reason}: {exc.verify_message})"
            ": pin it with "
            "tls_fingerprint= (CLI: --tls-fingerprint SHA256:..., as the broker printed it at "
            "start) or give cafile= with the CA that signed it")


async def _plain_to_tls_hint(scheme: str, host: str, port: int, exc: BaseException) -> object:
    """A plain connection the broker closed unanswered: if the port speaks TLS, say so
    (one unverified probe, only on this failure path) instead of "connection lost"."""
    if scheme not in ("minou", "ws"):
        return exc
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    try:
        transport, _ = await asyncio.wait_for(asyncio.get_running_loop().create_connection(
            asyncio.Protocol, host, port, ssl=probe), 2)
    except (OSError, TimeoutError, ssl.SSLError):
        return exc
    try:
        from ..tls import cert_fingerprint

        der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
        seen = f" (it presents {cert_fingerprint(der)}; check it against the broker's banner)"
    except Exception:  # the hint is a courtesy; never fail on it
        seen = ""
    finally:
        transport.abort()  # no TLS goodbye: nothing was said, and the caller may stop the loop
        await asyncio.sleep(0)  # let the socket close now
    secure = "minous" if scheme == "minou" else "wss"
    return (f"the broker speaks TLS: use {secure}://{host}:{port} and pin its certificate "
            f"with tls_fingerprint= (CLI: --tls-fingerprint){seen}")


async def connect(
    urls: str | list[str] = f"minou://127.0.0.1:{DEFAULT_PORT}",
    *,
    client_id: str | None = None,
    max_pending: int = CLIENT_SEND_QUEUE,
    request_timeout: float = CLIENT_REQUEST_TIMEOUT_S,
    reconnect: bool = True,
    key: str | os.PathLike[str] | PrivateKey | None = None,
    broker_token: str | None = None,
    tls_fingerprint: str | None = None,
    cafile: str | None = None,
    wait_for_approval: float = 0.0,
    heartbeat: float | None = DEFAULT_HEARTBEAT_S,
    confirm_timeout: float | None = CLIENT_CONFIRM_TIMEOUT_S,
    idempotent: bool = True,
    credential: str | None = None,
) -> Client:
    """Connect to the first broker of ``urls`` that answers; fail over to the others.

    ``key`` is the client's private key (a file from ``minou keygen``, or a key object):
    each connection signs a fresh short-lived token with it, and presents the public
    key so a first connection can register it. ``broker_token`` is the shared secret
    of brokers that require one. ``minous://`` and ``wss://`` URLs use TLS, verified
    with ``cafile`` or pinned to ``tls_fingerprint`` (``SHA256:..`` as the broker
    printed it). A new client may have to wait for an admin's approval: with
    ``wait_for_approval`` > 0 it retries for that many seconds instead of raising
    ``PendingApproval`` at once. ``credential`` (with ``client_id``, without ``key``) is a
    delegated credential its holder issued (``Client.issue_credential``).

    Liveness and deadlines (docs/reliability.md): both sides send a heartbeat every
    ``heartbeat`` seconds of silence (``None``: none) and a side that hears nothing for
    two intervals drops the connection (the client then reconnects, next URL first).
    A publish not confirmed within ``confirm_timeout`` seconds raises ``Timeout``
    (``None``: wait as long as it takes); other calls wait ``request_timeout``. With
    ``idempotent`` (the default) publishes are numbered per channel, so a resend after
    a reconnect is stored once without a dedup key.
    """
    if isinstance(urls, str):
        urls = [u.strip() for u in urls.split(",") if u.strip()]
    client = Client(urls, client_id=client_id, max_pending=max_pending,
                    request_timeout=request_timeout, reconnect=reconnect, key=key,
                    broker_token=broker_token, tls_fingerprint=tls_fingerprint, cafile=cafile,
                    heartbeat=heartbeat, confirm_timeout=confirm_timeout,
                    idempotent=idempotent, credential=credential)
    deadline = asyncio.get_running_loop().time() + wait_for_approval
    while True:
        try:
            await client._open()
            return client
        except PendingApproval:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(min(1.0, max(0.05, deadline - asyncio.get_running_loop().time())))
