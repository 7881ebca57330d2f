"""The C-reader request parser gives the pure parser's results: for what libraries
send, split anywhere; for inline commands, odd elements and broken streams (handed to
the pure parser from the first command not returned); for the limits, as soon as the
headers say so. Fuzzed against the pure parser."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minou.protocol.resp import MAX_ARRAY, RespParser, RespProtocolError
from minou.protocol.resp_hiredis import PROBE_LIMIT, HiredisParser
from minou.server.resp import RequestParser

from .test_resp import command


def run(parser: RespParser | HiredisParser, parts: list[bytes]
        ) -> tuple[list[list[bytes]], str | None]:
    got: list[list[bytes]] = []
    for part in parts:
        got += parser.feed(part)
    return got, None if parser.error is None else str(parser.error)


def both(parts: list[bytes], max_bulk: int = 1 << 10) -> tuple[list[list[bytes]], str | None]:
    """What the C-reader parser makes of ``parts``, checked against the pure one's."""
    fast = run(HiredisParser(max_bulk), parts)
    assert fast == run(RespParser(max_bulk), parts)
    return fast


def test_the_broker_reads_with_hiredis_when_it_is_installed() -> None:
    assert RequestParser is HiredisParser


def test_pipelined_commands_split_at_every_byte() -> None:
    wire = (command(b"HELLO", b"3") + command(b"XADD", b"s", b"*", b"", b"\x00\xff\r\n")
            + command(b"XLEN", b"s") + command(b"PING"))
    want = [[b"HELLO", b"3"], [b"XADD", b"s", b"*", b"", b"\x00\xff\r\n"], [b"XLEN", b"s"],
            [b"PING"]]
    for cut in range(len(wire) + 1):
        for cut2 in range(cut, len(wire) + 1, 7):
            p = HiredisParser(1 << 20)
            assert run(p, [wire[:cut], wire[cut:cut2], wire[cut2:]]) == (want, None)
            assert p.buffered == 0


def test_inline_commands_and_odd_elements_go_through_the_pure_parser_and_back() -> None:
    wire = (command(b"PING") + b"SET k v\r\n" + command(b"ECHO", b"x") + b"*0\r\n*-1\r\n"
            + command(b"XLEN", b"s"))
    want = [[b"PING"], [b"SET", b"k", b"v"], [b"ECHO", b"x"], [b"XLEN", b"s"]]
    for cut in range(len(wire) + 1):
        assert both([wire[:cut], wire[cut:]]) == (want, None)
    p = HiredisParser(1 << 10)
    assert p.feed(b"PING\r\n") == [[b"PING"]]
    assert p._pure is None  # at a boundary the C reader reads again
    assert p.feed(command(b"PING")) == [[b"PING"]]


@pytest.mark.parametrize(("wire", "why"), [
    (b"*x\r\n", "invalid multibulk length"),
    (b"*2\r\n:1\r\n", "expected '$', got ':'"),
    (b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n", "expected '$', got '*'"),  # nested
    (b"*1\r\n$x\r\n", "invalid bulk length"),
    (b"*1\r\n$-1\r\n", "invalid bulk length"),
    (b"*1\r\n$11\r\n", "invalid bulk length"),  # over max_bulk, before the body
    (b"*%d\r\n" % (MAX_ARRAY + 1), "invalid multibulk length"),  # before the elements
    (b"*1" + b"1" * 40, "too big mbulk count string"),
    (b"*1\r\n$1" + b"1" * 40, "too big bulk count string"),
    (b"*20000\r\n" + b"$0\r\n\r\n" * 20000, "too big request"),  # 20,000 x 64 > 1 MiB
])
def test_what_cannot_be_framed_is_the_pure_parsers_error_at_once(wire: bytes, why: str
                                                                 ) -> None:
    before = command(b"PING")
    assert both([before + wire], max_bulk=10) == ([[b"PING"]], f"Protocol error: {why}")
    assert both([before, wire], max_bulk=10) == ([[b"PING"]], f"Protocol error: {why}")


def test_a_big_bulk_and_a_long_pipeline_are_held_only_as_long_as_unfinished() -> None:
    body = b"x" * 300_000
    wire = command(b"XADD", b"s", b"*", b"f", body)
    p = HiredisParser(1 << 20)
    assert p.feed(wire[:100_000]) == [] and 99_900 < p.buffered <= 100_000
    assert p.feed(wire[100_000:200_000]) == [] and p.error is None
    assert p.feed(wire[200_000:]) == [[b"XADD", b"s", b"*", b"f", body]]
    assert p.buffered == 0
    many = command(b"XADD", b"s", b"*", b"d", b"y" * 100) * 5000  # 700 kB
    got = []
    for i in range(0, len(many), 65536):
        got += p.feed(many[i:i + 65536])
        assert p.buffered < 200  # only the unfinished command's bytes
    assert len(got) == 5000 and p._pure is None


def test_one_command_over_max_request_is_refused_though_complete() -> None:
    wire = command(b"XADD", *([b"a" * 500] * 4000))  # 2 MB, each argument fine
    assert both([wire], max_bulk=1000)[1] == "Protocol error: too big request"


canonical = st.lists(st.binary(max_size=40), min_size=1, max_size=6).map(lambda a: command(*a))
inline = st.sampled_from([b"PING\r\n", b"SET k 'v w'\r\n", b"  \r\n", b"ECHO \"a\\x41\"\n",
                          b"$10\r\n", b":1\r\n", b"+OK\r\n", b"_\r\n"])
odd = st.sampled_from([b"*0\r\n", b"*-1\r\n", b"*1\r\n:1\r\n", b"*1\r\n$-1\r\n", b"*x\r\n",
                       b"*1\r\n$99\r\n", b"*2\r\n$1\r\na\r\n*1\r\n$1\r\nb\r\n"])


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(canonical, canonical, canonical, inline, odd), min_size=1,
                max_size=8), st.data())
def test_any_stream_split_anywhere_reads_as_the_pure_parser_reads_it(
        pieces: list[bytes], data: st.DataObject) -> None:
    wire = b"".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=6)))
    parts = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    both(parts, max_bulk=64)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.integers(0, 300))
def test_random_bytes_never_crash_it(data: bytes, cut: int) -> None:
    p = HiredisParser(64)
    got, error = run(p, [data[:cut], data[cut:]])
    assert all(c and all(type(a) is bytes for a in c) for c in got)
    assert error is None or error.startswith("Protocol error: ")
    assert p.buffered <= len(data)


def test_a_broken_stream_reads_nothing_more() -> None:
    p = HiredisParser(10)
    assert p.feed(command(b"PING") + b"*x\r\n" + command(b"PING")) == [[b"PING"]]
    assert isinstance(p.error, RespProtocolError)
    assert p.feed(command(b"PING")) == []


def test_what_libraries_send_never_leaves_the_c_reader_up_to_each_limit() -> None:
    """The pure parser is the slow path: a stream of well-framed commands never goes to
    it, even with a command exactly at each limit; what is over one does."""
    p = HiredisParser(1000, max_request=5000)
    wire = (command(b"XADD", b"s", b"*", b"d", b"y" * 100) * 50
            + command(b"x" * 1000)  # one argument of exactly max_bulk
            + command(b"SET", b"x" * 1000)  # and with others
            + command(*[b"z" * 936] * 5))  # 5 x (936 + 64) = max_request exactly
    got = []
    for cut in range(0, len(wire), 997):
        got += p.feed(wire[cut:cut + 997])
    assert len(got) == 53 and p.error is None
    assert p.handovers == 0
    assert p.feed(b"PING\r\n") == [[b"PING"]] and p.handovers == 1  # inline: handed over
    assert p.feed(command(b"PING") + b"PING\r\n") == [[b"PING"]] * 2 and p.handovers == 2
    big = HiredisParser(1 << 20)
    wire = command(b"x" * 70_000)
    assert big.feed(wire[:PROBE_LIMIT]) == [] and big.handovers == 0  # probed, held
    assert big.feed(wire[PROBE_LIMIT:]) == [[b"x" * 70_000]] and big.handovers == 0
    assert big.feed(wire[:PROBE_LIMIT + 1]) == [] and big.handovers == 1  # over: pure


def test_a_configured_max_request_holds_on_both_paths() -> None:
    arg = b"$1000\r\n" + b"x" * 1000 + b"\r\n"
    p = HiredisParser(1000, max_request=5000)  # 4 x 1064 fits, 5 do not
    assert p.feed(b"*4\r\n" + arg * 4) == [[b"x" * 1000] * 4]
    assert p.feed(b"*10\r\n" + arg * 4 + b"$1000\r\n") == []  # the 5th header: too big
    assert str(p.error) == "Protocol error: too big request"
    p = HiredisParser(1000, max_request=5000)
    assert p.feed(command(b"PING") + b"*5\r\n" + arg * 5) == [[b"PING"]]  # complete
    assert str(p.error) == "Protocol error: too big request"
    p = HiredisParser(1000, max_request=5000)
    p.feed(b"PING\r\n*10\r\n" + arg * 4)  # on the pure parser since the inline PING
    p.feed(arg)
    assert str(p.error) == "Protocol error: too big request"


def test_commands_before_a_big_unfinished_one_are_returned_with_it_held() -> None:
    body = b"x" * 200_000
    wire = command(b"XADD", b"s", b"*", b"f", body)
    p = HiredisParser(1 << 20)
    assert p.feed(command(b"PING") + wire[:100_000]) == [[b"PING"]]
    assert p.feed(wire[100_000:]) == [[b"XADD", b"s", b"*", b"f", body]]


def test_an_array_of_exactly_max_array_elements_is_read_by_the_c_reader() -> None:
    p = HiredisParser(10, max_request=1 << 30)  # so that only the count limits it
    assert len(p.feed(b"*%d\r\n" % MAX_ARRAY + b"$0\r\n\r\n" * MAX_ARRAY)[0]) == MAX_ARRAY
    assert p.handovers == 0
    p.feed(b"*%d\r\n" % (MAX_ARRAY + 1) + b"$0\r\n\r\n" * (MAX_ARRAY + 1))
    assert str(p.error) == "Protocol error: invalid multibulk length"
