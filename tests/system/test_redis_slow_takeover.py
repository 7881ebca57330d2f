"""A broker that takes over keeps its lease while it opens the state (found by the
chaos run, tests/chaos.py).

Opening the state after a takeover (claiming every queue, reading the state) can take
longer than ``owner_lease``: a big state, a slow link to Redis, a loaded machine. The
lease must be renewed meanwhile, or it runs out before the new primary serves and a
third broker takes over from it: a takeover from a primary that was never paused, which
then stops before it served anyone; with slow opens this can go on and on.

Three brokers on one Redis. The one that takes over reaches Redis through a proxy that
delays every reply by 0.25 s, so that opening the state (some fifteen round trips) takes
longer than the lease, and a renewal on a second connection (a new one costs a few
round trips) still fits well within it. The third broker is paused while the primary
is killed, so that the slow one is the one that takes over, and woken as soon as it
has: it must find the lease renewed, and stay a standby.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, wait_until
from ..redis_server import REDIS_SERVER, RedisServer, free_port
from .netproxy import Proxy

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

LEASE = 3.0
REPLY_DELAY = 0.25  # per round trip to Redis, for the broker that takes over


@pytest.fixture
def redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def renewals(b: BrokerProcess, admin: BrokerProcess) -> int:
    """``minou_lease_renewals_total`` of ``b`` (0 until it answers)."""
    token = make_token("admin", keyfiles.load_private(admin.admin_key), "minou")
    try:
        text = httpx.get(b.http + "/metrics", timeout=5,
                         headers={"Authorization": f"Bearer {token}"}).text
    except httpx.HTTPError:
        return 0
    m = re.search(r"^minou_lease_renewals_total (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else 0


def test_a_broker_opening_the_state_slowly_after_a_takeover_keeps_its_lease(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f"[storage]\nowner_lease = {LEASE}\n")
    proxy = Proxy("127.0.0.1", redis.port).start()
    try:
        first = broker_factory.make(config=cfg, storage=redis.url).start()
        with first.connect_sync("p") as c:  # a queue to claim at the takeover
            c.send("slow/v1/1", {"n": 1})
        slow = broker_factory.make(config=cfg, storage=f"redis://127.0.0.1:{proxy.port}/0")
        third = broker_factory.make(config=cfg, storage=redis.url)
        for b in (slow, third):
            b.port, b.http_port = free_port(), free_port()
            b.start(ready="standby:")
        proxy.reply_delay = REPLY_DELAY
        assert third.proc is not None
        third.proc.send_signal(signal.SIGSTOP)  # so that the slow one takes over
        try:
            first.kill()
            wait_until(lambda: "took over as the primary" in slow.output, 60,
                       what="the slow broker to take over")
        finally:
            third.proc.send_signal(signal.SIGCONT)
        try:
            wait_until(lambda: "  stop with" in slow.output.split("took over", 1)[1], 60,
                       what="the slow broker to serve")
            # Renewed through a few leases' worth of time: meanwhile the third broker,
            # awake, tries the lease every third of it.
            wait_until(lambda: renewals(slow, first) >= 6, 60,
                       what="the slow broker to renew its lease")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nslow broker:\n{slow.output[-3000:]}\nthird "
                                 f"broker:\n{third.output[-2000:]}") from None
        assert slow.alive and "writes nothing more" not in slow.output, slow.output[-2000:]
        assert "took over" not in third.output, third.output[-2000:]
        assert slow.stop() == 0
    finally:
        proxy.close()
