"""Flow control: a publisher that outruns the disk is paused, a consumer that stops
reading is cut with an error first, and nothing is lost either way."""

from __future__ import annotations

import asyncio
import socket

import minou
from minou.errors import ErrorCode
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

from ..conftest import signed_hello, wait_until


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
