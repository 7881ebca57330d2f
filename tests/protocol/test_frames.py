"""Frames round-trip through encode/decode_body and through FrameReader however the
bytes are cut up."""

from __future__ import annotations

import itertools
import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minou.limits import MAX_FRAME_SIZE
from minou.protocol import BadFrame, FrameReader, FrameType, decode_body, encode
from minou.protocol.frames import (
    FRAME_CLASSES,
    HEADER_SIZE,
    TYPE_OF,
    Admin,
    Bye,
    Hello,
    JsonText,
    Ping,
    Publish,
    Result,
    Send,
    Settled,
    Welcome,
    json_text_hook,
)

from .strategies import FRAME_STRATEGIES, frames

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
frame_lists = st.lists(frames, min_size=2, max_size=3)


def _concat(fs) -> tuple[bytes, list[int]]:
    """The frames' bytes back to back, and the offset where each frame ends."""
    out, ends = b"", []
    for f in fs:
        out += encode(f)
        ends.append(len(out))
    return out, ends


def _drain(reader: FrameReader) -> list:
    out = reader.events()
    assert reader.next_event() is None  # events() stopped because it ran out of bytes
    return out


# -- the frame table -------------------------------------------------------------------------


def test_every_frame_class_has_a_strategy():
    assert set(FRAME_STRATEGIES) == set(FRAME_CLASSES.values())


def test_frame_table_is_one_to_one_and_complete():
    assert set(FRAME_CLASSES) == set(FrameType)
    assert len(set(FRAME_CLASSES.values())) == len(FRAME_CLASSES)
    assert {cls: t for t, cls in FRAME_CLASSES.items()} == TYPE_OF


def test_frame_type_numbers_are_stable():
    # These numbers are the wire format: renumbering breaks every deployed peer.
    # fmt: off
    assert [(t.name, int(t)) for t in FrameType] == [
        ("HELLO", 1), ("WELCOME", 2), ("PUBLISH", 3), ("CONFIRM", 4), ("SUBSCRIBE", 5),
        ("UNSUBSCRIBE", 6), ("SUB_ADD", 7), ("SUB_REMOVE", 8), ("DELIVER", 9), ("ACK", 10),
        ("NACK", 11), ("EXTEND", 12), ("SETTLED", 13), ("READ", 14), ("READ_RESULT", 15),
        ("ADMIN", 16), ("RESULT", 17), ("ERROR", 18), ("PING", 19), ("PONG", 20), ("BYE", 21),
        ("STAGE", 22), ("TXN_COMMIT", 23), ("TXN_ABORT", 24), ("OFFSETS", 25), ("POSITION", 26),
        ("HEARTBEAT", 27),
    ]
    # fmt: on


# -- exact bytes -----------------------------------------------------------------------------


def test_golden_ping():
    # length 3 = type byte + fixarray(1) + fixint 7; type 19.
    assert encode(Ping(req=7)) == b"\x00\x00\x00\x03\x13\x91\x07"


def test_golden_hello_keeps_defaults_on_the_wire():
    # array_like, omit_defaults=False: every field is sent, in declaration order.
    # ... then heartbeat (a float64 0.0), producer_id ("") and credential (nil)
    body = b"\x99\xa1c\x01\xc0\xc0\xc0\xc0\xcb" + bytes(8) + b"\xa0\xc0"
    assert encode(Hello(client_id="c")) == len(body + b"x").to_bytes(4, "big") + b"\x01" + body


def test_golden_publish_nests_send_as_array():
    f = Publish(req=1, msgs=[Send(channel="o/v1/1", data=b"{}")])
    expected_body = msgspec.msgpack.encode(
        [1, [["o/v1/1", b"{}", False, None, 0, None, None, None, None, 0]]]
    )
    assert encode(f)[HEADER_SIZE:] == expected_body
    assert encode(f)[4] == FrameType.PUBLISH


def test_new_peer_with_more_trailing_fields_decodes_on_an_old_shape():
    # An old client reads a newer WELCOME (heartbeat, producer_id appended) unharmed.
    class OldWelcome(msgspec.Struct, array_like=True):
        broker_id: str
        version: int
        session: str
        max_message_size: int
        client_id: str = ""
        admin: bool = False

    new = encode(Welcome("b", 1, "s", 10, "c", False, 5.0, "00ff00ff00ff00ff"))
    assert msgspec.msgpack.decode(new[HEADER_SIZE:], type=OldWelcome) == OldWelcome(
        "b", 1, "s", 10, "c", False)


def test_old_peer_without_trailing_optional_fields_decodes_with_defaults():
    body = msgspec.msgpack.encode(["client"])
    assert decode_body(FrameType.HELLO, body) == Hello(client_id="client")
    assert decode_body(FrameType.BYE, msgspec.msgpack.encode([])) == Bye(reason="")
    body = msgspec.msgpack.encode([3, "list"])
    assert decode_body(FrameType.ADMIN, body) == Admin(req=3, op="list", args={})


def test_newer_peer_extra_trailing_fields_are_ignored():
    body = msgspec.msgpack.encode([7, "a field from a later version", 42])
    assert decode_body(FrameType.PING, body) == Ping(req=7)


def test_settled_failed_entries_round_trip_as_tuples():
    f = Settled(req=5, failed=[(1, 205, "unknown delivery tag"), (2, 300, "")])
    out = decode_body(FrameType.SETTLED, encode(f)[HEADER_SIZE:])
    assert out == f
    assert all(type(entry) is tuple for entry in out.failed)


# -- properties: one frame -------------------------------------------------------------------


@SETTINGS
@given(frames)
def test_encode_decode_round_trip(frame):
    data = encode(frame)
    length = int.from_bytes(data[:4], "big")
    assert length == len(data) - 4  # counts the type byte and the body
    assert data[4] == TYPE_OF[type(frame)]
    out = decode_body(data[4], data[HEADER_SIZE:])
    assert type(out) is type(frame)
    assert out == frame
    # decode_body accepts a memoryview too (the reader may hand one over).
    assert decode_body(data[4], memoryview(data)[HEADER_SIZE:]) == frame


@pytest.mark.parametrize("cls", list(FRAME_STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_each_frame_type_round_trips(cls, data):
    # The mixed strategy above could under-sample one type; this covers each one.
    frame = data.draw(FRAME_STRATEGIES[cls])
    raw = encode(frame)
    reader = FrameReader()
    reader.receive_data(raw)
    assert _drain(reader) == [frame]
    assert reader.buffered == 0


# -- properties: the reader ------------------------------------------------------------------


@SETTINGS
@given(frame_lists)
def test_reader_whole(fs):
    data, _ = _concat(fs)
    reader = FrameReader()
    reader.receive_data(data)
    assert reader.buffered == len(data)
    assert _drain(reader) == fs
    assert reader.buffered == 0


@settings(max_examples=100, deadline=None)
@given(frame_lists)
def test_reader_byte_by_byte(fs):
    data, ends = _concat(fs)
    reader = FrameReader()
    got = []
    for i in range(len(data)):
        reader.receive_data(data[i : i + 1])
        got += _drain(reader)
        # A frame comes out exactly when its last byte arrives, never earlier.
        done = sum(1 for end in ends if end <= i + 1)
        assert got == fs[:done]
        assert reader.buffered == i + 1 - (ends[done - 1] if done else 0)
    assert got == fs


@settings(max_examples=100, deadline=None)
@given(frame_lists)
def test_reader_every_split_point(fs):
    data, ends = _concat(fs)
    for i in range(len(data) + 1):
        reader = FrameReader()
        reader.receive_data(data[:i])
        first = _drain(reader)
        done = sum(1 for end in ends if end <= i)
        assert first == fs[:done], i
        reader.receive_data(data[i:])
        assert first + _drain(reader) == fs, i
        assert reader.buffered == 0


@SETTINGS
@given(frame_lists, st.data())
def test_reader_random_chunks(fs, data):
    raw, _ = _concat(fs)
    cuts = sorted(data.draw(st.sets(st.integers(0, len(raw)), max_size=10)))
    reader = FrameReader()
    got, prev = [], 0
    for cut in [*cuts, len(raw)]:
        reader.receive_data(raw[prev:cut])
        prev = cut
        got += _drain(reader)
    assert got == fs
    assert reader.buffered == 0


@SETTINGS
@given(frame_lists, frames, st.data())
def test_reader_trailing_partial_frame_stays_buffered(fs, last, data):
    raw, _ = _concat(fs)
    tail = encode(last)
    k = data.draw(st.integers(1, len(tail) - 1), label="partial bytes")
    reader = FrameReader()
    reader.receive_data(raw + tail[:k])
    assert _drain(reader) == fs
    assert reader.buffered == k
    assert reader.next_event() is None  # asking again changes nothing
    assert reader.buffered == k
    reader.receive_data(tail[k:])
    assert _drain(reader) == [last]
    assert reader.buffered == 0


# -- the buffer management -------------------------------------------------------------------


def test_reader_compacts_without_losing_bytes():
    # Over 64 KiB consumed with a partial frame pending exercises _compact's copy.
    small = [Ping(req=i) for i in range(12_000)]  # 7-8 bytes each: ~90 KiB
    big = Publish(req=1, msgs=[Send(channel="o/v1/1", data=bytes(range(256)) * 40)])
    raw_small = b"".join(encode(f) for f in small)
    raw_big = encode(big)
    reader = FrameReader()
    reader.receive_data(raw_small + raw_big[:100])
    assert _drain(reader) == small
    assert reader.buffered == 100
    got = []
    for i in range(100, len(raw_big), 333):
        assert got == []  # nothing before the last piece
        reader.receive_data(raw_big[i : i + 333])
        assert reader.buffered == min(i + 333, len(raw_big))
        got = _drain(reader)
    assert got == [big]
    assert reader.buffered == 0


def test_large_frame_in_small_pieces():
    big = Publish(
        req=9, msgs=[Send(channel=f"o/v1/{i}", data=bytes([i]) * 50_000) for i in range(10)]
    )
    raw = encode(big)
    assert len(raw) > 500_000
    reader = FrameReader()
    for i in range(0, len(raw), 4096):
        assert reader.next_event() is None
        reader.receive_data(raw[i : i + 4096])
    assert reader.buffered == len(raw)
    assert _drain(reader) == [big]
    assert reader.buffered == 0


def test_frame_of_exactly_the_limit_is_accepted():
    f = Bye(reason="x" * 50)
    raw = encode(f)
    limit = len(raw) - 4
    reader = FrameReader(max_frame_size=limit)
    reader.receive_data(raw + raw)
    assert _drain(reader) == [f, f]


def test_reader_accepts_bytearray_and_memoryview_input():
    raw = encode(Ping(req=1)) + encode(Ping(req=2))
    reader = FrameReader()
    reader.receive_data(bytearray(raw[:6]))
    reader.receive_data(memoryview(raw)[6:])
    assert _drain(reader) == [Ping(req=1), Ping(req=2)]


def test_default_limit_is_max_frame_size():
    reader = FrameReader()
    reader.receive_data(MAX_FRAME_SIZE.to_bytes(4, "big") + bytes([FrameType.PING]))
    assert reader.next_event() is None  # allowed: it just waits for the body
    assert reader.buffered == HEADER_SIZE


def test_no_bad_frames_from_good_input():
    raw = b"".join(encode(f) for f in (Hello(client_id="c"), Ping(req=1), Bye()))
    reader = FrameReader()
    reader.receive_data(raw)
    assert not any(isinstance(ev, BadFrame) for ev in _drain(reader))


def test_a_reader_that_always_holds_a_partial_frame_keeps_its_memory_bounded():
    """Consumed bytes are dropped once they dominate the buffer (and pass 64 KiB), even
    when no read ever ends on a frame boundary."""
    frames = [encode(Ping(req=i)) for i in range(60_000)]  # ~450 KiB
    raw = b"".join(frames)
    ends = set(itertools.accumulate(map(len, frames)))
    cuts = sorted({c + 1 if c in ends else c for c in range(1000, len(raw), 1000)})
    reader = FrameReader()
    got = peak = 0
    for lo, hi in itertools.pairwise([0, *cuts, len(raw)]):  # each ends inside a frame
        reader.receive_data(raw[lo:hi])
        got += len(_drain(reader))
        peak = max(peak, len(reader._buf))
    assert got == 60_000 and reader.buffered == 0
    assert peak <= 2 * 65536 + 2 * 1001


# -- JSON text kept as text (stored KV values) ------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@SETTINGS
@given(_json_values, st.sampled_from([b"", b" ", b"\n\t "]))
def test_json_text_is_the_value_in_a_frame_and_the_text_in_json(value, space):
    # As stored: whatever spacing and escapes the publisher used (decoding into Raw
    # trims only the outer spaces, as the broker does).
    text = space + json.dumps(value, indent=len(space) or None,
                              ensure_ascii=bool(space)).encode() + space
    raw = msgspec.json.decode(text, type=msgspec.Raw)
    held = JsonText(raw)
    assert encode(Result(7, {"value": held})) == encode(Result(7, {"value": value}))
    answer = msgspec.json.Encoder(enc_hook=json_text_hook).encode({"value": held})
    assert answer == b'{"value":' + bytes(raw) + b"}"
    assert msgspec.json.decode(answer) == {"value": value}


def test_encoding_json_text_leaves_the_garbage_collector_as_it_found_it():
    """The hook pauses collections while it converts a value (its tree is freed by
    reference counting): a frame encoded must not leave them off for the process."""
    import gc

    held = JsonText(msgspec.Raw(b'{"a": [1, 2, {"b": null}]}'))
    was = gc.isenabled()
    try:
        gc.enable()
        encode(Result(7, {"value": held}))
        assert gc.isenabled()
        gc.disable()
        encode(Result(7, {"value": held}))
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


def test_json_text_is_refused_by_an_encoder_without_the_hook():
    held = JsonText(msgspec.Raw(b"[1]"))
    with pytest.raises(TypeError):
        msgspec.json.encode({"value": held})  # never str() of it, never silently
    assert repr(held) == "JsonText(3 bytes)"


def test_the_hooks_refuse_other_types_as_msgspec_does():
    json_encode = msgspec.json.Encoder(enc_hook=json_text_hook).encode
    for enc in (json_encode, lambda v: encode(Result(1, v))):
        with pytest.raises(TypeError, match="Encoding objects of type object is unsupported"):
            enc({"x": object()})
