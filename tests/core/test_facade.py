"""``Broker`` as the adapters see it: settings set on it reach the parts, and the calls
the server makes to wake groups and swap channel options on a reload."""

from __future__ import annotations

from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions

from .helpers import Harness, send, seqs

CH = "orders/v1/1"


def test_a_setting_set_on_the_broker_is_the_one_its_parts_use() -> None:
    h = Harness()
    h.broker.max_message_size = 4
    (refused,) = h.publish_values(CH, ["too long"])
    assert refused.code and h.broker.state.max_message_size == 4


def test_options_for_swapped_on_a_reload_reaches_new_channels() -> None:
    h = Harness()
    h.broker.options_for = lambda key: ChannelOptions(prefetch=7)
    assert h.broker.options(CH).prefetch == 7
    h.broker.options_for = lambda key: ChannelOptions(prefetch=9)
    assert h.broker.options("orders/v1/2").prefetch == 9


def test_mark_ready_lets_a_group_whose_member_can_take_more_again_be_served() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    sub.paused = True  # the connection's writes backed up
    h.publish_values(CH, [1, 2])
    assert h.pump() == {}
    sub.paused = False
    assert h.pump() == {}  # nothing in the core changed: the adapter must say so
    h.broker.mark_ready(sub.group)
    assert seqs(h.take(sub)) == [1, 2]


class _Recorder:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


    def observe_since(self, now: float, times: list[float]) -> None:
        self.values.extend(now - t for t in times)


def test_an_ack_with_the_time_feeds_the_ack_latency_metric() -> None:
    h = Harness()
    h.broker.ack_latency = latency = _Recorder()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5)
    h.publish_values(CH, [1, 2])
    got = h.take(sub)
    h.advance(2.5)
    assert h.ack(s, got[:1]) == []  # the engine passes the time: measured
    assert latency.values == [2.5]
    assert h.broker.ack(s, [got[1].tag]) == []  # no time: not measured
    assert latency.values == [2.5]


def test_a_writer_released_without_dropping_its_fences_stays_exactly_once() -> None:
    h = Harness()
    first, second = Session("first"), Session("second")
    h.broker.stage(first, "t", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(first, "job", 3, ["t"], h.now)["published"] == 1
    assert h.broker.txn_replay_holds("job", 3, [CH])
    assert not h.broker.txn_replay_holds("job", 4, [CH])
    assert h.broker.release_writer("job") == "first"
    h.broker.stage(second, "t", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(second, "job", 3, ["t"], h.now)["discarded"] == 1
    # A commit without a lineage binds none: a streaming run may take the writer on.
    h.broker.stage(second, "u", [send(CH, 2)], h.now)
    assert h.broker.commit_txns(second, "job", 4, ["u"], h.now, "run-1")["published"] == 1


def test_a_broker_built_without_settings_is_named_minou() -> None:
    assert Broker().broker_id == "minou"  # the audience its tokens are signed for
