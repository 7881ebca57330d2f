"""The Redis door's consumer names (server/resp_groups.py), without a broker: each is
bounded in length, a group keeps only so many, the broker only so many over every
group and one client makes only its share of those; a name unused for IDLE_S that
holds no pending entry is forgotten, one that holds entries is kept, and what is
forgotten (or deleted, or destroyed with its group) frees room, for its maker too. (The
real bounds, through a real broker: tests/system/test_resp.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from minou.errors import BadRequest, QueueFull
from minou.server import resp_groups
from minou.server.resp_groups import IDLE_S, Pending, RespGroups

APP: Any = SimpleNamespace(client_id="app", admin=False)  # who makes the names


def groups_of(*gnames: str) -> RespGroups:
    """A RespGroups over a server that has only the consumer groups ``gnames``."""
    state = SimpleNamespace(groups={f"consume:{g}": object() for g in gnames})
    server = SimpleNamespace(core=SimpleNamespace(state=state), admin=lambda *args: None)
    return RespGroups(server)  # type: ignore[arg-type]


def hold(groups: RespGroups, gname: str, name: bytes, seq: int) -> None:
    """A live pending entry of ``name``: its lease is held by a consumer's session."""
    holder: Any = SimpleNamespace(session=SimpleNamespace(leases={seq}))
    item: Any = SimpleNamespace(tag=seq, seq=seq)
    groups.pel.setdefault(gname, {})[seq] = Pending(name, holder, item, 0.0, 1)


def age(groups: RespGroups, gname: str, by: float) -> None:
    """Every name of the group last used ``by`` seconds earlier than it was."""
    names = groups.names[gname]
    for name in names:
        names[name] -= by


def test_a_name_longer_than_the_bound_is_refused_and_not_kept() -> None:
    groups = groups_of("g@s")
    groups.seen("g@s", b"n" * resp_groups.MAX_CONSUMER_NAME, APP)  # at the bound: kept
    with pytest.raises(BadRequest, match=r"^consumer name is 513 bytes, the limit is 512$"):
        groups.seen("g@s", b"n" * 513, APP)
    with pytest.raises(BadRequest):
        groups.claim("g@s", b"n" * (512 << 10), APP, 0, [])  # XCLAIM names one too
    assert list(groups.names["g@s"]) == [b"n" * 512] and groups.name_count == 1


def test_a_group_keeps_only_so_many_names_and_a_forgotten_one_frees_room(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMERS_PER_GROUP", 3)
    groups = groups_of("g@s", "h@s")
    for name in (b"a", b"b", b"c"):
        groups.seen("g@s", name, APP)
    groups.seen("g@s", b"a", APP)  # a name it has is used again, whatever the count
    with pytest.raises(QueueFull, match=r"^group 'g@s' has 3 consumer names \(the limit is "
                       r"3\); reuse a name, or XGROUP DELCONSUMER those no longer used \(one "
                       r"unused for 300 s that holds no pending entry is forgotten\)$"):
        groups.seen("g@s", b"d", APP)
    groups.seen("h@s", b"d", APP)  # another group has room of its own
    groups.forget("g@s", b"b")  # XGROUP DELCONSUMER
    groups.seen("g@s", b"d", APP)
    assert list(groups.names["g@s"]) == [b"c", b"a", b"d"]  # least recently used first
    assert groups.name_count == 4


def test_the_broker_keeps_only_so_many_names_over_every_group(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES", 4)
    groups = groups_of("g@s", "h@s", "i@s")
    for gname, name in (("g@s", b"a"), ("g@s", b"b"), ("h@s", b"a"), ("h@s", b"b")):
        groups.seen(gname, name, APP)
    with pytest.raises(QueueFull, match=r"^the broker keeps 4 consumer names over every "
                       r"group \(the limit is 4\)"):
        groups.seen("i@s", b"a", APP)
    groups.forget("h@s", b"a")  # XGROUP DELCONSUMER
    groups.seen("i@s", b"a", APP)
    assert groups.destroy("g@s")  # XGROUP DESTROY: its names with it
    groups.seen("i@s", b"b", APP)
    assert groups.name_count == 3


def test_idle_names_holding_nothing_are_forgotten_and_those_holding_entries_kept(
        monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMERS_PER_GROUP", 3)
    groups = groups_of("g@s")
    for name in (b"gone", b"busy", b"quiet"):
        groups.seen("g@s", name, APP)
    hold(groups, "g@s", b"busy", 7)
    mono = resp_groups.time.monotonic()
    groups.forget_idle(mono)  # none idle yet
    assert len(groups.names["g@s"]) == 3
    age(groups, "g@s", IDLE_S + 1)
    groups.seen("g@s", b"quiet", APP)  # used again: not idle
    groups.forget_idle(mono)
    assert list(groups.names["g@s"]) == [b"busy", b"quiet"] and groups.name_count == 2
    assert groups.consumer_pending("g@s") == {b"busy": 1}
    groups.seen("g@s", b"worker-host-4242", APP)  # room for a new worker's name
    # its entry acknowledged (its lease gone), the idle name goes at the next sweep
    groups.pel["g@s"][7].holder.session.leases.clear()
    groups.forget_idle(mono)
    assert list(groups.names["g@s"]) == [b"quiet", b"worker-host-4242"]


def test_the_sweep_looks_for_idle_names_now_and_then_and_drops_deleted_groups(
        monkeypatch) -> None:
    groups = groups_of("g@s")
    groups.seen("g@s", b"a", APP)
    groups.seen("gone@s", b"a", APP)  # a group another door deleted meanwhile
    groups.seen("gone@s", b"b", APP)  # ... whose names are not idle: gone with it
    age(groups, "g@s", IDLE_S + 1)
    groups.sweep(0.0)
    assert groups.name_count == 3  # not yet: every NAMES_SWEEP_S
    groups.names_swept -= resp_groups.NAMES_SWEEP_S
    groups.sweep(0.0)
    assert groups.names == {"g@s": {}}  # an existing group's empty list stays
    assert groups.name_count == 0 and groups.made == {} and groups.makers == {"g@s": {}}


def test_a_read_answered_after_its_name_was_forgotten_brings_the_name_back() -> None:
    groups = groups_of("g@s")
    groups.seen("g@s", b"blocked", APP)  # XREADGROUP BLOCK 0, then nothing for long
    age(groups, "g@s", IDLE_S + 1)
    groups.forget_idle(resp_groups.time.monotonic())
    assert groups.names["g@s"] == {}
    holder: Any = SimpleNamespace(session=SimpleNamespace(leases={1}), identity=APP)
    item: Any = SimpleNamespace(tag=1, seq=1, attempts=1)
    groups.delivered_all("g@s", b"blocked", holder, [item], False)
    assert list(groups.names["g@s"]) == [b"blocked"] and groups.name_count == 1
    assert groups.consumer_pending("g@s") == {b"blocked": 1}


BOB: Any = SimpleNamespace(client_id="bob", admin=False)
ROOT: Any = SimpleNamespace(client_id="root", admin=True)
SHARE_FULL = (r"^client 'app' made 3 of the consumer names this broker keeps over every "
              r"group \(a client may make 3 of the 100000, so that no one uses them all\); "
              r"reuse a name, or XGROUP DELCONSUMER those no longer used \(one unused for "
              r"300 s that holds no pending entry is forgotten\)$")


def test_one_client_makes_only_its_share_of_the_names_and_others_go_on(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES_PER_CLIENT", 3)
    groups = groups_of("g@s", "h@s")
    for gname, name in (("g@s", b"a"), ("g@s", b"b"), ("h@s", b"a")):
        groups.seen(gname, name, APP)
    with pytest.raises(QueueFull, match=SHARE_FULL) as refused:
        groups.seen("h@s", b"c", APP)
    assert refused.value.detail == {"client": "app", "limit": 3}
    with pytest.raises(QueueFull, match=SHARE_FULL):
        groups.claim("h@s", b"c", APP, 0, [])  # XCLAIM names one too
    groups.seen("g@s", b"a", APP)  # its own names are used again, whatever its count
    groups.seen("h@s", b"c", BOB)  # another client makes names of its own
    groups.seen("g@s", b"b", BOB)  # ... and uses the maker's, which stay counted for it
    assert groups.made == {"app": 3, "bob": 1}
    with pytest.raises(QueueFull, match=SHARE_FULL):
        groups.seen("h@s", b"d", APP)
    for name in (b"d", b"e", b"f", b"g"):
        groups.seen("h@s", name, ROOT)  # an admin has no share
    assert groups.made == {"app": 3, "bob": 1, "root": 4} and groups.name_count == 8
    assert groups.makers["g@s"] == {b"a": "app", b"b": "app"}


def test_every_way_a_name_goes_gives_its_maker_the_slot_back(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES_PER_CLIENT", 3)
    groups = groups_of("g@s", "h@s", "i@s")

    def fill() -> None:  # app back at its share, whatever it made before
        for _ in range(3 - groups.made["app"]):
            groups.seen("i@s", b"fill-%d" % len(groups.names.get("i@s", {})), APP)
        with pytest.raises(QueueFull, match=SHARE_FULL):
            groups.seen("g@s", b"one-more", APP)

    for name in (b"a", b"b"):
        groups.seen("g@s", name, APP)
    groups.seen("h@s", b"a", APP)
    fill()
    groups.forget("g@s", b"a")  # XGROUP DELCONSUMER
    assert groups.made["app"] == 2
    fill()
    age(groups, "g@s", IDLE_S + 1)  # forgotten idle
    groups.forget_idle(resp_groups.time.monotonic())
    assert groups.made["app"] == 2 and groups.names["g@s"] == {}
    fill()
    assert groups.destroy("h@s")  # XGROUP DESTROY
    assert groups.made["app"] == 2
    fill()
    groups.group_deleted("consume:i@s")  # an admin deleted it through another door
    assert groups.made == {} and groups.name_count == 0
    groups.seen("g@s", b"x", APP)
    groups.server.core.state.groups.pop("consume:g@s")  # deleted by idle expiry, then
    groups.server.engine = SimpleNamespace(subscribe=lambda *a, **k: None,
                                           close=lambda *a: None)
    groups.server.access_for = lambda identity: None
    groups.create(APP, "s", "g@s", "new")  # ... made anew: the old names are not its
    assert groups.names["g@s"] == {} and groups.made == {} and groups.name_count == 0


def test_a_read_of_several_streams_makes_its_new_names_within_the_share(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES_PER_CLIENT", 3)
    groups = groups_of("g@s", "h@s", "i@s")
    groups.seen("g@s", b"w", APP)
    assert groups.admit("g@s", b"w", APP) is False  # it has it: no slot
    assert groups.admit("h@s", b"w", APP, more=0) is True
    assert groups.admit("i@s", b"w", APP, more=1) is True  # 1 + 1 made before it: 3
    with pytest.raises(QueueFull, match=r"^client 'app' made 3 of the consumer names"):
        groups.admit("i@s", b"w", APP, more=2)


def test_a_client_at_its_share_is_logged_once_until_it_frees_a_name(monkeypatch,
                                                                    caplog) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES_PER_CLIENT", 1)
    groups = groups_of("g@s")
    groups.seen("g@s", b"a", APP)
    caplog.set_level("WARNING", logger="minou.security")
    for _ in range(3):
        with pytest.raises(QueueFull):
            groups.seen("g@s", b"b", APP)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["client 'app' made 1 Redis consumer names, its share (the limit is 1): "
                     "more are refused until it frees some, other clients go on"]
    groups.forget("g@s", b"a")
    groups.seen("g@s", b"b", APP)
    with pytest.raises(QueueFull):
        groups.seen("g@s", b"c", APP)
    assert len(caplog.records) == 2  # at its share again: one more line


def test_a_name_brought_back_by_a_read_is_counted_for_the_reader() -> None:
    groups = groups_of("g@s")
    groups.names["g@s"] = {}  # made by XGROUP CREATE, no name yet
    holder: Any = SimpleNamespace(session=SimpleNamespace(leases={1}), identity=BOB)
    item: Any = SimpleNamespace(tag=1, seq=1, attempts=1)
    groups.delivered_all("g@s", b"blocked", holder, [item], False)
    assert groups.made == {"bob": 1} and groups.makers["g@s"] == {b"blocked": "bob"}
