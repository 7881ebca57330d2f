"""Admin operations reachable over the native protocol (``ADMIN`` frames)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..errors import BadRequest

if TYPE_CHECKING:
    from .app import BrokerServer


def run_admin(server: BrokerServer, op: str, args: dict[str, Any]) -> Any:
    core = server.core
    now = time.time()
    if op == "status":
        return server.status()
    if op == "list":
        prefix = str(args.get("channel") or "")
        return {
            "channels": [
                core.channel_stats(log, now)
                for name, log in sorted(core.channels.items())
                if name.startswith(prefix)
            ],
            "groups": [core.group_stats(g, now) for _, g in sorted(core.groups.items())],
        }
    raise BadRequest(f"unknown admin operation {op!r} (known: status, list)")
