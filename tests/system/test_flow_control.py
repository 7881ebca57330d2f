"""Flow control: a publisher that outruns the disk is paused, a consumer that stops
reading is cut with an error first, and nothing is lost either way."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import minou
from minou.errors import ErrorCode
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import signed_hello, wait_until
from .test_http_api import admin_bearer, bearer


def test_publisher_outrunning_the_disk_is_paused_and_loses_nothing(broker_factory, tmp_path):
    cfg = tmp_path / "flow.toml"
    cfg.write_text("publish_pause_bytes = 20000\n")
    broker = broker_factory.make(config=cfg).start()

    async def main() -> None:
        c = await minou.connect(broker.url, **broker.admin_auth())
        body = "x" * 1000
        receipts = await asyncio.gather(*(c.send("flow/v1/1", body) for _ in range(3000)))
        assert [r.seq for r in receipts] == list(range(1, 3001))
        status = await c.admin("status")
        assert status["flow"]["publisher_pauses"] >= 1
        listing = await c.admin("list", channel="flow/v1/1")
        assert listing["channels"][0]["depth"] == 3000
        await c.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_consumer_that_stops_reading_is_cut_with_an_error_first(broker_factory, tmp_path):
    cfg = tmp_path / "slow.toml"
    cfg.write_text("slow_consumer_bytes = 200000\n")
    broker = broker_factory.make(config=cfg).start()
    host, port = broker.url.removeprefix("minou://").rsplit(":", 1)
    with minou.connect_sync(broker.url, **broker.admin_auth()) as producer:
        producer.send_many([("slow/v1/1", "y" * 20_000) for _ in range(400)])
        sock = socket.create_connection((host, int(port)))
        sock.sendall(f.encode(signed_hello("sleepy")) + f.encode(
            f.Subscribe(1, 1, "consume", ["slow/v1/1"], "g", "", 1000, 0.0)))
        # Do not read: the broker's buffer for us grows past the limit and it cuts us.
        wait_until(lambda: producer.admin("status")["flow"]["slow_consumers_cut"] == 1,
                   timeout=30, what="the slow consumer to be cut")
        reader = FrameReader()
        frames = []
        sock.settimeout(10)
        try:
            while chunk := sock.recv(1 << 20):
                reader.receive_data(chunk)
                frames.extend(reader.events())
        except ConnectionResetError:
            pass  # dropped after the grace period: what we read must hold the error
        sock.close()
        errors = [fr for fr in frames if isinstance(fr, f.Error)]
        assert errors and errors[-1].code == ErrorCode.SLOW_CONSUMER and errors[-1].fatal
        # Its deliveries went back: a healthy consumer gets all 400.
        sub = producer.consume("slow/v1/1", group="g", prefetch=100)
        seqs = set()
        while len(seqs) < 400:
            msg = sub.get(timeout=10)
            seqs.add(msg.seq)
            msg.ack()
        assert seqs == set(range(1, 401))


@pytest.mark.sqlite_only
def test_http_publishes_count_toward_the_budget_and_are_refused_past_it(broker_factory,
                                                                         tmp_path):
    # The broker's writer is held on the SQLite write lock (its busy timeout is 5 s), so
    # what HTTP publishes stage stays uncommitted for as long as this test decides.
    cfg = tmp_path / "flow.toml"
    cfg.write_text("publish_pause_bytes = 20000\n")
    broker = broker_factory.make(config=cfg).start()
    h, admin = bearer(broker, "http-flood"), admin_bearer(broker)
    with httpx.Client(base_url=broker.http, timeout=10) as http, \
            broker.connect_sync("tcp-publisher") as tcp, ThreadPoolExecutor(2) as pool:

        def status() -> dict:
            return http.get("/v1/status", headers=admin).json()

        def publish(payload: object, timeout: float = 10) -> httpx.Response:
            return http.post("/v1/messages/flow/v1/h", json=payload, headers=h,
                             timeout=timeout)

        def big_publish() -> httpx.Response:
            with httpx.Client(base_url=broker.http, timeout=10) as other:
                return other.post("/v1/messages/flow/v1/h", json="x" * 30_000, headers=h)

        assert publish(0).status_code == 201  # identities known, nothing left to commit
        tcp.send("flow/v1/t", 0)
        before = status()
        assert before["flow"]["publisher_pauses"] == 0
        assert before["flow"]["uncommitted_bytes"] == 0
        assert before["flow"]["publish_pause_bytes"] == 20000
        db = sqlite3.connect(before["storage"]["path"], isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        try:
            big = pool.submit(big_publish)  # answered once committed: after the lock
            wait_until(lambda: status()["flow"]["uncommitted_bytes"] >= 30_000, 3,
                       what="the HTTP publish to count as uncommitted")
            # Over the budget: refused at once, precisely, and nothing of it is stored.
            for refused in (publish(1, timeout=2), http.post(
                    "/v1/messages", json=[{"channel": "flow/v1/h", "payload": 2}],
                    headers=h, timeout=2)):
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                error = refused.json()["error"]
                assert error["reason"] == "publish_backlog" and error["code"] == 305
                assert "the disk is behind" in error["message"]
                assert "publish_pause_bytes 20000" in error["message"]
                assert error["detail"]["limit"] == 20000
                assert error["detail"]["uncommitted_bytes"] >= 30_000
            # A TCP publisher now finds the budget spent by HTTP: it is paused.
            small = pool.submit(tcp.send, "flow/v1/t", "y" * 1000)
            wait_until(lambda: publish(3, timeout=2).json()["error"]["detail"]
                       ["uncommitted_bytes"] >= 31_000, 3, what="the TCP publish to count")
        finally:
            db.execute("ROLLBACK")
            db.close()
        assert big.result(10).status_code == 201
        assert small.result(10).seq == 2
        after = status()
        assert after["flow"]["publisher_pauses"] == 1
        assert after["flow"]["uncommitted_bytes"] == 0
        assert after["counters"]["refused"]["publish_backlog"] >= 3
        # The writer caught up: HTTP publishes are taken again; the refused ones were
        # not stored (warm-up 1, the big one 2, this one 3).
        assert publish(4).json()["seq"] == 3
