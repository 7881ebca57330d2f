"""examples/spark_orders.py runs as documented: orders in, revenue out, invalid rows
dead-lettered, and a rerun of the same batches writes nothing twice."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_example_pipeline(spark, minou_broker, client, opts, tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import spark_orders
    finally:
        sys.path.remove(str(EXAMPLES))
    orders = [(f"orders/v1/{i % 2}", {"customer": ["ada", "ken"][i % 2], "total": 10.0})
              for i in range(40)]
    orders += [("orders/v1/0", {"no": "customer"}), ("orders/v1/1", "not an object"),
               ("orders/v1/0", b"not json at all")]  # a raw message: dead-lettered as is
    client.send_many(orders)
    args = argparse.Namespace(brokers=minou_broker.url, checkpoint=str(tmp_path / "ckpt"),
                              key=opts["keyFile"], client_id=opts["clientId"],
                              writer_id="example-test", batch_size=15)
    spark_orders.build(spark, args).start().awaitTermination()

    def totals() -> dict[str, tuple[int, float]]:
        out: dict[str, tuple[int, float]] = {}
        reports, _ = client.read("reports/v1/revenue", limit=10_000)
        for m in reports:
            n, r = out.get(m.payload["customer"], (0, 0.0))
            out[m.payload["customer"]] = (n + m.payload["orders"], r + m.payload["revenue"])
        return out

    assert totals() == {"ada": (20, 200.0), "ken": (20, 200.0)}
    dead, _ = client.read("_dead/orders/v1/spark", limit=100)
    assert len(dead) == 3
    assert {m.headers["x-dead-reason"] for m in dead} == {"unparseable order"}
    assert b"not json at all" in {m.data for m in dead}
    # Forget that the last batch was committed: Spark replays it, the broker's fence
    # keeps the reports as they were.
    commits = sorted((tmp_path / "ckpt" / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    last = commits[-1]
    last.unlink()
    crc = last.with_name(f".{last.name}.crc")
    if crc.exists():
        crc.unlink()
    spark_orders.build(spark, args).start().awaitTermination()
    assert totals() == {"ada": (20, 200.0), "ken": (20, 200.0)}
    shutil.rmtree(tmp_path / "ckpt", ignore_errors=True)


def test_make_spark_demo_runs_to_its_summary(tmp_path):
    """``make spark-demo`` (examples/spark_demo.py) as a user runs it: its own broker and
    Spark, to the summary line, exit 0 (it once printed its totals, then a traceback)."""
    import os
    import re
    import subprocess

    env = {**os.environ, "TMPDIR": str(tmp_path)}  # its broker's data dir and checkpoint
    out = subprocess.run([sys.executable, str(EXAMPLES / "spark_demo.py"), "-n", "300"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = re.search(r"(\d+) report rows covering (\d+) orders; (\d+) invalid orders "
                        r"dead-lettered \(e\.g\. (.*)\)", out.stdout)
    assert summary, out.stdout[-2000:]
    # 300 orders, every 97th broken (0, 97, 194, 291): the rest are reported, once each.
    assert (int(summary[2]), int(summary[3])) == (296, 4)
    assert '"oops"' in summary[4]
