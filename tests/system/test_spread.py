"""Queues spread over brokers (issue 18, items 1 and 2): ``[storage] placement =
"spread"``, three real broker processes on a real redis-server of the test's own.

Each broker owns the queues rendezvous hashing gives it; a client on any broker
publishes to every queue and consumes a pattern spanning queues owned by all three
(its broker forwards to the owners over link connections); kill -9 of a broker: the
others adopt its queues within the lease and nothing confirmed is lost; a broker that
joins takes its share by hand-over.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import websockets.sync.client as wsc

import minou
from minou.auth import keys as keyfiles
from minou.auth.registry import decode_record, encode_record
from minou.auth.tokens import make_token
from minou.errors import ErrorCode
from minou.protocol import frames as f
from minou.storage.redis.keys import queue_base

from ..conftest import BrokerProcess, RawPeer, signed_hello, wait_until
from ..redis_cluster import RedisCluster
from ..redis_sentinel import SentinelSet
from ..redis_server import REDIS_SERVER, RedisServer
from .test_full_disk import bearer

# Shared with the other test_spread_*.py files, as is the ``redis`` fixture.
SPREAD_MARKS = [pytest.mark.timeout(180),
                pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]
pytestmark = SPREAD_MARKS

LEASE = 1.0
QUEUES = [f"orders/v{i}" for i in range(1, 13)]


@pytest.fixture
def redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def spread_brokers(broker_factory: Any, redis: RedisServer | str, tmp_path: Path, n: int,
                   **make: Any) -> list[BrokerProcess]:
    url = redis if isinstance(redis, str) else redis.url
    cfg = tmp_path / "spread.toml"
    cfg.write_text(f'[storage]\nurl = "{url}"\nowner_lease = {LEASE}\n'
                   'placement = "spread"\n')
    made = [broker_factory.make(config=cfg, storage=url, **make).start() for _ in range(n)]
    ADMINS[url] = made[0]
    return made


ADMINS: dict[str, BrokerProcess] = {}  # redis URL -> the broker that made the admin key


def cluster_view(b: BrokerProcess) -> dict[str, Any]:
    """``minou cluster --json`` asked of ``b`` (as the admin the first broker made: the
    registry is shared)."""
    env = {**ADMINS[b.storage].cli_env(), "MINOU_URL": b.url}
    done = subprocess.run([sys.executable, "-m", "minou", "cluster", "--json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def owners(b: BrokerProcess) -> dict[str, str]:
    return {q["queue"]: q["owner"] for q in cluster_view(b)["queues"]}


def links_runner(brokers: list[BrokerProcess]) -> tuple[str, BrokerProcess]:
    """The member running the federation links (the owner of ``_federation/v1``) and its
    broker. The links' queue may be between owners for a moment (its owner found it last
    at a renewal): wait for one of ``brokers``."""
    members = {cluster_view(b)["this_broker"]["member"]: b for b in brokers}
    wait_until(lambda: owners(brokers[0]).get("_federation/v1") in members, timeout=30,
               interval=0.2, what="a broker running the links")
    runner = owners(brokers[0])["_federation/v1"]
    return runner, members[runner]


def settled_spread(b: BrokerProcess, alive: int) -> bool:
    """Every queue owned by the broker placement gives it to, over ``alive`` brokers."""
    view = cluster_view(b)
    live = [m for m in view["brokers"] if m["alive"]]
    return len(live) == alive and all(q["owner"] == q["placed"] for q in view["queues"]) \
        and {q["queue"] for q in view["queues"]} >= set(QUEUES)


def publish_all(b: BrokerProcess, per_queue: int, start: int = 0, *,
                seqs: bool = True) -> int:
    """``per_queue`` messages to every queue, n from ``start``; ``seqs``: each channel
    had ``start`` messages before (its seqs follow on)."""
    with b.connect_sync("producer") as c:
        for i in range(start, start + per_queue):  # one frame over every queue: split
            receipts = c.send_many([(f"{q}/1", {"n": i, "q": q}) for q in QUEUES])
            assert not seqs or [r.seq for r in receipts] == [i + 1] * len(QUEUES)
    return per_queue * len(QUEUES)


def consume(b: BrokerProcess, expect: int, *, timeout: float = 3.0,
            failing_over: bool = False) -> dict[tuple[str, int], int]:
    """Consume ``orders/*`` as group ``all`` through ``b`` until ``expect`` came and then
    nothing for ``timeout`` s; ack each. {(queue, n): deliveries}. ``failing_over``: Redis
    just failed over, so an ack may be not durable for now (False: the replica it waits
    for is still resyncing with the new primary; the message comes again). A refused tag
    raises in every case."""
    got: dict[tuple[str, int], int] = {}
    with b.connect_sync("consumer") as c:
        sub = c.consume("orders/*", group="all", prefetch=50)
        while True:
            try:
                msg = sub.get(timeout=30 if len(got) < expect else timeout)
            except (TimeoutError, minou.Timeout):
                break
            key = (msg.payload["q"], msg.payload["n"])
            got[key] = got.get(key, 0) + 1
            durable = msg.ack()
            assert durable or failing_over, f"the ack of {key} (tag {msg.tag}) was refused"
    return got


def test_three_brokers_spread_the_queues_and_any_serves_every_queue_native_and_http(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    brokers = spread_brokers(broker_factory, redis, tmp_path, 3)
    sent = publish_all(brokers[0], 25)
    wait_until(lambda: settled_spread(brokers[0], 3), timeout=20)
    by_owner: dict[str, int] = {}
    for owner in owners(brokers[1]).values():
        by_owner[owner] = by_owner.get(owner, 0) + 1
    # Member ids are random, so the split is too: 12 queues all on one broker has odds
    # of 3 / 3**12 (and one of three with none, 3 * (2/3)**12 = 2.3 %: not asserted).
    assert len(by_owner) >= 2, f"12 queues not spread over the brokers: {by_owner}"
    shown = subprocess.run([sys.executable, "-m", "minou", "cluster"],
                           env={**brokers[0].cli_env(), "COLUMNS": "200"},
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "queues spread" in shown.stdout and all(q in shown.stdout for q in QUEUES)
    with brokers[2].connect_sync("consumer") as c:  # group "all" holds every message
        c.consume("orders/*", group="all", prefetch=1).close()
    # Reads of a channel go to its owner wherever the client is.
    with brokers[1].connect_sync("reader") as c:
        for q in QUEUES:
            msgs, _ = c.read(f"{q}/1", limit=100)
            assert [m.payload["n"] for m in msgs] == list(range(25))
        # OFFSETS answers for every queue, whoever owns it (what Spark's reader lists)
        offsets = c.offsets("orders/*")
        assert offsets == {f"{q}/1": (1, 26) for q in QUEUES}
        # ... by publish time too (a task on each broker, merged by the client's)
        assert c.offsets_at("orders/*", time.time() - 3600) == \
            {f"{q}/1": (1, 26, 1) for q in QUEUES}
        # ... and POSITION moves a group on every owner: past seq 20 on each channel
        lags = c.set_position("positioned", {f"{q}/1": 21 for q in QUEUES})
        assert lags == {f"{q}/1": 5 for q in QUEUES}
    with brokers[0].connect_sync("positioned-reader") as c:
        sub = c.consume("orders/*", group="positioned", prefetch=100)
        seen = []
        while len(seen) < 5 * len(QUEUES):
            msg = sub.get(timeout=30)
            seen.append(msg.payload["n"])
            msg.ack()
        assert sorted(set(seen)) == [20, 21, 22, 23, 24]
    # HTTP publishes through a broker that owns some of the queues reach all of them:
    # one message per request, then a batch over the 12 queues in one request.
    h = bearer(brokers[1], "http-producer")
    with httpx.Client(base_url=brokers[1].http, timeout=30) as http:
        for q in QUEUES:
            r = http.post(f"/v1/messages/{q}/1", json={"n": 25, "q": q}, headers=h)
            assert r.status_code == 201, r.text
            assert r.json()["seq"] == 26
        batch = [{"channel": f"{q}/1", "payload": {"n": 26, "q": q}} for q in QUEUES]
        r = http.post("/v1/messages", json=batch, headers=h)
        assert r.status_code == 200, r.text
        assert [res["seq"] for res in r.json()["results"]] == [27] * len(QUEUES)
    sent += 2 * len(QUEUES)
    # A consumer on another broker reads every queue, each message once, and its acks
    # (tags of three brokers) all land: nothing comes again.
    got = consume(brokers[2], sent)
    assert len(got) == sent and set(got.values()) == {1}
    assert consume(brokers[1], 0, timeout=2.0) == {}


def test_an_xadd_naming_its_id_is_refused_by_a_broker_that_does_not_own_the_queue(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A stream's explicit ids live in its owner's memory (core/stream_ids.py): another
    broker refuses such an XADD naming the owner, rather than store it under '*'."""
    redis_py = pytest.importorskip("redis")
    from .test_resp import connect

    brokers = spread_brokers(broker_factory, redis, tmp_path, 2, resp_port=0)
    publish_all(brokers[0], 1)
    wait_until(lambda: settled_spread(brokers[0], 2), timeout=20)
    placed = owners(brokers[0])
    mine = cluster_view(brokers[0])["this_broker"]["member"]
    r = connect(brokers[0], "ider")
    refused = 0
    for q in QUEUES:
        if placed[q] == mine:
            assert r.xadd(f"{q}/1", {"n": "1"}, id="1700000000000-0") == b"1700000000000-0"
        else:
            with pytest.raises(redis_py.ResponseError, match=f"owns the stream's queue "
                                                            f"\\({placed[q]}\\)"):
                r.xadd(f"{q}/1", {"n": "1"}, id="1700000000000-0")
            refused += 1
            assert r.xadd(f"{q}/1", {"n": "1"}) == b"2-0"  # '*' goes to the owner
    assert 0 < refused < len(QUEUES), placed  # all on one broker: odds 2 / 2**12


def test_http_stream_and_admin_views_reach_queues_owned_by_another_broker(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    sent = publish_all(a, 3)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    placed = owners(a)
    there = cluster_view(a)["this_broker"]["member"]  # queues a owns: b reads them remotely
    remote = [q for q in QUEUES if placed[q] == there]
    # Admin views through b answer for every queue: `minou list` and GET /v1/queues
    # merged over the brokers, one queue's page and messages from its owner.
    env = {**ADMINS[redis.url].cli_env(), "MINOU_URL": b.url}
    listed = subprocess.run([sys.executable, "-m", "minou", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert {c["channel"]: c["depth"] for c in json.loads(listed.stdout)["channels"]} == \
        {f"{q}/1": 3 for q in QUEUES}
    admin = {"Authorization": "Bearer " + make_token(
        "admin", keyfiles.load_private(ADMINS[redis.url].admin_key), "minou", ttl=600)}
    with httpx.Client(base_url=b.http, timeout=30, headers=admin) as http:
        r = http.get("/v1/queues")
        assert r.status_code == 200, r.text
        assert {q["queue"]: q["depth"] for q in r.json()["queues"]} == {q: 3 for q in QUEUES}
        for q in remote[:2]:
            page = http.get(f"/v1/queues/{q}")
            assert page.status_code == 200 and page.json()["depth"] == 3, page.text
            msgs = http.get(f"/v1/queues/{q}/1/messages")
            assert [m["payload"]["n"] for m in msgs.json()["messages"]] == [0, 1, 2], msgs.text
    h = bearer(b, "http-consumer")
    with httpx.Client(base_url=b.http, timeout=30) as http:
        # Long polls through b, one message each, for every queue wherever it is owned;
        # receipts of a's deliveries are settled on a.
        got: dict[tuple[str, int], int] = {}
        for q in QUEUES:
            for _ in range(3):
                r = http.post(f"/v1/consume/{q}/*", params={"group": "web", "wait": 10},
                              headers=h)
                assert r.status_code == 200, (q, r.status_code, r.text)
                msg = r.json()
                key = (msg["payload"]["q"], msg["payload"]["n"])
                got[key] = got.get(key, 0) + 1
                ack = http.post(f"/v1/ack/{msg['receipt']}", headers=h)
                assert ack.status_code == 200, ack.text
        assert len(got) == sent and set(got.values()) == {1}
        # Acked on their owners: nothing comes again, here or there.
        for q in QUEUES:
            r = http.post(f"/v1/consume/{q}/*", params={"group": "web", "wait": 0.2},
                          headers=h)
            assert r.status_code == 204, (q, r.text)
        if remote:
            # An HTTP consumer with no request waiting holds nothing on the owner: a
            # message published now goes at once to a native consumer of the same group.
            q = remote[0]
            with a.connect_sync("native") as c:
                sub = c.consume(f"{q}/*", group="web", prefetch=10)
                c.send(f"{q}/1", {"n": 99, "q": q})
                assert sub.get(timeout=5).payload["n"] == 99
            # A receipt the owner no longer knows is a precise 4xx, not a 500.
            bad = http.post(f"/v1/ack/{msg['receipt']}", headers=h)
            assert bad.status_code == 404 and bad.json()["error"]["reason"] == "unknown_delivery", \
                bad.text
    # /v1/stream through b: one subscription over every queue (made before the
    # messages: acked ones are gone), acks land where the messages were delivered.
    with wsc.connect(b.http.replace("http://", "ws://") + "/v1/stream",
                     additional_headers=h, max_size=None) as ws:
        ws.send(json.dumps({"op": "consume", "pattern": "orders/*", "group": "ws",
                            "prefetch": 20}))
        assert json.loads(ws.recv(10))["type"] == "subscribed"
        sent = publish_all(a, 2, start=10, seqs=False)
        seen: dict[tuple[str, int], int] = {}
        settled = 0
        while settled < sent:
            ev = json.loads(ws.recv(30))
            if ev["type"] == "message":
                if ev["payload"]["n"] == 99:  # left to group web above
                    continue
                key = (ev["payload"]["q"], ev["payload"]["n"])
                seen[key] = seen.get(key, 0) + 1
                ws.send(json.dumps({"op": "ack", "receipt": ev["receipt"]}))
            else:
                assert ev["type"] == "settled", ev
                settled += 1
        assert len(seen) == sent and set(seen.values()) == {1}
        assert sum(q in remote for q, _ in seen) == 2 * len(remote)
        with pytest.raises(TimeoutError):  # all acked: nothing comes again
            while True:
                assert json.loads(ws.recv(1.5))["payload"]["n"] == 99
    # Queues made after a subscription under its pattern reach it, whoever owns them.
    fresh = [f"fresh/v{i}" for i in range(1, 9)]
    with b.connect_sync("native-fresh") as c:
        sub = c.consume("fresh/*", group="late", prefetch=20)
        with a.connect_sync("producer") as p:
            p.send_many([(f"{q}/1", {"q": q}) for q in fresh])
        wait_until(lambda: settled_spread(a, 2), timeout=20)
        got_fresh = []
        while len(got_fresh) < len(fresh):
            msg = sub.get(timeout=20)
            got_fresh.append(msg.payload["q"])
            msg.ack()
        assert sorted(got_fresh) == sorted(fresh)  # (all 8 owned by b: odds 1 in 256)


def test_spread_on_a_redis_cluster_shards_the_queues_and_survives_a_kill(
        broker_factory: Any, redis_cluster: RedisCluster, cluster_url: str,
        tmp_path: Path) -> None:
    """Redis Cluster of three primaries: each queue's keys in its own slot (spread over
    the nodes), claims in two steps; a broker killed, its queues adopted, nothing lost."""
    a, b = spread_brokers(broker_factory, cluster_url, tmp_path, 2)
    sent = publish_all(a, 5)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    prefix = cluster_url.partition("prefix=")[2]
    nodes = {redis_cluster.primary_of(queue_base(prefix, q) + "epoch").port for q in QUEUES}
    assert len(nodes) >= 2, "12 queues' keys all on one cluster node"
    a.kill()
    wait_until(lambda: settled_spread(b, 1), timeout=20)
    assert set(owners(b).values()) == {cluster_view(b)["this_broker"]["member"]}
    sent += publish_all(b, 5, start=5)
    got = consume(b, sent)
    assert len(got) == sent and set(got.values()) == {1}


def test_a_first_start_admin_key_another_broker_stored_over_is_set_aside(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Brokers on an empty Redis started together may each find no admin and make a
    key; the one stored last is the admin's. Here the race's outcome is forced: another
    broker's admin key written over this one's in Redis. Within a look this broker sets
    its key aside, says which is the admin's, and that one works on it."""
    (a,) = spread_brokers(broker_factory, redis, tmp_path, 1)
    assert a.admin_key.exists()
    other_dir = tmp_path / "other"
    other_key = keyfiles.generate()
    keyfiles.save(other_key, other_dir, "admin")
    r = redis.client()
    (clients,) = [k for k in r.keys("*clients")]
    record = decode_record(r.hget(clients, "admin"))
    r.hset(clients, "admin", encode_record(msgspec.structs.replace(
        record, public_key=keyfiles.public_pem(other_key).decode(),
        fingerprint=keyfiles.fingerprint(other_key))))
    wait_until(lambda: (a.data_dir / "admin.key.unused").exists(), 10,
               what="the overwritten admin key set aside")
    assert not a.admin_key.exists()
    # The key is set aside, then the warning written: wait for it (read between the two
    # once, under load)
    wait_until(lambda: "admin key was stored last" in a.output, 10, what="the warning")
    assert keyfiles.fingerprint(other_key) in a.output
    env = {**a.cli_env(), "MINOU_KEY": str(other_dir / "admin.key")}
    done = subprocess.run([sys.executable, "-m", "minou", "status", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["auth"]["admin_key"] is None


def test_spread_brokers_follow_a_sentinel_failover_losing_nothing_confirmed(
        broker_factory: Any, tmp_path: Path) -> None:
    """Two brokers spreading the queues over a Redis primary with two replicas under
    three Sentinels, ``replicas = 1``; kill -9 of the Redis primary: both brokers follow
    the promoted replica (their lease outlasts the failover), publishes through either
    are confirmed again, and every message confirmed before and after is read back."""
    redis = SentinelSet(tmp_path / "redis", replicas=2).start()
    try:
        url = redis.url()
        cfg = tmp_path / "spread.toml"
        cfg.write_text(f'[storage]\nurl = "{url}"\nreplicas = 1\nowner_lease = 8.0\n'
                       'placement = "spread"\n')
        a, b = [broker_factory.make(config=cfg, storage=url).start() for _ in range(2)]
        ADMINS[url] = a
        publish_all(a, 5)
        wait_until(lambda: settled_spread(a, 2), timeout=30)
        old = redis.primary
        old.kill()  # kill -9 the Redis primary
        wait_until(lambda: redis.master_port() != old.port, 30,
                   what="Sentinel to promote a replica")
        confirmed = {(q, n) for q in QUEUES for n in range(5)}

        def publish_after(n: int, through: BrokerProcess) -> bool:
            try:
                with through.connect_sync("producer") as c:
                    for r in c.send_many([(f"{q}/1", {"n": n, "q": q}) for q in QUEUES]):
                        assert r.seq > 0
            except minou.MinouError:  # refused while the brokers follow: sent again
                return False
            confirmed.update((q, n) for q in QUEUES)
            return True

        wait_until(lambda: publish_after(5, b), 60, interval=0.5,
                   what="publishes confirmed on the new primary")
        for n in range(6, 9):
            assert publish_after(n, a if n % 2 else b)
        assert a.alive and b.alive
        got = consume(b, len(confirmed), failing_over=True)
        assert confirmed <= set(got), f"missing: {sorted(confirmed - set(got))[:5]}"
    finally:
        redis.stop()


def test_a_broker_cut_off_from_redis_exits_and_the_other_adopts_its_queues(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A partition between one broker and Redis (a black hole: no reset, no answer):
    out of reach past its lease with another broker alive, it delivers nothing more and
    exits 1; the other, which still reaches Redis, adopts its queues; every message
    confirmed before the cut and after is read back."""
    from .netproxy import Proxy

    proxy = Proxy("127.0.0.1", redis.port).start()
    try:
        cfg = tmp_path / "cut.toml"
        url = f"redis://127.0.0.1:{proxy.port}/0"
        cfg.write_text(f'[storage]\nurl = "{url}"\nowner_lease = {LEASE}\n'
                       'placement = "spread"\n')
        cut = broker_factory.make(config=cfg, storage=url).start()
        ADMINS[url] = cut
        (other,) = spread_brokers(broker_factory, redis, tmp_path, 1)
        ADMINS[redis.url] = cut
        sent = publish_all(other, 5)
        wait_until(lambda: settled_spread(other, 2), timeout=20)
        mine = cluster_view(cut)["this_broker"]["member"]
        assert mine in owners(other).values(), "the broker to cut owns no queue"
        proxy.freeze()
        assert cut.proc is not None and cut.proc.wait(30) == 1, cut.output[-3000:]
        assert "out of reach" in cut.output, cut.output[-3000:]
        wait_until(lambda: settled_spread(other, 1), timeout=20)
        sent += publish_all(other, 5, start=5)
    finally:
        proxy.close()
    got = consume(other, sent)
    assert len(got) == sent and set(got.values()) == {1}


def test_a_broker_killed_its_queues_are_adopted_and_nothing_confirmed_is_lost(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    brokers = spread_brokers(broker_factory, redis, tmp_path, 3)
    sent = publish_all(brokers[0], 10)
    wait_until(lambda: settled_spread(brokers[0], 3), timeout=20)
    held = set(owners(brokers[0]).values())
    victim = next(b for b in brokers[1:] if cluster_view(b)["this_broker"]["member"] in held)
    gone = cluster_view(victim)["this_broker"]["member"]
    victim.kill()
    wait_until(lambda: settled_spread(brokers[0], 2), timeout=20)
    survivor = next(b for b in brokers[1:] if b is not victim)
    assert gone not in owners(survivor).values()
    sent += publish_all(survivor, 10, start=10)
    got = consume(brokers[0], sent)
    assert len(got) == sent, f"{sent - len(got)} confirmed message(s) missing"


def test_a_broker_that_joins_takes_its_share_by_hand_over_delivering_nothing_twice(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    (first,) = spread_brokers(broker_factory, redis, tmp_path, 1)
    sent = publish_all(first, 30)
    assert set(owners(first).values()) == {cluster_view(first)["this_broker"]["member"]}
    # A consumer reads slowly through the first broker while the second joins: the
    # queues handed over let what is out settle first, so nothing comes twice.
    got: dict[tuple[str, int], int] = {}
    refused: list[str] = []
    stop = threading.Event()

    def read() -> None:
        with first.connect_sync("consumer") as c:
            sub = c.consume("orders/*", group="all", prefetch=5)
            while not stop.is_set():
                try:
                    msg = sub.get(timeout=0.5)
                except (TimeoutError, minou.Timeout):
                    continue
                key = (msg.payload["q"], msg.payload["n"])
                got[key] = got.get(key, 0) + 1
                time.sleep(0.01)
                try:
                    msg.ack()
                except minou.MinouError as exc:  # a tag the hand-over forgot
                    refused.append(f"{key}: {exc}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_until(lambda: len(got) > 20, timeout=20)
    cfg = tmp_path / "spread.toml"
    second = broker_factory.make(config=cfg, storage=redis.url).start()
    wait_until(lambda: settled_spread(first, 2), timeout=30)
    wait_until(lambda: len(got) >= sent, timeout=60, what="every message")
    time.sleep(1.0)
    stop.set()
    reader.join(10)
    mine = cluster_view(second)["this_broker"]["member"]
    assert mine in set(owners(first).values()), "the new broker took nothing"
    events = cluster_view(first)["events"]
    assert any(e["what"] == "handed over" and e.get("to") == mine for e in events)
    assert len(got) == sent
    assert not refused, f"acks refused across the hand-over: {refused}"
    twice = {k: n for k, n in got.items() if n > 1}
    assert not twice, f"delivered more than once across the hand-over: {twice}"


def test_a_broker_paused_past_its_lease_writes_nothing_when_it_wakes_and_exits(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    sent = publish_all(a, 5)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    paused = cluster_view(b)["this_broker"]["member"]
    assert paused in owners(a).values()
    assert b.proc is not None
    b.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: settled_spread(a, 1), timeout=LEASE + 15,
                   what="the paused broker's queues to be adopted")
        sent += publish_all(a, 5, start=5)  # every queue, now all a's
    finally:
        b.proc.send_signal(signal.SIGCONT)
    assert b.proc.wait(20) == 1, b.output
    assert "claimed by another broker" in b.output or "fenced" in b.output, b.output
    got = consume(a, sent)
    assert len(got) == sent and set(got.values()) == {1}


def test_soft_stop_hands_every_queue_over_and_exits_0(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    sent = publish_all(a, 5)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    leaving = cluster_view(b)["this_broker"]["member"]
    env = {**ADMINS[redis.url].cli_env(), "MINOU_URL": b.url}
    done = subprocess.run([sys.executable, "-m", "minou", "soft-stop", "--json"],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert b.proc is not None and b.proc.wait(30) == 0, b.output
    assert leaving not in {q["owner"] for q in cluster_view(a)["queues"]}
    # b gives its queues up and exits; a takes them at its next look (a loaded machine
    # may make that a moment after b is gone).
    wait_until(lambda: any(e["what"] == "adopted" for e in cluster_view(a)["events"]), 20,
               what="the other broker to adopt the queues handed over")
    sent += publish_all(a, 5, start=5)
    got = consume(a, sent)
    assert len(got) == sent and set(got.values()) == {1}


def test_a_transaction_over_queues_of_both_brokers_commits_each_part_once(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """What the Spark sink does: stage (executors), commit by batch id (the driver),
    the same batch again after a crash (discarded by the fences), abort."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    publish_all(a, 1)  # the queues exist and spread
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    assert len(set(owners(a).values())) == 2
    with b.connect_sync("spark-job") as c:
        items = [(f"{q}/1", {"n": 1, "q": q}) for q in QUEUES]
        assert c.stage("t1", items) == len(QUEUES)
        done = c.commit_transactions("writer", 1, ["t1"])
        assert done["published"] == len(QUEUES) and done["discarded"] == 0
        assert c.stage("t2", items) == len(QUEUES)  # the batch replayed after a crash
        again = c.commit_transactions("writer", 1, ["t2"])
        assert again["published"] == 0 and again["discarded"] == len(QUEUES)
        c.stage("t3", [(f"{q}/1", {"n": 2, "q": q}) for q in QUEUES])
        assert c.abort_transactions(["t3"]) == 1  # its parts on both brokers dropped
        with pytest.raises(minou.MinouError, match="unknown transaction"):
            c.commit_transactions("writer", 2, ["t3"])
    got = consume(a, 2 * len(QUEUES))
    assert sorted(got) == sorted((q, n) for q in QUEUES for n in (0, 1))
    assert set(got.values()) == {1}


def test_a_client_revoked_on_one_broker_is_cut_and_refused_on_the_other(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The key registry is shared: each broker reads what the others stored every third
    of the lease, so a revocation on one reaches a connection held on another."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    with b.connect_sync("short-lived", reconnect=False) as held:
        held.send("orders/v1/1", {"n": 0, "q": "orders/v1"})
        with minou.connect_sync(a.url, **a.admin_auth()) as admin:
            # registered on b, known on a within a look (a third of the lease)
            wait_until(lambda: any(c["client_id"] == "short-lived"
                                   for c in admin.admin("clients.list")["clients"]),
                       timeout=10, what="a to learn the client b registered")
            admin.admin("clients.revoke", client_id="short-lived")

        def cut() -> bool:
            try:
                held.send("orders/v1/1", {"n": 1, "q": "orders/v1"})
            except minou.MinouError:
                return True
            return False

        wait_until(cut, timeout=10, what="the revoked client's connection to be cut")
    with pytest.raises(minou.MinouError, match="revoked"):
        minou.connect_sync(b.url, **b.auth("short-lived"))


def test_an_admins_credential_cannot_have_another_broker_run_an_admin_operation(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A credential never carries admin rights, an admin's neither. Through a broker
    that does not own the queue, an admin operation for it (purge, browse, dead letters)
    went to its owner over the brokers' link, which speaks for the admin without saying
    a credential was presented: the owner ran it. Now the broker the credential reached
    refuses it first, natively and over HTTP."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    publish_all(a, 1)
    wait_until(lambda: settled_spread(a, 2), timeout=20)
    here = cluster_view(a)["this_broker"]["member"]
    queue = next(q for q, owner in owners(a).items() if owner != here and q in QUEUES)
    with minou.connect_sync(a.url, **a.admin_auth(reconnect=False)) as admin:
        secret = admin.issue_credential(ttl=120)["credential"]
    with minou.connect_sync(a.url, client_id="admin", credential=secret, reconnect=False,
                            request_timeout=10) as worker:
        for op in ("purge", "browse", "dead.purge"):
            queue_arg = f"_dead/{queue}" if op == "dead.purge" else queue
            args = {"channel": f"{queue}/1"} if op == "browse" else {"queue": queue_arg}
            with pytest.raises(minou.NotAuthorized, match="delegated credential"):
                worker.admin(op, **args)
        assert worker.read(f"{queue}/1")[0][0].payload == {"n": 0, "q": queue}
    endpoint, version = queue.split("/")
    with httpx.Client(base_url=a.http, timeout=10,
                      headers={"Authorization": f"Bearer {secret}"}) as http:
        r = http.post(f"/v1/queues/{endpoint}/{version}/purge")
        assert r.status_code == 403, r.text
        r = http.get(f"/v1/queues/{endpoint}/{version}/1/messages")
        assert r.status_code == 403, r.text
    with minou.connect_sync(b.url, **b.auth("checker")) as checker:
        assert [m.payload for m in checker.read(f"{queue}/1")[0]] == [{"n": 0, "q": queue}]


def test_a_hello_token_used_on_one_broker_is_refused_on_the_others(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A native HELLO's token opens one connection, on any broker of the cluster: its
    id is claimed in Redis before the WELCOME. Each broker remembered only the ids it
    saw itself, so a captured token opened a connection on each of the others."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    with a.connect_sync("replayed-1"):  # registered, on every broker within a look
        pass
    wait_until(lambda: _welcomes(b, signed_hello("replayed-1")), timeout=10,
               what="b to know the client a registered")
    hello = signed_hello("replayed-1")
    assert _welcomes(a, hello)
    peer = RawPeer(b.url)
    try:
        peer.write(f.encode(hello))
        refused = peer.read()
        assert isinstance(refused, f.Error) and refused.fatal, refused
        assert refused.code == ErrorCode.NOT_AUTHENTICATED
        assert "already used" in refused.message and "replayed" in refused.message
        assert peer.closed_by_peer()
    finally:
        peer.close()
    fresh = signed_hello("replayed-1")  # a fresh token works on either
    assert _welcomes(b, fresh)
    with b.connect_sync("replayed-1") as client:
        assert client.admin("whoami")["client_id"] == "replayed-1"


def _welcomes(broker: BrokerProcess, hello: f.Hello) -> bool:
    peer = RawPeer(broker.url)
    try:
        peer.write(f.encode(hello))
        return isinstance(peer.read(), f.Welcome)
    except ConnectionError:
        return False
    finally:
        peer.close()


def test_a_credential_revoked_on_one_broker_cuts_its_connections_on_the_other(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Revoking a credential closes the connections that presented it, on every broker:
    the others learnt it was gone (it stopped opening new connections there) and kept
    the connections it had opened."""
    a, b = spread_brokers(broker_factory, redis, tmp_path, 2)
    with a.connect_sync("job-r1", reconnect=False) as owner:
        issued = owner.issue_credential(ttl=600)

        def opened() -> Any:
            try:
                return minou.connect_sync(b.url, client_id="job-r1", reconnect=False,
                                          credential=issued["credential"],
                                          request_timeout=10)
            except minou.NotAuthenticated:  # b has not read it yet
                return None

        held: list[Any] = []
        wait_until(lambda: held.append(opened()) or held[-1] is not None, timeout=10,
                   what="b to know the credential a issued")
        worker = held[-1]
        assert worker.admin("whoami")["client_id"] == "job-r1"
        owner.revoke_credential(issued["id"])

    def cut() -> bool:
        try:
            worker.admin("whoami")
        except Exception:  # closed by the broker: any error says so
            return True
        return False

    wait_until(cut, timeout=10, what="the revoked credential's connection on b to close")
    worker.close()
    with pytest.raises(minou.NotAuthenticated):
        minou.connect_sync(b.url, client_id="job-r1", credential=issued["credential"],
                           reconnect=False)


def test_request_reply_across_brokers_that_spread_the_queues(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Requests to queues owned by every broker, the responder on one broker, the
    requester on another, the requester's inbox owned by a third or either: the reply
    is checked by its token, which any broker of the cluster can verify."""
    brokers = spread_brokers(broker_factory, redis, tmp_path, 3)
    publish_all(brokers[0], 1)  # the queues exist: rendezvous hashing places them
    wait_until(lambda: settled_spread(brokers[0], 3), timeout=20)
    assert len(set(owners(brokers[0]).values())) >= 2
    with brokers[0].connect_sync("responder") as responder, \
            brokers[1].connect_sync("requester") as requester:
        responder.serve("orders/*", lambda msg: {"echo": msg.payload, "on": msg.channel},
                        group="echo", prefetch=16)
        for q in QUEUES:
            reply = requester.request(f"{q}/r", {"q": q}, timeout=10)
            assert reply == {"echo": {"q": q}, "on": f"{q}/r"}
        with pytest.raises(minou.NoResponders):
            requester.request("nobody/v1/r", {}, timeout=10)


def test_http_requests_through_any_broker_reach_responders_on_another(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """POST /v1/request on every broker, the responder on one, the requests' queues and
    the inboxes (_inbox/v1) owned by any: the broker holding the inboxes makes the
    request and waits for the reply (it commits there), the others relay its answer."""
    brokers = spread_brokers(broker_factory, redis, tmp_path, 3)
    publish_all(brokers[0], 1)
    h = bearer(brokers[1], "http-asker")  # the key is registered once, for every broker
    with brokers[0].connect_sync("http-responder") as responder:
        responder.serve("orders/*", lambda msg: {"echo": msg.payload, "on": msg.channel},
                        group="echo", prefetch=16)
        responder.request("orders/v1/warm", {}, timeout=10)  # the inboxes' queue exists
        wait_until(lambda: settled_spread(brokers[0], 3), timeout=20)
        inboxes = owners(brokers[0])["_inbox/v1"]
        for b in brokers:
            asked_here = cluster_view(b)["this_broker"]["member"] == inboxes
            with httpx.Client(base_url=b.http, timeout=30, headers=h) as http:
                for q in QUEUES:
                    r = http.post(f"/v1/request/{q}/r", params={"timeout": 10},
                                  json={"q": q, "here": asked_here})
                    assert r.status_code == 200, r.text
                    assert r.json() == {"echo": {"q": q, "here": asked_here}, "on": f"{q}/r"}
                    assert r.headers["x-minou-reply-id"]
                nobody = http.post("/v1/request/nobody/v1/r", params={"timeout": 5}, json={})
                assert nobody.status_code == 503, nobody.text
                assert nobody.json()["error"]["reason"] == "no_responders"
    # A link op no client may send, whatever its rights.
    with brokers[0].connect_sync("sneaky") as c, pytest.raises(minou.NotAuthorized,
                                                               match="brokers' own links"):
        c.admin("link.request", channel="orders/v1/x", data="e30=", headers="{}", timeout=1)


def test_kv_buckets_work_from_every_broker_and_survive_their_owner_s_death(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Every bucket is in queue _kv/v1: its owner checks each compare-and-set, fronts
    forward the writes and the reads; killed, another broker adopts it and rebuilds its
    index from Redis, so revisions and compare-and-set go on."""
    brokers = spread_brokers(broker_factory, redis, tmp_path, 2)
    with brokers[0].connect_sync("kv-a") as a, brokers[1].connect_sync("kv-b") as b:
        rev = a.kv("config").put("limit", 1)
        assert b.kv("config").get("limit").value == 1
        with pytest.raises(minou.RevisionMismatch):
            b.kv("config").put("limit", 2, revision=rev + 5)
        rev = b.kv("config").put("limit", 2, revision=rev)
        assert a.kv("config").get("limit").revision == rev
        assert a.kv("config").keys() == ["limit"]
    # The queue may show no owner for a moment (a 1 s lease on a loaded machine can
    # lapse and be taken again): wait for one of the two, read once.
    members = {cluster_view(x)["this_broker"]["member"]: x for x in brokers}
    seen: dict[str, str] = {}
    wait_until(lambda: seen.update(owners(brokers[0])) or seen.get("_kv/v1") in members,
               timeout=20, what="one of the brokers to own _kv/v1")
    owner = seen["_kv/v1"]
    victim = members[owner]
    survivor = next(x for x in brokers if x is not victim)
    victim.kill()
    wait_until(lambda: owners(survivor).get("_kv/v1") not in (None, owner), timeout=30,
               what="the survivor to adopt _kv/v1")
    with survivor.connect_sync("kv-c") as c:
        assert c.kv("config").get("limit").value == 2
        with pytest.raises(minou.RevisionMismatch):
            c.kv("config").create("limit", 3)
        assert c.kv("config").put("limit", 3, revision=rev) > rev


def test_a_federation_link_runs_on_one_broker_of_those_that_spread_the_queues(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Every broker of a spread cluster has the same [[federation]] link: the one owning
    queue _federation/v1 runs it, so the remote gets each message once; killed, another
    takes the links over and goes on from the fences."""
    from .test_federation import link, read_all, start

    remote = start(tmp_path, "far")
    cfg = tmp_path / "spread.toml"
    cfg.write_text(f'broker_id = "near"\n[storage]\nurl = "{redis.url}"\n'
                   f'owner_lease = {LEASE}\nplacement = "spread"\n'
                   + link("near-far", remote.url, push=["orders/*"]))
    brokers = [broker_factory.make(config=cfg, storage=redis.url).start() for _ in range(2)]
    ADMINS[redis.url] = brokers[0]
    try:
        sent = publish_all(brokers[0], 50, seqs=False)
        wait_until(lambda: sum(len(read_all(remote, f"{q}/1")) for q in QUEUES) >= sent,
                   timeout=60, what="every message on the remote")
        _, victim = links_runner(brokers)
        survivor = next(b for b in brokers if b is not victim)
        victim.kill()
        sent += publish_all(survivor, 50, start=50, seqs=False)
        wait_until(lambda: sum(len(read_all(remote, f"{q}/1")) for q in QUEUES) >= sent,
                   timeout=90, what="the messages sent after the runner's death")
        time.sleep(1.0)
        for q in QUEUES:
            got = [m.payload["n"] for m in read_all(remote, f"{q}/1")]
            assert got == list(range(100)), f"{q}/1: each once, in order"
    finally:
        remote.stop()


def test_a_federation_runner_paused_past_its_lease_carries_nothing_twice(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The broker running a link is paused (SIGSTOP) past its lease while messages keep
    coming: another adopts _federation/v1 and carries them; woken, the old runner goes
    on with the page it had until its next turn. The remote holds what the source
    holds, each message once, in the source's order. (Two runners cutting overlapping
    pages at once, which the commit's ``after`` refuses, is forced deterministically in
    test_federation.py::test_a_page_another_runner_partly_committed_is_not_carried_twice;
    here the woken runner's pages are mostly behind the new runner's fences already.)"""
    from .test_federation import link, read_all, start

    remote = start(tmp_path, "far")
    cfg = tmp_path / "spread.toml"
    cfg.write_text(f'broker_id = "near"\n[storage]\nurl = "{redis.url}"\n'
                   f'owner_lease = {LEASE}\nplacement = "spread"\n'
                   '[channels."orders/*"]\nretention = 3600\n'  # to compare with the source
                   + link("near-far", remote.url, push=["orders/*"]))
    brokers = [broker_factory.make(config=cfg, storage=redis.url).start() for _ in range(2)]
    ADMINS[redis.url] = brokers[0]
    paused: list[BrokerProcess] = []
    channels = [f"{q}/1" for q in QUEUES[:4]]

    def on_remote() -> int:
        return sum(len(read_all(remote, ch)) for ch in channels)

    try:
        runner = None
        sent = [0]

        def produce(b: BrokerProcess, until: Callable[[], bool]) -> None:
            with b.connect_sync("producer", reconnect=True, request_timeout=10) as c:
                while not until():
                    try:
                        c.send_many([(ch, sent[0]) for ch in channels])
                    except minou.MinouError:
                        time.sleep(0.2)  # not confirmed: sent again (the source may hold both)
                        continue
                    sent[0] += 1

        produce(brokers[0], lambda: sent[0] >= 50)
        wait_until(lambda: on_remote() >= 200, timeout=60, what="the first on the remote")
        runner, victim = links_runner(brokers)
        survivor = next(b for b in brokers if b is not victim)
        done = threading.Event()
        producer = threading.Thread(target=produce, args=(survivor, done.is_set))
        producer.start()
        time.sleep(0.5)
        victim.proc.send_signal(signal.SIGSTOP)
        paused.append(victim)
        wait_until(lambda: owners(survivor).get("_federation/v1") not in (None, runner),
                   timeout=30, what="the survivor to take the links over")
        time.sleep(1.5)  # it carries what came meanwhile
        victim.proc.send_signal(signal.SIGCONT)
        paused.clear()
        time.sleep(2.0)  # both may carry the link for a moment
        done.set()
        producer.join(60)
        assert not producer.is_alive()

        def caught_up() -> bool:
            return all(len(read_all(remote, ch)) >= len(read_all(survivor, ch))
                       for ch in channels)
        wait_until(caught_up, timeout=90, interval=1.0, what="the remote catching up")
        time.sleep(1.0)  # anything carried twice would be there by now
        for ch in channels:
            source = [m.payload for m in read_all(survivor, ch)]
            assert len(source) >= sent[0]
            assert [m.payload for m in read_all(remote, ch)] == source, \
                f"{ch}: not each once in order"
    finally:
        for b in paused:
            b.proc.send_signal(signal.SIGCONT)
        remote.stop()
