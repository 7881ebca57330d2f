"""Broker-wide counters (the metrics adapters read these) and per channel and group
figures (the admin views' and metrics')."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..limits import MAX_LISTED_NAMES
from .group import Group
from .log import ChannelLog


@dataclass
class Counters:
    published: int = 0
    requeued: int = 0  # dead letters moved back: not counted as published
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    expired: int = 0
    dropped: int = 0
    duplicates: int = 0
    lease_expired: int = 0
    channels_expired: int = 0  # removed by expire_idle
    refused: Counter[str] = field(default_factory=Counter)

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = dict(vars(self))
        out["refused"] = dict(self.refused)  # a plain dict, not the Counter
        return out


def channel_stats(log: ChannelLog) -> dict[str, Any]:
    unsettled = sum(len(gc.pending) for gc in log.states)
    return {
        "channel": log.name, "depth": log.count, "first_seq": log.first_seq,
        "next_seq": log.end, "unsettled": unsettled, "published": log.published,
        "requeued": log.requeued, "dropped": log.dropped, "expired": log.expired,
        "readers": [gc.group.key for gc in log.states[:MAX_LISTED_NAMES]],
        "readers_total": len(log.states),
        "expire_idle": log.options.expire_idle, "active_at": log.touched,
        # deleted seqs above first_seq (a live message below pins them), and what the
        # broker holds for them: 16 bytes a run of consecutive ones (core/seq_runs.py)
        "deleted": len(log.gone), "deleted_bytes": log.gone.nbytes(),
    }


def group_stats(grp: Group) -> dict[str, Any]:
    gcs = grp.gcs.values()
    in_flight = sum(len(gc.pending) for gc in gcs)
    return {
        "group": grp.key, "kind": grp.kind,
        "patterns": [p.text for p in grp.patterns[:MAX_LISTED_NAMES]],
        "patterns_total": len(grp.patterns),
        "members": len(grp.members), "channels": len(grp.gcs),
        "unsettled": in_flight,  # the old name of in_flight
        "waiting": sum(gc.waiting()[0] for gc in gcs),
        "in_flight": in_flight,
        "lag": sum(max(0, gc.log.end - gc.cursor) for gc in gcs),
        "delivered": sum(gc.delivered for gc in gcs),
        "acked": sum(gc.acks for gc in gcs),
    }
