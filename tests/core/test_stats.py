"""The figures the dashboard, ``minou list`` and the metrics show, where the core makes
them: a channel's (``channel_stats``), a reader group's (``group_stats``) and the
broker-wide counters (``Counters.as_dict``)."""

from __future__ import annotations

from minou.core import maintenance as mt
from minou.core.broker import Session
from minou.core.log import ChannelOptions

from .helpers import Harness, send

Q = "orders/v1"
CH = "orders/v1/1"


def test_a_channels_figures_count_what_happened_to_its_messages() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=4,
                                                           overflow="drop_oldest"))
    c = Session("c")
    sub = h.subscribe(c, patterns=CH, group="g", prefetch=2)
    h.subscribe(Session("l"), kind="listen", patterns=CH, name="audit").paused = True
    # One batch of 5: seq 1 is dropped before its commit (never published), then the
    # sixth publish drops seq 2 (published, then dropped).
    h.publish_values(CH, [1, 2, 3, 4, 5])
    h.publish(send(CH, "short", ttl=1.0))
    h.advance(2.0)
    assert h.broker.expire([(CH, 6)], h.now) == 1
    got = h.take(sub)
    assert len(got) == 2
    h.ack(c, got[:1])
    (stats,) = mt.queue_stats(h.broker, Q, now=h.now)["channels"]
    assert stats == {
        "channel": CH, "depth": 3, "first_seq": 1, "next_seq": 7, "unsettled": 1,
        "published": 5, "requeued": 0, "dropped": 2, "expired": 1,
        "readers": ["consume:g", "listen:l:audit"], "readers_total": 2,
        "expire_idle": None, "active_at": h.now,  # the last delivery
        # 1 (dropped before its commit), 2 and 6: two runs of deleted seqs
        "deleted": 3, "deleted_bytes": stats["deleted_bytes"],
    }
    assert h.broker.channel_stats(h.broker.channels[CH], h.now) == stats
    assert list(h.broker.channels[CH].gone.runs()) == [(1, 3), (6, 7)]
    assert 128 <= stats["deleted_bytes"] <= 256


def test_a_groups_figures_sum_its_channels() -> None:
    h = Harness()
    a, b = Session("a"), Session("b")
    sa = h.subscribe(a, patterns="orders/v1/*", group="g", prefetch=2)
    h.subscribe(b, patterns="orders/v1/*", group="g").paused = True  # takes nothing
    h.publish_values(CH, [1, 2, 3])
    h.publish_values("orders/v1/2", [4, 5])
    got = h.take(sa)
    assert len(got) == 2
    h.ack(a, got[:1])
    grp = h.broker.groups["consume:g"]
    stats = h.broker.group_stats(grp, h.now)
    assert stats == {
        "group": "consume:g", "kind": "consume", "patterns": ["orders/v1/*"],
        "patterns_total": 1,
        "members": 2, "channels": 2, "unsettled": 1, "waiting": 3, "in_flight": 1,
        "lag": 3, "delivered": 2, "acked": 1,
    }
    assert mt.queue_stats(h.broker, Q, now=h.now)["groups"] == [stats]
    listener = h.subscribe(Session("l"), kind="listen", patterns=CH, name="n")
    assert h.broker.group_stats(listener.group, h.now)["kind"] == "listen"


def test_the_counters_are_flat_numbers_with_the_refusals_by_reason() -> None:
    h = Harness()
    h.broker.max_message_size = 4
    h.publish_values(CH, ["too long", "too long"])
    h.broker.max_message_size = 1 << 20
    h.publish_values(CH, [1])
    out = h.broker.counters.as_dict()
    assert out == {
        "published": 1, "requeued": 0, "delivered": 0, "redelivered": 0, "acked": 0, "nacked": 0,
        "dead_lettered": 0, "expired": 0, "dropped": 0, "duplicates": 0,
        "lease_expired": 0, "channels_expired": 0, "refused": dict(h.broker.counters.refused),
    }
    assert sum(out["refused"].values()) == 2  # type: ignore[attr-defined]
