"""The connector on a real standalone cluster whose executors cannot see the driver's keys.

Each test runs one driver (driver.py, a subprocess) against the session's cluster and
checks the broker's side with its own client; the four whose scenarios need nothing of
their own (no killed worker, UI or split DNS) share one driver, ``one_app``. How the
tests let tasks authenticate is ``AUTH``, a key of driver.py's ``AUTH`` table:
``credential`` (the default: a delegated credential the connector issues on the
driver; nothing shipped) or ``ship`` (the key shipped with ``addFile``,
``executorAuth=keyFile``); ``MINOU_SPARK_CLUSTER_AUTH=ship`` runs them so without
editing anything. Either way they check which it was: the key's copies in the
executors' directories exist exactly when it was shipped.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ..spark.helpers import read_all
from .conftest import SPLIT_NAME, SparkCluster, driver_runner, make_job_args

# How tests (b)-(d) hand the job's identity to the executors (a key of driver.AUTH).
AUTH = os.environ.get("MINOU_SPARK_CLUSTER_AUTH", "credential")
N_CHANNELS = 4
RunDriver = Callable[..., dict[str, Any]]


def prefix(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:8]}"


def channels(ep: str) -> list[str]:
    return [f"{ep}/v1/{i}" for i in range(N_CHANNELS)]


def publish(client: Any, chans: list[str], per_channel: int) -> None:
    for ch in chans:
        for lo in range(0, per_channel, 1000):
            client.send_many([{"channel": ch, "payload": {"n": i, "ch": ch}}
                              for i in range(lo, min(lo + 1000, per_channel))])


def sink_keys(client: Any, out: str) -> Counter[tuple[str, int]]:
    """How many times each source (channel, seq) landed in the sink."""
    return Counter((p["src"], p["seq"]) for p in
                   (json.loads(m.data) for m in read_all(client, out)))


def source_keys(client: Any, chans: list[str]) -> set[tuple[str, int]]:
    got = client.offsets(chans)
    return {(ch, seq) for ch in chans for seq in range(*got[ch])}


def check_key_copies(cluster: SparkCluster, app_id: str) -> None:
    """The key reached the executors' directories (addFile's copies) iff AUTH ships it."""
    copies = [p for d in cluster.worker_dirs for p in (d / app_id).rglob(cluster.job_key.name)]
    if AUTH == "ship":
        assert copies, f"no executor of {app_id} received the key"
    else:
        assert not copies, f"the key reached executors under AUTH={AUTH}: {copies}"


@dataclass
class OneApp:
    """The scenarios that need no application of their own, run by one driver (a Spark
    application takes ~15 s to start here, and its executors' first Python task ~10 s
    more): what each was given and what it returned."""

    eps: dict[str, str]
    results: dict[str, Any]
    tls_broker: Any

    @property
    def app_id(self) -> str:
        return self.results["app_id"]


@pytest.fixture(scope="module")
def one_app(spark_cluster: SparkCluster, cluster_broker: Any, cluster_client: Any,
            tls_cluster_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> OneApp:
    root = tmp_path_factory.mktemp("one-app")
    eps = {name: prefix(name) for name in ("mask", "cbatch", "cdrain", "ctls")}
    publish(cluster_client, channels(eps["mask"])[:1], 10)  # a read with tasks to fail
    publish(cluster_client, channels(eps["cbatch"]), 5000)
    publish(cluster_client, channels(eps["cdrain"]), 5000)
    with tls_cluster_broker.connect_sync("spark-cluster-tests") as c:
        publish(c, channels(eps["ctls"]), 500)
    # The TLS broker's CA file sits beside the key (executors cannot see it there) and
    # reaches them through addFile, named by its bare name.
    ca = spark_cluster.driver_keys / f"broker-ca-{uuid.uuid4().hex[:6]}.pem"
    ca.write_bytes((tls_cluster_broker.data_dir / "tls" / "cert.pem").read_bytes())

    def args(part: str, broker: Any = cluster_broker) -> dict[str, Any]:
        (root / part).mkdir()
        return make_job_args(spark_cluster, broker, root / part)

    ep = eps["cdrain"]
    # The mask first: it checks that a key named by its driver path and shipped nowhere
    # reaches no executor, before a part ships anything (AUTH=ship). Its failing read is
    # tried spark.task.maxFailures times (4, the default the other parts want).
    parts = {
        "mask": {**args("mask"), "pattern": f"{eps['mask']}/v1/*"},
        "batch_read": {**args("batch_read"), "auth": AUTH, "pattern": f"{eps['cbatch']}/v1/*",
                       "per_partition": 2500},
        "stream_drain": {**args("stream_drain"), "auth": AUTH, "pattern": f"{ep}/v1/*",
                         "out": f"{ep}out/v1/sink", "writer_id": f"w-{ep}",
                         "per_batch": 5000},
        "tls_read_and_stream": {
            **args("tls_read_and_stream", tls_cluster_broker), "tls_fingerprint": None,
            "cafile": str(ca), "pattern": f"{eps['ctls']}/v1/*",
            "out": f"{eps['ctls']}out/v1/sink", "writer_id": f"w-{eps['ctls']}"},
    }
    results = driver_runner(spark_cluster, root)("+".join(parts), parts, 360)
    return OneApp(eps, results, tls_cluster_broker)


def test_executors_cannot_see_the_driver_keys(spark_cluster: SparkCluster,
                                              one_app: OneApp) -> None:
    res = one_app.results["mask"]
    key = spark_cluster.job_key
    # The driver (on the host) sees the key; the precondition of everything below.
    assert res["driver"]["key_exists"] and res["driver"]["listdir"] == sorted(
        p.name for p in spark_cluster.driver_keys.iterdir())
    tasks = res["tasks"]
    assert sorted(spark_cluster.worker_of(t["cwd"]) for t in tasks) == [0, 1], tasks
    for t in tasks:
        assert t["key_exists"] is False, t
        assert t["listdir"] == [], t
        assert t["tmpfs_on_keys"] is True, t
        assert t["mnt_ns"] != res["driver"]["mnt_ns"], t
    # A key named by its driver path and shipped nowhere: the tasks cannot find it.
    assert res["unshipped_rows"] is None, res
    assert "no such file on" in res["unshipped_error"], res["unshipped_error"]
    assert str(key) in res["unshipped_error"] or key.name in res["unshipped_error"]
    if AUTH != "ship":  # (the application's other scenarios ship it then)
        assert not [p for d in spark_cluster.worker_dirs
                    for p in (d / one_app.app_id).rglob("*.key")]


def test_batch_read(spark_cluster: SparkCluster, one_app: OneApp) -> None:
    res = one_app.results["batch_read"]
    chans = channels(one_app.eps["cbatch"])
    assert res["count"] == 20_000
    assert res["distinct"] == 20_000
    assert res["per_channel"] == {ch: [5000, 1, 5000] for ch in chans}
    parts = res["partitions"]
    assert len(parts) == 8 and sum(n for _, n in parts) == 20_000
    # The read ran in executors, on both workers.
    assert {spark_cluster.worker_of(cwd) for cwd, _ in parts} == {0, 1}, parts
    check_key_copies(spark_cluster, one_app.app_id)


def test_stream_into_transactional_sink(spark_cluster: SparkCluster, one_app: OneApp,
                                        cluster_client: Any) -> None:
    res = one_app.results["stream_drain"]
    ep = one_app.eps["cdrain"]
    chans, out = channels(ep), f"{ep}out/v1/sink"
    assert res["rows"] == 20_000 and res["batches"] == 4, res
    landed = sink_keys(cluster_client, out)
    assert sum(landed.values()) == 20_000
    assert set(landed) == source_keys(cluster_client, chans)
    assert max(landed.values()) == 1
    check_key_copies(spark_cluster, one_app.app_id)


def test_tls_broker_with_a_cafile_shipped_by_name(spark_cluster: SparkCluster,
                                                  one_app: OneApp) -> None:
    """An authenticated TLS broker; its CA file sits beside the key (executors cannot see
    it there) and reaches them through addFile, named by its bare name."""
    res = one_app.results["tls_read_and_stream"]
    ep = one_app.eps["ctls"]
    assert res["count"] == 2000 and res["rows"] == 2000, res
    with one_app.tls_broker.connect_sync("spark-cluster-tests") as c:
        landed = sink_keys(c, f"{ep}out/v1/sink")
    assert len(landed) == 2000 and max(landed.values()) == 1
    check_key_copies(spark_cluster, one_app.app_id)


def test_stream_survives_a_killed_worker(spark_cluster: SparkCluster, run_driver: RunDriver,
                                         job_args: dict[str, Any], cluster_client: Any,
                                         tmp_path: Path) -> None:
    ep = prefix("ckill")
    chans, out = channels(ep), f"{ep}out/v1/sink"
    victim = spark_cluster.workers[0]
    request, done = tmp_path / "kill-request", tmp_path / "kill-done"
    stop = threading.Event()
    killed: dict[str, Any] = {}

    def killer() -> None:
        # The driver asks (a file) once a batch's tasks run on both executors; pytest,
        # which started the worker, kills its whole process group with SIGKILL.
        while not stop.wait(0.02):
            if request.exists():
                killed["pid"] = victim.pid
                victim.kill()
                killed["returncode"] = victim.proc.returncode if victim.proc else None
                done.write_text("killed")
                return

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        res = run_driver("stream_kill", {
            **job_args, "auth": AUTH, "pattern": f"{ep}/v1/*", "channels": chans,
            "out": out, "writer_id": f"w-{ep}", "rounds": 4, "per_round": 1250,
            "per_batch": 4000, "per_partition": 250, "trigger": "500 milliseconds",
            "kill_request": str(request), "kill_done": str(done),
            "victim_pgid": victim.pid}, 200)  # its own session: the group is its pid
    finally:
        stop.set()
        thread.join(10)
        spark_cluster.restart_worker(0)  # the next tests get two workers again
    assert killed.get("returncode") == -9, killed
    assert res["total"] == 20_000
    assert res["executors_left"] == 1, res  # the lost executor was not replaced meanwhile
    # The kill hit work in flight: tasks of the killed executor failed and were rerun.
    assert res["tasks"]["failed"] >= 1, res
    landed = sink_keys(cluster_client, out)
    expected = source_keys(cluster_client, chans)
    assert len(expected) == 20_000
    missing, extra = expected - set(landed), set(landed) - expected
    duplicated = {k: n for k, n in landed.items() if n > 1}
    assert (len(missing), len(extra), len(duplicated)) == (0, 0, 0), (
        sorted(missing)[:5], sorted(extra)[:5], list(duplicated.items())[:5])
    check_key_copies(spark_cluster, res["app_id"])


def test_no_secret_reaches_plans_ui_event_log_or_logs(spark_cluster: SparkCluster,
                                                     run_driver: RunDriver,
                                                     job_args: dict[str, Any],
                                                     cluster_client: Any,
                                                     tmp_path: Path) -> None:
    """The executors' credential travels inside the pickled reader/writer only: not in
    explain() output, the UI's REST answers, the event log or the driver's log (at
    INFO); a brokerToken option is redacted by Spark's own redaction."""
    ep = prefix("credact")
    publish(cluster_client, channels(ep)[:2], 200)
    token = f"broker-token-{uuid.uuid4().hex}"
    events = tmp_path / "events"
    events.mkdir()
    res = run_driver("redaction", {
        **job_args, "pattern": f"{ep}/v1/*", "out": f"{ep}out/v1/sink",
        "writer_id": f"w-{ep}", "broker_token": token, "ui": True, "log_level": "INFO",
        # uncompressed, so that it can be searched (compression hides nothing from a reader)
        "spark_conf": {"spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
                       "spark.eventLog.dir": str(events)}}, 180)
    assert res["count"] == 400 and res["rows"] == 400, res
    shown = (tmp_path / "shown.txt").read_text()
    logs = "".join(p.read_text(errors="replace") for p in tmp_path.glob("driver-*.stderr"))
    event_log = "".join(p.read_text(errors="replace") for p in events.rglob("*") if p.is_file())
    # Positive controls: each place does show the query.
    assert "format: minou" in shown and "INFO SparkContext" in logs
    assert "SQLExecutionStart" in event_log and "minou" in event_log
    executor_logs = "".join(p.read_text(errors="replace") for d in spark_cluster.worker_dirs
                            for p in (d / res["app_id"]).rglob("std*") if p.is_file())
    assert "Executor" in executor_logs  # their logs are there, and at INFO
    key_body = "".join(spark_cluster.job_key.read_text().splitlines()[1:-1])
    for name, text in (("plans and UI", shown), ("driver log", logs),
                       ("event log", event_log), ("executors' logs", executor_logs)):
        assert "mdc1." not in text, f"a credential in the {name}"
        assert token not in text, f"the broker token in the {name}"
        assert key_body not in text, f"the private key in the {name}"


def test_a_broker_unreachable_from_executors_only_is_named(spark_cluster: SparkCluster,
                                                          run_driver: RunDriver,
                                                          job_args: dict[str, Any],
                                                          cluster_broker: Any,
                                                          cluster_client: Any) -> None:
    ep = prefix("cunreach")
    publish(cluster_client, channels(ep)[:1], 10)
    url = cluster_broker.url.replace("127.0.0.1", SPLIT_NAME)
    res = run_driver("unreachable", {
        **job_args, "brokers": url, "pattern": f"{ep}/v1/*",
        "spark_conf": {"spark.task.maxFailures": "1"}}, 150, split_dns=True)
    assert res["rows"] is None, res
    error = res["error"]
    assert f"cannot reach the broker at {url}" in error, error
    assert "executor host" in error and "the driver reached it" in error, error
