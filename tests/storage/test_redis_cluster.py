"""Storage on a Redis Cluster (``redis+cluster://``): queues shard over the nodes by their
hash tag, a commit over queues on several nodes lands whole, claims stay fenced although
a claim spans two slots. The storage contract itself also runs on the cluster
(test_contract.py's ``cluster`` backend)."""

from __future__ import annotations

import time

import pytest
from redis.crc import key_slot

from minou.errors import StorageFenced
from minou.storage.redis import RedisStorage
from minou.storage.redis import scripts as lua
from minou.storage.redis.keys import queue_base
from tests.redis_cluster import RedisCluster
from tests.storage.test_contract import NOW, batch_of, msg, records, seqs

pytestmark = pytest.mark.timeout(60)

QUEUES = [f"q{i}/v1" for i in range(12)]


def _prefix(url: str) -> str:
    return url.rsplit("prefix=", 1)[1]


def _nodes_holding(cluster: RedisCluster, prefix: str) -> dict[int, set[str]]:
    """Node index -> the queues whose keys it holds."""
    out: dict[int, set[str]] = {}
    for i, c in enumerate(cluster.clients()):
        for key in c.scan_iter(match=f"{prefix}:*", count=1000):
            tag = key.decode(errors="replace").split("{", 1)[1].split("}", 1)[0]
            if tag != "shared":
                out.setdefault(i, set()).add(tag)
    return out


def test_queues_spread_over_the_nodes_each_whole_on_one(cluster_url: str,
                                                        redis_cluster: RedisCluster) -> None:
    st = RedisStorage(cluster_url)
    st.open(NOW)
    st.apply(batch_of(*(msg(f"{q}/1", 1) for q in QUEUES),
                      *(msg(f"_dead/{q}/1", 1) for q in QUEUES[:3])))
    holding = _nodes_holding(redis_cluster, _prefix(cluster_url))
    assert len(holding) >= 2, holding  # sharded: more than one node holds queues
    every = [q for qs in holding.values() for q in qs]
    assert sorted(every) == sorted(QUEUES)  # each queue on exactly one node
    snap = RedisStorage(cluster_url, claim=False).open(NOW)
    assert {name: r.count for name, r in records(snap).items()} == {
        **{f"{q}/1": 1 for q in QUEUES}, **{f"_dead/{q}/1": 1 for q in QUEUES[:3]}}


def test_a_claim_fences_the_earlier_writer_on_its_node_only(cluster_url: str) -> None:
    # Two queues on different nodes: fencing one leaves the other writable.
    a, b = "orders/v1", next(q for q in QUEUES if key_slot(f"{{{q}}}".encode()) // 5461
                             != key_slot(b"{orders/v1}") // 5461)
    first = RedisStorage(cluster_url)
    first.open(NOW)
    first.apply(batch_of(msg(f"{a}/1", 1), msg(f"{b}/1", 1)))
    second = RedisStorage(cluster_url, claim=False)
    second.open(NOW)
    assert second.claim(a) == first.epochs[a] + 1
    with pytest.raises(StorageFenced) as info:
        first.apply(batch_of(msg(f"{a}/1", 2), msg(f"{b}/1", 2)))
    assert set(info.value.queues) == {a}
    snap = RedisStorage(cluster_url, claim=False).open(NOW)
    assert records(snap)[f"{a}/1"].count == 1 and records(snap)[f"{b}/1"].count == 2
    second.apply(batch_of(msg(f"{a}/1", 2, b"mine")))
    assert seqs(second.read_range(f"{a}/1", 1, 10, 10)) == [1, 2]


def test_a_broker_paused_between_the_two_steps_of_a_claim_cannot_fence_its_successor(
        cluster_url: str) -> None:
    old = RedisStorage(cluster_url)
    old_lease = old.lease("old", 0.2)
    assert old_lease.try_acquire({"role": "primary"})
    old.open(NOW)
    old.apply(batch_of(msg("orders/v1/1", 1)))
    old_term = int(old._client.get(f"{_prefix(cluster_url)}:{{shared}}:term"))
    # The old primary's lease runs out (it is paused); a successor takes it: a newer term.
    new = RedisStorage(cluster_url)
    new_lease = new.lease("new", 5.0)
    deadline = time.monotonic() + 5
    while not new_lease.try_acquire({"role": "primary"}):
        assert time.monotonic() < deadline, "the successor never got the lease"
        time.sleep(0.05)
    new.open(NOW)  # claims orders/v1 under the newer term
    epoch = new.epochs["orders/v1"]
    # The old primary wakes up inside its claim, past the lease check, with its old
    # term: the queue's own slot refuses it, and its epoch does not move.
    base = queue_base(_prefix(cluster_url), "orders/v1")
    status, last = old._client.eval(lua.CLAIM_TERM, 2, base + "epoch", base + "term",
                                    old_term)
    assert (status, int(last)) == (b"fenced", old_term + 1)
    assert int(old._client.get(base + "epoch")) == epoch
    with pytest.raises(StorageFenced):  # its writes stay fenced
        old.apply(batch_of(msg("orders/v1/1", 2)))
    old.epochs.pop("orders/v1")  # as if it had never claimed it: it claims at the write
    with pytest.raises(StorageFenced):  # and is refused: the lease is not its own
        old.apply(batch_of(msg("orders/v1/1", 2)))
    new.apply(batch_of(msg("orders/v1/1", 2, b"new")))
    assert [m.data for m in new.read_range("orders/v1/1", 1, 10, 10)] == [b"1", b"new"]
    old_lease.close()
    new_lease.close()
