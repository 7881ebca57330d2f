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
