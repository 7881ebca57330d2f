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

At the limit, a socket that is neither logged in nor busy gives its place to the new one
instead of the new one being refused, oldest first, once it has been so for
``EVICT_MIN_IDLE_S``: a native connection that has not said HELLO, an HTTP connection
between requests or still sending a request's headers (nginx closes idle keep-alive
connections when it runs out of them the same way). Strangers who connect and say
nothing, or reconnect each time their deadline cuts them, can then no longer keep
clients out; a client's own logged-in connections are bounded per client instead
(``max_connections_per_client``).

Sockets are counted per transport, not per protocol object: on a WebSocket upgrade
uvicorn hands the transport to a new protocol, and the HTTP one is never told that
its connection is gone (http_fast wraps the new protocol to report it).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from ..errors import TooManyConnections
from ..limits import EVICT_MIN_IDLE_S, FD_RESERVED, MAX_REFUSING
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
                 descriptors_before: int = 0,
                 per_client: Callable[[], int] = lambda: 1 << 30,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_connections = max_connections
        self.per_client = per_client
        self.clock = clock
        # Sockets that may give their place at the limit: transport -> (since, close),
        # oldest first (``idle``/``busy`` keep the order by moving them).
        self.evictable: OrderedDict[Any, tuple[float, Callable[[], None]]] = OrderedDict()
        self.evicted = 0
        # Authenticated connections by client (admins and brokers' links not counted).
        self.by_client: Counter[str] = Counter()
        self.client_of: dict[Any, str] = {}
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
        if len(self.open) < limit or self._evict_one():
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

    def idle(self, transport: Any, close: Callable[[], None]) -> None:
        """``transport`` is not logged in, or between requests: at the limit, once so for
        EVICT_MIN_IDLE_S, ``close`` is called to give its place to a new socket."""
        if transport in self.open:
            self.evictable.pop(transport, None)
            self.evictable[transport] = (self.clock(), close)

    def busy(self, transport: Any) -> None:
        """``transport`` logged in, or is being answered: it keeps its place."""
        self.evictable.pop(transport, None)

    def _evict_one(self) -> bool:
        if not self.evictable:
            return False
        transport, (since, close) = next(iter(self.evictable.items()))
        if self.clock() - since < EVICT_MIN_IDLE_S:
            return False  # the oldest is too young: so are the others
        del self.evictable[transport]
        self.open.pop(transport, None)  # its place is the new socket's from now
        self.evicted += 1
        close()
        return True

    def enter_client(self, conn: Any, identity: Any, peer: Any) -> None:
        """``conn`` is authenticated as ``identity``: count it against its client's share
        (``max_connections_per_client``), or raise TooManyConnections (counted, logged)
        when the client has that many already. Admins and brokers' links pass."""
        if identity.admin or identity.method == "link":
            return
        client, limit = identity.client_id, self.per_client()
        held = self.by_client[client]
        if held >= limit:
            exc = TooManyConnections(
                f"client {client!r} already has {held} connections (native, WebSocket and "
                f"Redis protocol together; max_connections_per_client = {limit}); close "
                f"some, or ask an operator to raise it", limit=limit, client=client)
            self.refused["client"] += 1
            self.count_refusal(exc.reason)
            oplog.connection_refused("client", peer,
                                     f"client {client!r} has {held} connections "
                                     f"(max_connections_per_client = {limit})")
            raise exc
        self.by_client[client] = held + 1
        self.client_of[conn] = client

    def leave_client(self, conn: Any) -> None:
        """An authenticated connection ended (calling it twice is harmless)."""
        client = self.client_of.pop(conn, None)
        if client is not None:
            held = self.by_client[client] - 1
            if held:
                self.by_client[client] = held
            else:
                del self.by_client[client]

    def leave(self, transport: Any) -> None:
        """A socket closed (admitted or refused; calling it twice is harmless)."""
        self.open.pop(transport, None)
        self.refusing.discard(transport)
        self.evictable.pop(transport, None)

    def stats(self) -> dict[str, Any]:
        kinds = Counter(self.open.values())
        return {"limit": self.limit, "max_connections": self.max_connections(),
                "descriptors": self.descriptor_limit(),
                "descriptors_before": self.descriptors_before,
                "open": {"native": kinds["native"], "http": kinds["http"],
                         "resp": kinds["resp"]},
                "refused": {"native": self.refused["native"], "http": self.refused["http"],
                            "resp": self.refused["resp"], "client": self.refused["client"]},
                "per_client": self.per_client(),
                "busiest_client": max(self.by_client.values(), default=0),
                "refusing": len(self.refusing), "dropped": self.dropped,
                "evictable": len(self.evictable), "evicted": self.evicted}
