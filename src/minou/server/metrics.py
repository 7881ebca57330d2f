"""Prometheus metrics for ``GET /metrics`` and ``GET /statistics``.

Nothing here is updated per message through prometheus_client objects: the
broker keeps plain counters (``core.stats.Counters``) and per-channel stats,
and one custom collector turns a ``snapshot()`` of them into metric families
at scrape time. Only the latency distributions are fed from hot paths, through
the lock-free :class:`Histogram` below (everything runs on one event loop).

Two families of names are exposed:

* ``kitten_mq_*``: the names of the reference broker kitten-mq, byte for byte,
  so existing dashboards keep working. Its counters end in ``_count``, which
  prometheus_client cannot emit as a ``counter`` (it forces ``_total``), so
  they are exposed ``untyped``; PromQL's ``rate()`` works on them all the same.
* ``minou_*``: minou's own, following Prometheus naming conventions.

A kitten "queue" is ``endpoint/version``: per-channel stats are summed over
``endpoint/version/<id>``; dead-letter channels ``_dead/endpoint/version/<id>``
form their own queue ``_dead/endpoint/version``.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from ..core.maintenance import queue_of
from .rate_history import RateHistory

__all__ = [
    "ACK_LATENCY_BUCKETS",
    "COMMIT_DURATION_BUCKETS",
    "DELIVERY_LATENCY_BUCKETS",
    "PUBLISH_LATENCY_BUCKETS",
    "QUEUE_RATES",
    "Histogram",
    "Metrics",
    "RateTracker",
    "queue_of",
]

# A group commit is an fsync plus a few inserts: 0.1 ms on fast NVMe, up to ~1 s
# on a struggling disk.
COMMIT_DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)
# Publish -> confirm includes waiting for the commit, so it starts where commits start
# and reaches a few seconds for a broker under back-pressure.
PUBLISH_LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)
# A message may wait for a consumer for a long time (consumer down, backlog), so
# delivery latency spans milliseconds to an hour.
DELIVERY_LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)
# Delivered -> acked is the consumer's processing time, bounded in practice by the lease.
ACK_LATENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
)


class Histogram:
    """A cheap cumulative-on-read histogram for the broker's hot paths.

    ``observe`` is a bisect and two additions (``observe_many`` the same for a list, in
    C); cumulating happens only at scrape time. No locks: the broker updates and
    scrapes from the same event loop.
    """

    __slots__ = ("_bounds", "_counts", "_les", "count", "sum")

    def __init__(self, buckets: Sequence[float]) -> None:
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] == math.inf:
            bounds.pop()  # "+Inf" is always added; accept it being listed too
        if not bounds:
            raise ValueError("a histogram needs at least one finite bucket bound")
        if any(math.isnan(b) or math.isinf(b) for b in bounds):
            raise ValueError(f"bucket bounds must be finite numbers, got {list(buckets)!r}")
        if any(a >= b for a, b in pairwise(bounds)):
            raise ValueError(f"bucket bounds must be strictly increasing, got {list(buckets)!r}")
        self._bounds: tuple[float, ...] = tuple(bounds)
        # Formatted once, the way prometheus_client formats its own "le" labels.
        self._les: tuple[str, ...] = (*(floatToGoString(b) for b in bounds), "+Inf")
        # Per-bucket (not cumulative) counts; the last slot is the +Inf overflow.
        self._counts: list[int] = [0] * (len(bounds) + 1)
        self.count: int = 0
        self.sum: float = 0.0

    def observe(self, value: float) -> None:
        if value != value:  # NaN would poison the sum forever
            return
        if value < 0.0:
            # Latencies come from wall-clock differences; a clock step back must not
            # make the sum go negative (Prometheus assumes it only grows).
            value = 0.0
        # bisect_left: a value equal to a bound belongs to that bucket (le = "<=").
        self._counts[bisect_left(self._bounds, value)] += 1
        self.count += 1
        self.sum += value

    def observe_many(self, values: list[float]) -> None:
        """``observe`` each of ``values``: the hot paths hand over a pump's deliveries or
        an ack frame's latencies at once (the bisecting and counting run in C: a
        method call per message cost ~15 % of the broker core's deliver+ack)."""
        if len(values) < 4:
            for value in values:
                self.observe(value)
            return
        total = sum(values)
        if total != total or min(values) < 0.0:  # a NaN, or a clock stepped back: rare
            values = [v if v > 0.0 else 0.0 for v in values if v == v]
            total = sum(values)
        counts = self._counts
        for index, n in Counter(map(partial(bisect_left, self._bounds), values)).items():
            counts[index] += n
        self.count += len(values)
        self.sum += total

    def observe_since(self, now: float, times: list[float]) -> None:
        """``observe(now - t)`` for each of ``times``. The hot paths' times come in runs
        (a pump's deliveries share their time, a publish frame's messages theirs), so
        each distinct time is bisected once, with its count: ~45 ns a value where
        ``observe_many`` of the differences took ~170. Times mostly distinct (a slow
        flow, where the cost does not matter) go the plain way."""
        if len(times) < 8:
            for t in times:
                self.observe(now - t)
            return
        distinct = Counter(times)
        if len(distinct) > len(times) >> 2:
            self.observe_many([now - t for t in times])
            return
        bounds, counts = self._bounds, self._counts
        seen, total = 0, 0.0
        for t, n in distinct.items():
            value = now - t
            if value != value:  # a NaN (each is a key of its own)
                continue
            if value < 0.0:  # a clock step back: as ``observe``
                value = 0.0
            counts[bisect_left(bounds, value)] += n
            seen += n
            total += value * n
        self.count += seen
        self.sum += total

    def snapshot(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative ``[(le, count), ..., ("+Inf", total)]`` and the sum."""
        out: list[tuple[str, float]] = []
        running = 0
        for le, n in zip(self._les, self._counts, strict=True):
            running += n
            out.append((le, running))
        return out, self.sum


# What each queue's tuple given to RateTracker.sample holds, in order.
QUEUE_RATES = ("published", "delivered", "acked", "schema_refused")


class RateTracker:
    """Per-second averages over a sliding window, for the ``*_per_seconds_average`` gauges.

    The broker's once-a-second ticker calls :meth:`sample` with a monotonic clock, its
    current counters and each queue's totals (a tuple per queue: ``QUEUE_RATES``); a
    scrape reads :meth:`rate` and :meth:`queue_rates`. Nothing is computed per message.
    Each sample also goes to ``history`` when there is one (the dashboard's last
    minutes, see rate_history).
    """

    def __init__(self, window_s: float = 60.0, *, history: RateHistory | None = None
                 ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be positive, got {window_s!r}")
        self.window_s = float(window_s)
        # Each sample keeps only what changed since the one before it (None: gone): a copy
        # of every counter per sample held ~2 GB over the window at 100,000 queues.
        # ``_first`` is every counter as of the oldest sample kept, ``_last`` as of the
        # newest; the same for the queues' tuples in ``_first_q``/``_last_q``.
        self._samples: deque[tuple[float, dict[str, float | None],
                                   dict[str, tuple[float, ...] | None]]] = deque()
        self._first: dict[str, float] = {}
        self._last: dict[str, float] = {}
        self._first_q: dict[str, tuple[float, ...]] = {}
        self._last_q: Mapping[str, tuple[float, ...]] = {}
        # A queue that came after the window's first sample: the time of the sample just
        # before it came, when its counters (they start at 0 with the queue) were 0.
        self._born: dict[str, float] = {}
        self.history = history

    def sample(self, now: float, counters: Mapping[str, float],
               queues: Mapping[str, tuple[float, ...]] | None = None,
               changed_queues: Mapping[str, tuple[float, ...]] | None = None) -> None:
        """``counters``: the broker's own (non-numbers skipped, so Counters.as_dict()
        with its nested "refused" can be passed; copied). ``queues``: a tuple per queue,
        kept as given (no copy: at 100,000 queues a copy and flat ``queue|name`` keys
        were most of the broker's CPU), so pass a fresh mapping each time.
        ``changed_queues``: those of ``queues`` that differ from :meth:`latest_queues`,
        when the caller found them already (the broker does, a slice at a time)."""
        values = {
            k: float(v)
            for k, v in counters.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        queues = {} if queues is None else queues
        last, last_q = self._last, self._last_q
        changed: dict[str, float | None] = {k: v for k, v in values.items()
                                            if last.get(k) != v}
        changed.update((k, None) for k in last.keys() - values.keys())
        changed_q: dict[str, tuple[float, ...] | None] = (
            {q: t for q, t in queues.items() if last_q.get(q) != t}
            if changed_queues is None else dict(changed_queues))
        came = sum(1 for q in changed_q if q not in last_q)
        if len(queues) - came != len(last_q):  # some queue went: find which (~8 ms)
            changed_q.update((q, None) for q in last_q.keys() - queues.keys())
        self._last, self._last_q = values, queues
        if not self._samples:
            self._first, self._first_q = dict(values), dict(queues)
        else:
            before = self._samples[-1][0]
            for q, totals in changed_q.items():
                if totals is None:
                    self._born.pop(q, None)
                elif q not in last_q:
                    self._born[q] = before
        self._samples.append((now, changed, changed_q))
        horizon = now - self.window_s
        while len(self._samples) > 1 and self._samples[0][0] < horizon:
            self._samples.popleft()
            _, changed, changed_q = self._samples[0]
            _advance(self._first, changed)
            _advance(self._first_q, changed_q)
            for q in changed_q:
                self._born.pop(q, None)  # the window starts with it now
        if self.history is not None:
            self.history.sample(now, values, queues)

    def latest_queues(self) -> Mapping[str, tuple[float, ...]]:
        """Each queue's tuple as of the newest sample."""
        return self._last_q

    def _elapsed(self) -> float:
        return self._samples[-1][0] - self._samples[0][0] if len(self._samples) > 1 else 0.0

    def rate(self, name: str) -> float:
        """(latest - oldest) / elapsed over the window; 0.0 until there are two samples."""
        elapsed = self._elapsed()
        first, last = self._first.get(name), self._last.get(name)
        if elapsed <= 0 or first is None or last is None:
            return 0.0
        return (last - first) / elapsed

    def queue_rates(self, queue: str) -> tuple[float, ...]:
        """A queue's rates, one per element of its tuple (as :meth:`rate`); for a queue
        that came within the window, since it came (from 0); () for one not there now."""
        elapsed = self._elapsed()
        first, last = self._first_q.get(queue), self._last_q.get(queue)
        if last is None or elapsed <= 0:
            return ()
        if first is None:
            born = self._born.get(queue)
            if born is None:
                return ()
            elapsed = self._samples[-1][0] - born
            first = (0,) * len(last)
        return tuple((b - a) / elapsed for a, b in zip(first, last, strict=True))


def _advance(first: dict[str, Any], changed: Mapping[str, Any]) -> None:
    """The oldest sample kept is now the next one: ``first`` takes its changes."""
    for key, value in changed.items():
        if value is None:
            first.pop(key, None)
        else:
            first[key] = value


@dataclass
class _Collecting:
    """What ``generate_latest`` takes: something to ``collect()`` from."""

    collect: Callable[[], Iterator[Metric]]


@dataclass
class _QueueStats:
    published: float = 0
    dropped: float = 0
    expired: float = 0
    depth: float = 0
    unsettled: float = 0
    oldest_age_s: float = 0.0


def _aggregate(channels: Iterable[Mapping[str, Any]]) -> dict[str, _QueueStats]:
    queues: dict[str, _QueueStats] = {}
    for ch in channels:
        q = queues.setdefault(queue_of(str(ch.get("channel", ""))), _QueueStats())
        q.published += ch.get("published", 0) or 0
        q.dropped += ch.get("dropped", 0) or 0
        q.expired += ch.get("expired", 0) or 0
        q.depth += ch.get("depth", 0) or 0
        q.unsettled += ch.get("unsettled", 0) or 0
        # The queue's oldest message is the oldest over its channels.
        q.oldest_age_s = max(q.oldest_age_s, float(ch.get("oldest_age_s", 0.0) or 0.0))
    return queues


# (snapshot counter key, minou counter name without "_total", help)
_MINOU_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("published", "minou_messages_published", "Messages published and stored."),
    ("delivered", "minou_messages_delivered", "Messages delivered to clients."),
    ("redelivered", "minou_messages_redelivered", "Messages delivered again after a nack "
     "or an expired lease."),
    ("acked", "minou_messages_acked", "Messages acknowledged by consumers."),
    ("nacked", "minou_messages_nacked", "Messages negatively acknowledged by consumers."),
    ("dead_lettered", "minou_messages_dead_lettered", "Messages moved to a dead-letter channel."),
    ("requeued", "minou_messages_requeued", "Dead letters moved back to their channel (not "
     "counted in published)."),
    ("expired", "minou_messages_expired", "Messages expired by their TTL."),
    ("dropped", "minou_messages_dropped", "Messages dropped (queue limits)."),
    ("duplicates", "minou_messages_duplicate", "Publishes recognised as duplicates and not "
     "stored again."),
    ("lease_expired", "minou_leases_expired", "Delivery leases that expired before a settle."),
    ("channels_expired", "minou_channels_expired", "Channels removed by idle expiry "
     "(expire_idle), with their messages."),
)


def _federation_metrics(pipes: Any) -> Iterator[Metric]:
    """One series per federation link and direction (docs/federation.md)."""
    labels = ["link", "direction"]
    families = {
        "up": GaugeMetricFamily("minou_federation_up", "1 while the link's direction is "
                                "connected to both brokers and carrying.", labels=labels),
        "forwarded": CounterMetricFamily("minou_federation_forwarded", "Messages the link "
                                         "carried into the destination (since the start).",
                                         labels=labels),
        "lag_messages": GaugeMetricFamily("minou_federation_lag_messages", "Messages on the "
                                          "source not carried yet.", labels=labels),
        "lag_seconds": GaugeMetricFamily("minou_federation_lag_seconds", "Age of the last "
                                         "message carried while behind (0: caught up); "
                                         "while down, it goes on growing.",
                                         labels=labels),
        "lag_age": GaugeMetricFamily("minou_federation_lag_messages_age_seconds", "Seconds "
                                     "since lag_messages was counted on the source: it "
                                     "grows while a pull direction's remote is out of "
                                     "reach (lag_messages is then the last figure known); "
                                     "absent until first counted.", labels=labels),
        "skipped_loops": CounterMetricFamily("minou_federation_loops_skipped", "Messages not "
                                             "sent to a broker they were on (a loop).",
                                             labels=labels),
        "dead_lettered": CounterMetricFamily("minou_federation_dead_lettered", "Messages the "
                                             "destination refused, dead-lettered here.",
                                             labels=labels),
        "rate": GaugeMetricFamily("minou_federation_rate", "Messages carried per second "
                                  "over the last 10 s.", labels=labels),
        "refused_channels": GaugeMetricFamily("minou_federation_refused_channels",
                                              "Channels waiting on a refusal of the "
                                              "destination (a rule, a full queue).",
                                              labels=labels),
        "foreign_channels": GaugeMetricFamily("minou_federation_foreign_channels",
                                              "Channels the source named that the "
                                              "direction's patterns do not match: not "
                                              "carried.", labels=labels),
        "orphans_dropped": CounterMetricFamily("minou_federation_orphans_dropped",
                                               "Pages a lost connection left staged on the "
                                               "destination, aborted on the next one.",
                                               labels=labels),
        "errors": GaugeMetricFamily("minou_federation_error", "1 while the link's last "
                                    "attempt failed (its text: minou federation).",
                                    labels=labels),
    }
    now = time.time()
    for p in pipes:
        key = [str(p.get("link", "")), str(p.get("direction", ""))]
        counted = p.get("lag_counted_at")
        if counted is not None:
            families["lag_age"].add_metric(key, max(0.0, now - float(counted)))
        families["up"].add_metric(key, 1.0 if p.get("state") == "up" else 0.0)
        families["errors"].add_metric(key, 1.0 if p.get("state") == "retrying" else 0.0)
        for name in ("forwarded", "lag_messages", "lag_seconds", "skipped_loops",
                     "dead_lettered", "rate", "refused_channels", "foreign_channels",
                     "orphans_dropped"):
            families[name].add_metric(key, float(p.get(name, 0) or 0))
    yield from families.values()


class Metrics:
    """The broker's metrics: histograms and rates it feeds, plus a scrape-time collector.

    ``snapshot()`` is called once per scrape and returns the broker state::

        {"uptime_s": float, "connections": int,
         "sockets": {"limit": int, "open": {listener: int}, "refused": {listener: int}},
         "counters": {"published", "delivered", "redelivered", "acked", "nacked",
                      "dead_lettered", "expired", "dropped", "duplicates", "lease_expired",
                      "channels_expired": int,
                      "refused": {reason: int}},
         "storage": {"bytes": int, "commits": int, "commit_seconds": float, "full": 0|1},
         "dedup": {"keys": int, "evicted": int},
         "producers": {"states": int, "evicted": int}, "dead_connections": int,
         "unfinished_input": {"reserved_bytes", "waiting", "waited", "cut": int},
         "auth_failures": {why: int}, "schema_refused": {schema: int},
         "authentications": {method: int}, "credentials": int,
         "channels": [{"channel", "depth", "unsettled", "published", "dropped", "expired",
                       "oldest_age_s"}, ...],
         or, summed per queue already (the broker's: a dict per channel was most of a
         scrape at 100,000 channels), "queues": {queue: {the same numbers}},
         "groups": [{"group", "kind", "members", "lag", "unsettled", "delivered", "acked"}, ...],
         "max_queue_series": int (metrics_max_queues; absent: no limit)}

    Missing keys read as zero/empty, so a broker still starting can be scraped.
    """

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot
        self.commit_duration = Histogram(COMMIT_DURATION_BUCKETS)
        self.publish_latency = Histogram(PUBLISH_LATENCY_BUCKETS)
        self.delivery_latency = Histogram(DELIVERY_LATENCY_BUCKETS)
        self.ack_latency = Histogram(ACK_LATENCY_BUCKETS)
        self.history = RateHistory()
        self.rates = RateTracker(history=self.history)
        # A private registry: no process/platform/gc collectors, nothing global, so two
        # brokers in one process (tests) never collide.
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        # The 0.0.4 text format: what every Prometheus version scrapes.
        self.content_type: str = CONTENT_TYPE_PLAIN_0_0_4

    def render(self, snapshot: Mapping[str, Any] | None = None) -> bytes:
        """The Prometheus text exposition (format 0.0.4) of the current state, or of
        ``snapshot`` when given: then nothing but the snapshot, the rate tracker's and
        the histograms' numbers is read, so a thread may write it (34 MB at 100,000
        queues: ~3 s of Python)."""
        if snapshot is None:
            return generate_latest(self.registry)
        return generate_latest(_Collecting(partial(self.collect_of, snapshot)))  # type: ignore[arg-type]

    def collect(self) -> Iterator[Metric]:
        return self.collect_of(self._snapshot() or {})

    def collect_of(self, snap: Mapping[str, Any]) -> Iterator[Metric]:
        counters: Mapping[str, Any] = snap.get("counters") or {}
        storage: Mapping[str, Any] = snap.get("storage") or {}
        dedup: Mapping[str, Any] = snap.get("dedup") or {}
        unfinished: Mapping[str, Any] = snap.get("unfinished_input") or {}
        producers: Mapping[str, Any] = snap.get("producers") or {}
        queues = {q: _QueueStats(**v) for q, v in snap["queues"].items()} \
            if "queues" in snap else _aggregate(snap.get("channels") or ())
        groups: list[Mapping[str, Any]] = sorted(
            snap.get("groups") or (), key=lambda g: str(g.get("group", ""))
        )
        queue_names = sorted(queues)
        # The first ones by name: the same ones every scrape, so no series comes and goes
        # (a counter that vanishes and comes back reads as a reset to rate()).
        most = snap.get("max_queue_series")
        omitted = {"queue": max(len(queue_names) - most, 0) if most is not None else 0,
                   "group": max(len(groups) - most, 0) if most is not None else 0}
        queue_names, groups = queue_names[:most], groups[:most]  # [:None]: all

        def num(source: Mapping[str, Any], key: str) -> float:
            return float(source.get(key, 0) or 0)

        # --- kitten-mq compatible names -------------------------------------------------
        yield GaugeMetricFamily(
            "kitten_mq_info_uptime", "Seconds since the broker started.", num(snap, "uptime_s")
        )
        for kitten, key, what in (
            ("sent", "delivered", "delivered to clients"),
            ("received", "published", "published and stored"),
            ("acked", "acked", "acknowledged"),
        ):
            yield UnknownMetricFamily(
                f"kitten_mq_messages_{kitten}_count",
                f"Messages {what} (a counter; kitten-mq name).",
                num(counters, key),
            )
            yield GaugeMetricFamily(
                f"kitten_mq_messages_{kitten}_per_seconds_average",
                f"Messages {what} per second, averaged over the last "
                f"{self.rates.window_s:g} s.",
                self.rates.rate(key),
            )
        for suffix, attr, what in (
            ("messages_count", "published", "Messages added to the queue"),
            ("messages_dropped_count", "dropped", "Messages dropped from the queue"),
            ("messages_timeout_count", "expired", "Messages of the queue expired by their TTL"),
        ):
            fam = UnknownMetricFamily(
                f"kitten_mq_queue_{suffix}",
                f"{what} (a counter; kitten-mq name; queue = endpoint/version).",
                labels=["queue"],
            )
            for name in queue_names:
                fam.add_metric([name], getattr(queues[name], attr))
            yield fam

        # --- minou's own ----------------------------------------------------------------
        for key, name, doc in _MINOU_COUNTERS:
            yield CounterMetricFamily(name, doc, num(counters, key))
        yield _labelled_counter(
            "minou_requests_refused", "Requests refused, by reason.", "reason",
            counters.get("refused") or {},
        )
        yield _labelled_counter(
            "minou_auth_failures", "Failed authentications, by cause.", "why",
            snap.get("auth_failures") or {},
        )
        yield _labelled_counter(
            "minou_authentications", "Native and WebSocket connections authenticated, by "
            "method (key, credential, broker_token, development).", "method",
            snap.get("authentications") or {},
        )
        yield GaugeMetricFamily("minou_credentials", "Live delegated credentials.",
                                num(snap, "credentials"))
        yield _labelled_counter(
            "minou_schema_refused", "Publishes refused by schema validation, by schema.",
            "schema", snap.get("schema_refused") or {},
        )
        yield GaugeMetricFamily("minou_connections", "Open client connections.",
                                num(snap, "connections"))
        sockets = snap.get("sockets") or {}
        gauge = GaugeMetricFamily("minou_sockets", "Open client sockets counted against the "
                                  "connection limit, by listener (http: requests, idle "
                                  "keep-alive connections and WebSockets).", labels=["listener"])
        for listener, count in sorted((sockets.get("open") or {}).items()):
            gauge.add_metric([listener], float(count))
        yield gauge
        yield from _federation_metrics(snap.get("federation") or ())
        yield GaugeMetricFamily("minou_connection_limit", "The connection limit: "
                                "max_connections, capped by the file descriptor limit.",
                                num(sockets, "limit"))
        yield _labelled_counter("minou_connections_refused", "Connections refused over the "
                                "connection limit, by listener.", "listener",
                                sockets.get("refused") or {})
        yield GaugeMetricFamily("minou_storage_bytes", "Size of the storage files in bytes.",
                                num(storage, "bytes"))
        yield CounterMetricFamily("minou_storage_commits", "Storage group commits.",
                                  num(storage, "commits"))
        yield CounterMetricFamily("minou_storage_commit_seconds",
                                  "Seconds spent in storage commits.",
                                  num(storage, "commit_seconds"))
        yield CounterMetricFamily("minou_storage_syncs", "fsyncs made after commits of "
                                  'channels with durability "interval".', num(storage, "syncs"))
        yield CounterMetricFamily("minou_storage_syncs_late", 'fsyncs of "interval" commits '
                                  "that began more than 5 ms past their sync_interval.",
                                  num(storage, "syncs_late"))
        yield CounterMetricFamily("minou_storage_commits_on_loop", "Commits small enough "
                                  "to be written by the event loop rather than handed to "
                                  "the writer thread (whose fdatasync still makes an fsync "
                                  "channel's durable before its answer).",
                                  num(storage, "commits_on_loop"))
        yield GaugeMetricFamily("minou_storage_body_files", "Files of large message bodies "
                                "kept beside the SQLite database (part of "
                                "minou_storage_bytes).", num(storage, "body_files"))
        yield GaugeMetricFamily("minou_storage_full", "1 while the disk or [storage] "
                                "max_size is full (publishes refused with STORAGE_FULL).",
                                num(storage, "full"))
        cluster: Mapping[str, Any] = snap.get("cluster") or {}
        if cluster:
            yield GaugeMetricFamily("minou_primary", "1 while this broker is the primary of "
                                    "those on its Redis (0: standby or stopping).",
                                    1 if cluster.get("role") == "primary" else 0)
            for name, key, doc in (
                ("minou_fenced_writes", "fenced_writes",
                 "Commits Redis refused because another broker took over (fencing)."),
                ("minou_lease_renewals", "lease_renewals", "Primary lease renewals."),
                ("minou_takeovers", "takeovers",
                 "Times this broker took over as primary from another that stopped "
                 "renewing its lease (a hand-over by a clean or soft stop is not counted)."),
            ):
                yield CounterMetricFamily(name, doc, num(cluster, key))
        yield GaugeMetricFamily("minou_storage_unavailable", "1 while storage cannot be "
                                "reached (Redis down: publishes refused with "
                                "STORAGE_UNAVAILABLE).", num(storage, "unavailable"))
        yield CounterMetricFamily("minou_storage_unavailable_commits",
                                  "Commits that failed because storage could not be reached.",
                                  num(storage, "unavailable_commits"))
        for family, name, value, doc in (
            (GaugeMetricFamily, "minou_dedup_keys", num(dedup, "keys"),
             "Dedup keys held in memory (the dedup window; max_dedup_keys caps it)."),
            (CounterMetricFamily, "minou_dedup_evicted", num(dedup, "evicted"),
             "Dedup keys expired early because max_dedup_keys was reached (the window "
             "narrowed)."),
            (GaugeMetricFamily, "minou_producer_states", num(producers, "states"),
             "Idempotent producer states held (one per client, producer id and channel)."),
            (CounterMetricFamily, "minou_producer_states_evicted", num(producers, "evicted"),
             "Producer states dropped past MAX_PRODUCER_STATES (least recently used first)."),
            (CounterMetricFamily, "minou_connections_dead", num(snap, "dead_connections"),
             "Connections cut because they sent nothing for two heartbeat intervals."),
            (GaugeMetricFamily, "minou_input_reserved_bytes", num(unfinished, "reserved_bytes"),
             "Bytes reserved for frames and bodies over 64 KiB still arriving."),
            (GaugeMetricFamily, "minou_input_waiting", num(unfinished, "waiting"),
             "Connections waiting for room to read a frame or body over 64 KiB."),
            (CounterMetricFamily, "minou_input_waits", num(unfinished, "waited"),
             "Frames and bodies over 64 KiB that had to wait for room."),
            (CounterMetricFamily, "minou_input_cut", num(unfinished, "cut"),
             "Connections cut because a frame or body over 64 KiB arrived too slowly."),
        ):
            yield family(name, doc, value)

        for name, attr, doc in (
            ("minou_queue_depth", "depth", "Live messages in the queue."),
            ("minou_queue_unsettled", "unsettled", "Messages of the queue delivered and not yet "
             "settled."),
            ("minou_queue_oldest_age_seconds", "oldest_age_s", "Age of the oldest live message "
             "of the queue (0 if empty)."),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["queue"])
            for q in queue_names:
                gauge.add_metric([q], getattr(queues[q], attr))
            yield gauge
        left_out = GaugeMetricFamily(
            "minou_metrics_series_omitted", "Queues or reader groups past metrics_max_queues "
            "(by name) whose own series this scrape leaves out; the totals count them.",
            labels=["kind"])
        if most is not None:  # (the broker's snapshots always say)
            for kind in ("queue", "group"):
                left_out.add_metric([kind], omitted[kind])
        yield left_out
        for name, key, doc in (
            ("minou_group_lag", "lag", "Messages the group has yet to receive."),
            ("minou_group_members", "members", "Connected members of the group."),
            ("minou_group_unsettled", "unsettled", "Messages delivered to the group and not "
             "yet settled."),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["group"])
            for g in groups:
                gauge.add_metric([str(g.get("group", ""))], num(g, key))
            yield gauge

        for name, hist, doc in (
            ("minou_storage_commit_duration_seconds", self.commit_duration,
             "Duration of one storage group commit."),
            ("minou_publish_latency_seconds", self.publish_latency,
             "From a publish received (any interface) to its answer once durable."),
            ("minou_delivery_latency_seconds", self.delivery_latency,
             "From a message's published_at to its delivery."),
            ("minou_ack_latency_seconds", self.ack_latency,
             "From a delivery to its ack."),
        ):
            buckets, total = hist.snapshot()
            yield HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _labelled_counter(name: str, doc: str, label: str, values: Mapping[str, Any]) -> Metric:
    fam = CounterMetricFamily(name, doc, labels=[label])
    for key in sorted(values, key=str):
        fam.add_metric([str(key)], float(values[key] or 0))
    return fam
