"""Batch and streaming readers: a channel's committed, retained messages by seq.

A partition is one channel's half-open seq range ``[start, end)``, never two channels
(order is kept within a partition). Offsets are ``{channel: next_seq}`` dicts, plain
JSON so Spark can checkpoint them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from minou.client.message import Message

from ._common import (
    ClientConfig,
    LazyClient,
    MinouSparkError,
    binary_payload,
    opt,
    opt_bool,
    opt_int,
    parse_offsets_json,
)

log = logging.getLogger("pyspark_minou")

# Must match to_arrow_schema(SCHEMA_DDL, timezone="UTC") exactly, or Spark raises
# DATA_SOURCE_RETURN_SCHEMA_MISMATCH (P10).
ARROW_SCHEMA = pa.schema([
    pa.field("channel", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("id", pa.string()),
    pa.field("key", pa.string()),
    pa.field("payload", pa.string()),
    pa.field("headers", pa.map_(pa.field("key", pa.string(), nullable=False),
                                pa.field("value", pa.string()))),
    pa.field("published_at", pa.timestamp("us", tz="UTC")),
])
ARROW_SCHEMA_BINARY = ARROW_SCHEMA.set(4, pa.field("payload", pa.binary()))
READ_PAGE = 5000  # messages per broker round trip (the broker caps a page at 10,000)
EARLIEST, LATEST = -2, -1


@dataclass
class MinouPartition(InputPartition):
    channel: str
    start: int
    end: int  # exclusive


def to_record_batch(msgs: list[Message], binary: bool = False) -> pa.RecordBatch:
    if binary:
        payloads: pa.Array = pa.array([m.data for m in msgs], pa.binary())
    else:
        payloads = pa.array([
            (m.data.decode("utf-8", errors="replace") if m.raw else m.data.decode("utf-8"))
            for m in msgs], pa.string())
    return pa.RecordBatch.from_arrays([
        pa.array([m.channel for m in msgs], pa.string()),
        pa.array([m.seq for m in msgs], pa.int64()),
        pa.array([m.id for m in msgs], pa.string()),
        pa.array([m.key for m in msgs], pa.string()),
        payloads,
        pa.array([list(m.headers.items()) for m in msgs], ARROW_SCHEMA.field("headers").type),
        pa.array([round(m.published_at * 1_000_000) for m in msgs],
                 pa.timestamp("us", tz="UTC")),
    ], schema=ARROW_SCHEMA_BINARY if binary else ARROW_SCHEMA)


def split(channel: str, start: int, end: int, size: int) -> list[MinouPartition]:
    return [MinouPartition(channel, s, min(s + size, end)) for s in range(start, end, size)]


def at_least(parts: list[Any], n: int | None) -> list[Any]:
    """Kafka's minPartitions: halve the largest ranges until there are ``n`` partitions
    (or every range is one message)."""
    if not n:
        return parts
    parts = list(parts)
    while len(parts) < n:
        big = max(parts, key=lambda p: p.end - p.start, default=None)
        if big is None or big.end - big.start < 2:
            break
        mid = big.start + (big.end - big.start) // 2
        i = parts.index(big)
        parts[i:i + 1] = [MinouPartition(big.channel, big.start, mid),
                          MinouPartition(big.channel, mid, big.end)]
    return parts


_DURATION = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(name: str, value: str) -> float:
    """``500ms``, ``30s``, ``15m``, ``1h`` (a bare number is seconds): seconds."""
    text = value.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number):] or "s"
    try:
        out = float(number) * _DURATION[unit]
    except (KeyError, ValueError):
        raise MinouSparkError(f"option {name}={value!r}: expected a duration such as 500ms, "
                              "30s, 15m or 1h") from None
    if not out >= 0:
        raise MinouSparkError(f"option {name}={value!r}: must not be negative")
    return out


def fair_share(available: Mapping[str, int], limit: int) -> dict[str, int]:
    """Split ``limit`` rows across channels by water-filling: small channels take all
    they have, the rest share what is left equally (so one hot channel cannot starve
    the others)."""
    if sum(available.values()) <= limit:
        return dict(available)
    out: dict[str, int] = {}
    remaining = limit
    ordered = sorted(available.items(), key=lambda kv: (kv[1], kv[0]))
    for i, (channel, count) in enumerate(ordered):
        take = min(count, remaining // (len(ordered) - i))
        out[channel] = take
        remaining -= take
    return out


def _timestamps(options: Mapping[str, str], every: str, by_channel: str,
                ) -> tuple[float | None, dict[str, float]]:
    """(seconds for every channel, or None; seconds per channel) from Kafka's options
    in milliseconds since the epoch."""
    raw = opt(options, every)
    if raw is not None:
        try:
            return float(raw) / 1000.0, {}
        except ValueError:
            raise MinouSparkError(f"option {every}={raw!r}: expected milliseconds since "
                                  "the epoch") from None
    raw = opt(options, by_channel)
    if raw is None:
        return None, {}
    return None, {c: ms / 1000.0 for c, ms in parse_offsets_json(by_channel, raw).items()}


class _ReadOptions:
    """Read options shared by batch and stream readers."""

    def __init__(self, options: Mapping[str, str], *, streaming: bool) -> None:
        self.config = ClientConfig.from_options(options, kind="read", streaming=streaming)
        channel, pattern = opt(options, "channel"), opt(options, "pattern")
        if not (channel or pattern):
            raise MinouSparkError("give option pattern (e.g. orders/v1/*) or channel to read")
        self.patterns = [p.strip() for p in (pattern or channel or "").split(",") if p.strip()]
        self.starting = opt(options, "startingOffsets", "earliest") or "earliest"
        self.ending = opt(options, "endingOffsets", "latest") or "latest"
        self.per_partition = opt_int(options, "maxRecordsPerPartition", 50_000) or 50_000
        self.min_partitions = opt_int(options, "minPartitions", None)
        self.min_per_trigger = opt_int(options, "minOffsetsPerTrigger", None)
        self.max_trigger_delay = parse_duration(
            "maxTriggerDelay", opt(options, "maxTriggerDelay", "15m") or "15m")
        self.max_per_batch = opt_int(options, "maxRecordsPerBatch", None)
        self.fail_on_data_loss = opt_bool(options, "failOnDataLoss", True)
        self.binary = binary_payload(options)
        name = opt(options, "groupName") or opt(options, "queryName")
        self.group = f"spark:{name}" if name else None
        self._start_json = (parse_offsets_json("startingOffsets", self.starting)
                            if self.starting not in ("earliest", "latest") else None)
        if self.ending not in ("latest", "earliest"):
            self._end_json = parse_offsets_json("endingOffsets", self.ending)
        else:
            self._end_json = None
        # Kafka's timestamp options, in milliseconds since the epoch; they take
        # precedence over startingOffsets / endingOffsets (as Kafka's do).
        self.start_time = _timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp")
        self.end_time = _timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp")
        if streaming and self.end_time != (None, {}):
            raise MinouSparkError("options endingTimestamp and endingOffsetsByTimestamp are "
                                  "for batch queries (spark.read): a stream has no end")
        self._refuse_what_kafka_refuses(options, streaming)

    def seqs_at(self, reader: LazyClient, offsets: Mapping[str, Any],
                which: tuple[float | None, dict[str, float]]) -> dict[str, int]:
        """Per channel of ``offsets``, the first seq published at or after the time the
        option gives it (the broker answers from storage); channels without one are left
        out."""
        every, per_channel = which
        wanted: dict[float, list[str]] = {}
        for channel in offsets:
            at = every if every is not None else per_channel.get(channel)
            if at is not None:
                wanted.setdefault(at, []).append(channel)
        out: dict[str, int] = {}
        for at, channels in wanted.items():
            for i in range(0, len(channels), 256):  # MAX_PATTERNS_PER_REQUEST
                chunk = channels[i:i + 256]
                found = reader.with_client_when_room(
                    lambda c, ch=chunk, t=at: c.offsets_at(ch, t),
                    f"finding the seqs published at {at:.3f}")
                out.update({c: v[2] for c, v in found.items()})
        return out

    def _refuse_what_kafka_refuses(self, options: Mapping[str, str], streaming: bool) -> None:
        """Options that would silently read everything or nothing fail at planning,
        with the reason, as they do with Spark's Kafka source."""
        if streaming:
            if opt(options, "endingOffsets") is not None:
                raise MinouSparkError(
                    "option endingOffsets is for batch queries (spark.read): a streaming "
                    "query reads on as messages arrive and has no end. Drop it, or read "
                    "the bounded range with spark.read")
            return
        starts = (self._start_json or {}).values()
        if self.starting == "latest" or LATEST in starts:
            raise MinouSparkError(
                "option startingOffsets=latest is not allowed in a batch query: it would "
                "always read nothing. Use earliest or a JSON object of seqs, or "
                "spark.readStream to read what arrives from now on")
        if self.ending == "earliest" or EARLIEST in (self._end_json or {}).values():
            raise MinouSparkError(
                "option endingOffsets=earliest is not allowed in a batch query: it would "
                "always read nothing. Use latest or a JSON object of seqs")

    def start_of(self, channel: str, first: int, nxt: int) -> int:
        if self._start_json is not None:
            seq = self._start_json.get(channel, EARLIEST)
        else:
            seq = EARLIEST if self.starting == "earliest" else LATEST
        return first if seq == EARLIEST else nxt if seq == LATEST else seq

    def end_of(self, channel: str, nxt: int) -> int:
        seq = LATEST if self._end_json is None else self._end_json.get(channel, LATEST)
        return nxt if seq in (LATEST, EARLIEST) else min(seq, nxt)

    def check_loss(self, channel: str, start: int, first: int) -> int:
        """Where to read ``channel`` from when ``start`` may be below its retained range."""
        if start >= first:
            return start
        if self.fail_on_data_loss:
            raise MinouSparkError(
                f"data loss on channel {channel!r}: messages [{start}, {first}) are no "
                f"longer retained (retention or purge removed them before they were read). "
                f"Set failOnDataLoss=false to skip the gap.")
        log.warning("channel %s: skipping lost messages [%d, %d)", channel, start, first)
        return first


def read_range(client: Any, part: MinouPartition, fail_on_data_loss: bool = True,
               binary: bool = False) -> Iterator[pa.RecordBatch]:
    pos = part.start
    while pos < part.end:
        msgs, nxt, first = client.read_page(part.channel, pos,
                                            limit=min(READ_PAGE, part.end - pos),
                                            to_seq=part.end)
        if first > pos:
            # Retention or a purge removed [pos, first) after the batch was planned.
            lost_to = min(first, part.end)
            if fail_on_data_loss:
                raise MinouSparkError(
                    f"data loss on channel {part.channel!r}: messages [{pos}, {lost_to}) "
                    "were removed while the query was reading them (retention or purge). "
                    "Set failOnDataLoss=false to skip the gap.")
            log.warning("channel %s: skipping lost messages [%d, %d)", part.channel, pos,
                        lost_to)
        if msgs:
            yield to_record_batch(msgs, binary)
        if nxt <= pos:  # defensive: never spin on a broker that makes no progress
            break
        pos = nxt


class _Reconnecting:
    """``read_page`` through ``LazyClient.with_client``: a read by seq is safe to
    repeat, so a task whose broker restarts reads on from where it was."""

    def __init__(self, owner: LazyClient) -> None:
        self.owner = owner

    def read_page(self, channel: str, pos: int, **kw: Any) -> Any:
        return self.owner.with_client(lambda c: c.read_page(channel, pos, **kw),
                                      f"reading {channel!r} from seq {pos}")


class _PartitionReader(LazyClient):
    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, MinouPartition):
            return  # the placeholder Spark passes when partitions() is empty (P10)
        try:
            opts = getattr(self, "opts", None)
            yield from read_range(_Reconnecting(self), partition,
                                  opts.fail_on_data_loss if opts is not None else True,
                                  opts.binary if opts is not None else False)
        finally:
            # One connection per task: executors' Python workers are reused, but a task
            # must not leave an idle connection (and its loop thread) behind.
            self.close_client()


class MinouBatchReader(_PartitionReader, DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = _ReadOptions(options, streaming=False)
        self.config = self.opts.config
        self._client = None

    def partitions(self) -> list[InputPartition]:
        o = self.opts
        try:
            offsets = self.with_client(lambda c: c.offsets(o.patterns),
                                       f"listing the offsets of {o.patterns}")
        finally:
            self.close_client()
        starts = o.seqs_at(self, offsets, o.start_time)
        ends = o.seqs_at(self, offsets, o.end_time)
        parts: list[InputPartition] = []
        for channel in sorted(offsets):
            first, nxt = offsets[channel]
            start = starts.get(channel) or o.start_of(channel, first, nxt)
            start = o.check_loss(channel, start, first)
            end = ends.get(channel) or o.end_of(channel, nxt)
            if start > end:
                raise MinouSparkError(
                    f"startingOffsets for {channel!r} is seq {start}, past the end of the "
                    f"read (seq {end}: " + ("endingOffsets" if end < nxt else
                                            "the channel's next seq") + "): nothing "
                    "would be read. Start at or below the end")
            parts += split(channel, start, end, o.per_partition)
        return at_least(parts, o.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)


class MinouStreamReader(_PartitionReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source. initialOffset/latestOffset/partitions/commit run in one
    long-lived driver-side process per query, so the client and caches live across
    calls there; read() runs on executors with a fresh unpickled copy (P6)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.opts = _ReadOptions(options, streaming=True)
        self.config = self.opts.config
        self._client = None
        self._target: dict[str, int] | None = None  # pinned by availableNow
        self._first: dict[str, int] = {}
        self._latest: dict[str, int] | None = None
        self._last_trigger = time.monotonic()  # minOffsetsPerTrigger waits from here
        self._renewed_at: float | None = None  # when this process last renewed credentials

    def _offsets(self) -> dict[str, tuple[int, int]]:
        offsets = self.with_client(lambda c: c.offsets(self.opts.patterns),
                                   f"listing the offsets of {self.opts.patterns}")
        self._first = {c: fn[0] for c, fn in offsets.items()}
        self._latest = {c: fn[1] for c, fn in offsets.items()}
        return offsets

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # Driver-side caches mean nothing on an executor.
        state.update(_first={}, _latest=None, _target=None, _renewed_at=None)
        return state

    def initialOffset(self) -> dict[str, int]:
        offsets = self._offsets()
        starts = self.opts.seqs_at(self, offsets, self.opts.start_time)
        return {c: starts.get(c) or self.opts.start_of(c, first, nxt)
                for c, (first, nxt) in sorted(offsets.items())}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_per_batch is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.opts.max_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        # Pin what "available now" means, so messages published while the query drains
        # do not keep it running (P13).
        self._target = {c: nxt for c, (_, nxt) in self._offsets().items()}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        offsets = self._offsets()
        self._renew_when_due()
        begin: dict[str, int] = {}
        available: dict[str, int] = {}
        for channel, (first, nxt) in offsets.items():
            if self._target is not None:
                if channel not in self._target:
                    continue  # appeared after availableNow started: next run's business
                nxt = min(nxt, self._target[channel])
            # A channel that appeared under the pattern enters at its first retained seq.
            s = self.opts.check_loss(channel, int(start.get(channel, first)), first)
            begin[channel] = s
            available[channel] = max(0, nxt - s)
        if isinstance(limit, ReadMaxRows):
            take = fair_share(available, limit.max_rows)
        else:
            take = available
        if self._waits_for_more(sum(take.values())):
            return dict(sorted(start.items()))  # no batch yet
        end = dict(start)  # channels that vanished keep their offset
        for channel, s in begin.items():
            if channel in start:
                end[channel] = s + take[channel]
            elif take[channel] > 0:
                # A new channel enters the offsets at its first retained seq, with no rows
                # in this batch: where it began is then in the offset log, and a replay
                # after a restart checks that start for data loss instead of silently
                # starting wherever the channel's first seq has moved to since.
                end[channel] = s
        return {c: end[c] for c in sorted(end)}

    def _renew_when_due(self) -> None:
        """Every trigger comes here, idle or not: the executors' credential (issued when
        the query was planned) is extended long before it could expire mid-query."""
        now = time.monotonic()
        if self._renewed_at is None or now - self._renewed_at >= self.config.credential_ttl / 4:
            self.renew_credentials()
            self._renewed_at = now

    def _waits_for_more(self, rows: int) -> bool:
        """Kafka's minOffsetsPerTrigger: hold the batch back until that many rows wait,
        or maxTriggerDelay passed since the last batch (not under availableNow)."""
        now = time.monotonic()
        minimum = self.opts.min_per_trigger
        if (minimum and self._target is None and rows < minimum
                and now - self._last_trigger < self.opts.max_trigger_delay):
            return True
        if rows:
            self._last_trigger = now
        return False

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else dict(sorted(self._latest.items()))

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if any(c not in start for c in end) and not self._first:
            self._offsets()  # after a restart the first batch comes straight from the WAL
        parts: list[InputPartition] = []
        for channel in sorted(end):
            s = int(start.get(channel, self._first.get(channel, 1)))
            if channel in self._first and s < self._first[channel]:
                s = self.opts.check_loss(channel, s, self._first[channel])
            parts += split(channel, s, int(end[channel]), self.opts.per_partition)
        return at_least(parts, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._read(partition)

    def commit(self, end: dict[str, int]) -> None:
        # Lags one batch (P12) and is never the resume point (the checkpoint is): it
        # only tells the broker's retention and lag metrics how far this query got.
        if self.opts.group is None or not end:
            return
        try:
            positions = {c: int(s) for c, s in end.items()}
            self.with_client(lambda c: c.set_position(self.opts.group or "", positions),
                             f"reporting the position of group {self.opts.group!r}")
        except Exception as exc:  # an ack is advisory: it must not kill the query
            log.warning("set_position(%s) failed: %s", self.opts.group, exc)

    def stop(self) -> None:
        self.close_client()
