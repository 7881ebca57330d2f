"""The Spark connector through a takeover (issue 18): two brokers on one Redis, the
connector given both (`brokers`); the primary is killed -9 while a task reads, between
a task's staging and the driver's commit, and while a stream's driver asks for offsets.
The standby takes over; nothing is read twice or lost, and a staged batch is published
once. The connector's parts run here as Spark's tasks and driver would run them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.datasource import ReadAllAvailable

from pyspark_minou.reader import MinouBatchReader, MinouStreamReader
from pyspark_minou.writer import MinouBatchWriter

from ..conftest import BrokerProcess, wait_until
from ..redis_server import REDIS_SERVER, RedisServer, free_port
from .conftest import RULES
from .helpers import publish, read_all, unique
from .test_connector_parts import SINK_SCHEMA, rows, spark_options

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

LEASE = 1.0


@pytest.fixture
def pair(broker_factory: Any, tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    redis = RedisServer(tmp_path / "redis").start()
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(RULES + f'\n[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n')
    primary = broker_factory.make(config=cfg, storage=redis.url).start()
    standby = broker_factory.make(config=cfg, storage=redis.url)
    standby.port, standby.http_port = free_port(), free_port()
    standby.start(ready="standby:")
    standby.url = f"minou://127.0.0.1:{standby.port}"  # it prints no banner yet
    try:
        yield primary, standby
    finally:
        standby.kill()
        redis.stop()


def options(primary: BrokerProcess, standby: BrokerProcess, client_id: str) -> dict[str, str]:
    a = primary.auth(client_id)
    return {"brokers": f"{primary.url},{standby.url}", "clientId": a["client_id"],
            "keyFile": a["key"]}


def take_over(primary: BrokerProcess, standby: BrokerProcess) -> None:
    primary.kill()
    wait_until(lambda: "took over as the primary" in standby.output, LEASE + 15,
               what="the standby to take over")


def on(broker: BrokerProcess, auth_from: BrokerProcess, client_id: str) -> Any:
    import minou

    return minou.connect_sync(broker.url, request_timeout=10, **auth_from.auth(client_id))


def test_a_reading_task_reads_on_through_a_takeover(pair: Any) -> None:
    primary, standby = pair
    ch = f"{unique('ctake')}/v1/a"
    with primary.connect_sync("spark-feeder") as c:
        publish(c, ch, 12_000)
    reader = MinouBatchReader(spark_options(**options(primary, standby, "spark-ct"),
                                            channel=ch, maxRecordsPerPartition="20000",
                                            reconnectTimeout="30"))
    (part,) = reader.partitions()
    pages = reader.read(part)
    seqs = next(pages).column("seq").to_pylist()  # one page read, then the takeover
    take_over(primary, standby)
    for page in pages:
        seqs += page.column("seq").to_pylist()
    assert seqs == list(range(1, 12_001))


def test_a_batch_staged_on_the_old_primary_is_committed_once_by_the_new_one(
        pair: Any) -> None:
    primary, standby = pair
    out = f"{unique('ctstage')}/v1/out"
    writer_id = unique("w")
    opts = spark_options(**options(primary, standby, "spark-cw"), channel=out,
                         writerId=writer_id, reconnectTimeout="30")
    sink = MinouBatchWriter(opts, SINK_SCHEMA)
    messages = [sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)]
    take_over(primary, standby)
    sink.commit(messages)  # the staged transactions are in Redis: the new primary has them
    # Spark replays the batch (new task runs, new transactions): fenced, not published.
    sink.commit([sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)])
    with on(standby, primary, "spark-check") as c:
        assert sorted(m.payload for m in read_all(c, out)) == list(range(10))


def test_a_streams_driver_sees_new_offsets_after_a_takeover(pair: Any) -> None:
    primary, standby = pair
    ch = f"{unique('ctstream')}/v1/a"
    with primary.connect_sync("spark-feeder") as c:
        publish(c, ch, 5)
    source = MinouStreamReader(spark_options(**options(primary, standby, "spark-cs"),
                                             pattern=ch, reconnectTimeout="30"))
    start = source.initialOffset()
    assert source.latestOffset(start, ReadAllAvailable()) == {ch: 6}
    take_over(primary, standby)
    with on(standby, primary, "spark-feeder") as c:
        publish(c, ch, 3, start=5)
    assert source.latestOffset(start, ReadAllAvailable()) == {ch: 9}
    source.stop()
