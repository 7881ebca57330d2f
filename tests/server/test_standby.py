"""The standby's door over real loopback sockets: it relays each connection to the
primary byte for byte, and says where the primary is when it cannot (relaying off or
full, the primary out of reach, a TLS primary that is not the one Redis named)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from minou.errors import ErrorCode
from minou.protocol import frames as f
from minou.server.standby import StandbyDoor
from minou.tls import ensure_self_signed, server_context

pytestmark = pytest.mark.anyio


class Primary:
    """A stand-in for the primary's port: it answers every chunk with ``ok:`` + it."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def close(self) -> None:
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def start(self, tls: Any = None) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            self.writers.append(writer)
            while data := await reader.read(65536):
                writer.write(b"ok:" + data)
                await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        port = self.server.sockets[0].getsockname()[1]
        return f"{'minous' if tls else 'minou'}://127.0.0.1:{port}"


def listener() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


class Door:
    """A standby door on a loopback listener, and what the test opened through it."""

    def __init__(self, relay: bool = True) -> None:
        self.native = listener()
        self.door = StandbyDoor(None, relay=relay, max_relays=2)
        self.primary = Primary()
        self._writers: list[asyncio.StreamWriter] = []

    async def dial(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(*self.native.getsockname()[:2])
        self._writers.append(writer)
        return reader, writer

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        await self.door.close()
        await self.primary.close()
        self.native.close()
        await asyncio.sleep(0.05)  # let the closed transports go


@pytest.fixture
async def d() -> AsyncIterator[Door]:
    door = Door()
    await door.door.start(door.native, None, None)
    yield door
    await door.close()


async def standby_error(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                        ) -> f.Error:
    writer.write(b"\x00\x00\x00\x01\x01")  # anything: the door answers the first bytes
    data = await asyncio.wait_for(reader.read(65536), 5)
    frame = f.decode_body(data[4], data[5:])
    assert isinstance(frame, f.Error)
    return frame


async def test_a_connection_is_relayed_to_the_primary_both_ways(d: Door) -> None:
    door, primary = d.door, d.primary
    door.holder = {"id": "p1", "native": await primary.start()}
    reader, writer = await d.dial()
    writer.write(b"hello")
    assert await asyncio.wait_for(reader.readexactly(8), 5) == b"ok:hello"
    assert (door.relaying, door.relayed, primary.connections) == (1, 1, 1)
    writer.close()
    await asyncio.sleep(0.1)
    assert door.relaying == 0  # the client went: so did its connection to the primary


async def test_past_max_relays_the_client_is_told_where_the_primary_is(d: Door) -> None:
    door = d.door
    door.holder = {"id": "p1", "native": await d.primary.start()}
    held = [await d.dial() for _ in range(2)]
    for reader, writer in held:
        writer.write(b"x")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ok:x"
    error = await standby_error(*await d.dial())
    assert error.code == ErrorCode.STANDBY and error.fatal
    assert error.detail == {"primary": door.holder["native"]}
    assert (door.relaying, door.refused) == (2, 1)


async def until(condition: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the door never got there")


async def test_a_door_holding_all_its_sockets_refuses_the_next_client_at_once(d: Door) -> None:
    """Idle sockets flooding a standby: two relays hold four sockets, two clients told
    where the primary is (still silent) two more; a door of six refuses the seventh
    at once with TOO_MANY_CONNECTIONS and closes it, and takes clients again once
    some leave."""
    door = d.door
    door.max_held = 6
    door.holder = {"id": "p1", "native": await d.primary.start()}
    relayed = [await d.dial() for _ in range(2)]
    for reader, writer in relayed:
        writer.write(b"x")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ok:x"
    silent = [await d.dial() for _ in range(2)]  # past max_relays: the door waits for them
    await until(lambda: door._held() == 6)
    reader, _ = await d.dial()
    data = await asyncio.wait_for(reader.read(65536), 5)  # at once, unasked
    error = f.decode_body(data[4], data[5:])
    assert isinstance(error, f.Error) and error.fatal
    assert error.code == ErrorCode.TOO_MANY_CONNECTIONS and error.detail == {"limit": 6}
    assert await asyncio.wait_for(reader.read(1), 5) == b""  # and closed
    assert (door.full, door.relaying, door.refused) == (1, 2, 0)
    for _, writer in relayed + silent:
        writer.close()
    await until(lambda: door._held() == 0)
    reader, writer = await d.dial()
    writer.write(b"y")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ok:y"
    assert door.full == 1


async def test_a_primary_out_of_reach_makes_the_door_say_where_it_is(d: Door) -> None:
    door = d.door
    gone = listener()
    url = f"minou://127.0.0.1:{gone.getsockname()[1]}"
    gone.close()  # nobody listens there now
    door.holder = {"id": "p1", "native": url}
    error = await standby_error(*await d.dial())
    assert error.code == ErrorCode.STANDBY and error.detail == {"primary": url}
    assert door.relay_failures == 1 and door.relayed == 0


async def test_a_tls_primary_whose_certificate_is_not_the_published_one_is_not_relayed_to(
        d: Door, tmp_path: Path) -> None:
    door = d.door
    real = ensure_self_signed(tmp_path / "real", hosts=["127.0.0.1"])
    other = ensure_self_signed(tmp_path / "other", hosts=["127.0.0.1"])
    url = await d.primary.start(tls=server_context(real))
    door.holder = {"id": "p1", "native": url, "tls_fingerprint": other.fingerprint}
    error = await standby_error(*await d.dial())
    assert error.code == ErrorCode.STANDBY
    assert door.relay_failures == 1 and door.relayed == 0
    door.holder["tls_fingerprint"] = real.fingerprint  # the one Redis names: relayed
    reader, writer = await d.dial()
    writer.write(b"secret")
    assert await asyncio.wait_for(reader.readexactly(9), 5) == b"ok:secret"


async def test_a_new_primary_closes_the_connections_relayed_to_the_old_one(d: Door) -> None:
    door = d.door
    door.holder = {"id": "p1", "native": await d.primary.start()}
    reader, writer = await d.dial()
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ok:x"
    door.primary_changed({"id": "p2", "native": door.holder["native"]})
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed: the client reconnects
    await asyncio.sleep(0.1)
    assert door.relaying == 0


async def test_with_relaying_off_the_door_redirects() -> None:
    d = Door(relay=False)
    await d.door.start(d.native, None, None)
    try:
        d.door.holder = {"id": "p1", "native": await d.primary.start()}
        error = await standby_error(*await d.dial())
        assert error.code == ErrorCode.STANDBY and d.primary.connections == 0
    finally:
        await d.close()


async def test_a_primary_at_this_doors_own_address_is_not_relayed_to(d: Door) -> None:
    """A broker restarted on its old port (kill -9, then systemd) is a standby until
    its dead self's lease runs out, and Redis still names its own address as the
    primary's. Relaying there dialled the door itself, hop after hop up to max_relays,
    and clients waited in the loop; now the door sees its own connection come back,
    relays no more to that address, and tells the client to try again later."""
    door = d.door
    door.max_relays = 50
    own = f"minou://127.0.0.1:{d.native.getsockname()[1]}"
    door.holder = {"id": "dead-self", "native": own}
    error = await standby_error(*await d.dial())
    assert error.code == ErrorCode.STANDBY and error.fatal
    assert "primary" not in error.detail  # not "connect there": there is here
    assert "own address" in error.message
    assert door.relayed <= 1  # one hop at most, never a chain
    await until(lambda: door.relaying == 0)
    relayed = door.relayed
    error = await standby_error(*await d.dial())  # the next client: told at once
    assert error.code == ErrorCode.STANDBY and door.relayed == relayed
    # A real primary elsewhere: relayed again.
    door.primary_changed({"id": "p2", "native": await d.primary.start()})
    reader, writer = await d.dial()
    writer.write(b"x")
    assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ok:x"
