"""Client JSON: every way it can fail is an InvalidPayload naming the limit or the
reason; the depth measured on the bytes is the depth of the value."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.errors import BadRequest, InvalidPayload
from minou.limits import MAX_JSON_DEPTH
from minou.payloads import check_depth, check_json, decode_json, json_depth, repeated_key


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def depth_of(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


# Strings full of what a byte scan could mistake for structure.
tricky_text = st.text(alphabet='[]{}"\\ab\u00e9\u2028', max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | tricky_text
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_the_depth_of_the_bytes_is_the_depth_of_the_value(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert json_depth(text.encode()) == depth_of(value)
    assert json_depth(text) == depth_of(value)
    assert decode_json(text.encode()) == value


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1000, 200_000])
def test_too_deep_is_refused_with_the_limit(depth):
    for data in (nested(depth), nested(depth).decode(), b'{"a":' * depth + b"1" + b"}" * depth):
        with pytest.raises(InvalidPayload) as info:
            decode_json(data)
        assert info.value.message == (f"payload nests arrays and objects {depth} deep; the "
                                      f"limit is {MAX_JSON_DEPTH} (MAX_JSON_DEPTH)")
        assert info.value.detail == {"limit": MAX_JSON_DEPTH, "depth": depth}


def test_at_the_limit_is_fine_and_brackets_in_strings_do_not_count():
    assert depth_of(decode_json(nested(MAX_JSON_DEPTH))) == MAX_JSON_DEPTH
    assert decode_json(b'["' + b"[" * 500 + b'"]') == ["[" * 500]
    assert decode_json(b'["\\"' + b"[" * 500 + b'"]') == ['"' + "[" * 500]
    check_depth(b'[{"payload": ' + nested(MAX_JSON_DEPTH) + b"}]", outer=2)
    with pytest.raises(InvalidPayload, match=f"{MAX_JSON_DEPTH + 1} deep"):
        check_depth(b'[{"payload": ' + nested(MAX_JSON_DEPTH + 1) + b"}]", outer=2)


@pytest.mark.parametrize(("data", "message"), [
    (b'"caf\xe9"', "payload is not UTF-8 (JSON text is UTF-8): it holds byte 0xe9"),
    (b"\xff", "payload is not UTF-8 (JSON text is UTF-8): it holds byte 0xff"),
    ('"\ud800"', "payload is not UTF-8"),  # a lone surrogate in a str
    (b'{"a": 1', "payload is not valid JSON: Input data was truncated"),
    (b"", "payload is not valid JSON"),
])
def test_undecodable_text_is_an_invalid_payload(data, message):
    with pytest.raises(InvalidPayload) as info:
        check_json(data)
    assert message in info.value.message


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=100))
def test_nothing_but_invalid_payload_ever_comes_out(data):
    try:
        decode_json(data, what="body")
    except InvalidPayload as exc:
        assert exc.message.startswith("body ")


def test_a_request_that_is_no_json_may_be_a_bad_request():
    with pytest.raises(BadRequest, match="stream message is not valid JSON"):
        decode_json(b"not json", what="stream message", malformed=BadRequest)
    with pytest.raises(InvalidPayload, match="the limit is 64"):  # depth stays a payload's
        decode_json(nested(100), what="stream message", malformed=BadRequest)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_json_without_a_repeated_key_has_none_found(value, ascii_only):
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert repeated_key(text, decode_json(text)) is None


@settings(max_examples=300, deadline=None)
@given(json_values, tricky_text, st.booleans())
def test_a_key_repeated_anywhere_is_found(value, key, ascii_only):
    # The repeated key is put inside the value, in an object of its own at the end.
    inner = json.dumps({key: value}, ensure_ascii=ascii_only)
    twice = "{" + inner[1:-1] + ", " + inner[1:-1] + "}"
    text = json.dumps([value, "x"], ensure_ascii=ascii_only)[:-1] + ", " + twice + "]"
    assert repeated_key(text.encode(), decode_json(text.encode())) == key


def test_a_key_written_with_an_escape_is_the_same_key():
    text = b'{"amount": "DROP TABLE", "\\u0061mount": 1}'
    assert repeated_key(text, decode_json(text)) == "amount"
