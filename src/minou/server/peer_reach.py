"""Whether another broker of the cluster reaches Redis now: asked over its ``/health``.

A broker whose renewals of its record have failed past its lease cannot tell, from
Redis alone, whether it is the one cut off (a partition: the others took or will take
its queues, so it stops and its clients go to them) or Redis is out of reach for every
broker (paused, restarting, its host down: nobody can take anything, and a cluster
whose brokers all stopped would serve nothing once Redis is back). The other brokers
can tell: each says in its ``/health`` how long ago its last record renewal that
landed was sent (``redis_seen_s``); a live broker renews every third of the lease.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from ..tls import TlsPinMismatch, check_pin, client_context

ASK_TIMEOUT_S = 1.0  # a paused or dead broker answers nothing: it reaches nothing either
MAX_HEALTH_BYTES = 64 * 1024


async def reaches_redis(record: dict[str, str], within: float,
                        timeout: float = ASK_TIMEOUT_S) -> bool:
    """Whether the broker of ``record`` (its record in Redis) renewed its own record
    within ``within`` seconds, as its ``/health`` says. False if it cannot be asked."""
    try:
        return await asyncio.wait_for(_ask(record, within), timeout)
    except (OSError, TimeoutError, TlsPinMismatch, ValueError, json.JSONDecodeError):
        return False


async def _ask(record: dict[str, str], within: float) -> bool:
    parts = urlsplit(record.get("http", ""))
    if not parts.hostname or not parts.port:
        return False
    pin = record.get("tls_fingerprint") or ""
    if parts.scheme == "https" and not pin:
        return False
    tls = client_context(fingerprint=pin) if parts.scheme == "https" else None
    reader, writer = await asyncio.open_connection(
        parts.hostname, parts.port, ssl=tls, server_hostname=parts.hostname if tls else None)
    try:
        if tls is not None:
            check_pin(writer.get_extra_info("ssl_object"), pin)
        writer.write(f"GET /health HTTP/1.0\r\nHost: {parts.hostname}\r\n\r\n".encode())
        reply = await reader.read(MAX_HEALTH_BYTES)
    finally:
        writer.close()
    _, _, body = reply.partition(b"\r\n\r\n")
    seen = json.loads(body or b"{}").get("redis_seen_s")
    return isinstance(seen, int | float) and seen < within
