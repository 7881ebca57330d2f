"""One SparkSession and one broker for every Spark test (each costs seconds to start).

The session follows the research report's pitfalls: workers run this interpreter (P2),
everything binds to loopback (P3), and the JVM is stopped at teardown (P16).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from ..conftest import BrokerProcess

# A client under "spark-*" reads and writes everything; "limited-*" only public/*.
RULES = """
[[rules]]
client = "spark-*"
read = ["*"]
write = ["*"]

[[rules]]
client = "limited-*"
read = ["public/*"]
write = ["public/*"]
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The project turns warnings into errors; py4j and pyspark emit their own
    # ResourceWarnings/DeprecationWarnings that are not ours to fix.
    for item in items:
        if "tests/spark/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The executors' credentials are cached on the driver's machine (pyspark_minou's
    # credentials.py): in this run's temp dir, not the user's ~/.cache. Set before the
    # JVM starts, so that its Python workers inherit it.
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("minou-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@contextlib.contextmanager
def rules_broker(tmp_path_factory: pytest.TempPathFactory, name: str,
                 more_config: str = "") -> Iterator[BrokerProcess]:
    """A keys-mode broker with RULES (and ``more_config``), killed on exit."""
    root = tmp_path_factory.mktemp(name)
    config = root / "rules.toml"
    config.write_text(RULES + more_config)
    broker = BrokerProcess(root / "data", config=config).start()
    try:
        yield broker
    finally:
        broker.kill()


@pytest.fixture(scope="session")
def minou_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with rules_broker(tmp_path_factory, "spark-broker") as broker:
        yield broker


@pytest.fixture
def opts(minou_broker: BrokerProcess) -> dict[str, str]:
    """Spark options for an allowed client."""
    return client_options(minou_broker, "spark-tests")


def client_options(broker: BrokerProcess, client_id: str) -> dict[str, str]:
    a = broker.auth(client_id)
    return {"brokers": broker.url, "clientId": a["client_id"], "keyFile": a["key"]}


@pytest.fixture
def client(minou_broker: BrokerProcess) -> Iterator[Any]:
    c = minou_broker.connect_sync("spark-tests")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def admin(minou_broker: BrokerProcess) -> Iterator[Any]:
    import minou

    c = minou.connect_sync(minou_broker.url, **minou_broker.admin_auth())
    try:
        yield c
    finally:
        c.close()


def checkpoint(tmp_path: Path, name: str = "cp") -> str:
    return str(tmp_path / name)
