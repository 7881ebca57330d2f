"""An example pipeline: orders in, revenue per customer per minute out, exactly once.

    spark-submit examples/spark_orders.py --brokers minou://127.0.0.1:7700 \
        --checkpoint /tmp/orders-ckpt [--key keys/spark.key --client-id spark-orders]

It reads ``orders/v1/*`` as a stream, parses the JSON payloads, sends the rows that do
not parse (or have no customer/total) to ``_dead/orders/v1/spark`` with the reason, and
writes the revenue of each customer per minute to ``reports/v1/revenue``. The
aggregation is an Update-mode one, so it goes through ``foreachBatch`` and the batch
writer with ``writerId`` and ``batchId``: a batch Spark replays after a crash is
fenced by the broker, never written twice. Each report row is the revenue of one
customer in one minute within one micro-batch; a reader sums the rows of a
(customer, minute) for its total. ``make spark-demo`` runs it end to end.
"""

from __future__ import annotations

import argparse
from typing import Any

ORDER_SCHEMA = "customer string, total double"


def minou_options(args: argparse.Namespace) -> dict[str, str]:
    opts = {"brokers": args.brokers}
    if args.key:
        opts.update(keyFile=args.key, clientId=args.client_id)
    return opts


def build(spark: Any, args: argparse.Namespace) -> Any:
    """The streaming query (not started)."""
    from pyspark.sql import functions as F

    opts = minou_options(args)
    orders = (spark.readStream.format("minou").options(**opts)
              .option("pattern", "orders/v1/*")
              .option("startingOffsets", "earliest")
              .option("maxRecordsPerBatch", str(args.batch_size))
              .load())
    parsed = orders.select(
        "channel", "seq", "payload", "published_at",
        F.from_json("payload", ORDER_SCHEMA).alias("order"))
    valid = F.col("order").isNotNull() & F.col("order.customer").isNotNull() \
        & F.col("order.total").isNotNull()

    def per_batch(batch: Any, batch_id: int) -> None:
        batch.persist()
        invalid = batch.where(~valid).select(
            F.lit("_dead/orders/v1/spark").alias("channel"),
            # binary: the message as it came, JSON or not (a string column must be JSON)
            F.col("payload").cast("binary").alias("payload"),
            F.create_map(F.lit("x-dead-reason"), F.lit("unparseable order"),
                         F.lit("x-original-channel"), F.col("channel"),
                         F.lit("x-original-seq"), F.col("seq").cast("string")).alias("headers"))
        revenue = (batch.where(valid)
                   .groupBy(F.col("order.customer").alias("customer"),
                            F.window("published_at", "1 minute").alias("minute"))
                   .agg(F.sum("order.total").alias("revenue"), F.count("*").alias("orders"))
                   .select(F.lit("reports/v1/revenue").alias("channel"),
                           F.to_json(F.struct(
                               "customer", F.col("minute.start").alias("minute"),
                               F.round("revenue", 2).alias("revenue"), "orders"))
                           .alias("payload")))
        for frame, writer in ((invalid, "orders-dead-letters"), (revenue, "orders-revenue")):
            (frame.write.format("minou").options(**opts)
             .option("writerId", f"{args.writer_id}:{writer}")
             .option("batchId", str(batch_id)).mode("append").save())
        batch.unpersist()

    return (parsed.writeStream.queryName("orders_revenue").foreachBatch(per_batch)
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--key", help="the pipeline's private key file (minou keygen)")
    ap.add_argument("--client-id", default="spark-orders")
    ap.add_argument("--writer-id", default="spark-orders",
                    help="stable across restarts: the broker's fence for exactly-once")
    ap.add_argument("--batch-size", type=int, default=5000)
    args = ap.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("minou-orders").getOrCreate()
    try:
        build(spark, args).start().awaitTermination()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
