"""What a standby broker answers while another holds the primary lease.

A standby has opened nothing (the primary's state is the primary's until the lease runs
out), so it serves no request: on its native port it answers the HELLO with a fatal
STANDBY error naming the primary's URL (the client connects there, then to its other
URLs); on its HTTP port ``/health`` is 503 (a load balancer sends nobody here) and every
other request is redirected (307) to the same path on the primary, or refused with 503
when the primary's address is not known. The door listens on duplicates of the broker's
sockets: closing it at the takeover leaves the sockets to the broker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from typing import Any

from ..errors import ERROR_TABLE, ErrorCode
from ..protocol import frames as f

HEAD_LIMIT = 16 * 1024  # a request head bigger than this is not worth reading here
READ_TIMEOUT_S = 5.0


class StandbyDoor:
    def __init__(self, holder: dict[str, Any] | None) -> None:
        self.holder = holder  # the primary: id, native, http, since (None: nobody yet)
        self.refused = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self, native: socket.socket, http: socket.socket | None,
                    tls: ssl.SSLContext | None) -> None:
        self._servers.append(await asyncio.start_server(
            self._native, sock=native.dup(), ssl=tls, ssl_handshake_timeout=READ_TIMEOUT_S
            if tls else None))
        if http is not None:
            self._servers.append(await asyncio.start_server(
                self._http, sock=http.dup(), ssl=tls, limit=HEAD_LIMIT,
                ssl_handshake_timeout=READ_TIMEOUT_S if tls else None))

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for writer in list(self._conns):
            writer.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await server.wait_closed()
        self._servers.clear()

    def _message(self) -> tuple[str, dict[str, Any]]:
        holder = self.holder or {}
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

    async def _native(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def answer() -> None:
            await reader.read(64 * 1024)  # the HELLO: answered whatever it holds
            message, detail = self._message()
            self.refused += 1
            writer.write(f.encode(f.Error(0, int(ErrorCode.STANDBY), message, detail,
                                          fatal=True)))
            await writer.drain()

        await self._serve(writer, answer())

    async def _http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
                                        "accepting": False, "reason": message, **detail}
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
