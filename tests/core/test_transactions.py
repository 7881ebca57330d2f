"""Staged transactions and fences (core, no I/O)."""

from __future__ import annotations

import pytest

from minou.core.transactions import Transactions
from minou.errors import BadRequest, NotFound, QueueFull
from minou.protocol.frames import Send


def s(channel: str, body: bytes = b"{}") -> Send:
    return Send(channel, body)


def test_stage_take_and_bytes_accounting() -> None:
    t = Transactions()
    assert t.stage("c", "t1", [s("a/v1/1", b"12345")], 0.0) == 1
    assert t.stage("c", "t1", [s("a/v1/2", b"123")], 0.0) == 2
    assert t.bytes == 8
    sends = t.take("c", ["t1"])
    assert [x.channel for x in sends] == ["a/v1/1", "a/v1/2"]
    assert t.bytes == 0 and t.staged == {} and t.committed == 1
    with pytest.raises(NotFound, match="unknown transaction"):
        t.take("c", ["t1"])


def test_owners_are_enforced() -> None:
    t = Transactions()
    t.stage("c1", "t", [s("a/v1/1")], 0.0)
    with pytest.raises(BadRequest, match="another client"):
        t.stage("c2", "t", [s("a/v1/1")], 0.0)
    with pytest.raises(BadRequest, match="another client"):
        t.take("c2", ["t"])
    assert t.abort("c2", ["t"]) == 0 and t.abort("c1", ["t"]) == 1


def test_fence_discards_what_a_batch_already_published() -> None:
    t = Transactions()
    keep, skipped, updates = t.fence("w", 3, [s("a/v1/1"), s("a/v1/2")])
    assert len(keep) == 2 and skipped == [] and updates == {("w", "a/v1/1"): 3,
                                                             ("w", "a/v1/2"): 3}
    t.fences.update(updates)
    keep, skipped, _ = t.fence("w", 3, [s("a/v1/1"), s("a/v1/3")])
    assert [x.channel for x in keep] == ["a/v1/3"] and skipped == ["a/v1/1"]
    keep, _, _ = t.fence("other-writer", 3, [s("a/v1/1")])
    assert len(keep) == 1  # fences are per writer
    keep, _, _ = t.fence("w", 4, [s("a/v1/1")])
    assert len(keep) == 1 and t.discarded == 1


def test_limits_and_expiry(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 10)
    t = Transactions()
    t.stage("c", "a", [s("a/v1/1", b"123456")], 0.0)
    with pytest.raises(QueueFull):
        t.stage("c", "b", [s("a/v1/1", b"123456")], 0.0)
    with pytest.raises(BadRequest):
        t.stage("c", "", [s("a/v1/1")], 0.0)
    assert t.expire(now=10.0, ttl=5.0) == 1 and t.bytes == 0 and t.expired == 1
