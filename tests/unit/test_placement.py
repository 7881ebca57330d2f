"""Rendezvous placement of queues over brokers (server/placement.py): every broker
agrees, a join or a leave moves only what it must, the load spreads evenly."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from minou.server.placement import assign, moves, owner, ranking, weight

names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1,
                max_size=12)
members = st.lists(names, min_size=1, max_size=6, unique=True)
queues = st.lists(names, min_size=1, max_size=40, unique=True)


@given(members, queues)
def test_every_broker_agrees_whatever_order_it_lists_the_members_in(ms, qs):
    for q in qs:
        assert owner(q, ms) == owner(q, reversed(ms)) == ranking(q, ms)[0]
        assert sorted(ranking(q, ms)) == sorted(ms)


@given(members, queues, names)
def test_a_broker_that_leaves_moves_its_own_queues_only_each_to_its_second_choice(
        ms, qs, gone):
    before = [*ms, gone] if gone not in ms else ms
    after = [m for m in before if m != gone]
    for q, frm, to in moves(qs, before, after):
        assert frm == gone
        assert to == (ranking(q, before)[1] if after else None)
    kept = {q for q in qs if owner(q, before) != gone}
    assert kept.isdisjoint(q for q, _, _ in moves(qs, before, after))


@given(members, queues, names)
def test_a_broker_that_joins_takes_queues_and_nothing_else_moves(ms, qs, new):
    after = [*ms, new] if new not in ms else ms
    for _, frm, to in moves(qs, ms, after):
        assert to == new and frm in ms


def test_the_load_spreads_evenly_and_a_join_moves_about_its_share():
    qs = [f"orders{i}/v1" for i in range(3000)]
    three = ["broker-a", "broker-b", "broker-c"]
    counts = Counter(owner(q, three) for q in qs)
    assert set(counts) == set(three)
    assert all(900 <= n <= 1100 for n in counts.values()), counts  # 1000 each, +-10 %
    moved = moves(qs, three, [*three, "broker-d"])
    assert 600 <= len(moved) <= 900, len(moved)  # a quarter of 3000 = 750
    assert {to for _, _, to in moved} == {"broker-d"}
    assert sum(len(v) for v in assign(qs, [*three, "broker-d"]).values()) == 3000


@settings(max_examples=50)
@given(queues)
def test_with_nobody_left_nobody_owns_anything(qs):
    assert all(owner(q, []) is None for q in qs)
    assert assign(qs, []) == {}
    assert moves(qs, ["a"], []) == [(q, "a", None) for q in sorted(set(qs))]


def test_the_weight_is_the_same_on_every_machine():
    # BLAKE2b-64 of "broker-a\0orders/v1", big-endian, not Python's per-process hash():
    # a change here would re-place every queue of a running cluster at an upgrade.
    assert weight("broker-a", "orders/v1") == 0xD6C951A946A6779A
    assert assign(["orders/v1"], ["broker-a", "broker-b"])[
        owner("orders/v1", ["broker-a", "broker-b"])] == ["orders/v1"]
