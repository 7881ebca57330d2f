"""Consumers that stop reading, on a broker that relays another broker's deliveries to
them (queues spread over brokers): the relayed deliveries are bounded by this broker's
delivery budget as its own are. Real broker processes, raw sockets that never read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import minou

from ..conftest import wait_until
from ..redis_server import RedisServer
from . import test_spread
from .test_slow_consumers import BODY, read_all, rss_mib, silent_consumer
from .test_spread import (
    ADMINS,
    LEASE,
    SPREAD_MARKS,
    cluster_view,
    owners,
)

pytestmark = SPREAD_MARKS
redis = test_spread.redis  # the fixture: one Redis per test


def test_silent_consumers_of_another_broker_s_queue_pin_a_bounded_amount_here(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """20 consumers on broker a, prefetch 5000, never reading, of a queue broker b owns,
    under 4 KB messages, with an 8 MiB delivery budget on each broker. a relays what b
    delivers over its links; once a client's connection stops taking deliveries (its
    water mark, or its share of the budget) its front stops reading the links, so b's
    deliveries wait on b, under b's own bounds. Before, a read on and buffered them all
    unsent: each consumer up to b's in-flight share (64 MiB), 10x a's budget here."""
    budget = 8 << 20
    cfg = tmp_path / "budget.toml"
    cfg.write_text(f'delivery_buffer_bytes = {budget}\nslow_consumer_seconds = 600\n'
                   f'[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n'
                   'placement = "spread"\n')
    a, b, queue = two_brokers_and_a_queue_of_b(broker_factory, redis, cfg, "mem")
    silent = [silent_consumer(a.url, f"silent-{i}", f"{queue}/*", f"g{i}", prefetch=5000)
              for i in range(20)]
    try:
        before = rss_mib(a.proc.pid)
        with b.connect_sync("producer") as p:
            for _ in range(10):
                p.send_many([(f"{queue}/{i % 8}", BODY) for i in range(1000)])  # 4 MB
        time.sleep(2)
        flow = status_of(a)["flow"]
        bound = budget + 20 * ((256 << 10) + (1 << 20))
        assert flow["unsent_delivery_bytes"] <= bound, flow
        grown = rss_mib(a.proc.pid) - before
        assert grown < 100, f"a's RSS grew {grown:.0f} MiB relaying b's deliveries"
    finally:
        for s in silent:
            s.close()


def test_a_silent_consumer_of_another_broker_s_queue_is_cut_by_its_own_broker(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A consumer on broker a, of a queue broker b owns, prefetches 3,000 and reads
    nothing. b sees a relay that reads (a's link), not the consumer that stopped; a holds
    the relayed deliveries unsent. a cuts it after slow_consumer_seconds as it cuts one of
    its own queues, its front's links close, b requeues, and a reader gets all 3,000.
    Before, neither broker cut anything: the deliveries stayed pinned to the silent one."""
    cfg = tmp_path / "stall.toml"
    cfg.write_text(f'slow_consumer_seconds = 2\n[storage]\nurl = "{redis.url}"\n'
                   f'owner_lease = {LEASE}\nplacement = "spread"\n')
    a, b, queue = two_brokers_and_a_queue_of_b(broker_factory, redis, cfg, "cut")
    stuck = silent_consumer(a.url, "stuck", f"{queue}/*", "g", prefetch=3000)
    try:
        with b.connect_sync("producer") as p:
            p.send_many([(f"{queue}/{i % 8}", BODY) for i in range(3000)])  # ~12 MB
        wait_until(lambda: status_of(a)["flow"]["slow_consumers_cut"] >= 1, 20,
                   what="broker a to cut the silent consumer")
        assert "no deliveries were read for 2 s" in a.output
        assert len(read_all(a, f"{queue}/*", "g", 3000)) == 3000
    finally:
        stuck.close()


def two_brokers_and_a_queue_of_b(broker_factory: Any, redis: RedisServer, cfg: Path,
                                 prefix: str) -> tuple[Any, Any, str]:
    """Brokers a and b spreading 12 queues ``<prefix>1/v1`` .. ``<prefix>12/v1``, settled;
    one queue b owns."""
    a, b = (broker_factory.make(config=cfg, storage=redis.url).start() for _ in range(2))
    ADMINS[redis.url] = a
    with b.connect_sync("producer") as p:
        for k in range(1, 13):
            p.send(f"{prefix}{k}/v1/0", BODY)
    wait_until(lambda: settled_spread_of(a, 2), timeout=20)
    b_member = cluster_view(b)["this_broker"]["member"]
    return a, b, next(q for q, m in sorted(owners(a).items()) if m == b_member)


def settled_spread_of(b: Any, alive: int) -> bool:
    view = cluster_view(b)
    return len([m for m in view["brokers"] if m["alive"]]) == alive and \
        all(q["owner"] == q["placed"] for q in view["queues"])


def status_of(broker: Any) -> dict[str, Any]:
    with minou.connect_sync(broker.url, **ADMINS[broker.storage].admin_auth()) as c:
        return c.admin("status")  # type: ignore[no-any-return]
