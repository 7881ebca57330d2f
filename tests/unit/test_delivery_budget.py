"""The delivery budget (server/delivery_budget.py): a connection over its share is
paused only while all connections together hold more than the limit; a recount makes
the running total exact again and resumes the others."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.limits import BUDGET_SHARE
from minou.server.delivery_budget import DeliveryBudget


class Conn:
    """A connection as the budget sees it: what it noted, and whether it is paused."""

    def __init__(self) -> None:
        self.unsent_noted = 0
        self.paused = False

    def set_budget_paused(self, paused: bool) -> None:
        self.paused = paused


def test_default_share_is_the_configured_one() -> None:
    assert DeliveryBudget().share == BUDGET_SHARE


def test_a_write_pauses_only_a_connection_over_its_share_while_the_total_is_over() -> None:
    budget = DeliveryBudget(share=100)
    a, b = Conn(), Conn()
    assert budget.note(a, 100, limit=150) is False  # at its share: not over it
    assert budget.note(b, 50, limit=150) is False  # total 150 == limit: not over it
    assert budget.note(b, 51, limit=150) is False  # total over, but b is under its share
    assert budget.note(a, 101, limit=150) is True  # total over and a over its share
    assert budget.running == 152
    assert (a.unsent_noted, b.unsent_noted) == (101, 51)


def test_at_the_limit_or_at_its_share_a_connection_goes_on() -> None:
    budget = DeliveryBudget(share=100)
    a, b = Conn(), Conn()
    budget.note(b, 60, limit=1_000)
    assert budget.note(a, 100, limit=150) is False  # total over, a exactly at its share
    assert budget.note(a, 101, limit=161) is False  # a over its share, total at the limit
    assert budget.note(a, 102, limit=161) is True


def test_a_big_write_under_the_limit_does_not_pause() -> None:
    budget = DeliveryBudget(share=10)
    assert budget.note(Conn(), 500, limit=1_000) is False


def test_a_write_counts_only_what_changed_since_the_connection_last_noted() -> None:
    budget = DeliveryBudget(share=10)
    a = Conn()
    budget.note(a, 300, limit=1_000)
    budget.note(a, 200, limit=1_000)  # it sent 100 of them meanwhile... and wrote again
    assert budget.running == 200
    # Only if the total were counted twice would this cross the limit.
    assert budget.note(a, 400, limit=500) is False
    assert budget.running == 400


def test_recount_pauses_those_over_their_share_only_while_the_total_is_over() -> None:
    budget = DeliveryBudget(share=100)
    slow, fast, idle = Conn(), Conn(), Conn()
    assert budget.recount([(slow, 101), (fast, 100), (idle, 0)], limit=200) == 201
    assert (slow.paused, fast.paused, idle.paused) == (True, False, False)
    assert budget.running == 201
    assert (slow.unsent_noted, fast.unsent_noted, idle.unsent_noted) == (101, 100, 0)
    # fast caught up: the total is back at the limit, everyone is resumed.
    assert budget.recount([(slow, 101), (fast, 99), (idle, 0)], limit=200) == 200
    assert (slow.paused, fast.paused, idle.paused) == (False, False, False)
    assert budget.running == 200


def test_after_a_recount_writes_count_from_the_exact_total() -> None:
    budget = DeliveryBudget(share=10)
    a, b = Conn(), Conn()
    budget.note(a, 500, limit=10_000)
    budget.note(b, 500, limit=10_000)
    budget.recount([(a, 0), (b, 20)], limit=10_000)  # a's reader read it all
    assert budget.note(a, 30, limit=49) is True  # 20 + 30 > 49, and 30 > share
    assert budget.running == 50


@settings(derandomize=True, max_examples=40, deadline=None)
@given(
    share=st.integers(0, 50),
    limit=st.integers(0, 150),
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.integers(0, 2), st.integers(0, 100)),
            st.tuples(st.just("recount"), st.lists(st.integers(0, 100), min_size=3,
                                                   max_size=3)),
        ),
        max_size=12,
    ),
)
def test_budget_matches_its_rule(share: int, limit: int, steps: list) -> None:
    """Whatever the order of writes and recounts: a write pauses its connection exactly
    when the noted total is over the limit and its own bytes are over the share; a
    recount pauses exactly those over their share while the exact total is over."""
    budget = DeliveryBudget(share=share)
    conns = [Conn(), Conn(), Conn()]
    noted = [0, 0, 0]
    for step in steps:
        if step[0] == "write":
            _, i, buffered = step
            noted[i] = buffered
            assert budget.note(conns[i], buffered, limit) == (
                sum(noted) > limit and buffered > share)
            assert budget.running == sum(noted)
        else:
            sizes = step[1]
            noted = list(sizes)
            assert budget.recount(list(zip(conns, sizes, strict=True)), limit) == sum(sizes)
            over = sum(sizes) > limit
            assert [c.paused for c in conns] == [over and s > share for s in sizes]
            assert budget.running == sum(sizes)
        assert [c.unsent_noted for c in conns] == noted
