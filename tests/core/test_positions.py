"""Where a consumer group stands and how it is moved: ``offsets`` (OFFSETS), a group
seek (``set_position``: POSITION, a Spark source committing its offsets), a restart
from ``seq:<n>``, and the patterns a subscription adds and removes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.auth.rules import Rules
from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.errors import BadRequest, ErrorCode, InvalidChannel, NotAuthorized, RequestError
from minou.storage.memory import MemoryStorage

from .helpers import Harness, send, seqs

CH = "orders/v1/1"
CH2 = "orders/v1/2"


def restart(h: Harness) -> Harness:
    """Stop ``h`` (its uncommitted batch is lost) and start again on its storage."""
    assert isinstance(h.storage, MemoryStorage)
    h.storage.close()
    storage = MemoryStorage(h.storage.name)
    broker = Broker()
    broker.restore(storage.open(h.now + 1.0), h.now + 1.0)
    return Harness(broker=broker, storage=storage, now=h.now + 1.0)


def refused(exc: type[RequestError], call: Any, *args: Any, **kw: Any) -> RequestError:
    """The refusal ``call`` raises; it always says why (the text a client shows)."""
    try:
        call(*args, **kw)
    except exc as e:
        assert isinstance(e.message, str) and e.message
        return e
    raise AssertionError(f"{call} was not refused")


# ------------------------------------------------------------- set_position
@settings(derandomize=True, max_examples=25, deadline=None)
@given(n=st.integers(0, 8), position=st.integers(1, 12), delivered=st.integers(0, 4))
def test_a_seek_keeps_exactly_the_message_at_the_position_and_drops_those_below(
        n: int, position: int, delivered: int) -> None:
    h = Harness()
    c = Session("c")
    out = []
    if delivered:  # a member holds the first ones, unsettled
        sub = h.subscribe(c, patterns=CH, group="g", prefetch=delivered)
        h.publish_values(CH, list(range(1, n + 1)))
        out = h.take(sub)
        sub.paused = True  # takes nothing more
    else:
        h.publish_values(CH, list(range(1, n + 1)))
    end, upto = n + 1, min(position, n + 1)
    cursor = max(upto, 1 + len(out))  # where the group goes on
    assert h.broker.set_position(c, "g", {CH: position}, h.now) == {CH: end - cursor}
    # Deliveries below the position are forgotten (their tags are unknown now); those
    # at or above it are still out, and can be acked.
    failed = h.ack(c, out)
    assert sorted(tag for tag, _, _ in failed) == [d.tag for d in out if d.seq < upto]
    assert {code for _, code, _ in failed} <= {ErrorCode.UNKNOWN_DELIVERY}
    # The group goes on exactly from the position: nothing below it, nothing twice.
    fresh = h.subscribe(Session("m"), patterns=CH, group="g", prefetch=20)
    assert seqs(h.take(fresh)) == list(range(cursor, end))


def test_a_new_group_positioned_on_a_channel_starts_there_and_stays_there() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3, 4, 5])
    h.publish(send(CH, "later", delay=60.0))  # seq 6, published with a delay
    admin = Session("ops", admin=True)
    assert h.broker.set_position(admin, "spark", {CH: 3}, h.now) == {CH: 4}
    assert h.broker.group_stats(h.broker.groups["consume:spark"], h.now)["kind"] == "consume"
    h.commit()
    h = restart(h)
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="spark", prefetch=10)
    got = h.take(sub)
    assert seqs(got) == [3, 4, 5]
    assert h.ack(c, got) == []
    h.tick(60.0)
    assert seqs(h.take(sub)) == [6]  # the delayed one too, when its time comes


def test_a_position_past_the_end_is_the_end_and_one_below_the_start_is_the_start() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    c = Session("c")
    assert h.broker.set_position(c, "g", {CH: 99}, h.now) == {CH: 0}
    h.publish_values(CH, [4])
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=10)
    assert seqs(h.take(sub)) == [4]  # the end then, not 99
    assert h.broker.set_position(c, "g", {CH: 1}, h.now) == {CH: 0}  # no way back
    # 1..3 were settled by the only group, so they are gone: a new group starts at 4.
    assert h.broker.set_position(c, "h", {CH: 1}, h.now) == {CH: 1}


def test_a_seek_claims_nothing_and_checks_every_channel_before_moving_any() -> None:
    rules = Rules.parse([{"client": "*", "read": ["orders/*", "!invoice/*"]}])
    h = Harness()
    h.broker.rules = rules
    me = Session("me", access=rules.for_client("me"))
    h.publish_values(CH, [1, 2, 3])
    e = refused(BadRequest, h.broker.set_position, me, "", {CH: 2}, h.now)
    assert e.code == ErrorCode.BAD_REQUEST
    e = refused(BadRequest, h.broker.set_position, me, "g", {CH: 2, "invoice/v1/1": 0}, h.now)
    assert e.code == ErrorCode.BAD_REQUEST
    assert refused(InvalidChannel, h.broker.set_position, me, "g", {CH: 2, "bad": 1},
                   h.now).code == ErrorCode.INVALID_CHANNEL
    e = refused(NotAuthorized, h.broker.set_position, me, "g", {CH: 2, "secret/v1/1": 1},
                h.now)
    assert e.detail["channel"] == "secret/v1/1"
    assert h.broker.reservations == {} and "consume:g" not in h.broker.groups
    assert h.broker.read_refusals["secret/v1/1"] == [1, "me"]  # "why is nothing flowing?"


def test_a_refused_seek_names_the_callers_own_refusal_before_the_groups() -> None:
    rules = Rules.parse([{"client": "a", "read": ["orders/v1/1"]},
                         {"client": "b", "read": ["orders/v1/1"]}])
    h = Harness()
    h.broker.rules = rules
    a, b = (Session(x, access=rules.for_client(x)) for x in "ab")
    h.subscribe(a, patterns=CH, group="g")
    e = refused(NotAuthorized, h.broker.set_position, b, "g", {CH2: 1}, h.now)
    assert e.detail == {"channel": CH2, "client": "b"}  # not the member's: b's own
    assert h.broker.read_refusals[CH2] == [1, "b"]


def test_lag_counts_what_the_group_has_not_been_handed_yet() -> None:
    h = Harness()
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2, 3, 4, 5, 6])
    h.ack(c, h.take(sub))  # 1 and 2
    assert h.broker.set_position(c, "g", {CH: 2}, h.now) == {CH: 4}  # 3..6
    assert h.broker.set_position(c, "g", {CH: 5}, h.now) == {CH: 2}  # 5, 6
    assert seqs(h.take(sub)) == [5, 6]


# ------------------------------------------------------------------- offsets
def test_offsets_answer_first_and_next_seq_per_channel() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2,
                                                           overflow="drop_oldest"))
    h.publish_values(CH, [1, 2, 3])
    h.publish_values(CH2, [4])
    h.publish_values("orders/v2/1", [5])
    c = Session("c")
    first = h.broker.channels[CH].first_seq
    assert h.broker.offsets(c, [CH, "orders/v1/*"]) == {CH: [first, 4], CH2: [1, 2]}
    assert h.broker.offsets(c, ["orders/v1/9", CH2]) == {CH2: [1, 2]}  # unknown: left out
    assert h.broker.offsets(c, ["orders/*"]) == {CH: [first, 4], CH2: [1, 2],
                                                "orders/v2/1": [1, 2]}


def test_offsets_of_a_free_exclusive_channel_by_name_claim_it() -> None:
    h = Harness()
    h.broker.rules = Rules.parse([{"client": "*", "read": ["orders/*", "!invoice/*"]}])
    h.publish(send("invoice/v1/1", 1), send("invoice/v1/2", 2))
    me = Session("me")  # its key's rules allow the wildcard (as before a reload)
    # Through a wildcard neither free exclusive channel is shown (nor claimed).
    assert h.broker.offsets(me, ["invoice/v1/*"]) == {}
    assert h.broker.offsets(me, ["invoice/v1/1"]) == {"invoice/v1/1": [1, 2]}
    assert h.broker.reservations == {"invoice/v1/1": "me"}
    assert h.broker.offsets(me, ["invoice/v1/*"]) == {"invoice/v1/1": [1, 2]}
    root = Session("root", admin=True)
    assert set(h.broker.offsets(root, ["invoice/v1/*"])) == {"invoice/v1/1", "invoice/v1/2"}


def test_offsets_in_steps_check_rights_at_once_and_let_others_go_between_steps() -> None:
    """OFFSETS-at matches its patterns a slice of channels a turn of the event loop
    (whole, 50,000 channels held it ~60 ms): the rules refuse at the call, before any
    step; the steps together answer what ``offsets`` does, each channel once however
    many wildcards match it; one removed between steps is left out, one made is not
    listed (the match is of the channels there were)."""
    h = Harness()
    h.broker.rules = Rules.parse([{"client": "*", "read": ["orders/*", "pay/*",
                                                          "!invoice/*"]}])
    h.publish(*(send(f"orders/v1/{i}", i) for i in range(10)), send("orders/v2/x", 1),
              send("pay/v1/1", 1), send("invoice/v1/1", 1))
    h.broker.offsets(Session("owner"), ["invoice/v1/1"])  # reserves it
    c = Session("c")
    refused(NotAuthorized, h.broker.match_offsets, c, ["orders/*", "invoice/v1/1"], {}, 3)
    patterns = ["orders/*", "orders/v1/*", CH, "pay/v1/1"]
    out: dict[str, list[int]] = {}
    steps = h.broker.match_offsets(c, patterns, out, 3)
    assert out == {CH: [1, 2], "pay/v1/1": [1, 2]}  # by name: at once
    taken = 0
    for _ in steps:
        taken += 1
        if taken == 1:  # between two steps: one channel goes, another comes
            del h.broker.channels["orders/v1/9"]
            h.publish(send("orders/v1/new", 1))
    assert taken == 4  # 13 channels, 3 a step: 5 steps, a yield between two
    whole = h.broker.offsets(c, patterns)
    assert out == {k: v for k, v in whole.items() if k != "orders/v1/new"}
    assert set(out) == {f"orders/v1/{i}" for i in range(9)} | {"orders/v2/x", "pay/v1/1"}
    assert Harness().broker.offsets(c, ["orders/*"]) == {}  # no channel at all


# ------------------------------------------------------- restart from seq:<n>
def test_a_group_without_members_restarts_from_a_seq_once_each() -> None:
    h = Harness()
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4, 5])
    h.publish(send(CH, "later", delay=30.0))  # seq 6
    assert seqs(h.take(sub)) == [1, 2, 3, 4, 5]
    h.disconnect(a)  # all five go back to the group's front
    b = Session("b")
    again = h.subscribe(b, patterns=CH, group="g", start="seq:3", prefetch=10)
    assert seqs(h.take(again)) == [3, 4, 5]  # not 1 and 2, and each once
    h.publish_values(CH, [7])
    assert seqs(h.take(again)) == [7]
    h.tick(30.0)
    assert seqs(h.take(again)) == [6]


def test_a_settled_group_seeks_back_with_a_seq_start() -> None:
    h = Harness()
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    h.ack(a, h.take(sub))
    assert h.pump() == {}
    h.broker.unsubscribe(a, 1, h.now)
    again = h.subscribe(a, 2, patterns=CH, group="g", start="seq:2", prefetch=10)
    assert seqs(h.take(again)) == [2, 3]
    h.commit()
    h = restart(h)
    after = h.subscribe(Session("c"), patterns=CH, group="g", prefetch=10)
    assert seqs(h.take(after)) == [2, 3]  # the replay was never acked: it comes back


# ------------------------------------------------------------ adding patterns
def test_an_added_pattern_reads_a_channel_with_a_delayed_message() -> None:
    h = Harness()
    h.publish(send(CH2, "later", delay=10.0))
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=10)
    h.broker.add_pattern(c, 1, CH2, h.now)
    assert h.take(sub) == []
    h.tick(10.0)
    assert [d.channel for d in h.take(sub)] == [CH2]


def test_a_refused_added_pattern_claims_nothing_and_is_recorded() -> None:
    rules = Rules.parse([{"client": c, "read": ["orders/*", "!invoice/*"]}
                         for c in ("me", "other")] + [{"client": "narrow", "read": [CH]}])
    h = Harness()
    h.broker.rules = rules
    me, other = (Session(x, access=rules.for_client(x)) for x in ("me", "other"))
    h.subscribe(other, patterns=CH, group="g")
    h.subscribe(me, patterns=CH, group="g")
    e = refused(NotAuthorized, h.broker.add_pattern, me, 1, "invoice/v1/1", h.now)
    assert e.detail == {"group": "g", "pattern": "invoice/v1/1"}  # the other member's
    assert h.broker.reservations == {}
    narrow = Session("narrow", access=rules.for_client("narrow"))
    h.subscribe(narrow, patterns=CH, group="g")
    e = refused(NotAuthorized, h.broker.add_pattern, narrow, 1, CH2, h.now)
    assert e.detail == {"channel": CH2, "client": "narrow"}  # its own refusal first
    assert h.broker.read_refusals[CH2] == [1, "narrow"]


# ---------------------------------------------------------- removing patterns
def test_a_removed_pattern_stops_the_group_reading_its_channels_for_good() -> None:
    h = Harness()
    c = Session("c")
    sub = h.subscribe(c, patterns=[CH, CH2], group="g", prefetch=1)
    h.publish_values(CH2, [1, 2])
    (d,) = h.take(sub)
    h.nack(c, [d], delay=5.0)  # a delayed retry on CH2
    h.broker.remove_pattern(c, 1, CH2, h.now)
    h.tick(5.0)
    assert h.pump() == {}  # neither the retry nor the waiting one
    h.publish_values(CH, [3])
    assert [(x.channel, x.seq) for x in h.take(sub)] == [(CH, 1)]
    h.commit()
    h = restart(h)
    grp = h.broker.groups["consume:g"]
    assert [p.text for p in grp.patterns] == [CH] and list(grp.gcs) == [CH]
    sub = h.subscribe(Session("d"), patterns=CH, group="g", prefetch=10)
    h.publish_values(CH2, [4])
    assert {x.channel for x in h.take(sub)} == {CH}


def test_removing_an_unknown_or_the_last_pattern_is_refused() -> None:
    h = Harness()
    c = Session("c")
    h.subscribe(c, patterns=CH, group="g")
    assert refused(BadRequest, h.broker.remove_pattern, c, 1, CH2, h.now).code == \
        ErrorCode.BAD_REQUEST
    assert refused(BadRequest, h.broker.remove_pattern, c, 1, CH, h.now).code == \
        ErrorCode.BAD_REQUEST
    e = refused(RequestError, h.broker.remove_pattern, c, 7, CH, h.now)
    assert (e.code, e.detail) == (ErrorCode.UNKNOWN_SUBSCRIPTION, {"sid": 7})


# --------------------------------------------------------- default prefetch
def test_a_subscription_without_prefetch_takes_its_queues() -> None:
    def options(key: str) -> ChannelOptions:
        return ChannelOptions(prefetch={"orders/v1": 2, "orders/v2": 3}.get(key, 5))

    default = ChannelOptions().prefetch  # a pattern over several queues: none of theirs
    assert default not in (2, 3, 5)
    cases = {"orders/v1/*": 2, "_dead/orders/v2/*": 3, "orders/v2/7": 3, "orders/*": default,
             "_dead/orders/*": default}
    for pattern, want in cases.items():
        h = Harness(channel_options=options)  # no channel yet: the options decide
        sub = h.subscribe(Session("c"), patterns=pattern, group="g")
        assert sub.prefetch == want, pattern
    h = Harness(channel_options=options)
    sub = h.subscribe(Session("c"), patterns="orders/v1/*", group="g")
    h.publish_values("orders/v1/1", [1, 2, 3])
    assert seqs(h.take(sub)) == [1, 2]  # its prefetch: 2 unsettled at most


# ------------------------------------------------------------ subscribe's limits
def test_subscribe_accepts_its_limits_and_refuses_past_them() -> None:
    from minou.limits import MAX_LEASE_S, MAX_PREFETCH, MAX_SUBSCRIPTIONS

    h = Harness()
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=MAX_PREFETCH, lease=MAX_LEASE_S)
    assert (sub.prefetch, sub.lease_s) == (MAX_PREFETCH, MAX_LEASE_S)
    for sid in range(2, MAX_SUBSCRIPTIONS + 1):
        h.subscribe(c, sid, patterns=CH, group="g")
    assert len(c.subs) == MAX_SUBSCRIPTIONS
    e = refused(BadRequest, h.subscribe, c, MAX_SUBSCRIPTIONS + 1, patterns=CH, group="g")
    assert e.code == ErrorCode.BAD_REQUEST and len(c.subs) == MAX_SUBSCRIPTIONS
    for start in ("seq:\u0663", "seq:", "seq:-1", "later"):  # only ASCII digits are a seq
        assert refused(BadRequest, h.subscribe, Session("d"), patterns=CH, group="h",
                       start=start).code == ErrorCode.BAD_REQUEST
    d = Session("d")
    for kw in ({"kind": "replay"}, {"patterns": []}, {"prefetch": MAX_PREFETCH + 1},
               {"prefetch": -1}, {"lease": MAX_LEASE_S + 1}, {"lease": -1.0}):
        args = {"patterns": CH, "group": "h", **kw}
        assert refused(BadRequest, h.subscribe, d, **args).code == ErrorCode.BAD_REQUEST, kw
    h.subscribe(d, 5, patterns=CH, group="h")
    assert refused(BadRequest, h.subscribe, d, 5, patterns=CH2).code == ErrorCode.BAD_REQUEST
    assert list(d.subs) == [5]


def test_a_refused_subscribe_names_the_callers_own_refusal_before_the_groups() -> None:
    rules = Rules.parse([{"client": "a", "read": [CH]}, {"client": "b", "read": [CH]}])
    h = Harness()
    h.broker.rules = rules
    a, b = (Session(x, access=rules.for_client(x)) for x in "ab")
    h.subscribe(a, patterns=CH, group="g")
    e = refused(NotAuthorized, h.subscribe, b, patterns=CH2, group="g")
    assert e.detail == {"channel": CH2, "client": "b"}
    assert h.broker.read_refusals[CH2] == [1, "b"]


def test_joining_a_group_claims_its_free_exclusive_channels() -> None:
    rules = Rules.parse([{"client": "*", "read": ["orders/*", "!invoice/*"]}])
    h = Harness()
    h.broker.rules = rules
    owner, joiner = (Session(x, access=rules.for_client(x)) for x in ("owner", "joiner"))
    h.subscribe(owner, patterns="invoice/v1/1", group="g")
    h.broker.unsubscribe(owner, 1, h.now)
    assert h.broker.release("invoice/v1/1") == "owner"
    h.subscribe(joiner, patterns=CH, group="g")  # the group still reads invoice/v1/1
    assert h.broker.reservations == {"invoice/v1/1": "joiner"}


def test_a_subscription_without_prefetch_over_existing_channels_takes_theirs() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(prefetch=2 if key == "orders/v1"
                                                           else 5))
    h.publish_values(CH, [1, 2, 3])
    sub = h.subscribe(Session("c"), patterns="orders/*", group="g")  # reads orders/v1/1
    assert sub.prefetch == 2
    assert seqs(h.take(sub)) == [1, 2]


def test_deliveries_returning_across_a_restart_from_a_seq_come_once() -> None:
    """A member leaves before its deliveries' attempt counts are stored (they go back
    only after the next commit), and the group restarts from seq:1 meanwhile: the returns
    land on the group's replaced state and must not deliver from it (XGROUP SETID gave
    3, 4, 5 twice when its commit came late)."""
    h = Harness()
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3, 4, 5])
    assert seqs(h.take(sub)) == [1, 2, 3, 4, 5]
    h.engine.close(a)  # no commit first: the five wait for it to come back
    b = Session("b")
    again = h.subscribe(b, patterns=CH, group="g", start="seq:1", prefetch=10)
    got = seqs(h.take(again))
    for _ in range(3):
        h.commit()
        got += seqs(h.take(again))
    assert sorted(got) == [1, 2, 3, 4, 5]
