"""``make spark-demo``: a broker, some orders, the Spark pipeline, the results.

Starts a development broker on a temporary data dir (loopback, free ports), publishes
orders for a few customers (and a few broken ones), runs examples/spark_orders.py on a
local Spark, and prints what arrived in ``reports/v1/revenue`` and the dead letters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def start_broker(data: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "minou", "start", "--dev", "--data", str(data), "--port", "0",
         "--http-port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True)
    url = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"\s+native\s+(\S+)", line)
        if m:
            url = m.group(1)
        if "stop with" in line:
            return proc, url
    raise SystemExit("the broker did not start")


def feed(url: str, n: int) -> int:
    import minou

    rng = random.Random(7)
    customers = ["ada", "grace", "linus", "barbara", "ken"]
    items: list[tuple[str, object]] = []
    for i in range(n):
        if i % 97 == 0:
            items.append((f"orders/v1/{i % 3}", {"oops": "no customer"}))
        else:
            items.append((f"orders/v1/{i % 3}", {"customer": rng.choice(customers),
                                                 "total": round(rng.uniform(1, 100), 2)}))
    with minou.connect_sync(url) as client:
        client.send_many(items)
    return len(items)


def spark_session():  # type: ignore[no-untyped-def]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("minou-spark-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def shown(payload: object) -> str:
    """A dead letter's payload as text: the pipeline dead-letters orders as they came, in
    binary (JSON or not), so they read back as bytes."""
    if isinstance(payload, bytes):
        return payload.decode("utf-8", "replace")
    return json.dumps(payload)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="orders to publish")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import spark_orders

    import minou

    with tempfile.TemporaryDirectory(prefix="minou-spark-demo-") as tmp:
        proc, url = start_broker(Path(tmp) / "data")
        try:
            t0 = time.monotonic()
            print(f"broker at {url}; publishing {args.n} orders...", flush=True)
            feed(url, args.n)
            spark = spark_session()
            try:
                pipeline = spark_orders.build(spark, argparse.Namespace(
                    brokers=url, checkpoint=f"{tmp}/ckpt", key=None, client_id="spark-orders",
                    writer_id="demo", batch_size=500))
                pipeline.start().awaitTermination()
            finally:
                spark.stop()
            with minou.connect_sync(url) as client:
                reports, _ = client.read("reports/v1/revenue", limit=10_000)
                dead, _ = client.read("_dead/orders/v1/spark", limit=10_000)
            # Each report row is one micro-batch's revenue for a (minute, customer): the
            # totals are their sums.
            totals: dict[tuple[str, str], list[float]] = {}
            for m in reports:
                t = totals.setdefault((m.payload["minute"], m.payload["customer"]), [0, 0.0])
                t[0] += m.payload["orders"]
                t[1] += m.payload["revenue"]
            print(f"\n{'minute':<26} {'customer':<10} {'orders':>6} {'revenue':>10}")
            for (minute, customer), (orders, revenue) in sorted(totals.items()):
                print(f"{minute:<26} {customer:<10} {orders:>6} {revenue:>10.2f}")
            total = sum(int(t[0]) for t in totals.values())
            print(f"\n{len(reports)} report rows covering {total} orders; {len(dead)} invalid "
                  f"orders dead-lettered (e.g. {shown(dead[0].payload) if dead else '-'})"
                  f"; {time.monotonic() - t0:.1f} s")
        finally:
            proc.terminate()
            proc.wait(20)


if __name__ == "__main__":
    main()
