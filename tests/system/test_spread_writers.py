"""Spark writer ids with the queues spread over brokers: a ``writerId`` belongs to the
client whose commit first used it, on every broker, not only on the brokers that held a
part of that commit (docs/spark.md: "nobody can move a job's fences and make its next
batches vanish")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import minou
from minou.storage.redis.keys import shared_base

from ..conftest import wait_until
from ..redis_server import RedisServer
from . import test_spread
from .test_spread import (
    SPREAD_MARKS,
    owners,
    publish_all,
    settled_spread,
    spread_brokers,
)

pytestmark = SPREAD_MARKS
redis = test_spread.redis  # the fixture: one Redis per test


def test_a_writer_id_bound_on_one_broker_is_refused_to_another_client_on_every_broker(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The victim commits under writer ``W`` to a queue owned by broker a only; the
    thief, connected to broker b, commits under ``W`` to a queue b owns with a batch id
    far ahead. b never held a part of the victim's commit, yet ``W`` is the victim's:
    refused, and no fence moved (the victim's next batch there is published)."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    publish_all(a, 1)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    by_member: dict[str, list[str]] = {}
    for q, m in owners(a).items():
        by_member.setdefault(m, []).append(q)
    mine = [m for m in by_member if f":{a.port}:" in m]  # member ids name the port
    assert len(by_member) == 2 and mine, by_member
    qa = by_member[mine[0]][0]
    qb = next(q for m, qs in by_member.items() if m != mine[0] for q in qs)
    with a.connect_sync("victim") as c:
        c.stage("v1", [(f"{qa}/1", {"n": 100, "q": qa})])
        assert c.commit_transactions("W", 1, ["v1"])["published"] == 1
    with b.connect_sync("thief") as c:
        c.stage("t1", [(f"{qb}/1", {"n": 101, "q": qb})])
        with pytest.raises(minou.MinouError, match="belongs to client 'victim'"):
            c.commit_transactions("W", 10**9, ["t1"])
    with a.connect_sync("thief") as c:  # through a front whose broker knows the owner
        c.stage("t2", [(f"{qb}/1", {"n": 103, "q": qb})])
        with pytest.raises(minou.MinouError, match="belongs to client 'victim'"):
            c.commit_transactions("W", 10**9, ["t2"])
    stored = redis.client().hget(shared_base("minou") + "writers", "W")
    assert stored == b"victim"
    with b.connect_sync("victim") as c:  # the victim's next batch, on b's queue
        c.stage("v2", [(f"{qb}/1", {"n": 102, "q": qb})])
        done = c.commit_transactions("W", 2, ["v2"])
        assert done["published"] == 1 and done["discarded"] == 0, done



def test_a_writer_s_fences_adopted_with_its_queue_are_shown_only_to_its_owner(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Broker b starts knowing no writer; the victim then commits under ``W`` to a queue
    of broker a, which dies: b adopts the queue and W's fences with it, but never saw
    W bound. ``txn.fences`` of W asked of b by another client is refused (b looks the
    owner up in Redis), as a would have refused it; the victim still reads them."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    publish_all(a, 1)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    mine = [q for q, m in owners(a).items() if f":{a.port}:" in m]
    assert mine
    with a.connect_sync("victim") as c:
        c.stage("v1", [(f"{mine[0]}/1", {"n": 1})])
        assert c.commit_transactions("W", 7, ["v1"])["published"] == 1
    with b.connect_sync("nosy"):
        pass  # registered while a lives (a key is shared state)
    a.kill()
    wait_until(lambda: settled_spread(b, 1), timeout=20)
    assert all(f":{b.port}:" in m for m in owners(b).values())
    with b.connect_sync("nosy") as c, \
            pytest.raises(minou.MinouError, match="is client 'victim'"):
        c.admin("txn.fences", writer_id="W")
    with b.connect_sync("victim") as c:
        assert c.admin("txn.fences", writer_id="W")["fences"] == {f"{mine[0]}/1": 7}
