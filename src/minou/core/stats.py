"""Broker-wide counters (the metrics adapters read these)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Counters:
    published: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0
    duplicates: int = 0
    lease_expired: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: v for k, v in vars(self).items() if k != "refused"}
        out["refused"] = dict(self.refused)
        return out
