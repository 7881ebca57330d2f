"""What a standby broker does with clients while another holds the primary lease.

A standby has opened nothing (the primary's state is the primary's until the lease runs
out), so it serves no request itself. By default (``[storage] standby = "relay"``) it
passes each connection on to the primary, byte for byte, native and HTTP alike (SSE and
WebSocket too): every broker serves every client, the client's own key still proves
who it is to the primary, and delivery tags are the primary's, fenced as ever. The
connection to the primary is TLS when the primary's is, pinned to the certificate
fingerprint the primary published in Redis (the brokers' shared, trusted registry).

When relaying is off, impossible (the primary is unknown, out of reach, or
``max_relays`` connections are relayed already) or refused, the standby says where the
primary is instead: on its native port it answers the HELLO with a fatal STANDBY error
naming the primary's URL (the client connects there, then to its other URLs); on its
HTTP port ``/health`` is 503 (a load balancer sends nobody here) and every other
request is redirected (307) to the same path on the primary, or refused with 503 when
the primary's address is not known. The door listens on duplicates of the broker's
sockets: closing it at the takeover leaves the sockets to the broker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from ..errors import ERROR_TABLE, ErrorCode, TooManyConnections, describe
from ..protocol import frames as f
from ..tls import TlsPinMismatch, check_pin, client_context

HEAD_LIMIT = 16 * 1024  # a request head bigger than this is not worth reading here
READ_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0  # to the primary; past it the client is told where to go
CHUNK = 64 * 1024
RELAY_LOG_EVERY_S = 30.0

log = logging.getLogger("minou.cluster")


class StandbyDoor:
    def __init__(self, holder: dict[str, Any] | None, *, relay: bool = False,
                 max_relays: int = 0, max_held: int = 0) -> None:
        self.holder = holder  # the primary: id, native, http, since (None: nobody yet)
        # Seconds since this broker last reached Redis, for /health (peer_reach.py: how
        # the primary, cut off, tells a partition from Redis down for everyone).
        self.redis_seen_s: Any = lambda: 0.0
        self.relay = relay
        self.max_relays = max_relays  # connections relayed at once, at most
        # Sockets the door holds at once, at most (a relay holds two: the client's and
        # the primary's): past it a client is refused at once, its socket closed.
        self.max_held = max_held
        self.full = 0  # clients refused so: the door held max_held sockets already
        self.refused = 0  # clients told where the primary is
        self.relayed = 0  # connections passed on to the primary, in all
        self.relay_failures = 0  # relays tried that could not reach the primary
        self._servers: list[asyncio.AbstractServer] = []
        self._conns: set[asyncio.StreamWriter] = set()
        # Relayed connections: client writer -> (primary id, upstream writer).
        self._relays: dict[asyncio.StreamWriter, tuple[str, asyncio.StreamWriter]] = {}
        self._logged_failure = 0.0
        self._logged_full = 0.0
        self._opening = 0
        # The local ports of the connections we opened to the primary: one that comes
        # back to this door means the primary's address is ours (see _is_own_relay).
        self._outgoing: set[int] = set()
        self._own_address: str | None = None  # a primary URL found to be this door's

    async def start(self, native: socket.socket, http: socket.socket | None,
                    tls: ssl.SSLContext | None) -> None:
        self._servers.append(await asyncio.start_server(
            self._native, sock=native.dup(), ssl=tls, ssl_handshake_timeout=READ_TIMEOUT_S
            if tls else None))
        if http is not None:
            self._servers.append(await asyncio.start_server(
                self._http, sock=http.dup(), ssl=tls, limit=HEAD_LIMIT,
                ssl_handshake_timeout=READ_TIMEOUT_S if tls else None))

    @property
    def relaying(self) -> int:
        return len(self._relays)

    def _held(self) -> int:
        return len(self._conns) + 2 * (len(self._relays) + self._opening)

    def _refuse_if_full(self, writer: asyncio.StreamWriter, kind: str) -> bool:
        """Refuse a client at once when the door holds all the sockets it may (idle
        sockets flooding a standby): a precise error, a log line, and its descriptor
        back at once rather than after a read timeout."""
        if not self.max_held or self._held() < self.max_held:
            return False
        self.full += 1
        exc = TooManyConnections(
            f"this standby already holds {self._held()} sockets, its clients' and those "
            f"it relays to the primary (its limit: {self.max_held}); try again later",
            limit=self.max_held)
        if kind == "native":
            writer.write(f.encode(f.Error(0, int(exc.code), exc.message, exc.detail,
                                          fatal=True)))
        else:
            body = json.dumps({"error": {"code": int(exc.code), "reason": exc.reason,
                                         "message": exc.message, "detail": exc.detail}}
                              ).encode()
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                         b"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
        writer.close()
        now = time.monotonic()
        if now - self._logged_full >= RELAY_LOG_EVERY_S:
            self._logged_full = now
            log.warning("standby: %s connection from %s refused: %d sockets held (limit "
                        "%d; %d refused so far)", "native" if kind == "native" else "HTTP",
                        writer.get_extra_info("peername"), self._held(), self.max_held,
                        self.full)
        return True

    def primary_changed(self, holder: dict[str, Any] | None) -> None:
        """A new primary (or none): connections relayed to the old one go nowhere
        now, so they are closed and their clients reconnect."""
        self.holder = holder
        self._own_address = None
        new = (holder or {}).get("id")
        for client, (primary, upstream) in list(self._relays.items()):
            if primary != new:
                upstream.close()
                client.close()

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._conns):
            writer.close()
        for client, (_, upstream) in list(self._relays.items()):
            upstream.close()
            client.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    def _message(self) -> tuple[str, dict[str, Any]]:
        holder = self.holder or {}
        if self._own_address is not None and holder.get("native") == self._own_address:
            # Naming it would send the client back here: it retries after its backoff.
            return (f"this broker is a standby and the primary's address in the registry "
                    f"is its own address ({self._own_address}): the broker that held it "
                    "is gone, and this one takes over once its lease runs out; try again",
                    {})
        detail = {k: holder[v] for k, v in (("primary", "native"), ("primary_http", "http"))
                  if holder.get(v)}
        where = f"broker {holder['id']!r} at {holder.get('native') or '?'}" if holder \
            else "no broker yet (the lease is being taken over)"
        return (f"this broker is a standby; the primary is {where}: connect there", detail)

    async def _serve(self, writer: asyncio.StreamWriter, work: Any) -> None:
        self._conns.add(writer)
        try:
            await asyncio.wait_for(work, READ_TIMEOUT_S)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ssl.SSLError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()

    # ------------------------------------------------------------------- relaying
    async def _open_primary(self, which: str
                            ) -> tuple[str, asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the primary's ``which`` port ("native", "http"), or None
        (relaying off or full, the primary unknown or out of reach)."""
        holder = self.holder or {}
        url = holder.get(which)
        if not self.relay or not url or len(self._relays) + self._opening >= self.max_relays:
            return None
        if self._own_address is not None and holder.get("native") == self._own_address:
            return None  # the primary's address is this door's: see _is_own_relay
        parts = urlsplit(url)
        secure = parts.scheme in ("minous", "https")
        pin = holder.get("tls_fingerprint")
        if secure and not pin:
            self._relay_failed(f"the primary's {which} port speaks TLS but it published "
                               "no certificate fingerprint")
            return None
        self._opening += 1  # counted against max_relays while it connects
        sock: socket.socket | None = None
        try:
            tls = client_context(fingerprint=pin) if secure else None
            sock = await self._bound_socket(parts.hostname or "", parts.port or 0)
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                sock=sock, ssl=tls, server_hostname=parts.hostname if tls else None,
                limit=CHUNK), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            if sock is not None:
                self._outgoing.discard(sock.getsockname()[1])
                sock.close()
            self._relay_failed(f"cannot reach the primary at {url}: {describe(exc)}")
            return None
        finally:
            self._opening -= 1
        if secure:
            try:
                check_pin(writer.get_extra_info("ssl_object"), pin or "")
            except TlsPinMismatch as exc:
                self._outgoing.discard(sock.getsockname()[1])
                writer.close()
                self._relay_failed(f"the primary at {url}: {exc}")
                return None
        return str(holder.get("id", "")), reader, writer

    async def _bound_socket(self, host: str, port: int) -> socket.socket:
        """A socket connected to the primary, whose local port was known (and noted in
        ``_outgoing``) before it connected: the door may accept it before this
        coroutine resumes, and must see then that it is its own (_is_own_relay)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            self._outgoing.add(sock.getsockname()[1])
            await asyncio.wait_for(loop.sock_connect(sock, address), CONNECT_TIMEOUT_S)
        except BaseException:
            self._outgoing.discard(sock.getsockname()[1])
            sock.close()
            raise
        return sock

    def _is_own_relay(self, writer: asyncio.StreamWriter) -> bool:
        """Whether this connection is one this door opened to the primary: then the
        primary's address is this door's own. It happens to a broker restarted on its
        old port while its dead self's lease runs on: relaying there dialled the door
        itself, hop after hop up to max_relays, with the client waiting at the end.
        From now until the primary changes the door relays nothing to that address
        and tells clients to try again."""
        peer, local = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        # From this machine (the peer's address is the one it reached us on) and from a
        # port one of our relays holds.
        if not peer or not local or peer[1] not in self._outgoing or peer[0] != local[0]:
            return False
        url = (self.holder or {}).get("native")
        if self._own_address is None and url:
            self._own_address = url
            log.warning("standby: the primary's address in the registry, %s, is this "
                        "broker's own (restarted on the port of the broker that held the "
                        "lease, which is gone): clients are asked to retry until this "
                        "broker takes over", url)
        return True

    def _relay_failed(self, why: str) -> None:
        self.relay_failures += 1
        now = time.monotonic()
        if now - self._logged_failure >= RELAY_LOG_EVERY_S:
            self._logged_failure = now
            log.warning("standby: %s; clients asking here are told where the primary is "
                        "instead (%d relay failures so far)", why, self.relay_failures)

    async def _splice(self, client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                      primary: tuple[str, asyncio.StreamReader, asyncio.StreamWriter]
                      ) -> None:
        """Pass bytes both ways until either side closes; each way waits for the
        other side to take what it was given (a slow reader slows its sender, nothing
        piles up here)."""
        reader, writer = client
        primary_id, up_reader, up_writer = primary
        own_end = up_writer.get_extra_info("sockname")
        self._relays[writer] = (primary_id, up_writer)
        self.relayed += 1

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(CHUNK):
                dst.write(data)
                await dst.drain()

        try:
            ways = [asyncio.ensure_future(pipe(reader, up_writer)),
                    asyncio.ensure_future(pipe(up_reader, writer))]
            try:
                await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for way in ways:
                    way.cancel()
                for way in ways:  # collect them: a reset or TLS error ends a way
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await way
        finally:
            self._relays.pop(writer, None)
            if own_end is not None:
                self._outgoing.discard(own_end[1])
            up_writer.close()
            writer.close()

    # ----------------------------------------------------------------- the ports
    async def _native(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse_if_full(writer, "native"):
            return
        primary = None if self._is_own_relay(writer) else await self._open_primary("native")
        if primary is not None:
            await self._splice((reader, writer), primary)
            return

        async def answer() -> None:
            await reader.read(64 * 1024)  # the HELLO: answered whatever it holds
            message, detail = self._message()
            self.refused += 1
            writer.write(f.encode(f.Error(0, int(ErrorCode.STANDBY), message, detail,
                                          fatal=True)))
            await writer.drain()

        await self._serve(writer, answer())

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refuse_if_full(writer, "http"):
            return
        if self.relay and not self._is_own_relay(writer):
            primary = await self._open_primary("http")
            if primary is not None:
                await self._splice((reader, writer), primary)
                return

        async def answer() -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = line[1] if len(line) >= 3 and line[1].startswith("/") else "/"
            message, detail = self._message()
            self.refused += 1
            info = ERROR_TABLE[ErrorCode.STANDBY]
            if path.split("?", 1)[0] == "/health":
                status, extra = "503 Service Unavailable", {}
                body: dict[str, Any] = {"status": "standby", "storage": "standby",
                                        "accepting": False, "reason": message, **detail,
                                        "redis_seen_s": round(self.redis_seen_s(), 3)}
            elif detail.get("primary_http"):
                status = "307 Temporary Redirect"
                extra = {"Location": detail["primary_http"].rstrip("/") + path}
                body = {"error": {"code": int(ErrorCode.STANDBY), "reason": info.reason,
                                  "message": message, "detail": detail}}
            else:
                status, extra = "503 Service Unavailable", {"Retry-After": "1"}
                body = {"error": {"code": int(ErrorCode.STANDBY), "reason": info.reason,
                                  "message": message, "detail": detail}}
            data = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Content-Length": str(len(data)),
                       "Connection": "close", "Cache-Control": "no-store", **extra}
            writer.write(f"HTTP/1.1 {status}\r\n".encode() + b"".join(
                f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items()) + b"\r\n" + data)
            await writer.drain()

        await self._serve(writer, answer())
