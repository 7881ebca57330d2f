"""A loopback TCP proxy for tests of bad networks: it forwards bytes both ways and can
cut every connection (both ends closed, as a reset link), black-hole them (it stops
forwarding and keeps the sockets open, as a NAT that dropped its state: no FIN, no
RST ever arrives) or slow the replies down (``reply_delay``: a far or loaded link).
Runs its own event loop in a thread, so sync and async tests can both drive it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any


class Proxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="test-proxy")
        self.links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.frozen = False  # black hole: new bytes are read and dropped, nothing closes
        self.replies_lost = False  # broker -> client bytes dropped (confirms never arrive)
        self.reply_delay = 0.0  # seconds each chunk of replies waits: a slow, far link
        self.cuts = 0
        self.accepted = 0
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"minou://127.0.0.1:{self.port}"

    def start(self) -> Proxy:
        self.thread.start()
        self._call(self._listen())
        return self

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, sock=self._sock)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self.links.append((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer),
                             self._pump(up_reader, writer, replies=True),
                             return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    replies: bool = False) -> None:
        try:
            while data := await reader.read(65536):
                if replies and self.reply_delay:
                    await asyncio.sleep(self.reply_delay)
                if not self.frozen and not (replies and self.replies_lost):
                    writer.write(data)
                    await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if not self.frozen:
                writer.close()

    def cut(self, lose_replies_for: float = 0.0) -> None:
        """Close every open connection now (both sides see the connection end). With
        ``lose_replies_for``, the broker's replies are dropped that long first: what
        the client sent then was stored, and it never hears so."""
        async def run() -> None:
            if lose_replies_for:
                self.replies_lost = True
                await asyncio.sleep(lose_replies_for)
                self.replies_lost = False
            links, self.links = self.links, []
            for a, b in links:
                for w in (a, b):
                    with contextlib.suppress(Exception):
                        w.transport.abort()
            self.cuts += 1

        self._call(run())

    def freeze(self) -> None:
        """Black-hole the connections open now and later: bytes go nowhere, and nothing
        closes (until ``thaw`` or ``close``)."""
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def close(self) -> None:
        async def run() -> None:
            if self._server is not None:
                self._server.close()
            for a, b in self.links:
                for w in (a, b):
                    with contextlib.suppress(Exception):
                        w.transport.abort()

        with contextlib.suppress(Exception):
            self._call(run())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.loop.is_running():
            self.loop.close()
