"""HTTP/1.1 on the wire, byte by byte: what the protocol's fast path (publish, batch
publish, ack and nack answered without an ASGI task) must get right beside uvicorn's
own path -- pipelining, HTTP/1.0, Connection: close, chunked bodies, oversized bodies,
clients that leave before their commit -- and that both paths answer alike. A request
with ``Expect: 100-continue`` always takes uvicorn's path, which makes the two
comparable request for request."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from .test_http_api import admin_bearer, bearer

CONFIG = """
max_message_size = 1024

[[rules]]
client = "app-*"
read = ["orders/*"]
write = ["orders/*"]
"""


@pytest.fixture
def wire_broker(broker_factory, tmp_path):
    cfg = tmp_path / "wire.toml"
    cfg.write_text(CONFIG)
    yield broker_factory.make(config=cfg).start()
    while Wire.opened:
        Wire.opened.pop().close()


class Wire:
    """One raw TCP connection to the HTTP port (closed at the end of the test)."""

    opened: list[Wire] = []

    def __init__(self, http_url: str) -> None:
        u = urlsplit(http_url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=10)
        self.buf = b""
        Wire.opened.append(self)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._fill():
                raise ConnectionError(f"closed mid-response: {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if status == 100:
            return self.response()
        size = int(headers.get("content-length", "0"))
        while len(self.buf) < size:
            if not self._fill():
                raise ConnectionError("closed mid-body")
        body, self.buf = self.buf[:size], self.buf[size:]
        return status, headers, body

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def request(path: str, body: bytes = b"", *, headers: dict[str, str] | None = None,
            version: str = "1.1", method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: test"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if "Transfer-Encoding" not in (headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def consume_all(broker, h: dict[str, str], pattern: str, group: str) -> list:
    out = []
    with httpx.Client(base_url=broker.http, timeout=10) as http:
        while True:
            r = http.post(f"/v1/consume/{pattern}", params={"group": group, "wait": 0.3},
                          headers=h)
            if r.status_code == 204:
                return out
            out.append(r.json()["payload"])
            http.post(f"/v1/ack/{r.json()['receipt']}", headers=h)


def test_pipelined_requests_are_answered_in_order(wire_broker):
    h = bearer(wire_broker, "app-pipe")
    wire = Wire(wire_broker.http)
    # Three publishes and a batch in one write: the first is answered by the fast path,
    # the others wait in uvicorn's pipeline and go through the ASGI app, in order.
    wire.send(b"".join(request("/v1/messages/orders/v1/p", json.dumps(i).encode(),
                               headers=h) for i in range(3))
              + request("/v1/messages", json.dumps(
                  [{"channel": "orders/v1/p", "payload": 3}]).encode(), headers=h))
    seqs = []
    for _ in range(3):
        status, _, body = wire.response()
        assert status == 201, body
        seqs.append(json.loads(body)["seq"])
    status, _, body = wire.response()
    assert status == 200 and json.loads(body)["results"][0]["seq"] == 4
    assert seqs == [1, 2, 3]
    # The connection is still good for a fast request afterwards.
    wire.send(request("/v1/messages/orders/v1/p", b"4", headers=h))
    assert wire.response()[0] == 201
    wire.close()
    assert consume_all(wire_broker, h, "orders/v1/p", "g") == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("version,extra", [("1.0", {}), ("1.1", {"Connection": "close"})])
def test_connection_closes_when_the_client_asks(wire_broker, version, extra):
    h = bearer(wire_broker, "app-close")
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/messages/orders/v1/c", b'{"a": 1}', headers={**h, **extra},
                      version=version))
    status, headers, _ = wire.response()
    assert status == 201 and headers["connection"] == "close"
    assert wire.closed_by_peer()


def test_nothing_behind_a_closing_answer_is_done(wire_broker):
    # The 413 closes the connection: the client must assume the request behind it was
    # not done, so it must not be.
    h = bearer(wire_broker, "app-after")
    wire = Wire(wire_broker.http)
    big = request("/v1/messages/orders/v1/after", b'"' + b"x" * 4000 + b'"', headers=h)
    wire.send(big + request("/v1/messages/orders/v1/after", b'"second"', headers=h))
    status, headers, _ = wire.response()
    assert status == 413 and headers["connection"] == "close"
    assert wire.closed_by_peer()
    # Same behind a Connection: close answered at once.
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/ack/nope.1", headers={**h, "Connection": "close"})
              + request("/v1/messages/orders/v1/after", b'"third"', headers=h))
    assert wire.response()[0] == 404 and wire.closed_by_peer()
    assert consume_all(wire_broker, h, "orders/v1/after", "g") == []


def test_a_long_poll_behind_an_instant_answer_keeps_its_connection(wire_broker):
    # An answer given while a read is parsed re-arms uvicorn's keep-alive timer (5 s);
    # a long poll parsed from the same read must not be cut by it.
    h = bearer(wire_broker, "app-ka")
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/ack/nope.1", headers=h)
              + request("/v1/consume/orders/v1/ka?group=g&wait=6", headers=h))
    assert wire.response()[0] == 404
    assert wire.response()[0] == 204  # after its 6 s, on a connection still open


def test_chunked_request_body(wire_broker):
    h = bearer(wire_broker, "app-chunk")
    wire = Wire(wire_broker.http)
    chunks = [b'{"items": [', b"1, 2, ", b"3]}"]
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    wire.send(request("/v1/messages/orders/v1/ch", body,
                      headers={**h, "Transfer-Encoding": "chunked"}))
    status, headers, _ = wire.response()
    assert status == 201 and headers.get("connection") != "close"
    assert consume_all(wire_broker, h, "orders/v1/ch", "g") == [{"items": [1, 2, 3]}]


def test_oversized_bodies_are_refused_before_they_are_read(wire_broker):
    h = bearer(wire_broker, "app-big")
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/messages/orders/v1/big", b'"' + b"x" * 4000 + b'"', headers=h))
    status, headers, body = wire.response()
    error = json.loads(body)["error"]
    assert status == 413 and error["reason"] == "message_too_large", body
    assert error["detail"]["limit"] == 1024 and headers["connection"] == "close"
    assert wire.closed_by_peer()
    # The same through uvicorn's path (Expect: 100-continue).
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/messages/orders/v1/big", b'"' + b"x" * 4000 + b'"',
                      headers={**h, "Expect": "100-continue"}))
    status, _, body = wire.response()
    assert status == 413 and json.loads(body)["error"]["reason"] == "message_too_large"
    # A batch body over the frame limit (16 MiB): refused while it is still arriving.
    wire = Wire(wire_broker.http)
    item = b'{"channel": "orders/v1/big", "payload": "' + b"y" * 1000 + b'"},'
    count = (17 << 20) // len(item)
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: t\r\nAuthorization: {h['Authorization']}"
            f"\r\nContent-Length: {len(item) * count + 2}\r\n\r\n[").encode()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        wire.send(head + item * count + b"1]")  # the broker may close before the end
    status, _, body = wire.response()
    assert status == 413 and json.loads(body)["error"]["reason"] == "frame_too_large"
    # Counted, and the broker serves the next client.
    with httpx.Client(base_url=wire_broker.http, timeout=10) as http:
        r = http.post("/v1/messages/orders/v1/big", json={"ok": True}, headers=h)
        assert r.status_code == 201
        status = http.get("/v1/status", headers=admin_bearer(wire_broker)).json()
    refused = status["counters"]["refused"]
    assert refused["message_too_large"] == 2 and refused["frame_too_large"] == 1


def test_a_client_leaving_before_its_commit_loses_nothing(wire_broker):
    h = bearer(wire_broker, "app-gone")
    for i in range(20):
        wire = Wire(wire_broker.http)
        wire.send(request("/v1/messages/orders/v1/gone", str(i).encode(), headers=h))
        wire.close()  # before the answer: the publish still commits
    wire = Wire(wire_broker.http)
    wire.send(request("/v1/messages/orders/v1/gone", b"20", headers=h))
    assert wire.response()[0] == 201
    assert sorted(consume_all(wire_broker, h, "orders/v1/gone", "g")) == list(range(21))


def test_a_consume_whose_client_left_does_not_keep_the_message(wire_broker):
    h = bearer(wire_broker, "app-left")
    for _ in range(3):  # long polls whose clients go away while they wait
        wire = Wire(wire_broker.http)
        wire.send(request("/v1/consume/orders/v1/left?group=g&wait=20", headers=h))
        wire.close()
    with httpx.Client(base_url=wire_broker.http, timeout=10) as http:
        assert http.post("/v1/messages/orders/v1/left", json="m", headers=h).status_code == 201
        # The next request gets it now, not once a dead request's lease runs out.
        r = http.post("/v1/consume/orders/v1/left", params={"group": "g", "wait": 3},
                      headers=h)
        assert r.status_code == 200 and r.json()["payload"] == "m", r.text
        assert http.post(f"/v1/ack/{r.json()['receipt']}", headers=h).status_code == 200


def test_a_kept_delivery_whose_lease_ran_out_is_not_handed_out(wire_broker):
    h = bearer(wire_broker, "app-stale")
    wire = Wire(wire_broker.http)
    # A long poll with a pipelined request behind it, then the client leaves: the
    # message published next is kept for this consumer's next request...
    wire.send(request("/v1/consume/orders/v1/st?group=g&wait=20&lease=1", headers=h)
              + b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    wire.close()
    with httpx.Client(base_url=wire_broker.http, timeout=10) as http:
        assert http.post("/v1/messages/orders/v1/st", json="m", headers=h).status_code == 201
        time.sleep(2.5)  # ... until its 1 s lease runs out and the group takes it back
        r = http.post("/v1/consume/orders/v1/st", params={"group": "g", "wait": 5,
                                                           "lease": 30}, headers=h)
        assert r.status_code == 200 and r.json()["payload"] == "m", r.text
        # Its receipt is a live one (not the expired delivery's).
        assert http.post(f"/v1/ack/{r.json()['receipt']}", headers=h).status_code == 200
        r = http.post("/v1/consume/orders/v1/st", params={"group": "g", "wait": 0.5},
                      headers=h)
        assert r.status_code == 204, r.text


def test_consume_delivers_to_waiting_requests_in_turn(wire_broker):
    h = bearer(wire_broker, "app-turn")
    waiting = [Wire(wire_broker.http) for _ in range(3)]
    for wire in waiting:
        wire.send(request("/v1/consume/orders/v1/turn?group=g&wait=10", headers=h))
    with httpx.Client(base_url=wire_broker.http, timeout=10) as http:
        for i in range(3):
            http.post("/v1/messages/orders/v1/turn", json=i, headers=h)
    got = []
    for wire in waiting:
        status, headers, body = wire.response()
        assert status == 200 and headers["content-type"] == "application/json"
        got.append(json.loads(body)["payload"])
    assert sorted(got) == [0, 1, 2]


CASES = [
    # (name, path, body, headers beyond the client's bearer; None = no bearer at all)
    ("good publish", "/v1/messages/orders/v1/x?priority=3&key=k", b'{"n": 1}', {}),
    ("payload query", "/v1/messages/orders/v1/x?payload=hello", b"", {}),
    ("payload query and a body", "/v1/messages/orders/v1/x?payload=hi", b"z" * 2000, {}),
    ("message header", "/v1/messages/orders/v1/x", b"1", {"X-Minou-Header-Source": "t"}),
    ("no token", "/v1/messages/orders/v1/x", b"1", None),
    ("bad bearer", "/v1/messages/orders/v1/x", b"1", {"Authorization": "Bearer nope"}),
    ("bad scheme", "/v1/messages/orders/v1/x", b"1", {"Authorization": "Basic a"}),
    ("forbidden channel", "/v1/messages/billing/v1/x", b"1", {}),
    ("invalid json", "/v1/messages/orders/v1/x", b"{nope", {}),
    ("empty body", "/v1/messages/orders/v1/x", b"", {}),
    ("bad priority", "/v1/messages/orders/v1/x?priority=high", b"1", {}),
    ("bad ttl", "/v1/messages/orders/v1/x?ttl=nan", b"1", {}),
    ("bad channel id", "/v1/messages/orders/v1/a%20b", b"1", {}),
    ("batch", "/v1/messages", b'[{"channel": "orders/v1/x", "payload": 1},'
                              b' {"channel": "billing/v1/x", "payload": 2}]', {}),
    ("batch not a list", "/v1/messages", b'{"channel": 1}', {}),
    ("batch empty", "/v1/messages", b"[]", {}),
    ("consume nothing there", "/v1/consume/orders/v1/none?group=g&wait=0", b"", {}),
    ("consume forbidden", "/v1/consume/billing/v1/x?group=g&wait=0", b"", {}),
    ("consume dead forbidden", "/v1/consume/_dead/orders/v1/x?group=g&wait=0", b"", {}),
    ("consume bad wait", "/v1/consume/orders/v1/x?group=g&wait=soon", b"", {}),
    ("consume with a body", "/v1/consume/orders/v1/none?group=g&wait=0", b"z" * 2000, {}),
    ("consume no token", "/v1/consume/orders/v1/x?group=g&wait=0", b"", None),
    ("ack unknown receipt", "/v1/ack/nope.1", b"", {}),
    ("nack unknown receipt", "/v1/nack/nope.1?delay=1", b"", {}),
]


def _comparable(body: bytes) -> object:
    if not body:
        return None
    value = json.loads(body)
    for item in [value, *value.get("results", [])] if isinstance(value, dict) else [value]:
        for k in ("seq", "id", "receipt", "published_at"):
            if isinstance(item, dict) and k in item:
                item[k] = "*"
    return value


@pytest.mark.parametrize("name,path,body,extra", CASES, ids=[c[0] for c in CASES])
def test_fast_and_asgi_paths_answer_alike(wire_broker, name, path, body, extra):
    h = {} if extra is None else {**bearer(wire_broker, "app-same"), **extra}
    answers = []
    for expect in (False, True):
        wire = Wire(wire_broker.http)
        headers = {**h, "Expect": "100-continue"} if expect else h
        wire.send(request(path, body, headers=headers))
        status, resp_headers, resp_body = wire.response()
        wire.close()
        answers.append((status, resp_headers.get("content-type"),
                        resp_headers.get("www-authenticate"),
                        resp_headers.get("x-frame-options"), _comparable(resp_body)))
    assert answers[0] == answers[1], name
    assert answers[0][3] == "DENY"


def test_each_consume_gets_the_lease_it_asks_for(wire_broker):
    h = bearer(wire_broker, "app-lease")
    with httpx.Client(base_url=wire_broker.http, timeout=10) as http:
        q = {"group": "lease", "wait": 0}
        assert http.post("/v1/consume/orders/v1/l", params={**q, "lease": 1},
                         headers=h).status_code == 204
        http.post("/v1/messages/orders/v1/l", json="m", headers=h)
        d = http.post("/v1/consume/orders/v1/l", params={**q, "wait": 3, "lease": 600},
                      headers=h).json()
        time.sleep(2)  # past the first request's 1 s lease, well inside 600 s
        assert http.post("/v1/consume/orders/v1/l", params={**q, "wait": 0.5},
                         headers=h).status_code == 204
        assert http.post(f"/v1/ack/{d['receipt']}", headers=h).status_code == 200
