"""Fair delivery in a consumer group: the round-robin turn moves only on a delivery,
and a message that came back from a member goes to another member that can take it."""

from __future__ import annotations

from collections import Counter

from minou.core.broker import Session
from minou.core.group import Subscription
from minou.server import engine

from .helpers import Harness, payloads

CH = "jobs/v1/1"


def test_spaced_messages_are_shared_evenly_by_idle_members() -> None:
    """30 messages published one at a time (pump rounds in between find nothing) over 3
    idle members: 10 each, not all to the first."""
    h = Harness()
    members = {}
    for name in ("a", "b", "c"):
        s = Session(name)
        members[name] = (s, h.subscribe(s, patterns="jobs/v1/*", group="g", prefetch=1))
    got: Counter[str] = Counter()
    for i in range(30):
        h.pump()  # an empty round, as the server's pump runs on every tick
        h.publish_values(f"jobs/v1/{i % 4}", [i])
        for sub, items in h.pump().items():
            name = sub.session.client_id
            got[name] += len(items)
            h.ack(members[name][0], items)
        h.tick(0.1)
    assert sum(got.values()) == 30
    assert all(abs(n - 10) <= 1 for n in got.values()), got


def test_a_message_whose_lease_expired_goes_to_another_member() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", lease=2.0)
    sb = h.subscribe(b, patterns=CH, group="g", lease=2.0)
    h.publish_values(CH, ["job"])
    first = h.pump()
    assert list(first) in ([sa], [sb])
    other = sb if sa in first else sa
    h.tick(2.5)  # the holder never acks: its lease runs out
    again = h.pump()
    assert list(again) == [other] and payloads(again[other]) == ["job"]
    assert again[other][0].attempts == 2
    # The holder is not forgotten for new work: the next message is its turn again.
    h.ack(other.session, again[other])
    h.publish_values(CH, ["next"])
    assert sum(len(v) for v in h.pump().values()) == 1


def test_a_message_never_acked_by_one_member_reaches_the_idle_one_before_dead_letters(
) -> None:
    """Member A takes every message and never settles; B is idle. With a requeue limit
    of 10, B gets the message on the first redelivery instead of A using up every try."""
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", lease=1.0, prefetch=100)
    sb = h.subscribe(b, patterns=CH, group="g", lease=1.0, prefetch=1)
    h.publish_values(CH, ["poison"])
    to_a = h.pump().get(sa, [])
    if not to_a:  # B had the first turn: let it time out once so A holds it
        h.tick(1.5)
        to_a = h.pump().get(sa, [])
    assert payloads(to_a) == ["poison"]
    h.tick(1.5)
    assert payloads(h.pump().get(sb, [])) == ["poison"]


def test_a_nacked_message_goes_to_another_member_with_credit() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g")
    sb = h.subscribe(b, patterns=CH, group="g")
    h.publish_values(CH, ["job"])
    first = h.pump()
    holder = sa if sa in first else sb
    other = sb if holder is sa else sa
    assert h.nack(holder.session, first[holder]) == []
    assert list(h.pump()) == [other]


def test_with_one_member_a_returned_message_still_comes_back_to_it() -> None:
    h = Harness()
    a = Session("a")
    sa = h.subscribe(a, patterns=CH, group="g", lease=1.0)
    h.publish_values(CH, ["job"])
    assert payloads(h.take(sa)) == ["job"]
    h.tick(1.5)
    again = h.take(sa)
    assert payloads(again) == ["job"] and again[0].attempts == 2


def test_the_memory_of_where_messages_came_back_from_is_bounded(monkeypatch) -> None:
    """Past ``RETURNED_FROM_LIMIT`` remembered returns (stale ones pile up when their
    messages are purged or expire), the memory starts afresh: the returns before lose
    their preference, the one that reached the limit keeps it."""
    from minou.core import settlement

    monkeypatch.setattr(settlement, "RETURNED_FROM_LIMIT", 2)
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=3)
    h.publish_values(CH, [1, 2, 3])
    got = h.take(sa)
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=3)
    h.nack(a, got[:2])  # two remembered: the limit
    h.nack(a, got[2:])  # the memory starts afresh with this one
    out = h.pump()
    # 1 and 2 go round-robin (a's turn first), 3 avoids a.
    assert (payloads(out[sa]), payloads(out[sb])) == ([1], [2, 3])


# ------------------------------------------------------------ bursts per round
def _five_big(prefetch: int) -> tuple[Harness, Session, Subscription]:
    """A member (session "a", group g) with ``prefetch``, and five messages of about
    300 KB published: four of them make a round's burst."""
    h = Harness()
    s = Session("a")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=prefetch)
    h.publish_values(CH, ["x" * 300_000 for _ in range(5)])
    return h, s, sub


def test_a_member_at_its_burst_gets_the_rest_in_the_next_round() -> None:
    h, _, sub = _five_big(10)
    turn = engine.pump(h.broker, h.now)
    assert len(turn.deliveries[sub]) == 4 and turn.again  # more is ready at once
    turn = engine.pump(h.broker, h.now)
    assert len(turn.deliveries[sub]) == 1 and not turn.again


def test_a_member_at_its_burst_and_its_prefetch_waits_for_acks_not_rounds() -> None:
    h, s, sub = _five_big(4)
    turn = engine.pump(h.broker, h.now)
    got = turn.deliveries[sub]
    assert len(got) == 4 and not turn.again  # nothing to do until an ack
    assert engine.pump(h.broker, h.now).deliveries == {}
    h.ack(s, got[:1])
    turn = engine.pump(h.broker, h.now)
    assert len(turn.deliveries[sub]) == 1


def test_a_round_ends_when_a_member_reaches_its_burst_exactly() -> None:
    from minou.limits import BURST_BYTES
    h = Harness()
    sub = h.subscribe(Session("a"), patterns=CH, group="g", prefetch=10)
    # Each delivery counts its body and 64 bytes of framing: four make the burst.
    body = BURST_BYTES // 4 - 64
    h.publish_values(CH, ["x" * (body - 2) for _ in range(5)])
    turn = engine.pump(h.broker, h.now)
    assert [len(d.data) for d in turn.deliveries[sub]] == [body] * 4
    assert len(engine.pump(h.broker, h.now).deliveries[sub]) == 1


# ------------------------------------------------------------ what a delivery says
class _Latency:
    def __init__(self) -> None:
        self.seen: list[float] = []

    def observe(self, value: float) -> None:
        self.seen.append(value)

    def observe_since(self, now: float, times: list[float]) -> None:
        self.seen.extend(now - t for t in times)


def test_a_delivery_carries_what_the_publisher_set_and_counts() -> None:
    from .helpers import send

    h = Harness()
    latency = _Latency()
    h.broker.delivery_latency = latency
    s = Session("a")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=5, lease=30.0)
    (o,) = h.publish(send(CH, {"n": 1}, headers={"h": "v"}, priority=3, key="k1"))
    h.publish(send(CH, "r", raw=True))
    published = h.now
    h.advance(2.0)
    d, r = h.take(sub)
    assert (d.channel, d.seq, d.id, payloads([d]), d.raw, d.headers, d.attempts,
            d.published_at, d.priority, d.key) == (
        CH, o.seq, o.id, [{"n": 1}], False, {"h": "v"}, 1, published, 3, "k1")
    assert r.raw is True and r.key is None and r.priority == 0
    assert latency.seen == [2.0, 2.0]  # published -> first delivered
    c = h.broker.counters
    assert (c.delivered, c.redelivered) == (2, 0)
    h.nack(s, [d])
    (again,) = h.take(sub)
    assert again.attempts == 2 and again.tag not in (d.tag, r.tag)
    assert (c.delivered, c.redelivered) == (3, 1)
    assert latency.seen == [2.0, 2.0]  # a redelivery is not a first delivery
    stats = h.broker.group_stats(sub.group, h.now)
    assert (stats["delivered"], stats["in_flight"]) == (3, 2)


def test_a_message_back_from_the_member_whose_turn_it_is_goes_to_the_next_in_turn() -> None:
    """Three members took one message each, so the turn is back at the first; it returns
    its message, which then goes to the member after it in the round (the second), not
    to whichever member with credit the round ends on."""
    h = Harness()
    members = [h.subscribe(Session(n), patterns=CH, group="g", prefetch=10) for n in "abc"]
    h.publish_values(CH, ["m1", "m2", "m3"])
    first = h.pump()
    assert [payloads(first[s]) for s in members] == [["m1"], ["m2"], ["m3"]]
    assert h.nack(members[0].session, first[members[0]]) == []
    again = h.pump()
    assert list(again) == [members[1]] and payloads(again[members[1]]) == ["m1"]


def test_a_member_without_credit_passes_its_turn_to_the_next_member_not_the_first() -> None:
    """The round is a, b, c; b can hold one message only. Once b is full, each of its
    turns goes to the member after it (c), not back to the first of the group (a): six
    messages split a 3, b 1, c 2."""
    h = Harness()
    members = [h.subscribe(Session(n), patterns=CH, group="g", prefetch=p)
               for n, p in (("a", 10), ("b", 1), ("c", 10))]
    h.publish_values(CH, [f"m{i}" for i in range(1, 7)])
    got = h.pump()
    assert [payloads(got[s]) for s in members] == [["m1", "m4", "m6"], ["m2"], ["m3", "m5"]]
