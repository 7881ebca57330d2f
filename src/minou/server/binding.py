"""Listening sockets, bound before anything is written to the data directory.

Binding first means a busy port fails the start before storage is opened: no empty
``minou.db`` is left behind, and the error names the port and the option to change.
"""

from __future__ import annotations

import errno
import socket

from ..errors import StartupError


def bind_listener(host: str, port: int, what: str, option: str) -> socket.socket:
    """A listening, non-blocking TCP socket on ``host:port`` (0 = any free port)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {host!r}: {exc.strerror} (check --host)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # both families
        sock.bind(address)
        sock.listen(1024)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise StartupError(_why(exc, host, port, what, option)) from None
    return sock


def _why(exc: OSError, host: str, port: int, what: str, option: str) -> str:
    other = "--http-port N" if option == "--port" else "--port N"
    pick = f"pick others with {option} N (and {other}); 0 picks any free port"
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} ({what}) is already in use by another program: "
                f"stop it, or {pick}")
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} ({what}) needs privileges this user lacks: {pick}"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine ({what}): check --host"
    return f"cannot listen on {host}:{port} ({what}): {exc.strerror or exc}"
