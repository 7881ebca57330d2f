"""Unfinished frames are bounded once a client is authenticated (server/input_budget.py).

Before: one authenticated client could open connection after connection and park most
of a 16 MB frame in each, held for good (10 sockets: RSS 62 -> 215 MiB; max_connections
of them, 160 GB). Now a frame over 64 KiB is read only with room reserved for it, a
client has a quarter of the broker's budget, and a reserved frame must keep arriving.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
import time

import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed as WsClosed
from websockets.exceptions import InvalidStatus

import minou
from minou.errors import ErrorCode
from minou.limits import INPUT_BUDGET_BYTES, INPUT_CLIENT_SHARE, INPUT_GRACE_S, INPUT_MIN_RATE
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import RawPeer, signed_hello, wait_until
from .test_http_api import bearer
from .test_http_limits import Http

FRAME = 16_000_000  # declared length of each parked frame (the frame limit is 16 MiB)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def unfinished(client: minou.SyncClient) -> dict[str, int]:
    return client.admin("status")["unfinished_input"]


def publish_frame(channel: str, size: int) -> bytes:
    """A whole publish frame of one JSON string message, ``size`` bytes declared."""
    pad = size
    while True:  # the payload's msgpack length prefix grows with it
        frame = f.encode(f.Publish(1, [f.Send(channel, b'"' + b"x" * pad + b'"')]))
        if len(frame) - 4 == size:
            return frame
        pad += size - (len(frame) - 4)


def park(peer: RawPeer, frame: bytes, keep: int) -> None:
    """Send all of ``frame`` but its last ``keep`` bytes (until the socket is closed)."""
    peer.sock.settimeout(60)
    with contextlib.suppress(OSError):
        peer.write(frame[:-keep])


@pytest.fixture
def peers(broker):
    made: list[RawPeer] = []

    def make(client_id: str) -> RawPeer:
        p = RawPeer(broker.url)
        made.append(p)
        p.hello(client_id)
        return p

    yield make
    for p in made:
        p.close()


def test_one_client_parking_large_frames_holds_a_quarter_of_the_budget_at_most(broker, peers):
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    frame = publish_frame("parked/v1/1", FRAME)
    assert len(frame) == FRAME + 4
    share = INPUT_BUDGET_BYTES // INPUT_CLIENT_SHARE
    fits = share // FRAME  # 4 frames of 16 MB in a 64 MiB share
    before = rss_bytes(broker.proc.pid)
    parked = [peers("hog") for _ in range(fits + 6)]
    senders = []
    for peer in parked:
        # Sent from threads: a connection waiting for room reads nothing, so its
        # sendall blocks once the socket buffers are full.
        t = threading.Thread(target=park, args=(peer, frame, 1000), daemon=True)
        t.start()
        senders.append(t)
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == fits * FRAME
               and unfinished(admin)["waiting"] == 6, timeout=30,
               what="the client's share reserved, the other connections waiting")
    time.sleep(1)  # what the waiting sockets could still push in would be in by now
    grown = rss_bytes(broker.proc.pid) - before
    # 10 connections held 150 MB before; now the share (64 MB) and a read buffer each.
    assert grown < fits * FRAME + 40_000_000, grown
    # Another client is not held back by the first one's share.
    other = peers("neighbour")
    other.write(publish_frame("parked/v1/2", 1_000_000))
    confirm = other.read()
    assert isinstance(confirm, f.Confirm) and [o.code for o in confirm.outcomes] == [0]
    # A parked frame completed frees its room: a waiting connection reads its own.
    first = parked[0]
    first.write(frame[-1000:])
    confirm = first.read()  # read whole and answered (one message over 1 MiB: refused)
    assert isinstance(confirm, f.Confirm) and len(confirm.outcomes) == 1
    wait_until(lambda: unfinished(admin)["waiting"] == 5, timeout=10,
               what="a waiting connection granted the freed room")
    # Parked connections that go free their room for the rest.
    for peer in parked[1:fits]:
        peer.close()
    wait_until(lambda: unfinished(admin)["waiting"] == 2, timeout=10,
               what="room freed by closed connections granted in turn")
    assert broker.alive
    assert "waits to read a 16000000-byte frame" in broker.output
    admin.close()


def post_head(token: dict[str, str], size: int, path: str = "/v1/messages") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            f"Authorization: {token['Authorization']}\r\n"
            f"Content-Length: {size}\r\n\r\n").encode()


def test_http_bodies_share_the_budget_and_are_refused_when_it_is_taken(broker):
    """An HTTP request with a large body is read only with room reserved: past its
    client's share, a 503 input_busy with Retry-After at its headers (its body is not
    held); another client is served, and a body that completes frees its room."""
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    token = bearer(broker, "http-hog")
    size = 16_000_000
    body = b"x" * (size - 1000)
    share = INPUT_BUDGET_BYTES // INPUT_CLIENT_SHARE
    held = []
    for _ in range(share // size):
        conn = Http(broker)
        conn.sock.sendall(post_head(token, size) + body)
        held.append(conn)
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == len(held) * size, timeout=20,
               what="the client's share reserved by its bodies")
    refused = Http(broker)
    refused.sock.sendall(post_head(token, size) + b"x" * 1000)
    status, headers, answer = refused.response()
    assert status == 503 and headers["retry-after"] == "1", (status, answer)
    error = json.loads(answer)["error"]
    assert error["reason"] == "input_busy", error
    assert "try again" in error["message"]
    assert refused.closed_by_peer()
    # Another client's large body is taken meanwhile.
    other = Http(broker)
    batch = json.dumps([{"channel": "parked/v1/5", "payload": "y" * 500_000}]).encode()
    other.sock.sendall(post_head(bearer(broker, "http-neighbour"), len(batch)) + batch)
    status, _, answer = other.response()
    assert status == 200, answer
    # A body that completes frees its room (answered: over the message limit, 413).
    held[0].sock.sendall(b"x" * 1000)
    status, _, _ = held[0].response()
    assert status == 400, status  # read whole: not JSON
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == (len(held) - 1) * size,
               timeout=10, what="the completed body's room freed")
    for conn in held[1:]:
        conn.sock.close()
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == 0, timeout=10,
               what="closed connections' room freed")
    assert admin.admin("status")["counters"]["refused"]["input_busy"] == 1
    admin.close()
    for conn in (held[0], refused, other):
        conn.sock.close()


def test_a_large_frame_or_body_that_stops_arriving_is_cut(broker, peers):
    """A reserved frame (or HTTP body) must arrive at INPUT_MIN_RATE after INPUT_GRACE_S:
    a sender that stops holds its room only that long, then gets a precise error and the
    close."""
    size = 100_000
    allowed = INPUT_GRACE_S + size / INPUT_MIN_RATE
    peer = peers("staller")
    http = Http(broker)
    frame = publish_frame("parked/v1/3", size)
    started = time.monotonic()
    peer.write(frame[:-10])
    http.sock.sendall(post_head(bearer(broker, "http-staller"), size) + b"[" * 5000)
    peer.sock.settimeout(allowed + 10)
    err = peer.read()
    took = time.monotonic() - started
    assert isinstance(err, f.Error) and err.fatal, err
    assert err.code == ErrorCode.REQUEST_TIMEOUT
    assert f"a frame of {size} bytes did not arrive within {allowed:.0f} s" in err.message
    assert allowed - 1 <= took <= allowed + 5, took
    assert peer.closed_by_peer()
    http.sock.settimeout(10)
    status, _, answer = http.response()
    assert status == 408, answer
    assert f"a request body of {size} bytes did not arrive within {allowed:.0f} s" in \
        json.loads(answer)["error"]["message"]
    assert http.closed_by_peer()
    http.sock.close()
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    assert unfinished(admin)["reserved_bytes"] == 0
    assert unfinished(admin)["cut"] == 2
    assert admin.admin("status")["counters"]["refused"]["request_timeout"] == 2
    admin.close()
    assert "not complete within" in broker.output


def test_a_slow_but_steady_large_frame_is_taken(broker, peers):
    """Arriving in pieces, well above the minimum rate, a large frame is read whole."""
    peer = peers("trickler")
    frame = publish_frame("parked/v1/4", 600_000)
    for i in range(0, len(frame), 100_000):
        peer.write(frame[i:i + 100_000])
        time.sleep(0.2)
    confirm = peer.read()
    assert isinstance(confirm, f.Confirm) and [o.code for o in confirm.outcomes] == [0]



def park_ws_message(ws: object, size: int, sent: int) -> None:
    """Begin a binary WebSocket message of ``size`` bytes and send ``sent`` of them (a
    client frame, masked with a zero key: the payload goes as is)."""
    head = bytes([0x82, 0x80 | 127]) + struct.pack(">Q", size) + b"\0\0\0\0"
    sock = ws.socket  # type: ignore[attr-defined]
    sock.settimeout(60)
    with contextlib.suppress(OSError):
        sock.sendall(head + b"\0" * sent)


def test_websocket_messages_share_the_budget(broker):
    """/v1/ws: an authenticated client's messages still arriving grow their room a MiB at
    a time; past the client's share, the socket is closed with 1013 (try again later)."""
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    url = broker.http.replace("http://", "ws://") + "/v1/ws"
    sockets = []
    stack = contextlib.ExitStack()
    for _ in range(6):
        ws = stack.enter_context(wsc.connect(url, max_size=None, close_timeout=0.5))
        ws.send(f.encode(signed_hello("ws-hog")))
        reader = FrameReader()
        reader.receive_data(ws.recv(timeout=5))
        assert isinstance(reader.next_event(), f.Welcome)
        sockets.append(ws)
    threads = [threading.Thread(target=park_ws_message, args=(ws, 16_000_000, 15_000_000),
                                daemon=True) for ws in sockets]
    for t in threads:
        t.start()
    share = INPUT_BUDGET_BYTES // INPUT_CLIENT_SHARE
    wait_until(lambda: admin.admin("status")["counters"]["refused"].get("input_busy", 0) >= 2,
               timeout=30, what="the sockets past the client's share closed")
    assert unfinished(admin)["reserved_bytes"] <= share
    closed = []
    for ws in sockets:
        try:
            ws.recv(timeout=0.5)
        except WsClosed as exc:
            closed.append(exc.rcvd.code if exc.rcvd is not None else None)
        except TimeoutError:
            pass
    assert closed and set(closed) == {1013}, closed
    stack.close()
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == 0, timeout=10,
               what="closed sockets' room freed")
    admin.close()


def test_redis_protocol_commands_share_the_budget(broker_factory):
    """The Redis door: an authenticated client's commands still arriving hold room a MiB at
    a time; past the client's share, an error and the close (clients reconnect)."""
    from .test_resp import token

    broker = broker_factory.make(resp_port=0).start()
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    password = token(broker, "resp-hog").encode()
    auth = b"*3\r\n$4\r\nAUTH\r\n$8\r\nresp-hog\r\n$%d\r\n%s\r\n" % (len(password), password)
    bulk = 1_000_000  # within the message size: a command holds up to two of them
    part = (b"*5\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nd\r\n$%d\r\n" % bulk
            + b"x" * (bulk - 10))
    share = INPUT_BUDGET_BYTES // INPUT_CLIENT_SHARE
    socks = []
    answers = []
    try:
        for _ in range(share // (1 << 20) + 8):
            s = socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10)
            socks.append(s)
            s.sendall(auth)
            assert s.recv(100) == b"+OK\r\n"
            s.sendall(part)
        wait_until(lambda: unfinished(admin)["reserved_bytes"] >= share - (2 << 20),
                   timeout=30, what="the client's share reserved")
        deadline = time.monotonic() + 2
        waiting = list(socks)
        while waiting and time.monotonic() < deadline:
            ready, _, _ = select.select(waiting, [], [], 0.2)
            for s in ready:
                answers.append(s.recv(200))
                waiting.remove(s)
        busy = [a for a in answers if a.startswith(b"-ERR input busy")]
        assert len(busy) >= 8, answers
        assert unfinished(admin)["reserved_bytes"] <= share
        assert admin.admin("status")["counters"]["refused"]["input_busy"] == len(busy)
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: unfinished(admin)["reserved_bytes"] == 0, timeout=10,
               what="closed sockets' room freed")
    admin.close()


def test_one_client_holds_at_most_its_share_of_connections(broker_factory, tmp_path):
    """max_connections_per_client: past it, the client's next native, /v1/stream or Redis
    protocol login is refused TOO_MANY_CONNECTIONS naming the client; others (admins
    too) connect as before, and a connection that goes frees its place."""
    from .test_http_api import bearer
    from .test_resp import token

    cfg = tmp_path / "per-client.toml"
    cfg.write_text("max_connections_per_client = 3\n")
    broker = broker_factory.make(config=cfg, resp_port=0).start()
    headers = bearer(broker, "greedy")  # each registers the key with a connection of its own
    password = token(broker, "greedy").encode()
    peers = [RawPeer(broker.url) for _ in range(3)]
    for peer in peers:
        peer.hello("greedy")
    extra = RawPeer(broker.url)
    extra.write(f.encode(signed_hello("greedy")))
    err = extra.read()
    assert isinstance(err, f.Error) and err.fatal
    assert err.code == ErrorCode.TOO_MANY_CONNECTIONS
    assert "client 'greedy' already has 3 connections" in err.message
    assert err.detail["limit"] == 3 and err.detail["client"] == "greedy"
    assert extra.closed_by_peer()
    extra.close()
    stream_url = broker.http.replace("http://", "ws://") + "/v1/stream"
    with pytest.raises(InvalidStatus):  # refused at the upgrade  # noqa: SIM117
        with wsc.connect(stream_url, additional_headers=headers):
            pass
    with socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10) as s:
        s.sendall(b"*3\r\n$4\r\nAUTH\r\n$6\r\ngreedy\r\n$%d\r\n%s\r\n" % (len(password),
                                                                          password))
        answer = s.recv(300)
        assert answer.startswith(b"-ERR TOO_MANY_CONNECTIONS client 'greedy'"), answer
        s.sendall(b"*1\r\n$4\r\nPING\r\n")  # not logged in
        assert s.recv(100).startswith(b"-NOAUTH"), answer
    other = minou.connect_sync(broker.url, **broker.auth("modest"))
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    status = admin.admin("status")
    assert status["admission"]["refused"]["client"] == 3
    assert status["admission"]["busiest_client"] == 3
    peers[0].close()
    wait_until(lambda: admin.admin("status")["admission"]["busiest_client"] == 2,
               what="the closed connection's place freed")
    again = RawPeer(broker.url)
    again.hello("greedy")
    for peer in [*peers[1:], again]:
        peer.close()
    other.close()
    admin.close()
    assert "max_connections_per_client = 3" in broker.output
