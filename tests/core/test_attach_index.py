"""Which groups read a new channel, and which channels a new group (or pattern) reads,
found through the broker's indexes (``BrokerState.patterns``: pattern prefix -> groups;
``BrokerState.channel_index``: the channels under a wildcard's prefix), not by trying
every group against each new channel (~8 ms with 20,000 groups) nor every channel
against each new wildcard (~25 ms with 100,000 channels).

The answers must be exactly what trying all of them gave, in the same order (the order
groups are attached in is the order they were made; channels, the order they were
made), after groups are dropped, patterns added or removed, channels expired, released
or made again, and across a restart."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.broker import Broker, Session
from minou.core.group import Group
from minou.core.log import ChannelOptions
from minou.core.maintenance import delete_group
from minou.core.snapshot import queue_part
from minou.core.state import BrokerState
from minou.names import Pattern, match_keys, parse_pattern

from .helpers import Harness, send

IDLE = 60.0


def readers(h: Harness, channel: str) -> list[str]:
    """The groups reading ``channel``, in the order they were attached."""
    return [gc.group.key for gc in h.broker.channels[channel].states]


def channels_of(h: Harness, group: str) -> list[str]:
    return list(h.broker.groups[f"consume:{group}"].gcs)


def groups(h: Harness, specs: list[tuple[str, list[str]]]) -> None:
    """Consumer groups, made in this order, each reading its patterns."""
    s = Session("maker", admin=True)
    for sid, (name, patterns) in enumerate(specs, 1):
        h.subscribe(s, sid, patterns=patterns, group=name)
    h.disconnect(s)


@contextmanager
def counted_matches(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every check of one group, or of one pattern, against one channel."""
    calls = [0]
    real_keys, real_pattern = Group.matches_keys, Pattern.matches

    def matches_keys(self: Group, keys: list[str]) -> bool:
        calls[0] += 1
        return real_keys(self, keys)

    def matches(self: Pattern, channel: str) -> bool:
        calls[0] += 1
        return real_pattern(self, channel)

    with monkeypatch.context() as m:
        m.setattr(Group, "matches_keys", matches_keys)
        m.setattr(Pattern, "matches", matches)
        yield calls


SPECS = [
    ("v1", ["a/v1/*"]),
    ("one", ["a/v1/1"]),
    ("ab", ["ab/*"]),  # a name that starts with "a" is not under "a/"
    ("all", ["a/*"]),
    ("both", ["a/*", "a/v1/*"]),  # matched twice over: attached once
    ("dead", ["_dead/a/*"]),
    ("deadv1", ["_dead/a/v1/*"]),
    ("b", ["b/v1/*"]),
]


# ------------------------------------------------- a new channel -> its groups
def test_a_new_channel_is_read_by_exactly_the_groups_that_match_it_in_their_order() -> None:
    h = Harness()
    groups(h, SPECS)
    h.publish(send("a/v1/2", 1), send("a/v2/x", 1), send("ab/v1/1", 1), send("b/v1/1", 1),
              send("c/v1/1", 1))
    # a/v1/1 exists already: group "one" made it, and the wildcards made before read it
    assert readers(h, "a/v1/1") == ["consume:v1", "consume:one", "consume:all",
                                    "consume:both"]
    assert readers(h, "a/v1/2") == ["consume:v1", "consume:all", "consume:both"]
    assert readers(h, "a/v2/x") == ["consume:all", "consume:both"]
    assert readers(h, "ab/v1/1") == ["consume:ab"]
    assert readers(h, "b/v1/1") == ["consume:b"]
    assert readers(h, "c/v1/1") == []


def test_a_dead_letter_channel_is_read_by_the_groups_of_dead_letters_only() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(requeue_limit=0))
    groups(h, SPECS)
    s = Session("c")
    sub = h.subscribe(s, patterns="a/v2/*", group="worker")
    h.publish(send("a/v2/1", 1))
    h.nack(s, h.take(sub))  # over its requeue limit: to _dead/a/v2/1
    assert readers(h, "_dead/a/v2/1") == ["consume:dead"]
    h.publish(send("a/v1/3", 1))
    h.broker.state.log("_dead/a/v1/3", h.now)  # as dead_letters.py makes one
    assert readers(h, "_dead/a/v1/3") == ["consume:dead", "consume:deadv1"]


def test_a_group_deleted_or_expired_reads_no_new_channel() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(
        expire_idle=IDLE if key.startswith("tmp/") else None))
    groups(h, [("w", ["a/*"]), ("x", ["a/v1/*"]), ("y", ["a/*"])])
    delete_group(h.broker, "consume:x", h.now)
    listener = Session("l")
    h.subscribe(listener, kind="listen", patterns="tmp/v1/a")  # goes with its channel
    h.disconnect(listener)
    h.tick(IDLE + 2)
    assert "tmp/v1/a" not in h.broker.channels
    assert not any(k.startswith("listen:") for k in h.broker.groups)
    h.publish(send("a/v1/1", 1), send("tmp/v1/a", 1))
    assert readers(h, "a/v1/1") == ["consume:w", "consume:y"]
    assert readers(h, "tmp/v1/a") == []
    # Made again under the name of a deleted one: it comes after those made before.
    groups(h, [("x", ["a/*"])])
    h.publish(send("a/v1/2", 1))
    assert readers(h, "a/v1/2") == ["consume:w", "consume:y", "consume:x"]


def test_patterns_added_and_removed_later_decide_which_new_channels_a_group_reads() -> None:
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns="a/v1/*", group="g")
    h.broker.add_pattern(s, sub.sid, "b/*", h.now)
    h.broker.add_pattern(s, sub.sid, "c/v1/1", h.now)
    h.publish(send("b/v9/1", 1))
    assert readers(h, "b/v9/1") == ["consume:g"]
    assert readers(h, "c/v1/1") == ["consume:g"]
    h.broker.subscriptions.remove_pattern(s, sub.sid, "a/v1/*")
    h.broker.subscriptions.remove_pattern(s, sub.sid, "b/*")
    h.publish(send("a/v1/5", 1), send("b/v9/2", 1))
    assert readers(h, "a/v1/5") == [] and readers(h, "b/v9/2") == []
    assert channels_of(h, "g") == ["c/v1/1"]


def test_a_new_channel_is_not_tried_against_every_group(monkeypatch) -> None:
    """Making a channel looks its groups up; it does not try each of the groups held."""
    h = Harness()
    state = h.broker.state
    for i in range(500):
        state.add_group(Group(f"consume:g{i}", "consume", [parse_pattern(f"e{i}/v1/*")]))
    with counted_matches(monkeypatch) as calls:
        h.publish(send("e7/v1/new", 1), send("nobody/v1/reads", 1))
    assert readers(h, "e7/v1/new") == ["consume:g7"]
    assert calls[0] <= 2, f"{calls[0]} checks of a group against a channel for 2 channels"


# ------------------------------------------------ a new group -> its channels
def test_a_new_wildcard_group_reads_exactly_the_channels_it_matches_in_their_order() -> None:
    h = Harness()
    names = ["a/v1/2", "b/v1/1", "a/v2/1", "ab/v1/1", "a/v1/1", "_dead/a/v1/1", "_dead/b/v1/1"]
    for name in names:
        h.broker.state.log(name, h.now)
    groups(h, [("all", ["a/*"]), ("v1", ["a/v1/*"]), ("dead", ["_dead/a/*"]),
               ("both", ["a/v2/*", "a/v1/*"]),
               ("none", ["zz/*"])])
    assert channels_of(h, "all") == ["a/v1/2", "a/v2/1", "a/v1/1"]
    assert channels_of(h, "v1") == ["a/v1/2", "a/v1/1"]
    assert channels_of(h, "dead") == ["_dead/a/v1/1"]
    # its patterns one after the other, each's channels in the order they were made
    assert channels_of(h, "both") == ["a/v2/1", "a/v1/2", "a/v1/1"]
    assert channels_of(h, "none") == []


def test_a_new_group_reads_no_expired_channel_and_one_made_again() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(
        expire_idle=IDLE if key.startswith("tmp/") else None))
    h.publish(send("tmp/v1/a", 1), send("tmp/v1/b", 1), send("tmp/v2/c", 1))
    h.tick(IDLE + 2)
    assert not any(n.startswith("tmp/") for n in h.broker.channels)
    groups(h, [("g", ["tmp/*"])])
    assert channels_of(h, "g") == []
    h.publish(send("tmp/v1/b", 2))  # made again: read by the group
    h.tick(IDLE + 2)  # the group has no member: it expires again, the group stays
    h.publish(send("tmp/v2/c", 2))
    groups(h, [("later", ["tmp/*"])])
    assert channels_of(h, "later") == ["tmp/v2/c"]
    groups(h, [("named", ["tmp/v1/b"])])  # by name: made again by its reader, and so
    assert channels_of(h, "named") == ["tmp/v1/b"]  # read by the wildcards too
    assert channels_of(h, "g") == channels_of(h, "later") == ["tmp/v2/c", "tmp/v1/b"]


def test_a_released_queue_is_read_by_no_new_group_until_adopted_again() -> None:
    h = Harness()
    h.publish(send("orders/v1/1", 1), send("orders/v2/1", 1), send("prices/v1/1", 1))
    h.commit()
    snap = h.storage.open(h.now)
    h.broker.release_queue("orders/v1", h.now)
    groups(h, [("g", ["orders/*"])])
    assert channels_of(h, "g") == ["orders/v2/1"]
    h.broker.adopt(queue_part(snap, "orders/v1"), h.now)
    groups(h, [("later", ["orders/*"])])
    assert channels_of(h, "later") == ["orders/v2/1", "orders/v1/1"]


def test_a_new_wildcard_is_not_tried_against_every_channel(monkeypatch) -> None:
    h = Harness()
    for i in range(500):
        h.broker.state.log(f"q{i % 50}/v1/c{i}", h.now)
    with counted_matches(monkeypatch) as calls:
        groups(h, [("g", ["q7/v1/*"]), ("none", ["zz/*"])])
    assert len(channels_of(h, "g")) == 10
    assert calls[0] <= 10, f"{calls[0]} checks of a pattern against a channel"


def test_a_restart_attaches_unsaved_channels_and_keeps_the_index(tmp_path) -> None:
    from minou.storage.sqlite import SQLiteStorage

    st = SQLiteStorage(tmp_path / "db")
    st.open(1000.0)
    h = Harness(storage=st, now=1000.0)
    groups(h, [("v1", ["a/v1/*"]), ("all", ["a/*"]), ("gone", ["a/*"])])
    delete_group(h.broker, "consume:gone", h.now)
    h.commit()
    st.close()
    st = SQLiteStorage(tmp_path / "db")
    b = Broker()
    b.restore(st.open(h.now), h.now)
    h2 = Harness(broker=b, storage=st, now=h.now)
    h2.publish(send("a/v1/1", 1))
    # in the order of the groups as restored (storage's), without the deleted one
    assert list(b.groups) == sorted(["consume:v1", "consume:all"])
    assert readers(h2, "a/v1/1") == list(b.groups)
    st.close()


# ------------------------------------- the indexes against trying every one
ENDPOINTS = ["a", "ab", "b"]
VERSIONS = ["v1", "v2"]
IDS = ["1", "2", "x"]
NAMES = [f"{d}{e}/{v}/{i}" for d in ("", "_dead/") for e in ENDPOINTS for v in VERSIONS
         for i in IDS]
PATTERNS = NAMES + [f"{d}{e}/*" for d in ("", "_dead/") for e in ENDPOINTS] + \
    [f"{d}{e}/{v}/*" for d in ("", "_dead/") for e in ENDPOINTS for v in VERSIONS]

op = st.one_of(
    st.tuples(st.just("channel"), st.sampled_from(NAMES)),
    st.tuples(st.just("forget"), st.sampled_from(NAMES)),
    st.tuples(st.just("group"), st.integers(0, 5), st.lists(st.sampled_from(PATTERNS),
                                                            max_size=3)),
    st.tuples(st.just("drop"), st.integers(0, 5)),
    st.tuples(st.just("add"), st.integers(0, 5), st.sampled_from(PATTERNS)),
    st.tuples(st.just("set"), st.integers(0, 5), st.lists(st.sampled_from(PATTERNS),
                                                          max_size=3)),
)


def _check(state: BrokerState) -> None:
    groups_ = list(state.groups.values())
    for name in NAMES:
        scan = [g for g in groups_ if any(p.matches(name) for p in g.patterns)]
        assert state.patterns.groups_of(match_keys(name)) == scan, name
    logs = list(state.channels.values())
    for text in PATTERNS:
        pattern = parse_pattern(text)
        if not pattern.concrete:
            scan = [log for log in logs if log.name.startswith(pattern.prefix)]
            assert state.channel_index.matching(pattern.prefix) == scan, text
    # Nothing more is kept than the channels and the groups' patterns hold.
    assert len(state.channel_index) == len(logs)
    assert state.channel_index.prefixes() == {
        key for log in logs for key in match_keys(log.name)[1:]}
    assert state.patterns.total == sum(len(g.patterns) for g in groups_)
    assert {prefix: set(bucket) for prefix, bucket in state.patterns.readers.items()} == {
        prefix: {g for g in groups_ if prefix in g.prefixes}
        for prefix in {p for g in groups_ for p in g.prefixes}}


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_the_indexes_answer_what_trying_every_group_and_channel_does(ops: list[Any]) -> None:
    b = Broker()
    state = b.state
    for o in ops:
        kind = o[0]
        if kind == "channel":
            state.log(o[1], 0.0)
        elif kind == "forget" and o[1] in state.channels:
            state.drop_channel(state.channels[o[1]])
        elif kind == "group":
            state.add_group(Group(f"g{o[1]}", "consume",
                                  list({t: parse_pattern(t) for t in o[2]}.values())))
        elif kind == "drop" and f"g{o[1]}" in state.groups:
            state.drop_group(state.groups[f"g{o[1]}"])
        elif kind == "add" and f"g{o[1]}" in state.groups:
            state.groups[f"g{o[1]}"].add_pattern(parse_pattern(o[2]))
        elif kind == "set" and f"g{o[1]}" in state.groups:
            state.groups[f"g{o[1]}"].set_patterns(
                list({t: parse_pattern(t) for t in o[2]}.values()))
        _check(state)
