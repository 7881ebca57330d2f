"""The RESP parser and encoder (no I/O): what clients send, split anywhere; what
Redis says to what it cannot read; every reply type in RESP2 and RESP3; fuzzed."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minou.protocol.resp import (
    MAX_INLINE,
    NULL_ARRAY,
    OK,
    Bool,
    Double,
    Encoded,
    Error,
    Map,
    NullArray,
    Push,
    RespParser,
    RespProtocolError,
    Set,
    Simple,
    Verbatim,
    encode,
    split_inline,
)


def command(*args: bytes) -> bytes:
    """A command as redis-py and every other library frame it."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def parse(data: bytes, max_bulk: int = 1 << 20) -> list[list[bytes]]:
    p = RespParser(max_bulk)
    out = p.feed(data)
    if p.error is not None:
        raise p.error
    return out


def test_commands_arrive_whole_pipelined_and_split_at_every_byte() -> None:
    wire = (command(b"HELLO", b"3") + command(b"XADD", b"s", b"*", b"", b"\x00\xff\r\n")
            + b"PING\r\n" + command(b"XLEN", b"s"))
    want = [[b"HELLO", b"3"], [b"XADD", b"s", b"*", b"", b"\x00\xff\r\n"], [b"PING"],
            [b"XLEN", b"s"]]
    assert parse(wire) == want
    for cut in range(len(wire) + 1):
        p = RespParser(1 << 20)
        got = p.feed(wire[:cut]) + p.feed(wire[cut:])
        assert got == want, cut
        assert p.buffered == 0
    p = RespParser(1 << 20)  # a byte at a time
    assert [c for i in range(len(wire)) for c in p.feed(wire[i:i + 1])] == want


def test_inline_commands_split_as_redis_does() -> None:
    assert parse(b"SET k v\r\n") == [[b"SET", b"k", b"v"]]
    assert parse(b"  PING  \n") == [[b"PING"]]  # bare LF (nc), extra spaces
    assert parse(b"\r\n\r\nPING\r\n") == [[b"PING"]]  # empty lines are skipped
    assert split_inline(b'SET "a b" \'c d\'') == [b"SET", b"a b", b"c d"]
    assert split_inline(b'ECHO "\\x41\\n\\"q"') == [b"ECHO", b'A\n"q']
    assert split_inline(b"ECHO 'it\\'s'") == [b"ECHO", b"it's"]
    assert split_inline(b'ECHO ""') == [b"ECHO", b""]
    assert split_inline(b"SET 'a b' c\t'd'") == [b"SET", b"a b", b"c", b"d"]
    for bad in (b'ECHO "open', b"ECHO 'open", b'ECHO "a"b', b"ECHO 'a'b", b"ECHO 'a'X",
                b"ECHO 'a\\", b"ECHO 'a\\'"):
        with pytest.raises(RespProtocolError) as err:
            split_inline(bad)
        assert str(err.value) == "Protocol error: unbalanced quotes in request", bad


def test_empty_and_null_arrays_are_ignored() -> None:
    assert parse(b"*0\r\n*-1\r\n" + command(b"PING")) == [[b"PING"]]


@pytest.mark.parametrize(("wire", "why"), [
    (b"*x\r\n", "invalid multibulk length"),
    (b"*2\r\n:1\r\n", "expected '$', got ':'"),
    (b"*1\r\n$x\r\n", "invalid bulk length"),
    (b"*1\r\n$-5\r\n", "invalid bulk length"),
    (b"*1\r\n$11\r\n", "invalid bulk length"),  # over max_bulk (10 here)
    (b"*1\r\n$3\r\nabcXY", "bulk string not followed by CRLF"),
    (b"*%d\r\n" % (1024 * 1024 + 1), "invalid multibulk length"),
    (b"*1" + b"1" * 40, "too big mbulk count string"),
    (b"*1\r\n$1" + b"1" * 40, "too big bulk count string"),
])
def test_what_cannot_be_framed_is_a_protocol_error_in_redis_words(wire: bytes, why: str
                                                                   ) -> None:
    with pytest.raises(RespProtocolError) as err:
        parse(wire, max_bulk=10)
    assert str(err.value) == f"Protocol error: {why}"


def test_an_inline_line_is_bounded_even_before_its_end_arrives() -> None:
    p = RespParser(10)
    p.feed(b"A" * MAX_INLINE)  # not over yet
    assert p.error is None
    assert p.feed(b"A" * 10) == []
    assert str(p.error) == "Protocol error: too big inline request"
    assert p.feed(b"PING\r\n") == [] and p.buffered == 0  # nothing more is read


def test_commands_before_a_break_are_still_returned() -> None:
    p = RespParser(10)
    assert p.feed(command(b"PING") + b"*x\r\n" + command(b"PING")) == [[b"PING"]]
    assert str(p.error) == "Protocol error: invalid multibulk length"


def test_a_big_bulk_is_held_until_complete_and_nothing_more() -> None:
    p = RespParser(1 << 20)
    body = b"x" * 100_000
    wire = command(b"XADD", b"s", b"*", b"f", body)
    assert p.feed(wire[:50_000]) == []
    assert p.buffered <= len(wire)
    assert p.feed(wire[50_000:]) == [[b"XADD", b"s", b"*", b"f", body]]
    assert p.buffered == 0


def test_replies_in_resp2_and_resp3() -> None:
    assert encode(OK) == b"+OK\r\n"
    assert encode(Error("ERR bad\r\nthing")) == b"-ERR bad  thing\r\n"
    assert encode(42) == b":42\r\n"
    assert encode(b"\x00a") == b"$2\r\n\x00a\r\n"
    assert encode("é") == b"$2\r\n\xc3\xa9\r\n"
    assert encode(None) == b"$-1\r\n" and encode(None, 3) == b"_\r\n"
    assert encode(NULL_ARRAY) == b"*-1\r\n" and encode(NullArray(), 3) == b"_\r\n"
    assert encode([b"a", 1, None]) == b"*3\r\n$1\r\na\r\n:1\r\n$-1\r\n"
    m = Map([(b"server", b"minou"), (b"proto", 3)])
    assert encode(m) == b"*4\r\n$6\r\nserver\r\n$5\r\nminou\r\n$5\r\nproto\r\n:3\r\n"
    assert encode(m, 3) == b"%2\r\n$6\r\nserver\r\n$5\r\nminou\r\n$5\r\nproto\r\n:3\r\n"
    assert encode(Set([b"a"]), 3) == b"~1\r\n$1\r\na\r\n" and encode(Set([b"a"])) == \
        b"*1\r\n$1\r\na\r\n"
    assert encode(Double(1.5), 3) == b",1.5\r\n" and encode(Double(1.5)) == b"$3\r\n1.5\r\n"
    assert encode(Double(float("inf")), 3) == b",inf\r\n"
    assert encode(Bool(True), 3) == b"#t\r\n" and encode(True) == b":1\r\n"
    assert encode(Verbatim("a"), 3) == b"=5\r\ntxt:a\r\n" and encode(Verbatim("a")) == \
        b"$1\r\na\r\n"
    assert encode(Push([b"message", b"c"]), 3) == b">2\r\n$7\r\nmessage\r\n$1\r\nc\r\n"
    assert encode(Push([b"message", b"c"])) == b"*2\r\n$7\r\nmessage\r\n$1\r\nc\r\n"
    assert encode(Bool(False), 3) == b"#f\r\n" and encode(False) == b":0\r\n"
    # what is inside a map, a set or a push is in the reply's protocol too
    nested = Map([(b"k", None), (b"b", False), (b"s", Set([None])), (b"p", Push([None]))])
    assert encode(nested, 3) == (b"%4\r\n$1\r\nk\r\n_\r\n$1\r\nb\r\n#f\r\n"
                                 b"$1\r\ns\r\n~1\r\n_\r\n$1\r\np\r\n>1\r\n_\r\n")
    assert encode(nested) == (b"*8\r\n$1\r\nk\r\n$-1\r\n$1\r\nb\r\n:0\r\n"
                              b"$1\r\ns\r\n*1\r\n$-1\r\n$1\r\np\r\n*1\r\n$-1\r\n")
    assert encode(Simple("PONG")) == b"+PONG\r\n"
    # a reply a hot path made as RESP already goes out as it is, alone or inside another
    assert encode(Encoded(b"$3\r\n1-0\r\n"), 3) == b"$3\r\n1-0\r\n"
    assert encode([Encoded(b":1\r\n"), b"a"]) == b"*2\r\n:1\r\n$1\r\na\r\n"
    with pytest.raises(TypeError):
        encode(object())


args_st = st.lists(st.binary(max_size=40), min_size=1, max_size=6)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(args_st, min_size=1, max_size=5), st.data())
def test_any_commands_split_anywhere_come_out_as_sent(commands: list[list[bytes]],
                                                      data: st.DataObject) -> None:
    wire = b"".join(command(*c) for c in commands)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    p = RespParser(1 << 10)
    got: list[list[bytes]] = []
    last = 0
    for cut in [*cuts, len(wire)]:
        got += p.feed(wire[last:cut])
        last = cut
    assert got == commands and p.buffered == 0


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.integers(0, 300))
def test_random_bytes_give_commands_or_a_protocol_error_never_a_crash(data: bytes,
                                                                     cut: int) -> None:
    p = RespParser(64)
    for part in (data[:cut], data[cut:]):
        for c in p.feed(part):
            assert c and all(isinstance(a, bytes) for a in c)
    assert p.error is None or str(p.error).startswith("Protocol error: ")
    assert p.buffered <= len(data)


def test_the_edges_of_every_limit_and_line() -> None:
    assert parse(b"PING\n") == [[b"PING"]]  # a bare LF ends an inline line; nothing cut
    longest = b"ECHO " + b"a" * (MAX_INLINE - 6)  # with its CR: the limit exactly
    assert parse(longest + b"\r\n")[0][1] == b"a" * (MAX_INLINE - 6)
    with pytest.raises(RespProtocolError, match="too big inline request"):
        parse(longest + b"a\r\n")
    assert parse(command(b"SET", b"k", b"x" * 10), max_bulk=10) == [[b"SET", b"k", b"x" * 10]]
    for wire, why in ((b"*1\r\n$3\r\nabc\rX", "bulk string not followed by CRLF"),
                      (b"*1\r\n$3\r\nabcX\n", "bulk string not followed by CRLF"),
                      (b"*1\r\n x", "expected '$', got ' '"),
                      (b"*1\r\n\x7f", "expected '$', got '\\x7f'"),
                      (b"*1\r\n~", "expected '$', got '~'")):
        with pytest.raises(RespProtocolError) as err:
            parse(wire)
        assert str(err.value) == f"Protocol error: {why}"
    # a count line of 32 bytes is waited for; longer is refused, even before its end
    p = RespParser(10)
    assert p.feed(b"*" + b"1" * 31) == [] and p.error is None  # 32 bytes, no end yet
    p.feed(b"1")
    assert str(p.error) == "Protocol error: too big mbulk count string"


def test_doubles_that_are_not_numbers() -> None:
    assert encode(Double(float("-inf")), 3) == b",-inf\r\n"
    assert encode(Double(float("nan")), 3) == b",nan\r\n"
    assert encode(Double(float("-inf"))) == b"$4\r\n-inf\r\n"
    assert encode(Double(0.0), 3) == b",0.0\r\n"


def test_length_lines_requests_and_inline_lines_at_their_exact_bounds() -> None:
    from minou.protocol.resp import ARG_OVERHEAD, MAX_ARRAY, default_max_request

    ping = b"$4\r\nPING\r\n"
    # a length line holds 32 bytes at most ('*' or '$' and the digits), whole or not yet
    assert parse(b"*" + b"0" * 30 + b"1\r\n" + ping) == [[b"PING"]]
    assert parse(b"*1\r\n$" + b"0" * 30 + b"4\r\nPING\r\n") == [[b"PING"]]
    for wire, why in ((b"*" + b"0" * 31 + b"1\r\n" + ping, "too big mbulk count string"),
                      (b"*1\r\n$" + b"0" * 31 + b"4\r\nPING\r\n", "too big bulk count string"),
                      (b"*" + b"0" * 32, "too big mbulk count string"),
                      (b"*1\r\n$" + b"0" * 32, "too big bulk count string")):
        with pytest.raises(RespProtocolError) as err:
            parse(wire)
        assert str(err.value) == f"Protocol error: {why}"
    assert parse(b"*" + b"0" * 31) == [] and parse(b"*1\r\n$" + b"0" * 31) == []  # waiting
    assert parse(b"*%d\r\n" % MAX_ARRAY) == []  # the most elements: waits for them
    # the arguments of one request together, each with its overhead, up to max_request
    args = (b"SET", b"k", b"v" * 100)
    exact = sum(len(a) + ARG_OVERHEAD for a in args)
    assert RespParser(1 << 20, exact).feed(command(*args)) == [list(args)]
    over = RespParser(1 << 20, exact - 1)
    assert over.feed(command(*args)) == [] and str(over.error) == \
        "Protocol error: too big request"
    assert default_max_request(1 << 20) == 2 << 20 and default_max_request(10) == 1 << 20
    # an inline line at the limit after another command in the same read, or arriving
    longest = b"ECHO " + b"a" * (MAX_INLINE - 6)
    assert parse(b"PING\r\n" + longest + b"\r\n") == [[b"PING"], [b"ECHO", b"a" * (MAX_INLINE - 6)]]
    p = RespParser(1 << 20)
    assert p.feed(b"PING\r\n" + longest) == [[b"PING"]] and p.error is None
    assert p.feed(b"\r\n") == [[b"ECHO", b"a" * (MAX_INLINE - 6)]]
    assert parse(b"\nPING\r\n") == [[b"PING"]]  # an empty first line is skipped


def test_inline_escapes_and_separators_cut_short_or_next_to_other_bytes() -> None:
    assert split_inline(b"XLEN X1\tXx") == [b"XLEN", b"X1", b"Xx"]
    assert split_inline(b'ECHO "\\xZ1"') == [b"ECHO", b"xZ1"]  # not hex: \x is x
    for bad in (b'ECHO "\\x', b'ECHO "\\x4', b'ECHO "a\\', b'ECHO "a\\"', b'ECHO "a"X'):
        with pytest.raises(RespProtocolError) as err:
            split_inline(bad)
        assert str(err.value) == "Protocol error: unbalanced quotes in request", bad
