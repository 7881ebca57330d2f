"""A real Redis Cluster for tests: three primaries (``redis-server --cluster-enabled``)
on free loopback ports, the 16,384 slots split between them, AOF ``always``, and as
many replicas as asked (one per primary at most); stopped (only they) when done."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from tests.redis_server import RedisServer

SLOTS = 16_384
BUS_OFFSET = 10_000  # Redis Cluster's bus listens on port + 10000


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisCluster:
    def __init__(self, directory: Path, primaries: int = 3, replicas: int = 0) -> None:
        self.dir = directory
        self.primaries = primaries
        self.nodes: list[RedisServer] = []  # the primaries first, then their replicas
        for i in range(primaries + replicas):
            node = RedisServer(directory / f"node{i}")
            # the cluster bus (port + 10000) must be free too, and on loopback
            while node.port + BUS_OFFSET > 65_535 or not _free(node.port + BUS_OFFSET):
                node = RedisServer(directory / f"node{i}")
            # a replica's full sync at once, not after Redis's default 5 s wait
            node.extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                          "--cluster-config-file", str(node.dir / "nodes.conf"),
                          "--repl-diskless-sync-delay", "0"]
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}"
                                             for n in self.nodes[:self.primaries])

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for n in self.nodes:
            n.start()
        share = SLOTS // self.primaries
        for i, n in enumerate(self.nodes[:self.primaries]):
            last = SLOTS - 1 if i == self.primaries - 1 else (i + 1) * share - 1
            n.client().execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        first = self.nodes[0].client()
        for n in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
        deadline = time.monotonic() + timeout
        self._until(deadline, lambda: all(self._ready(n) for n in self.nodes))
        for primary, replica in zip(self.nodes, self.nodes[self.primaries:], strict=False):
            primary_id = primary.client().execute_command("CLUSTER", "MYID")
            replica.client().execute_command("CLUSTER", "REPLICATE", primary_id)
        self._until(deadline, lambda: all(
            n.client().info("replication").get("master_link_status") == "up"
            for n in self.nodes[self.primaries:]))
        return self

    def _until(self, deadline: float, ready: Any) -> None:
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the Redis Cluster did not come up in time")

    def primary_of(self, key: str) -> RedisServer:
        """The node serving ``key``'s slot now."""
        for n in self.nodes:
            if n.proc is None:
                continue
            try:
                n.client().execute_command("GET", key)
            except Exception:  # MOVED (or down): another node serves it
                continue
            if n.client().info("replication").get("role") == "master":
                return n
        raise LookupError(f"no node serves {key!r}")

    def _ready(self, node: RedisServer) -> bool:
        """Every slot served and every node known, as this node sees it."""
        info = node.client().execute_command("CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text and \
            f"cluster_known_nodes:{len(self.nodes)}\r" in text

    def clients(self) -> list[Any]:
        return [n.client() for n in self.nodes]

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
