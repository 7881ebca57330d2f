"""Idle expiry (channel option ``expire_idle``, core/expiry.py): a channel with no
publish, no delivery and no connected reader for that long is removed with its
messages and the groups that read only it; a connected reader keeps it; a channel of
the same name made later goes on with the next seq."""

from __future__ import annotations

from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.names import inbox_of

from .helpers import Harness, payloads, send, seqs

IDLE = 60.0


def options(key: str) -> ChannelOptions:
    return ChannelOptions(expire_idle=IDLE) if key.startswith("tmp/") else ChannelOptions()


def harness() -> Harness:
    return Harness(broker=Broker(channel_options=options))


def test_an_idle_channel_is_removed_with_its_messages_and_only_its_groups() -> None:
    h = harness()
    h.publish_values("tmp/v1/a", [1, 2, 3])
    h.publish_values("keep/v1/a", [1])
    listener = Session("l")
    only = h.subscribe(listener, kind="listen", patterns="tmp/v1/a", start="oldest",
                       prefetch=10)
    wide = h.subscribe(listener, 2, patterns="tmp/v1/*", group="wide")
    assert len(h.take(only)) == 3
    h.disconnect(listener)
    h.tick(IDLE - 1)
    assert "tmp/v1/a" in h.broker.channels  # the delivery counted as activity
    h.tick(2)
    assert "tmp/v1/a" not in h.broker.channels
    assert "keep/v1/a" in h.broker.channels  # no expire_idle: never
    assert h.broker.counters.channels_expired == 1
    # The listener of just that channel went with it; the pattern's group stays.
    assert set(h.broker.groups) == {wide.group.key}
    assert wide.group.gcs == {}
    batch = h.commit()
    assert batch.truncates == {"tmp/v1/a": 4}
    assert batch.group_defs == {only.group.key: None}
    assert (wide.group.key, "tmp/v1/a") in batch.group_states
    # Storage has no message of it left.
    assert h.storage.read_range("tmp/v1/a", 1, 10, 10) == []


def test_publishes_deliveries_and_connected_readers_keep_it() -> None:
    h = harness()
    h.publish_values("tmp/v1/a", [1])
    for _ in range(3):  # a publish every 50 s: never idle for 60
        h.tick(50)
        h.publish_values("tmp/v1/a", [2])
    assert "tmp/v1/a" in h.broker.channels
    # A connected consumer keeps it however long nothing flows.
    s = Session("c")
    sub = h.subscribe(s, patterns="tmp/v1/a", group="g")
    h.ack(s, h.take(sub))
    for _ in range(5):
        h.tick(IDLE)
    assert "tmp/v1/a" in h.broker.channels
    h.disconnect(s)
    h.tick(IDLE - 1)
    assert "tmp/v1/a" in h.broker.channels  # idle counted from the disconnect's scan
    h.tick(2)
    assert "tmp/v1/a" not in h.broker.channels


def test_a_channel_made_again_goes_on_with_the_next_seq() -> None:
    h = harness()
    first = h.publish_values("tmp/v1/a", [1, 2])
    h.tick(IDLE + 1)
    assert "tmp/v1/a" not in h.broker.channels
    again = h.publish_values("tmp/v1/a", [3])
    assert [o.seq for o in first + again] == [1, 2, 3]
    assert len({o.id for o in first + again}) == 3  # ids are never given twice
    s = Session("c")
    sub = h.subscribe(s, patterns="tmp/v1/a", group="g")
    items = h.take(sub)
    assert (seqs(items), payloads(items)) == ([3], [3])


def test_a_reload_gives_and_takes_the_option() -> None:
    h = Harness()
    h.publish_values("tmp/v1/a", [1])
    h.tick(IDLE + 1)
    assert "tmp/v1/a" in h.broker.channels  # no option yet
    h.broker.options_for = options
    h.broker.apply_options(h.now)
    h.tick(IDLE + 1)
    assert "tmp/v1/a" not in h.broker.channels
    h.publish_values("tmp/v1/a", [1])
    h.broker.options_for = lambda key: ChannelOptions()
    h.broker.apply_options(h.now)
    h.tick(IDLE * 10)
    assert "tmp/v1/a" in h.broker.channels


def test_inboxes_expire_by_default_once_their_owner_is_gone() -> None:
    from minou.config import Settings

    h = Harness(broker=Broker(channel_options=Settings().channel_options))
    inbox = inbox_of("asker", "i1")
    owner = Session("asker")
    sub = h.subscribe(owner, kind="listen", patterns=inbox)
    h.tick(3600)
    assert inbox in h.broker.channels
    h.engine.unsubscribe(owner, sub.sid)
    h.tick(h.broker.options(inbox).expire_idle + 2)
    assert inbox not in h.broker.channels
    assert sub.group.key not in h.broker.groups


def test_idle_for_exactly_expire_idle_is_enough_and_scans_come_once_a_second() -> None:
    h = harness()
    h.publish_values("tmp/v1/a", [1])  # touched at T0
    h.tick(IDLE - 0.5)  # a scan: not yet
    h.tick(0.5)  # idle exactly IDLE, but the last scan was half a second ago
    assert "tmp/v1/a" in h.broker.channels
    h.tick(0.5)  # the next scan: idle for IDLE + 0.5
    assert "tmp/v1/a" not in h.broker.channels
    h.publish_values("tmp/v1/b", [1])
    h.tick(IDLE)  # idle exactly IDLE at a scan: gone
    assert "tmp/v1/b" not in h.broker.channels
    assert h.broker.counters.channels_expired == 2


def test_a_group_of_named_channels_goes_with_the_last_of_them() -> None:
    h = harness()
    h.publish_values("tmp/v1/a", [1])
    h.tick(30)
    h.publish_values("tmp/v1/b", [1])
    s = Session("l")
    sub = h.subscribe(s, kind="listen", patterns=["tmp/v1/a", "tmp/v1/b"], start="oldest",
                      prefetch=10)
    h.take(sub)
    h.disconnect(s)
    h.tick(IDLE)  # a was touched by its delivery too: both idle from here
    h.tick(IDLE)
    assert "tmp/v1/a" not in h.broker.channels and "tmp/v1/b" not in h.broker.channels
    assert sub.group.key not in h.broker.groups


def test_a_queue_handed_to_another_broker_is_not_watched_any_more() -> None:
    h = harness()
    h.publish_values("tmp/v1/a", [1])
    log = h.broker.channels["tmp/v1/a"]
    h.commit()
    h.broker.release_queue("tmp/v1", h.now)
    assert log not in h.broker.state.expiring
    h.tick(IDLE + 1)
    assert h.broker.counters.channels_expired == 0


def test_a_channel_a_reader_made_expires_once_it_left() -> None:
    h = harness()
    s = Session("l")
    sub = h.subscribe(s, kind="listen", patterns="tmp/v1/named")  # makes the channel
    assert "tmp/v1/named" in h.broker.channels
    h.engine.unsubscribe(s, sub.sid)
    h.tick(IDLE + 1)
    assert "tmp/v1/named" not in h.broker.channels


def test_an_expired_inbox_leaves_nothing_behind() -> None:
    from minou.config import Settings

    h = Harness(broker=Broker(channel_options=Settings().channel_options))
    inbox = inbox_of("asker", "i2")
    owner = Session("asker")
    h.subscribe(owner, kind="listen", patterns=inbox)
    h.publish_values(inbox, [1])
    h.disconnect(owner)
    h.tick(3600)
    assert inbox not in h.broker.channels
    batch = h.commit()
    assert batch.forgets == [inbox]
    assert inbox not in h.broker.state.retired and not h.broker.state.forgetting
    assert inbox not in {r.name for r in h.storage.open(h.now).channels}


def test_a_channel_made_again_before_its_record_went_keeps_it() -> None:
    h = Harness(broker=Broker(channel_options=lambda key: ChannelOptions(expire_idle=IDLE)))
    inbox = inbox_of("a", "x")
    first = Session("a")
    h.subscribe(first, kind="listen", patterns=inbox)
    h.disconnect(first)
    h.tick(IDLE + 1)
    assert inbox not in h.broker.channels
    assert h.broker.batch.forgets == [inbox]
    h.subscribe(Session("a"), kind="listen", patterns=inbox)  # back before the commit
    assert inbox in h.broker.channels
    assert h.broker.batch.forgets == [] and h.broker.state.forgetting == set()
    h.commit()
    assert inbox in {r.name for r in h.storage.open(h.now).channels}


def test_past_the_bound_the_oldest_tombstones_go(monkeypatch) -> None:
    from minou.core import expiry

    monkeypatch.setattr(expiry, "MAX_RETIRED_CHANNELS", 2)
    h = harness()
    for n in range(4):
        h.publish_values(f"tmp/v1/c{n}", [1, 2])
        h.tick(IDLE + 1)
    h.commit()
    assert list(h.broker.state.retired) == ["tmp/v1/c2", "tmp/v1/c3"]
    stored = {r.name for r in h.storage.open(h.now).channels}
    assert {"tmp/v1/c0", "tmp/v1/c1"}.isdisjoint(stored)
    assert {"tmp/v1/c2", "tmp/v1/c3"} <= stored
    (o,) = h.publish_values("tmp/v1/c0", [9])  # forgotten: made again from seq 1
    assert o.seq == 1
    (o,) = h.publish_values("tmp/v1/c3", [9])  # still remembered: goes on
    assert o.seq == 3


def test_a_forget_outlives_a_failed_commit_and_a_channel_made_again_meanwhile_stays() -> None:
    from minou.errors import StorageFull

    h = Harness(broker=Broker(channel_options=lambda key: ChannelOptions(expire_idle=IDLE)))
    full = StorageFull("full", data_dir="/x", free_bytes=0)
    one, two = inbox_of("a", "1"), inbox_of("a", "2")
    for inbox in (one, two):
        s = Session("a")
        h.subscribe(s, kind="listen", patterns=inbox)
        h.disconnect(s)
    h.commit()
    h.tick(IDLE + 1)
    failed = h.broker.take_writes()
    assert sorted(failed.forgets) == [one, two]
    h.broker.on_failed(failed, full)
    assert sorted(h.broker.batch.forgets) == [one, two]  # carried
    taken = h.broker.take_writes()  # being written when ``two`` comes back
    h.subscribe(Session("a"), kind="listen", patterns=two)
    h.storage.apply(taken)
    h.broker.on_committed(taken, h.now)
    assert h.broker.state.retired == {} and h.broker.state.forgetting == set()
    h.commit()  # ``two`` is stored again, as a new channel
    names = {r.name for r in h.storage.open(h.now).channels}
    assert one not in names and two in names


def test_a_name_forgotten_again_while_its_first_forget_is_written_keeps_what_comes_next(
        monkeypatch) -> None:
    """Made again and idle again while the commit of its first forget is still being
    written (a slow disk), the name is forgotten a second time: the first commit must
    not take that second forget for done. Else the name made once more reused seq 1 and
    the pending forget deleted its record with the message just stored (a restart lost
    a confirmed message). Found from ``Commits.on_committed`` 105 (mutation run of
    2026-12-01)."""
    from minou.core import expiry

    monkeypatch.setattr(expiry, "MAX_RETIRED_CHANNELS", 0)  # every removed name forgotten
    h = harness()
    h.publish_values("tmp/v1/a", [1])
    h.tick(IDLE + 1)
    first = h.broker.take_writes()  # its forget, being written
    assert first.forgets == ["tmp/v1/a"]
    reader = Session("r")  # made again by a reader, who leaves; idle again
    h.broker.subscribe(reader, 1, kind="consume", patterns=["tmp/v1/a"], group="g",
                       prefetch=1, now=h.advance(1))
    h.broker.disconnect(reader, h.now)
    h.broker.tick(h.advance(IDLE + 1))
    assert "tmp/v1/a" not in h.broker.channels and h.broker.batch.forgets == ["tmp/v1/a"]
    h.storage.apply(first)
    h.broker.on_committed(first, h.now)
    (o,) = h.publish_values("tmp/v1/a", [2])  # made once more: stored and committed
    assert o.code == 0 and o.seq == 2  # before its second forget went: it goes on
    h.commit()
    assert "tmp/v1/a" in {r.name for r in h.storage.open(h.now).channels}
    assert payloads(h.storage.read_range("tmp/v1/a", 1, 10, 10)) == [2]


def test_an_expired_inbox_does_not_count_against_the_bound_on_tombstones(monkeypatch) -> None:
    """An inbox is forgotten at once: with the bound reached by other channels, its own
    expiry forgets no other channel's tombstone, nor does a forget not committed yet."""
    from minou.core import expiry

    monkeypatch.setattr(expiry, "MAX_RETIRED_CHANNELS", 2)
    h = Harness(broker=Broker(channel_options=lambda key: ChannelOptions(expire_idle=IDLE)))
    inbox = inbox_of("a", "1")
    for n in range(3):
        h.publish_values(f"tmp/v1/c{n}", [1, 2])
    s = Session("a")
    h.subscribe(s, kind="listen", patterns=inbox)
    h.disconnect(s)
    h.commit()
    h.tick(IDLE + 1)  # all four in one scan: c0 past the bound, the inbox as an inbox
    assert h.broker.counters.channels_expired == 4
    assert sorted(h.broker.batch.forgets) == sorted(["tmp/v1/c0", inbox])
    h.commit()
    assert list(h.broker.state.retired) == ["tmp/v1/c1", "tmp/v1/c2"]
    (o,) = h.publish_values("tmp/v1/c1", [9])
    assert o.seq == 3


def test_an_expired_stream_leaves_none_of_its_explicit_ids_stored() -> None:
    """A stream made again under the name of one that expired numbers its ids anew."""
    from minou.core.stream_ids import ID_HEADER, point_key

    h = harness()
    ch = "tmp/v1/s"
    outs = h.publish(send(ch, 1, headers={ID_HEADER: "100-0"}), send(ch, 2),
                     send(ch, 3, headers={ID_HEADER: "200-5"}), resp_door=True)
    assert [o.code for o in outs] == [0, 0, 0]
    assert {k for k in h.storage.open(h.now).meta if k.startswith("resp-id/")} == {
        point_key(ch, 1), point_key(ch, 3)}
    h.tick(IDLE + 1)
    batch = h.commit()
    assert batch.meta == {point_key(ch, 1): None, point_key(ch, 3): None}
    assert not any(k.startswith("resp-id/") for k in h.storage.open(h.now).meta)
    (o,) = h.publish(send(ch, 4), resp_door=True)
    assert h.broker.channels[ch].stream_ids is None and o.seq == 4


def test_forgets_made_while_a_commit_fails_are_kept_with_the_carried_ones() -> None:
    from minou.errors import StorageFull

    h = Harness(broker=Broker(channel_options=lambda key: ChannelOptions(expire_idle=IDLE)))
    full = StorageFull("full", data_dir="/x", free_bytes=0)
    one, two = inbox_of("a", "1"), inbox_of("a", "2")
    for inbox in (one, two):  # ``two`` half an idle time after ``one``
        if inbox == two:
            h.tick(IDLE / 2)
        s = Session("a")
        h.subscribe(s, kind="listen", patterns=inbox)
        h.disconnect(s)
        h.commit()
    h.tick(IDLE / 2 + 1)
    failed = h.broker.take_writes()  # being written when ``two`` expires
    assert failed.forgets == [one]
    h.tick(IDLE / 2)
    assert h.broker.batch.forgets == [two]
    h.broker.on_failed(failed, full)
    assert h.broker.batch.forgets == [one, two]
    h.commit()
    assert not {one, two} & {r.name for r in h.storage.open(h.now).channels}


def test_a_scan_looks_only_at_channels_whose_time_came_and_reloads_leave_it_bounded(
        ) -> None:
    """Idle expiry keeps a heap by due time, not a scan of every watched channel each
    second (~50 ms of the loop at 100,000 channels): a channel is looked at again only
    at its due. Each reload watches every channel again; the entries it leaves stale are
    dropped in a rebuild before they outnumber the channels twice over (plus a slack)."""
    from minou.core.state import EXPIRY_HEAP_SLACK

    h = harness()
    for i in range(20):
        h.publish_values(f"tmp/v1/c{i}", [1])
    state = h.broker.state
    assert len(state.expiry_heap) == 20
    h.tick(IDLE / 2)  # nothing due: nothing looked at, nothing pushed again
    assert len(state.expiry_heap) == 20
    for _ in range(3 * EXPIRY_HEAP_SLACK):
        h.broker.apply_options(h.now)
    assert len(state.expiring) == 20
    assert len(state.expiry_heap) <= 2 * 20 + EXPIRY_HEAP_SLACK + 1
    h.tick(IDLE - 1)  # idle since the last reload (which starts their idle time again)
    assert len(h.broker.channels) == 20
    h.tick(2)
    assert not any(name.startswith("tmp/") for name in h.broker.channels)
    assert h.broker.counters.channels_expired == 20


def test_the_broker_s_cached_bytes_follow_every_channel_s_cache() -> None:
    """``trim_cache`` reads the total kept as each channel's cache changes, not a sum
    over every channel each tick: it must equal that sum through publishes, evictions,
    channels expiring and a queue handed to another broker."""
    h = harness()
    state = h.broker.state

    def summed() -> int:
        return sum(log.cache_bytes for log in h.broker.channels.values())

    for i in range(5):
        h.publish_values(f"tmp/v1/c{i}", list(range(20)))
        h.publish_values(f"keep/v1/c{i}", list(range(10)))
    assert state.cached_bytes.total == summed() > 0
    h.broker.channels["keep/v1/c0"].evict_bytes(50)
    h.broker.channels["keep/v1/c1"].evict_below(5)
    assert state.cached_bytes.total == summed()
    h.tick(IDLE + 1)  # the tmp/ channels expire with their caches
    assert not any(name.startswith("tmp/") for name in h.broker.channels)
    assert state.cached_bytes.total == summed() > 0
    # A queue handed to another broker leaves with its cache still held (only memory
    # forgets it): the broker's total drops it too.
    from minou.core.ownership import release

    assert state.channels["keep/v1/c3"].cache_bytes > 0
    release(state, "keep/v1", h.now)
    assert not any(name.startswith("keep/") for name in h.broker.channels)
    assert state.cached_bytes.total == summed() == 0
    h.publish_values("keep/v1/c9", [1, 2])
    assert state.cached_bytes.total == summed() > 0
    state.cache_budget = 1  # every body over the budget: trimmed to a quarter of it
    h.broker.trim_cache()
    assert state.cached_bytes.total == summed() == 0


def test_a_channel_read_for_longer_than_expire_idle_counts_its_idle_time_from_the_reader_leaving(
        ) -> None:
    """While read, a channel is looked at every scan (not once per expire_idle): its idle
    time counts from the last scan that saw the reader, not from an earlier one."""
    h = harness()
    h.publish_values("tmp/v1/a", [1])
    s = Session("c")
    sub = h.subscribe(s, patterns="tmp/v1/a", group="g")
    h.ack(s, h.take(sub))
    for _ in range(int(IDLE) + 5):  # read past one expire_idle, a scan a second
        h.tick(1)
    h.disconnect(s)
    h.tick(IDLE - 1)
    assert "tmp/v1/a" in h.broker.channels  # idle IDLE - 1 since the reader left
    h.tick(2)
    assert "tmp/v1/a" not in h.broker.channels
