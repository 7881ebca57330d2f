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
