"""Test e of bench/minou_bench.py: minou's HTTP API under keep-alive load.

``HttpPeer`` has the methods of the peer classes of /work/shared/bench/peers.py
(``connect``, ``publish``, ``consume``, ``close``), so the HTTP rows run through
the same worker code as every other row (``peers._worker``: spawn, uvloop,
barrier start, CLOCK_MONOTONIC, CPU accounting). It is plugged in as the peer
``minou-http`` by ``bench_clients.worker_entry``.

Each worker process is one client as deployed: it registers its own Ed25519 key
with one native connection (``bench-http-<pid>``, accepted by the bench broker's
rule ``bench-*``), closes it, and signs a JWT for the broker (``make_token``, one
hour), which every request carries as ``Authorization: Bearer``. So the rule
check runs on every publish and consume, as for a deployed HTTP client (the broker
token would make the caller an admin, which skips it).

The process then keeps ``conns`` keep-alive HTTP/1.1 connections open, each with
one request in flight at a time (HTTP/1.1 without pipelining), one coroutine per
connection:

* publish: ``POST /v1/messages/bench/v1/q`` with a JSON string body of ``size``
  bytes; a 201 comes back once the message is in a committed (fsync'd) SQLite
  transaction (the broker group-commits concurrent requests).
* batch publish (``http_batch`` > 1): ``POST /v1/messages`` with a JSON array of
  ``http_batch`` such messages; a 200 comes back once all are committed, with one
  result each (a message counts when its result has no error).
* consume+ack: ``POST /v1/consume/bench/v1/q?group=bench_g&wait=1`` (200 with
  ``{"receipt", "payload", ...}``, or 204 after a second without a message), then
  ``POST /v1/ack/<receipt>``, whose 200 comes back once the ack is durable. A
  message counts when its ack is answered.

Two clients (``--http-client``): ``raw`` (default), a minimal HTTP/1.1 client on
an asyncio protocol with the ``httptools`` response parser (the parser uvicorn
uses; already a minou dependency), so that on a small machine the load
generator leaves the CPU to the broker, like ``wrk`` would; and ``httpx``
(``httpx.AsyncClient``, HTTP/1.1, ``Limits(max_connections=conns)``), which is
what a typical Python application would use and costs several times more CPU
per request on the client side.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bench_clients import CHANNEL, GROUP, _process_key

PUB_PATH = f"/v1/messages/{CHANNEL}"
BATCH_PATH = "/v1/messages"
CON_PATH = f"/v1/consume/{CHANNEL}?group={GROUP}&wait=1"
ACK_PATH = "/v1/ack/"


class _Delivered(msgspec.Struct):
    receipt: str


_decode_delivery = msgspec.json.Decoder(_Delivered).decode


# ------------------------------------------------------------ the raw client
class RawConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. Reconnects if the
    server closes it (``Connection: close``, or the keep-alive timeout)."""

    def __init__(self, host: str, port: int, headers: bytes) -> None:
        import httptools

        self.host, self.port = host, port
        self.headers = headers  # Host, Authorization, ... each ending in CRLF
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []
        self.keep_alive = True
        self.reconnects = -1

    async def open(self) -> None:
        import httptools

        self.parser = httptools.HttpResponseParser(self)
        self.keep_alive = True
        self.reconnects += 1
        await asyncio.get_running_loop().create_connection(lambda: self, self.host, self.port)

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # httptools.HttpParserError
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ConnectionError(f"connection closed by the server ({exc})"))

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks)
        self.chunks = []
        self.keep_alive = self.parser.should_keep_alive()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), body))

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    async def post(self, path: str, body: bytes = b"", method: str = "POST"
                   ) -> tuple[int, bytes]:
        if self.transport is None or not self.keep_alive:
            if self.transport is not None:
                self.transport.close()
            await self.open()
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(b"%s %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
                             % (method.encode(), path.encode(), self.headers, len(body), body))
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None


class HttpxConnection:
    """The same ``post`` over one shared ``httpx.AsyncClient`` (its pool holds the
    keep-alive connections)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.reconnects = 0

    async def post(self, path: str, body: bytes = b"", method: str = "POST"
                   ) -> tuple[int, bytes]:
        r = await self.client.request(method, path, content=body)
        return r.status_code, r.content

    def close(self) -> None:
        return None


# ---------------------------------------------------------------- the peer
class HttpPeer:
    """minou over its HTTP API; the job gives the URLs, ``conns`` and the client."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.native_url: str = job["url"]
        self.http_url: str = job["http_url"]
        self.nconns: int = int(job.get("conns", 16))
        self.kind: str = job.get("http_client", "raw")
        self.batch: int = int(job.get("http_batch", 1))  # > 1: POST /v1/messages arrays
        self.conns: list[Any] = []
        self.httpx: Any = None

    async def connect(self) -> None:
        import minou
        from minou.auth.tokens import make_token

        client_id = f"bench-http-{os.getpid()}"
        key = _process_key()
        native = await minou.connect(self.native_url, client_id=client_id, key=key,
                                     reconnect=False)
        try:
            broker_id = native.broker_id
        finally:
            await native.close()
        token = make_token(client_id, key, broker_id, ttl=3600)
        u = urlsplit(self.http_url)
        if u.scheme != "http" or u.hostname is None or u.port is None:
            raise RuntimeError(f"unexpected HTTP URL {self.http_url!r} (plain http only)")
        if self.kind == "httpx":
            import httpx

            self.httpx = httpx.AsyncClient(
                base_url=self.http_url, http1=True, http2=False, timeout=30.0,
                limits=httpx.Limits(max_connections=self.nconns,
                                    max_keepalive_connections=self.nconns),
                headers={"Authorization": f"Bearer {token}",
                         "Content-Type": "application/json"})
            self.conns = [HttpxConnection(self.httpx) for _ in range(self.nconns)]
        elif self.kind == "raw":
            headers = (f"Host: {u.hostname}:{u.port}\r\nAuthorization: Bearer {token}\r\n"
                       "Content-Type: application/json\r\n").encode()
            self.conns = [RawConnection(u.hostname, u.port, headers)
                          for _ in range(self.nconns)]
            await asyncio.gather(*(c.open() for c in self.conns))
        else:
            raise ValueError(f"unknown HTTP client {self.kind!r} (raw, httpx)")
        # Before the barrier: check the token on every connection (and, with httpx,
        # make the pool open all of them).
        async def whoami(c: Any) -> None:
            status, body = await c.post("/v1/whoami", method="GET")
            if status != 200:
                raise RuntimeError(f"GET /v1/whoami: HTTP {status}: {body[:300]!r}")

        await asyncio.gather(*(whoami(c) for c in self.conns))

    async def close(self) -> None:
        reconnects = sum(c.reconnects for c in self.conns)
        if reconnects:  # keep-alive is part of the method: say when it did not hold
            print(f"  ! http_bench: {reconnects} reconnection(s) in process {os.getpid()}",
                  file=sys.stderr, flush=True)
        for c in self.conns:
            c.close()
        if self.httpx is not None:
            await self.httpx.aclose()

    async def reset(self) -> None:  # the orchestrator restarts the broker on a fresh dir
        return None

    async def publish(self, n: int, size: int, window: int, deadline: float
                      ) -> tuple[int, int]:
        """``n`` publishes over ``conns`` connections, one in flight on each (``window``
        is the native rows' parameter; here the in-flight count is ``conns``)."""
        body = b'"' + b"x" * (size - 2) + b'"'  # a JSON string of `size` bytes
        path, expect, per = PUB_PATH, 201, 1
        if self.batch > 1:  # the batch route: one JSON array of `batch` messages
            item = b'{"channel": "%s", "payload": %s}' % (CHANNEL.encode(), body)
            path, expect, per = BATCH_PATH, 200, self.batch
            body = b"[" + b",".join([item] * self.batch) + b"]"
        ok = errors = started = 0
        first_error: str | None = None

        async def loop(conn: Any) -> None:
            nonlocal ok, errors, started, first_error
            while started < n and time.monotonic() < deadline:
                started += per
                status, text = await conn.post(path, body)
                if status == expect and (per == 1 or b'"error"' not in text):
                    ok += per
                else:
                    errors += per
                    first_error = first_error or f"HTTP {status}: {text[:300]!r}"
                    if errors >= 100 and not ok:
                        return

        await asyncio.gather(*(loop(c) for c in self.conns))
        if errors and not ok:
            raise RuntimeError(f"every HTTP publish failed: {first_error}")
        return ok, errors

    async def consume(self, target: int, batch: int, deadline: float, idle_s: float,
                      name: str, lat: list[int] | None = None) -> tuple[int, float]:
        """Long-poll consume + ack per message on ``conns`` connections (``batch`` is the
        native rows' prefetch; here the broker hands out one message per waiting
        request). Stops at ``target``, at the deadline, or ``idle_s`` after the last
        message. Returns (messages acked, time of the last ack's answer)."""
        count = 0
        last = time.monotonic()

        async def loop(conn: Any) -> None:
            nonlocal count, last
            while count < target and time.monotonic() < deadline:
                status, text = await conn.post(CON_PATH)
                if status == 204:
                    if time.monotonic() - last > idle_s:
                        return
                    continue
                if status != 200:
                    raise RuntimeError(f"consume: HTTP {status}: {text[:300]!r}")
                receipt = _decode_delivery(text).receipt
                status, text = await conn.post(ACK_PATH + receipt)
                if status != 200:
                    raise RuntimeError(f"ack: HTTP {status}: {text[:300]!r}")
                count += 1
                last = time.monotonic()

        await asyncio.gather(*(loop(c) for c in self.conns))
        return count, last

    async def publish_paced(self, rate: float, duration: float, size: int) -> int:
        raise NotImplementedError("test e has no latency row")
