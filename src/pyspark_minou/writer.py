"""Batch and streaming sinks.

``transactional`` (default, exactly-once): each task stages its rows under its own
transaction id and returns that id; the driver publishes every transaction of the
batch in one ``commit_transactions`` call, which the broker fences per
``(writerId, channel)`` on the batch id, so a batch Spark replays after a crash is
discarded instead of published twice. ``direct`` (at-least-once): tasks publish
immediately; a replayed batch is published again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from minou.errors import NotFound

from ._common import RETRYABLE, ClientConfig, LazyClient, MinouSparkError, opt, opt_int

log = logging.getLogger("pyspark_minou")


@dataclass
class MinouCommitMessage(WriterCommitMessage):
    txns: list[str] = field(default_factory=list)
    rows: int = 0
    # The streaming query's id (Spark keeps it in the checkpoint): the run of batches the
    # writer's fences belong to. A new checkpoint is a new run.
    lineage: str = ""


def _headers(headers: Any) -> dict[str, str]:
    """A headers column as the broker takes them: a map<string,string>, or Kafka's
    array<struct<key: string, value: string or binary>>. Message headers are one value
    per name: a name that repeats gets its values joined with ", " (HTTP's rule for a
    repeated header); a null value means no such header (not the text "None")."""
    pairs = headers.items() if isinstance(headers, dict) else headers
    out: dict[str, str] = {}
    for pair in pairs:
        key, value = (pair["key"], pair["value"]) if isinstance(pair, dict) else pair
        if value is None:
            continue
        text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) \
            else str(value)
        name = str(key)
        out[name] = f"{out[name]}, {text}" if name in out else text
    return out


class _Sink(LazyClient):
    streaming = False

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.config = ClientConfig.from_options(options, kind="write",
                                                streaming=self.streaming)
        self._client = None
        self.mode = (opt(options, "sinkMode", "transactional") or "").lower()
        if self.mode not in ("transactional", "direct"):
            raise MinouSparkError(f"option sinkMode={self.mode!r}: expected transactional "
                                  "or direct")
        self.writer_id = opt(options, "writerId")
        if self.mode == "transactional" and not self.writer_id:
            raise MinouSparkError(
                "option writerId is required with sinkMode=transactional: a stable name for "
                "this sink (the same across restarts of the query), used to fence replays")
        self.channel = opt(options, "channel")
        self.batch_size = opt_int(options, "sinkBatchSize", 1000) or 1000
        names = set(schema.fieldNames())
        if "payload" not in names:
            raise MinouSparkError("the minou sink needs a column 'payload': a string (JSON "
                                  "text; use to_json(...)) or binary (raw messages); "
                                  "optional: channel, key, headers")
        if "channel" not in names and not self.channel:
            raise MinouSparkError("give option channel, or a 'channel' column, to say where "
                                  "rows go")
        self.columns = names & {"payload", "channel", "key", "headers"}

    # ------------------------------------------------------------- executor side
    def _item(self, channel: str | None, text: str | bytes | None, key: str | None,
              headers: Any) -> dict[str, Any]:
        # The option wins over a channel column (Kafka's rule for topic): a frame read
        # from minou carries its source channels, and writing it on must not send the
        # rows back where they came from.
        channel = self.channel or channel
        if not channel:
            raise MinouSparkError("a row has a null channel and no option channel is set")
        # A string payload is JSON text already: it goes to the broker as is (Raw), which
        # checks it is JSON (and matches the channel's schema) when it is staged. A binary
        # one is sent as a raw message (not JSON: refused where a schema applies).
        payload: Any = text if isinstance(text, bytes) else msgspec.Raw(
            b"null" if text is None else text.encode("utf-8"))
        item: dict[str, Any] = {"channel": channel, "payload": payload}
        if key is not None:
            item["key"] = key
        if headers:
            item["headers"] = _headers(headers)
        return item

    def _rows_of(self, batches: Iterator[Any]) -> Iterator[dict[str, Any]]:
        """Arrow batches -> message items, a column at a time (no Row objects)."""
        for batch in batches:
            n = batch.num_rows
            cols = {name: batch.column(name).to_pylist() if name in batch.schema.names
                    else [None] * n for name in ("channel", "payload", "key", "headers")}
            yield from (self._item(c, p, k, h) for c, p, k, h in zip(
                cols["channel"], cols["payload"], cols["key"], cols["headers"], strict=True))

    def _write_rows(self, iterator: Iterator[Any], batch_id: int) -> MinouCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx else (0, 0)
        base = f"{(self.writer_id or '')[:100]}:b{batch_id}:p{part}:a{attempt}"
        # The task's Arrow batches so far: after a reconnect, a transactional task stages
        # them all again under a new transaction id (the broker may have restarted and
        # lost what was staged, or kept half a call of it); a direct one resends the
        # batch it was in.
        kept: list[Any] = []
        fresh = iter(iterator)
        deadline: float | None = None
        delay = 0.2
        while True:
            # Unique per task run: Spark reuses (partition, attempt) after a restart or a
            # stage retry, and staging into a leftover transaction of a killed run would
            # publish its rows too.
            txn = f"{base}:{uuid.uuid4().hex}"
            try:
                rows, staged = self._stage_all(txn, kept, fresh)
                break
            except RETRYABLE as exc:
                self._forget(txn)
                deadline = deadline or time.monotonic() + self.config.reconnect_timeout
                self.wait_to_retry(exc, f"writing partition {part} of batch {batch_id}",
                                   deadline, delay)
                delay = min(delay * 2, 2.0)
            except BaseException:
                self._forget(txn)
                raise
        self.close_client()
        lineage = (ctx.getLocalProperty("sql.streaming.queryId") or "") if ctx else ""
        return MinouCommitMessage([txn] if staged else [], rows, lineage)

    def _forget(self, txn: str) -> None:
        """Drop a transaction that will not be committed (frees the broker's memory
        now rather than at its expiry; best effort: the broker may be gone)."""
        if self.mode == "transactional" and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.abort_transactions([txn])
        self.close_client()

    def _stage_all(self, txn: str, kept: list[Any], fresh: Iterator[Any]) -> tuple[int, bool]:
        client = self.client()
        transactional = self.mode == "transactional"
        staged = False
        rows = 0

        def batches() -> Iterator[Any]:
            yield from list(kept)
            for batch in fresh:
                kept.append(batch)
                yield batch

        def flush(items: list[dict[str, Any]]) -> None:
            nonlocal staged
            if transactional:
                client.stage(txn, items)
                staged = True
            else:
                client.send_many(items)

        # Grouped per channel so each stage/send call carries one channel's run of rows.
        pending: dict[str, list[dict[str, Any]]] = {}
        for batch in batches():
            for item in self._rows_of([batch]):
                buf = pending.setdefault(item["channel"], [])
                buf.append(item)
                rows += 1
                if len(buf) >= self.batch_size:
                    flush(buf)
                    pending[item["channel"]] = []
            if not transactional:  # sent and confirmed: a reconnect resends from here
                for channel, buf in pending.items():
                    if buf:
                        flush(buf)
                        pending[channel] = []
                kept.clear()
        for buf in pending.values():
            if buf:
                flush(buf)
        return rows, staged

    # --------------------------------------------------------------- driver side
    def _commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        if self.mode != "transactional":
            return
        mine = [m for m in messages if isinstance(m, MinouCommitMessage)]
        txns = [t for m in mine for t in m.txns]
        if not txns:
            return
        lineage = next((m.lineage for m in mine if m.lineage), "")
        try:
            # Safe to send again: a commit the broker made already is answered as it was.
            result = self.with_client(
                lambda c: c.commit_transactions(self.writer_id or "", batch_id, txns, lineage),
                f"committing batch {batch_id} of writer {self.writer_id!r}")
        except NotFound as exc:
            raise MinouSparkError(
                f"committing batch {batch_id} of writer {self.writer_id!r}: the broker at "
                f"{self.config.brokers} no longer holds the batch's staged transactions "
                "(they expired, an hour after their last STAGE, or were aborted). Nothing "
                "of the batch was published; restart the query and it is written again, "
                f"exactly once. ({exc})") from exc
        finally:
            self.close_client()
        if result.get("failed"):
            raise MinouSparkError(f"the broker refused part of batch {batch_id} of writer "
                                  f"{self.writer_id!r}: {result['failed']}")
        if result.get("replayed_channels"):
            # Expected after a crash between publish and Spark's commit log; otherwise
            # it means writerId/batchId were reused and the rows were NOT written.
            log.warning("writer %s batch %d already published for %s: discarded %s rows",
                        self.writer_id, batch_id, result["replayed_channels"],
                        result.get("discarded"))

    def _abort(self, messages: list[WriterCommitMessage | None]) -> None:
        txns = [t for m in messages if isinstance(m, MinouCommitMessage) for t in m.txns]
        if not txns:
            return
        try:
            self.client().abort_transactions(txns)
        except Exception as exc:  # the broker expires orphaned staged data anyway
            log.warning("abort of %d staged transactions failed: %s", len(txns), exc)
        finally:
            self.close_client()


class MinouBatchWriter(_Sink, DataSourceArrowWriter):
    """``df.write.format("minou")``: one atomic publish per job in transactional mode.

    From ``foreachBatch``, pass ``writerId`` and ``batchId`` options so a replayed
    micro-batch is fenced; a plain batch job keeps the default batchId 0, so a second
    job with the same writerId is discarded: give each job its own writerId.
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        raw = opt(options, "batchId", "0") or "0"
        try:
            self.batch_id = int(raw)
        except ValueError:
            raise MinouSparkError(f"option batchId={raw!r}: expected an integer") from None

    def write(self, iterator: Iterator[Any]) -> MinouCommitMessage:
        return self._write_rows(iterator, self.batch_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            self._commit(messages, self.batch_id)
        finally:
            self.revoke_credentials()  # the job's tasks are done

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        try:
            self._abort(messages)
        finally:
            self.revoke_credentials()


class MinouStreamWriter(_Sink, DataSourceStreamArrowWriter):
    """Streaming sink (Append and Complete modes; Complete re-appends the whole result)."""

    streaming = True

    def write(self, iterator: Iterator[Any]) -> MinouCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        raw = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
        if raw is None:
            raise MinouSparkError("no streaming.sql.batchId in the task context")
        return self._write_rows(iterator, int(raw))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._commit(messages, batchId)
        # Each micro-batch's commit runs in a fresh driver-side process: renew here, so
        # the credential the tasks got at planning outlives the query (a stream that
        # runs no batch for longer than credentialTtl needs a longer one).
        try:
            self.renew_credentials()
        except Exception as exc:  # the batch is committed; the next commit tries again
            log.warning("renewing the executors' credential failed: %s", exc)
        finally:
            self.close_client()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages)
