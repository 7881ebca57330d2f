"""The real server code over fake transports, in this process (uvicorn's and h11's
way of testing a protocol): no client library, no subprocess.

``make_server(**settings)`` starts a ``BrokerServer`` on a ``MemoryStorage`` (a
``GatedStorage``: a test can hold its writer inside ``apply`` to see what waits for
a commit). ``BrokerServer.open`` opens storage and restores without binding any
socket; every connection here is a ``_TcpProtocol`` over a ``FakeTransport``: bytes
go in through ``data_received``, and what the broker wrote is read back from the
transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from uvicorn.server import ServerState

from minou.config import Settings
from minou.core.writes import WriteBatch
from minou.protocol import frames as f
from minou.protocol.reader import BadFrame, FrameReader
from minou.server.app import BrokerServer, _TcpProtocol
from minou.server.http import http_config
from minou.storage.memory import MemoryStorage

WAIT_S = 5.0  # bound of every wait: a hang fails the test, it never stalls the run
_stores = itertools.count(1)
_ports = itertools.count(40_000)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class GatedStorage(MemoryStorage):
    """MemoryStorage whose writer can be held inside ``apply`` (before anything is
    written) until ``release()``: what the broker sends meanwhile did not wait for
    the commit."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # the writer is held in apply
        self.applied = 0

    def hold(self) -> None:
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def apply(self, batch: WriteBatch) -> None:
        if not self.gate.is_set():
            self.entered.set()
            if not self.gate.wait(WAIT_S * 2):
                raise AssertionError("the test never released the writer")
        super().apply(batch)
        self.applied += 1

    async def writer_held(self) -> None:
        """Wait (bounded) until the writer thread is inside a held ``apply``."""
        held = await asyncio.to_thread(self.entered.wait, WAIT_S)
        assert held, "no commit reached the storage"

    def stored(self, channel: str) -> list[Any]:
        return self.read_range(channel, 1, 1 << 40, 1000)


class FakeTransport:
    """What an asyncio transport offers a protocol, recording everything. Closing it
    tells the protocol, on the next loop turn, as asyncio does."""

    def __init__(self, peername: tuple[str, int]) -> None:
        self.peername = peername
        self.protocol: Any = None
        self.data = bytearray()
        self.writes = 0
        self.events: list[str] = []  # pause_reading, resume_reading, close, abort
        self.reading = True
        self.closed = False
        self.buffered = 0  # what get_write_buffer_size reports
        self.write_limits: tuple[int, int] | None = None
        self.wrote = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.data += data
        self.writes += 1
        self.wrote.set()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.peername, "sockname": ("127.0.0.1", 7700)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.write_limits = (high or 0, low or 0)

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading = False
        self.events.append("pause_reading")

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True
        self.events.append("resume_reading")

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.events.append("write_eof")

    def close(self) -> None:
        self._end("close")

    def abort(self) -> None:
        self._end("abort")

    def _end(self, how: str) -> None:
        self.events.append(how)
        if not self.closed:
            self.closed = True
            self.wrote.set()
            if self.protocol is not None:
                asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


class Peer:
    """One native connection driven by hand: ``send`` frames or bytes, ``expect``
    what the broker answered."""

    def __init__(self, server: BrokerServer, transport: FakeTransport) -> None:
        self.server = server
        self.transport = transport
        self.protocol = _TcpProtocol(server)
        transport.protocol = self.protocol
        self.protocol.connection_made(transport)  # type: ignore[arg-type]
        self.reader = FrameReader(max_frame_size=1 << 30)
        self._read = 0
        self.received: list[f.Frame] = []  # decoded, not yet taken by expect()

    @property
    def conn(self) -> Any:
        return self.protocol.conn

    def send(self, *frames: f.Frame) -> None:
        self.send_bytes(b"".join(f.encode(frame) for frame in frames))

    def send_bytes(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def frames(self) -> list[f.Frame]:
        """Every frame written since the last call (or expect)."""
        self._decode()
        out, self.received = self.received, []
        return out

    def _decode(self) -> None:
        new = bytes(self.transport.data[self._read:])
        self._read += len(new)
        self.reader.receive_data(new)
        for event in self.reader.events():
            assert not isinstance(event, BadFrame), event
            self.received.append(event)

    async def expect(self, kind: type[f.Frame], timeout: float = WAIT_S) -> Any:
        """The next frame of type ``kind`` (frames before it are kept for later)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            self._decode()
            for i, frame in enumerate(self.received):
                if isinstance(frame, kind):
                    del self.received[i]
                    return frame
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0 or self.transport.closed:
                raise AssertionError(f"no {kind.__name__} within {timeout} s; "
                                     f"got {self.received}, closed={self.transport.closed}")
            self.transport.wrote.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.transport.wrote.wait(), left)

    async def hello(self, client_id: str = "peer", **kw: Any) -> f.Welcome:
        self.send(f.Hello(client_id, **kw))
        welcome = await self.expect(f.Welcome)
        assert welcome.client_id == client_id
        return welcome

    async def closed(self) -> None:
        """The broker closed the connection and the protocol was told."""
        await wait_for(lambda: self.transport.closed and self.conn.closed,
                       "the connection to close")
        await asyncio.sleep(0)  # connection_lost runs on the next turn


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Yield to the loop until ``predicate()``; fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.001)


class Harness:
    """A started BrokerServer and the peers connected to it."""

    def __init__(self, server: BrokerServer, storage: GatedStorage) -> None:
        self.server = server
        self.storage = storage
        self.peers: list[Peer] = []

    async def connect(self, client_id: str | None = "peer") -> Peer:
        """A new connection, through the TCP adapter; with ``client_id``, welcomed."""
        peer = Peer(self.server, FakeTransport(("127.0.0.1", next(_ports))))
        self.peers.append(peer)
        if client_id is not None:
            await peer.hello(client_id)
        return peer


@pytest.fixture
async def make_server(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    started: list[Harness] = []
    thresholds = gc.get_threshold()

    async def make(**settings: Any) -> Harness:
        storage = GatedStorage(f"server-test-{next(_stores)}")
        values = {"host": "127.0.0.1", "port": 0, "http_port": None, "auth_mode": "off",
                  "data_dir": str(tmp_path / f"data{len(started)}"), **settings}
        server = BrokerServer(Settings(**values), storage=storage)
        await server.open()  # storage and restore, no listening socket: fake transports
        harness = Harness(server, storage)
        started.append(harness)
        return harness

    yield make
    for harness in started:
        harness.storage.release()
        await harness.server.stop()
        MemoryStorage.forget(harness.storage.name)
    gc.set_threshold(*thresholds)  # in case a test calls start(), which tunes the GC


@pytest.fixture
async def broker(make_server: Callable[..., Awaitable[Harness]]) -> Harness:
    return await make_server()


# ------------------------------------------------------------------- HTTP
def post(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: broker", "Content-Type: application/json",
            f"Content-Length: {len(body) if length is None else length}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class HttpPeer:
    """One HTTP connection to the broker's protocol, driven by hand."""

    def __init__(self, broker: Harness) -> None:
        # The listener's own configuration, minus the listener.
        config = http_config(broker.server)
        self.protocol = config.http(config=config, server_state=ServerState(), app_state={})
        self.transport = FakeTransport(("127.0.0.1", 50_001))
        self.transport.protocol = self.protocol
        self.protocol.connection_made(self.transport)
        self._read = 0

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def _complete(self) -> tuple[int, dict[str, str], bytes] | None:
        data = bytes(self.transport.data[self._read:])
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            return None
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            return None
        self._read += len(head) + len(sep) + length
        assert status_line.startswith("HTTP/1.1 "), status_line
        return int(status_line.split()[1]), headers, rest[:length]

    def responses(self) -> list[tuple[int, dict[str, str], bytes]]:
        out = []
        while (response := self._complete()) is not None:
            out.append(response)
        return out

    async def response(self) -> tuple[int, dict[str, str], Any]:
        """The next complete response; its body decoded from JSON."""
        found: list[tuple[int, dict[str, str], bytes]] = []

        def complete() -> bool:
            response = self._complete()
            if response is not None:
                found.append(response)
            return bool(found)

        await wait_for(complete, "an HTTP response", WAIT_S)
        status, headers, body = found[0]
        return status, headers, json.loads(body) if body else None


@pytest.fixture
async def http() -> AsyncIterator[Callable[[Harness], HttpPeer]]:
    peers: list[HttpPeer] = []

    def connect(broker: Harness) -> HttpPeer:
        peer = HttpPeer(broker)
        peers.append(peer)
        return peer

    yield connect
    for peer in peers:
        peer.transport.close()  # the protocol cancels its timers in connection_lost
    await wait_for(lambda: all(not p.protocol.connections for p in peers),
                   "the HTTP connections to be lost")
