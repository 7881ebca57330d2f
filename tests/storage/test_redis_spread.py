"""Queues spread over brokers, at the storage level (RedisStorage.spread_as): a live
broker claims a queue no other live broker owns, hands it over with release_queue,
and a broker whose own record ran out (paused, cut off) claims and writes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from minou.core.snapshot import queue_part, shared_part
from minou.errors import StorageFenced
from minou.storage.redis import RedisStorage
from minou.storage.redis.keys import queue_base
from minou.storage.redis.lease import PrimaryLease
from tests.storage.test_contract import NOW, batch_of, msg, records

A1, A2, B1 = "orders/v1/1", "orders/v1/2", "audit/v2/7"


class Broker:
    """One broker's storage and its record in the alive set."""

    def __init__(self, url: str, member: str, lease_s: float = 5.0) -> None:
        self.st = RedisStorage(url, claim=False)
        self.lease: PrimaryLease = self.st.lease(member, lease_s)
        self.st.spread_as(member)
        self.lease.seen({"native": f"minou://127.0.0.1/{member}"})

    def close(self) -> None:
        self.lease.close()
        self.st.close()


@pytest.fixture(params=["redis", "cluster"])
def brokers(request: pytest.FixtureRequest) -> Iterator[list[Broker]]:
    """Brokers on one Redis, or on a Redis Cluster of three (claims in two steps)."""
    redis_url = request.getfixturevalue("redis_url" if request.param == "redis"
                                        else "cluster_url")
    made: list[Broker] = []

    def make(member: str, lease_s: float = 5.0) -> Broker:
        b = Broker(redis_url, member, lease_s)
        made.append(b)
        return b

    make.url = redis_url  # type: ignore[attr-defined]
    yield make  # type: ignore[misc]
    for b in made:
        b.close()


def test_the_first_writer_of_a_new_queue_owns_it_and_another_is_refused(brokers) -> None:
    a, b = brokers("a"), brokers("b")
    a.st.open_shared(NOW)
    b.st.open_shared(NOW)
    a.st.apply(batch_of(msg(A1, 1)))
    assert a.st.owners() == {"orders/v1": "a"}
    with pytest.raises(StorageFenced, match="owned by a") as info:
        b.st.apply(batch_of(msg(A2, 1)))
    assert (info.value.queues, info.value.holder) == ({"orders/v1": 0}, "a")
    with pytest.raises(StorageFenced, match="owned by a"):
        b.st.open_queue("orders/v1", NOW)
    b.st.apply(batch_of(msg(B1, 1)))  # another queue is b's to make
    assert a.st.owners() == {"orders/v1": "a", "audit/v2": "b"}


def test_a_handed_over_queue_is_claimed_at_once_and_the_old_owner_writes_nothing(
        brokers) -> None:
    a, b = brokers("a"), brokers("b")
    a.st.open_shared(NOW)
    b.st.open_shared(NOW)
    a.st.apply(batch_of(msg(A1, 1), msg(A1, 2)))
    assert a.st.release_queue("orders/v1") is True
    snap = b.st.open_queue("orders/v1", NOW)
    assert records(snap)[A1].next_seq == 3
    assert b.st.owners() == {"orders/v1": "b"}
    b.st.apply(batch_of(msg(A1, 3)))
    with pytest.raises(StorageFenced, match="owned by b"):  # a forgot it: no claim now
        a.st.apply(batch_of(msg(A1, 3, b"stale")))
    assert a.st.release_queue("orders/v1") is False  # not a's to give
    msgs = b.st.read_range(A1, 1, 10, 10)
    assert [m.data for m in msgs] == [b"1", b"2", b"3"]


def test_a_dead_owners_queue_is_claimed_and_its_late_writes_are_fenced(brokers) -> None:
    a, b = brokers("a", lease_s=1.0), brokers("b")
    a.st.open_shared(NOW)
    b.st.open_shared(NOW)
    a.lease.seen({"native": "minou://127.0.0.1/a"})  # its record from now (a slow machine)
    a.st.apply(batch_of(msg(A1, 1)))
    with pytest.raises(StorageFenced):
        b.st.open_queue("orders/v1", NOW)
    time.sleep(1.1)  # a's record runs out: it is dead to the others (a real wait: Redis's clock)
    assert b.lease.alive_members() == ["b"]
    b.st.open_queue("orders/v1", NOW)
    with pytest.raises(StorageFenced, match="claimed by another broker"):
        a.st.apply(batch_of(msg(A1, 2, b"late")))  # a's epoch is the old one
    # Nor may a broker whose own record ran out claim anything, or write shared state.
    with pytest.raises(StorageFenced, match="record in the alive set ran out"):
        a.st.apply(batch_of(msg(B1, 1)))
    with pytest.raises(StorageFenced):
        a.st.apply(batch_of(clients={"x": b"record"}))
    assert [m.data for m in b.st.read_range(A1, 1, 10, 10)] == [b"1"]


def test_shared_part_and_each_queue_opened_are_the_whole_open(brokers) -> None:
    a = brokers("a")
    a.st.open_shared(NOW)
    a.st.apply(batch_of(msg(A1, 1), msg(A2, 1), msg(B1, 1), clients={"x": b"rec"},
                        reservations={"orders/v1/1": "x"},
                        # explicit stream ids' points are the queue's (core/stream_ids.py)
                        meta={f"resp-id/{A1}/1": "50-0", f"resp-id/{B1}/1": "7-3",
                              "listen_keys": "escaped"}))
    whole = RedisStorage(brokers.url, claim=False)
    try:
        snap = whole.open(NOW)
    finally:
        whole.close()
    assert a.st.release_queue("orders/v1") and a.st.release_queue("audit/v2")
    b = brokers("b")
    shared = b.st.open_shared(NOW)
    assert shared == shared_part(snap)
    for q in ("orders/v1", "audit/v2"):
        assert b.st.open_queue(q, NOW) == queue_part(snap, q)
    assert b.st.open_queue("orders/v1", NOW).meta == {f"resp-id/{A1}/1": "50-0"}


def test_on_a_cluster_a_claim_cut_between_its_two_steps_raises_no_epoch(
        brokers, request: pytest.FixtureRequest) -> None:
    """Redis Cluster: owner and term in the shared slot, then the epoch in the queue's.
    A broker paused between the two (its first step then taken over by a later claim)
    must not raise the epoch when it wakes: the later claim's term fences it."""
    if request.node.callspec.params["brokers"] != "cluster":
        pytest.skip("the two-step claim is Redis Cluster's")
    a, b = brokers("a", lease_s=1.0), brokers("b")
    a.st.open_shared(NOW)
    b.st.open_shared(NOW)
    shared = a.st._shared
    a.lease.seen({"native": "minou://127.0.0.1/a"})  # its record from now (a slow machine)
    # a's first step alone, as if paused right after it
    step1 = a.st._client.evalsha(a.st._sha("own"), 4, shared + "owners", shared + "alive",
                                 shared + "queues", shared + "ownterm", "a", "orders/v1")
    assert step1[0] == b"ok"
    time.sleep(1.1)  # a's record runs out; b claims the queue in both steps
    b.st.open_queue("orders/v1", NOW)
    b.st.apply(batch_of(msg(A1, 1)))
    base = queue_base(a.st.prefix, "orders/v1")
    epoch = int(a.st._client.get(base + "epoch"))
    late = a.st._client.evalsha(a.st._sha("claim_term"), 2, base + "epoch", base + "term",
                                step1[1])  # a wakes: its second step
    assert late[0] == b"fenced" and int(a.st._client.get(base + "epoch")) == epoch
    assert b.st.owners() == {"orders/v1": "b"}
    b.st.apply(batch_of(msg(A1, 2)))  # b still writes
    assert [m.data for m in b.st.read_range(A1, 1, 10, 10)] == [b"1", b"2"]


def test_a_token_id_is_claimed_once_over_every_broker_and_counted_once(brokers) -> None:
    """A HELLO token's id, claimed before the WELCOME: the first broker wins, any other
    (or the same again) is told it is used; counted in ``used`` as a commit's TK would
    count it, and not again when that commit stores it too."""
    a, b = brokers("a"), brokers("b")
    a.st.open_shared(NOW)
    b.st.open_shared(NOW)
    shared = a.st._shared  # the {shared} keys' prefix

    def used() -> int:
        return int(a.st._client.get(shared + "used") or 0)

    before = used()
    assert a.st.claim_token("jti-1", NOW + 60) is True
    assert b.st.claim_token("jti-1", NOW + 60) is False
    assert a.st.claim_token("jti-1", NOW + 60) is False
    assert used() == before + 64 + len("jti-1")
    a.st.apply(batch_of(used_tokens=[("jti-1", NOW + 60)]))
    assert used() == before + 64 + len("jti-1")
    assert b.st.claim_token("jti-2", NOW + 60) is True
    assert sorted(a.st.open_shared(NOW).used_tokens) == [("jti-1", NOW + 60),
                                                         ("jti-2", NOW + 60)]
