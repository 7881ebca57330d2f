"""Channel names and patterns (minou.names)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.errors import ErrorCode, InvalidChannel
from minou.limits import MAX_CHANNEL_LENGTH
from minou.names import (
    DEAD_PREFIX,
    Pattern,
    broadcast_prefix,
    dead_letter_channel,
    is_dead_letter,
    listen_group_key,
    parse_pattern,
    schema_key,
    validate_channel,
)

VALID = [
    "orders/v1/42",
    "orders-x_y/v12/a%2Fb",
    "_dead/orders/v1/1",
    "A-Z_0/v999999/x",
    "e/v1/._~!$&'()+,;=:@-",
    "e/v1/%c3%A9",  # é, encoded
    "e/v1/" + "a" * (MAX_CHANNEL_LENGTH - 5),  # exactly the limit
]


@pytest.mark.parametrize("name", VALID)
def test_valid_channels(name):
    assert validate_channel(name) == name


INVALID = [
    # (name, substrings of the message)
    ("", ["empty"]),
    ("orders/v1", ["'orders/v1'", "expected endpoint/version/id"]),
    ("orders", ["expected endpoint/version/id"]),
    ("orders/v1/a/b", ["expected endpoint/version/id", "%2F"]),
    ("_dead/orders/v1/a/b", ["expected endpoint/version/id", "%2F"]),
    ("ord ers/v1/1", ["endpoint 'ord ers'", "letters, digits, '-' or '_'"]),
    ("ord.ers/v1/1", ["endpoint 'ord.ers'"]),
    ("ordérs/v1/1", ["endpoint 'ordérs'"]),
    ("/v1/1", ["endpoint ''"]),
    ("orders/1/1", ["version '1'", "v1, v2"]),
    ("orders/v0/1", ["version 'v0'"]),
    ("orders/vx/1", ["version 'vx'"]),
    ("orders/V1/1", ["version 'V1'"]),
    ("orders/v01/1", ["version 'v01'"]),
    ("orders/v1234567/1", ["version 'v1234567'"]),
    ("orders//1", ["version ''"]),
    ("orders/v1/*", ["is a pattern, not a channel", "broadcast"]),
    ("orders/v1/a b", ["id 'a b'", "URL-encoded"]),
    ("orders/v1/é", ["id 'é'", "URL-encoded"]),
    ("orders/v1/", ["id after orders/v1/ is empty", "orders/v1/42"]),
    ("orders/v1/%", ["id '%'", "URL-encoded"]),
    ("orders/v1/%2", ["URL-encoded"]),
    ("orders/v1/%GG", ["URL-encoded"]),
    ("orders/v1/a?b", ["URL-encoded"]),
    ("orders/v1/a#b", ["URL-encoded"]),
    ("orders/v1/1\n", ["URL-encoded"]),
    (
        "e/v1/" + "a" * (MAX_CHANNEL_LENGTH - 4),
        ["256 characters", f"limit is {MAX_CHANNEL_LENGTH}"],
    ),
]


def _id(text: str) -> str:
    """A test id a command line can name again (mutmut runs tests by id): printable
    ASCII only."""
    return re.sub(r"[^!-~]", "_", text[:20]) or "empty"


@pytest.mark.parametrize("name, expected", INVALID, ids=[_id(n) for n, _ in INVALID])
def test_invalid_channels_say_what_is_wrong(name, expected):
    with pytest.raises(InvalidChannel) as info:
        validate_channel(name)
    err = info.value
    assert err.code == ErrorCode.INVALID_CHANNEL
    for part in expected:
        assert part in err.message
    assert "channel" in err.detail


def test_too_long_name_detail_is_truncated():
    name = "e/v1/" + "a" * 1000
    with pytest.raises(InvalidChannel) as info:
        validate_channel(name)
    assert info.value.detail["channel"] == name[:64]


def test_length_is_checked_before_shape():
    # A huge name is refused for its length without echoing it back in the message.
    name = "x" * 10_000
    with pytest.raises(InvalidChannel) as info:
        validate_channel(name)
    assert "10000 characters" in info.value.message
    assert len(info.value.message) < 200


@pytest.mark.parametrize("bad", [None, 42, b"orders/v1/1"])
def test_non_str_is_refused(bad):
    with pytest.raises(InvalidChannel):
        validate_channel(bad)


def test_validation_result_is_not_poisoned_by_the_cache():
    with pytest.raises(InvalidChannel):
        validate_channel("orders/v1/a b")
    with pytest.raises(InvalidChannel):  # the second call must still raise
        validate_channel("orders/v1/a b")


# -- dead letters ----------------------------------------------------------------------------


def test_dead_letter_helpers():
    assert dead_letter_channel("orders/v1/1") == "_dead/orders/v1/1"
    assert dead_letter_channel("_dead/orders/v1/1") == "_dead/orders/v1/1"  # no _dead/_dead
    assert is_dead_letter("_dead/orders/v1/1")
    assert not is_dead_letter("orders/v1/1")
    assert not is_dead_letter("_deadx/v1/1")


def test_dead_of_dead_is_not_a_channel():
    with pytest.raises(InvalidChannel):
        validate_channel("_dead/_dead/orders/v1/1")


def test_dead_letter_channel_of_a_valid_channel_is_valid():
    channel = "e/v1/" + "a" * (MAX_CHANNEL_LENGTH - 5)
    assert validate_channel(channel) == channel
    dead = dead_letter_channel(channel)
    assert validate_channel(dead) == dead


# -- patterns --------------------------------------------------------------------------------


def test_parse_concrete_pattern():
    p = parse_pattern("orders/v1/42")
    assert p == Pattern("orders/v1/42", "orders/v1/42", concrete=True)
    assert p.matches("orders/v1/42")
    assert not p.matches("orders/v1/421")  # not a prefix match
    assert not p.matches("orders/v1/4")
    assert not p.matches("_dead/orders/v1/42")


def test_parse_version_wildcard():
    p = parse_pattern("orders/v1/*")
    assert p == Pattern("orders/v1/*", "orders/v1/", concrete=False)
    assert p.matches("orders/v1/1")
    assert p.matches("orders/v1/a%2Fb")
    assert not p.matches("orders/v2/1")
    assert not p.matches("orders/v10/1")
    assert not p.matches("orders/v1")
    assert not p.matches("ordersX/v1/1")
    assert not p.matches("_dead/orders/v1/1")


def test_parse_endpoint_wildcard():
    p = parse_pattern("orders/*")
    assert p == Pattern("orders/*", "orders/", concrete=False)
    assert p.matches("orders/v1/1")
    assert p.matches("orders/v2/1")
    assert not p.matches("ordersX/v1/1")
    assert not p.matches("order/v1/1")
    assert not p.matches("_dead/orders/v1/1")
    assert not p.matches("x/orders/v1/1")


def test_parse_dead_letter_patterns():
    p = parse_pattern("_dead/orders/*")
    assert p.prefix == "_dead/orders/" and not p.concrete
    assert p.matches("_dead/orders/v1/1")
    assert not p.matches("orders/v1/1")
    q = parse_pattern("_dead/orders/v2/*")
    assert q.matches("_dead/orders/v2/9")
    assert not q.matches("_dead/orders/v1/9")
    assert parse_pattern("_dead/orders/v1/1").concrete


INVALID_PATTERNS = [
    ("", ["pattern is empty"]),
    ("*", ["invalid pattern '*'", "endpoint/version/*", "endpoint/*"]),
    ("orders", ["invalid pattern 'orders'", "expected endpoint/version/id"]),
    ("orders/v1/**", ["invalid pattern", "id '**'"]),
    ("orders/v1/a/b", ["invalid pattern", "%2F"]),
    ("orders/*/*", ["version '*'"]),
    ("orders/v0/*", ["version 'v0'"]),
    ("bad!/*", ["endpoint 'bad!'"]),
    ("bad!/v1/*", ["endpoint 'bad!'"]),
    ("*/v1/*", ["endpoint '*'"]),
    ("orders/v1/*/x", ["invalid pattern"]),
    ("orders/*x", ["invalid pattern"]),
]


@pytest.mark.parametrize("text, expected", INVALID_PATTERNS,
                         ids=[_id(t) for t, _ in INVALID_PATTERNS])
def test_invalid_patterns(text, expected):
    with pytest.raises(InvalidChannel) as info:
        parse_pattern(text)
    for part in expected:
        assert part in info.value.message
    assert info.value.detail["channel"] == text


# -- broadcast_prefix and schema_key ---------------------------------------------------------


@pytest.mark.parametrize(
    "target, prefix",
    [
        ("orders/v1/*", "orders/v1/"),
        ("_dead/orders/v3/*", "_dead/orders/v3/"),
        ("orders/v1/1", None),
        ("orders/*", None),  # only endpoint/version/* broadcasts
        ("orders/v1/a%2Fb", None),
    ],
)
def test_broadcast_prefix(target, prefix):
    assert broadcast_prefix(target) == prefix


@pytest.mark.parametrize("target", ["orders/v0/*", "bad!/v1/*", "orders/x/*"])
def test_broadcast_prefix_validates_what_it_accepts(target):
    with pytest.raises(InvalidChannel) as refused:
        broadcast_prefix(target)
    assert refused.value.detail == {"channel": target}  # the pattern as it was given


@pytest.mark.parametrize(
    "channel, key",
    [
        ("orders/v1/42", "orders/v1"),
        ("orders/v2/42", "orders/v2"),
        ("_dead/orders/v1/42", "orders/v1"),  # dead letters keep their schema
        ("orders-x_y/v12/a%2Fb", "orders-x_y/v12"),
    ],
)
def test_schema_key(channel, key):
    assert schema_key(channel) == key


# -- properties ------------------------------------------------------------------------------

endpoints = st.text(alphabet="ABCXYZabcxyz0123456789_-", min_size=1, max_size=30).filter(
    lambda e: e != "_dead"
)
versions = st.integers(1, 999_999).map(lambda n: f"v{n}")
_ID_CHARS = "AZaz09._~!$&'()+,;=:@-"
ids = st.lists(
    st.sampled_from(_ID_CHARS) | st.from_regex(r"%[0-9A-Fa-f]{2}", fullmatch=True),
    min_size=1,
    max_size=40,
).map("".join)
_FORBIDDEN = ' "#%<>?[\\]^`{|}\t\n*é€中\x00'


@settings(max_examples=300, deadline=None)
@given(endpoints, versions, ids, st.booleans())
def test_generated_channels_are_valid_and_match_their_patterns(e, v, i, dead):
    pre = DEAD_PREFIX if dead else ""
    channel = f"{pre}{e}/{v}/{i}"
    assert validate_channel(channel) == channel
    assert is_dead_letter(channel) is dead
    assert schema_key(channel) == f"{e}/{v}"

    assert parse_pattern(f"{pre}{e}/{v}/*").matches(channel)
    assert parse_pattern(f"{pre}{e}/*").matches(channel)
    assert parse_pattern(channel).matches(channel)
    assert broadcast_prefix(f"{pre}{e}/{v}/*") == f"{pre}{e}/{v}/"
    assert channel.startswith(broadcast_prefix(f"{pre}{e}/{v}/*"))

    # And the near misses do not match.
    other_pre = "" if dead else DEAD_PREFIX
    assert not parse_pattern(f"{other_pre}{e}/*").matches(channel)
    assert not parse_pattern(f"{pre}{e}x/*").matches(channel)
    other_v = "v2" if v == "v1" else "v1"
    assert not parse_pattern(f"{pre}{e}/{other_v}/*").matches(channel)
    assert not parse_pattern(f"{pre}{e}/{v}/{i}x").matches(channel)


@settings(max_examples=200, deadline=None)
@given(endpoints, versions, ids, st.sampled_from(_FORBIDDEN), st.data())
def test_a_forbidden_character_in_the_id_is_refused(e, v, i, bad, data):
    at = data.draw(st.integers(0, len(i)))
    ident = i[:at] + bad + i[at:]
    if bad == "%":
        # A % is only refused when it does not start an escape.
        ident = i[:at] + "%" + "g" + i[at:]
    channel = f"{e}/{v}/{ident}"
    with pytest.raises(InvalidChannel) as info:
        validate_channel(channel)
    assert "URL-encoded" in info.value.message


@settings(max_examples=200, deadline=None)
@given(endpoints, versions, ids, ids)
def test_a_slash_in_the_id_points_at_percent_2f(e, v, i, j):
    with pytest.raises(InvalidChannel) as info:
        validate_channel(f"{e}/{v}/{i}/{j}")
    assert "%2F" in info.value.message


@pytest.mark.parametrize(("client", "key"), [
    ("app-1", "listen:app-1:n"),  # the key older versions stored
    ("50%", "listen:50%25:n"),
    ("a:b", "listen:a%3Ab:n"),
    ("a%3Ab", "listen:a%253Ab:n"),  # not a:b's
])
def test_a_durable_listeners_key_escapes_its_client_id(client: str, key: str) -> None:
    """Stored keys: their form is kept across versions."""
    assert listen_group_key(client, "n") == key


def test_a_bad_bucket_name_is_refused_with_the_name_cut_to_80_characters():
    from minou.names import kv_channel

    assert kv_channel("a-Z_9") == "_kv/v1/a-Z_9"
    for bad, shown in (("bad name", "bad name"), ("b" * 65, "b" * 65), ("é" * 200, "é" * 80),
                       ("", "")):
        with pytest.raises(InvalidChannel) as info:
            kv_channel(bad)
        assert info.value.code == ErrorCode.INVALID_CHANNEL
        assert info.value.detail == {"channel": shown}
        assert str(info.value).startswith(f"invalid bucket {shown!r}: 1 to 64 letters")


def test_a_kv_key_is_1_to_max_key_length_characters_with_no_empty_segment():
    from minou.errors import BadRequest
    from minou.limits import MAX_KEY_LENGTH
    from minou.names import validate_kv_key

    assert validate_kv_key("a" * MAX_KEY_LENGTH) == "a" * MAX_KEY_LENGTH
    assert validate_kv_key("a/b.c:d@e=f_g-h") == "a/b.c:d@e=f_g-h"
    with pytest.raises(BadRequest) as info:
        validate_kv_key("a" * (MAX_KEY_LENGTH + 1))
    assert info.value.detail == {"limit": MAX_KEY_LENGTH}
    assert info.value.message == (f"KV key is {MAX_KEY_LENGTH + 1} characters, "
                                  f"the limit is {MAX_KEY_LENGTH}")
    for bad in ("a//b", "/a", "a b", "", 5, None):
        with pytest.raises(BadRequest) as info:
            validate_kv_key(bad)
        assert info.value.detail == {}, bad
