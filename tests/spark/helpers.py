"""Small helpers shared by the Spark tests: unique channels, publishing, reading back."""

from __future__ import annotations

import json
import uuid
from typing import Any


def unique(prefix: str) -> str:
    """An endpoint name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def publish(client: Any, channel: str, n: int, start: int = 0) -> None:
    client.send_many([{"channel": channel, "payload": {"n": i, "ch": channel},
                       "key": f"k{i}", "headers": {"i": str(i)}}
                      for i in range(start, start + n)])


def read_all(client: Any, channel: str) -> list[Any]:
    out: list[Any] = []
    pos = 1
    while True:
        msgs, nxt = client.read(channel, pos, limit=5000)
        out += msgs
        if not msgs or nxt <= pos:
            return out
        pos = nxt


def payloads(client: Any, channel: str) -> list[dict[str, Any]]:
    return [json.loads(m.data) for m in read_all(client, channel)]
