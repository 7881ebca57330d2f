"""The lines an operator reads: refused logins, pending clients, failed TLS handshakes,
connections refused over the limit, HTTP requests too slow to arrive, a client that
used up its share of something all clients draw on.

Each names what happened, the client id and the peer address, never a token or a key.
A client can cause these at will, so they are rate limited per kind: a flood of bad
logins costs a few lines and a count of the rest, not a full disk.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

from ..errors import NotAuthenticated, PendingApproval
from ..limits import SECURITY_LOG_LINES, SECURITY_LOG_WINDOW_S

log = logging.getLogger("minou.security")


class LineBudget:
    """At most ``lines`` lines per ``window_s`` seconds for one kind of line, then one
    line counting the rest (``summary(suppressed, seconds)``, at the window's end)."""

    def __init__(self, lines: int, window_s: float,
                 summary: Callable[[int, float], None]) -> None:
        self.max_lines, self.window_s, self.summary = lines, window_s, summary
        self.window_start = 0.0
        self.lines = 0
        self.suppressed = 0

    def allow(self, now: float) -> bool:
        if now - self.window_start >= self.window_s:
            if self.suppressed:
                self.summary(self.suppressed, now - self.window_start)
            self.window_start, self.lines, self.suppressed = now, 0, 0
        if self.lines < self.max_lines:
            self.lines += 1
            return True
        self.suppressed += 1
        return False


def _summary(kind: str) -> Callable[[int, float], None]:
    def summary(suppressed: int, seconds: float) -> None:
        log.warning("%d more %s in the last %.0f s (not logged one by one; see /metrics)",
                    suppressed, kind, seconds)
    return summary


_limits: dict[str, LineBudget] = {}


def _allow(kind: str) -> bool:
    limiter = _limits.get(kind)
    if limiter is None:
        limiter = _limits[kind] = LineBudget(SECURITY_LOG_LINES, SECURITY_LOG_WINDOW_S,
                                                _summary(kind))
    return limiter.allow(time.monotonic())


def refused(exc: NotAuthenticated, client_id: str | None, peer: Any, via: str) -> None:
    """A connection or request whose identity was refused (or that waits for approval)."""
    why = str(exc.detail.get("why", "token"))
    who = repr(client_id) if client_id else "an unnamed client"
    if isinstance(exc, PendingApproval):
        if _allow("pending clients"):
            log.info("client %s from %s (%s) waits for approval (key %s): minou clients "
                     "approve %s", who, _peer(peer), via, exc.detail.get("fingerprint", "?"),
                     client_id)
        return
    if why == "token_required":
        return  # the normal challenge of a first HELLO, not a failure
    if _allow("authentication failures"):
        log.warning("authentication failed for %s from %s (%s): %s [%s]", who, _peer(peer),
                    via, exc.message, why)


def share_used(client_id: str, what: str, limit: int) -> None:
    """A client refused because it holds its share of something every client draws on
    (logged once until it holds less: its own retries cost no line)."""
    if _allow("clients at their share"):
        log.warning("client %r made %s, its share (the limit is %d): more are refused "
                    "until it frees some, other clients go on", client_id, what, limit)


def client_bound(client_id: str, what: str, bound: str, limit: int) -> None:
    """A request refused because its client already has ``limit`` of ``what``: an
    operator sees who runs into a per-client bound (and which, to raise or to ask why)."""
    if _allow("requests past a per-client bound"):
        log.warning("client %r refused: it has %d %s, the limit (%s)", client_id, limit,
                    what, bound)


def checkpoint_failed(exc: BaseException) -> None:
    """A WAL checkpoint that failed (out of descriptors, say): the next tick tries again."""
    if _allow("checkpoint failures"):
        log.warning("WAL checkpoint failed, tried again at the next tick: %s", exc)


def connection_refused(listener: str, peer: Any, reason: str) -> None:
    """A new connection over the connection limit (see admission.py)."""
    if _allow("connections refused"):
        log.warning("%s connection from %s refused: %s", listener, _peer(peer), reason)


def request_too_slow(peer: Any, seconds: float) -> None:
    """An HTTP request whose headers did not arrive in time (slowloris)."""
    if _allow("slow HTTP requests cut"):
        log.warning("HTTP connection from %s cut: request headers not complete within %g s",
                    _peer(peer), seconds)


def input_too_slow(peer: Any, client_id: str | None, what: str, size: int,
                   seconds: float) -> None:
    """A frame or body over INPUT_SMALL_BYTES that did not arrive in the time its
    reservation gave it (server/input_budget.py)."""
    if _allow("slow frames and bodies cut"):
        who = repr(client_id) if client_id else "an unnamed client"
        log.warning("connection of %s from %s cut: a %s of %d bytes not complete within "
                    "%.0f s (INPUT_MIN_RATE)", who, _peer(peer), what, size, seconds)


def input_budget_full(peer: Any, client_id: str | None, size: int, stats: dict[str, int]) -> None:
    """A frame or body that must wait for room in the budget of unfinished input."""
    if _allow("frames and bodies waiting for room"):
        who = repr(client_id) if client_id else "an unnamed client"
        log.warning("connection of %s from %s waits to read a %d-byte frame or body: %d "
                    "of %d bytes of unfinished input reserved (%d by one client at most), "
                    "%d waiting", who, _peer(peer), size, stats["reserved_bytes"],
                    stats["limit_bytes"], stats["per_client_bytes"], stats["waiting"])


def answer_too_large(peer: Any, client_id: str | None, size: int, limit: int) -> None:
    """A native answer that would pass the frame limit, refused instead of sent."""
    if _allow("answers too large"):
        who = repr(client_id) if client_id else "an unnamed client"
        log.warning("an answer to %s from %s would be a frame of %d bytes, over the %d "
                    "byte limit: refused with frame_too_large (the client asks for less)",
                    who, _peer(peer), size, limit)


def http_answer_unread(peer: Any, size: int, silent: float, unsent: int, limit: int) -> None:
    """An HTTP socket cut for holding an answer its client does not read."""
    if _allow("HTTP answers unread"):
        log.warning("HTTP connection from %s cut: %d bytes of answers unread, none read for "
                    "%.1f s (HTTP answers unread over all connections: %d bytes, limit %d; "
                    "a connection reading nothing is cut after slow_consumer_seconds)",
                    _peer(peer), size, silent, unsent, limit)


def request_head_too_large(peer: Any, limit: int) -> None:
    """An HTTP request whose line and headers went past the limit."""
    if _allow("HTTP request heads too large"):
        log.warning("HTTP connection from %s cut: request line and headers over %d bytes",
                    _peer(peer), limit)


def request_pipeline_full(peer: Any, limit: int) -> None:
    """An HTTP connection that pipelined more requests than are queued."""
    if _allow("HTTP pipelines too long"):
        log.warning("HTTP connection from %s closed after its answers: over %d requests "
                    "pipelined (MAX_HTTP_PIPELINE) while it read none of them", _peer(peer),
                    limit)


def connection_dead(peer: Any, client_id: str | None, silent: float, interval: float,
                    held: int) -> None:
    """A connection that missed its heartbeats: the peer (or the path to it) is gone."""
    if _allow("dead connections cut"):
        who = repr(client_id) if client_id else "an unnamed client"
        log.warning("connection of %s from %s is dead: nothing heard for %.1f s (heartbeat "
                    "every %g s); cut, %d unsettled deliveries returned to their queues",
                    who, _peer(peer), silent, interval, held)


def tls_failed(exc: BaseException, listener: str) -> None:
    if not _allow("TLS handshake failures"):
        return
    reason = getattr(exc, "reason", None) or type(exc).__name__
    hint = ""
    if reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"):
        hint = " (the client spoke plain text: it should use minous:// or https://)"
    elif reason in ("TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
                    "SSLV3_ALERT_CERTIFICATE_UNKNOWN"):
        hint = " (the client does not trust this certificate: it should pin the fingerprint)"
    log.warning("TLS handshake failed on the %s listener: %s%s", listener, reason, hint)


def peer_text(peer: Any, via: str = "") -> str:
    """``host:port`` (``[v6]:port``) of a socket's peer, as operators grep for it."""
    if isinstance(peer, tuple | list) and len(peer) >= 2:
        host = f"[{peer[0]}]" if ":" in str(peer[0]) else peer[0]
        text = f"{host}:{peer[1]}"
    else:
        text = str(peer) if peer else "?"
    return f"{via}:{text}" if via else text


_peer = peer_text


def peer_host(peer: str) -> str:
    """The host part of what ``peer_text`` made ("ws:1.2.3.4:5" -> "1.2.3.4")."""
    host = peer.removeprefix("ws:").rpartition(":")[0]
    return host.strip("[]")


def watch_handshakes(ctx: ssl.SSLContext, listener: str, count: Any) -> ssl.SSLContext:
    """Make ``ctx`` report failed server handshakes: asyncio and uvloop drop them
    silently (an OSError is only logged in debug mode). ``count()`` is called for each."""

    class WatchedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except (ssl.SSLError, OSError) as exc:
                count()
                tls_failed(exc, listener)
                raise

    ctx.sslobject_class = WatchedSSLObject
    return ctx
