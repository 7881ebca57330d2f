"""Ports for servers a test starts on a port it picks (a broker restarted on its port,
redis-server, the Spark daemons): below the kernel's ephemeral range (32768-60999).

A port the kernel handed out for ``bind(("127.0.0.1", 0))`` and that was closed again is
back in the ephemeral range, where every outgoing connection's local port and every
other process's ``bind(0)`` come from: in the seconds before the server binds it, any
of them may take it. Seen in the suite: a Spark master's web UI moved to the next port
(the test asked the old one for 90 s), a JVM's socket for its Python worker read an
HTTP request's "GET " as a 1.2 GB length (Java heap space), a broker restarted after a
kill -9 found its port taken by a client's connection.
"""

from __future__ import annotations

import itertools
import os
import socket


def _port_slice() -> tuple[int, int]:
    """This test process's own share of 21000-31999: xdist workers counting through one
    shared range from random starts walked into each other's ports (a broker then found
    its port taken by another worker's broker)."""
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % workers if worker.isdigit() else 0
    size = 11000 // workers
    return 21000 + index * size, size


_PORT_BASE, _PORT_SPAN = _port_slice()
_RESTART_PORTS = itertools.count(int.from_bytes(os.urandom(2), "big") % _PORT_SPAN)


def restartable_port() -> int:
    """A free loopback port below the kernel's ephemeral range (32768-60999): a broker
    restarted on it after a kill -9 never finds it taken by some client's outgoing
    connection, which port 0 (an ephemeral port) risks on a busy machine."""
    for _ in range(2000):
        port = _PORT_BASE + next(_RESTART_PORTS) % _PORT_SPAN
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORT_BASE}-{_PORT_BASE + _PORT_SPAN - 1}")
