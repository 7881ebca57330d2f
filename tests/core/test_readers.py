"""Consume (competing consumers), listen (fan-out, durable), start positions, patterns."""

from __future__ import annotations

import pytest

from minou.core.broker import Session
from minou.core.log import ChannelOptions
from minou.errors import BadRequest, InvalidChannel, QueueFull, UnknownSubscription

from .helpers import Harness, payloads, send, seqs

CH = "orders/v1/1"


# -------------------------------------------------------------------- consume
def test_consumers_of_one_group_share_round_robin() -> None:
    h = Harness()
    sessions = [Session(f"c{i}") for i in range(3)]
    subs = [h.subscribe(s, patterns=CH, group="g", prefetch=1) for s in sessions]
    h.publish_values(CH, list(range(6)))
    got = h.pump()
    assert [seqs(got[sub]) for sub in subs] == [[1], [2], [3]]
    for s, sub in zip(sessions, subs, strict=True):
        assert h.ack(s, got[sub]) == []
    got = h.pump()
    assert [seqs(got[sub]) for sub in subs] == [[4], [5], [6]]


def test_round_robin_with_larger_prefetch_alternates() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=3)
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=3)
    h.publish_values(CH, list(range(6)))
    got = h.pump()
    assert seqs(got[sa]) == [1, 3, 5]
    assert seqs(got[sb]) == [2, 4, 6]


def test_prefetch_bounds_unsettled_and_ack_frees_credit() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, list(range(5)))
    first = h.take(sub)
    assert seqs(first) == [1, 2]
    assert sub.unsettled == 2 and sub.credit == 0
    assert h.pump() == {}
    assert h.ack(s, first[:1]) == []
    assert sub.credit == 1
    assert seqs(h.take(sub)) == [3]
    assert h.pump() == {}
    h.ack(s, first[1:])
    assert seqs(h.take(sub)) == [4]


def test_default_prefetch_comes_from_channel_options() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(prefetch=3 if key == "orders/v1"
                                                           else 1))
    h.publish_values(CH, list(range(5)))
    sub = h.subscribe(Session("c"), patterns=CH, group="g")
    assert sub.prefetch == 3
    assert seqs(h.take(sub)) == [1, 2, 3]
    sub2 = h.subscribe(Session("d"), patterns="other/v1/*", group="g2")
    assert sub2.prefetch == 1


def test_two_groups_each_get_every_message() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="billing", prefetch=10)
    sb = h.subscribe(b, patterns=CH, group="shipping", prefetch=10)
    h.publish_values(CH, ["x", "y", "z"])
    got = h.pump()
    assert payloads(got[sa]) == ["x", "y", "z"]
    assert payloads(got[sb]) == ["x", "y", "z"]


def test_messages_wait_for_a_consumer_that_was_not_connected() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2])
    sub = h.subscribe(Session("late"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == [1, 2]


def test_a_group_rotates_over_its_channels() -> None:
    h = Harness()
    h.publish_values("orders/v1/a", ["a1", "a2"])
    h.publish_values("orders/v1/b", ["b1", "b2"])
    sub = h.subscribe(Session("c"), patterns="orders/v1/*", group="g", prefetch=10)
    got = payloads(h.take(sub))
    assert sorted(got) == ["a1", "a2", "b1", "b2"]
    assert got.index("a1") < got.index("a2") and got.index("b1") < got.index("b2")
    assert got[:2] in (["a1", "b1"], ["b1", "a1"])  # the channels take turns


def test_wildcard_consumer_picks_up_channels_created_later() -> None:
    h = Harness()
    sub = h.subscribe(Session("c"), patterns="orders/*", group="g", prefetch=10)
    h.publish(send("orders/v1/1", 1), send("orders/v2/9", 2), send("other/v1/1", 3))
    assert sorted(payloads(h.take(sub))) == [1, 2]


# --------------------------------------------------------------------- listen
def test_each_listener_gets_its_own_copy() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    la = h.subscribe(a, kind="listen", patterns=CH, prefetch=10)
    lb = h.subscribe(b, kind="listen", patterns=CH, prefetch=10)
    h.publish_values(CH, [1, 2])
    got = h.pump()
    assert payloads(got[la]) == [1, 2]
    assert payloads(got[lb]) == [1, 2]
    assert la.group is not lb.group


def test_durable_listener_gets_the_backlog_after_reconnecting() -> None:
    h = Harness()
    s1 = Session("svc")
    sub = h.subscribe(s1, kind="listen", patterns=CH, name="audit", prefetch=10)
    h.publish_values(CH, [1])
    got = h.take(sub)
    h.ack(s1, got)
    h.disconnect(s1)
    h.publish_values(CH, [2, 3])
    assert h.pump() == {}
    s2 = Session("svc")  # same client id, new connection
    sub2 = h.subscribe(s2, kind="listen", patterns=CH, name="audit", prefetch=10)
    assert sub2.group is sub.group
    assert payloads(h.take(sub2)) == [2, 3]


def test_listener_with_other_client_id_or_name_is_not_the_durable_one() -> None:
    h = Harness()
    s1 = Session("svc")
    h.subscribe(s1, kind="listen", patterns=CH, name="audit")
    h.disconnect(s1)
    h.publish_values(CH, [1])
    other_client = h.subscribe(Session("other"), kind="listen", patterns=CH, name="audit")
    other_name = h.subscribe(Session("svc"), kind="listen", patterns=CH, name="other")
    assert h.pump() == {}  # both start at new messages
    assert other_client.group.key != other_name.group.key


def test_unacked_listener_deliveries_come_back_after_reconnect() -> None:
    h = Harness()
    s1 = Session("svc")
    sub = h.subscribe(s1, kind="listen", patterns=CH, prefetch=10)
    h.publish_values(CH, [1, 2])
    assert seqs(h.take(sub)) == [1, 2]
    h.disconnect(s1)
    s2 = Session("svc")
    sub2 = h.subscribe(s2, kind="listen", patterns=CH, prefetch=10)
    got = h.take(sub2)
    assert seqs(got) == [1, 2]
    assert [d.attempts for d in got] == [2, 2]


@pytest.mark.parametrize(
    ("start", "expected"),
    [("", [4, 5]), ("new", [4, 5]), ("oldest", [1, 2, 3, 4, 5]), ("seq:2", [2, 3, 4, 5]),
     ("seq:0", [1, 2, 3, 4, 5]), ("seq:99", [])],
)
def test_listen_start_positions(start: str, expected: list[int]) -> None:
    h = Harness()
    h.publish_values(CH, [1, 2, 3])
    sub = h.subscribe(Session("c"), kind="listen", patterns=CH, start=start, prefetch=10)
    h.publish_values(CH, [4, 5])
    assert seqs(h.take(sub)) == expected


def test_consume_defaults_to_oldest_and_can_start_new() -> None:
    h = Harness()
    h.publish_values(CH, [1, 2])
    old = h.subscribe(Session("a"), patterns=CH, group="g1", prefetch=10)
    new = h.subscribe(Session("b"), patterns=CH, group="g2", start="new", prefetch=10)
    h.publish_values(CH, [3])
    got = h.pump()
    assert seqs(got[old]) == [1, 2, 3]
    assert seqs(got[new]) == [3]


def test_replay_resets_an_idle_durable_listener() -> None:
    h = Harness()
    s1 = Session("svc")
    sub = h.subscribe(s1, kind="listen", patterns=CH, prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    h.ack(s1, h.take(sub))
    h.engine.close(s1)  # before a commit truncates what the group acked
    s2 = Session("svc")
    sub2 = h.subscribe(s2, kind="listen", patterns=CH, start="seq:2", prefetch=10)
    assert seqs(h.take(sub2)) == [2, 3]


def test_bad_start_prefetch_kind_and_duplicate_sid_are_refused() -> None:
    h = Harness()
    s = Session("c")
    with pytest.raises(BadRequest):
        h.subscribe(s, patterns=CH, start="seq:x")
    with pytest.raises(BadRequest):
        h.subscribe(s, patterns=CH, prefetch=-1)
    with pytest.raises(BadRequest):
        h.subscribe(s, kind="watch", patterns=CH)
    with pytest.raises(BadRequest):
        h.subscribe(s, patterns=[])
    h.subscribe(s, 7, patterns=CH)
    with pytest.raises(BadRequest):
        h.subscribe(s, 7, patterns=CH)


# ------------------------------------------------------------------ patterns
def test_add_pattern_and_remove_pattern() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns="orders/v1/a", group="g", prefetch=10)
    h.publish(send("orders/v1/a", "a1"), send("orders/v1/b", "b1"))
    assert payloads(h.take(sub)) == ["a1"]
    h.broker.add_pattern(s, 1, "orders/v1/b", h.now)
    assert payloads(h.take(sub)) == ["b1"]  # consume: from the oldest message
    assert [p.text for p in sub.group.patterns] == ["orders/v1/a", "orders/v1/b"]
    assert h.broker.batch.group_defs["consume:g"].patterns == ("orders/v1/a", "orders/v1/b")
    h.broker.remove_pattern(s, 1, "orders/v1/a", h.now)
    assert "orders/v1/a" not in sub.group.gcs
    assert h.broker.batch.group_states[("consume:g", "orders/v1/a")] is None
    h.publish(send("orders/v1/a", "a2"), send("orders/v1/b", "b2"))
    assert payloads(h.take(sub)) == ["b2"]


def test_remove_pattern_releases_the_credit_of_its_unsettled_deliveries() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=["orders/v1/a", "orders/v1/b"], group="g", prefetch=1)
    h.publish(send("orders/v1/a", "a1"))
    (d,) = h.take(sub)
    assert sub.credit == 0
    h.broker.remove_pattern(s, 1, "orders/v1/a", h.now)
    assert sub.credit == 1
    assert h.ack(s, [d])[0][0] == d.tag  # that delivery is gone with the pattern
    h.publish(send("orders/v1/b", "b1"))
    assert payloads(h.take(sub)) == ["b1"]


def test_add_pattern_on_a_listener_starts_at_new_messages() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, kind="listen", patterns="orders/v1/a", prefetch=10)
    h.publish(send("orders/v1/b", "old"))
    h.broker.add_pattern(s, 1, "orders/v1/b", h.now)
    assert h.pump() == {}
    h.publish(send("orders/v1/b", "new"))
    assert payloads(h.take(sub)) == ["new"]


def test_pattern_errors() -> None:
    h = Harness()
    s = Session("c")
    h.subscribe(s, patterns="orders/v1/a", group="g")
    with pytest.raises(BadRequest):
        h.broker.remove_pattern(s, 1, "orders/v1/zzz", h.now)
    with pytest.raises(BadRequest):
        h.broker.remove_pattern(s, 1, "orders/v1/a", h.now)  # the last one
    with pytest.raises(UnknownSubscription):
        h.broker.add_pattern(s, 2, "orders/v1/b", h.now)


def test_unsubscribe_returns_unsettled_to_the_group() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=2)
    h.publish_values(CH, [1, 2])
    assert seqs(h.take(sa)) == [1, 2]
    h.store_attempts()
    h.broker.unsubscribe(a, 1, h.now)
    assert a.subs == {} and a.leases == {}
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=2)
    assert seqs(h.take(sb)) == [1, 2]


def test_credit_freed_by_remove_pattern_delivers_the_waiting_backlog() -> None:
    # Regression: detach freed credit without putting the group back in ready_groups.
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=["orders/v1/a", "orders/v1/b"], group="g", prefetch=1)
    h.publish(send("orders/v1/a", "a1"))
    assert payloads(h.take(sub)) == ["a1"]
    h.publish(send("orders/v1/b", "b1"))
    assert h.pump() == {}  # no credit
    h.broker.remove_pattern(s, 1, "orders/v1/a", h.now)
    h.tick(1.0)
    assert payloads(h.take(sub)) == ["b1"]


def test_invalid_patterns_are_refused_without_side_effects() -> None:
    h = Harness()
    s = Session("c")
    with pytest.raises(InvalidChannel):
        h.subscribe(s, patterns=["orders/v1/a", "orders/x/*"], group="g")
    assert s.subs == {} and h.broker.groups == {} and h.broker.channels == {}
    h.subscribe(s, patterns="orders/v1/a", group="g")
    with pytest.raises(InvalidChannel):
        h.broker.add_pattern(s, 1, "orders//*", h.now)
    assert [p.text for p in h.broker.groups["consume:g"].patterns] == ["orders/v1/a"]


def _trimmed(h: Harness, channel: str, values: list[object]) -> None:
    """``values`` published to ``channel``, their bodies then dropped from memory (as
    the cache budget does): a reader needs a load from storage to get them."""
    h.publish_values(channel, values)
    budget, h.broker.cache_budget = h.broker.cache_budget, 0
    h.broker.trim_cache()
    h.broker.cache_budget = budget


def test_two_groups_waiting_for_the_same_page_cause_one_load() -> None:
    h = Harness()
    _trimmed(h, "jobs/v1/1", [1, 2])
    for name in ("g1", "g2"):
        h.subscribe(Session(name), patterns="jobs/v1/1", group=name, prefetch=10)
    out, loads = h.broker.pump(h.now)
    assert out == {}
    assert [(need.log.name, need.seq) for need in loads] == [("jobs/v1/1", 1)]


def test_a_channel_waiting_for_its_load_holds_up_none_of_the_groups_other_channels() -> None:
    h = Harness()
    _trimmed(h, "jobs/v1/a", ["on disk"])
    h.publish_values("jobs/v1/b", ["in memory"])
    sub = h.subscribe(Session("c"), patterns="jobs/v1/*", group="g", prefetch=10)
    out, loads = h.broker.pump(h.now)
    assert [need.log.name for need in loads] == ["jobs/v1/a"]
    assert payloads(out[sub]) == ["in memory"]  # in the same round, not after the load


# ------------------------------------------------------- names and how many groups
@pytest.mark.parametrize("kind, field", [("consume", "group"), ("listen", "name")])
@pytest.mark.parametrize("bad", ["a\x00b", "\u202eevil", "x" * 513, "line\nbreak", "tab\there"])
def test_a_group_or_listener_name_is_bounded_and_printable(kind: str, field: str, bad: str
                                                           ) -> None:
    h = Harness()
    with pytest.raises(BadRequest) as caught:
        h.subscribe(Session("c"), patterns=CH, kind=kind, **{field: bad})
    assert caught.value.message.startswith(("group name", "listener name"))
    assert h.broker.state.groups == {}
    # A name of 512 printable characters, "/", spaces and non-ASCII letters included
    # (Redis group names may hold spaces), is fine.
    h.subscribe(Session("c"), patterns=CH, kind=kind, **{field: "é/ " + "x" * 509})


def test_set_position_refuses_a_bad_group_name_before_making_the_group() -> None:
    h = Harness()
    with pytest.raises(BadRequest):
        h.broker.set_position(Session("c"), "x" * 513, {CH: 1}, h.now)
    with pytest.raises(BadRequest):
        h.broker.set_position(Session("c"), "", {CH: 1}, h.now)
    assert h.broker.state.groups == {}


def test_the_broker_keeps_at_most_max_groups_groups(monkeypatch) -> None:
    import minou.core.subscriptions as subscriptions

    monkeypatch.setattr(subscriptions, "MAX_GROUPS", 3)
    h = Harness()
    c = Session("c")
    for i in range(3):
        h.subscribe(c, i + 1, patterns=CH, group=f"g{i}")
    with pytest.raises(QueueFull) as caught:
        h.subscribe(c, 9, patterns=CH, group="g9")
    assert caught.value.detail == {"limit": 3} and "consume:g9" not in h.broker.state.groups
    with pytest.raises(QueueFull):
        h.broker.set_position(c, "g9", {CH: 1}, h.now)
    # Joining a group that exists makes none: still allowed at the bound.
    h.subscribe(Session("d"), 1, patterns=CH, group="g0")


def test_one_client_may_make_only_its_share_of_the_groups(monkeypatch) -> None:
    """MAX_GROUPS is the broker's: one client (not an admin) may make at most
    MAX_GROUPS_PER_CLIENT of them, so it cannot use them all and lock every other
    client out of new groups. A group it deleted leaves its share."""
    import minou.core.subscriptions as subscriptions
    from minou.core.maintenance import delete_group

    monkeypatch.setattr(subscriptions, "MAX_GROUPS_PER_CLIENT", 2)
    h = Harness()
    c = Session("c")
    h.subscribe(c, 1, patterns=CH, group="g0")
    h.broker.set_position(c, "g1", {CH: 1}, h.now)
    with pytest.raises(QueueFull) as caught:
        h.subscribe(c, 3, patterns=CH, group="g2")
    assert caught.value.detail == {"limit": 2}
    assert "client 'c' made 2 of the consumer groups" in caught.value.message
    with pytest.raises(QueueFull):
        h.broker.set_position(c, "g2", {CH: 1}, h.now)
    with pytest.raises(QueueFull):  # a durable listener is a group too
        h.subscribe(c, 4, kind="listen", patterns=CH, name="l")
    assert "consume:g2" not in h.broker.state.groups
    h.subscribe(c, 5, patterns=CH, group="g0")  # joining one that exists: allowed
    h.subscribe(Session("d"), 1, patterns=CH, group="d0")  # others: their own share
    h.subscribe(Session("root", admin=True), 1, patterns=CH, group="a0")
    h.subscribe(Session("root", admin=True), 1, patterns=CH, group="a1")
    h.subscribe(Session("root", admin=True), 1, patterns=CH, group="a2")
    delete_group(h.broker, "consume:g1", h.now)
    h.subscribe(c, 6, patterns=CH, group="g2")


def test_a_group_reads_a_bounded_number_of_patterns(monkeypatch) -> None:
    """Each pattern a group reads is kept for good (stored with the group) and each
    channel it names is a channel read: MAX_PATTERNS_PER_GROUP bounds them, counted as
    distinct texts, refused whole (nothing of the request is added or made)."""
    import minou.core.subscriptions as subscriptions

    monkeypatch.setattr(subscriptions, "MAX_PATTERNS_PER_GROUP", 3)
    h = Harness()
    c = Session("c")
    with pytest.raises(BadRequest):  # one request past the bound: refused as it is
        h.subscribe(c, 1, patterns=[f"a/v1/{i}" for i in range(4)], group="g")
    sub = h.subscribe(c, 1, patterns=["a/v1/1", "a/v1/1", "a/v1/2"], group="g")
    grp = sub.group
    h.broker.subscriptions.add_pattern(c, 1, "a/v1/1", h.now)  # read already: free
    h.broker.subscriptions.add_pattern(c, 1, "b/v1/*", h.now)
    assert [p.text for p in grp.patterns] == ["a/v1/1", "a/v1/2", "b/v1/*"]
    with pytest.raises(QueueFull) as caught:
        h.broker.subscriptions.add_pattern(c, 1, "a/v1/3", h.now)
    assert caught.value.detail == {"limit": 3}
    assert "the group would read 4 patterns" in caught.value.message
    with pytest.raises(QueueFull):
        h.broker.set_position(c, "g", {"a/v1/1": 1, "c/v1/1": 1}, h.now)
    with pytest.raises(QueueFull):  # joining with one more is adding one more
        h.subscribe(Session("d"), 1, patterns=["a/v1/1", "d/v1/*"], group="g")
    assert len(grp.patterns) == 3 and not {"a/v1/3", "c/v1/1"} & set(h.broker.state.channels)
    h.broker.set_position(c, "g", {"a/v1/1": 1}, h.now)  # within: positioned
    with pytest.raises(QueueFull):  # a new group is bounded the same
        h.broker.set_position(c, "g2", {f"e/v1/{i}": 1 for i in range(4)}, h.now)
    assert "consume:g2" not in h.broker.state.groups


def test_a_group_matches_by_name_and_by_wildcard_after_changes() -> None:
    """The group's patterns are indexed (names in a set, wildcards apart): what it
    matches follows every add and remove."""
    h = Harness()
    c = Session("c")
    sub = h.subscribe(c, 1, patterns=["a/v1/1", "b/*"], group="g")
    grp = sub.group
    assert grp.matches("a/v1/1") and grp.matches("b/v2/x") and not grp.matches("a/v1/2")
    h.broker.subscriptions.add_pattern(c, 1, "a/v1/*", h.now)
    assert grp.matches("a/v1/2")
    h.broker.subscriptions.remove_pattern(c, 1, "a/v1/*")
    h.broker.subscriptions.remove_pattern(c, 1, "b/*")
    assert grp.matches("a/v1/1") and not grp.matches("a/v1/2") and not grp.matches("b/v2/x")
    h.broker.subscriptions.add_pattern(c, 1, "b/*", h.now)  # removed, then read again
    assert grp.matches("b/v1/y") and [p.text for p in grp.patterns] == ["a/v1/1", "b/*"]


def test_a_group_made_before_the_name_bounds_is_still_joined() -> None:
    """Names are checked when a group is made: one stored before (a tab in its name,
    say) is joined and positioned as before, its state kept."""
    from minou.core.group import Group
    from minou.names import consume_group_key

    h = Harness()

    old = consume_group_key("old\tgroup")
    h.broker.state.groups[old] = Group(old, "consume", [])
    sub = h.subscribe(Session("d"), patterns=CH, group="old\tgroup")
    assert sub.group is h.broker.state.groups[old]
    h.broker.set_position(Session("d"), "old\tgroup", {CH: 1}, h.now)


def test_a_refused_new_group_claims_no_exclusive_channel(monkeypatch) -> None:
    """The bounds on a new group are checked before the read claims a free exclusive
    channel: a refused subscribe leaves the channel free for someone else."""
    import minou.core.subscriptions as subscriptions
    from minou.auth.rules import Rules

    monkeypatch.setattr(subscriptions, "MAX_GROUPS", 0)
    rules = Rules.parse([{"client": "*", "read": ["!invoice/*"]}])
    h = Harness()
    h.broker.rules = rules
    c = Session("c", access=rules.for_client("c"))
    with pytest.raises(QueueFull):
        h.subscribe(c, patterns="invoice/v1/1", group="g")
    with pytest.raises(QueueFull):
        h.broker.set_position(c, "g", {"invoice/v1/1": 1}, h.now)
    assert h.broker.state.reservations == {}


def test_joining_with_the_patterns_a_group_reads_writes_nothing_about_it() -> None:
    """A group's definition is stored when its patterns change, once per request: a
    member joining with the patterns it reads already changes nothing to store."""
    h = Harness()
    h.subscribe(Session("a"), 1, patterns=["a/v1/1", "b/*"], group="g")
    assert list(h.broker.state.batch.group_defs) == ["consume:g"]
    h.commit()
    h.subscribe(Session("b"), 1, patterns=["b/*", "a/v1/1"], group="g")
    h.broker.set_position(Session("b"), "g", {"a/v1/1": 1}, h.now)
    assert h.broker.state.batch.group_defs == {}
    h.subscribe(Session("c"), 1, patterns=["b/*", "c/v1/1"], group="g")
    assert h.broker.state.batch.group_defs["consume:g"].patterns == ("a/v1/1", "b/*", "c/v1/1")


def test_queues_spread_over_brokers_a_reader_makes_only_this_brokers_channels() -> None:
    """With queues spread over brokers (``hosts``), a reader naming another broker's
    channel makes nothing of it here, and it does not count against max_channels; the
    bound counts exactly the channels that would be made."""
    h = Harness()
    h.broker.state.hosts = lambda channel: channel.startswith("mine/")
    h.broker.max_channels = 2
    h.publish(send("mine/v1/0", 1))
    s = Session("c")
    sub = h.subscribe(s, 1, patterns=["mine/v1/1", "theirs/v1/1", "theirs/v1/2"],
                      group="g")  # one made here: exactly the room left
    assert sorted(h.broker.state.channels) == ["mine/v1/0", "mine/v1/1"]
    assert sorted(sub.group.gcs) == ["mine/v1/1"]
    with pytest.raises(QueueFull):
        h.subscribe(s, 2, patterns=["mine/v1/2"], group="g2")
    h.subscribe(s, 3, patterns=["theirs/v1/3"], group="g3")  # another broker's: room


def test_the_patterns_of_all_groups_are_bounded_and_counted(monkeypatch) -> None:
    """Each pattern is held for good with its group: MAX_GROUP_PATTERNS bounds them over
    every group and MAX_GROUP_PATTERNS_PER_CLIENT over the groups one client made (one
    client's 2,000 groups of 10,000 patterns held ~5 GiB). The count follows every
    add, remove and deleted group."""
    import minou.core.subscriptions as subscriptions
    from minou.core.maintenance import delete_group

    monkeypatch.setattr(subscriptions, "MAX_GROUP_PATTERNS", 6)
    monkeypatch.setattr(subscriptions, "MAX_GROUP_PATTERNS_PER_CLIENT", 4)
    h = Harness()
    c, d = Session("c"), Session("d")
    count = h.broker.state.patterns
    h.subscribe(c, 1, patterns=["a/v1/1", "b/*"], group="g1")
    h.subscribe(c, 2, patterns=["c/*", "d/v1/*"], group="g2")  # c's 4: its share
    assert count.total == 4
    with pytest.raises(QueueFull) as caught:
        h.subscribe(c, 3, patterns=["e/*"], group="g3")
    assert caught.value.detail == {"client": "c", "limit": 4}
    h.subscribe(c, 4, patterns=["b/*"], group="g1")  # joined, nothing new: allowed
    h.subscribe(d, 1, patterns=["e/*", "f/*"], group="d1")  # 6: the broker's all
    with pytest.raises(QueueFull) as caught:
        h.subscribe(d, 2, patterns=["g/*"], group="d2")
    assert caught.value.detail == {"limit": 6}
    h.subscribe(Session("root", admin=True), 1, patterns=["b/*"], group="g1")  # nothing new
    h.broker.subscriptions.remove_pattern(c, 2, "d/v1/*")
    assert count.total == 5
    h.broker.subscriptions.add_pattern(d, 1, "g/*", h.now)  # the room given back
    h.broker.unsubscribe(c, 1, h.now)
    h.broker.unsubscribe(c, 4, h.now)
    delete_group(h.broker, "consume:g1", h.now, force=True)
    assert count.total == 4 == sum(len(g.patterns) for g in h.broker.state.groups.values())
    h.subscribe(c, 5, patterns=["h/*", "i/*"], group="g5")


def test_a_group_matches_dead_letters_only_by_their_own_patterns() -> None:
    """Patterns are looked up by prefix: ``orders/*`` reads no dead letter of orders,
    ``_dead/orders/*`` reads them all, a name reads that channel only."""
    h = Harness()
    grp = h.subscribe(Session("c"), 1, patterns=["orders/*"], group="g").group
    assert grp.matches("orders/v2/x") and not grp.matches("_dead/orders/v1/1")
    assert not grp.matches("ordersx/v1/1") and not grp.matches("orders")
    dead = h.subscribe(Session("c"), 2, patterns=["_dead/orders/*", "pay/v1/7"],
                       group="d").group
    assert dead.matches("_dead/orders/v1/1") and not dead.matches("orders/v1/1")
    assert dead.matches("pay/v1/7") and not dead.matches("pay/v1/70")


def test_channels_by_name_and_new_channels_are_matched_without_trying_patterns(
        monkeypatch) -> None:
    """A group finds its channels by lookups: naming 2,000 channels, positioning them,
    making a new channel and asking whether a group reads one never try a pattern
    against a channel (doing so per pattern per channel made one request of 10,000
    names stall the broker 18.7 s)."""
    from minou.names import Pattern

    h = Harness()
    for i in range(50):
        h.publish(send(f"old/v1/{i}", i))
    names = [f"old/v1/{i}" for i in range(2_000)]
    s = Session("c")
    h.subscribe(s, 2, patterns=["new/*", "old/v2/*"], group="w")  # a wildcard: a scan

    def tried(self: Pattern, channel: str) -> bool:
        raise AssertionError(f"{self.text!r} tried against {channel!r}")

    monkeypatch.setattr(Pattern, "matches", tried)
    sub = h.subscribe(s, 1, patterns=names, group="g")
    h.broker.set_position(s, "p", dict.fromkeys(names, 1), h.now)
    assert len(sub.group.gcs) == 2_000 and len(sub.group.patterns) == 2_000
    h.publish(send("new/v1/x", 1))  # a new channel: each group looked up, none tried
    assert "new/v1/x" in h.broker.state.groups["consume:w"].gcs
    assert sub.group.matches("old/v1/7") and not sub.group.matches("old/v1/x")
