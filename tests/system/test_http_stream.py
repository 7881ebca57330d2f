"""The JSON stream (/v1/stream) and the native frames over WebSocket (/v1/ws) under
the same rules as TCP connections: reloads and revocations reach them, a reader that
stops reading is cut (not buffered without end), bad input gets a precise error."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

import httpx
import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed

from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import wait_until
from .test_http_api import admin_bearer, bearer

RULES = """
slow_consumer_bytes = 2097152

[[rules]]
client = "app-*"
read = ["orders/*", "big/*"]
write = ["orders/*", "big/*"]
"""


@pytest.fixture
def stream_broker(broker_factory, tmp_path):
    cfg = tmp_path / "stream.toml"
    cfg.write_text(RULES)
    broker = broker_factory.make(config=cfg).start()
    broker.config_text = RULES  # type: ignore[attr-defined]
    return broker


def stream(broker, headers: dict[str, str]) -> Any:
    return wsc.connect(broker.http.replace("http://", "ws://") + "/v1/stream",
                       additional_headers=headers, max_size=None)


def receive(ws: Any, kind: str, timeout: float = 5) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(ws.recv(max(0.01, deadline - time.monotonic())))
        if message["type"] == kind:
            return message


def raw_websocket(http_url: str, path: str, headers: dict[str, str]) -> socket.socket:
    """A WebSocket that never reads (a small receive buffer, and nobody calls recv)."""
    host, port = http_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked client frame (1 = text, 2 = binary)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_reload_and_revoke_reach_streams(stream_broker, tmp_path):
    h = bearer(stream_broker, "app-reload")
    admin = admin_bearer(stream_broker)
    with stream(stream_broker, h) as ws, httpx.Client(base_url=stream_broker.http,
                                                      timeout=10) as http:
        ws.send(json.dumps({"op": "consume", "pattern": "orders/v1/*", "group": "r"}))
        receive(ws, "subscribed")
        (tmp_path / "stream.toml").write_text(RULES.replace(
            'read = ["orders/*", "big/*"]', 'read = ["big/*"]'))
        closed = http.post("/v1/admin/reload", headers=admin).json()["subscriptions_closed"]
        assert [c["client_id"] for c in closed] == ["app-reload"]
        error = receive(ws, "error")
        assert "ended by a reload" in error["message"] and error["sid"] == 1
        http.post("/v1/messages/orders/v1/1", json={"x": 1}, headers=admin)
        ws.send(json.dumps({"op": "publish", "channel": "orders/v1/2", "payload": 1}))
        assert receive(ws, "published")["seq"] == 1  # writing is still allowed
        # A revocation ends the stream itself.
        assert http.post("/v1/clients/app-reload/revoke", headers=admin).status_code == 200
        error = receive(ws, "error")
        assert error["reason"] == "not_authenticated"
        with pytest.raises(ConnectionClosed):  # by the broker
            while True:
                ws.recv(5)


def test_a_stream_that_does_not_read_is_cut_and_its_deliveries_return(stream_broker):
    h = bearer(stream_broker, "app-slow")
    admin = admin_bearer(stream_broker)
    with httpx.Client(base_url=stream_broker.http, timeout=30) as http:
        for i in range(20):
            assert http.post("/v1/messages/big/v1/1", json={"i": i, "pad": "x" * 400_000},
                             headers=h).status_code == 201
        sock = raw_websocket(stream_broker.http, "/v1/stream", h)
        try:
            sock.sendall(ws_frame(json.dumps({"op": "consume", "pattern": "big/v1/*",
                                              "group": "slow", "prefetch": 1000}).encode()))
            # 8 MB of deliveries against a 2 MiB limit: cut, not buffered.
            wait_until(lambda: http.get("/v1/status", headers=admin).json()
                       ["flow"]["slow_consumers_cut"] == 1, 10, what="the cut")
        finally:
            sock.close()
        # Its deliveries went back to the group: a reader that reads gets all 20.
        got = set()
        with stream(stream_broker, h) as ws:
            ws.send(json.dumps({"op": "consume", "pattern": "big/v1/*", "group": "slow",
                                "prefetch": 5}))
            while len(got) < 20:
                message = receive(ws, "message", 10)
                got.add(message["payload"]["i"])
                ws.send(json.dumps({"op": "ack", "receipt": message["receipt"]}))
        assert got == set(range(20))


def test_bad_stream_messages_get_errors_and_the_stream_lives(stream_broker):
    h = bearer(stream_broker, "app-bad")
    with stream(stream_broker, h) as ws:
        for bad, reason in [
            ({"op": "ack", "receipt": "1.\u00b2"}, "unknown_delivery"),  # a Unicode digit
            ({"op": "consume", "pattern": "orders/v1/*", "start": "seq:\u00b2"},
             "bad_request"),
            ({"op": "nack", "receipt": "1.1", "delay": 1e300}, "bad_request"),
            ({"op": "teleport"}, "bad_request"),
            # A misspelt option was dropped for its default (here: from new, not oldest).
            ({"op": "listen", "pattern": "orders/v1/*", "strat": "oldest"}, "bad_request"),
            ({"op": "consume", "pattern": "orders/v1/*", "prefecth": 1}, "bad_request"),
            ({"op": "nack", "receipt": "1.1", "front": "no"}, "bad_request"),  # was front
            ({"op": "ack"}, "bad_request"),  # was "receipt None is not one of ..."
        ]:
            ws.send(json.dumps(bad))
            error = receive(ws, "error")
            assert error["reason"] == reason, bad
            if bad["op"] == "ack" and "receipt" in bad:
                assert error["receipt"] == bad["receipt"]
            if "strat" in bad or "prefecth" in bad:
                assert "unknown field" in error["message"], error
        ws.send(json.dumps({"op": "listen", "pattern": "orders/v1/u"}))
        sid = receive(ws, "subscribed")["sid"]
        ws.send(json.dumps({"op": "unsubscribe", "sid": sid, "ref": "u1"}))
        assert receive(ws, "unsubscribed") == {"type": "unsubscribed", "sid": sid, "ref": "u1"}
        ws.send(b"\x00binary")
        assert "send stream messages as text" in receive(ws, "error")["message"]
        for sid in range(257):
            ws.send(json.dumps({"op": "listen", "pattern": f"orders/v1/{sid}"}))
        assert "the limit is 256" in receive(ws, "error", 10)["message"]
        ws.send(json.dumps({"op": "publish", "channel": "orders/v1/x", "payload": 1}))
        assert receive(ws, "published")["channel"] == "orders/v1/x"
    with httpx.Client(base_url=stream_broker.http, timeout=10) as http:
        r = http.post("/v1/ack/abc.\u00b2", headers=h)
        assert r.status_code == 404 and r.json()["error"]["reason"] == "unknown_delivery"
        consumed = http.post("/v1/messages/orders/v1/n", json=1, headers=h)
        assert consumed.status_code == 201
        d = http.post("/v1/consume/orders/v1/n", params={"group": "n", "wait": 3},
                      headers=h).json()
        r = http.post(f"/v1/nack/{d['receipt']}", params={"delay": "1e300"}, headers=h)
        assert r.status_code == 400 and "delay must be 0.." in r.json()["error"]["message"]


def test_text_on_the_native_websocket_is_refused_precisely(stream_broker):
    h = bearer(stream_broker, "app-text")
    sock = raw_websocket(stream_broker.http, "/v1/ws", h)
    try:
        sock.sendall(ws_frame(b'{"op": "publish"}'))
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    # The broker's binary message holds a fatal ERROR frame, then the socket closes.
    start = data.index(b"\x82") + 2  # a binary frame, unmasked, short length
    reader = FrameReader()
    reader.receive_data(data[start:])
    frame = reader.next_event()
    assert isinstance(frame, f.Error) and frame.fatal, frame
    assert "binary messages, not text" in frame.message


def test_stream_publishers_get_flow_control(broker_factory, tmp_path):
    # With a 1-byte threshold every publish waits for the disk before the stream reads
    # on: all are still answered, and the pauses are counted as for TCP publishers.
    cfg = tmp_path / "flow.toml"
    cfg.write_text(RULES.replace("slow_consumer_bytes = 2097152",
                                 "publish_pause_bytes = 1"))
    broker = broker_factory.make(config=cfg).start()
    h = bearer(broker, "app-flow")
    with stream(broker, h) as ws:
        for i in range(5):
            ws.send(json.dumps({"op": "publish", "channel": "orders/v1/f", "payload": i}))
        assert sorted(receive(ws, "published")["seq"] for _ in range(5)) == [1, 2, 3, 4, 5]
    with httpx.Client(base_url=broker.http, timeout=10) as http:
        flow = http.get("/v1/status", headers=admin_bearer(broker)).json()["flow"]
    assert flow["publisher_pauses"] >= 1


def test_subscribed_comes_before_the_first_message(stream_broker):
    h = bearer(stream_broker, "app-order")
    with httpx.Client(base_url=stream_broker.http, timeout=10) as http:
        for i in range(3):
            http.post("/v1/messages/orders/v1/o", json=i, headers=h)
    with stream(stream_broker, h) as ws:
        ws.send(json.dumps({"op": "consume", "pattern": "orders/v1/o", "group": "o",
                            "prefetch": 3, "ref": "s"}))
        first = json.loads(ws.recv(5))
        assert (first["type"], first["ref"]) == ("subscribed", "s")
        assert json.loads(ws.recv(5))["sid"] == first["sid"]


def test_stream_publishes_carry_headers_key_ttl_delay_and_dedup(stream_broker):
    h, admin = bearer(stream_broker, "app-fields"), admin_bearer(stream_broker)

    def publish(ws: Any, channel: str, ref: str, **fields: Any) -> dict[str, Any]:
        ws.send(json.dumps({"op": "publish", "channel": channel, "payload": ref,
                            "ref": ref, **fields}))
        reply = receive(ws, "published")
        assert reply["ref"] == ref, reply
        return reply

    with stream(stream_broker, h) as pub, stream(stream_broker, h) as sub, \
            httpx.Client(base_url=stream_broker.http, timeout=10) as http:
        sub.send(json.dumps({"op": "consume", "pattern": "orders/v1/fields", "group": "g",
                             "prefetch": 10}))
        receive(sub, "subscribed")
        # Headers, key and priority reach the consumer.
        publish(pub, "orders/v1/fields", "plain", headers={"trace": "a1"}, key="cust-7",
                priority=3)
        message = receive(sub, "message")
        assert (message["headers"], message["key"], message["priority"]) == \
            ({"trace": "a1"}, "cust-7", 3)
        # A delay holds the message: one published after it without a delay comes first.
        sent = time.monotonic()
        publish(pub, "orders/v1/fields", "delayed", delay=1.0)
        publish(pub, "orders/v1/fields", "prompt")
        assert receive(sub, "message")["payload"] == "prompt"
        assert receive(sub, "message", 10)["payload"] == "delayed"
        assert time.monotonic() - sent >= 0.95
        # A repeated dedup key is a duplicate of the first, not a second message.
        first = publish(pub, "orders/v1/fields", "once", dedup="order-42")
        again = publish(pub, "orders/v1/fields", "twice", dedup="order-42")
        assert (first["duplicate"], again["duplicate"]) == (False, True)
        assert (again["seq"], again["id"]) == (first["seq"], first["id"])
        assert receive(sub, "message")["payload"] == "once"
        # A ttl expires the message before anyone reads it.
        publish(pub, "orders/v1/expiring", "short-lived", ttl=0.2)
        wait_until(lambda: http.get("/v1/status", headers=admin).json()
                   ["counters"]["expired"] == 1, 10, what="the message to expire")
        sub.send(json.dumps({"op": "consume", "pattern": "orders/v1/expiring",
                             "group": "late"}))
        receive(sub, "subscribed")
        publish(pub, "orders/v1/expiring", "after")
        assert receive(sub, "message")["payload"] == "after"


def test_stream_publish_fields_are_refused_as_http_refuses_them(stream_broker):
    h = bearer(stream_broker, "app-refused")
    many = {f"h{i}": "v" for i in range(65)}
    # (stream fields, the same request over HTTP: query, headers)
    cases = [
        ({"ttl": "soon"}, {"ttl": "soon"}, {}),
        ({"ttl": -1}, {"ttl": "-1"}, {}),
        ({"delay": 1e300}, {"delay": "1e300"}, {}),
        ({"priority": 12}, {"priority": "12"}, {}),
        ({"key": "k" * 257}, {"key": "k" * 257}, {}),
        ({"dedup": "d" * 257}, {"dedup": "d" * 257}, {}),
        ({"headers": many}, {}, {f"X-Minou-Header-{k}": v for k, v in many.items()}),
    ]
    with stream(stream_broker, h) as ws, \
            httpx.Client(base_url=stream_broker.http, timeout=10) as http:
        for i, (fields, query, headers) in enumerate(cases):
            ws.send(json.dumps({"op": "publish", "channel": "orders/v1/r", "payload": 1,
                                "ref": i, **fields}))
            error = receive(ws, "error")
            r = http.post("/v1/messages/orders/v1/r", params=query, json=1,
                          headers={**h, **headers})
            assert r.status_code == 400, (fields, r.text)
            assert error["ref"] == i
            assert (error["reason"], error["message"]) == \
                (r.json()["error"]["reason"], r.json()["error"]["message"]), fields
        for fields, message in [
            ({"tll": 5}, "a publish takes no field 'tll'"),
            ({"headers": {"n": 1}}, "header 'n' must be a string, not 1"),
            ({"headers": ["a"]}, "headers must be an object of strings"),
            ({"delay": True}, "delay must be a number, not True"),
        ]:
            ws.send(json.dumps({"op": "publish", "channel": "orders/v1/r", "payload": 1,
                                **fields}))
            error = receive(ws, "error")
            assert error["reason"] == "bad_request" and message in error["message"], error
        # Nothing refused was stored; the stream goes on.
        ws.send(json.dumps({"op": "publish", "channel": "orders/v1/r", "payload": 1}))
        assert receive(ws, "published")["seq"] == 1
