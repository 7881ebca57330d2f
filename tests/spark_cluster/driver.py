#!/usr/bin/env python3
"""A Spark driver for tests/spark_cluster, run as a subprocess of pytest (one
SparkContext per process, and pytest's own process may hold a local one).

    python driver.py SCENARIO 'JSON ARGS'

Connects to the standalone master in ``$MINOU_SPARK_MASTER``, runs one scenario (a
function below, by name), stops the session and prints one JSON line on stdout, last:
what the scenario returns, and ``app_id`` (the executors' directories are named by it).
``a+b`` runs several in one application, in turn: ARGS then holds each one's arguments
under its name (and the session's, ``ui``/``spark_conf``/``log_level``, at the top), the
result each one's result.
Everything else (Spark's log included) goes to stderr.

Every scenario gets the broker and the job's identity as the driver holds it:
``brokers``, ``client_id``, ``key_file`` (a path only the driver can read: the
executors' view of its directory is an empty tmpfs), ``tls_fingerprint`` / ``cafile``,
``driver_keys`` and ``workdir``; optionally ``ui`` (Spark's UI on) and ``spark_conf``
(more session settings). How the connector is told who the job is lives in one
place, ``connector_options``: the ``auth`` argument names the way (see ``AUTH``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Args = dict[str, Any]
SCENARIOS: dict[str, Callable[[Any, Args], dict[str, Any]]] = {}


def scenario(fn: Callable[[Any, Args], dict[str, Any]]) -> Callable[[Any, Args], dict[str, Any]]:
    SCENARIOS[fn.__name__] = fn
    return fn


T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[driver +{time.monotonic() - T0:.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the session
def session(app: str, ui: bool = False, conf: dict[str, str] | None = None) -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(os.environ["MINOU_SPARK_MASTER"]).appName(app)
               .config("spark.executor.memory", "512m")
               .config("spark.executor.cores", "1")
               .config("spark.cores.max", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "true" if ui else "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.streaming.stopTimeout", "10s")
               .config("spark.sql.streaming.numRecentProgressUpdates", "1000"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    say("session up")
    return spark


def executor_count(spark: Any) -> int:
    # getExecutorMemoryStatus lists the block managers: the executors and the driver's.
    return int(spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()) - 1


def wait_executors(spark: Any, n: int, timeout: float = 90.0) -> None:
    """Until ``n`` executors are registered, so that work spreads over both workers."""
    deadline = time.monotonic() + timeout
    while executor_count(spark) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {executor_count(spark)} of {n} executors registered "
                               f"in {timeout:g} s")
        time.sleep(0.1)
    say(f"{n} executors registered")


# ---------------------------------------------------------------- authentication
# Each way returns the options that say how tasks prove who the job is, and ships what
# it must. The tests pick one by name (test_cluster.AUTH); switching the whole suite is
# changing that name. ``executorAuth`` is the connector's switch between the key read by
# every executor ("keyFile") and a delegated credential the driver issues ("credential",
# nothing shipped); a connector without that option ignores it and reads keyFile.
def _ship(spark: Any, path: str) -> str:
    """``addFile``, and the option names the driver's path: the driver reads it there,
    executors (which cannot) find the shipped copy by its name with SparkFiles.get.

    Not the bare name: PySpark 4.3 gives the Python process that plans a *streaming*
    source on the driver ``<SparkFiles root>/streaming_job`` as its SparkFiles root, where
    addFile's copy is not, so a bare name fails there (batch reads are fine)."""
    spark.sparkContext.addFile(path)
    return path


def auth_ship_key(spark: Any, args: Args) -> dict[str, str]:
    """The key shipped to every executor with addFile; tasks authenticate with it."""
    out = {"keyFile": _ship(spark, args["key_file"]), "executorAuth": "keyFile"}
    if args.get("cafile"):
        out["cafile"] = _ship(spark, args["cafile"])
    return out


def auth_driver_path(spark: Any, args: Args) -> dict[str, str]:
    """The driver's own paths, shipped nowhere, and tasks told to read the key: they
    cannot (the negative control of the mask)."""
    out = {"keyFile": args["key_file"], "executorAuth": "keyFile"}
    if args.get("cafile"):
        out["cafile"] = args["cafile"]
    return out


def auth_credential(spark: Any, args: Args) -> dict[str, str]:
    """The key stays on the driver (its path, shipped nowhere); the connector issues a
    delegated credential there and tasks authenticate with it. Only a cafile (public,
    and read by tasks) is shipped, and named by its bare name (found with SparkFiles
    on the driver's planning processes and on executors alike)."""
    out = {"keyFile": args["key_file"]}
    if args.get("cafile"):
        spark.sparkContext.addFile(args["cafile"])
        out["cafile"] = os.path.basename(args["cafile"])
    return out


AUTH: dict[str, Callable[[Any, Args], dict[str, str]]] = {
    "ship": auth_ship_key,
    "path": auth_driver_path,
    "credential": auth_credential,
}


def connector_options(spark: Any, args: Args) -> dict[str, str]:
    """Reader/writer options: where the broker is and who the job is (``args["auth"]``,
    a key of AUTH, default ``credential``)."""
    opts = {"brokers": args["brokers"], "clientId": args["client_id"]}
    if args.get("tls_fingerprint"):
        opts["tlsFingerprint"] = args["tls_fingerprint"]
    opts.update(AUTH[args.get("auth", "credential")](spark, args))
    return opts


def job_client(args: Args) -> Any:
    """The driver's own broker client, with the key as only the driver can read it."""
    import minou

    return minou.connect_sync(args["brokers"], client_id=args["client_id"],
                              key=args["key_file"], tls_fingerprint=args.get("tls_fingerprint"),
                              cafile=args.get("cafile"), reconnect=False)


# ---------------------------------------------------------------- helpers
def publish(client: Any, channels: list[str], per_channel: int, start: int = 0) -> int:
    for ch in channels:
        for lo in range(start, start + per_channel, 1000):
            hi = min(lo + 1000, start + per_channel)
            client.send_many([{"channel": ch, "payload": {"n": i, "ch": ch}, "key": f"k{i}"}
                              for i in range(lo, hi)])
    return per_channel * len(channels)


def sink_count(client: Any, channel: str) -> int:
    first, nxt = client.offsets(channel).get(channel, (1, 1))
    return nxt - first


def progress_rows(query: Any) -> tuple[int, int]:
    """(rows read, batches with rows) over the query's recent progress."""
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    return sum(p["numInputRows"] for p in batches), len(batches)


def failed_tasks(spark: Any, group: str) -> dict[str, int]:
    """Tasks and failed task attempts of every stage of the jobs of ``group``."""
    tracker = spark.sparkContext.statusTracker()
    stages: set[int] = set()
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        if info is not None:
            stages.update(info.stageIds)
    out = {"stages": len(stages), "tasks": 0, "failed": 0}
    for sid in stages:
        st = tracker.getStageInfo(sid)
        if st is not None:
            out["tasks"] += st.numTasks
            out["failed"] += st.numFailedTasks
    return out


def wait_for(what: str, predicate: Callable[[], bool], timeout: float,
             query: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if query is not None and query.exception() is not None:
            raise RuntimeError(f"the query failed while waiting for {what}: "
                               f"{query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def sink_pipeline(spark: Any, opts: dict[str, str], args: Args, **source: str) -> Any:
    """The source (pattern ``args["pattern"]``) -> JSON {src, seq, id} -> the transactional
    minou sink on ``args["out"]``; not started."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("minou").options(**opts) \
        .option("pattern", args["pattern"]).option("startingOffsets", "earliest")
    for key, value in source.items():
        reader = reader.option(key, value)
    df = reader.load().select(F.to_json(F.struct(
        F.col("channel").alias("src"), "seq", "id")).alias("payload"))
    return (df.writeStream.format("minou").options(**opts).option("channel", args["out"])
            .option("sinkMode", "transactional").option("writerId", args["writer_id"])
            .option("checkpointLocation", str(Path(args["workdir"]) / "checkpoint")))


# ---------------------------------------------------------------- scenarios
@scenario
def mask(spark: Any, args: Args) -> dict[str, Any]:
    """What executors see of the driver's key directory, from one task on each executor
    (a barrier stage of 2 tasks on 2 one-core executors), and what a read does when the
    key is named by the driver's path and shipped nowhere."""
    key, keys = os.path.realpath(args["key_file"]), os.path.realpath(args["driver_keys"])

    def probe(_rows: Iterator[Any]) -> Iterator[dict[str, Any]]:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        yield {"cwd": os.getcwd(), "pid": os.getpid(),
               "mnt_ns": os.readlink("/proc/self/ns/mnt"),
               "key_exists": os.path.exists(key), "listdir": sorted(os.listdir(keys)),
               "tmpfs_on_keys": any(m.split()[4] == keys and " - tmpfs " in m
                                    for m in mounts)}

    wait_executors(spark, 2)
    tasks = spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(probe) \
        .collect()
    say("probe done")
    driver = {"mnt_ns": os.readlink("/proc/self/ns/mnt"), "key_exists": os.path.exists(key),
              "listdir": sorted(os.listdir(keys))}
    error = None
    try:
        opts = connector_options(spark, {**args, "auth": "path"})
        rows = spark.read.format("minou").options(**opts).option("pattern", args["pattern"]) \
            .load().count()
    except Exception as exc:
        rows = None
        error = "\n".join(ln for ln in str(exc).splitlines() if "keyFile" in ln)[:4000] \
            or str(exc)[:4000]
    return {"tasks": tasks, "driver": driver, "unshipped_rows": rows,
            "unshipped_error": error}


@scenario
def batch_read(spark: Any, args: Args) -> dict[str, Any]:
    """A batch read of ``args["pattern"]``: rows per partition and where they ran, per
    channel count/min/max seq, and distinct (channel, seq)."""
    opts = connector_options(spark, args)
    wait_executors(spark, 2)
    df = (spark.read.format("minou").options(**opts).option("pattern", args["pattern"])
          .option("maxRecordsPerPartition", str(args.get("per_partition", 2500))).load())
    # One job (each reads the channels again): where each partition ran, its rows.
    parts = df.select("channel", "seq").rdd.mapPartitions(
        lambda rows: [(os.getcwd(), [(r[0], r[1]) for r in rows])]).collect()
    say("partitions read")
    keys = [k for _, rows in parts for k in rows]
    per_channel: dict[str, list[int]] = {}
    for ch, seq in keys:
        n, lo, hi = per_channel.get(ch, (0, seq, seq))
        per_channel[ch] = [n + 1, min(lo, seq), max(hi, seq)]
    return {"partitions": [(cwd, len(rows)) for cwd, rows in parts], "count": len(keys),
            "per_channel": per_channel, "distinct": len(set(keys))}


@scenario
def stream_drain(spark: Any, args: Args) -> dict[str, Any]:
    """availableNow from ``pattern`` into the transactional sink on ``out``."""
    opts = connector_options(spark, args)
    wait_executors(spark, 2)
    query = sink_pipeline(spark, opts, args,
                          maxRecordsPerBatch=str(args.get("per_batch", 5000))) \
        .trigger(availableNow=True).start()
    if not query.awaitTermination(args.get("query_timeout", 120)):
        query.stop()
        raise RuntimeError("the availableNow query did not finish")
    say("query finished")
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    rows, batches = progress_rows(query)
    return {"rows": rows, "batches": batches, "tasks": failed_tasks(spark, str(query.runId))}


@scenario
def stream_kill(spark: Any, args: Args) -> dict[str, Any]:
    """A processingTime query from ``channels`` into the sink while the driver publishes
    ``rounds`` rounds of ``per_round`` messages per channel. While a batch's tasks run on
    both executors (and more wait), the driver stops the worker's process group
    (SIGSTOP of ``victim_pgid``) and asks pytest to kill -9 it (writes ``kill_request``,
    waits for ``kill_done``), then publishes the rest. Stops once every
    message is in the sink and the source has nothing left."""
    opts = connector_options(spark, args)
    channels, rounds, per_round = args["channels"], args["rounds"], args["per_round"]
    total = len(channels) * rounds * per_round
    limit = float(args.get("query_timeout", 150))
    client = job_client(args)
    wait_executors(spark, 2)
    publish(client, channels, per_round, 0)
    query = sink_pipeline(spark, opts, args, maxRecordsPerBatch=str(args["per_batch"]),
                          maxRecordsPerPartition=str(args["per_partition"])) \
        .trigger(processingTime=args.get("trigger", "500 milliseconds")).start()
    group = str(query.runId)
    tracker = spark.sparkContext.statusTracker()
    kill: dict[str, Any] = {}
    try:
        wait_for("the first batch", lambda: progress_rows(query)[1] >= 1, limit, query)
        publish(client, channels, per_round, per_round)

        def busy() -> bool:
            """A stage of the query with a task on each executor and more to come."""
            for sid in tracker.getActiveStageIds():
                st = tracker.getStageInfo(sid)
                if st is not None and st.numActiveTasks >= 2 and \
                        st.numTasks - st.numCompletedTasks - st.numActiveTasks >= 1:
                    kill.update(stage=sid, tasks=st.numTasks, done=st.numCompletedTasks,
                                active=st.numActiveTasks)
                    return True
            return False

        wait_for("a stage with both executors busy", busy, limit, query)
        # Frozen at once, so the task it runs cannot end before pytest's kill lands (on
        # a loaded machine it sometimes did: the kill then hit an idle executor).
        os.killpg(int(args["victim_pgid"]), signal.SIGSTOP)
        Path(args["kill_request"]).write_text(json.dumps(kill))
        say(f"asking for the kill: {kill}")
        wait_for("the worker's kill", lambda: Path(args["kill_done"]).exists(), 30)
        say("killed")
        kill["rows_before"] = progress_rows(query)[0]
        wait_for("the driver to lose the executor", lambda: executor_count(spark) == 1, 60,
                 query)
        for r in range(2, rounds):
            publish(client, channels, per_round, r * per_round)
            seen = progress_rows(query)[1]
            wait_for(f"a batch after round {r}", lambda s=seen: progress_rows(query)[1] > s,
                     limit, query)
        wait_for("every message in the sink", lambda: sink_count(client, args["out"]) >= total,
                 limit, query)

        def drained() -> bool:
            status = query.status
            return not status["isDataAvailable"] and not status["isTriggerActive"]

        wait_for("the query to run out of input", drained, limit, query)
        executors_left = executor_count(spark)
    finally:
        query.stop()
        client.close()
    if query.exception() is not None:
        raise RuntimeError(f"the query failed: {query.exception()}")
    rows, batches = progress_rows(query)
    return {"total": total, "rows": rows, "batches": batches, "kill": kill,
            "executors_left": executors_left, "tasks": failed_tasks(spark, group)}


@scenario
def tls_read_and_stream(spark: Any, args: Args) -> dict[str, Any]:
    """Against a TLS broker (cafile shipped by name): a batch read, then availableNow
    into the transactional sink."""
    opts = connector_options(spark, args)
    wait_executors(spark, 2)
    count = spark.read.format("minou").options(**opts).option("pattern", args["pattern"]) \
        .load().count()
    say(f"batch read {count}")
    query = sink_pipeline(spark, opts, args).trigger(availableNow=True).start()
    if not query.awaitTermination(120) or query.exception() is not None:
        query.stop()
        raise RuntimeError(f"the TLS stream failed: {query.exception()}")
    rows, _ = progress_rows(query)
    return {"count": count, "rows": rows}


@scenario
def redaction(spark: Any, args: Args) -> dict[str, Any]:
    """A batch read and an availableNow stream into the sink with an event log and the
    UI on; writes every place Spark shows a query (plans, UI REST answers) to
    ``<workdir>/shown.txt`` for the test to search for secrets."""
    opts = {**connector_options(spark, args), "brokerToken": args["broker_token"]}
    wait_executors(spark, 2)
    shown: list[str] = []
    df = spark.read.format("minou").options(**opts).option("pattern", args["pattern"]).load()
    count = df.count()
    shown.append(df._jdf.queryExecution().toString())
    query = sink_pipeline(spark, opts, args).trigger(availableNow=True).start()
    if not query.awaitTermination(120) or query.exception() is not None:
        query.stop()
        raise RuntimeError(f"the stream failed: {query.exception()}")
    shown.append(query._jsq.explainInternal(True))
    app, ui = spark.sparkContext.applicationId, spark.sparkContext.uiWebUrl
    for path in (f"applications/{app}/sql?details=true&planDescription=true",
                 f"applications/{app}/environment", f"applications/{app}/jobs",
                 f"applications/{app}/stages?details=true"):
        shown.append(ui_json(f"{ui}/api/v1/{path}"))
    Path(args["workdir"], "shown.txt").write_text("\n".join(shown))
    rows, _ = progress_rows(query)
    return {"count": count, "rows": rows, "shown_bytes": sum(len(s) for s in shown)}


def ui_json(url: str, attempts: int = 3) -> str:
    """A Spark UI REST answer: its server answers slowly while the event log is written
    on a loaded machine (one make test saw a 10 s read time out), so a few tries."""
    import urllib.request

    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                return str(resp.read().decode(errors="replace"))
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@scenario
def unreachable(spark: Any, args: Args) -> dict[str, Any]:
    """A batch read whose broker URL the driver reaches and the executors do not."""
    opts = {**connector_options(spark, args), "reconnectTimeout": "2"}
    wait_executors(spark, 2)
    try:
        rows = spark.read.format("minou").options(**opts).option(
            "pattern", args["pattern"]).load().count()
        return {"rows": rows, "error": None}
    except Exception as exc:
        lines = [ln for ln in str(exc).splitlines() if "MinouSparkError" in ln]
        return {"rows": None, "error": "\n".join(lines)[:4000] or str(exc)[:4000]}


def main() -> int:
    name, args = sys.argv[1], json.loads(sys.argv[2])
    names = name.split("+")
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario {unknown[0]!r}; known: "
                         f"{', '.join(sorted(SCENARIOS))}")
    spark = session(f"minou-cluster-{name}", ui=bool(args.get("ui")),
                    conf=args.get("spark_conf"))
    if args.get("log_level"):
        spark.sparkContext.setLogLevel(args["log_level"])
    try:
        if len(names) == 1:
            result = SCENARIOS[name](spark, args)
        else:  # one application, each scenario with its own arguments, in turn
            result = {}
            for n in names:
                result[n] = SCENARIOS[n](spark, args[n])
                say(f"part {n} done")
        result["app_id"] = spark.sparkContext.applicationId
        say(f"scenario {name} done")
    finally:
        spark.stop()
        say("session stopped")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
