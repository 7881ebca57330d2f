#!/usr/bin/env python3
"""What partition planning buys the Spark source: one SparkSession (local[2]) drains
the same N messages into the noop sink (availableNow, rows/s over the wall time) with
several read options, medians of --runs, against a broker of its own.

    .venv/bin/python bench/spark_partitions.py [-n 200000] [--runs 3]

Needs the spark extra (pyspark, pyarrow) and Java 17 (`make spark-demo` installs both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CHANNEL = "bench/v1/parts"
CASES: list[tuple[str, dict[str, str]]] = [
    ("defaults (maxRecordsPerPartition 50,000)", {}),
    ("maxRecordsPerPartition = N / 2 (a partition per core)", {"per": "half"}),
    ("maxRecordsPerPartition = N / 8", {"per": "eighth"}),
    ("one range, minPartitions = 2", {"per": "all", "minPartitions": "2"}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import minou
    from bench_servers import MinouBroker
    from minou.auth import keys

    work = Path(tempfile.mkdtemp(prefix="minou-spark-parts-"))
    broker = MinouBroker(work)
    url = broker.start()
    try:
        key, _ = keys.save(keys.generate(), work, "bench-spark-parts")
        with minou.connect_sync(url, client_id="bench-spark-parts", key=str(key)) as c:
            for i in range(0, args.n, 1000):
                c.send_many([(CHANNEL, {"i": j, "pad": "x" * 60})
                             for j in range(i, min(i + 1000, args.n))])
        spark = (SparkSession.builder.master("local[2]")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        opts = {"brokers": url, "clientId": "bench-spark-parts", "keyFile": str(key)}

        def drain(more: dict[str, str]) -> int:
            t0 = time.monotonic()
            q = (spark.readStream.format("minou").options(**opts).option("channel", CHANNEL)
                 .options(**more).load().select("payload").writeStream.format("noop")
                 .option("checkpointLocation", tempfile.mkdtemp(dir=work))
                 .trigger(availableNow=True).start())
            q.awaitTermination(600)
            return round(args.n / (time.monotonic() - t0))

        drain({})  # the first Python data source query of a session pays seconds once
        print(f"| read options ({args.n:,} x ~80 B, local[2] -> noop) | rows/s, median of "
              f"{args.runs} | runs |\n|---|---:|---|")
        for label, case in CASES:
            more = {k: v for k, v in case.items() if k != "per"}
            per = {"half": args.n // 2, "eighth": args.n // 8, "all": args.n}.get(
                case.get("per", ""))
            if per:
                more["maxRecordsPerPartition"] = str(per)
            runs = [drain(more) for _ in range(args.runs)]
            print(f"| {label} | {statistics.median(runs):,} | {runs} |", flush=True)
        spark.stop()
    finally:
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
