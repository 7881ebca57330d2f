"""How Redis stream keys, ids and entries map onto channels and messages (no I/O)."""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minou.protocol.resp import encode
from minou.protocol.resp_streams import (
    BINARY,
    ENTRY_HEADER,
    FIELDS,
    StreamIdError,
    StreamKeyError,
    channel_to_key,
    encoded_entry,
    encoded_id,
    encoded_message,
    entry_to_message,
    exact_seq,
    format_id,
    id_of,
    key_to_channel,
    message_to_entry,
    parse_id,
    stream_pattern,
)


def test_a_channel_name_is_itself_any_other_key_lives_under_redis_v1() -> None:
    assert key_to_channel(b"orders/v1/eu") == "orders/v1/eu"
    assert key_to_channel(b"mystream") == "redis/v1/mystream"
    assert key_to_channel(b"app:events") == "redis/v1/app:events"
    assert key_to_channel(b"a b/c") == "redis/v1/a%20b%2Fc"
    assert key_to_channel(b"\xff\x00") == "redis/v1/%FF%00"
    assert key_to_channel(b"orders/v1/x/*") == "redis/v1/orders%2Fv1%2Fx%2F%2A"  # no pattern
    with pytest.raises(StreamKeyError, match="may not be empty"):
        key_to_channel(b"")
    with pytest.raises(StreamKeyError, match="limit"):
        key_to_channel(b"x" * 5000)


@given(st.binary(min_size=1, max_size=60))
def test_every_key_comes_back_as_it_was_named(key: bytes) -> None:
    assume(stream_pattern(key) is None)  # a pattern names streams, not one (XREAD)
    assert channel_to_key(key_to_channel(key)) == key


def test_entries_map_to_what_other_interfaces_read() -> None:
    assert entry_to_message([b"payload", b'{"n": 1}']) == (b'{"n": 1}', False, {})
    data, raw, headers = entry_to_message([b"payload", b"not json"])
    assert not raw and msgspec.json.decode(data) == {"payload": "not json"}
    assert headers == {ENTRY_HEADER: FIELDS}
    data, raw, headers = entry_to_message([b"b", b"1", b"a", b"2"])
    assert data == b'{"b":"1","a":"2"}' and not raw  # in field order
    for binary in ([b"bin", b"\xff"], [b"a", b"1", b"a", b"2"], [b"\xff", b"x"]):
        data, raw, headers = entry_to_message(binary)
        assert raw and headers == {ENTRY_HEADER: BINARY,
                                   "content-type": "application/vnd.minou.resp-entry+msgpack"}
        assert msgspec.msgpack.decode(data) == binary
    # only the header makes a body fields: the same bytes without it are a payload
    fields_body, _, _ = entry_to_message([b"a", b"b"])
    assert message_to_entry(fields_body, False, None) == [b"payload", fields_body]
    binary_body, _, _ = entry_to_message([b"a", b"\xff"])
    assert message_to_entry(binary_body, True, None) == [b"payload", binary_body]
    not_bytes = msgspec.msgpack.encode([1, 2])
    assert message_to_entry(not_bytes, True, {ENTRY_HEADER: BINARY}) == [b"payload", not_bytes]
    # what another interface published reads as one field: payload
    assert message_to_entry(b'{"n":1}', False, None) == [b"payload", b'{"n":1}']
    assert message_to_entry(b"\x00\x01", True, {}) == [b"payload", b"\x00\x01"]
    # a header that lies about the body: still readable, as the payload
    assert message_to_entry(b"[1]", False, {ENTRY_HEADER: FIELDS}) == [b"payload", b"[1]"]
    assert message_to_entry(b"\x93", True, {ENTRY_HEADER: BINARY}) == [b"payload", b"\x93"]


@settings(max_examples=300)
@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=20)), min_size=1,
                max_size=6))
def test_any_entry_round_trips_byte_for_byte(pairs: list[tuple[bytes, bytes]]) -> None:
    fields = [x for pair in pairs for x in pair]
    data, raw, headers = entry_to_message(fields)
    assert message_to_entry(data, raw, headers) == fields


def test_ids_are_seqs_and_ranges_read_as_redis_does() -> None:
    assert format_id(42) == b"42-0"
    assert parse_id(b"-", high=False) == 1
    assert parse_id(b"+", high=True) == 2 ** 63 - 1
    assert parse_id(b"5", high=False) == 5 and parse_id(b"5-0", high=False) == 5
    assert parse_id(b"5-3", high=False) == 6  # after 5-0
    assert parse_id(b"5-3", high=True) == 5
    # "(5" as the end is "before 5-<max>" (Redis completes it, then steps back): 5-0 is in
    assert parse_id(b"(5-0", high=False) == 6 and parse_id(b"(5", high=True) == 5
    assert parse_id(b"(5-0", high=True) == 4 and parse_id(b"(5", high=False) == 6
    assert parse_id(b"(5-3", high=False) == 6 and parse_id(b"(5-3", high=True) == 5
    assert parse_id(b"(5-1", high=True) == 5  # 5-0 is below 5-1
    for bad in (b"x", b"5-x", b"(-", b"(+", b"", b"-5"):
        with pytest.raises(StreamIdError) as err:
            parse_id(bad, high=False)
        assert str(err.value) == "Invalid stream ID specified as stream command argument"


def test_a_wildcard_key_is_a_pattern_and_names_no_single_stream() -> None:
    from minou.protocol.resp_streams import StreamKeyError, key_to_channel, stream_pattern

    for key in (b"orders/v1/*", b"orders/*", b"_dead/orders/v1/*"):
        pattern = stream_pattern(key)
        assert pattern is not None and pattern.text == key.decode() and not pattern.concrete
        with pytest.raises(StreamKeyError, match="is a pattern"):
            key_to_channel(key)
    for key in (b"orders/v1/eu", b"jobs", b"a*", b"/*", b"orders/v1/x/*", b"\xff/*"):
        assert stream_pattern(key) is None
    assert key_to_channel(b"a*").startswith("redis/v1/")  # a plain key with a star


@settings(max_examples=300)
@given(st.lists(st.one_of(st.integers(0, 10**18).map(lambda n: b"%d-0" % n),
                          st.sampled_from([b"1-0 2-0", b"", b"05-0", b"7", b"3-1", b"(4-0",
                                           b"-", b"+", b"x-0", b"1-00", b" 1-0"])),
                min_size=1, max_size=8))
def test_xacks_ids_read_fast_as_exact_seq_reads_them(values: list[bytes]) -> None:
    """XACK's ids are read at C speed when they are all minou's (<seq>-0): the same
    seqs as exact_seq (-1 for an id no entry has), and its error for any other."""
    from minou.limits import MAX_FROM_SEQ
    from minou.server.resp import _ids

    try:
        want: list[int] | str = [-1 if (s := exact_seq(v, None)) is None or s > MAX_FROM_SEQ
                                 else s for v in values]
    except StreamIdError as exc:
        want = str(exc)
    try:
        got: list[int] | str = _ids(values, None)
    except StreamIdError as exc:
        got = str(exc)
    assert got == want


id_texts = st.builds(
    lambda ex, ms, n: (b"(" if ex else b"") + b"%d" % ms + (b"" if n is None else b"-%d" % n),
    st.booleans(), st.integers(0, 2000), st.one_of(st.none(), st.integers(0, 4)))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 400), st.integers(0, 3)),
                max_size=8), st.lists(id_texts, min_size=1, max_size=6))
def test_range_bounds_and_exact_ids_follow_the_streams_own_ids(
        points: list[tuple[int, int, int]], texts: list[bytes]) -> None:
    """With explicit ids (core/stream_ids.py) or without, a bound is the first (last)
    seq whose id is at or above (below) the id given, as a scan over the ids finds it."""
    from minou.core.stream_ids import SEQ_BITS, StreamIds, make_id
    from minou.errors import BadRequest

    ids = StreamIds()
    seq = 0
    for gap, dms, n in points:  # explicit ids above the top, some seqs apart
        seq += gap + 1
        top = ids.id_of(seq - 1)
        with contextlib.suppress(BadRequest):  # not above the top: no point
            ids.assign(seq, (top >> SEQ_BITS) + dms, n)
    end = seq + 2500
    model = [ids.id_of(s) for s in range(end)]
    for text in texts:
        body = text.lstrip(b"(")
        ms, _, n = body.partition(b"-")
        exclusive = text.startswith(b"(")
        low_id = make_id(int(ms), int(n) if n else 0) + (1 if exclusive else 0)
        high_id = make_id(int(ms), int(n) if n else (1 << 64) - 1) - (1 if exclusive else 0)
        if high_id < 0:  # "(0-0" as an end: nothing is below it
            with pytest.raises(StreamIdError):
                parse_id(text, high=True, ids=ids)
            high_id = None
        for table in (ids, None):
            ids_of = model if table is ids else [s << SEQ_BITS for s in range(end)]
            low = next(s for s in range(1, end) if ids_of[s] >= low_id)
            high = max((s for s in range(end) if high_id is not None
                        and ids_of[s] <= high_id), default=0)
            assert parse_id(text, high=False, ids=table) == low
            if high_id is not None:
                assert parse_id(text, high=True, ids=table) == high
        if not exclusive:
            want = make_id(int(ms), int(n) if n else 0)
            found = next((s for s in range(1, end) if model[s] == want), None)
            assert exact_seq(body, ids) == found
            assert exact_seq(body, None) == (int(ms) if not n or int(n) == 0 else None)
    assert [id_of(s, ids) for s in range(1, 5)] == [ids.text(s) for s in range(1, 5)]
    assert id_of(7, None) == b"7-0"


def test_a_stream_key_too_long_is_shown_as_text_cut_short() -> None:
    with pytest.raises(StreamKeyError) as refused:
        key_to_channel(b"s" * 1009)
    message = str(refused.value)
    assert message.startswith("stream key 'ssss") and "...': channel name is" in message
    assert "b'" not in message  # (a Python bytes literal before)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=20)), min_size=1,
                max_size=6),
       st.integers(min_value=1, max_value=2 ** 63 - 1),
       st.one_of(st.none(), st.binary(min_size=3, max_size=24)))
def test_an_entry_reads_in_resp_as_its_id_and_fields(
        pairs: list[tuple[bytes, bytes]], seq: int, sid: bytes | None) -> None:
    # XREAD/XREADGROUP/XADD write these bytes straight to the socket: a client must read
    # exactly what the general encoder would have sent for [id, [field, value, ...]].
    fields = [x for pair in pairs for x in pair]
    data, raw, headers = entry_to_message(fields)
    entry_id = format_id(seq) if sid is None else sid
    assert encoded_message(seq, data, raw, headers, sid) == encode([entry_id, fields])
    assert encoded_entry(seq, fields, sid) == encode([entry_id, fields])
    assert encoded_id(seq) == encode(format_id(seq))


def test_a_message_from_another_interface_reads_in_resp_as_its_payload() -> None:
    cases: list[tuple[bytes, bool, dict[str, str] | None]] = [
        (b'{"n":1}', False, None),
        (b"\x00\x01", True, {}),
        (b"[1]", False, {ENTRY_HEADER: FIELDS}),  # a header that lies about the body
        (b'{"a":"b"}', True, {ENTRY_HEADER: FIELDS}),  # fields, but a raw body
        ('{"é":"ü"}'.encode(), False, {ENTRY_HEADER: FIELDS}),  # lengths in bytes
    ]
    for data, raw, headers in cases:
        fields = message_to_entry(data, raw, headers)
        for seq in (1, 9, 10, 123456):
            assert encoded_message(seq, data, raw, headers) == \
                encode([format_id(seq), fields])
        assert encoded_message(7, data, raw, headers, b"7-5") == encode([b"7-5", fields])


def test_both_parts_of_an_id_are_unsigned_64_bit_as_in_redis() -> None:
    top = 2 ** 64 - 1
    assert parse_id(b"5-%d" % top, high=True) == 5
    assert parse_id(b"(%d-%d" % (top, top - 1), high=False) == 2 ** 63 - 1  # the last id
    assert exact_seq(b"5-%d" % top, None) is None  # an id, but no entry's: n is not 0
    assert exact_seq(b"%d" % (2 ** 63 - 1), None) == 2 ** 63 - 1
    assert exact_seq(b"%d" % 2 ** 63, None) is None
    for bad in (b"5-%d" % (top + 1), b"%d-0" % (top + 1), b"(%d-%d" % (top, top)):
        with pytest.raises(StreamIdError):
            parse_id(bad, high=False)
    for bad in (b"5-%d" % (top + 1), b"%d" % (top + 1)):
        with pytest.raises(StreamIdError):
            exact_seq(bad, None)
