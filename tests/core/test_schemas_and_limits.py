"""What a publish is checked against before it is stored: its channel version's JSON
schema (and ``strict_schemas``), the header limits (count, size), the key lengths,
priority, ttl/delay and the message size. A refusal is that message's outcome (its
code; the rest of the batch is stored); ``validate`` (a transactional STAGE and
commit use it) raises the same error with the detail fields a client acts on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.errors import ErrorCode, MessageTooLarge, QueueFull, RequestError, SchemaMismatch
from minou.limits import (
    MAX_DELAY_S,
    MAX_HEADER_SIZE,
    MAX_HEADERS,
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MIN_PRIORITY,
)
from minou.protocol.frames import Send
from minou.schemas import compile_schema

from .helpers import Harness, js, payloads, send

CH = "orders/v1/1"
ORDER = {
    "type": "object",
    "required": ["qty"],
    "properties": {"qty": {"type": "integer", "minimum": 1}},
}


def with_schema(**kw: Any) -> Harness:
    """A broker whose ``orders/v1`` declares ORDER (other versions declare nothing)."""
    schema = compile_schema(ORDER, key="orders/v1")

    def options(key: str) -> ChannelOptions:
        return ChannelOptions(schema=schema) if key == "orders/v1" else ChannelOptions()

    return Harness(channel_options=options, **kw)


def refusal(broker: Broker, send: Send) -> RequestError:
    """What ``validate`` raises for ``send`` (it must raise)."""
    with pytest.raises(RequestError) as caught:
        broker.publishing.validate(send, Session("c").access)
    return caught.value


def codes(h: Harness, *sends: Send) -> list[int]:
    return [o.code for o in h.publish(*sends)]


# ------------------------------------------------------------------- schemas
def test_a_channel_with_a_schema_stores_valid_payloads_and_refuses_the_others() -> None:
    h = with_schema()
    outcomes = h.publish(send_value({"qty": 2}), send_value({"qty": 0}),
                         send_value({"n": 1}), send_value({"qty": 3}))
    assert [o.code for o in outcomes] == [0, ErrorCode.SCHEMA_MISMATCH,
                                          ErrorCode.SCHEMA_MISMATCH, 0]
    assert [o.seq for o in outcomes] == [1, 0, 0, 2]
    assert h.broker.counters.refused == {"schema_mismatch": 2}
    assert h.broker.schema_refusals == {"orders/v1": 2}
    sub = h.subscribe(Session("r"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == [{"qty": 2}, {"qty": 3}]
    # Another version, without a schema, takes any JSON.
    assert codes(h, Send("orders/v2/1", js({"n": 1}))) == [0]
    assert h.broker.schema_refusals == {"orders/v1": 2}


def send_value(value: Any, channel: str = CH, **kw: Any) -> Send:
    return Send(channel, js(value), **kw)


def test_a_schema_refusal_names_the_schema_and_the_failing_path() -> None:
    h = with_schema()
    err = refusal(h.broker, send_value({"qty": 0}))
    assert isinstance(err, SchemaMismatch) and err.code == ErrorCode.SCHEMA_MISMATCH
    assert err.message  # a client shows it
    assert err.detail["schema"] == "orders/v1"
    assert err.detail["path"] == "$.qty"
    assert err.detail["why"]
    err = refusal(h.broker, send_value({"n": 1}))
    assert (err.detail["schema"], err.detail["path"]) == ("orders/v1", "$")
    # The schema of a channel that exists already is checked too, on every publish.
    assert codes(h, send_value({"qty": 1})) == [0]
    assert refusal(h.broker, send_value({"qty": "1"})).detail["path"] == "$.qty"
    assert h.broker.schema_refusals == {"orders/v1": 3}


def test_a_raw_payload_is_refused_by_a_channel_with_a_schema() -> None:
    h = with_schema()
    raw = Send(CH, js({"qty": 1}), raw=True)
    err = refusal(h.broker, raw)
    assert (err.code, err.detail) == (ErrorCode.SCHEMA_MISMATCH, {"schema": "orders/v1"})
    assert err.message
    assert codes(h, raw, raw) == [ErrorCode.SCHEMA_MISMATCH] * 2
    assert h.broker.schema_refusals == {"orders/v1": 3}
    assert codes(h, Send("orders/v2/1", b"\x00raw", raw=True)) == [0]


def test_a_payload_that_is_not_json_is_invalid_before_the_schema_is_asked() -> None:
    h = with_schema()
    err = refusal(h.broker, Send(CH, b"{not json"))
    assert err.code == ErrorCode.INVALID_PAYLOAD
    assert h.broker.schema_refusals == {}


def test_a_payload_repeating_a_key_is_refused_where_a_schema_checks_it() -> None:
    # The schema sees the last "qty" (a valid 1); a reader keeping the first would see 0.
    h = with_schema()
    twice = Send(CH, b'{"qty": 0, "qty": 1}')
    err = refusal(h.broker, twice)
    assert err.code == ErrorCode.INVALID_PAYLOAD and "qty" in err.message
    assert err.detail == {"schema": "orders/v1", "key": "qty"}
    assert codes(h, twice, Send(CH, b'{"qty": 1}')) == [ErrorCode.INVALID_PAYLOAD, 0]
    assert h.broker.schema_refusals == {"orders/v1": 2}
    # Without a schema nothing checks the value: stored as it came.
    assert codes(h, Send("orders/v2/1", b'{"qty": 0, "qty": 1}')) == [0]
    # A long key is named by its first 64 characters.
    long = "k" * 100
    err = refusal(h.broker, Send(CH, f'{{"{long}": 0, "{long}": 1, "qty": 1}}'.encode()))
    assert err.detail["key"] == long[:64]


def test_strict_schemas_refuse_channels_that_declare_none_except_dead_letters() -> None:
    h = with_schema()
    h.broker.strict_schemas = True
    assert codes(h, send_value({"qty": 1})) == [0]  # declared: checked as usual
    err = refusal(h.broker, send_value(1, "audit/v1/x"))
    assert (err.code, err.detail) == (ErrorCode.SCHEMA_MISMATCH, {"schema": "audit/v1"})
    assert codes(h, send_value(1, "audit/v1/x"), send_value(1, "audit/v1/y")) == [
        ErrorCode.SCHEMA_MISMATCH] * 2
    assert h.broker.schema_refusals == {"audit/v1": 3}
    assert "audit/v1/x" not in h.broker.channels
    # Dead letters are copies of messages checked when they were published.
    assert codes(h, send_value(1, "_dead/audit/v1/x")) == [0]
    h.broker.strict_schemas = False
    assert codes(h, send_value(1, "audit/v1/x")) == [0]


def test_strict_schemas_refuse_raw_payloads_of_undeclared_channels_too() -> None:
    h = Harness()
    h.broker.strict_schemas = True
    assert codes(h, Send("audit/v1/x", b"\x00", raw=True)) == [ErrorCode.SCHEMA_MISMATCH]
    assert h.broker.schema_refusals == {"audit/v1": 1}


def test_without_a_schema_the_payload_must_still_be_json_unless_raw() -> None:
    h = Harness()
    assert codes(h, Send(CH, b"{bad"), Send(CH, b"{bad", raw=True)) == [
        ErrorCode.INVALID_PAYLOAD, 0]


# --------------------------------------------------------------------- size
@settings(derandomize=True, max_examples=25, deadline=None)
@given(size=st.integers(1, 40))
def test_a_message_over_the_size_limit_is_refused_with_the_limit_and_its_size(
        size: int) -> None:
    broker = Broker(max_message_size=20)
    send = Send(CH, b"1" * size)
    if size <= 20:
        assert broker.publishing.validate(send, Session("c").access) is None
        return
    err = refusal(broker, send)
    assert isinstance(err, MessageTooLarge)
    assert (err.code, err.detail) == (ErrorCode.MESSAGE_TOO_LARGE, {"limit": 20, "size": size})


def test_an_oversized_message_is_refused_and_the_rest_of_the_batch_stored() -> None:
    h = Harness(max_message_size=8)
    outcomes = h.publish(Send(CH, b"1" * 9), Send(CH, b"1" * 8))
    assert [(o.code, o.seq) for o in outcomes] == [(ErrorCode.MESSAGE_TOO_LARGE, 0), (0, 1)]
    assert h.broker.counters.refused == {"message_too_large": 1}


# ------------------------------------------------------------------- headers
@settings(derandomize=True, max_examples=30, deadline=None)
@given(n=st.integers(0, MAX_HEADERS + 3))
@example(n=MAX_HEADERS).via("the boundary")
@example(n=MAX_HEADERS + 1).via("the boundary")
def test_at_most_max_headers_headers(n: int) -> None:
    broker = Broker()
    send = send_value(1, headers={f"h{i}": "v" for i in range(n)} or None)
    if n <= MAX_HEADERS:
        assert broker.publishing.validate(send, Session("c").access) is None
    else:
        assert refusal(broker, send).code == ErrorCode.BAD_REQUEST


@settings(derandomize=True, max_examples=30, deadline=None)
@given(extra=st.integers(-3, 3), names=st.integers(1, 4))
def test_headers_hold_at_most_max_header_size_bytes_keys_and_values_counted(
        extra: int, names: int) -> None:
    broker = Broker()
    total = MAX_HEADER_SIZE + extra
    headers = {f"k{i}": "" for i in range(names)}
    used = sum(len(k) for k in headers)
    headers["k0"] = "v" * (total - used)  # the keys count, and the values
    assert sum(len(k) + len(v) for k, v in headers.items()) == total
    send = send_value(1, headers=headers)
    if total <= MAX_HEADER_SIZE:
        assert broker.publishing.validate(send, Session("c").access) is None
    else:
        assert refusal(broker, send).code == ErrorCode.BAD_REQUEST


def test_header_refusals_are_the_messages_own() -> None:
    h = Harness()
    too_many = {f"h{i}": "" for i in range(MAX_HEADERS + 1)}
    too_big = {"k": "v" * MAX_HEADER_SIZE}
    assert codes(h, send_value(1, headers=too_many), send_value(2, headers=too_big),
                 send_value(3, headers={"k": "v"})) == [
        ErrorCode.BAD_REQUEST, ErrorCode.BAD_REQUEST, 0]
    assert h.broker.counters.refused == {"bad_request": 2}


# ---------------------------------------------------------------- keys, etc.
@pytest.mark.parametrize("field", ["dedup", "key"])
@pytest.mark.parametrize("length", [1, MAX_KEY_LENGTH, MAX_KEY_LENGTH + 1])
def test_a_dedup_key_or_message_key_is_at_most_max_key_length(field: str, length: int
                                                              ) -> None:
    broker = Broker()
    send = send_value(1, **{field: "k" * length})
    if length <= MAX_KEY_LENGTH:
        assert broker.publishing.validate(send, Session("c").access) is None
        return
    err = refusal(broker, send)
    assert (err.code, err.detail) == (ErrorCode.BAD_REQUEST, {"limit": MAX_KEY_LENGTH})


@settings(derandomize=True, max_examples=20, deadline=None)
@given(priority=st.integers(MIN_PRIORITY - 3, MAX_PRIORITY + 3))
def test_priority_is_within_its_range(priority: int) -> None:
    h = Harness()
    (o,) = h.publish(send_value(1, priority=priority))
    assert (o.code == 0) == (MIN_PRIORITY <= priority <= MAX_PRIORITY)
    assert o.code in (0, ErrorCode.BAD_REQUEST)


@pytest.mark.parametrize("field", ["ttl", "delay"])
@pytest.mark.parametrize("value, ok", [
    (0.0, True), (1.5, True), (MAX_DELAY_S, True), (MAX_DELAY_S + 1, False),
    (-0.001, False),
])
def test_ttl_and_delay_are_within_zero_and_ten_years(field: str, value: float, ok: bool
                                                     ) -> None:
    broker = Broker()
    send = send_value(1, **{field: value})
    if ok:
        assert broker.publishing.validate(send, Session("c").access) is None
    else:
        assert refusal(broker, send).code == ErrorCode.BAD_REQUEST


def test_the_broker_makes_at_most_max_channels_channels() -> None:
    """A channel is made by its first publish or named reader and kept (~2 KB): past
    max_channels a new one is refused, precisely, per message; channels that exist go
    on, and a dead letter is made whatever the count (a failed message is never lost)."""
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    h.broker.max_channels = 2
    s = Session("c")
    sub = h.subscribe(s, patterns="a/v1/1", group="g", prefetch=1)  # made by its reader
    ok, refused = h.publish(send("a/v1/2", 1), send("a/v1/3", 1))
    assert ok.seq == 1 and refused.seq == 0 and refused.code and \
        "the broker holds 2 channels and the limit is 2 (max_channels)" in refused.error
    assert "a/v1/3" not in h.broker.state.channels
    with pytest.raises(QueueFull) as caught:  # a reader naming a new one: refused too
        h.subscribe(s, 2, patterns=["a/v1/2", "a/v1/4"], group="g2")
    assert caught.value.detail == {"limit": 2} and "consume:g2" not in h.broker.state.groups
    with pytest.raises(QueueFull):
        h.broker.set_position(s, "g", {"a/v1/5": 1}, h.now)
    h.subscribe(s, 3, patterns=["a/v1/*"], group="g3")  # a wildcard makes none
    assert h.publish(send("a/v1/1", 1))[0].seq == 1  # channels that exist go on
    (d,) = h.take(sub)
    h.nack(s, [d])  # requeue_limit 0: dead-lettered, past the bound
    h.commit()
    assert "_dead/a/v1/1" in h.broker.state.channels
    h.broker.max_channels = 10  # a reload raises it: made again
    assert h.publish(send("a/v1/3", 1))[0].seq == 1


def test_one_batch_cannot_pass_the_bound_of_scheduled_messages(monkeypatch) -> None:
    """The messages of the batch not yet committed count each: four of priority 1 in
    one publish, with room for three, have the fourth refused alone."""
    import minou.core.state as state_module

    monkeypatch.setattr(state_module, "MAX_SCHEDULED_MESSAGES", 3)
    h = Harness()
    out = h.publish(*(send("a/v1/1", i, priority=1) for i in range(4)), send("a/v1/1", 9))
    assert [o.seq for o in out] == [1, 2, 3, 0, 4]
    assert "3 messages with a priority or a delay wait already" in out[3].error
    assert h.broker.state.special_count.total == 3


def test_a_broadcast_counts_each_copy_against_the_bound_of_scheduled_messages(
        monkeypatch) -> None:
    """A broadcast is stored once per channel read under its prefix: with a delay or a
    priority, every copy waits in memory, so it is refused whole when its copies would
    pass the bound; a plain one is not counted."""
    import minou.core.state as state_module

    monkeypatch.setattr(state_module, "MAX_SCHEDULED_MESSAGES", 3)
    h = Harness()
    for i, ch in enumerate(("a/v1/1", "a/v1/2")):
        h.publish(send(ch, 0))
        h.subscribe(Session("r"), i, patterns=ch, group=f"g{i}", prefetch=10)
    [delayed] = h.publish(send("a/v1/*", 1, delay=5.0))
    assert (delayed.code, delayed.fanout) == (0, 2)
    [urgent] = h.publish(send("a/v1/*", 2, priority=1))  # two more: 4 would wait
    assert urgent.code == ErrorCode.QUEUE_FULL
    [plain] = h.publish(send("a/v1/*", 3))
    assert (plain.code, plain.fanout) == (0, 2)
    assert h.broker.state.special_count.total == 2
