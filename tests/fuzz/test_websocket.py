"""Fuzzing the WebSocket endpoints over raw sockets: ``/v1/stream`` (JSON messages)
and ``/v1/ws`` (native frames in binary messages), with hostile messages and
malformed WebSocket frames (reserved bits, unknown opcodes, unmasked or lying
lengths, fragments left open, oversized control frames, text that is not UTF-8).

Each example is one connection: its frames, then a well-behaved request (a stream
publish, a native PING) whose answer is awaited until the broker closes the
socket, or for a short while.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import struct
import time
from itertools import count
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import signed_hello
from ..protocol.strategies import json_like, text
from .conftest import FUZZ, Watched, bearer
from .test_native import frames as native_frames
from .test_native import mutated, nasty_json

READ_FOR_S = 0.3  # the broker answers in milliseconds; a frame that lies waits
TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10
_clients = count()


def handshake(http_url: str, path: str, headers: dict[str, str]) -> socket.socket:
    host, port = http_url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  f"Sec-WebSocket-Version: 13\r\n{extra}\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, f"no handshake answer: {head!r}"
        head += chunk
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


def frame(payload: bytes, opcode: int, *, fin: bool = True, rsv: int = 0, mask: bool = True,
          length: int | None = None) -> bytes:
    """One client frame; ``length`` (when given) is what the header claims."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | rsv | opcode
    masked = 0x80 if mask else 0
    if n < 126:
        head = struct.pack("!BB", first, masked | n)
    elif n < 65536:
        head = struct.pack("!BBH", first, masked | 126, n)
    else:
        head = struct.pack("!BBQ", first, masked | 127, min(n, 2**63 - 1))
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


@st.composite
def frames_of(draw: Any, payload: bytes, opcode: int) -> bytes:
    """``payload`` as one frame, as fragments, or as a frame broken some way."""
    how = draw(st.sampled_from(["whole", "whole", "fragments", "broken"]))
    if how == "whole":
        return frame(payload, opcode)
    if how == "fragments":
        cut = draw(st.integers(0, len(payload)))
        last = draw(st.sampled_from([True, True, False]))  # sometimes never finished
        return (frame(payload[:cut], opcode, fin=False)
                + draw(st.sampled_from([b"", frame(b"", PING)]))  # control frames may interleave
                + frame(payload[cut:], 0, fin=last))
    return frame(payload, draw(st.sampled_from([opcode, 0, 3, 7, 11, 15, CLOSE, PING, PONG])),
                 fin=draw(st.booleans()), rsv=draw(st.sampled_from([0, 0x40, 0x20, 0x10])),
                 mask=draw(st.booleans()),
                 length=draw(st.sampled_from([None, None, len(payload) + 1, 126, 70_000,
                                              2**40])))


control_frames = st.one_of(
    st.builds(lambda p: frame(p, PING), st.binary(max_size=125)),
    st.builds(lambda p: frame(p, PONG), st.binary(max_size=125)),
    st.builds(lambda p: frame(p, PING), st.just(b"x" * 126)),  # too long for a control frame
    st.builds(lambda code, reason: frame(struct.pack("!H", code) + reason, CLOSE),
              st.sampled_from([1000, 1001, 999, 1004, 1005, 1006, 1015, 2999, 4000, 65535]),
              st.sampled_from([b"", b"bye", b"\xff\xfe", b"x" * 124])),
    st.just(frame(b"\x03", CLOSE)),  # a one-byte close payload
)

# /v1/stream: JSON messages with hostile fields, and text that is no JSON at all.
_ops = st.sampled_from(["publish", "consume", "listen", "ack", "nack", "unsubscribe", "nope"])
_anything = json_like | st.just([[[[[[]]]]]])
stream_messages = st.fixed_dictionaries(
    {"op": _ops | _anything},
    optional={
        "channel": st.sampled_from(["calm/v1/1", "orders/v1/1", "calm/v1/*", "x"]) | _anything,
        "payload": _anything | st.just({"total": -1}),
        "pattern": st.sampled_from(["calm/v1/*", "calm/*", "*", "_dead/calm/v1/1"]) | _anything,
        "group": text | _anything, "start": st.sampled_from(["oldest", "new", "seq:5", "seq:x"])
        | _anything, "name": text | _anything,
        "prefetch": st.integers(-5, 5000) | _anything,
        "receipt": st.sampled_from(["1.1", "x", "1.", ".1", "99999999999999999999.1",
                                    "\u0661.\u0661"]) | _anything,
        "delay": st.floats(-1e6, 1e308) | _anything, "front": _anything,
        "sid": st.integers(-(2**70), 2**70) | _anything,
        "priority": st.integers(-(2**70), 2**70) | _anything, "ref": _anything,
    },
).map(lambda m: json.dumps(m, default=repr).encode())
stream_texts = stream_messages | nasty_json | st.binary(max_size=80)


def read_until(sock: socket.socket, done: Any) -> bytes:
    """What the broker sends until ``done(data)``, the socket closes, or READ_FOR_S."""
    data = b""
    deadline = time.monotonic() + READ_FOR_S
    try:
        while not done(data) and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        pass
    return data


def send_all(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):
        sock.sendall(data)


def test_stream_messages_and_broken_websocket_frames(fuzzed: Watched) -> None:
    b = fuzzed.broker
    headers = bearer(b, "fuzz-stream")
    sentinel = json.dumps({"op": "publish", "channel": "calm/v1/9", "payload": 1,
                           "ref": "sentinel"}).encode()

    @FUZZ
    @given(st.lists(st.one_of(
        stream_texts.flatmap(lambda t: frames_of(t, 1)),
        stream_texts.flatmap(lambda t: frames_of(t, 2)),
        control_frames), min_size=1, max_size=6).map(b"".join))
    def run(data: bytes) -> None:
        with handshake(b.http, "/v1/stream", headers) as sock:
            send_all(sock, data + frame(sentinel, TEXT))
            read_until(sock, lambda got: b'"ref":"sentinel"' in got)
        fuzzed.check(data)

    run()
    fuzzed.serves_a_good_client()


def _pong(reader: FrameReader, req: int, data: bytes) -> bool:
    """Whether the native frames inside the server's WebSocket messages hold PONG(req)."""
    while len(data) >= 2:
        n = data[1] & 0x7F
        start = 2
        if n == 126:
            n, start = struct.unpack_from("!H", data, 2)[0], 4
        elif n == 127:
            n, start = struct.unpack_from("!Q", data, 2)[0], 10
        if len(data) < start + n:
            return False
        if data[0] & 0x0F == BINARY:
            reader.receive_data(data[start:start + n])
        data = data[start + n:]
    return any(ev == f.Pong(req) for ev in reader.events())


def test_native_frames_over_websocket(fuzzed: Watched) -> None:
    b = fuzzed.broker

    @FUZZ
    @given(st.lists(st.one_of(
        st.one_of(native_frames.map(f.encode), mutated()).flatmap(lambda d: frames_of(d, 2)),
        stream_texts.flatmap(lambda t: frames_of(t, 1)),  # text on /v1/ws: refused
        control_frames), min_size=1, max_size=6).map(b"".join))
    def run(data: bytes) -> None:
        client_id = f"fuzz-ws-{next(_clients) % 8}"
        with handshake(b.http, "/v1/ws", {}) as sock:
            send_all(sock, frame(f.encode(signed_hello(client_id)), BINARY) + data
                     + frame(f.encode(f.Ping(424242)), BINARY))
            reader = FrameReader()
            read_until(sock, lambda got: _pong(reader, 424242, got))
        fuzzed.check(data)

    run()
    fuzzed.serves_a_good_client()
