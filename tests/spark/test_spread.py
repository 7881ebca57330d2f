"""The Spark connector on brokers that spread the queues (``placement = "spread"``,
issue 18): the connector is given one broker only, and reads a pattern over queues
owned by both and writes into a queue the other owns, exactly once through a replayed
batch. The connector's parts run here as Spark's tasks and driver would run them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import minou
from pyspark_minou.reader import MinouBatchReader
from pyspark_minou.writer import MinouBatchWriter

from ..conftest import BrokerProcess, wait_until
from ..redis_server import REDIS_SERVER, RedisServer
from .conftest import RULES
from .helpers import publish, read_all, unique
from .test_connector_parts import SINK_SCHEMA, rows, spark_options

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")]

VERSIONS = 10  # queues: all on one of two brokers has odds of 2 / 2**10


@pytest.fixture
def spread(broker_factory: Any, tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    redis = RedisServer(tmp_path / "redis").start()
    cfg = tmp_path / "spread.toml"
    cfg.write_text(RULES + f'\n[storage]\nurl = "{redis.url}"\nowner_lease = 1.0\n'
                   'placement = "spread"\n')
    a = broker_factory.make(config=cfg, storage=redis.url).start()
    b = broker_factory.make(config=cfg, storage=redis.url).start()
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()
        redis.stop()


def owners(admin: BrokerProcess, via: BrokerProcess) -> dict[str, str]:
    with minou.connect_sync(via.url, **admin.admin_auth()) as c:
        view = c.admin("cluster")
    return {q["queue"]: q["owner"] for q in view["queues"] if q["owner"] == q["placed"]}


def member(admin: BrokerProcess, b: BrokerProcess) -> str:
    with minou.connect_sync(b.url, **admin.admin_auth()) as c:
        return str(c.admin("cluster")["this_broker"]["member"])


def test_the_connector_on_one_broker_reads_and_writes_every_queue(spread: Any) -> None:
    a, b = spread
    name = unique("sprd")
    channels = [f"{name}/v{i}/a" for i in range(1, VERSIONS + 1)]
    with a.connect_sync("spark-feeder") as c:
        for ch in channels:
            publish(c, ch, 30)
    wait_until(lambda: len(owners(a, a)) == VERSIONS
               and len(set(owners(a, a).values())) == 2, timeout=20)
    auth = b.auth("spark-sp")
    opts = {"brokers": b.url, "clientId": auth["client_id"], "keyFile": auth["key"]}
    reader = MinouBatchReader(spark_options(**opts, pattern=f"{name}/*"))
    parts = reader.partitions()
    seen = sorted((row["channel"], row["seq"]) for part in parts for page in reader.read(part)
                  for row in page.to_pylist())
    assert seen == sorted((ch, s) for ch in channels for s in range(1, 31))
    # The sink's channel is owned by the broker the connector is not given.
    theirs = member(a, a)
    out_queue = next(q for q, o in owners(a, a).items() if o == theirs)
    out = f"{out_queue}/out"
    sink = MinouBatchWriter(spark_options(**opts, channel=out, writerId=unique("w")),
                            SINK_SCHEMA)
    sink.commit([sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)])
    # Spark replays the batch (new tasks, new transactions): fenced, not published again.
    sink.commit([sink.write(rows(list(range(i * 5, i * 5 + 5)))) for i in range(2)])
    with a.connect_sync("spark-check") as c:
        assert sorted(int(m.payload) for m in read_all(c, out)) == list(range(10))
