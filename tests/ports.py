"""Ports for servers a test starts that cannot bind port 0 themselves (redis-server, the
Spark daemons): picked below the kernel's ephemeral range.

A port the kernel handed out for ``bind(("127.0.0.1", 0))`` and that was closed again is
back in the ephemeral range, where every outgoing connection's local port and every
other process's ``bind(0)`` come from: in the seconds before the server binds it, any of
them may take it. Seen in the suite: a Spark master's web UI moved to the next port
(the test asked the old one for 90 s), and a JVM's socket for its Python worker read an
HTTP request's "GET " as a 1.2 GB length (Java heap space). Below that range only
another test's pick can clash, and picks are random and checked.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10_000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


_handed_out: set[int] = set()


def spare_port() -> int:
    """A loopback port free now, outside the ephemeral range, not handed out before by
    this process."""
    high = _ephemeral_low()
    if high - LOWEST < 1_000:  # an unusual range: fall back on the kernel's pick
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    while True:
        port = random.randrange(LOWEST, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
