"""Fuzzing the HTTP listener with raw bytes over a socket: malformed request lines,
odd and oversized headers, chunked bodies right and wrong, hostile query values and
bodies, on the routes of the fast path (publish, batch, consume, ack, nack) and the
others.

Each example is one connection: a few requests, then a well-formed ``GET /health``
with ``connection: close``. The answers are read until the broker closes, or for
a short while (a request that promised more body than it sent keeps the
connection waiting, which is fine).
"""

from __future__ import annotations

import socket
import time
from typing import Any
from urllib.parse import quote

from hypothesis import given
from hypothesis import strategies as st

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..protocol.strategies import json_like
from .conftest import FUZZ, Watched, bearer

READ_FOR_S = 0.5
text = st.text(max_size=12)
ascii_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.~", min_size=1,
                      max_size=12)

_paths = st.sampled_from([
    "/v1/messages/calm/v1/1", "/v1/messages/orders/v1/1", "/v1/messages", "/v1/messages/calm/v1/*",
    "/v1/consume/calm/v1/1", "/v1/consume/_dead/calm/v1/1", "/v1/consume/calm/v1/*",
    "/v1/ack/1.1", "/v1/nack/1.1", "/v1/ack/", "/v1/ack/x.y.z", "/v1/messages/a/v1/a%2Fb",
    "/v1/queues", "/v1/queues/calm/v1", "/v1/queues/_dead/calm/v1",
    "/v1/queues/calm/v1/1/messages", "/v1/queues/calm/v1/purge", "/v1/dead/calm/v1/requeue",
    "/v1/groups/g", "/v1/status", "/v1/whoami", "/v1/rates/history", "/v1/clients",
    "/v1/clients/someone/approve", "/v1/clients/someone/rotate",
    "/v1/reservations/calm/v1/1/release", "/v1/messages/0123456789abcdef1/receipt",
    "/metrics", "/statistics", "/health", "/openapi.json", "/status/nagios/calm/v1",
    "/status/queues/calm/v1/1", "/", "/index.html", "/../../etc/passwd", "/v1/stream",
    "/v1/ws", "/v1", "/v1/messages/calm/v1/1/x/y",
])
_wild_paths = st.sampled_from(["*", "http://x/v1/whoami", "", "/v1/\u00e9", "/a b", "/\x00"])
_segments = st.sampled_from(["%", "%zz", "%00", "%ff", "%2F", "..", "", "*", "a" * 3000,
                             "%C3%28", ";", "~"]) | ascii_token
_wild_segments = st.sampled_from(["\u00e9", "?", "#", " ", "\t", "\x7f"])


@st.composite
def paths(draw: Any, wild: bool) -> str:
    path = draw(_paths | _wild_paths if wild else _paths)
    if path.startswith("/") and draw(st.booleans()):
        parts = path.split("/")
        i = min(draw(st.integers(1, max(1, len(parts) - 1))), len(parts) - 1)
        parts[i] = draw(_segments | _wild_segments if wild else _segments)
        path = "/".join(parts)
    return path


_query_keys = st.sampled_from(["payload", "priority", "ttl", "delay", "dedup", "key", "wait",
                               "lease", "group", "front", "from_seq", "limit", "channel",
                               "queue", "minutes", "access_token", "force"]) | text
_query_values = st.sampled_from(["", "NaN", "nan", "inf", "-inf", "-1", "1e999", "9" * 5000,
                                 "1", "0", "0.01", "true", "%ff", "%00", "a%2Fb", "%",
                                 "[[[[[[", "%C3%A9", "x" * 300, "1_0", "%D9%A1",
                                 "%5B" * 100]) | text


@st.composite
def queries(draw: Any, wild: bool) -> str:
    pairs = draw(st.lists(st.tuples(_query_keys, _query_values), max_size=4))
    if not pairs:
        return ""
    escape = (lambda v: v) if wild else (lambda v: quote(v, safe="%=&"))
    return "?" + "&".join(f"{escape(k)}={escape(v)}" for k, v in pairs)


deep_or_bad = st.sampled_from([
    b"[" * 3000, b"[" * 65 + b"]" * 65, b'{"a":' * 1000 + b"1" + b"}" * 1000,
    b'"caf\xe9"', b"\xff\xfe", b'[{"channel": "calm/v1/1", "payload": "caf\xe9"}]',
    b'[{"channel": "calm/v1/1", "payload": ' + b"[" * 80 + b"]" * 80 + b"}]",
    b'[{"channel": "calm/v1/1", "payload": 1, "headers": {"a": 1}}]',
    b'[{"channel": "calm/v1/1", "payload": 1, "ttl": NaN, "priority": 99999999999999999999}]',
    b'[{"channel": "orders/v1/1", "payload": {"total": -1}}, {"channel": "x", "payload": 1}]',
    b'{"public_key": "' + b"A" * 5000 + b'"}', b'{"public_key": ' + b"[" * 70 + b"]" * 70 + b"}",
    b"[]", b"{}", b"null", b"NaN", b"",
])
bodies = deep_or_bad | json_like.map(repr).map(str.encode) | st.binary(max_size=200)


@st.composite
def chunked(draw: Any, body: bytes, wild: bool) -> bytes:
    """``body`` in chunks; when ``wild``, sometimes with a wrong size, an extension, a
    trailer, or no last chunk."""
    out = b""
    rest = body
    while rest:
        n = draw(st.integers(1, max(1, len(rest))))
        piece, rest = rest[:n], rest[n:]
        if not wild:
            out += b"%x\r\n" % n + piece + b"\r\n"
            continue
        size = draw(st.sampled_from([b"%x" % n, b"%X" % n, b"%x;ext=1" % n, b"%x" % (n + 1),
                                     b"zz", b"-1", b"ffffffffffffffffffff", b"%x " % n]))
        out += size + b"\r\n" + piece + draw(st.sampled_from([b"\r\n", b"\n", b"", b"\r\n\r\n"]))
    if not wild:
        return out + b"0\r\n\r\n"
    return out + draw(st.sampled_from([b"0\r\n\r\n", b"0\r\nx-trailer: 1\r\n\r\n", b"",
                                       b"0\r\n", b"1\r\n"]))


_header_names = st.sampled_from([
    "content-type", "expect", "connection", "upgrade", "x-minou-header-a", "x-minou-header-b",
    "sec-websocket-key", "sec-websocket-version", "x" * 300, "content-length", "accept",
    "transfer-encoding"]) | ascii_token
_header_values = st.sampled_from([
    "application/json", "100-continue", "close", "keep-alive", "upgrade", "websocket", "13",
    "v" * 9000, "\u00e9\u00e8", "", "text/plain; charset=latin-1", "*/*"]) | ascii_token
_wild_names = st.sampled_from(["bad header", ":", "x-minou-header-\u00e9", "a\tb", ""]) | text
_wild_values = st.sampled_from(["\t", "a\x00b", "a\r\nb", "\u2028"]) | text


@st.composite
def requests(draw: Any, tokens: dict[str, str]) -> bytes:
    """One request: usually well formed with hostile values (``wild`` False), sometimes
    broken anywhere."""
    wild = draw(st.sampled_from([False, False, True]))
    method = draw(st.sampled_from(["POST", "GET", "DELETE", "PUT", "HEAD", "OPTIONS"])
                  | (st.sampled_from(["G\x00T", "POST POST", "", "\u00e9"]) | ascii_token
                     if wild else st.nothing()))
    target = draw(paths(wild)) + draw(queries(wild))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0"])
                   | (st.sampled_from(["HTTP/2.0", "HTTP/1.1 x", "", "HTTP/9"])
                      if wild else st.nothing()))
    body = draw(bodies)
    headers: list[tuple[str, str]] = [("host", "x")]
    auth = draw(st.sampled_from([*tokens.values(), "Bearer", "Bearer x.y.z", "Basic YTpi", "",
                                 "Bearer " + "a" * 5000, None]))
    if auth is not None:
        headers.append(("authorization", auth))
    framings = ["length", "chunked"] + (["none", "wrong-length", "both"] if wild else [])
    framing = draw(st.sampled_from(framings))
    if framing in ("length", "both"):
        headers.append(("content-length", str(len(body))))
    if framing == "wrong-length":
        headers.append(("content-length", draw(st.sampled_from(
            ["-1", "abc", "99999999999999999999", str(len(body) + 1), " 1", "1, 1", "0x10"]))))
    if framing in ("chunked", "both"):
        headers.append(("transfer-encoding", draw(st.sampled_from(
            ["chunked", "gzip, chunked", "Chunked", "chunked, identity", "identity"]
            if wild else ["chunked"]))))
        body = draw(chunked(body, wild))
    names = _header_names | _wild_names if wild else _header_names
    values = _header_values | _wild_values if wild else _header_values
    headers += draw(st.lists(st.tuples(names, values), max_size=4))
    if draw(st.integers(0, 9)) == 9:
        headers += [(f"x-many-{i}", "y") for i in range(draw(st.integers(50, 300)))]
    head = f"{method} {target} {version}\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("utf-8", "surrogatepass") + body


SENTINEL = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"


def exchange(http_url: str, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; what the broker answers before it closes,
    or before READ_FOR_S passes."""
    host, port = http_url.removeprefix("http://").rsplit(":", 1)
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        try:
            sock.sendall(data)
            deadline = time.monotonic() + READ_FOR_S
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                chunk = sock.recv(1 << 16)
                if not chunk:
                    break
                answer += chunk
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass
    return answer


def test_http_raw_requests(fuzzed: Watched) -> None:
    b = fuzzed.broker
    admin_key = keyfiles.load_private(b.admin_key)
    tokens = {"user": bearer(b, "fuzz-http")["Authorization"],
              "admin": f"Bearer {make_token('admin', admin_key, 'minou', ttl=3000)}"}

    @FUZZ
    @given(st.lists(requests(tokens), min_size=1, max_size=3).map(b"".join))
    def run(data: bytes) -> None:
        answer = exchange(b.http, data + SENTINEL)
        assert not answer or answer.startswith(b"HTTP/1.1 "), answer[:200]
        assert b" 500 " not in answer, answer[:2000]
        fuzzed.check(data)

    run()
    fuzzed.serves_a_good_client()
