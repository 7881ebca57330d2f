"""A broker on Redis under Sentinel (issue 18, item 3): kill -9 the Redis primary
under load with ``replicas = 1``; Sentinel promotes a replica and the broker follows
it by itself: publishes are refused with STORAGE_UNAVAILABLE (``/health`` 503
``storage_unavailable``) meanwhile, then confirmed again on the new primary, and every
message confirmed before, during and after is there, exactly as confirmed.

Two shapes: two replicas (the promoted one still has a replica to WAIT for: nobody
has to do anything), and one replica (the promoted one has none until the old
primary comes back, which Sentinel turns into its replica).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ..conftest import wait_until
from ..redis_sentinel import SentinelSet
from ..redis_server import REDIS_SERVER
from .test_full_disk import drain, health
from .test_redis_storage import Producer

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]


@pytest.mark.parametrize("replicas", [2, 1], ids=["two-replicas", "one-replica"])
def test_redis_primary_killed_under_sentinel_the_broker_follows_the_new_one_losing_nothing(
        broker_factory: Any, tmp_path: Path, replicas: int) -> None:
    redis = SentinelSet(tmp_path / "redis", replicas=replicas).start()
    try:
        url = redis.url()
        cfg = tmp_path / "sentinel.toml"
        cfg.write_text(f'[storage]\nurl = "{url}"\nreplicas = 1\n')
        b = broker_factory.make(config=cfg, storage=url).start()
        producer = Producer(b)
        producer.start()
        try:
            wait_until(lambda: len(producer.confirmed) >= 200, 30,
                       what="publishes before the kill")
            old = redis.primary
            killed_at = time.monotonic()
            old.kill()  # kill -9 the Redis primary
            wait_until(lambda: producer.refused, 30, what="a refusal while Redis fails over")
            assert set(producer.refused.values()) == {300}  # STORAGE_UNAVAILABLE
            r = health(b)
            assert r.status_code == 503 and r.json()["status"] == "storage_unavailable"
            wait_until(lambda: redis.master_port() != old.port, 30,
                       what="Sentinel to promote a replica")
            promoted_at = time.monotonic()
            new = redis.server_at(redis.master_port())
            if replicas == 1:
                # The promoted replica has none of its own: commits cannot be confirmed,
                # and the broker, already on the new primary, says so.
                wait_until(lambda: f"(primary 127.0.0.1:{new.port}) has 0 replica(s)"
                           in health(b).text, 30, what="the broker on the new primary")
                old.start()  # back from its AOF; Sentinel makes it the new one's replica
            seen = len(producer.confirmed)
            wait_until(lambda: len(producer.confirmed) > seen + 200, 60,
                       what="publishes confirmed on the new primary")
            assert health(b).status_code == 200
            first_after = min(at for at in producer.confirmed_at.values()
                              if at > killed_at + 0.05)
            print(f"\nreplicas={replicas}: kill -> promotion {promoted_at - killed_at:.2f} s, "
                  f"kill -> first confirm on the new primary {first_after - killed_at:.2f} s")
        finally:
            producer.stop.set()
            producer.join(30)
        assert b.alive
        got, _ = drain(b, "recount", len(producer.confirmed))
        assert set(producer.confirmed) <= set(got), "a confirmed message is missing"
        assert all(got[seq] == n for seq, n in producer.confirmed.items())  # as confirmed
        assert b.stop() == 0
    finally:
        redis.stop()


def _free_runs(*widths: int) -> list[int]:
    """Bases of port runs ``base .. base + width - 1``, each port free on loopback, below
    the kernel's ephemeral range: a port free when checked there is not handed to some
    other test's connection before the script binds it (it was, once: 33888)."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    top = max(low, 20000 + 1000)
    bases: list[int] = []
    taken: set[int] = set()
    while len(bases) < len(widths):
        width = widths[len(bases)]
        base = random.randrange(20000, top - width)
        ports = set(range(base, base + width))
        if ports & taken:
            continue
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        bases.append(base)
        taken |= ports
    return bases


def test_the_three_broker_walk_through_runs_as_written(tmp_path: Path) -> None:
    """docs/cluster.md "Run three brokers": examples/three_brokers.sh starts Redis with
    two replicas, three Sentinels and three brokers; a client given the last broker
    only publishes (relayed to the primary); the primary is killed, another serves,
    and everything confirmed is there; ``stop`` stops it all."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    redis_base, sentinel_base, broker_base = _free_runs(3, 3, 22)
    env = {**os.environ, "DIR": "c", "REDIS_PORT": str(redis_base),
           "SENTINEL_PORT": str(sentinel_base), "BROKER_PORT": str(broker_base),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = str(root / "examples" / "three_brokers.sh")

    def sh(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", script, *args], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=120)

    def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
        cli_env = {**env, "MINOU_URL": url, "MINOU_KEY": str(tmp_path / "c/broker-0/admin.key"),
                   "MINOU_CLIENT_ID": "admin"}
        return subprocess.run([sys.executable, "-m", "minou", *args], cwd=tmp_path,
                              env=cli_env, text=True, capture_output=True, timeout=60)

    started = sh("start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        urls = started.stdout.split("three brokers up: ", 1)[1].split()[0]
        last = urls.split(",")[-1]
        sent = cli(last, "publish", "orders/v1/1", '{"n": 1}')
        assert sent.returncode == 0 and "seq=1" in sent.stdout, sent.stdout + sent.stderr
        primary_pid = int((tmp_path / "c/broker-0.pid").read_text())
        os.kill(primary_pid, signal.SIGKILL)
        wait_until(lambda: cli(urls, "publish", "orders/v1/1", '{"n": 2}').returncode == 0,
                   60, what="a standby to serve")
        got = cli(urls, "consume", "orders/v1/*", "--group", "audit", "--count", "2",
                  "--timeout", "10")
        assert got.returncode == 0, got.stdout + got.stderr
        assert '{"n": 1}' in got.stdout and '{"n": 2}' in got.stdout, got.stdout
    finally:
        stopped = sh("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not list((tmp_path / "c").glob("*.pid"))  # everything it started is gone
