"""Structured Streaming: minou source -> transform -> minou sink, with availableNow."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from .helpers import payloads, publish, read_all, unique


def run(spark: Any, opts: dict[str, str], pattern: str, out: str, cp: Path, *,
        mode: str = "transactional", writer: str = "w", per_batch: int = 100,
        name: str | None = None) -> Any:
    """One availableNow run of the pipeline; returns the finished query."""
    src = (spark.readStream.format("minou").options(**opts).option("pattern", pattern)
           .option("maxRecordsPerBatch", str(per_batch)).option("maxRecordsPerPartition", "60"))
    if name:
        src = src.option("groupName", name)
    df = src.load().select(F.to_json(F.struct(
        F.col("channel").alias("src"), F.col("seq"),
        F.get_json_object("payload", "$.n").cast("int").alias("n"))).alias("payload"))
    query = (df.writeStream.format("minou").options(**opts).option("channel", out)
             .option("sinkMode", mode).option("writerId", writer)
             .option("checkpointLocation", str(cp)).trigger(availableNow=True).start())
    assert query.awaitTermination(120), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()
    return query


def source_keys(client: Any, out: str) -> Counter[tuple[str, int]]:
    return Counter((p["src"], p["seq"]) for p in payloads(client, out))


def test_end_to_end_restart_and_exactly_once_replay(spark: Any, opts: dict[str, str],
                                                    client: Any, tmp_path: Path) -> None:
    ep = unique("stream")
    a, b, out = f"{ep}/v1/a", f"{ep}/v1/b", f"{ep}out/v1/x"
    publish(client, a, 150)
    publish(client, b, 60)
    cp = tmp_path / "cp"
    q = run(spark, opts, f"{ep}/v1/*", out, cp, writer=f"w-{ep}", name=ep)
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == 3  # 210 rows at 100 per batch, fair-shared across a and b
    assert all(p["numInputRows"] <= 100 for p in batches)
    keys = source_keys(client, out)
    assert len(keys) == 210 and max(keys.values()) == 1

    # Restart from the checkpoint with new data, including a channel that appeared.
    publish(client, a, 30, start=150)
    publish(client, f"{ep}/v1/c", 20)
    run(spark, opts, f"{ep}/v1/*", out, cp, writer=f"w-{ep}", name=ep)
    keys = source_keys(client, out)
    assert len(keys) == 260 and max(keys.values()) == 1

    # Crash between the sink's publish and Spark's commit log: Spark replays the batch,
    # the broker's fence discards it.
    last = max(int(p.name) for p in (cp / "commits").iterdir() if p.name.isdigit())
    (cp / "commits" / str(last)).unlink()
    (cp / "commits" / f".{last}.crc").unlink(missing_ok=True)
    run(spark, opts, f"{ep}/v1/*", out, cp, writer=f"w-{ep}", name=ep)
    keys = source_keys(client, out)
    assert len(keys) == 260 and max(keys.values()) == 1
    assert len(read_all(client, out)) == 260

    # commit() acked the broker as group spark:<groupName>, one batch behind (P12).
    # Re-acking seq 1 moves nothing back; the lag shows how far the group got.
    lag = client.set_position(f"spark:{ep}", {a: 1, b: 1})
    assert lag[b] == 0 and lag[a] < 180


def test_direct_mode_duplicates_a_replayed_batch(spark: Any, opts: dict[str, str],
                                                 client: Any, tmp_path: Path) -> None:
    ep = unique("direct")
    src, out = f"{ep}/v1/a", f"{ep}out/v1/x"
    publish(client, src, 90)
    cp = tmp_path / "cp"
    run(spark, opts, f"{ep}/v1/*", out, cp, mode="direct", per_batch=40)
    assert len(read_all(client, out)) == 90
    (cp / "commits" / "2").unlink()  # the last batch: rows 81..90
    (cp / "commits" / ".2.crc").unlink(missing_ok=True)
    run(spark, opts, f"{ep}/v1/*", out, cp, mode="direct", per_batch=40)
    keys = source_keys(client, out)
    assert len(keys) == 90
    assert sum(n - 1 for n in keys.values()) == 10  # at-least-once: the replay duplicated


def test_stream_data_loss_after_retention_cut(spark: Any, opts: dict[str, str], client: Any,
                                              admin: Any, tmp_path: Path) -> None:
    ep = unique("sloss")
    ch, out = f"{ep}/v1/a", f"{ep}out/v1/x"
    publish(client, ch, 30)
    cp = tmp_path / "cp"
    run(spark, opts, f"{ep}/v1/*", out, cp, writer=f"w-{ep}")
    # New messages arrive and are purged before the query reads them.
    publish(client, ch, 20, start=30)
    admin.admin("purge", queue=f"{ep}/v1")
    publish(client, ch, 5, start=50)
    src = (spark.readStream.format("minou").options(**opts).option("pattern", f"{ep}/v1/*")
           .load().select("payload"))
    query = (src.writeStream.format("minou").options(**opts).option("channel", out)
             .option("writerId", f"w-{ep}").option("checkpointLocation", str(cp))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="data loss on channel"):
        query.awaitTermination(120)


def test_update_mode_is_refused(spark: Any, opts: dict[str, str], tmp_path: Path) -> None:
    ep = unique("upd")
    df = (spark.readStream.format("minou").options(**opts).option("pattern", f"{ep}/v1/*")
          .load().groupBy("channel").count()
          .select(F.to_json(F.struct("channel", "count")).alias("payload")))
    with pytest.raises(Exception, match=r"does not support Update mode"):
        q = (df.writeStream.format("minou").options(**opts).option("channel", f"{ep}/v1/o")
             .option("writerId", "w").outputMode("update")
             .option("checkpointLocation", str(tmp_path / "cp")).start())
        q.awaitTermination(60)


def test_ending_offsets_on_a_stream_is_refused(spark: Any, opts: dict[str, str],
                                               tmp_path: Path) -> None:
    """Kafka refuses it; ignoring it read everything with no end."""
    ep = unique("sendoff")
    df = (spark.readStream.format("minou").options(**opts).option("pattern", f"{ep}/v1/*")
          .option("endingOffsets", "latest").load())
    with pytest.raises(Exception, match="endingOffsets is for batch queries"):
        q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "cp"))
             .start())
        q.awaitTermination(60)


def test_a_new_checkpoint_with_an_old_writer_id_fails_instead_of_dropping_rows(
        spark: Any, opts: dict[str, str], client: Any, admin: Any, tmp_path: Path) -> None:
    """The second query's batches 0..k would be taken for replays of the first query's
    and discarded: it fails at its first commit naming the writer and what to do, and
    nothing of it is lost; after `writers release --drop-fences` it writes everything."""
    ep = unique("lineage")
    out, writer = f"{ep}out/v1/x", f"w-{ep}"
    publish(client, f"{ep}/v1/a", 50)
    run(spark, opts, f"{ep}/v1/*", out, tmp_path / "cp1", writer=writer)
    assert len(read_all(client, out)) == 50
    with pytest.raises(Exception, match=rf"writer id '{writer}' fences the batches of "
                                        r"another run .* writers release"):
        run(spark, opts, f"{ep}/v1/*", out, tmp_path / "cp2", writer=writer)
    assert len(read_all(client, out)) == 50  # nothing published, nothing half-written
    admin.admin("writers.release", writer_id=writer, drop_fences=True)
    run(spark, opts, f"{ep}/v1/*", out, tmp_path / "cp2", writer=writer)
    assert len(read_all(client, out)) == 100  # the second query's own 50, all of them


def test_a_streaming_query_on_local_2_goes_on_through_a_broker_kill_and_restart(
        spark: Any, broker_factory: Any, tmp_path: Path) -> None:
    """kill -9 the broker under a running query (plain local[2]: Spark retries no task)
    and start it again 3 s later: tasks and the driver reconnect, staged batches were
    stored, and every row arrives once."""
    import threading
    import time

    from .conftest import RULES, client_options

    config = tmp_path / "rules.toml"
    config.write_text(RULES)
    broker = broker_factory.make(config=config).start()
    opts = client_options(broker, "spark-restart")
    ep = unique("kill")
    src, out = f"{ep}/v1/*", f"{ep}out/v1/x"
    with broker.connect_sync("spark-feed") as c:
        publish(c, f"{ep}/v1/a", 1200)
    df = (spark.readStream.format("minou").options(**opts).option("pattern", src)
          .option("maxRecordsPerBatch", "100").load()
          .select(F.to_json(F.struct(F.col("seq"))).alias("payload")))
    query = (df.writeStream.format("minou").options(**opts).option("channel", out)
             .option("writerId", f"w-{ep}").option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())

    def count() -> int:
        with broker.connect_sync("spark-count", reconnect=False) as c:
            return len(read_all(c, out))

    try:
        deadline = time.monotonic() + 120
        while query.lastProgress is None or count() < 300:
            assert time.monotonic() < deadline and query.isActive, query.exception()
            time.sleep(0.2)
        broker.kill()
        threading.Timer(3.0, broker.start).start()
        time.sleep(3.5)
        deadline = time.monotonic() + 120
        while True:
            assert query.isActive, f"the query ended: {query.exception()}"
            try:
                if count() >= 1200:
                    break
            except Exception:  # the broker may still be starting
                pass
            assert time.monotonic() < deadline, "the query did not catch up after the restart"
            time.sleep(0.3)
        time.sleep(1.0)  # a batch more: nothing arrives twice
        with broker.connect_sync("spark-count") as c:
            seqs = Counter(m.payload["seq"] for m in read_all(c, out))
        assert sorted(seqs) == list(range(1, 1201)) and max(seqs.values()) == 1
    finally:
        query.stop()
