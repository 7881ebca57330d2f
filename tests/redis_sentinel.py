"""Redis under Sentinel for tests: a primary, its replicas (``--replicaof``) and three
Sentinels (``redis-server <conf> --sentinel``: quorum 2, a primary is down after 1 s),
every one on a free loopback port with a directory of its own; stopped (only what was
started here) when done.

Each Sentinel gets its own writable config file: Sentinels rewrite it with what they
learn (replicas, the other Sentinels, a new primary).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import redis

from .redis_server import REDIS_SERVER, RedisServer, free_port

SERVICE = "mymaster"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


# A replica's first sync starts at once (Redis 7 waits 5 s for more replicas by default).
NO_SYNC_DELAY = ("--repl-diskless-sync-delay", "0")


class SentinelProcess:
    def __init__(self, directory: Path, index: int) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.id = f"{index + 1:040x}"  # a Sentinel's run id: 40 hex digits
        self.conf = self.dir / "sentinel.conf"
        self.proc: subprocess.Popen[bytes] | None = None

    def configure(self, primary_port: int, quorum: int, peers: list[SentinelProcess]) -> None:
        """Naming the other Sentinels saves the seconds they take to hear of each other
        (hello messages every 2 s): they can agree on a failover from the start."""
        known = "".join(f"sentinel known-sentinel {SERVICE} 127.0.0.1 {p.port} {p.id}\n"
                        for p in peers if p is not self)
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\ndaemonize no\n"
            f"sentinel myid {self.id}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n" + known)

    def start(self) -> SentinelProcess:
        assert REDIS_SERVER is not None
        log = open(self.dir / "sentinel.log", "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen([REDIS_SERVER, str(self.conf), "--sentinel"],
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, decode_responses=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


class SentinelSet:
    """``replicas`` replicas of one primary, watched by ``sentinels`` Sentinels."""

    def __init__(self, directory: Path, *, replicas: int = 1, sentinels: int = 3) -> None:
        self.dir = directory
        self.primary = RedisServer(directory / "redis0", *NO_SYNC_DELAY)
        self.replicas = [RedisServer(directory / f"redis{i + 1}", *NO_SYNC_DELAY,
                                     "--replicaof", "127.0.0.1", str(self.primary.port))
                         for i in range(replicas)]
        self.sentinels = [SentinelProcess(directory / f"sentinel{i}", i)
                          for i in range(sentinels)]
        for sentinel in self.sentinels:
            sentinel.configure(self.primary.port, sentinels // 2 + 1, self.sentinels)

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def url(self, query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0" + (f"?{query}" if query else "")

    def start(self, timeout: float = 30.0) -> SentinelSet:
        try:
            for server in self.servers:
                server.start()
            self.wait_linked(len(self.replicas), timeout, self.primary)
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_linked(self, replicas: int, timeout: float = 30.0,
                    primary: RedisServer | None = None) -> None:
        """Until ``primary`` (default: the one the Sentinels name now) has ``replicas``
        replicas in sync with it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                server = primary or self.server_at(self.master_port())
                info = server.client().info("replication")
            except (redis.RedisError, LookupError):
                info = {}
            online = [v for k, v in info.items() if k.startswith("slave")
                      and isinstance(v, dict) and v.get("state") == "online"]
            if len(online) >= replicas:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the primary did not get {replicas} replica(s) in time")

    def _wait_ready(self, timeout: float) -> None:
        """Until every Sentinel knows the replicas and the other Sentinels: only then
        can they agree that the primary is down and promote a replica."""
        deadline = time.monotonic() + timeout
        others = len(self.sentinels) - 1
        while time.monotonic() < deadline:
            ready = 0
            for sentinel in self.sentinels:
                try:
                    state = sentinel.client().sentinel_master(SERVICE)
                except redis.RedisError:
                    continue
                if int(state["num-slaves"]) >= len(self.replicas) and \
                        int(state["num-other-sentinels"]) >= others:
                    ready += 1
            if ready == len(self.sentinels):
                return
            time.sleep(0.1)
        raise RuntimeError("the Sentinels did not find each other and the replicas in time")

    def master_port(self) -> int:
        """The primary's port as the Sentinels say now (the first that answers)."""
        for sentinel in self.sentinels:
            try:
                _, port = sentinel.client().sentinel_get_master_addr_by_name(SERVICE)
            except (redis.RedisError, TypeError):
                continue
            return int(port)
        raise LookupError("no Sentinel answers")

    def server_at(self, port: int) -> RedisServer:
        for server in self.servers:
            if server.port == port:
                return server
        raise LookupError(f"no Redis of this set on port {port}")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()
