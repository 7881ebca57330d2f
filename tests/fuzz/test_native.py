"""Fuzzing the native listener: frames of every type with hostile field values,
mutated and truncated frames, and raw garbage, over TCP to a real broker.

An authenticated connection is reused while it lives: after each example a PING
must come back as a PONG, or the broker must have closed the connection after a
fatal error. Raw garbage (framing lost) goes over fresh connections of its own.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import signed_hello
from ..protocol.strategies import FRAME_STRATEGIES, json_like, text
from .conftest import FUZZ, Watched

# Field values past what a well-behaved client sends.
any_float = st.floats()  # NaN and the infinities too
any_int = st.integers(-(2**63), 2**64 - 1)
nasty_json = st.sampled_from([  # too deep, or not UTF-8
    b"[" * 3_000, b"[" * 65 + b"]" * 65, b"{\"a\":" * 1_500 + b"1" + b"}" * 1_500,
    b'"caf\xe9"', b"\xff\xfe", b'["\xc3"]',
]) | st.sampled_from([
    b"NaN", b"1e999", b"-" + b"9" * 4_400, b'"\\ud800"', b"", b"null", b'{"total": -1}',
    b'{"total": "1"}', b"[]" * 3, b"[" * 64 + b"]" * 64,
])
good_channels = st.sampled_from(["orders/v1/1", "calm/v1/1", "calm/v1/*", "_dead/x/v1/1",
                                 "a/v1/%2F"])
channels = good_channels | st.sampled_from(["calm/*", "a/v0/1", "a/v1/", "/v1/1",
                                            "a" * 300 + "/v1/1"]) | text
sends = st.builds(
    f.Send, channel=good_channels | channels, data=nasty_json | st.binary(max_size=64),
    raw=st.just(False) | st.booleans(),
    headers=st.none() | st.dictionaries(text, text, max_size=3)
    | st.just({str(i): "x" for i in range(70)}) | st.just({"k": "v" * 9000}),
    priority=any_int, ttl=st.none() | any_float, delay=st.none() | any_float,
    dedup=st.none() | text | st.just("d" * 300), key=st.none() | text | st.just("k" * 300),
)
patterns = channels | st.sampled_from(["*", "*/v1/*", "calm/v1/**", "_dead/*"])
ADMIN_OPS = ["status", "list", "whoami", "queue", "browse", "purge", "group.delete",
             "dead.requeue", "dead.purge", "receipt", "clients.list", "reservations.release",
             "nope"]
admin_args = st.dictionaries(
    st.sampled_from(["queue", "channel", "group", "limit", "from_seq", "id", "client_id",
                     "force", "writer_id"]) | text,
    json_like | any_float | st.just([[[[[]]]]]) | st.sampled_from(["calm/v1", "_dead/calm/v1",
                                                                    "calm/v1/1", "x/y/z/w"]),
    max_size=4)
hostile = {
    f.Publish: st.builds(f.Publish, req=any_int, msgs=st.lists(sends, min_size=1, max_size=4)),
    f.Stage: st.builds(f.Stage, req=any_int, txn=text, msgs=st.lists(sends, max_size=3)),
    f.Subscribe: st.builds(
        f.Subscribe, req=any_int, sid=any_int, kind=st.sampled_from(["listen", "consume"]) | text,
        patterns=st.lists(patterns, max_size=3), group=st.none() | text,
        start=st.sampled_from(["", "new", "oldest", "seq:", "seq:-1", "seq:1e9", "seq:NaN"])
        | any_int.map(lambda n: f"seq:{n}") | text,
        prefetch=any_int, lease=any_float, name=st.none() | text),
    f.Nack: st.builds(f.Nack, req=any_int, tags=st.lists(any_int, max_size=3), delay=any_float,
                      front=st.booleans()),
    f.Extend: st.builds(f.Extend, req=any_int, tags=st.lists(any_int, max_size=3),
                        seconds=any_float),
    f.Read: st.builds(f.Read, req=any_int, channel=channels, from_seq=any_int, limit=any_int,
                      to_seq=any_int),
    f.TxnCommit: st.builds(f.TxnCommit, req=any_int, writer_id=text, batch_id=any_int,
                           txns=st.lists(text, max_size=3)),
    f.Offsets: st.builds(f.Offsets, req=any_int, patterns=st.lists(patterns, max_size=4)),
    f.Position: st.builds(f.Position, req=any_int, group=text,
                          positions=st.dictionaries(channels, any_int, max_size=3)),
    f.SubAdd: st.builds(f.SubAdd, req=any_int, sid=any_int, pattern=patterns),
    f.Admin: st.builds(f.Admin, req=any_int, op=st.sampled_from(ADMIN_OPS), args=admin_args),
}
# Every frame type, well formed (tests/protocol/strategies.py), and the hostile ones,
# publishes most often (their payloads are decoded). No BYE: it would only end the
# connection the next examples reuse.
# (Hypothesis favours the first of several choices, and flattens nested one_of.)
_kinds = {"publish": hostile[f.Publish], "stage": hostile[f.Stage],
          "hostile": st.one_of(*hostile.values()),
          "any": st.one_of(*(s for t, s in FRAME_STRATEGIES.items() if t is not f.Bye))}
frames = st.sampled_from(list(_kinds)).flatmap(_kinds.__getitem__)


encoded = f.encode


@st.composite
def mutated(draw: Any) -> bytes:
    """A frame with a few bytes of its body changed, its length header intact."""
    raw = bytearray(encoded(draw(frames)))
    for _ in range(draw(st.integers(1, 4))):
        if len(raw) > f.HEADER_SIZE:
            raw[draw(st.integers(f.HEADER_SIZE, len(raw) - 1))] = draw(st.integers(0, 255))
    return bytes(raw)


def framed(body: bytes, frame_type: int) -> bytes:
    return struct.pack(">IB", len(body) + 1, frame_type) + body


# What one example sends on an authenticated connection: whole frames only.
well_framed = st.lists(
    st.one_of(frames.map(encoded), mutated(),
              st.builds(framed, st.binary(max_size=80),
                        st.integers(0, 255).filter(lambda t: t != f.FrameType.BYE))),
    min_size=1, max_size=6).map(b"".join)


class Session:
    """One authenticated native connection, reopened when the broker closes it."""

    def __init__(self, url: str, client_id: str, *, admin_key: Any = None) -> None:
        self.url, self.client_id, self.admin_key = url, client_id, admin_key
        self.sock: socket.socket | None = None
        self.reader = FrameReader()
        self.req = 1 << 40

    def open(self) -> None:
        host, port = self.url.removeprefix("minou://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.reader = FrameReader()
        if self.admin_key is not None:
            hello = f.Hello("admin", 1, make_token("admin", self.admin_key, "minou"))
        else:
            hello = signed_hello(self.client_id)
        self.sock.sendall(f.encode(hello))
        assert isinstance(self.next(), f.Welcome)

    def next(self) -> f.Frame | None:
        """The next frame from the broker, or None once it closed the connection."""
        assert self.sock is not None
        while (event := self.reader.next_event()) is None:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.reader.receive_data(data)
        assert not hasattr(event, "error"), f"the broker sent a bad frame: {event}"
        return event  # type: ignore[return-value]

    def send_and_ping(self, data: bytes) -> None:
        """Send ``data``, then a PING: a PONG must come (or a fatal error and the end)."""
        if self.sock is None:
            self.open()
        assert self.sock is not None
        self.req += 1
        try:
            self.sock.sendall(data + f.encode(f.Ping(self.req)))
        except (BrokenPipeError, ConnectionResetError):
            self.close()
            return
        fatal = False
        while (frame := self.next()) is not None:
            if frame == f.Pong(self.req):
                return
            if isinstance(frame, f.Error) and frame.fatal:
                fatal = True
        assert fatal, "the broker closed the connection without a fatal error"
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = None


def test_native_frames_with_hostile_fields(fuzzed: Watched) -> None:
    session = Session(fuzzed.broker.url, "fuzz-native")

    @FUZZ
    @given(well_framed)
    def run(data: bytes) -> None:
        session.send_and_ping(data)
        fuzzed.check(data)

    try:
        run()
    finally:
        session.close()
    fuzzed.serves_a_good_client()


def test_native_admin_operations_with_hostile_arguments(fuzzed: Watched) -> None:
    key = keyfiles.load_private(fuzzed.broker.admin_key)
    session = Session(fuzzed.broker.url, "admin", admin_key=key)

    @FUZZ
    @given(st.lists(hostile[f.Admin], min_size=1, max_size=4))
    def run(ops: list[f.Admin]) -> None:
        session.send_and_ping(b"".join(encoded(op) for op in ops))
        fuzzed.check(ops)

    try:
        run()
    finally:
        session.close()
    fuzzed.serves_a_good_client()


def garbage_connection(url: str, data: bytes, authenticate: bool) -> None:
    """A fresh connection that sends ``data`` (framing may be lost) and goes away."""
    host, port = url.removeprefix("minou://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        if authenticate:
            sock.sendall(f.encode(signed_hello("fuzz-garbage")))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):  # until the broker closes, or the timeout
                pass
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass


first_frames = st.one_of(
    FRAME_STRATEGIES[f.Hello].map(encoded),  # odd HELLOs, tokens and keys
    st.builds(lambda t: encoded(f.Hello("fuzz-garbage", 1, t)),
              st.text(max_size=60) | st.just("a.b.c") | st.just("x" * 5000)),
    st.binary(max_size=200),
    mutated(),
)


def test_native_garbage_on_fresh_connections(fuzzed: Watched) -> None:
    @FUZZ
    @given(st.lists(first_frames, min_size=1, max_size=4).map(b"".join), st.booleans())
    def run(data: bytes, authenticate: bool) -> None:
        garbage_connection(fuzzed.broker.url, data, authenticate)
        fuzzed.check(data)

    run()
    fuzzed.serves_a_good_client()
