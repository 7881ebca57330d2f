"""Nagios plugin output for a queue: one status line with perfdata.

``OK``/``WARNING``/``CRITICAL``/``UNKNOWN`` with the plugin exit codes 0..3:
warning when the oldest unsettled message is older than ``minutes``, critical
past twice that. The HTTP route also sends the code as ``X-Nagios-Exit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OK, WARNING, CRITICAL, UNKNOWN = 0, 1, 2, 3
LABELS = {OK: "OK", WARNING: "WARNING", CRITICAL: "CRITICAL", UNKNOWN: "UNKNOWN"}


@dataclass(frozen=True)
class NagiosResult:
    code: int
    text: str

    @property
    def label(self) -> str:
        return LABELS[self.code]


def unknown(message: str) -> NagiosResult:
    return NagiosResult(UNKNOWN, f"UNKNOWN - {message}")


def check_queue(stats: dict[str, Any], *, minutes: float, group: str | None) -> NagiosResult:
    """``stats`` is maintenance.queue_stats output (with ``oldest_age_s``)."""
    warn_s, crit_s = minutes * 60, minutes * 120
    age = stats.get("oldest_age_s") or 0.0
    who = f"{stats['queue']}" + (f" for {group}" if group else "")
    if age > crit_s:
        code = CRITICAL
    elif age > warn_s:
        code = WARNING
    else:
        code = OK
    unsettled = stats["unsettled"]
    groups = stats["groups"] if not group else [g for g in stats["groups"] if g["group"] == group]
    lag = sum(g["lag"] for g in groups)
    readers = stats["consumers"] + stats["listeners"]
    summary = (f"{who}: oldest unsettled message {age:.0f} s old "
               f"(warn > {warn_s:.0f} s, critical > {crit_s:.0f} s), depth {stats['depth']}, "
               f"unsettled {unsettled}, lag {lag}, {readers} reader(s) connected")
    perf = (f"oldest_age={age:.3f}s;{warn_s:.0f};{crit_s:.0f};0 depth={stats['depth']};;;0 "
            f"unsettled={unsettled};;;0 lag={lag};;;0 readers={readers};;;0")
    return NagiosResult(code, f"{LABELS[code]} - {summary} | {perf}")
