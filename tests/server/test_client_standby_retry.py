"""A client told STANDBY while reconnecting tries again every ~0.25 s, not after its
growing backoff (up to 2 s, 3 s with jitter): a takeover is under way and serving
starts any moment (on Redis, each restart waits out the dead primary's lease as a
standby; the backoff missed the short windows before the next failure). Against a real
loopback socket that answers every HELLO as a standby does; no broker is needed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from minou.client.aio import Client
from minou.errors import ErrorCode
from minou.protocol import frames as f

pytestmark = pytest.mark.anyio


async def standby(answer_standby: bool) -> tuple[asyncio.AbstractServer, list[float]]:
    """A listener that answers each connection with STANDBY (or closes it: no broker),
    noting when each try came. A try whose plain connection is cut also opens a TLS
    probe (the client checks whether the port speaks TLS): a connection whose first
    byte is a TLS record's (0x16) is that probe, not a try."""
    seen: list[float] = []
    loop = asyncio.get_running_loop()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        came = loop.time()
        first = await reader.read(65536)  # the HELLO, or a TLS ClientHello
        if first[:1] != b"\x16":
            seen.append(came)
        if answer_standby:
            writer.write(f.encode(f.Error(0, int(ErrorCode.STANDBY),
                                          "this broker is a standby", {}, True)))
            await writer.drain()
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0), seen


@pytest.mark.parametrize("answer_standby", [True, False])
async def test_a_standby_answer_is_retried_soon_a_dead_port_after_backoff(
        answer_standby: bool) -> None:
    server, seen = await standby(answer_standby)
    port = server.sockets[0].getsockname()[1]
    client = Client([f"minou://127.0.0.1:{port}"], client_id="c", reconnect=True,
                    request_timeout=2.0)
    loop = asyncio.create_task(client._reconnect_loop())
    await asyncio.sleep(4.0)
    loop.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await loop
    await client.close()  # the try cut short by the cancel leaves no socket behind
    server.close()
    await server.wait_closed()
    tries = seen
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    if answer_standby:
        # every ~0.25 s (0.125..0.375 with jitter): ~15 tries in 4 s
        assert len(tries) >= 10, tries
        assert max(gaps) < 0.6, gaps
    else:
        # the backoff grows: 0.05, 0.1, 0.2 ... 2 s (times 0.5..1.5): far fewer tries,
        # and gaps of a second or more by the end
        assert len(tries) <= 9, tries
        assert max(gaps) > 0.6, gaps
