"""The HTTP protocol's fast path (server/http_fast.py) over a fake transport: raw
HTTP/1.1 bytes in, the response bytes out, as uvicorn tests its protocols."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from uvicorn.server import ServerState

from minou.errors import ErrorCode
from minou.server.http import http_config

from .conftest import WAIT_S, FakeTransport, Harness, wait_for

pytestmark = pytest.mark.anyio

CH = "orders/v1/1"
TOKEN = "t" * 32


def post(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: broker", "Content-Type: application/json",
            f"Content-Length: {len(body) if length is None else length}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class HttpPeer:
    """One HTTP connection to the broker's protocol, driven by hand."""

    def __init__(self, broker: Harness) -> None:
        # The listener's own configuration, minus the listener (and the process's logging).
        config = http_config(broker.server, log_config=None)
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


async def test_a_publish_is_answered_201_once_committed(broker: Harness, http) -> None:
    peer = http(broker)
    assert broker.server.admission.stats()["open"]["http"] == 1
    broker.storage.hold()
    peer.send(post(f"/v1/messages/{CH}?priority=3", b'{"total": 12.5}',
                   "X-Minou-Header-Trace: abc"))
    await broker.storage.writer_held()
    assert peer.transport.data == b""  # nothing is answered before the commit
    broker.storage.release()

    status, headers, body = await peer.response()
    assert status == 201
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"  # the security headers
    assert "connection" not in headers  # kept alive
    assert body == {"channel": CH, "seq": 1, "id": body["id"], "duplicate": False,
                    "fanout": 1}
    [stored] = broker.storage.stored(CH)
    assert (stored.id, stored.data, stored.priority, stored.headers) == \
        (body["id"], b'{"total": 12.5}', 3, {"trace": "abc"})
    assert peer.transport.writes == 1  # head and body in one write

    peer.send(post(f"/v1/messages/{CH}", b'{"total": 2}'))  # the same connection goes on
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 2)


async def test_pipelined_publishes_are_answered_in_order(broker: Harness, http) -> None:
    peer = http(broker)
    peer.send(post(f"/v1/messages/{CH}", b'{"n": 1}') + post(f"/v1/messages/{CH}", b'{"n": 2}'))
    first, second = await peer.response(), await peer.response()
    assert [(first[0], first[2]["seq"]), (second[0], second[2]["seq"])] == [(201, 1), (201, 2)]


async def test_a_body_over_the_message_limit_is_refused_413_before_it_all_arrives(
        make_server, http) -> None:
    broker = await make_server(max_message_size=100)
    peer = http(broker)
    # 1000 bytes announced, 150 sent: past the limit already.
    peer.send(post(f"/v1/messages/{CH}", b"x" * 150, length=1000))
    status, headers, body = await peer.response()
    assert status == 413
    assert headers["connection"] == "close"
    assert body["error"]["code"] == ErrorCode.MESSAGE_TOO_LARGE
    assert body["error"]["reason"] == "message_too_large"
    assert body["error"]["detail"] == {"limit": 100}
    # The rest of the body is read and dropped while the connection lingers.
    assert peer.protocol.closing and not peer.transport.closed
    peer.send(b"x" * 850 + post(f"/v1/messages/{CH}", b"{}"))
    assert peer.responses() == []
    assert broker.storage.stored(CH) == [] and CH not in broker.server.core.channels
    assert broker.server.core.counters.as_dict()["refused"]["message_too_large"] == 1


async def test_a_body_at_the_limit_is_published(make_server, http) -> None:
    broker = await make_server(max_message_size=100)
    peer = http(broker)
    payload = b'"' + b"x" * 98 + b'"'
    peer.send(post(f"/v1/messages/{CH}", payload))
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 1)


async def test_a_batch_publish_answers_one_outcome_per_message(broker: Harness, http) -> None:
    peer = http(broker)
    batch = [{"channel": CH, "payload": {"n": 1}}, {"channel": "bad", "payload": 2}]
    peer.send(post("/v1/messages", json.dumps(batch).encode()))
    status, _, body = await peer.response()
    assert status == 200
    ok, refused = body["results"]
    assert (ok["channel"], ok["seq"]) == (CH, 1)
    assert refused["error"]["code"] == ErrorCode.INVALID_CHANNEL


async def test_a_publish_without_a_bearer_is_refused_401(make_server, http) -> None:
    broker = await make_server(auth_mode="token", broker_token=TOKEN)
    peer = http(broker)
    peer.send(post(f"/v1/messages/{CH}", b"{}"))
    status, headers, body = await peer.response()
    assert status == 401
    assert headers["www-authenticate"] == 'Bearer realm="minou"'
    assert body["error"]["detail"]["why"] == "no_token"

    peer.send(post(f"/v1/messages/{CH}", b"{}", f"Authorization: Bearer {TOKEN}"))
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 1)
