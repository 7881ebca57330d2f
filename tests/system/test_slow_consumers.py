"""Consumers that stop reading: they are cut after a while, their deliveries go to
readers that read, and all of them together pin a bounded amount of broker memory.
Real broker processes, raw sockets that never read."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import minou
from minou.protocol import frames as f

from ..conftest import RawPeer, wait_until

BODY = "x" * 4000  # ~4 KB messages, as in the report


def silent_consumer(url: str, name: str, pattern: str, group: str,
                    prefetch: int = 1000) -> socket.socket:
    """HELLO and SUBSCRIBE, then never read the socket again."""
    peer = RawPeer(url)
    peer.hello(name)
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up fast
    peer.write(f.encode(f.Subscribe(1, 1, "consume", [pattern], group=group, prefetch=prefetch)))
    return peer.sock


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def status(broker) -> dict:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        return a.admin("status")


def test_a_consumer_that_reads_nothing_is_cut_and_its_messages_go_to_a_reader(
        broker_factory, tmp_path):
    cfg = tmp_path / "stall.toml"
    cfg.write_text("slow_consumer_seconds = 2\n")
    b = broker_factory.make(config=cfg).start()
    # Prefetch all 3,000 (12 MB): more than the kernel's socket buffers take on any
    # machine (the send side autotunes up to net.ipv4.tcp_wmem's max, 4 MB here), so
    # deliveries wait in the broker's own buffer and the stall shows there.
    stuck = silent_consumer(b.url, "stuck", "slow/v1/*", "g", prefetch=3000)
    try:
        with b.connect_sync("producer") as p:
            p.send_many([(f"slow/v1/{i % 8}", BODY) for i in range(3000)])  # ~12 MB
        wait_until(lambda: status(b)["flow"]["slow_consumers_cut"] >= 1, 20,
                   what="the silent consumer to be cut")
        assert "no deliveries were read for 2 s" in b.output
        # Everything it held comes to a consumer that reads.
        seen: set[tuple[str, int]] = set()
        with b.connect_sync("reader") as r:
            sub = r.consume("slow/v1/*", group="g", prefetch=100)
            deadline = time.monotonic() + 60
            while len(seen) < 3000 and time.monotonic() < deadline:
                msg = sub.get(timeout=10)
                seen.add((msg.channel, msg.seq))
                msg.ack()
        assert len(seen) == 3000
    finally:
        stuck.close()


def test_silent_consumers_together_pin_a_bounded_amount_of_memory(broker_factory,
                                                                  tmp_path):
    """20 consumers subscribe with prefetch 5000 and never read, under 4 KB messages:
    without a budget each would hold its 4 MiB water mark (80 MB, beside what the kernel
    holds); with an 8 MiB budget the broker holds about the budget plus 256 KiB per
    connection."""
    budget = 8 << 20
    cfg = tmp_path / "budget.toml"
    cfg.write_text(f"delivery_buffer_bytes = {budget}\nslow_consumer_seconds = 600\n")
    b = broker_factory.make(config=cfg).start()
    silent = [silent_consumer(b.url, f"silent-{i}", "mem/v1/*", f"g{i}", prefetch=5000)
              for i in range(20)]
    try:
        before = rss_mib(b.proc.pid)
        with b.connect_sync("producer") as p:
            for _ in range(10):
                p.send_many([(f"mem/v1/{i % 8}", BODY) for i in range(1000)])  # 4 MB
        time.sleep(1.5)  # a few ticks
        flow = status(b)["flow"]
        bound = budget + 20 * ((256 << 10) + (1 << 20))
        assert flow["unsent_delivery_bytes"] <= bound, flow
        assert flow["budget_paused_connections"] >= 1, flow
        grown = rss_mib(b.proc.pid) - before
        assert grown < 150, f"RSS grew {grown:.0f} MiB"  # 40 MB stored + the budget
        # A reader of its own group still gets messages while the silent ones are held.
        with b.connect_sync("live") as r:
            got = r.consume("mem/v1/*", group="live", start="oldest").get(timeout=10)
            assert got.payload == BODY
    finally:
        for s in silent:
            s.close()
