"""Batch reads and writes through spark.read/df.write.format("minou")."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pyspark.sql import functions as F

from ..conftest import BrokerProcess
from .conftest import client_options
from .helpers import payloads, publish, unique


def reader(spark: Any, opts: dict[str, str], **more: str) -> Any:
    return spark.read.format("minou").options(**opts, **more).load()


def test_pattern_over_two_channels_in_several_partitions(spark: Any, opts: dict[str, str],
                                                         client: Any) -> None:
    ep = unique("bread")
    publish(client, f"{ep}/v1/a", 120)
    publish(client, f"{ep}/v1/b", 45)
    df = reader(spark, opts, pattern=f"{ep}/v1/*", maxRecordsPerPartition="50")
    # format("minou") resolved with no register() call: DefaultSource of pyspark_minou.
    assert df.rdd.getNumPartitions() == 3 + 1
    assert df.count() == 165
    rows = df.orderBy("channel", "seq").collect()
    a = [r for r in rows if r.channel == f"{ep}/v1/a"]
    assert [r.seq for r in a] == list(range(1, 121))
    first = a[0]
    assert json.loads(first.payload) == {"n": 0, "ch": f"{ep}/v1/a"}
    assert first.key == "k0" and first.headers == {"i": "0"} and first.id
    assert first.published_at is not None
    assert df.schema.simpleString() == (
        "struct<channel:string,seq:bigint,id:string,key:string,payload:string,"
        "headers:map<string,string>,published_at:timestamp>")
    # Per-channel seqs are consecutive inside each partition: no partition mixes channels.
    per_part = df.rdd.mapPartitions(lambda it: [sorted({r.channel for r in it})]).collect()
    assert all(len(p) <= 1 for p in per_part)


def test_starting_and_ending_offsets(spark: Any, opts: dict[str, str], client: Any) -> None:
    ep = unique("boff")
    a, b = f"{ep}/v1/a", f"{ep}/v1/b"
    publish(client, a, 20)
    publish(client, b, 20)
    df = reader(spark, opts, pattern=f"{ep}/v1/*",
                startingOffsets=json.dumps({a: 5, b: -2}), endingOffsets=json.dumps({a: 10}))
    got = {(r.channel, r.seq) for r in df.collect()}
    assert got == {(a, s) for s in range(5, 10)} | {(b, s) for s in range(1, 21)}
    assert reader(spark, opts, channel=f"{ep}/v1/none").count() == 0  # empty placeholder
    # Starting at the end is an empty read, not an error.
    assert reader(spark, opts, channel=a, startingOffsets=json.dumps({a: 21})).count() == 0


@pytest.mark.parametrize("more, reason", [
    ({"startingOffsets": "latest"}, "startingOffsets=latest is not allowed in a batch"),
    ({"startingOffsets": '{"CH": -1}'}, "startingOffsets=latest is not allowed in a batch"),
    ({"endingOffsets": "earliest"}, "endingOffsets=earliest is not allowed in a batch"),
    ({"startingOffsets": '{"CH": 30}'}, "is seq 30, past the end of the read (seq 21: the "
                                        "channel's next seq)"),
    ({"startingOffsets": '{"CH": 8}', "endingOffsets": '{"CH": 5}'},
     "is seq 8, past the end of the read (seq 5: endingOffsets)"),
])
def test_batch_offsets_that_would_read_nothing_are_refused_as_kafka_does(
        spark: Any, opts: dict[str, str], client: Any, more: dict[str, str],
        reason: str) -> None:
    ch = f"{unique('bkafka')}/v1/a"
    publish(client, ch, 20)
    more = {k: v.replace("CH", ch) for k, v in more.items()}
    with pytest.raises(Exception, match=re.escape(reason)):
        reader(spark, opts, channel=ch, **more).count()


def test_data_loss_is_detected_after_a_purge(spark: Any, opts: dict[str, str], client: Any,
                                            admin: Any) -> None:
    ep = unique("bloss")
    ch = f"{ep}/v1/a"
    publish(client, ch, 10)
    admin.admin("purge", queue=f"{ep}/v1")
    publish(client, ch, 5, start=10)
    start = json.dumps({ch: 1})
    with pytest.raises(Exception, match="data loss on channel"):
        reader(spark, opts, channel=ch, startingOffsets=start).count()
    rows = reader(spark, opts, channel=ch, startingOffsets=start,
                  failOnDataLoss="false").collect()
    assert sorted(r.seq for r in rows) == list(range(11, 16))


def test_forbidden_channel_fails_with_not_authorized(spark: Any, minou_broker: BrokerProcess,
                                                     client: Any) -> None:
    ep = unique("secret")
    publish(client, f"{ep}/v1/a", 3)
    limited = client_options(minou_broker, "limited-reader")
    with pytest.raises(Exception, match="NotAuthorized") as info:
        reader(spark, limited, pattern=f"{ep}/v1/*").count()
    assert "limited-reader" in str(info.value)


@pytest.mark.parametrize("mode", ["transactional", "direct"])
def test_batch_write(spark: Any, opts: dict[str, str], client: Any, mode: str) -> None:
    ep = unique("bwrite")
    df = spark.range(0, 50, numPartitions=3).select(
        F.to_json(F.struct(F.col("id").alias("n"))).alias("payload"),
        F.when(F.col("id") % 2 == 0, F.lit(f"{ep}/v1/even"))
        .otherwise(F.lit(f"{ep}/v1/odd")).alias("channel"),
        F.col("id").cast("string").alias("key"))
    (df.write.format("minou").options(**opts)
     .option("sinkMode", mode).option("writerId", f"w-{ep}").mode("append").save())
    even, odd = payloads(client, f"{ep}/v1/even"), payloads(client, f"{ep}/v1/odd")
    assert sorted(p["n"] for p in even) == list(range(0, 50, 2))
    assert sorted(p["n"] for p in odd) == list(range(1, 50, 2))


def test_messages_removed_while_a_task_reads_are_data_loss(minou_broker, client, admin):
    """Planning saw seqs 1..6; a purge removes them before the task reads: the task fails
    (or, with failOnDataLoss=false, skips the gap) instead of silently missing rows."""
    from pyspark_minou import MinouSparkError
    from pyspark_minou.reader import MinouPartition, read_range

    channel = unique("lossread") + "/v1/x"
    publish(client, channel, 6)
    part = MinouPartition(channel, 1, 7)
    admin.admin("purge", queue=channel.rsplit("/", 1)[0])
    with pytest.raises(MinouSparkError, match=r"messages \[1, 7\) were removed"):
        list(read_range(client, part))
    assert list(read_range(client, part, fail_on_data_loss=False)) == []


def test_starting_and_ending_timestamps(spark: Any, opts: dict[str, str], client: Any) -> None:
    """Kafka's startingTimestamp / endingTimestamp / startingOffsetsByTimestamp
    (milliseconds since the epoch) by the messages' publish times."""
    import time

    ep = unique("btime")
    a, b = f"{ep}/v1/a", f"{ep}/v1/b"
    publish(client, a, 5)
    publish(client, b, 4)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish(client, a, 3, start=5)

    def seqs(**more: str) -> set[tuple[str, int]]:
        return {(r.channel, r.seq) for r in reader(spark, opts, pattern=f"{ep}/v1/*",
                                                   **more).collect()}

    assert seqs(startingTimestamp=str(cut)) == {(a, 6), (a, 7), (a, 8)}
    assert seqs(endingTimestamp=str(cut)) == {(a, s) for s in range(1, 6)} | {
        (b, s) for s in range(1, 5)}
    by_channel = json.dumps({a: cut})  # b: startingOffsets (earliest)
    assert seqs(startingOffsetsByTimestamp=by_channel) == {(a, 6), (a, 7), (a, 8)} | {
        (b, s) for s in range(1, 5)}


def test_binary_payloads_are_raw_messages_both_ways(spark: Any, opts: dict[str, str],
                                                     client: Any) -> None:
    """A binary payload column writes raw (non-JSON) messages; payloadFormat=binary
    reads every payload as the bytes stored, JSON and raw alike."""
    out = f"{unique('bbin')}/v1/raw"
    blobs = [bytes([i, 0, 255, i]) for i in range(5)]
    df = spark.createDataFrame([(b,) for b in blobs], "payload binary")
    df.write.format("minou").options(**opts).option("channel", out) \
        .option("writerId", unique("w")).mode("append").save()
    client.send(out, {"json": True})
    got = reader(spark, opts, channel=out, payloadFormat="binary").orderBy("seq").collect()
    assert [bytes(r.payload) for r in got] == [*blobs, b'{"json":true}']
    assert reader(spark, opts, channel=out).schema["payload"].dataType.simpleString() == "string"
    with pytest.raises(Exception, match="payloadFormat='hex'"):
        reader(spark, opts, channel=out, payloadFormat="hex").count()


def test_kafka_shaped_headers_with_repeated_keys(spark: Any, opts: dict[str, str],
                                                 client: Any) -> None:
    """Kafka's headers column (array<struct<key, value binary>>) writes as is; a key
    that repeats has its values joined with ", " (a message has one value per name)."""
    out = f"{unique('bhdr')}/v1/x"
    df = spark.sql("""SELECT '{"n":1}' AS payload,
                      array(named_struct('key', 'trace', 'value', CAST('a' AS BINARY)),
                            named_struct('key', 'tag', 'value', CAST('x' AS BINARY)),
                            named_struct('key', 'tag', 'value', CAST('y' AS BINARY)),
                            named_struct('key', 'gone', 'value', CAST(NULL AS BINARY)))
                      AS headers""")
    df.write.format("minou").options(**opts).option("channel", out) \
        .option("writerId", unique("w")).mode("append").save()
    (row,) = reader(spark, opts, channel=out).collect()
    assert row.headers == {"trace": "a", "tag": "x, y"}


def test_file_options_resolve_files_shipped_with_spark_and_name_a_missing_one(
        spark: Any, opts: dict[str, str], client: Any, tmp_path: Any) -> None:
    """A keyFile (or cafile) given by name is found among the files shipped with
    --files / addFile; one found nowhere fails the query at planning, naming the option,
    the path and the machine."""
    import shutil
    import socket

    ch = f"{unique('shipped')}/v1/a"
    publish(client, ch, 3)
    name = f"{unique('shipped-key')}.key"
    shutil.copy(opts["keyFile"], tmp_path / name)
    spark.sparkContext.addFile(str(tmp_path / name))
    shipped = {**opts, "keyFile": name}  # not a path this process can open as such
    assert reader(spark, shipped, channel=ch).count() == 3
    missing = f"/nowhere/not-{name}"  # neither here nor shipped
    with pytest.raises(Exception, match=re.escape(
            f"option keyFile='{missing}': no such file on {socket.gethostname()}")):
        reader(spark, {**opts, "keyFile": missing}, channel=ch).count()
