"""PySpark data source for minou: ``spark.read.format("minou")``, streams and sinks.

Spark registers the ``DefaultSource`` of every top-level ``pyspark_*`` module it can
import on the worker's ``sys.path`` (P7 of the research report), so installing this
package in the ``PYSPARK_PYTHON`` venv is enough; ``spark.dataSource.register(
MinouDataSource)`` also works.

Read: ``.option("brokers", "minou://host:7700").option("pattern", "orders/v1/*")``;
write: a ``payload`` JSON text column (plus optional ``channel``, ``key``, ``headers``)
with ``.option("writerId", ...)`` for the default exactly-once transactional sink.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._common import SCHEMA_DDL, SCHEMA_DDL_BINARY, MinouSparkError, binary_payload, normalize
from .reader import MinouBatchReader, MinouPartition, MinouStreamReader
from .writer import MinouBatchWriter, MinouCommitMessage, MinouStreamWriter

__all__ = [
    "DefaultSource", "MinouBatchReader", "MinouBatchWriter", "MinouCommitMessage",
    "MinouDataSource", "MinouPartition", "MinouSparkError", "MinouStreamReader",
    "MinouStreamWriter",
]


class MinouDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "minou"

    def schema(self) -> str:
        return SCHEMA_DDL_BINARY if binary_payload(normalize(self.options)) else SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return MinouBatchReader(normalize(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MinouStreamReader(normalize(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise MinouSparkError("a minou channel is an append-only log: use mode('append')")
        return MinouBatchWriter(normalize(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # overwrite is True in Complete mode: the whole result table is appended again.
        return MinouStreamWriter(normalize(self.options), schema)


DefaultSource = MinouDataSource
