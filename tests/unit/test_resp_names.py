"""The Redis door's consumer names (server/resp_groups.py), without a broker: each is
bounded in length, a group keeps only so many and the broker only so many over every
group; a name unused for IDLE_S that holds no pending entry is forgotten, one that
holds entries is kept, and what is forgotten frees room. (The real bounds, through a
real broker: tests/system/test_resp.py.)"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from minou.errors import BadRequest, QueueFull
from minou.server import resp_groups
from minou.server.resp_groups import IDLE_S, Pending, RespGroups


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
    groups.seen("g@s", b"n" * resp_groups.MAX_CONSUMER_NAME)  # at the bound: kept
    with pytest.raises(BadRequest, match=r"^consumer name is 513 bytes, the limit is 512$"):
        groups.seen("g@s", b"n" * 513)
    with pytest.raises(BadRequest):
        groups.claim("g@s", b"n" * (512 << 10), 0, [])  # XCLAIM names one too
    assert list(groups.names["g@s"]) == [b"n" * 512] and groups.name_count == 1


def test_a_group_keeps_only_so_many_names_and_a_forgotten_one_frees_room(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMERS_PER_GROUP", 3)
    groups = groups_of("g@s", "h@s")
    for name in (b"a", b"b", b"c"):
        groups.seen("g@s", name)
    groups.seen("g@s", b"a")  # a name it has is used again, whatever the count
    with pytest.raises(QueueFull, match=r"^group 'g@s' has 3 consumer names \(the limit is "
                       r"3\); reuse a name, or XGROUP DELCONSUMER those no longer used \(one "
                       r"unused for 300 s that holds no pending entry is forgotten\)$"):
        groups.seen("g@s", b"d")
    groups.seen("h@s", b"d")  # another group has room of its own
    groups.forget("g@s", b"b")  # XGROUP DELCONSUMER
    groups.seen("g@s", b"d")
    assert list(groups.names["g@s"]) == [b"c", b"a", b"d"]  # least recently used first
    assert groups.name_count == 4


def test_the_broker_keeps_only_so_many_names_over_every_group(monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMER_NAMES", 4)
    groups = groups_of("g@s", "h@s", "i@s")
    for gname, name in (("g@s", b"a"), ("g@s", b"b"), ("h@s", b"a"), ("h@s", b"b")):
        groups.seen(gname, name)
    with pytest.raises(QueueFull, match=r"^the broker keeps 4 consumer names over every "
                       r"group \(the limit is 4\)"):
        groups.seen("i@s", b"a")
    groups.forget("h@s", b"a")  # XGROUP DELCONSUMER
    groups.seen("i@s", b"a")
    assert groups.destroy("g@s")  # XGROUP DESTROY: its names with it
    groups.seen("i@s", b"b")
    assert groups.name_count == 3


def test_idle_names_holding_nothing_are_forgotten_and_those_holding_entries_kept(
        monkeypatch) -> None:
    monkeypatch.setattr(resp_groups, "MAX_CONSUMERS_PER_GROUP", 3)
    groups = groups_of("g@s")
    for name in (b"gone", b"busy", b"quiet"):
        groups.seen("g@s", name)
    hold(groups, "g@s", b"busy", 7)
    mono = resp_groups.time.monotonic()
    groups.forget_idle(mono)  # none idle yet
    assert len(groups.names["g@s"]) == 3
    age(groups, "g@s", IDLE_S + 1)
    groups.seen("g@s", b"quiet")  # used again: not idle
    groups.forget_idle(mono)
    assert list(groups.names["g@s"]) == [b"busy", b"quiet"] and groups.name_count == 2
    assert groups.consumer_pending("g@s") == {b"busy": 1}
    groups.seen("g@s", b"worker-host-4242")  # room for a new worker's name
    # its entry acknowledged (its lease gone), the idle name goes at the next sweep
    groups.pel["g@s"][7].holder.session.leases.clear()
    groups.forget_idle(mono)
    assert list(groups.names["g@s"]) == [b"quiet", b"worker-host-4242"]


def test_the_sweep_looks_for_idle_names_now_and_then_and_drops_deleted_groups(
        monkeypatch) -> None:
    groups = groups_of("g@s")
    groups.seen("g@s", b"a")
    groups.seen("gone@s", b"a")  # a group another door deleted meanwhile
    age(groups, "g@s", IDLE_S + 1)
    age(groups, "gone@s", IDLE_S + 1)
    groups.sweep(0.0)
    assert groups.name_count == 2  # not yet: every NAMES_SWEEP_S
    groups.names_swept -= resp_groups.NAMES_SWEEP_S
    groups.sweep(0.0)
    assert groups.names == {"g@s": {}, "gone@s": {}} and groups.name_count == 0
    groups.forget_idle(resp_groups.time.monotonic())
    assert groups.names == {"g@s": {}}  # an existing group's empty list stays


def test_a_read_answered_after_its_name_was_forgotten_brings_the_name_back() -> None:
    groups = groups_of("g@s")
    groups.seen("g@s", b"blocked")  # XREADGROUP BLOCK 0, then nothing for long
    age(groups, "g@s", IDLE_S + 1)
    groups.forget_idle(resp_groups.time.monotonic())
    assert groups.names["g@s"] == {}
    holder: Any = SimpleNamespace(session=SimpleNamespace(leases={1}))
    item: Any = SimpleNamespace(tag=1, seq=1, attempts=1)
    groups.delivered_all("g@s", b"blocked", holder, [item], False)
    assert list(groups.names["g@s"]) == [b"blocked"] and groups.name_count == 1
    assert groups.consumer_pending("g@s") == {b"blocked": 1}
