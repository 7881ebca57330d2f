#!/usr/bin/env python3
"""The Spark rows of bench/minou_bench.py (test f), run in a subprocess of the bench so
that the bench's own process never imports pyspark or starts a JVM.

One SparkSession (local[2]) for the three rows, set up as the research report's
pitfalls say (P2 workers run this interpreter, P3 loopback only, no UI, 2 shuffle
partitions, log level ERROR, spark.stop() at the end):

  spark_read           batch read of the N messages the bench pre-filled into
                       bench/v1/q (about 100 B of JSON each): one query that counts the
                       rows and materialises every payload (count(*), sum(length(payload))),
                       after a warm-up read of 1,000 rows (the first Python data source
                       query of a session pays a one-off of seconds)
  spark_stream         streaming drain of the same N, availableNow, maxRecordsPerBatch
                       50,000, payload passed through (no from_json) to the minou sink in
                       transactional mode (writerId); rows/s over the wall time from
                       start() to the end of awaitTermination(), query start included
  spark_batch_latency  median micro-batch duration (triggerExecution) of a passthrough
                       query with trigger processingTime=0 while a producer (a child process
                       of this one) publishes --rate msg/s for --duration s

CPU per row: the broker process (pid given), this process tree (driver, JVM, Python
workers; the producer's own CPU taken out) and the whole machine, from /proc.

Prints one line ``RESULT {json}`` on stdout at the end; everything else goes to stderr.

    python bench/spark_bench.py --url minou://127.0.0.1:PORT --client-id bench-spark-1 \
        --key-file KEY --workdir DIR [--broker-pid PID] [-n 100000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHANNEL = "bench/v1/q"  # what the bench pre-filled (bench_clients.CHANNEL)
OUT = "bench/v1/spark-out"
LIVE = "bench/v1/spark-live"
LIVE_OUT = "bench/v1/spark-live-out"
TICK = os.sysconf("SC_CLK_TCK")


def say(msg: str) -> None:
    print(f"  [spark] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- CPU accounting
def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime+stime+cutime+cstime in s) of one process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), sum(int(x) for x in fields[11:15]) / TICK


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (reaped children are in their
    parent's cutime/cstime)."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None:
                stats[int(entry)] = s
    keep, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in keep:
                keep.add(pid)
                frontier.append(pid)
    return sum(stats[p][1] for p in keep if p in stats)


def proc_cpu_s(pid: int | None) -> float | None:
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def host_cpu() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class Phase:
    """Wall time and CPU of one row."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid

    def __enter__(self) -> Phase:
        self.t0 = time.monotonic()
        self.b0, self.s0, self.h0 = proc_cpu_s(self.broker_pid), tree_cpu_s(os.getpid()), \
            host_cpu()
        self.extra_cpu = 0.0  # CPU to take out of the Spark tree (the producer)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self.t0
        b1, s1, h1 = proc_cpu_s(self.broker_pid), tree_cpu_s(os.getpid()), host_cpu()
        self.cpu = {
            "server": round(100 * (b1 - self.b0) / self.wall, 1)
            if b1 is not None and self.b0 is not None else None,
            "clients": round(100 * (s1 - self.s0 - self.extra_cpu) / self.wall, 1),
            "host_busy_cores": round((os.cpu_count() or 1) * (h1[0] - self.h0[0])
                                     / max(1, h1[1] - self.h0[1]), 2),
        }


# ---------------------------------------------------------------- the producer
def produce(args: argparse.Namespace) -> None:
    """Child process: publish ``rate`` msg/s of ~100 B JSON for ``duration`` s."""
    import minou

    body = "x" * 98  # a JSON string of 100 bytes, as the pre-fill's
    client = minou.connect_sync(args.url, client_id=args.client_id, key=args.key_file,
                                reconnect=False)
    total = int(args.rate * args.duration)
    sent = 0
    receipts = []
    t0 = time.monotonic()
    while sent < total:
        due = min(total, int((time.monotonic() - t0) * args.rate) + 1)
        if due > sent:
            receipts += client.send_many([(LIVE, body)] * (due - sent))
            sent = due
        time.sleep(max(0.0, t0 + sent / args.rate - time.monotonic()))
    t1 = time.monotonic()
    client.close()
    usage = os.times()
    print(json.dumps({"sent": sent, "rate": round(sent / (t1 - t0)), "receipts": len(receipts),
                      "cpu_s": usage.user + usage.system}), flush=True)


# ---------------------------------------------------------------- the Spark rows
def progress_stats(progress: list[dict[str, Any]]) -> dict[str, Any]:
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    durs = [p["durationMs"]["triggerExecution"] for p in batches]
    rows = sum(p["numInputRows"] for p in batches)
    return {"batches": len(batches), "rows": rows, "durs_ms": durs,
            "rows_per_s_in_batches": round(rows / (sum(durs) / 1000)) if durs else None,
            "median_batch_ms": statistics.median(durs) if durs else None}


def run_spark(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import minou

    res: dict[str, Any] = {"cpu_pct": {}}
    work = Path(args.workdir)
    opts = {"brokers": args.url, "clientId": args.client_id, "keyFile": args.key_file}
    t0 = time.monotonic()
    spark = (SparkSession.builder.master("local[2]").appName("minou-bench")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.stopTimeout", "10s")
             .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    res["spark_session_s"] = round(time.monotonic() - t0, 2)
    say(f"session up in {res['spark_session_s']} s")
    client = minou.connect_sync(args.url, client_id=args.client_id, key=args.key_file,
                                reconnect=False)
    try:
        first, nxt = client.offsets(CHANNEL)[CHANNEL]
        res["spark_input_depth"] = nxt - first

        # warm-up: the first Python data source query of a session pays seconds once
        t0 = time.monotonic()
        (spark.read.format("minou").options(**opts).option("channel", CHANNEL)
         .option("endingOffsets", json.dumps({CHANNEL: first + 1000})).load().count())
        res["spark_warmup_s"] = round(time.monotonic() - t0, 2)
        say(f"warm-up read of 1,000 rows in {res['spark_warmup_s']} s")

        # --- spark_read
        with Phase(args.broker_pid) as ph:
            row = (spark.read.format("minou").options(**opts).option("channel", CHANNEL)
                   .load().selectExpr("count(*) AS n", "sum(length(payload)) AS bytes")
                   .first())
        res["spark_read"] = round(row["n"] / ph.wall)
        res.update(spark_read_count=row["n"], spark_read_bytes=row["bytes"],
                   spark_read_s=round(ph.wall, 2))
        res["cpu_pct"]["spark_read"] = ph.cpu
        say(f"batch read {row['n']:,} rows ({row['bytes']:,} B of payload) in {ph.wall:.2f} s"
            f" = {res['spark_read']:,} rows/s; CPU% {ph.cpu}")

        # --- spark_stream
        with Phase(args.broker_pid) as ph:
            q = (spark.readStream.format("minou").options(**opts).option("channel", CHANNEL)
                 .option("startingOffsets", "earliest")
                 .option("maxRecordsPerBatch", str(args.max_per_batch)).load()
                 .select("payload")
                 .writeStream.format("minou").options(**opts).option("channel", OUT)
                 .option("sinkMode", "transactional").option("writerId", "bench-spark-drain")
                 .option("checkpointLocation", str(work / "cp-drain"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(args.timeout)
            if q.isActive:
                q.stop()
                raise RuntimeError(f"the drain did not finish in {args.timeout:g} s")
            if q.exception() is not None:
                raise RuntimeError(f"the drain failed: {q.exception()}")
        st = progress_stats(q.recentProgress)
        f_out, n_out = client.offsets(OUT).get(OUT, (1, 1))
        res["spark_stream"] = round(st["rows"] / ph.wall)
        res.update(spark_stream_rows=st["rows"], spark_stream_out=n_out - f_out,
                   spark_stream_s=round(ph.wall, 2), spark_stream_batches=st["batches"],
                   spark_stream_in_batches=st["rows_per_s_in_batches"],
                   spark_stream_median_batch_ms=st["median_batch_ms"])
        res["cpu_pct"]["spark_stream"] = ph.cpu
        say(f"streaming drain {st['rows']:,} rows -> {n_out - f_out:,} in {OUT}, "
            f"{st['batches']} batches, {ph.wall:.2f} s wall = {res['spark_stream']:,} rows/s "
            f"({st['rows_per_s_in_batches']} rows/s in batches, median batch "
            f"{st['median_batch_ms']} ms); CPU% {ph.cpu}")

        # --- spark_noop and spark_rate_noop: the Python data-source path against Spark's
        # own source in the same session. Both are streams into the noop sink: minou's
        # drain of the N messages (availableNow), and Spark's rate source for as long,
        # at more rows a second than it can take (its rows/s is what Spark itself does).
        with Phase(args.broker_pid) as ph:
            q = (spark.readStream.format("minou").options(**opts).option("channel", CHANNEL)
                 .option("startingOffsets", "earliest")
                 .option("maxRecordsPerBatch", str(args.max_per_batch)).load()
                 .select("payload").writeStream.format("noop")
                 .option("checkpointLocation", str(work / "cp-noop"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(args.timeout)
        st = progress_stats(q.recentProgress)
        res["spark_noop"] = round(st["rows"] / ph.wall)
        res["cpu_pct"]["spark_noop"] = ph.cpu
        seconds = max(5.0, ph.wall)
        with Phase(args.broker_pid) as ph:
            q = (spark.readStream.format("rate").option("rowsPerSecond", 2_000_000)
                 .option("numPartitions", 2).load()
                 .selectExpr("repeat('x', 100) AS payload").writeStream.format("noop")
                 .option("checkpointLocation", str(work / "cp-rate"))
                 .trigger(processingTime="0 seconds").start())
            time.sleep(seconds)
            q.stop()
        st_rate = progress_stats(q.recentProgress)
        res["spark_rate_noop"] = round(st_rate["rows"] / ph.wall)
        res["cpu_pct"]["spark_rate_noop"] = ph.cpu
        res["spark_vs_rate"] = round(res["spark_noop"] / max(1, res["spark_rate_noop"]), 3)
        say(f"minou -> noop {res['spark_noop']:,} rows/s; Spark's rate -> noop "
            f"{res['spark_rate_noop']:,} rows/s over {ph.wall:.1f} s: ratio "
            f"{res['spark_vs_rate']}")

        # --- spark_batch_latency
        client.send(LIVE, "seed")  # the channel exists before the query starts
        q = (spark.readStream.format("minou").options(**opts).option("channel", LIVE)
             .option("startingOffsets", "earliest").load().select("payload")
             .writeStream.format("minou").options(**opts).option("channel", LIVE_OUT)
             .option("sinkMode", "transactional").option("writerId", "bench-spark-live")
             .option("checkpointLocation", str(work / "cp-live"))
             .trigger(processingTime="0 seconds").start())
        try:
            t_end = time.monotonic() + args.timeout
            while not any(p["numInputRows"] for p in q.recentProgress):  # the seed batch
                if q.exception() is not None or time.monotonic() > t_end:
                    raise RuntimeError(f"the live query did not start: {q.exception()}")
                time.sleep(0.1)
            seen = len(q.recentProgress)
            with Phase(args.broker_pid) as ph:
                prod = subprocess.run(
                    [sys.executable, __file__, "produce", "--url", args.url,
                     "--client-id", args.client_id, "--key-file", args.key_file,
                     "--rate", str(args.rate), "--duration", str(args.duration)],
                    capture_output=True, text=True, timeout=args.duration + 120, check=True)
                produced = json.loads(prod.stdout.strip().splitlines()[-1])
                ph.extra_cpu = produced["cpu_s"]
                want = 1 + produced["sent"]  # the seed, then the producer's messages
                while sum(p["numInputRows"] for p in q.recentProgress) < want:
                    if q.exception() is not None or time.monotonic() > t_end:
                        raise RuntimeError(f"the live query fell behind: {q.exception()}")
                    time.sleep(0.05)
            progress = q.recentProgress[seen:]
        finally:
            q.stop()
        st = progress_stats(progress)
        durs = sorted(st["durs_ms"])
        res["spark_batch_latency"] = round(st["median_batch_ms"] / 1000, 3) if durs else None
        res.update(spark_lat_batches=st["batches"], spark_lat_rows=st["rows"],
                   spark_lat_rate=produced["rate"],
                   spark_lat_p90_ms=durs[min(len(durs) - 1, int(0.9 * len(durs)))]
                   if durs else None, spark_lat_max_ms=durs[-1] if durs else None,
                   spark_lat_rows_per_batch=round(st["rows"] / max(1, st["batches"])))
        phases = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
        res["spark_lat_phases_ms"] = {
            k: statistics.median(p["durationMs"].get(k, 0) for p in progress
                                 if p["numInputRows"] > 0) for k in phases} if durs else {}
        res["cpu_pct"]["spark_batch_latency"] = ph.cpu
        say(f"live: {produced['sent']:,} msgs at {produced['rate']} msg/s, {st['batches']} "
            f"batches of ~{res['spark_lat_rows_per_batch']} rows, median "
            f"{st['median_batch_ms']} ms, p90 {res['spark_lat_p90_ms']} ms, max "
            f"{res['spark_lat_max_ms']} ms; phases {res['spark_lat_phases_ms']}; CPU% {ph.cpu}")
    finally:
        client.close()
        t0 = time.monotonic()
        spark.stop()
        res["spark_stop_s"] = round(time.monotonic() - t0, 2)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="spark", choices=["spark", "produce"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--key-file", required=True)
    ap.add_argument("--workdir", default=".")
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--max-per-batch", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    if args.mode == "produce":
        produce(args)
        return 0
    res = run_spark(args)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
