"""A real Redis Cluster for tests: three primaries (``redis-server --cluster-enabled``)
on free loopback ports, the 16,384 slots split between them, AOF ``always``; stopped
(only they) when done."""

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
    def __init__(self, directory: Path, primaries: int = 3) -> None:
        self.dir = directory
        self.nodes: list[RedisServer] = []
        for i in range(primaries):
            node = RedisServer(directory / f"node{i}")
            # the cluster bus (port + 10000) must be free too, and on loopback
            while node.port + BUS_OFFSET > 65_535 or not _free(node.port + BUS_OFFSET):
                node = RedisServer(directory / f"node{i}")
            node.extra = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                          "--cluster-config-file", str(node.dir / "nodes.conf")]
            self.nodes.append(node)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self, timeout: float = 20.0) -> RedisCluster:
        for n in self.nodes:
            n.start()
        share = SLOTS // len(self.nodes)
        for i, n in enumerate(self.nodes):
            last = SLOTS - 1 if i == len(self.nodes) - 1 else (i + 1) * share - 1
            n.client().execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
        first = self.nodes[0].client()
        for n in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", n.port)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._ready(n) for n in self.nodes):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok in time")

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
