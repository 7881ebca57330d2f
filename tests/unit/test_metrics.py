"""Metrics exposition: exact kitten-mq names, queue aggregation, label escaping,
histograms and per-second rates, checked by parsing the rendered text back with
prometheus_client's own parser."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from minou.server.metrics import (
    COMMIT_DURATION_BUCKETS,
    Histogram,
    Metrics,
    RateTracker,
    queue_of,
)
from minou.server.rate_history import RateHistory

SNAP: dict[str, Any] = {
    "uptime_s": 12.5,
    "connections": 3,
    "counters": {
        "published": 10, "delivered": 9, "redelivered": 1, "acked": 8, "nacked": 1,
        "dead_lettered": 4, "expired": 5, "dropped": 6, "duplicates": 7, "lease_expired": 2,
        "refused": {"not_authorized": 2, "rate_limited": 3},
    },
    "storage": {"bytes": 4096, "commits": 5, "commit_seconds": 0.01},
    "dedup": {"keys": 720_000, "evicted": 11},
    "producers": {"states": 42, "evicted": 3},
    "dead_connections": 5,
    "auth_failures": {"pending": 1, "bad_signature": 4},
    "schema_refused": {"orders/v1": 2},
    "channels": [
        {"channel": "orders/v1/1", "depth": 1, "unsettled": 0, "published": 5, "dropped": 1,
         "expired": 2, "oldest_age_s": 3.2},
    ],
    "groups": [
        {"group": "consume:billing", "kind": "consume", "members": 1, "lag": 4, "unsettled": 2,
         "delivered": 5, "acked": 5},
    ],
}

KITTEN_NAMES = (
    "kitten_mq_info_uptime",
    "kitten_mq_messages_sent_count",
    "kitten_mq_messages_sent_per_seconds_average",
    "kitten_mq_messages_received_count",
    "kitten_mq_messages_received_per_seconds_average",
    "kitten_mq_messages_acked_count",
    "kitten_mq_messages_acked_per_seconds_average",
    "kitten_mq_queue_messages_count",
    "kitten_mq_queue_messages_dropped_count",
    "kitten_mq_queue_messages_timeout_count",
)
GLOBAL_SAMPLES = (
    "kitten_mq_info_uptime",
    "kitten_mq_messages_sent_count",
    "kitten_mq_messages_sent_per_seconds_average",
    "kitten_mq_messages_received_count",
    "kitten_mq_messages_received_per_seconds_average",
    "kitten_mq_messages_acked_count",
    "kitten_mq_messages_acked_per_seconds_average",
    "minou_messages_published_total",
    "minou_messages_delivered_total",
    "minou_messages_redelivered_total",
    "minou_messages_acked_total",
    "minou_messages_nacked_total",
    "minou_messages_dead_lettered_total",
    "minou_messages_expired_total",
    "minou_messages_dropped_total",
    "minou_messages_duplicate_total",
    "minou_leases_expired_total",
    "minou_connections",
    "minou_storage_bytes",
    "minou_storage_full",
    "minou_dedup_keys",
    "minou_dedup_evicted_total",
    "minou_producer_states",
    "minou_producer_states_evicted_total",
    "minou_connections_dead_total",
    "minou_storage_commits_total",
    "minou_storage_commit_seconds_total",
    "minou_storage_commit_duration_seconds_count",
    "minou_publish_latency_seconds_count",
    "minou_delivery_latency_seconds_count",
    "minou_ack_latency_seconds_count",
)

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(metrics: Metrics) -> tuple[str, dict[Key, float], dict[str, str]]:
    """The rendered text, every sample keyed by (name, labels), and each family's type."""
    text = metrics.render().decode("utf-8")
    samples: dict[Key, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = s.value
    return text, samples, types


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def channel(name: str, **stats: float) -> dict[str, Any]:
    base: dict[str, Any] = {"channel": name, "depth": 0, "unsettled": 0, "published": 0,
                            "dropped": 0, "expired": 0, "oldest_age_s": 0.0}
    base.update(stats)
    return base


def test_kitten_names_are_exposed_exactly_with_their_values() -> None:
    text, samples, types = scrape(Metrics(lambda: SNAP))
    lines = text.splitlines()
    # The exact bytes a kitten-mq dashboard queries: no "_total" added, no suffix lost.
    assert "# TYPE kitten_mq_messages_sent_count untyped" in lines
    assert "kitten_mq_messages_sent_count 9.0" in lines
    assert "kitten_mq_messages_received_count 10.0" in lines
    assert "kitten_mq_messages_acked_count 8.0" in lines
    assert "kitten_mq_info_uptime 12.5" in lines
    assert 'kitten_mq_queue_messages_count{queue="orders/v1"} 5.0' in lines
    assert not any(line.startswith("kitten_mq_") and "_total" in line.split(" ")[0]
                   for line in lines)
    for name in KITTEN_NAMES:
        assert name in types, name
    assert types["kitten_mq_info_uptime"] == "gauge"
    assert types["kitten_mq_messages_sent_count"] == "unknown"
    assert types["kitten_mq_messages_sent_per_seconds_average"] == "gauge"

    assert value(samples, "kitten_mq_info_uptime") == 12.5
    assert value(samples, "kitten_mq_messages_sent_count") == 9
    assert value(samples, "kitten_mq_messages_received_count") == 10
    assert value(samples, "kitten_mq_messages_acked_count") == 8
    for kind in ("sent", "received", "acked"):
        # No rate samples taken yet.
        assert value(samples, f"kitten_mq_messages_{kind}_per_seconds_average") == 0.0
    assert value(samples, "kitten_mq_queue_messages_count", queue="orders/v1") == 5
    assert value(samples, "kitten_mq_queue_messages_dropped_count", queue="orders/v1") == 1
    assert value(samples, "kitten_mq_queue_messages_timeout_count", queue="orders/v1") == 2


def test_minou_metrics_names_types_and_values() -> None:
    text, samples, types = scrape(Metrics(lambda: SNAP))
    expected = {
        "minou_messages_published_total": 10, "minou_messages_delivered_total": 9,
        "minou_messages_redelivered_total": 1, "minou_messages_acked_total": 8,
        "minou_messages_nacked_total": 1, "minou_messages_dead_lettered_total": 4,
        "minou_messages_expired_total": 5, "minou_messages_dropped_total": 6,
        "minou_messages_duplicate_total": 7, "minou_leases_expired_total": 2,
        "minou_connections": 3, "minou_storage_bytes": 4096, "minou_storage_commits_total": 5,
        "minou_storage_commit_seconds_total": 0.01,
        "minou_dedup_keys": 720_000, "minou_dedup_evicted_total": 11,
        "minou_producer_states": 42, "minou_producer_states_evicted_total": 3,
        "minou_connections_dead_total": 5,
    }
    for name, want in expected.items():
        assert value(samples, name) == pytest.approx(want), name
    assert "# TYPE minou_messages_published_total counter" in text.splitlines()
    assert types["minou_messages_published"] == "counter"  # the parser strips "_total"
    assert types["minou_connections"] == "gauge"
    assert types["minou_dedup_keys"] == "gauge" and types["minou_dedup_evicted"] == "counter"
    assert types["minou_storage_commit_duration_seconds"] == "histogram"
    assert value(samples, "minou_auth_failures_total", why="pending") == 1
    assert value(samples, "minou_auth_failures_total", why="bad_signature") == 4
    assert value(samples, "minou_schema_refused_total", schema="orders/v1") == 2
    assert value(samples, "minou_queue_depth", queue="orders/v1") == 1
    assert value(samples, "minou_queue_unsettled", queue="orders/v1") == 0
    assert value(samples, "minou_queue_oldest_age_seconds", queue="orders/v1") == 3.2
    assert value(samples, "minou_group_lag", group="consume:billing") == 4
    assert value(samples, "minou_group_members", group="consume:billing") == 1
    assert value(samples, "minou_group_unsettled", group="consume:billing") == 2
    # Nothing besides our one collector: no process_/python_ metrics from defaults.
    assert all(n.startswith(("kitten_mq_", "minou_")) for n, _ in samples)


def test_refused_reasons_become_labelled_samples() -> None:
    _, samples, _ = scrape(Metrics(lambda: SNAP))
    refused = {dict(labels)["reason"]: v for (name, labels), v in samples.items()
               if name == "minou_requests_refused_total"}
    assert refused == {"not_authorized": 2, "rate_limited": 3}


def test_queues_aggregate_channels_of_one_version_and_keep_dead_letters_apart() -> None:
    snap = copy.deepcopy(SNAP)
    snap["channels"] = [
        channel("orders/v1/1", depth=2, unsettled=1, published=5, dropped=1, expired=0,
                oldest_age_s=3.0),
        channel("orders/v1/2", depth=3, unsettled=2, published=7, dropped=0, expired=4,
                oldest_age_s=9.5),
        channel("orders/v2/1", depth=1, published=1, oldest_age_s=1.0),
        channel("_dead/orders/v1/1", depth=4, published=4, oldest_age_s=60.0),
        channel("_dead/orders/v1/2", depth=1, published=1, expired=1, oldest_age_s=20.0),
    ]
    _, samples, _ = scrape(Metrics(lambda: snap))
    queues = {dict(labels)["queue"] for (name, labels), _ in samples.items()
              if name == "minou_queue_depth"}
    assert queues == {"orders/v1", "orders/v2", "_dead/orders/v1"}

    assert value(samples, "kitten_mq_queue_messages_count", queue="orders/v1") == 12
    assert value(samples, "kitten_mq_queue_messages_dropped_count", queue="orders/v1") == 1
    assert value(samples, "kitten_mq_queue_messages_timeout_count", queue="orders/v1") == 4
    assert value(samples, "minou_queue_depth", queue="orders/v1") == 5
    assert value(samples, "minou_queue_unsettled", queue="orders/v1") == 3
    # The oldest message of a queue is the oldest over its channels, not a sum.
    assert value(samples, "minou_queue_oldest_age_seconds", queue="orders/v1") == 9.5

    assert value(samples, "kitten_mq_queue_messages_count", queue="orders/v2") == 1
    assert value(samples, "kitten_mq_queue_messages_count", queue="_dead/orders/v1") == 5
    assert value(samples, "kitten_mq_queue_messages_timeout_count", queue="_dead/orders/v1") == 1
    assert value(samples, "minou_queue_depth", queue="_dead/orders/v1") == 5
    assert value(samples, "minou_queue_oldest_age_seconds", queue="_dead/orders/v1") == 60.0


def test_queue_of() -> None:
    assert queue_of("orders/v1/42") == "orders/v1"
    assert queue_of("orders/v1/a%2Fb") == "orders/v1"
    assert queue_of("_dead/orders/v3/x") == "_dead/orders/v3"


@pytest.mark.parametrize(
    "group",
    ['consume:we"ird', "consume:back\\slash", 'subscribe:a\\"b\\\\c"', "consume:new\nline"],
)
def test_group_labels_are_escaped_and_parse_back_equal(group: str) -> None:
    snap = copy.deepcopy(SNAP)
    snap["groups"] = [{"group": group, "kind": "consume", "members": 2, "lag": 7,
                       "unsettled": 1, "delivered": 0, "acked": 0}]
    text, samples, _ = scrape(Metrics(lambda: snap))
    escaped = group.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    assert f'minou_group_lag{{group="{escaped}"}} 7.0' in text.splitlines()
    assert value(samples, "minou_group_lag", group=group) == 7
    assert value(samples, "minou_group_members", group=group) == 2
    assert value(samples, "minou_group_unsettled", group=group) == 1


def test_histogram_snapshot_is_cumulative_with_inf_equal_to_count() -> None:
    h = Histogram([0.1, 0.5, 1.0])
    for v in (0.05, 0.1, 0.3, 0.5, 0.7, 2.0, 5.0):
        h.observe(v)
    buckets, total = h.snapshot()
    # A value equal to a bound falls in that bucket ("le" is "<=").
    assert buckets == [("0.1", 2), ("0.5", 4), ("1.0", 5), ("+Inf", 7)]
    assert total == pytest.approx(8.65)
    assert h.count == 7


def test_histogram_edge_values_and_validation() -> None:
    h = Histogram([1.0, 2.0, math.inf])  # a listed +Inf is accepted, not doubled
    h.observe(-3.0)  # a clock step back is clamped to 0, it does not shrink the sum
    h.observe(math.nan)  # ignored
    h.observe(1.5)
    assert h.snapshot() == ([("1.0", 1), ("2.0", 2), ("+Inf", 2)], 1.5)
    h.observe(math.inf)
    buckets, total = h.snapshot()
    assert buckets == [("1.0", 1), ("2.0", 2), ("+Inf", 3)]
    assert total == math.inf
    for bad in ([], [2.0, 1.0], [1.0, 1.0], [math.nan]):
        with pytest.raises(ValueError):
            Histogram(bad)


@pytest.mark.parametrize("values", [
    [],
    [0.3],
    [0.05, 0.1, 0.3, 0.5, 0.7, 2.0, 5.0],  # bounds fall in their own bucket
    [0.2] * 3 + [-1.0, math.nan, 0.0, 1.0],  # a step back clamped, a NaN ignored
    [0.1 * i for i in range(50)] + [math.inf],
])
def test_observe_many_counts_exactly_as_observe_one_by_one(values: list[float]) -> None:
    one, many = Histogram([0.1, 0.5, 1.0]), Histogram([0.1, 0.5, 1.0])
    for v in values:
        one.observe(v)
    many.observe_many(list(values))
    (b1, s1), (b2, s2) = one.snapshot(), many.snapshot()
    assert b2 == b1 and many.count == one.count
    assert s2 == pytest.approx(s1)


@pytest.mark.parametrize("times", [
    [],
    [99.7],
    [99.0] * 500 + [99.5] * 300 + [99.9] * 200,  # runs: one bisect per distinct time
    [99.95, 99.9, 99.7, 99.5, 99.3, 98.0, 95.0] * 20,  # bounds fall in their own bucket
    [99.8] * 30 + [101.0] * 10 + [math.nan] * 5 + [100.0] * 5,  # a step back, NaNs
    [100.0 - 0.013 * i for i in range(400)] + [-math.inf],  # mostly distinct
])
def test_observe_since_counts_exactly_as_observe_one_by_one(times: list[float]) -> None:
    one, since = Histogram([0.1, 0.5, 1.0]), Histogram([0.1, 0.5, 1.0])
    for t in times:
        one.observe(100.0 - t)
    since.observe_since(100.0, list(times))
    (b1, s1), (b2, s2) = one.snapshot(), since.snapshot()
    assert b2 == b1 and since.count == one.count
    assert s2 == pytest.approx(s1)


def test_rendered_histogram_buckets_sum_and_count() -> None:
    metrics = Metrics(lambda: SNAP)
    observed = (0.00005, 0.0003, 0.003, 0.003, 0.2, 3.0)
    for v in observed:
        metrics.commit_duration.observe(v)
    metrics.ack_latency.observe(0.02)
    _, samples, _ = scrape(metrics)
    name = "minou_storage_commit_duration_seconds"
    buckets = sorted(
        ((float(dict(labels)["le"]), v) for (n, labels), v in samples.items()
         if n == f"{name}_bucket"),
    )
    assert [le for le, _ in buckets] == [*COMMIT_DURATION_BUCKETS, math.inf]
    counts = [c for _, c in buckets]
    assert counts == sorted(counts)  # cumulative never decreases
    for le, c in buckets:
        assert c == sum(1 for v in observed if v <= le), le
    assert buckets[-1][1] == value(samples, f"{name}_count") == len(observed)
    assert value(samples, f"{name}_sum") == pytest.approx(sum(observed))
    assert value(samples, "minou_ack_latency_seconds_count") == 1
    assert value(samples, "minou_publish_latency_seconds_count") == 0
    assert value(samples, "minou_publish_latency_seconds_bucket", le="+Inf") == 0


def test_rate_tracker_rate_over_window() -> None:
    rt = RateTracker(window_s=10.0)
    rt.sample(100.0, {"published": 0, "delivered": 5})
    assert rt.rate("published") == 0.0  # one sample: no rate yet
    rt.sample(101.0, {"published": 10, "delivered": 5})
    rt.sample(104.0, {"published": 40, "delivered": 17})
    assert rt.rate("published") == pytest.approx(10.0)
    assert rt.rate("delivered") == pytest.approx(3.0)
    assert rt.rate("unknown") == 0.0


def test_rate_tracker_drops_samples_beyond_the_window() -> None:
    rt = RateTracker(window_s=5.0)
    rt.sample(0.0, {"acked": 0})
    rt.sample(1.0, {"acked": 100})  # a burst that must age out
    for t in range(2, 11):
        rt.sample(float(t), {"acked": 100 + (t - 1) * 2})
    # Window is [5, 10]: acked went 108 -> 118 over 5 s.
    assert rt.rate("acked") == pytest.approx(2.0)


def test_rate_tracker_copies_counters_and_skips_non_numbers() -> None:
    rt = RateTracker()
    live: dict[str, Any] = {"published": 1, "refused": {"x": 1}}
    rt.sample(0.0, live)
    live["published"] = 11  # the broker keeps mutating its dict
    rt.sample(2.0, live)
    assert rt.rate("published") == pytest.approx(5.0)
    assert rt.rate("refused") == 0.0


def test_rates_are_exposed_as_kitten_averages() -> None:
    metrics = Metrics(lambda: SNAP)
    metrics.rates.sample(0.0, {"published": 0, "delivered": 0, "acked": 0})
    metrics.rates.sample(4.0, {"published": 20, "delivered": 8, "acked": 2})
    _, samples, _ = scrape(metrics)
    assert value(samples, "kitten_mq_messages_received_per_seconds_average") == 5.0
    assert value(samples, "kitten_mq_messages_sent_per_seconds_average") == 2.0
    assert value(samples, "kitten_mq_messages_acked_per_seconds_average") == 0.5


@pytest.mark.parametrize("empty", [
    {"uptime_s": 0.0, "connections": 0,
     "counters": {k: 0 for k in ("published", "delivered", "redelivered", "acked", "nacked",
                                 "dead_lettered", "expired", "dropped", "duplicates",
                                 "lease_expired")} | {"refused": {}},
     "storage": {"bytes": 0, "commits": 0, "commit_seconds": 0.0},
     "auth_failures": {}, "schema_refused": {}, "channels": [], "groups": []},
    {},
], ids=["no-channels", "missing-keys"])
def test_empty_snapshot_still_renders_all_global_metrics(empty: dict[str, Any]) -> None:
    _, samples, types = scrape(Metrics(lambda: empty))
    for name in GLOBAL_SAMPLES:
        assert value(samples, name) == 0, name
    # Labelled families are still declared (HELP/TYPE), just without samples.
    for name in ("kitten_mq_queue_messages_count", "minou_queue_depth", "minou_group_lag"):
        assert name in types
    assert not any(labels for (n, labels) in samples if not n.endswith("_bucket"))


def test_a_snapshot_summed_per_queue_renders_as_its_channels_do() -> None:
    """The broker sums each queue while taking a scrape's snapshot ("queues"); the
    text is the one its channels ("channels") gave."""
    channels = {**SNAP, "channels": SNAP["channels"] + [
        {"channel": "orders/v1/2", "depth": 3, "unsettled": 1, "published": 4, "dropped": 0,
         "expired": 1, "oldest_age_s": 9.5}]}
    queues = {k: v for k, v in channels.items() if k != "channels"} | {"queues": {
        "orders/v1": {"published": 9, "dropped": 1, "expired": 3, "depth": 4, "unsettled": 1,
                      "oldest_age_s": 9.5}}}
    by_channel, by_queue = Metrics(lambda: channels), Metrics(lambda: queues)
    assert by_queue.render(queues) == by_channel.render(channels)
    _, samples, _ = scrape(by_queue)
    assert value(samples, "minou_queue_oldest_age_seconds", queue="orders/v1") == 9.5


def test_metrics_use_a_private_registry() -> None:
    a = Metrics(lambda: SNAP)
    b = Metrics(lambda: {})  # a second broker in the same process does not collide
    assert b"kitten_mq_messages_sent_count 9.0" in a.render()
    assert b"kitten_mq_messages_sent_count 0.0" in b.render()
    assert b"kitten_mq" not in generate_latest(REGISTRY)
    assert a.content_type.startswith("text/plain")


def test_snapshot_is_taken_once_per_scrape() -> None:
    calls = 0

    def snapshot() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        return SNAP

    metrics = Metrics(snapshot)
    assert calls == 0
    metrics.render()
    assert calls == 1


def test_rate_tracker_keeps_what_changed_and_rates_keys_that_come_and_go() -> None:
    """A sample keeps only the counters that changed (a copy of every per-queue counter
    per sample held ~2 GB at 100,000 queues): a queue that went has no rate, one that
    came within the window is rated since the sample before it came (from 0: a queue's
    counters start with it)."""
    rt = RateTracker(window_s=10.0)
    idle = {f"q{i}/v1": (7.0, 0.0, 0.0, 0.0) for i in range(1_000)}  # nobody writes
    for t in range(12):
        queues = {**idle, "busy/v1": (3.0 * t, 2.0 * t, t, 0.0)}
        if t >= 8:
            queues["late/v1"] = (float(t), 0.0, 0.0, 0.0)
        if t < 5:
            queues["gone/v1"] = (float(t), 0.0, 0.0, 0.0)
        rt.sample(float(t), {"published": 10.0 * t, "other": 1.0 if t < 5 else None},
                  queues)
    assert rt.rate("published") == pytest.approx(10.0)  # window [1, 11]
    assert rt.rate("other") == 0.0
    assert rt.queue_rates("busy/v1") == pytest.approx((3.0, 2.0, 1.0, 0.0))
    assert rt.queue_rates("q3/v1") == (0.0, 0.0, 0.0, 0.0)
    assert rt.queue_rates("gone/v1") == ()
    assert rt.queue_rates("late/v1") == pytest.approx((11 / 4, 0.0, 0.0, 0.0))  # since 7
    # Only what changed is kept per sample: busy/v1 each second, not the 1,000 idle ones.
    assert max(len(changed_q) for _, _, changed_q in list(rt._samples)[1:]) <= 2


def test_rate_tracker_keeps_the_queues_mapping_without_copying_it() -> None:
    """The ticker builds a fresh mapping each second; the tracker and its history keep
    that one as the latest (a copy of 100,000 queues each second was most of the CPU)."""
    history = RateHistory(seconds=5)
    rt = RateTracker(window_s=10.0, history=history)
    first = {"a/v1": (1.0, 0.0, 0.0, 0.0)}
    rt.sample(0.0, {}, first)
    later = {"a/v1": (5.0, 2.0, 0.0, 1.0)}
    rt.sample(2.0, {}, later)
    assert rt._last_q is later and history._last is later
    assert rt.queue_rates("a/v1") == (2.0, 1.0, 0.0, 0.5)
    assert history.series("a/v1")["published"] == [None, 2.0]


def test_rate_tracker_given_what_changed_still_finds_a_queue_gone_as_another_came() -> None:
    """The broker passes the queues that changed (found a slice at a time); the tracker
    looks for queues that went only when the counts say one did: here one went and
    another came in the same second, so the number of queues stayed the same."""
    rt = RateTracker(window_s=3.0)
    rt.sample(0.0, {}, {"a/v1": (1, 0, 0, 0), "b/v1": (1, 0, 0, 0)})
    rt.sample(1.0, {}, {"a/v1": (2, 0, 0, 0), "b/v1": (1, 0, 0, 0)},
              {"a/v1": (2, 0, 0, 0)})
    swapped = {"a/v1": (3, 0, 0, 0), "c/v1": (1, 0, 0, 0)}
    rt.sample(2.0, {}, swapped, {"a/v1": (3, 0, 0, 0), "c/v1": (1, 0, 0, 0)})
    assert rt._samples[-1][2] == {"a/v1": (3, 0, 0, 0), "c/v1": (1, 0, 0, 0), "b/v1": None}
    for t in (3.0, 4.0, 5.0, 6.0):
        rt.sample(t, {}, swapped, {})
    assert rt.queue_rates("b/v1") == () and rt.queue_rates("a/v1") == (0.0, 0.0, 0.0, 0.0)
    assert rt._first_q == swapped  # b/v1 left the window's start too


def test_a_new_queue_is_rated_from_zero_until_the_window_starts_with_it() -> None:
    """A queue made a second ago shows its rate now, not 0 for a whole window."""
    rt = RateTracker(window_s=3.0)
    rt.sample(0.0, {}, {"a/v1": (1, 0, 0, 0)})
    rt.sample(1.0, {}, {"a/v1": (1, 0, 0, 0), "new/v1": (6, 4, 2, 0)})
    assert rt.queue_rates("new/v1") == (6.0, 4.0, 2.0, 0.0)  # since t=0, when it was 0
    rt.sample(2.0, {}, {"a/v1": (1, 0, 0, 0), "new/v1": (8, 4, 2, 0)})
    assert rt.queue_rates("new/v1") == (4.0, 2.0, 1.0, 0.0)
    for t in (3.0, 4.0, 5.0):
        rt.sample(t, {}, {"a/v1": (1, 0, 0, 0), "new/v1": (8, 4, 2, 0)})
    assert rt.queue_rates("new/v1") == (0.0, 0.0, 0.0, 0.0) and not rt._born
    rt.sample(6.0, {}, {"a/v1": (1, 0, 0, 0)})  # gone: no rate, nothing kept for it
    assert rt.queue_rates("new/v1") == () and not rt._born


@pytest.mark.parametrize("most", [0, 2, 5, 9])
def test_queues_and_groups_past_the_limit_are_counted_not_listed(most: int) -> None:
    """``max_queue_series`` (metrics_max_queues): the first queues and groups by name
    keep their series, the rest are counted in minou_metrics_series_omitted; the totals
    still count every queue."""
    names = [f"q{i}/v1" for i in (3, 0, 4, 1, 2)]  # not in name order
    snap = {**SNAP, "max_queue_series": most, "counters": {"published": 15}, "queues": {
        q: {"published": 3, "dropped": 0, "expired": 0, "depth": 1, "unsettled": 0,
            "oldest_age_s": 0.0} for q in names},
        "groups": [{"group": f"consume:{q}", "kind": "consume", "members": 1, "lag": 1,
                    "unsettled": 0} for q in reversed(names)]}
    _, samples, _ = scrape(Metrics(lambda: snap))
    listed = sorted(names)[:most]
    for family in ("kitten_mq_queue_messages_count", "minou_queue_depth"):
        shown = sorted(dict(labels)["queue"] for n, labels in samples if n == family)
        assert shown == listed, family
    groups = sorted(dict(labels)["group"] for n, labels in samples if n == "minou_group_lag")
    assert groups == [f"consume:{q}" for q in listed]
    assert value(samples, "minou_metrics_series_omitted", kind="queue") == max(0, 5 - most)
    assert value(samples, "minou_metrics_series_omitted", kind="group") == max(0, 5 - most)
    assert value(samples, "minou_messages_published_total") == 15


def test_without_a_limit_every_queue_is_listed_and_nothing_said_omitted() -> None:
    snap = {**SNAP, "queues": {f"q{i}/v1": {"published": 1} for i in range(20)}}
    _, samples, types = scrape(Metrics(lambda: snap))
    assert sum(n == "kitten_mq_queue_messages_count" for n, _ in samples) == 20
    assert "minou_metrics_series_omitted" in types
    assert not any(n == "minou_metrics_series_omitted" for n, _ in samples)
