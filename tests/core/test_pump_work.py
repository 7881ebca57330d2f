"""``has_ready``: whether a further pump round has something to deliver (the engine
schedules one more round when it does)."""

from __future__ import annotations

from minou.core.broker import Session

from .helpers import Harness, send

CH = "orders/v1/1"


def test_a_member_joining_a_group_with_nothing_waiting_leaves_no_pump_work() -> None:
    h = Harness()
    h.subscribe(Session("a"), patterns=CH, group="g")
    h.pump()
    assert not h.broker.has_ready
    h.subscribe(Session("b"), patterns=CH, group="g")
    assert not h.broker.has_ready
    h.publish(send(CH, 1))
    assert h.broker.has_ready
    h.pump()
    h.subscribe(Session("c"), patterns=CH, group="g")  # the one message is out already
    assert not h.broker.has_ready


def test_a_group_whose_ready_channel_went_before_the_pump_leaves_no_pump_work() -> None:
    """The group was ready (a message on one of its channels), then stopped reading that
    channel before a pump: the pump finds nothing, and no further round is asked for."""
    h = Harness()
    s = Session("a")
    sub = h.subscribe(s, patterns=["orders/v1/a", "orders/v1/b"], group="g")
    h.pump()  # nothing on either channel yet
    h.publish(send("orders/v1/a", 1))
    assert h.broker.has_ready
    h.broker.remove_pattern(s, 1, "orders/v1/a", h.now)
    assert h.take(sub) == []
    assert not h.broker.has_ready
