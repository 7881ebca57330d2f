"""Nagios plugin output for a queue: one status line with perfdata.

``OK``/``WARNING``/``CRITICAL``/``UNKNOWN`` with the plugin exit codes 0..3:
warning when the oldest message not yet settled (waiting or in flight) is older
than ``minutes``, critical past twice that. The HTTP route also sends the code as ``X-Nagios-Exit``.
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
    """``stats`` is maintenance.queue_stats output (with ``oldest_age_s``).

    The summary names the two kinds of unsettled messages apart: *waiting* (stored, not
    yet delivered) and *in flight* (delivered, not yet acked), each with its oldest age.
    The perfdata keeps its old labels (``unsettled`` is the in-flight count) and adds
    ``waiting``, ``in_flight`` and their ages."""
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
    in_flight = stats.get("in_flight", unsettled)
    waiting = stats.get("waiting", max(0, stats["depth"] - in_flight))
    waiting_age = stats.get("oldest_waiting_age_s")
    flight_age = stats.get("oldest_in_flight_age_s")
    groups = stats["groups"] if not group else [g for g in stats["groups"] if g["group"] == group]
    lag = sum(g["lag"] for g in groups)
    readers = stats["consumers"] + stats["listeners"]
    summary = (f"{who}: oldest message not yet settled {age:.0f} s old "
               f"(warn > {warn_s:.0f} s, critical > {crit_s:.0f} s); "
               f"{waiting} waiting (oldest {_age(waiting_age)}), "
               f"{in_flight} in flight (oldest {_age(flight_age)}); depth {stats['depth']}, "
               f"lag {lag}, {readers} reader(s) connected")
    perf = (f"oldest_age={age:.3f}s;{warn_s:.0f};{crit_s:.0f};0 depth={stats['depth']};;;0 "
            f"unsettled={unsettled};;;0 lag={lag};;;0 readers={readers};;;0 "
            f"waiting={waiting};;;0 in_flight={in_flight};;;0 "
            f"oldest_waiting_age={waiting_age or 0.0:.3f}s;;;0 "
            f"oldest_in_flight_age={flight_age or 0.0:.3f}s;;;0")
    return NagiosResult(code, f"{LABELS[code]} - {summary} | {perf}")


def _age(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:.0f} s"


def check_federation(link: dict[str, Any], *, minutes: float) -> NagiosResult:
    """A federation link (``Federation.view`` of one link): critical while a direction
    is not carrying (retrying, its last error said), warning when one lags more than
    ``minutes`` behind (critical past twice that)."""
    warn_s, crit_s = minutes * 60, minutes * 120
    code, parts, perf = OK, [], []
    for p in link["pipes"]:
        lag_s, lag_n = float(p["lag_seconds"]), int(p["lag_messages"])
        d = p["direction"]
        if p["state"] == "elsewhere":  # another broker of the cluster runs the links
            parts.append(f"{d} runs on another broker")
        elif p["state"] != "up":
            code = CRITICAL
            parts.append(f"{d} {p['state']}: {p['last_error'] or 'connecting'}")
        else:
            if lag_s >= crit_s:
                code = CRITICAL
            elif lag_s >= warn_s:
                code = max(code, WARNING)
            parts.append(f"{d} up, {lag_n} behind ({_age(lag_s)})")
        perf += [f"{d}_lag_messages={lag_n}", f"{d}_lag_seconds={lag_s:.1f}s;{warn_s:g};"
                 f"{crit_s:g}", f"{d}_forwarded={p['forwarded']}c"]
    return NagiosResult(code, f"{LABELS[code]} - federation {link['name']}: "
                        f"{'; '.join(parts) or 'no direction'} | {' '.join(perf)}")
