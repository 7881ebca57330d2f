"""Idle and slow connections are bounded: a socket that sends no request, a request whose
headers trickle in (slowloris) and an idle keep-alive connection are closed after their
timeouts; native, HTTP and WebSocket connections count against one limit, past which
each kind is refused cleanly (and counted, and logged) while connected clients carry on;
and the limit derives from the file descriptor limit, raised at start."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import select
import socket
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
import websockets.sync.client as wsc
from websockets.exceptions import InvalidStatus

import minou
from minou.config import load_settings
from minou.errors import ConfigError, ConnectionClosed, ErrorCode
from minou.limits import MAX_HTTP_HEAD_BYTES, MAX_HTTP_PIPELINE
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import RawPeer, signed_hello, wait_until
from .test_http_api import bearer

HEALTH = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n"


def limited(broker_factory: Any, tmp_path: Any, config: str) -> Any:
    cfg = tmp_path / "limits.toml"
    cfg.write_text(config)
    return broker_factory.make(config=cfg).start()


class Http:
    """One raw TCP connection to the HTTP port."""

    def __init__(self, broker: Any) -> None:
        u = urlsplit(broker.http)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=10)
        self.buf = b""

    def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed mid-response: {self.buf!r}")
            self.buf += data
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip()
                   for k, _, v in (line.partition(":") for line in lines[1:])}
        size = int(headers.get("content-length", "0"))
        while len(self.buf) < size:
            self.buf += self.sock.recv(65536)
        body, self.buf = self.buf[:size], self.buf[size:]
        return int(lines[0].split()[1]), headers, body

    def get(self, request: bytes = HEALTH) -> tuple[int, dict[str, str], bytes]:
        self.sock.sendall(request)
        return self.response()

    def closed_by_peer(self, timeout: float = 10) -> bool:
        """Read until the broker closes (True), or ``timeout`` passes (False)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def frame_of(message: Any) -> Any:
    """The native frame a /v1/ws binary message carries."""
    reader = FrameReader()
    reader.receive_data(message)
    return reader.next_event()


def error_of(body: bytes) -> dict[str, Any]:
    return json.loads(body)["error"]  # type: ignore[no-any-return]


def status(broker: Any) -> dict[str, Any]:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        return admin.admin("status")  # type: ignore[no-any-return]


# ------------------------------------------------------------------ timeouts
def test_a_socket_that_sends_nothing_is_closed_after_the_header_timeout(broker_factory,
                                                                         tmp_path):
    broker = limited(broker_factory, tmp_path, "http_header_timeout = 0.5\n")
    silent = Http(broker)
    started = time.monotonic()
    assert silent.sock.recv(1) == b""  # closed, with no answer: there was no request
    assert 0.4 <= time.monotonic() - started < 5
    silent.close()


def test_a_slowloris_request_gets_a_408_then_the_close(broker_factory, tmp_path):
    broker = limited(broker_factory, tmp_path,
                     "http_header_timeout = 0.6\nhttp_idle_timeout = 10\n")
    slow = Http(broker)
    assert slow.get()[0] == 200
    time.sleep(0.5)  # idle, within http_idle_timeout: the deadline runs from the first byte
    first_byte = time.monotonic()
    for byte in HEALTH[:-2]:  # one byte per 0.05 s, never the blank line
        slow.sock.sendall(bytes([byte]))
        if select.select([slow.sock], [], [], 0.05)[0]:
            break
    status_code, headers, body = slow.response()
    took = time.monotonic() - first_byte
    assert status_code == 408 and headers["connection"] == "close"
    assert error_of(body)["reason"] == "request_timeout"
    assert "within 0.6 s" in error_of(body)["message"]
    assert 0.55 <= took < 5
    assert slow.closed_by_peer()
    slow.close()
    assert status(broker)["counters"]["refused"]["request_timeout"] == 1
    assert re.search(r"HTTP connection from 127\.0\.0\.1:\d+ cut: request headers not "
                     r"complete within 0\.6 s", broker.output)


def test_a_request_head_past_the_limit_is_refused_while_it_is_still_arriving(
        broker_factory, tmp_path):
    """A header line that never ends, sent fast: refused once past MAX_HTTP_HEAD_BYTES
    (the parser kept every byte of it until the header timeout, whatever the rate)."""
    broker = limited(broker_factory, tmp_path, "http_header_timeout = 30\n")
    big = Http(broker)
    big.sock.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\nX-Pad: ")
    sent, answered = 0, False
    while sent < 4 * MAX_HTTP_HEAD_BYTES and not answered:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            big.sock.sendall(b"a" * 8192)
        sent += 8192
        answered = bool(select.select([big.sock], [], [], 0)[0])
    status_code, headers, body = big.response()
    assert status_code == 400 and headers["connection"] == "close"
    assert error_of(body)["detail"] == {"limit": MAX_HTTP_HEAD_BYTES}
    assert sent <= 4 * MAX_HTTP_HEAD_BYTES  # answered while it was still sending
    big.close()
    nextone = Http(broker)
    assert nextone.get()[0] == 200  # the next client is served
    nextone.close()
    assert status(broker)["counters"]["refused"]["bad_request"] == 1
    assert "request line and headers over 65536 bytes" in broker.output


def test_a_stranger_sending_a_body_slowly_is_refused_at_its_headers(broker_factory, tmp_path):
    """No token, a body announced and never sent: 401 at once, not a slot held for as
    long as the body takes (bodies have no time limit); with a token the body is awaited."""
    broker = limited(broker_factory, tmp_path, "max_connections = 20\n")
    strangers = []
    for framing in (b"Content-Length: 100000\r\n", b"Transfer-Encoding: chunked\r\n"):
        for token in (b"", b"Authorization: Bearer not-a-token\r\n"):
            s = Http(broker)
            s.sock.sendall(b"POST /v1/messages/a/v1/b HTTP/1.1\r\nHost: t\r\n" + framing
                           + token + b"\r\n" + (b"5\r\nhello" if b"chunked" in framing
                                                  else b"hello"))
            status_code, headers, body = s.response()
            assert status_code == 401 and headers["connection"] == "close", body
            assert error_of(body)["reason"] == "not_authenticated"
            assert s.closed_by_peer()
            strangers.append(s)
    # A client with a token gets its body read and its publish answered.
    auth = bearer(broker, "pub-1")["Authorization"].encode()
    ok = Http(broker)
    ok.sock.sendall(b"POST /v1/messages/a/v1/b HTTP/1.1\r\nHost: t\r\nAuthorization: "
                    + auth + b"\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n")
    time.sleep(0.3)
    ok.sock.sendall(b'{"a":1}')
    assert ok.response()[0] == 201
    ok.close()
    for s in strangers:
        s.close()
    assert status(broker)["counters"]["refused"]["not_authenticated"] == 4


def test_a_body_in_the_same_read_as_the_head_is_not_counted_as_head(broker_factory,
                                                                   tmp_path):
    """The head limit counts what comes before the blank line: a 90 KB publish whose
    headers end in the same read as the body starts is stored, not refused as a head
    over 64 KiB (the request line came in a read before, as headers split on a network)."""
    broker = limited(broker_factory, tmp_path, "")
    auth = bearer(broker, "pub-1")["Authorization"].encode()
    body = json.dumps({"pad": "x" * 90_000}).encode()
    conn = Http(broker)
    conn.sock.sendall(b"POST /v1/messages/a/v1/b HTTP/1.1\r\n")
    time.sleep(0.2)  # the broker reads the request line alone: the head has begun
    conn.sock.sendall(b"Host: t\r\nAuthorization: "
                      + auth + b"\r\nContent-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert conn.response()[0] == 201
    conn.close()


def test_a_refusal_at_the_headers_never_overtakes_an_earlier_answer(broker_factory,
                                                                   tmp_path):
    """Pipelined behind a long poll, a request without a valid token is not refused at
    its headers (that answer would overtake the poll's): the poll is answered first,
    then the route refuses the second request, in order."""
    broker = limited(broker_factory, tmp_path, "")
    auth = bearer(broker, "con-1")["Authorization"].encode()
    conn = Http(broker)
    conn.sock.sendall(
        b"POST /v1/consume/a/v1/b?group=g&wait=1 HTTP/1.1\r\nHost: t\r\nAuthorization: "
        + auth + b"\r\nContent-Length: 0\r\n\r\n"
        + b"POST /v1/messages/a/v1/b HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer bad\r\n"
        b"Content-Length: 7\r\n\r\n{\"a\":1}")
    status_code, _, _ = conn.response()
    assert status_code in (200, 204)  # the poll's own answer (nothing came: 204)
    status_code, _, body = conn.response()
    assert status_code == 401 and error_of(body)["reason"] == "not_authenticated"
    conn.close()


def publish_request(auth: bytes) -> bytes:
    return (b"POST /v1/messages/idle/v1/1 HTTP/1.1\r\nHost: t\r\nAuthorization: " + auth
            + b"\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}")


@pytest.mark.parametrize("route", ["health", "publish"])
def test_an_idle_keep_alive_connection_is_closed_after_its_idle_timeout(broker_factory,
                                                                         tmp_path, route):
    """Through the app (GET /health) and through the protocol's own answers (a publish,
    whose idle timeout is the connection's one deadline, not uvicorn's timer: a header
    timeout far longer must not put the idle close off)."""
    broker = limited(broker_factory, tmp_path,
                     "http_idle_timeout = 2.0\nhttp_header_timeout = 10\n")
    request, expect = HEALTH, 200
    if route == "publish":
        request, expect = publish_request(bearer(broker, "idle-1")["Authorization"].encode()), 201
    with contextlib.ExitStack() as opened:  # closed whatever an assertion says
        conn = Http(broker)
        opened.callback(conn.close)
        for _ in range(10):  # 3 s of requests 0.3 s apart: idle is counted from each answer
            assert conn.get(request)[0] == expect
            time.sleep(0.3)
        # A request begun just before the idle timeout, its headers slow: the header
        # timeout counts for it from its first byte, the idle one no longer does.
        time.sleep(0.7)  # 1 s after the last answer
        head, _, rest = request.partition(b"\r\n")
        conn.sock.sendall(head + b"\r\n")
        time.sleep(1.5)  # past the idle deadline, within the header timeout
        conn.sock.sendall(rest)
        assert conn.response()[0] == expect
        answered = time.monotonic()
        assert conn.closed_by_peer()
        assert 1.9 <= time.monotonic() - answered < 6
        fresh = Http(broker)  # its first answer's idle timeout, well before its header one
        opened.callback(fresh.close)
        assert fresh.get(request)[0] == expect
        answered = time.monotonic()
        assert fresh.closed_by_peer(timeout=15)
        assert 1.9 <= time.monotonic() - answered < 6


def test_a_client_pipelining_without_reading_holds_a_bounded_queue(broker):
    """uvicorn queued a request per head it parsed and read on after every answer, so a
    client pipelining GET /health (no token needed) and reading none of the answers grew
    the broker without end (six sockets: +1.2 GB in 5 s). Now MAX_HTTP_PIPELINE wait
    behind the one being answered: those are answered, the last with the close, and what
    came after is not done."""
    http = Http(broker)
    http.sock.sendall(HEALTH * 1000)  # 36 KB: one read, parsed whole
    answers = []
    while True:
        try:
            answers.append(http.response())
        except ConnectionError:
            break
    assert 0 < len(answers) <= MAX_HTTP_PIPELINE + 1
    assert all(code == 200 for code, _, _ in answers)
    assert answers[-1][1]["connection"] == "close"
    assert http.closed_by_peer()
    http.close()
    assert "over 100 requests pipelined (MAX_HTTP_PIPELINE)" in broker.output
    # Pipelining within the bound is answered whole, in order, and the connection stays.
    http = Http(broker)
    http.sock.sendall(HEALTH * 50)
    assert [http.response()[0] for _ in range(50)] == [200] * 50
    assert http.get()[0] == 200
    http.close()


def test_blank_lines_do_not_keep_an_idle_connection_open(broker_factory, tmp_path):
    """Any data stops uvicorn's idle timer, even bytes that begin no request: the next
    request's headers are still due within idle + header timeout of the last answer."""
    broker = limited(broker_factory, tmp_path,
                     "http_idle_timeout = 0.5\nhttp_header_timeout = 0.5\n")
    conn = Http(broker)
    assert conn.get()[0] == 200
    answered = time.monotonic()
    received = b""
    while time.monotonic() - answered < 5:
        try:
            conn.sock.sendall(b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            break
        if select.select([conn.sock], [], [], 0.1)[0]:
            try:
                data = conn.sock.recv(65536)
            except ConnectionResetError:  # our blank lines crossed the close
                break
            received += data
            if not data:
                break
    assert received == b""  # closed quietly: no request had begun
    assert 0.9 <= time.monotonic() - answered < 4
    conn.close()


# --------------------------------------------------------------------- the limit
def test_native_http_and_websockets_share_one_limit_and_refusals_are_clean(broker_factory,
                                                                           tmp_path):
    broker = limited(broker_factory, tmp_path, "max_connections = 4\n")
    ws_base = broker.http.replace("http://", "ws://")
    stream_headers = bearer(broker, "app-stream")  # registers its key: a connection, gone
    http_headers = bearer(broker, "app-http")
    with contextlib.ExitStack() as opened:
        admin = opened.enter_context(minou.connect_sync(broker.url, **broker.admin_auth()))
        wait_until(lambda: admin.admin("status")["admission"]["open"] == {"native": 1,
                                                                          "http": 0,
                                                                          "resp": 0},
                   what="only the admin connection to be counted")
        # An HTTP connection being answered (a consume's long poll): it keeps its place
        # (an idle one would give it to a newcomer: the next test).
        keep_alive = Http(broker)
        opened.callback(keep_alive.close)
        assert keep_alive.get()[0] == 200
        keep_alive.sock.sendall(
            b"POST /v1/consume/lim/v1/*?group=h&wait=30 HTTP/1.1\r\nHost: t\r\n"
            b"Authorization: " + http_headers["Authorization"].encode() +
            b"\r\nContent-Length: 0\r\n\r\n")
        native_ws = opened.enter_context(wsc.connect(ws_base + "/v1/ws"))
        native_ws.send(f.encode(signed_hello("app-ws")))
        assert isinstance(frame_of(native_ws.recv(5)), f.Welcome)
        stream = opened.enter_context(wsc.connect(ws_base + "/v1/stream",
                                                  additional_headers=stream_headers))
        stream.send(json.dumps({"op": "consume", "pattern": "lim/v1/*", "group": "g"}))
        assert json.loads(stream.recv(5))["type"] == "subscribed"
        assert admin.admin("status")["admission"]["open"] == {"native": 1, "http": 3,
                                                              "resp": 0}

        # The next one of each kind is refused, each the way its protocol can say it.
        late = RawPeer(broker.url)
        err = late.read()
        assert isinstance(err, f.Error) and err.fatal
        assert err.code == ErrorCode.TOO_MANY_CONNECTIONS
        assert "max_connections = 4" in err.message
        assert late.closed_by_peer()
        late.close()
        with pytest.raises(ConnectionClosed, match="max_connections = 4"):
            minou.connect_sync(broker.url, **broker.auth("app-late"))
        refused = Http(broker)
        code, headers, body = refused.get()
        assert code == 503 and headers["connection"] == "close" and headers["retry-after"]
        assert error_of(body)["reason"] == "too_many_connections"
        assert error_of(body)["detail"] == {"limit": 4}
        assert refused.closed_by_peer()
        refused.close()
        for path, extra in (("/v1/ws", {}), ("/v1/stream", stream_headers)):
            with pytest.raises(InvalidStatus) as info, \
                    wsc.connect(ws_base + path, additional_headers=extra):
                pass
            assert info.value.response.status_code == 503

        # Those connected carry on, each on its own connection.
        assert admin.send("lim/v1/1", {"n": 1}).seq == 1
        message = json.loads(stream.recv(5))
        assert message["type"] == "message" and message["payload"] == {"n": 1}
        code, _, body = keep_alive.response()  # the long poll got it too
        assert code == 200 and json.loads(body)["payload"] == {"n": 1}
        native_ws.send(f.encode(f.Ping(7)))
        assert frame_of(native_ws.recv(5)) == f.Pong(7)

        st = admin.admin("status")
        assert st["admission"]["refused"] == {"native": 2, "http": 3, "resp": 0, "client": 0}
        assert st["counters"]["refused"]["too_many_connections"] == 5
        assert len(re.findall(r"native connection from 127\.0\.0\.1:\d+ refused: 4 "
                              r"connections open \(max_connections = 4\)",
                              broker.output)) == 2
        assert len(re.findall(r"HTTP connection from 127\.0\.0\.1:\d+ refused",
                              broker.output)) == 3

        # A connection that leaves gives its place back, whichever kind takes it.
        stream.close()
        wait_until(lambda: admin.admin("status")["admission"]["open"]["http"] == 2,
                   what="the stream's socket to leave the count")
        with wsc.connect(ws_base + "/v1/ws") as again:
            again.send(f.encode(signed_hello("app-ws-2")))
            assert isinstance(frame_of(again.recv(5)), f.Welcome)


def test_idle_sockets_are_cut_and_the_limit_frees_up(broker_factory, tmp_path):
    broker = limited(broker_factory, tmp_path,
                     "max_connections = 3\nhttp_header_timeout = 1.0\n")
    idle = [Http(broker) for _ in range(3)]  # connect, say nothing
    over = Http(broker)  # accepted after them (one listener accepts in order): refused
    assert over.get()[0] == 503
    over.close()
    late = RawPeer(broker.url)
    assert late.read().code == ErrorCode.TOO_MANY_CONNECTIONS  # type: ignore[attr-defined]
    late.close()
    for sock in idle:
        assert sock.closed_by_peer(timeout=10)
        sock.close()

    def connects() -> bool:
        try:
            with minou.connect_sync(broker.url, **broker.auth("app-after")) as client:
                return bool(client.send("back/v1/1", {"ok": True}).seq)
        except ConnectionClosed:
            return False

    wait_until(connects, timeout=10, what="a native client to be admitted again")
    back = Http(broker)
    assert back.get()[0] == 200
    back.close()


# --------------------------------------------------------- file descriptors
def assert_native_refused(broker: Any, limit: int, descriptors: int) -> None:
    """A native client past the limit is refused at once, the cap and its cause named."""
    late = RawPeer(broker.url)
    err = late.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.TOO_MANY_CONNECTIONS
    assert (f"capped to {limit} by the process's {descriptors} file descriptors"
            in err.message)
    late.close()


def test_the_limit_derives_from_the_descriptor_limit_and_holds_it(broker_factory, tmp_path,
                                                                  monkeypatch):
    """The reported case, scaled down: a process with few descriptors, flooded with idle
    sockets, refuses what it cannot take (instead of failing accept() and resetting),
    keeps its descriptors, and is whole again once the idle sockets are cut."""
    soft, hard = 200, 300
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < hard + 100:
        pytest.skip("this test needs a hard descriptor limit above 400")
    popen = subprocess.Popen

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    monkeypatch.setattr(subprocess, "Popen",
                        lambda *a, **kw: popen(*a, preexec_fn=low_limit, **kw))
    broker = limited(broker_factory, tmp_path, "http_header_timeout = 2.0\n")
    monkeypatch.undo()
    limit = hard - 64 - 64  # FD_RESERVED and MAX_REFUSING set aside
    assert (f"  limits  {limit} connections, native + HTTP + WebSocket (file descriptors: "
            f"{hard}, raised from {soft}; max_connections 10000 is capped by them"
            in broker.output)

    flood = [Http(broker) for _ in range(limit)]  # idle: they say nothing
    try:
        for _ in range(40):  # 40 more, accepted after those (one listener keeps the order)
            over = Http(broker)
            flood.append(over)
            assert over.get()[0] == 503
        assert_native_refused(broker, limit, hard)
        assert broker.proc is not None
        assert len(os.listdir(f"/proc/{broker.proc.pid}/fd")) < hard - 20
        for sock in flood:
            assert sock.closed_by_peer(timeout=10)
    finally:
        for sock in flood:
            sock.close()

    def healthy() -> bool:
        probe = Http(broker)
        try:
            return probe.get()[0] == 200
        finally:
            probe.close()

    wait_until(healthy, timeout=10, what="/health to answer again")
    st = status(broker)
    assert st["admission"]["descriptors"] == hard and st["admission"]["limit"] == limit
    assert st["admission"]["refused"]["http"] >= 40
    assert "Too many open files" not in broker.output
    assert "out of system resource" not in broker.output

    # An operator lowers the limit under the running broker (prlimit --nofile): the next
    # sockets are counted against what the process may hold now, and a native client
    # is refused at once instead of waiting in the backlog for an accept() that fails.
    lowered = 200
    resource.prlimit(broker.proc.pid, resource.RLIMIT_NOFILE, (lowered, hard))
    fewer = lowered - 64 - 64
    flood = [Http(broker) for _ in range(fewer - 1)]
    try:
        last = Http(broker)  # answered: those before it were taken in (one listener's order)
        flood.append(last)
        assert last.get()[0] == 200
        assert_native_refused(broker, fewer, lowered)
    finally:
        for sock in flood:
            sock.close()
    assert "out of system resource" not in broker.output


def test_timeouts_must_be_positive(tmp_path):
    for key in ("http_header_timeout", "http_idle_timeout"):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(f"{key} = 0\n")
        with pytest.raises(ConfigError, match=f"{key}: expected a number of seconds > 0"):
            load_settings(cfg)


def test_at_the_limit_sockets_not_logged_in_give_their_place_to_new_ones(broker_factory,
                                                                        tmp_path):
    """Strangers who connect and say nothing (or an idle keep-alive HTTP connection) no
    longer keep clients out at max_connections: once idle for EVICT_MIN_IDLE_S, the
    oldest gives its place to the new socket, a stranger with a precise error. Logged-in
    connections never do, and a socket that just connected is not pushed out."""
    broker = limited(broker_factory, tmp_path, "max_connections = 5\n")
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    keep_alive = Http(broker)
    assert keep_alive.get()[0] == 200  # then idle between requests
    strangers = [RawPeer(broker.url), RawPeer(broker.url)]
    opened = contextlib.ExitStack()
    silent_ws = opened.enter_context(
        wsc.connect(broker.http.replace("http://", "ws://") + "/v1/ws", close_timeout=0.5))
    wait_until(lambda: sum(admin.admin("status")["admission"]["open"].values()) == 5,
               what="the limit reached")
    time.sleep(1.2)  # EVICT_MIN_IDLE_S
    clients = [minou.connect_sync(broker.url, **broker.auth("newcomer"))]
    assert keep_alive.closed_by_peer(timeout=5)  # the oldest idle one went first
    for stranger in strangers:
        clients.append(minou.connect_sync(broker.url, **broker.auth("newcomer")))
        err = stranger.read()
        assert isinstance(err, f.Error) and err.fatal
        assert err.code == ErrorCode.TOO_MANY_CONNECTIONS
        assert "had not said HELLO within 1 s: its place went to a new connection" in \
            err.message
    clients.append(minou.connect_sync(broker.url, **broker.auth("newcomer")))
    err = FrameReader()
    err.receive_data(silent_ws.recv(timeout=5))  # a WebSocket without HELLO: the same
    assert err.next_event().code == ErrorCode.TOO_MANY_CONNECTIONS  # type: ignore[union-attr]
    opened.close()
    # Every place is now a logged-in client's: the next one is refused.
    with pytest.raises(ConnectionClosed, match="connections"):
        minou.connect_sync(broker.url, **broker.auth("late"),
                           reconnect=False)
    # A socket that has just connected is not pushed out by the next.
    clients.pop().close()
    wait_until(lambda: sum(admin.admin("status")["admission"]["open"].values()) == 4,
               what="a place free again")
    young = RawPeer(broker.url)
    with pytest.raises(ConnectionClosed, match="connections"):
        minou.connect_sync(broker.url, **broker.auth("late"),
                           reconnect=False)
    admission = admin.admin("status")["admission"]
    assert admission["evicted"] == 4
    young.hello("late")  # still there, and may log in
    for c in clients:
        c.close()
    admin.close()
    keep_alive.close()
    young.close()
    for stranger in strangers:
        stranger.close()
