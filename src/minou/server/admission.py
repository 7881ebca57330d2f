"""Admission: one budget of client sockets for both listeners, derived from the process's
file descriptor limit.

Every client socket holds a descriptor, whatever it speaks: native TCP connections,
HTTP connections (requests, idle keep-alive ones) and the WebSockets (``/v1/ws``,
``/v1/stream``) they upgrade to all count against one limit, ``max_connections``
capped by what the descriptor limit leaves once ``FD_RESERVED`` (storage, listeners,
the loop) and ``MAX_REFUSING`` are set aside. The soft descriptor limit is raised to
the hard one at start, so the cap is as high as the system allows, and read again at
each connection (``prlimit --nofile`` may lower it under a running broker).

A socket past the limit is refused at once -- native: a TOO_MANY_CONNECTIONS error
frame; HTTP: a 503 -- counted, logged (rate limited) and closed shortly after. Those
refusals hold descriptors too while they are answered: past ``MAX_REFUSING`` of them a
new socket is dropped without an answer, so the process never runs out.

Sockets are counted per transport, not per protocol object: on a WebSocket upgrade
uvicorn hands the transport to a new protocol, and the HTTP one is never told that
its connection is gone (http_fast wraps the new protocol to report it).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ..errors import TooManyConnections
from ..limits import FD_RESERVED, MAX_REFUSING
from . import oplog

UNLIMITED_DESCRIPTORS = 1 << 20  # what we ask for when the hard limit is "unlimited"
MACOS_OPEN_MAX = 10_240  # macOS refuses a soft limit above this even with no hard limit


def descriptor_limit() -> int:
    """The process's soft RLIMIT_NOFILE now (0: none). Read at each connection: an
    operator may lower it under a running broker (``prlimit --nofile``), and a limit
    counted from the old value would admit sockets accept() can no longer take."""
    try:
        import resource
    except ImportError:
        return 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED_DESCRIPTORS if soft == resource.RLIM_INFINITY else soft


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; (before, after). (0, 0) where
    the platform has no such limit (Windows)."""
    try:
        import resource
    except ImportError:
        return 0, 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_DESCRIPTORS if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft >= target:
        return soft, soft
    for wanted in (target, min(target, MACOS_OPEN_MAX)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return soft, wanted
        except (ValueError, OSError):
            continue
    return soft, soft


class Admission:
    """Counts the client sockets of both listeners and refuses those past the limit.

    Args:
        max_connections: the configured limit, read at each connection (a reload
            changes it).
        count_refusal: called with the reason of each refusal (the metrics counter).
        descriptors: reads the process's descriptor limit now; 0 for none.
    """

    def __init__(self, *, max_connections: Callable[[], int],
                 count_refusal: Callable[[str], None],
                 descriptors: Callable[[], int] = lambda: 0,
                 descriptors_before: int = 0) -> None:
        self.max_connections = max_connections
        self.count_refusal = count_refusal
        self.descriptor_limit = descriptors
        self.descriptors_before = descriptors_before
        self.open: dict[Any, str] = {}  # transport -> "native" | "http" | "resp"
        self.refusing: set[Any] = set()  # transports being refused (an answer, then close)
        self.refused: Counter[str] = Counter()  # by listener
        self.dropped = 0  # refused without an answer (MAX_REFUSING were in flight)

    @property
    def limit(self) -> int:
        """The effective connection limit: max_connections, capped by the descriptors."""
        return self._limit(self.max_connections(), self.descriptor_limit())

    @staticmethod
    def _limit(configured: int, descriptors: int) -> int:
        if descriptors <= 0:
            return configured
        return max(1, min(configured, descriptors - FD_RESERVED - MAX_REFUSING))

    def enter(self, transport: Any, kind: str, peer: Any) -> TooManyConnections | None:
        """Count a new socket of listener ``kind``. None: admitted. Otherwise the error to
        answer with (already counted and logged); the socket is then held as refusing
        until it closes, or aborted here when MAX_REFUSING refusals are in flight
        (``transport.is_closing()`` then says there is no answer to write)."""
        configured, descriptors = self.max_connections(), self.descriptor_limit()
        limit = self._limit(configured, descriptors)
        if len(self.open) < limit:
            self.open[transport] = kind
            return None
        why = f"max_connections = {configured}" if limit == configured else (
            f"max_connections = {configured}, capped to {limit} by the process's "
            f"{descriptors} file descriptors")
        exc = TooManyConnections(
            f"the broker already has {len(self.open)} connections, native, HTTP and "
            f"WebSocket together ({why}); try again later", limit=limit)
        self.refused[kind] += 1
        self.count_refusal(exc.reason)
        oplog.connection_refused({"native": "native", "resp": "Redis protocol"}.get(kind, "HTTP"),
                                 peer,
                                 f"{len(self.open)} connections open ({why})")
        if len(self.refusing) >= MAX_REFUSING:
            self.dropped += 1
            transport.abort()
        else:
            self.refusing.add(transport)
        return exc

    def leave(self, transport: Any) -> None:
        """A socket closed (admitted or refused; calling it twice is harmless)."""
        self.open.pop(transport, None)
        self.refusing.discard(transport)

    def stats(self) -> dict[str, Any]:
        kinds = Counter(self.open.values())
        return {"limit": self.limit, "max_connections": self.max_connections(),
                "descriptors": self.descriptor_limit(),
                "descriptors_before": self.descriptors_before,
                "open": {"native": kinds["native"], "http": kinds["http"],
                         "resp": kinds["resp"]},
                "refused": {"native": self.refused["native"], "http": self.refused["http"],
                            "resp": self.refused["resp"]},
                "refusing": len(self.refusing), "dropped": self.dropped}
