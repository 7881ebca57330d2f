"""One link connection to another broker of the cluster, on behalf of one client
connection (front.py): native frames out, their answers and deliveries back.

It speaks the native protocol as a client would, presenting the client's id with a
link credential (spread.py: signed with the cluster's link secret), so the owner
applies that client's own rules. Its TLS, when the owner's listener has it, is pinned
to the certificate fingerprint the owner published in Redis.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import msgspec

from ..errors import ErrorCode
from ..limits import PROTOCOL_VERSION
from ..protocol import frames as f
from ..protocol.reader import BadFrame, FrameReader
from ..tls import TlsPinMismatch, check_pin, client_context


class Front(Protocol):
    """What of a connection's front (front.py) a link answers to."""

    conn: Any  # the client's NativeConnection
    spread: Any  # spread.SpreadRole

    def delivered(self, up: Upstream, ev: f.Deliver) -> None: ...

    def lost(self, up: Upstream) -> None: ...

log = logging.getLogger("minou.cluster")

CONNECT_TIMEOUT_S = 5.0
Answer = Callable[[f.Frame], None]


class Upstream(asyncio.Protocol):
    def __init__(self, front: Front, member: str, record: dict[str, str]) -> None:
        self.front = front
        self.member = member
        self.record = record
        self.reader = FrameReader(max_frame_size=front.conn.server.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.welcomed = False
        self.closed = False
        self.error = ""  # why it failed, for the answers it owes
        self._queued: list[bytes] = []  # frames written before the WELCOME
        self._pending: dict[int, Answer] = {}
        self._reqs = itertools.count(1)
        self._task = asyncio.ensure_future(self._open())

    # -------------------------------------------------------------- opening
    async def _open(self) -> None:
        url = self.record.get("native", "")
        parts = urlsplit(url)
        pin = self.record.get("tls_fingerprint") or ""
        try:
            if parts.scheme == "minous" and not pin:
                raise ConnectionError(f"broker {self.member} speaks TLS but published no "
                                      "certificate fingerprint")
            tls = client_context(fingerprint=pin) if parts.scheme == "minous" else None
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.create_connection(
                lambda: self, parts.hostname, parts.port, ssl=tls,
                server_hostname=parts.hostname if tls else None), CONNECT_TIMEOUT_S)
            if tls is not None and self.transport is not None:
                check_pin(self.transport.get_extra_info("ssl_object"), pin)
        except (OSError, TimeoutError, TlsPinMismatch, ValueError) as exc:
            self._fail(f"cannot reach broker {self.member} at {url}: {exc}")
            return
        conn = self.front.conn
        hello = f.Hello(conn.session.client_id, PROTOCOL_VERSION,
                        credential=self.front.spread.link_credential(conn.session.client_id),
                        broker_token=conn.server.settings.broker_token,
                        producer_id=conn.session.producer_id)
        self._write(f.encode(hello), force=True)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.front.links_paused:
            self.transport.pause_reading()  # type: ignore[union-attr]

    def pause(self, paused: bool) -> None:
        """Stop (or go on) reading what the owner sends: its deliveries wait there, on
        its link connection, under its own water mark and budgets, instead of piling
        up here unsent to a client that does not read."""
        if self.transport is None or self.closed or self.transport.is_closing():
            return
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.reader.receive_data(data)
        while (event := self.reader.next_event()) is not None:
            if isinstance(event, BadFrame):
                self._fail(f"broker {self.member} sent a bad frame: {event.error}")
                return
            self._on_frame(event)
        self.front.conn.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"the link to broker {self.member} was lost"
                   + (f": {exc}" if exc else ""))

    # ------------------------------------------------------------- frames
    def _on_frame(self, ev: f.Frame) -> None:
        if isinstance(ev, f.Welcome):
            self.welcomed = True
            queued, self._queued = self._queued, []
            if self.transport is not None and queued:
                self.transport.write(b"".join(queued))
            return
        if isinstance(ev, f.Deliver):
            self.front.delivered(self, ev)
            return
        if isinstance(ev, f.Heartbeat | f.Pong):
            return
        req = getattr(ev, "req", 0)
        if isinstance(ev, f.Error) and (ev.fatal or not req):
            if ev.fatal:
                self._fail(f"broker {self.member} refused the link: {ev.message}")
            elif "tag" in ev.detail:  # an ack without a reply that failed: nothing to do
                pass
            return
        answer = self._pending.pop(req, None)
        if answer is not None:
            answer(ev)

    def request(self, frame: f.Frame, answer: Answer | None) -> None:
        """Send ``frame`` with a request id of this link's; ``answer`` gets the reply
        (or an Error frame if the link fails first)."""
        if self.closed:
            if answer is not None:
                answer(self._error_frame(0))
            return
        req = next(self._reqs) if answer is not None or getattr(frame, "req", 0) else 0
        if hasattr(frame, "req"):
            frame = msgspec.structs.replace(frame, req=req)  # type: ignore[type-var]
        if answer is not None:
            self._pending[req] = answer
        self._write(f.encode(frame))

    def _write(self, data: bytes, *, force: bool = False) -> None:
        if self.closed:
            return
        if (self.welcomed or force) and self.transport is not None:
            self.transport.write(data)
        else:
            self._queued.append(data)

    def _error_frame(self, req: int) -> f.Error:
        return f.Error(req, int(ErrorCode.STORAGE_UNAVAILABLE),
                       self.error or f"the link to broker {self.member} is closed")

    def fail(self, why: str) -> None:
        """Close, answering everything pending with ``why``."""
        self._fail(why)

    def _fail(self, why: str) -> None:
        if self.closed:
            return
        self.closed, self.error = True, why
        log.info("front: %s", why)
        if self.transport is not None:
            self.transport.close()
        pending, self._pending = self._pending, {}
        for req, answer in pending.items():
            answer(self._error_frame(req))
        self._queued.clear()
        self.front.lost(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._pending.clear()
            if self.transport is not None:
                self.transport.close()
            self._task.cancel()

    def status(self) -> dict[str, Any]:
        return {"member": self.member, "welcomed": self.welcomed, "pending": len(self._pending)}
