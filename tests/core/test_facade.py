"""``Broker`` as the adapters see it: settings set on it reach the parts, and the calls
the server makes to wake groups and swap channel options on a reload."""

from __future__ import annotations

from minou.core.broker import Session
from minou.core.log import ChannelOptions

from .helpers import Harness, seqs

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
