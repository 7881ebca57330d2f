"""What a commit carries: retention's truncations, and the state of a failed batch
carried into the next one (``WriteBatch.carry``: the newer batch's value wins, a
channel's first and next seq only move forward)."""

from __future__ import annotations

from minou.core.broker import Session
from minou.core.log import ChannelOptions
from minou.core.writes import WriteBatch

from .helpers import Harness, send, seqs

CH = "orders/v1/1"


def retained() -> Harness:
    return Harness(channel_options=lambda key: ChannelOptions(retention=60.0))


def test_retention_has_no_candidate_until_a_reader_settled_something() -> None:
    h = retained()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    assert h.broker.retention_candidates() == []  # nothing settled: the floor is seq 1
    h.ack(s, h.take(sub)[:2])
    h.commit()
    assert h.broker.retention_candidates() == [(CH, 3)]
    h.broker.truncate(CH, 3)
    assert h.commit().truncates == {CH: 3}
    assert h.broker.retention_candidates() == []  # all settled ones are gone


def test_a_channel_whose_settled_messages_are_too_young_waits_until_the_oldest_can_go(
) -> None:
    """Retention looked every candidate up in storage every second: a channel whose
    settled messages were all younger than the retention was looked up again and again
    (20,000 of them held 71 % of a core). Now it waits until its oldest can go: its
    publish time plus the retention when memory has it, else a tenth of the retention
    (1 s to RETENTION_RECHECK_S)."""
    h = retained()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1])
    t0 = h.broker.channels[CH].cache[1].published_at
    h.advance(10.0)
    h.publish_values(CH, [2, 3])
    got = h.take(sub)
    h.ack(s, got[:2])
    h.commit()
    assert h.broker.retention_candidates(t0 + 11.0) == [(CH, 3)]
    h.broker.retention_looked(CH, 3, None, t0 + 11.0)  # storage: all too young
    assert h.broker.retention_candidates(t0 + 12.0) == []
    assert h.broker.retention_candidates(t0 + 59.9) == []
    assert h.broker.retention_candidates(t0 + 60.0) == [(CH, 3)]
    h.broker.retention_looked(CH, 3, 2, t0 + 60.0)  # seq 1 went, seq 2 stays
    assert h.commit().truncates == {CH: 2}
    assert h.broker.retention_candidates(t0 + 69.9) == []  # seq 2: published at t0 + 10
    assert h.broker.retention_candidates(t0 + 70.0) == [(CH, 3)]
    h.broker.channels[CH].evict_below(3)  # memory no longer has seq 2's publish time
    h.broker.retention_looked(CH, 3, None, t0 + 70.0)
    assert h.broker.retention_candidates(t0 + 75.9) == []
    assert h.broker.retention_candidates(t0 + 76.0) == [(CH, 3)]  # a tenth of 60 s
    h.broker.retention_looked(CH, 3, 3, t0 + 76.0)  # every settled one went
    assert h.commit().truncates == {CH: 3}
    assert h.broker.channels[CH].retention_due == 0.0
    h.ack(s, got[2:])  # seq 3 settled: a candidate at once
    h.commit()
    assert h.broker.retention_candidates(t0 + 76.0) == [(CH, 4)]


def test_a_short_retention_not_in_memory_is_looked_at_again_a_second_later() -> None:
    """A tenth of the retention, but never sooner than a second (nor later than
    RETENTION_RECHECK_S)."""
    h = Harness(channel_options=lambda key: ChannelOptions(retention=5.0))
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    h.ack(s, h.take(sub)[:1])
    h.commit()
    h.broker.channels[CH].evict_below(3)
    h.broker.retention_looked(CH, 2, None, 1000.0)
    assert h.broker.channels[CH].retention_due == 1001.0


def test_retention_candidates_of_a_part_of_the_channels() -> None:
    """The broker walks the channels a part a tick (all of 100,000 each second held its
    loop 25-70 ms): ``start`` and ``count`` in the order the channels were made."""
    h = retained()
    s = Session("c")
    names = [f"orders/v1/{i}" for i in range(5)]
    sub = h.subscribe(s, patterns="orders/v1/*", group="g", prefetch=10)
    for name in names:
        h.publish_values(name, [1, 2])
    h.ack(s, [m for m in h.take(sub) if m.seq == 1])
    h.commit()
    assert h.broker.retention_candidates(1e12) == [(n, 2) for n in names]
    assert h.broker.retention_candidates(1e12, 0, 2) == [(n, 2) for n in names[:2]]
    assert h.broker.retention_candidates(1e12, 3, 2) == [(n, 2) for n in names[3:]]
    assert h.broker.retention_candidates(1e12, 4, 10) == [(names[4], 2)]
    assert h.broker.retention_candidates(1e12, 5, 10) == []
    assert h.broker.retention_candidates(1e12, 3) == [(n, 2) for n in names[3:]]


def test_truncating_what_is_gone_already_or_an_unknown_channel_writes_nothing() -> None:
    h = retained()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2, 3])
    h.ack(s, h.take(sub)[:1])
    h.commit()
    h.broker.truncate(CH, 1)  # the first seq already
    h.broker.truncate("orders/v1/unknown", 5)
    assert not h.broker.batch
    h.broker.truncate(CH, 2)
    batch = h.commit()
    assert (batch.truncates, batch.channels) == ({CH: 2}, {CH: 4})
    replay = h.subscribe(Session("r"), kind="listen", patterns=CH, start="oldest", prefetch=10)
    assert seqs(h.take(replay)) == [2, 3]


def test_a_carried_batch_moves_first_and_next_seqs_only_forward() -> None:
    failed = WriteBatch(truncates={"a": 3, "b": 9, "c": 4}, channels={"a": 10, "b": 20, "c": 5})
    pending = WriteBatch(truncates={"a": 5, "b": 7}, channels={"a": 12, "b": 15})
    pending.carry(failed, [])
    assert pending.truncates == {"a": 5, "b": 9, "c": 4}
    assert pending.channels == {"a": 12, "b": 20, "c": 5}


def test_a_carried_batch_keeps_the_newer_value_of_each_key_and_goes_first() -> None:
    failed = WriteBatch(writers={"w": "old", "x": "kept"}, meta={"m": "old"},
                        requeued={("a", 7)},
                        deletes=[("a", 1)], dropped_fences=["w1"], unstaged=[("c", "t1")],
                        used_tokens=[("j1", 1.0)], staged=[("c", "t", 1, [], 0.0)])
    pending = WriteBatch(writers={"w": None}, meta={"m": "new"}, deletes=[("a", 2)],
                         requeued={("b", 1)},
                         dropped_fences=["w2"], unstaged=[("c", "t2")],
                         used_tokens=[("j2", 2.0)], staged=[("c", "t", 2, [], 1.0)])
    pending.carry(failed, [])
    assert pending.writers == {"w": None, "x": "kept"}
    assert pending.meta == {"m": "new"}
    assert pending.deletes == [("a", 1), ("a", 2)]
    assert pending.requeued == {("a", 7), ("b", 1)}  # requeues written later count as such
    assert pending.dropped_fences == ["w1", "w2"]
    assert pending.unstaged == [("c", "t1"), ("c", "t2")]
    assert pending.used_tokens == [("j1", 1.0), ("j2", 2.0)]
    assert [part for _, _, part, _, _ in pending.staged] == [1, 2]


def test_settled_messages_of_a_channel_without_retention_go_at_once_whatever_came_before(
) -> None:
    """One commit touches a retained channel first, then one without retention: the
    latter's settled messages are truncated by that commit all the same."""
    h = Harness(channel_options=lambda key: ChannelOptions(
        retention=60.0 if key == "kept/v1" else None))
    s = Session("c")
    kept = h.subscribe(s, 1, patterns="kept/v1/1", group="g", prefetch=10)
    plain = h.subscribe(s, 2, patterns=CH, group="g", prefetch=10)
    h.publish_values("kept/v1/1", [1, 2])
    h.publish_values(CH, [1, 2])
    got = h.pump()
    h.ack(s, got[kept])
    h.ack(s, got[plain])
    assert h.commit().truncates == {CH: 3}


def interval_harness() -> Harness:
    """metrics/v1 has durability "interval" (20 ms), everything else the default fsync."""
    def options(key: str) -> ChannelOptions:
        if key == "metrics/v1":
            return ChannelOptions(durability="interval", sync_interval=0.02)
        if key == "slow/v1":
            return ChannelOptions(durability="interval", sync_interval=0.5)
        return ChannelOptions()
    h = Harness(channel_options=options)
    h.broker.any_interval = True
    return h


def test_a_batch_of_interval_channels_alone_may_be_synced_later() -> None:
    h = interval_harness()
    h.publish(send("metrics/v1/a", 1), send("metrics/v1/a", 2), commit=False)
    assert h.commit().sync_within == 0.02
    h.publish(send("metrics/v1/a", 3), commit=False)
    h.publish(send("slow/v1/x", 1), commit=False)
    assert h.commit().sync_within == 0.02  # the shortest interval of its channels
    # whatever order the channels are looked at in (a set: the shortest is not last)
    h.publish(*(send(f"slow/v1/{i}", 1) for i in range(12)), send("metrics/v1/b", 1),
              commit=False)
    assert h.commit().sync_within == 0.02


def test_dedup_keys_and_producer_seqs_of_interval_channels_may_be_synced_later() -> None:
    """A publish with a dedup id or from a numbered producer writes rows besides its
    message, keyed by its channel: they follow the channel's durability too."""
    from minou.auth.rules import ALLOW_ALL

    h = interval_harness()
    h.publish(send("metrics/v1/a", 1, dedup="k1"), commit=False)
    assert h.broker.batch.dedup
    assert h.commit().sync_within == 0.02
    p = Session("p", producer_id="00000000000000aa")
    h.engine.publish([send("metrics/v1/a", 2, pseq=1)], ALLOW_ALL, lambda *_: None,
                     session=p, publisher=h)
    batch = h.commit()
    assert batch.producers and batch.sync_within == 0.02


def test_one_fsync_channel_or_a_registry_write_makes_the_whole_batch_fsync() -> None:
    h = interval_harness()
    h.publish(send("metrics/v1/a", 1), commit=False)
    h.publish(send(CH, 1), commit=False)
    assert h.commit().sync_within is None
    h.publish(send("metrics/v1/a", 2), commit=False)
    h.broker.batch.meta["k"] = "v"  # state outside any channel: always fsync'd
    assert h.commit().sync_within is None


def test_acks_on_an_interval_channel_follow_its_durability() -> None:
    h = interval_harness()
    s = Session("c")
    sub = h.subscribe(s, patterns="metrics/v1/a", group="g", prefetch=10)
    h.publish_values("metrics/v1/a", [1, 2])
    h.ack(s, h.take(sub))
    batch = h.commit()
    assert batch.group_states and not batch.messages
    assert batch.sync_within == 0.02


def test_a_batch_with_nothing_to_write_has_no_sync_to_wait_for() -> None:
    h = interval_harness()
    batch = h.commit()  # forced with nothing staged (the ticker's commit)
    assert not batch.writes and batch.sync_within is None


def test_the_removal_of_an_idle_interval_channel_follows_its_durability() -> None:
    """The channel is gone from memory when its removal is committed: its durability
    comes from the configuration."""
    def options(key: str) -> ChannelOptions:
        return ChannelOptions(durability="interval", sync_interval=0.02, expire_idle=60.0)

    h = Harness(channel_options=options)
    h.broker.any_interval = True
    h.publish(send("metrics/v1/a", 1))
    h.tick(61)
    assert "metrics/v1/a" not in h.broker.channels
    batch = h.commit()
    assert batch.truncates == {"metrics/v1/a": 2} and batch.sync_within == 0.02


def test_without_an_interval_channel_in_the_config_nothing_is_looked_at() -> None:
    h = interval_harness()
    h.broker.any_interval = False
    h.publish(send("metrics/v1/a", 1), commit=False)
    assert h.commit().sync_within is None


def test_retention_drops_the_stream_ids_its_messages_no_longer_need() -> None:
    """Explicit Redis stream ids (core/stream_ids.py) are kept as points: the ones
    below the first message retention keeps go from memory and storage, the one that
    still numbers a kept message stays."""
    from minou.core.stream_ids import ID_HEADER, point_key

    h = retained()
    s = Session("c")
    sub = h.subscribe(s, patterns=CH, group="g", prefetch=10)
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}), send(CH, 2),
              send(CH, 3, headers={ID_HEADER: "200-0"}), send(CH, 4),
              send(CH, 5, headers={ID_HEADER: "300-0"}), resp_door=True)
    h.ack(s, h.take(sub)[:4])
    h.commit()
    h.broker.truncate(CH, 5)
    batch = h.commit()
    assert batch.meta == {point_key(CH, 1): None, point_key(CH, 3): None}
    ids = h.broker.channels[CH].stream_ids
    assert ids is not None and list(ids.seqs) == [5] and ids.text(5) == b"300-0"
    assert [k for k in h.storage.open(h.now).meta if k.startswith("resp-id/")] == [
        point_key(CH, 5)]
