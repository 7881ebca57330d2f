"""The bytes unsettled deliveries hold (``core/in_flight.py``): a subscription stops
at its own bound, at its share once all of them together hold the limit, always gets
one message when it holds nothing, and every way a delivery ends gives its bytes back
(a missed one would stall its consumer for good)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from minou.core import maintenance
from minou.core.broker import Session
from minou.core.group import Subscription
from minou.core.log import Msg, read_weight
from minou.protocol.frames import Delivery, Send

from .helpers import Harness, seqs

CH = "orders/v1/1"
BODY = b'"' + b"x" * 1_000 + b'"'  # 1,002 bytes of JSON
WEIGHT = len(BODY) + 512  # read_weight: payload and the fixed part


def big(n: int, channel: str = CH) -> list[Send]:
    return [Send(channel, BODY) for _ in range(n)]


def harness(*, limit: int = 1 << 40, share: int = 1 << 40, per_sub: int = 1 << 40
            ) -> Harness:
    h = Harness()
    h.broker.in_flight.configure(limit, share, per_sub)
    return h


def accounted(h: Harness) -> int:
    """Check the pool against the leases themselves: each subscription holds the weight
    of its live deliveries, the total is their sum. Returns the total."""
    held: dict[int, int] = {}
    for grp in h.broker.groups.values():
        for gc in grp.gcs.values():
            for lease in gc.pending.values():
                if not lease.returning:
                    held[id(lease.sub)] = held.get(id(lease.sub), 0) + lease.weight
    for grp in h.broker.groups.values():
        for sub in grp.members:
            assert sub.held == held.get(id(sub), 0), (sub.sid, sub.held, held)
    assert h.broker.in_flight.total == sum(held.values())
    return h.broker.in_flight.total


def test_a_subscription_at_its_byte_bound_gets_nothing_more_until_it_acks() -> None:
    h = harness(per_sub=4 * WEIGHT - 1)  # the 4th delivery crosses it
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(*big(10))
    first = h.take(sub)
    assert seqs(first) == [1, 2, 3, 4]  # prefetch would have allowed all 10
    assert h.take(sub) == []
    assert accounted(h) == 4 * WEIGHT
    h.ack(c, first[:1])  # back under its bound: the ack's wake delivers again
    assert seqs(h.take(sub)) == [5]
    h.ack(c, first[1:])
    assert seqs(h.take(sub)) == [6, 7, 8]
    assert accounted(h) == 4 * WEIGHT


def test_a_subscription_holding_nothing_gets_a_message_larger_than_every_bound() -> None:
    h = harness(limit=10, share=10, per_sub=10)
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(*big(3))
    got = h.take(sub)
    assert seqs(got) == [1]
    assert h.take(sub) == []
    h.ack(c, got)
    assert seqs(h.take(sub)) == [2]


def test_past_the_limit_a_subscription_within_its_share_goes_on_and_a_heavy_one_waits(
) -> None:
    h = harness(limit=3 * WEIGHT, share=2 * WEIGHT)
    a, b = Session("a"), Session("b")
    heavy = h.subscribe(a, patterns=CH, group="ga", prefetch=100)
    h.publish(*big(10))
    taken = h.take(heavy)
    assert seqs(taken) == [1, 2, 3]  # the third reaches the limit: it holds past its share
    light = h.subscribe(b, patterns=CH, group="gb", prefetch=100)
    # Another group: it gets messages until it holds its own share, then waits too.
    got = h.take(light)
    assert seqs(got) == [1, 2]
    assert h.take(heavy) == [] and h.take(light) == []
    assert accounted(h) == 5 * WEIGHT
    # The heavy reader's acks take the total under the limit: the stopped group wakes
    # though its member acked nothing, and takes one more (reaching the limit again).
    heavy.paused = True  # (its connection stopped reading: it takes nothing now)
    h.ack(a, taken)
    assert seqs(h.pump().get(light, [])) == [3]
    assert accounted(h) == 3 * WEIGHT
    heavy.paused = False
    h.broker.mark_ready(heavy.group)  # (what its connection's resume does)
    assert seqs(h.take(heavy)) == [4, 5]  # within its share it goes on
    assert h.take(heavy) == [] and h.take(light) == []


def test_the_pool_filling_mid_pump_stops_the_other_members_of_the_group_at_once() -> None:
    """The pump asks a member for its credit once, then only after delivering to it:
    the pool filling on one member's delivery lowers every member's bound, so the
    others are asked again before the next message (a member past the new share gets
    none, however much credit it had when the pump began)."""
    h = harness(limit=3 * WEIGHT, share=WEIGHT)
    a, b = Session("a"), Session("b")
    first = h.subscribe(a, patterns=CH, group="g", prefetch=100)
    second = h.subscribe(b, patterns=CH, group="g", prefetch=100)
    h.publish(*big(10))
    out = h.pump()
    # Round-robin: the third delivery reaches the limit; both now hold their share.
    assert seqs(out[first]) == [1, 3] and seqs(out[second]) == [2]
    assert h.pump() == {}
    assert accounted(h) == 3 * WEIGHT


def test_a_member_with_one_credit_left_when_the_pool_fills_still_gets_it_that_pump() -> None:
    """The pool fills on the third delivery (to ``first``); ``second`` (prefetch 2)
    holds one message, under the new share, and has room for one more: it gets the
    next message in the same pump."""
    h = harness(limit=3 * WEIGHT, share=2 * WEIGHT)
    a, b = Session("a"), Session("b")
    first = h.subscribe(a, patterns=CH, group="g", prefetch=100)
    second = h.subscribe(b, patterns=CH, group="g", prefetch=2)
    h.publish(*big(10))
    out = h.pump()
    assert seqs(out[first]) == [1, 3] and seqs(out[second]) == [2, 4]
    assert h.pump() == {}
    assert accounted(h) == 4 * WEIGHT


def test_header_heavy_messages_are_weighed_by_what_they_hold_in_memory() -> None:
    """A 3-byte message with 64 headers and a key holds ~9.8 KB of objects (Msg.size)
    and was weighed 1,283 (read_weight: the headers' text alone, no key): the bound
    meant for 4 of them let 31 through."""
    headers = {f"h{i:02d}": "v" for i in range(64)}
    heavy = [Send(CH, b'"x"', headers=dict(headers), key=f"k{i:03d}") for i in range(40)]
    weight = Msg(CH, 1, "", b'"x"', headers=headers, key="k000").size()
    assert weight > 7 * read_weight(Msg(CH, 1, "", b'"x"', headers=headers))
    h = harness(per_sub=4 * weight - 1)  # the 4th delivery crosses it
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(*heavy)
    first = h.take(sub)
    assert seqs(first) == [1, 2, 3, 4], len(first)
    assert h.take(sub) == []
    assert accounted(h) == 4 * weight
    h.ack(c, first)
    assert seqs(h.take(sub)) == [5, 6, 7, 8]
    assert accounted(h) == 4 * weight


def test_a_message_without_headers_or_key_weighs_its_payload_and_the_fixed_part() -> None:
    """The common case Lease inlines (empty headers alike); a long key counts."""
    keyed = Msg(CH, 3, "", BODY, key="k" * 256).size()
    assert keyed > WEIGHT
    h = harness()
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(Send(CH, BODY), Send(CH, BODY, headers={}), Send(CH, BODY, key="k" * 256))
    assert len(h.take(sub)) == 3
    assert [lease.weight for lease in sub.leases.values()] == [WEIGHT, WEIGHT, keyed]
    assert accounted(h) == 2 * WEIGHT + keyed


def test_the_limit_set_again_by_a_reload_applies_to_the_next_delivery() -> None:
    h = harness(limit=2 * WEIGHT, share=WEIGHT)
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(*big(6))
    assert seqs(h.take(sub)) == [1, 2]
    h.broker.in_flight.configure(1 << 30, WEIGHT)  # the groups it stopped wake
    assert seqs(h.take(sub)) == [3, 4, 5, 6]


def test_a_reload_lowering_the_limit_to_exactly_what_readers_hold_fills_the_pool() -> None:
    """Reaching the limit fills the pool (as a delivery that reaches it does): a reader
    holding past its share then waits."""
    h = harness(share=WEIGHT)
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=4)
    h.publish(*big(6))
    assert seqs(h.take(sub)) == [1, 2, 3, 4]  # its prefetch: the pool far from full
    h.broker.in_flight.configure(4 * WEIGHT, WEIGHT)
    assert h.broker.in_flight.full
    sub.prefetch = 100
    h.broker.mark_ready(sub.group)
    assert h.take(sub) == []


def _settle_paths() -> dict[str, Callable[[Harness, Session, Subscription, list[Delivery]],
                                          None]]:
    def ack(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        h.ack(s, out)

    def nack(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        sub.paused = True  # the returned ones stay returned
        h.nack(s, out)

    def lease_runs_out(h: Harness, s: Session, sub: Subscription, out: list[Delivery]
                       ) -> None:
        sub.paused = True
        h.tick(sub.lease_s + 1.0)

    def extended_lease_runs_out(h: Harness, s: Session, sub: Subscription,
                                out: list[Delivery]) -> None:
        h.extend(s, out, 30.0)
        sub.paused = True
        h.tick(31.0)

    def withdraw(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        sub.paused = True
        h.broker.withdraw(s, [d.tag for d in out], h.now)

    def unsubscribe(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        h.store_attempts()
        h.broker.unsubscribe(s, sub.sid, h.now)

    def disconnect(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        h.disconnect(s)

    def remove_pattern(h: Harness, s: Session, sub: Subscription, out: list[Delivery]
                       ) -> None:
        h.broker.remove_pattern(s, sub.sid, CH, h.now)  # its other pattern stays

    def seek_past(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        h.broker.set_position(Session("ops", admin=True), "g", {CH: 100}, h.now)

    def purge(h: Harness, s: Session, sub: Subscription, out: list[Delivery]) -> None:
        maintenance.purge(h.broker, h.broker.channels[CH])

    def delete_group(h: Harness, s: Session, sub: Subscription, out: list[Delivery]
                     ) -> None:
        h.store_attempts()
        maintenance.delete_group(h.broker, "consume:g", h.now, force=True)

    def hand_queue_over(h: Harness, s: Session, sub: Subscription, out: list[Delivery]
                        ) -> None:
        h.commit()  # (the adapter commits first)
        h.broker.release_queue("orders/v1", h.now)

    return {f.__name__: f for f in (
        ack, nack, lease_runs_out, extended_lease_runs_out, withdraw, unsubscribe,
        disconnect, remove_pattern, seek_past, purge, delete_group, hand_queue_over)}


@pytest.mark.parametrize("path", sorted(_settle_paths()))
def test_every_way_a_delivery_ends_gives_its_bytes_back(path: str) -> None:
    h = harness(per_sub=3 * WEIGHT - 1)
    s = Session("c")
    sub = h.subscribe(s, patterns=[CH, "other/v1/*"], group="g", prefetch=100)
    h.publish(*big(5))
    out = h.take(sub)
    assert len(out) == 3 and accounted(h) == 3 * WEIGHT
    _settle_paths()[path](h, s, sub, out)
    h.commit()  # returned deliveries wait for the commit of their attempt counts
    assert accounted(h) == 0
    assert sub.held == 0


def _pump_all(h: Harness) -> dict[Subscription, list[Delivery]]:
    """Pump turns until no group is ready (the server runs another turn while a burst
    limit left work)."""
    out: dict[Subscription, list[Delivery]] = {}
    for _ in range(50):
        for sub, items in h.pump().items():
            out.setdefault(sub, []).extend(items)
        if not h.broker.state.ready_groups:
            return out
    raise AssertionError("the pump kept going")


def _heavy_then_light(h: Harness, messages: int, light_share: list[int]
                      ) -> tuple[Session, Subscription, list[Delivery], Subscription]:
    """A heavy reader (group ga, prefetch 30) takes messages until the pool is full (8
    of them), then a light one (group gb) takes ``light_share`` (its share) and waits.
    Returns the heavy session, the heavy subscription, its deliveries, the light one."""
    hs, ls = Session("heavy"), Session("light")
    h.publish(*big(messages))
    heavy = h.subscribe(hs, patterns=CH, group="ga", prefetch=30)
    taken = _pump_all(h).get(heavy, [])
    assert len(taken) == 8
    light = h.subscribe(ls, patterns=CH, group="gb", prefetch=30)
    assert seqs(_pump_all(h).get(light, [])) == light_share
    return hs, heavy, taken, light


def test_a_reader_acking_one_at_a_time_does_not_keep_the_room_a_stopped_one_waits_for(
) -> None:
    """The pool is full; a heavy reader acks its oldest message one at a time and reads
    on, a light one waits at its share. Once the pool drains (under 7/8 of the limit)
    the light one is served first: it gets messages, and the heavy one waits (before,
    the acker's group was served first and took the room back at every ack)."""
    h = harness(limit=8 * WEIGHT, share=2 * WEIGHT)
    hs, heavy, held, light = _heavy_then_light(h, 60, [1, 2])
    later: list[Delivery] = []
    for _ in range(20):
        h.ack(hs, [held.pop(0)])
        out = _pump_all(h)
        held += out.get(heavy, [])
        later += out.get(light, [])
        assert accounted(h) <= 8 * WEIGHT + 2 * WEIGHT + WEIGHT  # limit, a share, one
    assert seqs(later)[:1] == [3]
    assert light.held > 2 * WEIGHT  # past its share: the drained pool's room was its


def test_a_full_pool_drains_to_seven_eighths_before_it_lets_readers_past_their_share(
) -> None:
    h = harness(limit=16 * WEIGHT, share=WEIGHT)
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=100)
    h.publish(*big(40))
    out = h.take(sub)
    assert len(out) == 16 and h.broker.in_flight.full
    h.ack(c, out[:2])  # 14 of 16: still full, and it holds past its share
    assert h.take(sub) == [] and h.broker.in_flight.full
    h.ack(c, out[2:3])  # 13 of 16: under 7/8, drained
    assert not h.broker.in_flight.full
    assert seqs(h.take(sub)) == [17, 18, 19]


def test_only_groups_the_full_pool_stopped_are_woken_when_it_drains() -> None:
    """Groups that found no member for another reason (prefetch, a paused reader) are
    not kept to be woken: with many of them each drain would pump them all."""
    h = harness(limit=4 * WEIGHT, share=WEIGHT)
    heavy = Session("heavy")
    hsub = h.subscribe(heavy, patterns=CH, group="heavy", prefetch=100)
    h.publish(*big(10))
    out = h.take(hsub)
    assert len(out) == 4 and h.broker.in_flight.full
    for i in range(5):  # each at its prefetch of 1, holding under its share
        s = Session(f"p{i}")
        sub = h.subscribe(s, patterns="small/v1/1", group=f"p{i}", prefetch=1)
    h.publish(*[Send("small/v1/1", b"1") for _ in range(3)])
    _pump_all(h)
    stopped = {grp.key for grp in h.broker.in_flight.stopped}  # type: ignore[attr-defined]
    assert stopped == {"consume:heavy"}
    assert sub.unsettled == 1


def test_when_the_pool_drains_the_group_whose_ack_drained_it_is_served_last() -> None:
    """Both readers wait while the pool is full; the heavy one's acks drain it while it
    holds less than the light one: ordered by what they hold it would go first and take
    the room back, but the group whose settlement made the room goes last."""
    h = harness(limit=8 * WEIGHT, share=4 * WEIGHT)
    hs, heavy, taken, light = _heavy_then_light(h, 30, [1, 2, 3, 4])  # 12 held in all
    h.ack(hs, taken[:6])  # 6 of 8 W: under 7/8 of the limit, heavy holding 2 (light 4)
    out = _pump_all(h)
    assert seqs(out.get(light, [])) == [5, 6]  # served first, up to the limit
    assert seqs(out.get(heavy, [])) == [9, 10]  # then the heavy one, up to its share


def test_a_group_the_full_pool_stopped_may_lose_its_members_before_it_drains() -> None:
    h = harness(limit=4 * WEIGHT, share=WEIGHT)
    a, b = Session("a"), Session("b")
    h.publish(*big(10))
    first = h.subscribe(a, patterns=CH, group="ga", prefetch=30)
    taken = _pump_all(h).get(first, [])
    second = h.subscribe(b, patterns=CH, group="gb", prefetch=30)
    assert len(_pump_all(h).get(second, [])) == 1  # past its share: stopped
    assert len(h.broker.in_flight.stopped) == 2  # type: ignore[attr-defined]
    h.disconnect(b)  # its group is left with no member, still noted as stopped
    h.ack(a, taken)  # the pool drains and wakes what it stopped: no member there
    assert not h.broker.in_flight.full and accounted(h) == 0
    assert len(_pump_all(h).get(first, [])) == 4


QUARTER_MIB = b'"' + b"x" * ((1 << 18) - 512 - 2) + b'"'  # weighs 256 KiB exactly


def _diagnosis(h: Harness) -> str:
    stats = maintenance.queue_stats(h.broker, "orders/v1", now=h.now)
    return maintenance.diagnose(h.broker, "orders/v1", stats, h.now)


def test_the_diagnosis_names_consumers_stopped_by_their_byte_bound() -> None:
    h = harness(per_sub=1 << 20)
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=100)
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=100)
    h.publish(*(Send(CH, QUARTER_MIB) for _ in range(10)))
    got = h.pump()
    assert (len(got[sa]), len(got[sb])) == (4, 4)  # each exactly at 1 MiB
    assert _diagnosis(h) == (
        "2 of 2 consumer(s) hold as many bytes of unsettled messages as they may (each "
        "holds 1 MiB or more): they hold 8 message(s) in flight and get more as they ack.")
    h.ack(a, got[sa][:1])
    assert "as many bytes" not in _diagnosis(h)


def test_the_diagnosis_names_the_broker_wide_byte_bound_when_it_stops_consumers() -> None:
    h = harness(limit=2 << 20, share=1 << 19)
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns=CH, group="g", prefetch=100)
    h.publish(*(Send(CH, QUARTER_MIB) for _ in range(20)))
    assert len(h.take(sa) + h.take(sa) + h.take(sa)) == 8  # 2 MiB: full, a over its share
    sb = h.subscribe(b, patterns=CH, group="g", prefetch=100)
    assert len(h.take(sb) + h.take(sb)) == 2  # its share, 512 KiB
    assert accounted(h) == 10 << 18
    assert _diagnosis(h) == (
        "2 of 2 consumer(s) hold as many bytes of unsettled messages as they may (the "
        "broker's consumers hold 2 MiB of unsettled messages together (in_flight_bytes "
        "is 2 MiB)): they hold 10 message(s) in flight and get more as they ack.")


def test_a_drain_wakes_the_settling_group_last_though_the_settling_member_was_not_stopped(
        ) -> None:
    """The pool drains on the settlement of a member under the cap whose group the full
    pool stopped (another member of it was at the cap): that group is woken too, after
    the others, not left for whoever settled to mark ready."""
    from dataclasses import dataclass, field

    from minou.core.in_flight import InFlightBytes

    @dataclass(eq=False)
    class Group:
        members: list[Any] = field(default_factory=list)

    @dataclass(eq=False)
    class Member:
        held: int
        group: Group

    woken: list[Any] = []
    first: list[list[Any]] = []
    pool = InFlightBytes(woken.append, lambda groups: first.append(list(groups)))
    pool.configure(limit=16, share=4, per_subscription=100)
    a, b = Group(), Group()
    a.members = [Member(6, a), Member(3, a)]  # one at the cap, one under it
    b.members = [Member(7, b)]
    pool.total = 16
    pool.reached()
    pool.over(a)
    pool.over(b)
    pool.give_back(a.members[1], 3)  # under the cap: nothing of its own to wake
    assert not pool.full and woken == []
    assert first == [[b, a]]
