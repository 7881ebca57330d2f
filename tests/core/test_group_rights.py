"""A consumer group hands each member messages of every pattern it reads, so the
rules are checked against the whole group: on joining and on adding a pattern."""

from __future__ import annotations

import pytest

from minou.auth.rules import Rules
from minou.core.broker import Session
from minou.errors import NotAuthorized

from .helpers import Harness, payloads, send

RULES = Rules.parse([{"client": "narrow", "read": ["orders/v1/1"]},
                     {"client": "wide", "read": ["orders/*"]}])


def session(client_id: str) -> Session:
    return Session(client_id, access=RULES.for_client(client_id))


def test_joining_needs_every_pattern_of_the_group() -> None:
    h = Harness()
    h.subscribe(session("wide"), patterns="orders/v1/*", group="g")
    with pytest.raises(NotAuthorized, match="group 'g' also reads 'orders/v1/\\*'"):
        h.subscribe(session("narrow"), patterns="orders/v1/1", group="g")
    # Its own group, or a group reading only what it may: fine.
    h.subscribe(session("narrow"), patterns="orders/v1/1", group="mine")
    h.subscribe(session("wide"), 2, patterns="orders/v1/1", group="mine")


def test_no_member_may_widen_the_group_past_another_member() -> None:
    h = Harness()
    narrow, wide = session("narrow"), session("wide")
    h.subscribe(narrow, patterns="orders/v1/1", group="g")
    h.subscribe(wide, patterns="orders/v1/1", group="g")
    with pytest.raises(NotAuthorized, match="member, client 'narrow'"):
        h.broker.add_pattern(wide, 1, "orders/v1/2", h.now)  # add_id / SUB_ADD
    with pytest.raises(NotAuthorized, match="member, client 'narrow'"):
        h.subscribe(wide, 2, patterns="orders/v1/2", group="g")
    # Once the narrow member has left, the group may grow.
    h.broker.unsubscribe(narrow, 1, h.now)
    h.broker.add_pattern(wide, 1, "orders/v1/2", h.now)
    assert {p.text for p in h.broker.groups["consume:g"].patterns} == {
        "orders/v1/1", "orders/v1/2"}


def test_a_member_adding_a_pattern_it_may_not_read_is_refused_for_its_own_rules() -> None:
    """Its own rules come first, even when another member may not read the pattern
    either; the refusal is recorded for "why is nothing flowing?"."""
    h = Harness()
    narrow, other = session("narrow"), Session("other", access=RULES.for_client("narrow"))
    h.subscribe(narrow, patterns="orders/v1/1", group="g")
    h.subscribe(other, patterns="orders/v1/1", group="g")
    with pytest.raises(NotAuthorized) as refused:
        h.broker.add_pattern(narrow, 1, "orders/v1/2", h.now)
    assert "group" not in refused.value.detail
    assert h.broker.read_refusals["orders/v1/2"] == [1, "narrow"]


def test_listen_subscriptions_are_per_client_and_unaffected() -> None:
    """Two clients' durable listeners of one name are two groups: the narrow one does
    not hold the wide one back, and each hears what its own patterns say."""
    h = Harness()
    wide = h.subscribe(session("wide"), kind="listen", patterns="orders/v1/*", name="g",
                       prefetch=10)
    narrow = h.subscribe(session("narrow"), kind="listen", patterns="orders/v1/1", name="g",
                         prefetch=10)
    assert wide.group is not narrow.group
    h.publish(send("orders/v1/1", 1), send("orders/v1/2", 2))
    got = h.pump()
    assert payloads(got[wide]) == [1, 2]
    assert payloads(got[narrow]) == [1]


def test_set_position_cannot_widen_a_group_either() -> None:
    h = Harness()
    h.subscribe(session("narrow"), patterns="orders/v1/1", group="g")
    with pytest.raises(NotAuthorized, match="member, client 'narrow'"):
        h.broker.set_position(session("wide"), "g", {"orders/v1/2": 1}, h.now)
    # A caller must be allowed everything the group reads to move it at all.
    h.subscribe(session("wide"), patterns="orders/v1/*", group="w")
    with pytest.raises(NotAuthorized, match="group 'w' also reads"):
        h.broker.set_position(session("narrow"), "w", {"orders/v1/1": 1}, h.now)


def test_an_exclusive_channel_is_not_handed_to_another_member() -> None:
    rules = Rules.parse([{"client": "*", "read": ["orders/*", "!invoice/*"]}])
    h = Harness()
    h.broker.rules = rules
    first = Session("first", access=rules.for_client("first"))
    second = Session("second", access=rules.for_client("second"))
    h.subscribe(first, patterns="orders/v1/*", group="g")
    with pytest.raises(NotAuthorized, match="member, client 'first'"):
        h.subscribe(second, patterns="invoice/v1/1", group="g")
    assert "invoice/v1/1" not in h.broker.reservations


def test_every_member_is_checked_whoever_joined_first() -> None:
    h = Harness()
    wide = session("wide")
    h.subscribe(wide, patterns="orders/v1/1", group="g")
    h.subscribe(Session("root", admin=True), patterns="orders/v1/1", group="g")
    h.subscribe(session("narrow"), patterns="orders/v1/1", group="g")
    with pytest.raises(NotAuthorized) as refused:
        h.broker.add_pattern(wide, 1, "orders/v1/2", h.now)
    assert refused.value.detail == {"group": "g", "pattern": "orders/v1/2"}
    h.subscribe(wide, 2, patterns="orders/v1/*", group="w")
    with pytest.raises(NotAuthorized) as refused:  # the joiner may not read the group's
        h.subscribe(session("narrow"), 2, patterns="orders/v1/1", group="w")
    assert refused.value.detail == {"group": "w", "pattern": "orders/v1/*"}


def test_a_durable_listener_refusal_names_the_listener() -> None:
    h = Harness()
    rules = Rules.parse([{"client": "app", "read": ["orders/*"]}])
    app = Session("app", access=rules.for_client("app"))
    h.subscribe(Session("app"), kind="listen", patterns="payments/v1/1", name="feed")
    with pytest.raises(NotAuthorized) as refused:
        h.subscribe(app, kind="listen", patterns="orders/v1/1", name="feed")
    assert refused.value.detail == {"group": "feed", "pattern": "payments/v1/1"}


def test_a_wildcard_read_reserves_nothing() -> None:
    h = Harness()
    h.broker.rules = Rules.parse([{"client": "*", "read": ["!invoice/*"]}])
    me = Session("me")  # its key's rules allow the wildcard (as before a reload)
    h.subscribe(me, kind="listen", patterns="invoice/v1/*")
    assert h.broker.reservations == {}


def test_a_group_named_like_a_pattern_is_made_only_by_who_may_read_that_pattern() -> None:
    """Consumers that name no group share the group named after their pattern: a client
    allowed one channel may not make that group (on its channel) and so lock out every
    consumer of the pattern while it stays connected."""
    h = Harness()
    narrow, wide = session("narrow"), session("wide")
    with pytest.raises(NotAuthorized, match="group name 'orders/v1/\\*' is the group of the "
                                            "consumers of pattern 'orders/v1/\\*'") as refused:
        h.subscribe(narrow, patterns="orders/v1/1", group="orders/v1/*")
    assert refused.value.detail["group"] == "orders/v1/*"  # for clients, in the error frame
    with pytest.raises(NotAuthorized, match="group name 'orders/v1/\\*'"):
        h.broker.set_position(narrow, "orders/v1/*", {"orders/v1/1": 1}, h.now)
    assert "consume:orders/v1/*" not in h.broker.groups
    # The pattern's consumers get their default group; one it may read it may name.
    h.subscribe(wide, patterns="orders/v1/*")
    h.subscribe(narrow, 2, patterns="orders/v1/1", group="orders/v1/1")
    h.subscribe(narrow, 3, patterns="orders/v1/1", group="orders-eu")  # not a pattern
    # Joining such a group once made is governed by the group's patterns, as before.
    with pytest.raises(NotAuthorized, match="group 'orders/v1/\\*' also reads"):
        h.subscribe(narrow, 4, patterns="orders/v1/1", group="orders/v1/*")
