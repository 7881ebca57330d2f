"""A federation remote that lies: it speaks the native protocol on loopback as a broker
would (HELLO, OFFSETS, POSITION, READ, ``channels.wait``, PING) and serves the messages
it is given, but its OFFSETS answer names whatever channels the test chooses, matched
by the link's patterns or not. What a compromised or buggy broker of another place
could send a link's pull direction. Runs its own event loop in a thread, as netproxy.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

from minou.limits import PROTOCOL_VERSION
from minou.protocol import frames as f
from minou.protocol.reader import BadFrame, FrameReader


class FakeRemote:
    def __init__(self, broker_id: str, channels: dict[str, list[bytes]]) -> None:
        self.broker_id = broker_id
        self.channels = channels  # channel -> its messages' JSON payloads, seq 1, 2, ...
        self.reads: list[str] = []  # channels the link read, in order
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="test-fake-remote")
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self._sock = sock
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"minou://127.0.0.1:{self.port}"

    def start(self) -> FakeRemote:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        return self

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        self._sock.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, sock=self._sock)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                frames.receive_data(data)
                while (ev := frames.next_event()) is not None:
                    if isinstance(ev, BadFrame):
                        return
                    answer = await self._answer(ev)
                    if answer is not None:
                        writer.write(f.encode(answer))
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _answer(self, ev: f.Frame) -> f.Frame | None:
        if isinstance(ev, f.Hello):
            return f.Welcome(self.broker_id, PROTOCOL_VERSION, "s1", 1 << 20, ev.client_id)
        if isinstance(ev, f.Offsets):
            return f.Result(ev.req, {ch: [1, len(msgs) + 1]
                                     for ch, msgs in self.channels.items()})
        if isinstance(ev, f.Position):
            return f.Result(ev.req, {"lag": {ch: 0 for ch in ev.positions}})
        if isinstance(ev, f.Read):
            self.reads.append(ev.channel)
            msgs = self.channels.get(ev.channel, [])
            items = [f.Delivery(0, ev.channel, seq, f"id-{seq}", data, False, None, 1,
                                time.time())
                     for seq, data in enumerate(msgs, 1) if seq >= ev.from_seq][:ev.limit]
            return f.ReadResult(ev.req, items, len(msgs) + 1, 1)
        if isinstance(ev, f.Admin):
            if ev.op == "channels.wait":
                await asyncio.sleep(0.2)
                return f.Result(ev.req, {"ready": False})
            return f.Result(ev.req, {})
        if isinstance(ev, f.Ping):
            return f.Pong(ev.req)
        return None
