"""The connector's reader and writer objects driven directly, as Spark's driver and
executors call them, against a real broker but without a SparkSession: the failure
cases Spark itself cannot be made to produce on demand (a killed task's leftovers, a
broker restart under a running query)."""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.datasource import ReadAllAvailable
from pyspark.sql.types import MapType, StringType, StructField, StructType

import minou
from minou.errors import TooManyConnections
from pyspark_minou import MinouSparkError
from pyspark_minou.reader import MinouStreamReader
from pyspark_minou.writer import MinouBatchWriter

from ..conftest import BrokerProcess
from .conftest import RULES, client_options
from .helpers import publish, read_all, unique


def spark_options(**options: str) -> dict[str, str]:
    """As Spark hands options to a data source: case-insensitive, keys lower-cased."""
    return {k.lower(): v for k, v in options.items()}


SINK_SCHEMA = StructType([StructField("payload", StringType()),
                          StructField("headers", MapType(StringType(), StringType()))])


def rows(values: list[int], headers: dict[str, str | None] | None = None) -> Any:
    return iter([pa.RecordBatch.from_pydict(
        {"payload": [str(v) for v in values], "headers": [headers] * len(values)},
        schema=pa.schema([("payload", pa.string()),
                          ("headers", pa.map_(pa.string(), pa.string()))]))])


def test_a_killed_attempts_leftovers_are_not_published_with_its_replay(
        opts: dict[str, str], client: Any) -> None:
    out = f"{unique('leftover')}/v1/out"
    sink = MinouBatchWriter(spark_options(**opts, channel=out, writerId=unique("w"),
                                          batchId="7"), SINK_SCHEMA)
    # Attempt 0 of partition 0 stages 4 rows and is killed before its commit message
    # reaches the driver (its staged data stays on the broker, unnamed by any commit).
    sink.write(rows([90, 91, 92, 93]))
    # The replay runs partition 0 again, attempt 0 again (as Spark numbers it after a
    # restart), and the driver commits what it reported.
    message = sink.write(rows(list(range(10))))
    sink.commit([message])
    assert [m.payload for m in read_all(client, out)] == list(range(10))


def test_a_null_header_value_is_no_header(opts: dict[str, str], client: Any) -> None:
    out = f"{unique('hdr')}/v1/out"
    sink = MinouBatchWriter(spark_options(**opts, channel=out, writerId=unique("w")),
                            SINK_SCHEMA)
    sink.commit([sink.write(rows([1], {"source": "spark", "trace": None}))])
    (msg,) = read_all(client, out)
    assert msg.headers == {"source": "spark"}


def test_a_running_query_survives_a_broker_restart(broker_factory: Any, tmp_path: Any
                                                   ) -> None:
    config = tmp_path / "rules.toml"
    config.write_text(RULES)
    broker: BrokerProcess = broker_factory.make(config=config).start()
    channel = f"{unique('restart')}/v1/a"
    with broker.connect_sync("spark-writer") as c:
        publish(c, channel, 5)
    source = MinouStreamReader(spark_options(**client_options(broker, "spark-restart"),
                                             pattern=channel))
    start = source.initialOffset()
    assert source.latestOffset(start, ReadAllAvailable()) == {channel: 6}
    broker.kill()
    broker.start()
    with broker.connect_sync("spark-writer") as c:
        publish(c, channel, 3, start=5)
    # The driver's connection died with the broker: the next call reconnects at once.
    assert source.latestOffset(start, ReadAllAvailable()) == {channel: 9}
    source.stop()


def test_the_channel_option_wins_over_a_channel_column(opts: dict[str, str],
                                                       client: Any) -> None:
    # A frame read from minou carries its source channel; written on with the option,
    # its rows must not go back where they came from.
    src, out = f"{unique('loop')}/v1/in", f"{unique('loop')}/v1/out"
    schema = StructType([StructField("channel", StringType()),
                         StructField("payload", StringType())])
    sink = MinouBatchWriter(spark_options(**opts, channel=out, writerId=unique("w")), schema)
    batch = pa.RecordBatch.from_pydict({"channel": [src, src], "payload": ["1", "2"]})
    sink.commit([sink.write(iter([batch]))])
    assert [m.payload for m in read_all(client, out)] == [1, 2]
    assert read_all(client, src) == []


def test_a_replayed_batch_knows_where_a_new_channel_began(minou_broker: BrokerProcess,
                                                          opts: dict[str, str], client: Any,
                                                          admin: Any) -> None:
    ep = unique("newch")
    publish(client, f"{ep}/v1/a", 3)
    options = spark_options(**opts, pattern=f"{ep}/v1/*")
    source = MinouStreamReader(options)
    start = source.initialOffset()
    publish(client, f"{ep}/v1/b", 3)  # a channel appears under the pattern
    first = source.latestOffset(start, ReadAllAvailable())
    # It enters the offsets where it begins, with no rows yet...
    assert first == {f"{ep}/v1/a": 4, f"{ep}/v1/b": 1}
    second = source.latestOffset(first, ReadAllAvailable())
    assert second == {f"{ep}/v1/a": 4, f"{ep}/v1/b": 4}  # ... and is read next.
    source.stop()
    # The broker purges b before the batch ran; the driver restarts and replays the
    # batch (first -> second) from its offset log: the loss is reported, not skipped.
    admin.admin("purge", queue=f"{ep}/v1")
    replay = MinouStreamReader(options)
    parts = replay.partitions(first, second)  # planned on the driver, read by tasks:
    with pytest.raises(MinouSparkError, match=f"data loss on channel '{ep}/v1/b'"):
        for part in parts:
            list(replay.read(part))
    replay.stop()


# -- a broker restart under a task (issue 14): tasks reconnect within reconnectTimeout --


@pytest.fixture
def own_broker(broker_factory: Any, tmp_path: Any) -> BrokerProcess:
    """A broker of this test's own, to kill -9 and restart."""
    config = tmp_path / "rules.toml"
    config.write_text(RULES)
    return broker_factory.make(config=config).start()


def _restart(broker: BrokerProcess) -> None:
    broker.kill()
    broker.start()


def _one_partition(broker: BrokerProcess, prefix: str, n: int, **options: str) -> Any:
    """A batch reader of a new channel holding ``n`` messages, and its one partition."""
    from pyspark_minou.reader import MinouBatchReader

    ch = f"{unique(prefix)}/v1/a"
    with broker.connect_sync("spark-feeder") as c:
        publish(c, ch, n)
    reader = MinouBatchReader(spark_options(**client_options(broker, f"spark-{prefix}"),
                                            channel=ch, **options))
    (part,) = reader.partitions()
    return reader, part


def test_a_reading_task_reads_on_after_a_broker_restart(own_broker: BrokerProcess) -> None:
    reader, part = _one_partition(own_broker, "rrestart", 12_000,
                                  maxRecordsPerPartition="20000")
    pages = reader.read(part)
    first = next(pages)  # one page of 5,000 read, then the broker dies and comes back
    _restart(own_broker)
    seqs = first.column("seq").to_pylist()
    for page in pages:
        seqs += page.column("seq").to_pylist()
    assert seqs == list(range(1, 12_001))


def _batches(values: list[list[int]], between: Any) -> Any:
    """Arrow batches of the sink's schema; ``between()`` runs after the first one."""
    for i, chunk in enumerate(values):
        if i == 1:
            between()
        yield from rows(chunk)


@pytest.mark.parametrize("mode", ["transactional", "direct"])
def test_a_writing_task_stages_again_after_a_broker_restart(own_broker: BrokerProcess,
                                                           mode: str) -> None:
    out = f"{unique('wrestart')}/v1/out"
    sink = MinouBatchWriter(spark_options(**client_options(own_broker, "spark-wr"),
                                          channel=out, writerId=unique("w"), sinkMode=mode,
                                          sinkBatchSize="100"), SINK_SCHEMA)
    values = [list(range(0, 300)), list(range(300, 600)), list(range(600, 900))]
    message = sink.write(_batches(values, lambda: _restart(own_broker)))
    sink.commit([message])
    with own_broker.connect_sync("spark-check") as c:
        got = [m.payload for m in read_all(c, out)]
    if mode == "transactional":
        assert got == list(range(900))  # staged again whole, committed once
    else:
        assert sorted(set(got)) == list(range(900))  # at-least-once: a batch may repeat


def test_a_broker_that_stays_away_fails_the_task_naming_it(own_broker: BrokerProcess) -> None:
    reader, part = _one_partition(own_broker, "gone", 10, reconnectTimeout="1")
    own_broker.kill()
    with pytest.raises(MinouSparkError, match=r"lost the broker at minou://127\.0\.0\.1:\d+ "
                                              r"and could not get it back within "
                                              r"reconnectTimeout=1 s"):
        list(reader.read(part))


def test_a_broker_restart_between_staging_and_the_commit_loses_nothing(
        own_broker: BrokerProcess) -> None:
    """Staged transactions are stored: the driver's commit after a kill -9 and a restart
    publishes what the tasks staged before it, once."""
    out = f"{unique('stagedkill')}/v1/out"
    sink = MinouBatchWriter(spark_options(**client_options(own_broker, "spark-lc"),
                                          channel=out, writerId=unique("w")), SINK_SCHEMA)
    messages = [sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)]
    _restart(own_broker)
    sink.commit(messages)
    # Spark replays the batch (new task runs, new transactions): fenced, not published.
    sink.commit([sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)])
    with own_broker.connect_sync("spark-check") as c:
        assert sorted(m.payload for m in read_all(c, out)) == list(range(10))


def test_a_commit_of_transactions_the_broker_no_longer_holds_fails_saying_so(
        own_broker: BrokerProcess) -> None:
    out = f"{unique('lostcommit')}/v1/out"
    sink = MinouBatchWriter(spark_options(**client_options(own_broker, "spark-lc"),
                                          channel=out, writerId=unique("w")), SINK_SCHEMA)
    message = sink.write(rows(list(range(5))))
    sink._abort([message])  # as if expired: the broker holds it no more
    with pytest.raises(MinouSparkError, match=r"no longer holds the batch's staged "
                                              r"transactions.*restart the query"):
        sink.commit([message])


# -- Kafka's remaining read options (issue 14) ------------------------------------------


def test_min_partitions_splits_the_largest_ranges(opts: dict[str, str], client: Any) -> None:
    from pyspark_minou.reader import MinouBatchReader, read_range

    ep = unique("minparts")
    publish(client, f"{ep}/v1/a", 100)
    publish(client, f"{ep}/v1/b", 3)
    reader = MinouBatchReader(spark_options(**opts, pattern=f"{ep}/v1/*", minPartitions="6"))
    parts = reader.partitions()
    assert len(parts) == 6
    sizes = sorted(p.end - p.start for p in parts)
    assert sum(sizes) == 103 and sizes[-1] <= 25  # the big range was halved, not the small
    seqs = sorted((p.channel, s) for p in parts for batch in read_range(client, p)
                  for s in batch.column("seq").to_pylist())
    assert len(seqs) == len(set(seqs)) == 103


def test_min_offsets_per_trigger_holds_a_batch_back_until_enough_or_the_delay(
        opts: dict[str, str], client: Any) -> None:
    import time

    ep = unique("mintrig")
    stream = MinouStreamReader(spark_options(**opts, pattern=f"{ep}/v1/*",
                                             minOffsetsPerTrigger="50",
                                             maxTriggerDelay="1s"))
    publish(client, f"{ep}/v1/a", 10)
    start = stream.initialOffset()
    assert stream.latestOffset(start, ReadAllAvailable()) == start  # 10 < 50: wait
    time.sleep(1.1)  # maxTriggerDelay passed: the 10 go
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end == {f"{ep}/v1/a": 11}
    publish(client, f"{ep}/v1/a", 60, start=10)
    assert stream.latestOffset(end, ReadAllAvailable()) == {f"{ep}/v1/a": 71}  # enough
    stream.stop()


@pytest.mark.parametrize("value", ["soon", "-1s", "5 parsecs"])
def test_a_bad_max_trigger_delay_is_refused(opts: dict[str, str], value: str) -> None:
    with pytest.raises(MinouSparkError, match="maxTriggerDelay"):
        MinouStreamReader(spark_options(**opts, pattern="x/v1/*", maxTriggerDelay=value))


def test_a_stream_starts_at_a_timestamp(opts: dict[str, str], client: Any) -> None:
    import time

    ep = unique("stime")
    publish(client, f"{ep}/v1/a", 4)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    publish(client, f"{ep}/v1/a", 2, start=4)
    stream = MinouStreamReader(spark_options(**opts, pattern=f"{ep}/v1/*",
                                             startingTimestamp=str(cut)))
    assert stream.initialOffset() == {f"{ep}/v1/a": 5}
    stream.stop()
    with pytest.raises(MinouSparkError, match="endingTimestamp and endingOffsetsByTimestamp "
                                              "are for batch queries"):
        MinouStreamReader(spark_options(**opts, pattern=f"{ep}/v1/*", endingTimestamp="1"))


def test_the_drivers_commit_waits_for_a_broker_that_is_restarting(
        own_broker: BrokerProcess) -> None:
    """The broker is down when the driver commits: the commit is sent again once it is
    back (a commit it had made would be answered as it was), published once."""
    import threading

    out = f"{unique('downcommit')}/v1/out"
    sink = MinouBatchWriter(spark_options(**client_options(own_broker, "spark-dc"),
                                          channel=out, writerId=unique("w")), SINK_SCHEMA)
    message = sink.write(rows(list(range(7))))
    own_broker.kill()
    threading.Timer(1.5, own_broker.start).start()
    sink.commit([message])
    with own_broker.connect_sync("spark-check") as c:
        assert [m.payload for m in read_all(c, out)] == list(range(7))


@pytest.mark.parametrize("option, value, reason", [
    ("reconnectTimeout", "soon", "option reconnectTimeout='soon': expected a number of seconds"),
    ("reconnectTimeout", "-1", "option reconnectTimeout='-1': must be >= 0 seconds"),
    ("startingTimestamp", "yesterday", "option startingTimestamp='yesterday': expected "
                                       "milliseconds since the epoch"),
    ("startingOffsetsByTimestamp", "[1]", "option startingOffsetsByTimestamp: expected a "
                                          "JSON object"),
    ("minPartitions", "0", "option minPartitions='0': must be >= 1"),
])
def test_bad_new_read_options_are_refused_precisely(opts: dict[str, str], option: str,
                                                    value: str, reason: str) -> None:
    from pyspark_minou.reader import MinouBatchReader

    with pytest.raises(MinouSparkError, match=re.escape(reason)):
        MinouBatchReader(spark_options(**opts, pattern="x/v1/*", **{option: value}))


def test_a_task_whose_credential_expired_says_what_to_do(
        opts: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle stream's sink renews only at commits: past credentialTtl, its next tasks
    get an error naming the credential's job, the ttl and the way out."""
    import pickle
    import time

    import pyspark_minou._common as common

    sink = MinouBatchWriter(spark_options(**opts, channel="x/v1/y", writerId=unique("w"),
                                          credentialTtl="1"), SINK_SCHEMA)
    task = pickle.loads(pickle.dumps(sink))  # the driver issues the credential here
    assert task.config.credential is not None and sink.config.credential is not None
    assert task.config.credential not in repr(task.config)
    time.sleep(1.2)
    monkeypatch.setattr(common, "in_task", lambda: True)
    with pytest.raises(MinouSparkError, match=r"expired.*credentialTtl=1 s.*Restart"):
        task.client()


def test_a_timestamp_lookup_refused_while_its_clients_others_run_waits_its_turn(
        broker_factory: Any, tmp_path: Any) -> None:
    """A broker answers 4 OFFSETS-at lookups of one client at once; Spark's driver may
    plan several queries under one clientId. Four lookups of that client keep the broker
    busy; the stream's start at a timestamp is refused (counted) and waits its turn
    instead of failing the query, then starts where it should."""
    import threading
    import time

    config = tmp_path / "rules.toml"
    config.write_text(RULES)
    broker: BrokerProcess = broker_factory.make(config=config).start()
    ep = unique("busy")
    with broker.connect_sync("spark-writer") as c:
        for lo in range(0, 10_000, 5_000):  # lookups long enough to hold their slots
            c.send_many([{"channel": f"{ep}/v1/c{i}", "payload": i}
                         for i in range(lo, lo + 5_000)])
    cut = int(time.time() * 1000) + 1
    time.sleep(0.01)
    with broker.connect_sync("spark-writer") as c:
        c.send_many([{"channel": f"{ep}/v1/c{i}", "payload": i} for i in range(3)])
    options = client_options(broker, "spark-busy")
    stop = threading.Event()

    def busy() -> None:  # the same client, one lookup in flight after another
        with broker.connect_sync("spark-busy") as c:
            while not stop.is_set():
                try:
                    c.offsets_at([f"{ep}/*"], time.time() - 3600)
                except TooManyConnections:  # the stream's start took a slot meanwhile
                    time.sleep(0.01)

    def refusals() -> int:
        with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
            refused = admin.admin("status")["counters"]["refused"]
            return int(refused.get("too_many_connections", 0))

    busy_threads = [threading.Thread(target=busy, daemon=True) for _ in range(4)]
    for t in busy_threads:
        t.start()
    before = refusals()
    started: dict[str, Any] = {}
    try:
        # Until one start was refused at least once (one may find a slot between two
        # lookups of the others and need no turn: then it is tried again).
        for _ in range(10):
            stream = MinouStreamReader(spark_options(
                **options, pattern=f"{ep}/*", startingTimestamp=str(cut),
                reconnectTimeout="60"))

            def start(stream: MinouStreamReader = stream) -> None:
                try:
                    started["offsets"] = stream.initialOffset()
                except Exception as exc:  # the old behaviour: the query fails
                    started["error"] = exc

            runner = threading.Thread(target=start, daemon=True)
            runner.start()
            deadline = time.monotonic() + 30
            while refusals() == before and runner.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if refusals() > before:
                break
            runner.join(30)
            stream.stop()
            started.clear()
        assert refusals() > before, "the start was never refused: the test proves nothing"
    finally:
        stop.set()
        for t in busy_threads:
            t.join(60)
    runner.join(60)
    stream.stop()
    assert "error" not in started, started.get("error")
    offsets = started["offsets"]
    assert offsets[f"{ep}/v1/c0"] == 2 and offsets[f"{ep}/v1/c9999"] == 2
    assert len(offsets) == 10_000
