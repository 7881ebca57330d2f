"""Two brokers on one Redis (issue 17, items 3 and 4; issue 18, item 1): one primary,
one standby.

Real broker processes on a real ``redis-server`` of the test's own, ``owner_lease``
1 s so that takeovers are quick. The standby relays its clients to the primary (native,
HTTP, the WebSocket stream), or with ``standby = "redirect"`` answers them with where
the primary is (the client follows, HTTP is redirected, ``/health`` is 503); kill -9 of
the primary under load: the standby serves within the lease and no confirmed message
is lost;
SIGSTOP of the primary past its lease, takeover, SIGCONT: the old primary writes
nothing (its writes are refused inside Redis), says so, and exits 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as wsc

import minou
from minou.errors import MinouError

from ..conftest import BrokerProcess, wait_until
from ..redis_server import REDIS_SERVER, RedisServer, free_port
from .test_full_disk import bearer, drain
from .test_http_stream import receive

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

CH = "fill/v1/1"
LEASE = 1.0


@pytest.fixture
def redis(tmp_path: Path) -> Any:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@dataclass
class OnCluster:
    """The session's Redis Cluster (three primaries), under a key prefix of the test's own."""

    url: str


@pytest.fixture(params=["redis", "cluster"])
def any_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """One Redis of the test's own, or the session's Redis Cluster: the lease, the
    claims and their fencing work the same on both."""
    if request.param == "cluster":
        yield OnCluster(request.getfixturevalue("cluster_url"))
        return
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def pair(broker_factory: Any, redis: RedisServer | OnCluster, tmp_path: Path,
         standby: str = "relay", top: str = "") -> tuple[BrokerProcess, BrokerProcess]:
    """A primary (started first) and a standby on fixed ports (``top``: more settings)."""
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f'{top}[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n'
                   f'standby = "{standby}"\n')
    first = broker_factory.make(config=cfg, storage=redis.url).start()
    return first, start_standby(broker_factory, cfg, redis.url)


def start_standby(broker_factory: Any, cfg: Path, storage: str) -> BrokerProcess:
    """A broker started after the primary, on fixed ports (it prints no banner)."""
    standby = broker_factory.make(config=cfg, storage=storage)
    standby.port, standby.http_port = free_port(), free_port()
    standby.start(ready="standby:")
    return standby


def assert_kept_every_confirmed(broker: BrokerProcess, producer: Producer) -> None:
    """Read from ``broker`` by a new group: every confirmed publish is there, unchanged."""
    got, _ = drain(broker, "recount", len(producer.confirmed))
    assert set(producer.confirmed) <= set(got), "a confirmed message is missing"
    assert all(got[seq] == n for seq, n in producer.confirmed.items()), \
        "a confirmed message was overwritten"


def cluster_view(b: BrokerProcess, admin: BrokerProcess) -> dict[str, Any]:
    """``minou cluster --json`` on ``b`` as the admin made by broker ``admin``."""
    env = {**admin.cli_env(), "MINOU_URL": b.url}
    done = subprocess.run([sys.executable, "-m", "minou", "cluster", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def serving(b: BrokerProcess) -> bool:
    try:
        return httpx.get(b.http + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Producer(threading.Thread):
    """Publishes numbered messages through a client that knows both brokers."""

    def __init__(self, urls: str, auth: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.urls, self.auth = urls, auth
        self.confirmed: dict[int, int] = {}
        self.failed = 0
        self.last: Exception | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        import minou

        with minou.connect_sync(self.urls, request_timeout=10, **self.auth) as c:
            n = 0
            while not self.stop.is_set():
                try:
                    self.confirmed[c.send(CH, {"n": n}).seq] = n
                except MinouError as exc:
                    self.last = exc
                    self.failed += 1  # refused or cut off: not confirmed, sent again later
                    time.sleep(0.05)
                n += 1


def test_a_standby_relays_its_clients_to_the_primary(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Every broker serves every client: one that knows only the standby publishes,
    consumes and settles through it, over the native protocol, HTTP and the WebSocket
    stream; the primary answers and the tags are its own."""
    primary, standby = pair(broker_factory, redis, tmp_path)
    import minou

    with minou.connect_sync(standby.url, request_timeout=10, **primary.auth("relayed")) as c:
        assert c.send(CH, {"n": 1}).seq == 1
        sub = c.consume("fill/v1/*", group="g", prefetch=5)
        m = sub.get(timeout=10)
        assert (m.seq, m.payload) == (1, {"n": 1})
        assert m.ack()
    h = bearer(primary, "relayed")
    r = httpx.post(standby.http + "/v1/messages/" + CH, json={"n": 2}, headers=h, timeout=10)
    assert r.status_code == 201 and r.json()["seq"] == 2, r.text
    r = httpx.get(standby.http + "/health", timeout=5)
    assert r.status_code == 200, r.text  # the primary's health: this broker serves
    ws = wsc.connect(standby.http.replace("http://", "ws://") + "/v1/stream",
                     additional_headers=h, max_size=None)
    with ws:
        ws.send(json.dumps({"op": "consume", "pattern": "fill/v1/*", "group": "g"}))
        got = receive(ws, "message", timeout=10)
        assert got["payload"] == {"n": 2}
        ws.send(json.dumps({"op": "ack", "receipt": got["receipt"]}))
        assert receive(ws, "settled", timeout=10)
    # The standby's clients go when the primary dies; the standby then serves itself.
    with minou.connect_sync(standby.url, request_timeout=10, **primary.auth("relayed")) as c:
        assert c.send(CH, {"n": 3}).seq == 3

        def relays() -> dict[str, Any]:  # the standby's row, as `minou cluster` shows it
            view = cluster_view(primary, primary)
            return next(b for b in view["brokers"] if b["role"] == "standby")
        # Its record in Redis says what its door does: this client's connection now,
        # and the four relayed so far (native, HTTP, /health, the WebSocket).
        wait_until(lambda: relays()["relaying"] >= 1 and relays()["relayed"] >= 4, 10,
                   what="the standby's relay counters in `minou cluster`")
        assert relays()["refused"] == 0
        primary.kill()
        wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
        assert c.send(CH, {"n": 4}).seq == 4
    got, _ = drain(standby, "recount", 2)
    assert got == {3: 3, 4: 4}  # 1 and 2 were acked through the relay: gone
    assert standby.stop() == 0


def test_idle_sockets_flooding_a_standby_are_bounded_refused_and_cut(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The operator's bad day on a relaying standby: far more idle sockets than it may
    hold. It relays what it may (the primary cuts those that never say HELLO), refuses
    the rest at once with TOO_MANY_CONNECTIONS and a log line, never holds more
    descriptors than its limit allows, every idle socket is closed, the primary serves
    its own clients throughout, and the standby relays again afterwards."""
    import minou

    limits = "max_connections = 20\nhello_timeout = 1.0\nhttp_header_timeout = 1.0\n"
    primary, standby = pair(broker_factory, redis, tmp_path, top=limits)
    assert standby.proc is not None
    fds_before = len(os.listdir(f"/proc/{standby.proc.pid}/fd"))
    http_port = int(standby.http.rsplit(":", 1)[1])
    flood: list[socket.socket] = []
    try:
        for i in range(150):  # silent sockets, native and HTTP
            port = standby.port if i % 3 else http_port
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        wait_until(lambda: "sockets held (limit 20" in standby.output, 10,
                   what="the standby to hold all the sockets it may")
        held = len(os.listdir(f"/proc/{standby.proc.pid}/fd")) - fds_before
        # Its 20, and a few refused at once whose close is still under way: not 150.
        assert held <= 20 + 10, f"the standby holds {held} more descriptors than before"
        with minou.connect_sync(primary.url, request_timeout=10, **primary.auth("direct")) as c:
            assert c.send(CH, {"n": 1}).seq == 1  # the primary's own clients: served
        for sock in flood:  # relayed ones by the primary's hello_timeout, the rest by the door
            sock.settimeout(15)
            with contextlib.suppress(OSError):
                while sock.recv(65536):
                    pass
    finally:
        for sock in flood:
            sock.close()
    assert "standby: native connection from" in standby.output \
        or "standby: HTTP connection from" in standby.output
    assert "refused:" in standby.output and "sockets held (limit 20" in standby.output
    row = next(b for b in cluster_view(primary, primary)["brokers"] if b["role"] == "standby")
    assert row["full"] > 0 and row["relayed"] > 0
    with minou.connect_sync(standby.url, request_timeout=10, **primary.auth("after")) as c:
        assert c.send(CH, {"n": 2}).seq == 2  # relayed again once the flood is gone
    assert standby.proc.poll() is None and primary.proc is not None \
        and primary.proc.poll() is None


def test_a_standby_set_to_redirect_sends_clients_to_the_primary(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    primary, standby = pair(broker_factory, redis, tmp_path, standby="redirect")
    r = httpx.get(standby.http + "/health", timeout=5)
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "standby" and body["primary"] == primary.url, body
    r = httpx.get(standby.http + "/v1/queues", timeout=5)
    assert r.status_code == 307 and r.headers["location"] == primary.http + "/v1/queues"
    # A client given only the standby's URL follows it to the primary.
    with standby.connect_sync("follower") as c:
        receipt = c.send(CH, {"n": 1})
        assert receipt.seq == 1
    assert serving(primary) and not serving(standby)
    view = cluster_view(standby, primary)  # the CLI, given the standby, follows too
    assert [b["native"] for b in view["brokers"] if b["self"]] == [primary.url]
    roles = sorted((b["role"], b["native"]) for b in view["brokers"])
    assert roles == [("primary", primary.url), ("standby", standby.url)], view
    assert view["queues"] == [{"queue": "fill/v1", "epoch": 1, "owner": view["primary"]}]
    assert primary.stop() == 0  # a clean stop gives the lease back: the standby serves
    wait_until(lambda: serving(standby), 10, what="the standby to take over")
    got, _ = drain(standby, "recount", 1)
    assert got == {1: 1}


def test_kill_minus_nine_of_the_primary_under_load_the_standby_serves_losing_nothing(
        broker_factory: Any, any_redis: RedisServer | OnCluster, tmp_path: Path) -> None:
    primary, standby = pair(broker_factory, any_redis, tmp_path)
    producer = Producer(f"{primary.url},{standby.url}", primary.auth("producer"))
    producer.start()
    try:
        wait_until(lambda: len(producer.confirmed) >= 300, 30, what="publishes on the primary")
        primary.kill()
        killed = time.monotonic()
        wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
        took = time.monotonic() - killed
        before = len(producer.confirmed)
        wait_until(lambda: len(producer.confirmed) >= before + 300, 30,
                   what="publishes confirmed by the new primary")
    finally:
        producer.stop.set()
        producer.join(30)
    assert took < LEASE + 5, f"the standby took {took:.1f} s to serve (owner_lease {LEASE})"
    assert "took over as the primary" in standby.output
    view = cluster_view(standby, primary)
    assert view["primary"] == view["this_broker"]["member"]
    roles = {b["native"]: b["role"] for b in view["brokers"]}
    assert roles.get(standby.url) == "primary" and roles.get(primary.url, "gone") == "gone"
    assert view["events"][0]["what"] == "took over"
    assert view["queues"][0]["queue"] == "fill/v1" and view["queues"][0]["epoch"] == 2
    assert_kept_every_confirmed(standby, producer)
    assert standby.stop() == 0


def test_a_primary_paused_past_its_lease_writes_nothing_when_it_wakes(
        broker_factory: Any, any_redis: RedisServer | OnCluster, tmp_path: Path) -> None:
    primary, standby = pair(broker_factory, any_redis, tmp_path)
    producer = Producer(f"{primary.url},{standby.url}", primary.auth("producer"))
    producer.start()
    try:
        wait_until(lambda: len(producer.confirmed) >= 200, 30, what="publishes on the primary")
        assert primary.proc is not None
        primary.proc.send_signal(signal.SIGSTOP)  # its client keeps writing into the socket
        wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
        primary.proc.send_signal(signal.SIGCONT)
        assert primary.proc.wait(20) == 1, primary.output
        before = len(producer.confirmed)
        try:
            wait_until(lambda: len(producer.confirmed) >= before + 200, 30,
                       what="publishes confirmed by the new primary")
        except AssertionError:
            raise AssertionError(f"{len(producer.confirmed)} confirmed, {producer.failed} "
                                 f"failed, alive {producer.is_alive()}, last error "
                                 f"{producer.last!r}\n{standby.output[-3000:]}") from None
    finally:
        producer.stop.set()
        producer.join(30)
    out = primary.output
    assert "another broker took over" in out and "writes nothing more" in out, out[-3000:]
    assert_kept_every_confirmed(standby, producer)
    assert standby.stop() == 0


def woken_primary_delivers_nothing_acked(primary: BrokerProcess,
                                         take_over: Callable[[], BrokerProcess]
                                         ) -> BrokerProcess:
    """A consumer on ``primary`` holds no deliveries; the primary holds in memory a
    message that falls due (published with a delay) while it is paused (SIGSTOP) past its
    lease. ``take_over`` returns another broker once it serves; that message and one
    published through it are delivered there and acked (confirmed). After SIGCONT the
    old primary, whose consumer is still attached, must deliver neither: it delivers
    nothing until it knows its lease holds, here finds it lost, and exits 1. Returns the
    new primary."""
    import minou

    assert primary.proc is not None
    got: list[int] = []  # what the old primary's consumer received, in order
    acked: set[int] = set()
    stop = threading.Event()
    # One URL: this consumer stays on the old primary (heartbeats far apart: it does not
    # give the paused broker up on its own).
    with minou.connect_sync(primary.url, request_timeout=10, heartbeat=60,
                            **primary.auth("old-reader")) as old:
        sub = old.consume("fill/v1/*", group="g", prefetch=10)

        def read() -> None:
            while not stop.is_set():
                try:
                    got.append(sub.get(timeout=0.2).seq)
                except (TimeoutError, MinouError):
                    continue

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        with primary.connect_sync("producer") as pub:
            held = pub.send(CH, {"n": 0}, delay=2.0).seq  # in the primary's memory
        primary.proc.send_signal(signal.SIGSTOP)
        try:
            assert got == []  # nothing was due: the consumer holds nothing
            new_primary = take_over()
            with minou.connect_sync(new_primary.url, request_timeout=10,
                                    **primary.auth("new-reader")) as new:
                fresh = new.send(CH, {"n": 1}).seq
                on_new = new.consume("fill/v1/*", group="g", prefetch=10)
                while len(acked) < 2:  # the delayed one once due (within 2 s)
                    m = on_new.get(timeout=20)
                    assert m.ack(), f"the ack of #{m.seq} was not confirmed"
                    acked.add(m.seq)
            assert acked == {held, fresh}
            assert primary.proc.poll() is None  # still paused: it cannot have delivered
        finally:
            primary.proc.send_signal(signal.SIGCONT)
        assert primary.proc.wait(20) == 1, primary.output[-3000:]
        stop.set()
        reader.join(10)
    assert not set(got) & acked, \
        f"the woken primary delivered {got}, acked already: {sorted(acked)}\n" \
        + primary.output[-3000:]
    assert "another broker took over" in primary.output, primary.output[-3000:]
    got_again, _ = drain(new_primary, "recount", 0, timeout=1.0)
    assert got_again == {}  # both acked on the new primary: nothing comes back
    return new_primary


def test_a_primary_woken_past_its_lease_delivers_nothing_acked_on_the_new_one(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The bug ``make chaos`` found under load ("deliveries after a confirmed ack = 1"):
    a primary woken from a pause past its lease delivered, from memory, a message the
    new primary had delivered already and whose ack was confirmed."""
    import minou

    primary, standby = pair(broker_factory, redis, tmp_path)
    with minou.connect_sync(primary.url, request_timeout=10, **primary.admin_auth()) as adm:
        def renewals() -> int:
            return int(adm.admin("cluster")["this_broker"]["lease_renewals"])
        # Two renewals after the standby said it was ready: the primary counted it among
        # the brokers alive (it is not alone).
        start = renewals()
        wait_until(lambda: renewals() >= start + 2, 10, what="two lease renewals")

    def take_over() -> BrokerProcess:
        wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
        return standby

    assert woken_primary_delivers_nothing_acked(primary, take_over).stop() == 0


def test_a_lone_primary_woken_past_its_lease_delivers_nothing_acked_by_a_later_one(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Alone at its last renewal is not enough to deliver past the lease: a broker
    started during the pause was counted by no renewal, and takes over once the lease
    runs out."""
    lease = 5.0  # the second broker surely starts (a standby) before it runs out
    cfg = tmp_path / "alone.toml"
    cfg.write_text(f"[storage]\nowner_lease = {lease}\n")
    primary = broker_factory.make(config=cfg, storage=redis.url).start()

    def take_over() -> BrokerProcess:
        second = broker_factory.make(config=cfg, storage=redis.url)
        second.port, second.http_port = free_port(), free_port()
        second.start(timeout=lease + 30, ready="took over as the primary")
        wait_until(lambda: serving(second), 10, what="the second broker to serve")
        return second

    assert woken_primary_delivers_nothing_acked(primary, take_over).stop() == 0


def test_deliveries_of_the_old_primary_cannot_be_settled_and_come_again(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    primary, standby = pair(broker_factory, redis, tmp_path)
    with primary.connect_sync("p") as pub:
        sent = {pub.send(CH, {"n": n}).seq: n for n in range(10)}
    import minou

    with minou.connect_sync(f"{primary.url},{standby.url}", request_timeout=10,
                            **primary.auth("reader")) as c:
        sub = c.consume("fill/v1/*", group="g", prefetch=10)
        held = [sub.get(timeout=10) for _ in range(10)]
        assert sorted(m.seq for m in held) == sorted(sent)
        time.sleep(0.5)  # their attempt counts are stored (within milliseconds)
        primary.kill()
        wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
        again = [sub.get(timeout=20) for _ in range(10)]
        # A tag of the old primary settles nothing on the new one: not durable.
        assert [m.ack() for m in held] == [False] * 10
        assert sorted(m.seq for m in again) == sorted(sent)
        assert all(m.attempts >= 2 for m in again), [m.attempts for m in again]
        assert all(m.ack() for m in again)
    got, _ = drain(standby, "recount", 0, timeout=1.0)
    assert got == {}  # acked on the new primary: nothing comes back
    assert standby.stop() == 0


def test_a_standby_stops_cleanly_and_leaves_the_cluster(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    primary, standby = pair(broker_factory, redis, tmp_path)
    assert len(cluster_view(primary, primary)["brokers"]) == 2
    assert standby.stop() == 0  # SIGTERM while waiting for the lease
    view = cluster_view(primary, primary)
    assert [b["native"] for b in view["brokers"]] == [primary.url]  # gone at once
    assert primary.stop() == 0


def test_a_lone_broker_paused_past_its_lease_takes_it_again_and_goes_on(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """No standby took over: nobody claimed anything, so the lease is taken again."""
    cfg = tmp_path / "alone.toml"
    cfg.write_text(f"[storage]\nowner_lease = {LEASE}\n")
    b = broker_factory.make(config=cfg, storage=redis.url).start()
    producer = Producer(b.url, b.auth("producer"))
    producer.start()
    try:
        wait_until(lambda: len(producer.confirmed) >= 100, 30, what="publishes")
        assert b.proc is not None
        b.proc.send_signal(signal.SIGSTOP)
        time.sleep(LEASE * 3)  # the lease runs out; nobody is there to take it
        b.proc.send_signal(signal.SIGCONT)
        before = len(producer.confirmed)
        wait_until(lambda: len(producer.confirmed) >= before + 100, 30,
                   what="publishes confirmed after the pause")
    finally:
        producer.stop.set()
        producer.join(30)
    assert b.alive and "taken again" in b.output, b.output[-2000:]
    got, _ = drain(b, "recount", len(producer.confirmed))
    assert set(producer.confirmed) <= set(got)
    assert b.stop() == 0


def test_a_standby_relays_over_tls_pinning_the_primary_from_redis(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Both brokers with their own self-signed certificates: the client pins the
    standby's; the standby pins the primary's, which the primary published in Redis."""
    from minou.tls import cert_fingerprint

    cfg = tmp_path / "tls.toml"
    cfg.write_text(f'[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n'
                   "[tls]\nself_signed = true\n")
    primary = broker_factory.make(config=cfg, storage=redis.url).start()
    standby = start_standby(broker_factory, cfg, redis.url)
    pin = cert_fingerprint((standby.data_dir / "tls" / "cert.pem").read_bytes())
    assert primary.url.startswith("minous://") and pin != primary.tls_fingerprint
    import minou

    own = {k: v for k, v in primary.auth("tls-relayed").items() if k != "tls_fingerprint"}
    with minou.connect_sync(f"minous://127.0.0.1:{standby.port}", request_timeout=10,
                            tls_fingerprint=pin, **own) as c:
        assert c.send(CH, {"n": 1}).seq == 1
    got, _ = drain(primary, "recount", 1)
    assert got == {1: 1}
    assert primary.stop() == 0


def test_a_primary_cut_off_from_redis_steps_down_and_its_clients_go_to_the_standby(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A partition between the primary and Redis (a black hole: no reset, no answer):
    the standby, which still reaches Redis, takes over; the primary, out of reach past
    its lease with a standby there, exits 1 instead of holding its clients to refusals;
    its clients reconnect through the standby; nothing confirmed is lost."""
    from .netproxy import Proxy

    proxy = Proxy("127.0.0.1", redis.port).start()
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(f"[storage]\nowner_lease = {LEASE}\n")
    try:
        primary = broker_factory.make(config=cfg,
                                      storage=f"redis://127.0.0.1:{proxy.port}/0").start()
        standby = start_standby(broker_factory, cfg, redis.url)
        time.sleep(LEASE)  # the primary has seen its standby (member records)
        producer = Producer(f"{primary.url},{standby.url}", primary.auth("producer"))
        producer.start()
        try:
            wait_until(lambda: len(producer.confirmed) >= 200, 30, what="publishes")
            proxy.freeze()
            wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
            assert primary.proc is not None
            # It closes its clients' connections at once; the process itself may wait
            # for a commit stuck in the partition (bounded by the Redis socket timeout).
            assert primary.proc.wait(30) == 1, primary.output[-3000:]
            before = len(producer.confirmed)
            wait_until(lambda: len(producer.confirmed) >= before + 200, 30,
                       what="publishes confirmed through the new primary")
        finally:
            producer.stop.set()
            producer.join(30)
    finally:
        proxy.close()
    assert "out of reach" in primary.output and "another broker reaches it to take over" \
        in primary.output, primary.output[-3000:]
    assert_kept_every_confirmed(standby, producer)
    assert standby.stop() == 0


def test_redis_out_of_reach_for_both_past_the_lease_stops_neither_and_the_primary_goes_on(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """redis-server SIGSTOPped for five leases: the primary's renewals fail past its
    lease, but the standby's /health says it does not reach Redis either, so the primary
    stays up (it used to exit 1, and the standby took over once Redis was back: one
    broker fewer after every Redis outage). Once Redis answers, the standby leaves the
    lease to the primary for one lease; the primary takes it again and goes on serving
    what it had, and the standby stays a standby."""
    primary, standby = pair(broker_factory, redis, tmp_path)
    with minou.connect_sync(primary.url, **primary.auth("before")) as c:
        for n in range(20):
            c.send("fill/v1/1", {"n": n})
    time.sleep(2 * LEASE)  # the primary has seen its standby (member records)
    assert "redis_seen_s" in httpx.get(primary.http + "/health").json()
    assert redis.proc is not None
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(5 * LEASE)
        assert primary.alive and standby.alive, (primary.output + standby.output)[-3000:]
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    wait_until(lambda: serving(primary), 20, what="the primary to serve again")
    with minou.connect_sync(primary.url, **primary.auth("after")) as c:
        c.send("fill/v1/1", {"n": 20})
    time.sleep(2 * LEASE)  # past the standby's wait: it must not take over now
    assert primary.alive and serving(primary)  # (the standby relays /health to it)
    got, _ = drain(primary, "recount", 21)
    assert sorted(got.values()) == list(range(21))
    assert "no standby reaches it either" in primary.output, primary.output[-3000:]
    assert "took over" not in standby.output, standby.output[-3000:]
    assert standby.stop() == 0
    assert primary.stop() == 0


def test_soft_stop_of_the_primary_hands_over_while_producers_keep_flowing(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """`minou soft-stop` (given the standby's URL: relayed to the primary) lets the
    primary's deliveries settle while it goes on taking publishes, commits, gives its
    lease up and wakes the standby, which serves at once; it exits 0. Producers never
    stop for long, nothing is lost, and the handover itself delivers nothing twice."""
    primary, standby = pair(broker_factory, redis, tmp_path)
    urls = f"{primary.url},{standby.url}"
    producer = Producer(urls, primary.auth("producer"))
    seen: list[int] = []
    stop_consuming = threading.Event()

    def consume() -> None:
        import minou

        with minou.connect_sync(urls, request_timeout=10, **primary.auth("reader")) as c:
            sub = c.consume("fill/v1/*", group="g", prefetch=50)
            while not stop_consuming.is_set():
                try:
                    m = sub.get(timeout=0.5)
                except (TimeoutError, MinouError):
                    continue
                if m is not None:
                    seen.append(m.seq)
                    m.ack()

    consumer = threading.Thread(target=consume, daemon=True)
    producer.start()
    consumer.start()
    try:
        wait_until(lambda: len(producer.confirmed) >= 300 and len(seen) >= 100, 30,
                   what="publishes and deliveries on the primary")
        env = {**primary.cli_env(), "MINOU_URL": standby.url}
        done = subprocess.run([sys.executable, "-m", "minou", "soft-stop", "--json"],
                              env=env, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["native"] == primary.url
        assert primary.proc is not None and primary.proc.wait(30) == 0, primary.output
        stopped = time.monotonic()
        wait_until(lambda: serving(standby), 10, what="the standby to serve")
        took = time.monotonic() - stopped
        before = len(producer.confirmed)
        wait_until(lambda: len(producer.confirmed) >= before + 300, 30,
                   what="publishes confirmed by the new primary")
    finally:
        producer.stop.set()
        producer.join(30)
        time.sleep(1.0)  # the last confirmed ones reach the consumer
        stop_consuming.set()
        consumer.join(30)
    assert took < LEASE / 3 + 1.5, f"the standby took {took:.2f} s after the stop"
    recorded = cluster_view(standby, primary)["events"]
    events = [e["what"] for e in recorded]
    assert events[:3] == ["took over (handed over)", "gave the lease back (clean stop)",
                          "handing over (soft stop)"], events
    # named even when the standby's last look found the lease already given back
    assert recorded[0].get("from") == recorded[1]["by"], recorded[:2]
    assert "gave its lease up: taking over now" in standby.output or took < 0.5
    dup = [seq for seq in set(seen) if seen.count(seq) > 1]
    assert dup == [], f"delivered twice: {dup[:10]}"
    assert set(producer.confirmed) <= set(seen) | set(drain(standby, "recount", 0,
                                                              timeout=1.0)[0])
    assert standby.stop() == 0


def test_a_broker_restarted_at_once_does_not_take_its_dead_self_for_the_primary(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """Killed -9 and started again on the same ports before its lease ran out: the
    lease names the dead process, whose URL is this broker's own. It must not relay to
    itself (each relayed connection would open another) nor send clients to itself:
    it answers STANDBY naming no primary, then takes the lease over and serves."""
    import socket as socketlib

    cfg = tmp_path / "slow.toml"
    cfg.write_text("[storage]\nowner_lease = 4.0\n")
    b = broker_factory.make(config=cfg, storage=redis.url).start()
    port = b.port
    b.kill()
    b.port = port  # the same ports again
    b.start(ready="standby:")
    with socketlib.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"\x00\x00\x00\x01\x01")
        data = s.recv(65536)
    from minou.protocol import frames as f

    error = f.decode_body(data[4], data[5:])
    assert isinstance(error, f.Error) and error.code == 306, error
    assert "primary" not in (error.detail or {}), error  # nobody to go to yet
    wait_until(lambda: "took over as the primary" in b.output, 15,
               what="the restarted broker to take its lease over")
    wait_until(lambda: serving(b), 10, what="it to serve")
    with b.connect_sync("after") as c:
        assert c.send(CH, {"n": 1}).seq >= 1
    assert b.stop() == 0


def test_kv_compare_and_set_goes_on_after_the_standby_takes_over(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """The standby that takes over rebuilds the buckets' index from Redis before it
    serves: values, revisions and compare-and-set are as the dead primary left them."""
    primary, standby = pair(broker_factory, redis, tmp_path)
    with minou.connect_sync(primary.url, **primary.auth("kv")) as c:
        kv = c.kv("config")
        revs = [kv.put("leader", f"p{n}") for n in range(5)]
        kv.put("gone", 1)
        kv.delete("gone")
    primary.kill()
    wait_until(lambda: serving(standby), LEASE + 10, what="the standby to take over")
    with minou.connect_sync(standby.url, **standby.auth("kv")) as c:
        kv = c.kv("config")
        assert (kv.get("leader").value, kv.get("leader").revision) == ("p4", revs[-1])
        assert kv.get("gone") is None
        with pytest.raises(minou.RevisionMismatch):
            kv.put("leader", "stale", revision=revs[-2])
        assert kv.put("leader", "s", revision=revs[-1]) > revs[-1]
        assert kv.keys() == ["leader"]
