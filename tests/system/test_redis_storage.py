"""A broker on Redis when Redis has a bad day (issue 17, items 2 and 6): a real broker
process on a real ``redis-server`` (AOF ``always``) of the test's own, killed and
restarted under it.

Redis killed -9 under load: publishes are refused with STORAGE_UNAVAILABLE (native
and HTTP), ``/health`` says 503 and why, the broker stays up and logs it once, and
resumes by itself when Redis is back from its AOF: every confirmed message is there,
nothing unconfirmed was confirmed. Redis unreachable at start, or a wrong password: a
clear error naming the URL (never the password), exit status 1.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from minou.errors import StorageFull, StorageUnavailable

from ..conftest import BrokerProcess, wait_until
from ..redis_server import REDIS_SERVER, RedisServer, free_port
from .test_full_disk import bearer, drain, fill, health

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

CH = "fill/v1/1"


class Producer(threading.Thread):
    """Publishes numbered messages without pause; records what was confirmed (seq -> n)
    and what was refused (n -> error code)."""

    def __init__(self, broker: BrokerProcess) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.confirmed: dict[int, int] = {}
        self.confirmed_at: dict[int, float] = {}  # seq -> time.monotonic() of its receipt
        self.refused: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        with self.broker.connect_sync("producer") as c:
            n = 0
            while not self.stop.is_set():
                try:
                    receipt = c.send(CH, {"n": n})
                except StorageUnavailable as exc:
                    self.refused[n] = int(exc.code)
                    time.sleep(0.05)
                else:
                    self.confirmed[receipt.seq] = n
                    self.confirmed_at[receipt.seq] = time.monotonic()
                n += 1


@pytest.fixture
def redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_redis_killed_under_load_refuses_publishes_then_resumes_losing_nothing(
        broker_factory: Any, redis: RedisServer) -> None:
    b = broker_factory.make(storage=redis.url).start()
    http_auth = bearer(b, "http-pub")
    producer = Producer(b)
    producer.start()
    try:
        wait_until(lambda: len(producer.confirmed) >= 200, 30, what="publishes before the kill")
        redis.kill()  # kill -9: Redis keeps what its AOF (fsync always) has
        wait_until(lambda: producer.refused, 30, what="a refusal while Redis is down")
        assert set(producer.refused.values()) == {300}  # STORAGE_UNAVAILABLE
        confirmed_while_down = len(producer.confirmed)
        r = httpx.post(b.http + "/v1/messages/" + CH, json={"n": -1}, headers=http_auth,
                       timeout=10)
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert (error["code"], error["reason"]) == (300, "storage_unavailable")
        assert redis.url.split("/0")[0].split("//")[1] in error["message"]
        r = health(b)
        assert r.status_code == 503
        assert (r.json()["status"], r.json()["storage"]) == ("storage_unavailable",
                                                             "unavailable")
        # An operator can still get in and look (an admin's token id cannot be made
        # durable now: the HELLO is welcomed all the same, and looking waits for no
        # commit).
        looked = subprocess.run([sys.executable, "-m", "minou", "status", "--json"],
                                env=b.cli_env(), capture_output=True, text=True, timeout=60)
        assert looked.returncode == 0, looked.stdout + looked.stderr
        refused_before = len(producer.refused)
        time.sleep(4.0)  # it stays down a while: nothing is confirmed meanwhile,
        assert len(producer.confirmed) == confirmed_while_down
        # and every publish is refused promptly (a refusal waits for no commit)
        assert len(producer.refused) >= refused_before + 5, producer.refused
        assert b.alive

        redis.start()  # the same port and directory: back from its AOF
        wait_until(lambda: len(producer.confirmed) >= confirmed_while_down + 200, 30,
                   what="publishes confirmed again once Redis is back")
        assert health(b).status_code == 200
    finally:
        producer.stop.set()
        producer.join(30)
    got, _ = drain(b, "recount", len(producer.confirmed))
    assert set(producer.confirmed) <= set(got), "a confirmed message is missing"
    assert all(got[seq] == n for seq, n in producer.confirmed.items())  # as confirmed
    refused = set(producer.refused)
    assert not refused & set(got.values()), "a refused publish was stored"
    assert b.output.count("cannot be reached") == 1, b.output  # logged once
    # Redis down longer than the lease (a slow restart): the lease ran out meanwhile and
    # is taken again, one more short episode with its own line, never a stop.
    assert b.output.count("until it holds the lease") <= \
        b.output.count("had run out (this broker was paused"), b.output
    assert "can be reached again" in b.output
    assert b.stop() == 0


def _start_fails(tmp_path: Path, storage: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minou", "start", "--data", str(tmp_path / "data"),
         "--host", "127.0.0.1", "--port", "0", "--http-port", "0", "--storage", storage],
        capture_output=True, text=True, timeout=60)


def test_unreachable_redis_at_start_is_a_clear_error(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    done = _start_fails(tmp_path, url)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert url in out and "Traceback" not in out, out


def test_a_wrong_password_is_a_clear_error_that_never_shows_it(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", "--requirepass", "right-secret").start()
    try:
        done = _start_fails(tmp_path, f"redis://:wrong-secret@127.0.0.1:{server.port}/0")
        out = done.stdout + done.stderr
        assert done.returncode == 1, out
        assert "password" in out.lower() and f"127.0.0.1:{server.port}" in out, out
        assert "wrong-secret" not in out and "Traceback" not in out, out
    finally:
        server.stop()


def test_with_replicas_1_publishes_wait_for_a_replica_and_are_refused_without_one(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    import redis as redis_py

    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1",
                          str(redis.port)).start()
    try:
        primary = redis_py.Redis(port=redis.port)
        wait_until(lambda: primary.info("replication")["connected_slaves"] == 1, 20,
                   what="the replica to connect")
        cfg = tmp_path / "replicas.toml"
        cfg.write_text(f'[storage]\nurl = "{redis.url}"\nreplicas = 1\n')
        b = broker_factory.make(config=cfg, storage=redis.url).start()
        with b.connect_sync("p", request_timeout=30) as c, \
                b.connect_sync("holder", request_timeout=30) as holder:
            confirmed = {c.send(CH, {"n": n}).seq: n for n in range(20)}
            # Confirmed means the replica has it too: its copy holds the queue's keys.
            assert redis_py.Redis(port=replica.port).keys("*{fill/v1}*")
            held = holder.consume("fill/v1/*", group="g", prefetch=2)
            first, second = held.get(timeout=10), held.get(timeout=10)
            replica.kill()
            with pytest.raises(StorageUnavailable) as refused:
                c.send(CH, {"n": 20})
            assert "replica" in refused.value.message, refused.value.message
            assert health(b).json()["status"] == "storage_unavailable"
            # An ack meanwhile is not durable: False (the message may come again), not
            # an exception that would end the consumer's loop over a failover.
            assert first.ack() is False
            replica.start()  # same directory and port: it connects and syncs again
            wait_until(lambda: health(b).status_code == 200, 60,
                       what="the broker to see its replica again")
            assert second.ack() is True

            def accepted() -> bool:
                try:
                    confirmed[c.send(CH, {"n": 21}).seq] = 21
                except StorageUnavailable:
                    time.sleep(0.2)
                    return False
                return True

            wait_until(accepted, 60, what="publishes confirmed once the replica is back")
        got, _ = drain(b, "recount", len(confirmed) - 2)
        # The one acked durably is settled; the one whose ack was not may come again.
        assert second.seq not in got
        assert set(confirmed) - {first.seq, second.seq} <= set(got)
        assert b.stop() == 0
    finally:
        replica.stop()


def test_redis_out_of_memory_refuses_publishes_serves_the_rest_and_resumes(
        broker_factory: Any, tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", "--maxmemory", "12mb",
                         "--maxmemory-policy", "noeviction").start()
    try:
        b = broker_factory.make(storage=server.url).start()
        with b.connect_sync("filler") as pub:
            before, full = fill(pub)
            assert "maxmemory" in full.message, full.message
            with pytest.raises(StorageFull):  # refused at once while full, still connected
                pub.send(CH, {"n": -1})
            r = health(b)
            assert r.status_code == 503 and r.json()["status"] == "storage_full"
            # Consumers and their acks go on while Redis is full: that frees room.
            got, durable = drain(b, "drainer", len(before))
            assert set(before) <= set(got) and all(got[s] == n for s, n in before.items())
            assert durable == set(got), "acks were not made durable while Redis was full"

            def accepted() -> bool:
                try:
                    pub.send(CH, {"n": "after"})
                except StorageFull:
                    time.sleep(0.2)
                    return False
                return True

            wait_until(accepted, 30, what="publishes accepted once acks freed room")
        assert b.alive and b.stop() == 0
    finally:
        server.stop()


def test_rediss_runs_a_broker_over_tls(broker_factory: Any, tmp_path: Path) -> None:
    """``rediss://`` with the CA of a Redis that speaks TLS only."""
    import redis as redis_py

    from minou.tls import ensure_self_signed

    files = ensure_self_signed(tmp_path / "tls", hosts=["127.0.0.1"])
    port = free_port()
    assert REDIS_SERVER is not None
    proc = subprocess.Popen(
        [REDIS_SERVER, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(files.cert), "--tls-key-file", str(files.key),
         "--tls-ca-cert-file", str(files.cert), "--tls-auth-clients", "no",
         "--appendonly", "yes", "--appendfsync", "always", "--save", "",
         "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={files.cert}"

        def up() -> bool:
            try:
                return bool(redis_py.Redis.from_url(url).ping())
            except redis_py.RedisError:
                return False

        wait_until(up, 20, what="redis-server with TLS")
        b = broker_factory.make(storage=url).start()
        with b.connect_sync("tls-user") as c:
            seqs = {c.send(CH, {"n": n}).seq: n for n in range(5)}
        b.kill()  # and back: the state is in that Redis
        b.start()
        got, _ = drain(b, "recount", len(seqs))
        assert got == seqs
        assert f"rediss://127.0.0.1:{port}/0" in b.output
        plain = redis_py.Redis(port=port, socket_timeout=2)
        with pytest.raises(redis_py.RedisError):
            plain.ping()  # nothing on that port speaks plain Redis: TLS was used
        assert b.stop() == 0
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_restart_gives_back_priority_and_delayed_messages_read_in_pages(
        broker_factory: Any, redis: RedisServer) -> None:
    """More priority and delayed messages than a page of a start's reads (about 1 MiB of
    their segments a call, storage.redis.store.OPEN_PAGE_BYTES): after a restart each
    comes once, those with a priority by priority, then the plain ones in order, and
    the delayed ones not before their time."""
    b = broker_factory.make(storage=redis.url).start()
    ch, delay, body = "late/v1/1", 8.0, bytes(range(256)) * 32  # 8 KiB
    kinds: dict[int, tuple[str, int]] = {}  # seq -> (kind, priority)

    async def publish() -> None:
        c = await b.connect("pub")
        for k in range(50):  # 400 messages of 8 KiB: 3.2 MiB of special segments
            items: list[dict[str, Any]] = []
            for i in range(8 * k, 8 * k + 8):
                item: dict[str, Any] = {"channel": ch, "payload": body}
                if i % 4 == 0:
                    item.update(delay=delay, priority=i % 3)
                elif i % 4 != 3:
                    item["priority"] = i % 9 + 1
                items.append(item)
            for item, receipt in zip(items, await c.send_many(items), strict=True):
                kind = "delayed" if "delay" in item else "priority" if item.get(
                    "priority") else "plain"
                kinds[receipt.seq] = kind, item.get("priority", 0)
        await c.close()

    asyncio.run(publish())
    assert b.stop() == 0
    b.start()
    got: list[tuple[int, int, float, float]] = []  # seq, priority, published_at, received
    with b.connect_sync("cons") as c:
        sub = c.consume(ch, prefetch=20)
        while len(got) < len(kinds):
            m = sub.get(60)
            got.append((m.seq, m.priority, m.published_at, time.time()))
            m.ack()
    assert sorted(s for s, *_ in got) == sorted(kinds)  # each once
    assert all(kinds[s][1] == p for s, p, *_ in got)  # its priority kept
    # Not delayed: by priority (then seq), then the plain ones in seq order.
    order = [s for s, *_ in got if kinds[s][0] != "delayed"]
    assert order == sorted((s for s in kinds if kinds[s][0] == "priority"),
                           key=lambda s: (-kinds[s][1], s)) + \
        sorted(s for s in kinds if kinds[s][0] == "plain")
    late = [(published + delay, received) for s, _, published, received in got
            if kinds[s][0] == "delayed"]
    assert len(late) == 100 and all(received >= due for due, received in late)
    assert b.stop() == 0
