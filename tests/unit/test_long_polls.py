"""Long polls waiting for commits (server/long_polls.py), without a broker: a commit
wakes exactly the polls whose patterns match a channel it wrote, looked up by the
channel's keys rather than every pattern tried; a client holds only so many."""

from __future__ import annotations

import random

import pytest

from minou.auth.registry import Identity
from minou.errors import TooManyConnections
from minou.names import Pattern, match_keys, parse_pattern
from minou.server.long_polls import LongPolls, PatternWaiters

CHANNELS = ["orders/v1/1", "orders/v1/10", "orders/v2/1", "orders2/v1/1", "order/v1/1",
            "_dead/orders/v1/1", "_dead/orders/v2/7", "_dead/order/v1/1", "pay/v1/a%2Fb",
            "_inbox/v1/me", "_kv/v1/config", "v1/v1/1", "_dead/v1/v1/1"]
PATTERNS = ["orders/v1/1", "orders/v1/10", "orders/*", "orders/v1/*", "orders/v2/*",
            "order/*", "orders2/*", "_dead/orders/*", "_dead/orders/v1/*",
            "_dead/orders/v1/1", "_dead/order/v1/*", "pay/v1/a%2Fb", "pay/*", "_inbox/v1/*",
            "_kv/v1/config", "v1/*", "_dead/v1/*", "_dead/v1/v1/*"]


def test_a_pattern_matches_a_channel_exactly_when_its_prefix_is_one_of_the_channels_keys(
) -> None:
    for text in PATTERNS:
        pattern = parse_pattern(text)
        for channel in CHANNELS:
            assert pattern.matches(channel) == (pattern.prefix in match_keys(channel)), \
                (text, channel)
    assert match_keys("_dead/orders/v1/1") == ["_dead/orders/v1/1", "_dead/",
                                               "_dead/orders/", "_dead/orders/v1/"]


class Poll:
    """A waiting poll: its patterns, and how many times it was woken."""

    def __init__(self, texts: list[str]) -> None:
        self.patterns = [parse_pattern(t) for t in texts]
        self.woken = 0

    def __call__(self) -> None:
        self.woken += 1


def test_a_commit_wakes_exactly_the_polls_its_channels_match_once_each() -> None:
    waiters = PatternWaiters()
    polls = {text: Poll([text]) for text in PATTERNS}
    both = Poll(["orders/v1/1", "orders/*", "orders/v1/1"])  # matched twice, given twice
    for poll in [*polls.values(), both]:
        waiters.add(poll.patterns, poll)
    assert len(waiters) == len(PATTERNS) + 1
    waiters.wake({"orders/v1/1", "_dead/orders/v2/7"})
    woken = {text for text, poll in polls.items() if poll.woken}
    assert woken == {"orders/v1/1", "orders/*", "orders/v1/*", "_dead/orders/*"}
    assert both.woken == 1 and all(p.woken <= 1 for p in polls.values())
    assert len(waiters) == len(PATTERNS) + 1 - 5  # the woken are forgotten
    waiters.wake({"orders/v1/1"})  # nobody waits for it any more
    assert both.woken == 1 and polls["orders/*"].woken == 1
    # "orders2/", "order/" are not what "orders/v1/10" starts with; a concrete name is
    # not a prefix: "orders/v1/1" woke nothing more.
    waiters.wake({"orders/v1/10"})
    assert polls["orders/v1/10"].woken == 1
    assert polls["order/*"].woken == polls["orders2/*"].woken == 0


def test_the_index_agrees_with_trying_every_pattern() -> None:
    rng = random.Random(7)
    for _ in range(200):
        waiters = PatternWaiters()
        polls = [Poll(rng.sample(PATTERNS, rng.randint(1, 4))) for _ in range(30)]
        for poll in polls:
            waiters.add(poll.patterns, poll)
        commit = set(rng.sample(CHANNELS, rng.randint(1, 3)))
        waiters.wake(commit)
        for poll in polls:
            expected = any(p.matches(ch) for p in poll.patterns for ch in commit)
            assert poll.woken == int(expected), ([p.text for p in poll.patterns], commit)
        assert len(waiters) == sum(1 for poll in polls if not poll.woken)


def test_a_commit_tries_no_pattern_and_forgetting_leaves_nothing_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 polls of 256 patterns each were each tried against every channel of a
    commit (17.6 s for one of 100 channels); the index never calls ``matches``."""
    def tried(self: Pattern, channel: str) -> bool:
        raise AssertionError("a pattern was tried against a channel")

    waiters = PatternWaiters()
    polls = [Poll([f"ep{i % 50}/v{j + 1}/*" for j in range(20)] + [f"ep{i}/v1/x"])
             for i in range(2_000)]
    for poll in polls:
        waiters.add(poll.patterns, poll)
    monkeypatch.setattr(Pattern, "matches", tried)
    waiters.wake({f"other/v1/{n}" for n in range(100)})
    assert not any(poll.woken for poll in polls)
    waiters.wake({"ep3/v2/z"})  # ep3, ep53, ep103, ...: 40 of them
    assert sum(poll.woken for poll in polls) == 40
    for poll in polls:  # timed out: each forgets itself (twice is harmless)
        waiters.remove(poll)
        waiters.remove(poll)
    assert len(waiters) == 0 and not waiters._by_key


def test_a_client_holds_only_so_many_slots_and_gives_each_back() -> None:
    polls = LongPolls(per_kind=5, per_client=2)
    alice, bob = Identity("alice", False), Identity("bob", False)
    admin = Identity("ops", True)
    with polls.slot("KV watches", alice), polls.slot("channels.wait long polls", alice):
        with pytest.raises(TooManyConnections, match="max_long_polls_per_client") as \
                refused, polls.slot("KV watches", alice):
            pass
        assert refused.value.detail == {"limit": 2, "client": "alice"}
        assert "client 'alice' has 2 long polls waiting" in refused.value.message
        with polls.slot("KV watches", bob), polls.slot("KV watches", admin), \
                polls.slot("KV watches", None), polls.slot("KV watches", admin):
            # The kind's bound holds for everyone, admins and the broker too.
            for caller in (Identity("carol", False), admin, None):
                with pytest.raises(TooManyConnections, match="MAX_KV_WAITERS"), \
                        polls.slot("KV watches", caller):
                    pass
            with polls.slot("channels.wait long polls", bob):  # the other kind: its own
                pass
    assert not polls.kinds and not polls.clients  # nothing kept once all gave back
    with pytest.raises(ValueError), polls.slot("KV watches", alice):  # a poll that fails
        raise ValueError
    assert not polls.clients


def test_the_engine_wakes_a_pattern_wait_once_a_commit_makes_a_match_durable() -> None:
    """channels.wait (a federation pipe's long poll) waits in Engine.pattern_waiters."""
    from tests.core.helpers import Harness, send

    h = Harness()
    woken: list[str] = []
    h.engine.pattern_waiters.add([parse_pattern("orders/v1/*")], lambda: woken.append("o"))
    h.engine.pattern_waiters.add([parse_pattern("prices/*")], lambda: woken.append("p"))
    h.publish(send("orders/v1/1", 1), commit=False)
    assert woken == []  # staged is not durable
    h.commit()
    assert woken == ["o"] and len(h.engine.pattern_waiters) == 1
    h.publish(send("orders/v1/2", 2), send("prices/v2/eu", 3))
    assert woken == ["o", "p"] and len(h.engine.pattern_waiters) == 0
