"""The broker process: storage writer, pump, timers, listeners, lifecycle.

One event loop runs everything. Storage work goes to two threads (one writer
connection that group-commits, one reader connection for pages and range
reads), so the loop never waits for the disk: a small commit is written to the OS
by the loop itself (cheaper than the hand-off), its fdatasync still on the writer
thread (``_write_here``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import hmac
import inspect
import logging
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .. import __version__
from ..auth import keys as keyfiles
from ..auth.credentials import Credentials, decode_credential, encode_credential
from ..auth.registry import (
    ClientRecord,
    Identity,
    Registry,
    check_client_id,
    decode_record,
    encode_record,
)
from ..auth.rules import ALLOW_ALL
from ..config import Settings
from ..core.broker import Broker, Session
from ..core.log import Msg, page_end
from ..core.writes import WriteBatch
from ..errors import (
    BadRequest,
    ErrorCode,
    NotAuthenticated,
    NotAuthorized,
    RequestError,
    ShuttingDown,
    StartupError,
    StorageError,
    StorageFenced,
    StorageFull,
    StorageLocked,
    StorageUnavailable,
    TooManyConnections,
    UnexpectedFrame,
)
from ..limits import (
    COMMIT_HERE_BACKOFF_S,
    COMMIT_HERE_MAX_BYTES,
    COMMIT_HERE_MAX_MESSAGES,
    COMMIT_HERE_SLOW_COUNT,
    COMMIT_HERE_SLOW_S,
    COMMIT_HERE_SLOW_WINDOW_S,
    COMMIT_HERE_STALL_S,
    CONSUMER_WRITE_HIGH,
    CONSUMER_WRITE_LOW,
    DRAIN_COMMIT_WAIT_S,
    EXPIRY_LOG_LINES,
    GC_THRESHOLD,
    HTTP_UNSENT_BYTES,
    MAX_FRAME_SIZE,
    MIN_CHECKPOINT_WAL_BYTES,
    OFFSETS_MATCH_SLICE,
    PUBLISH_RESUME_BYTES,
    RATE_SAMPLE_LOOK,
    RATE_SAMPLE_SLICE_S,
    RATE_SAMPLE_SPACING,
    REFUSAL_LINGER_S,
    REFUSAL_WAIT_S,
    RETENTION_LOOK_SLICE,
    RETENTION_LOOKS_PER_TICK,
    RETENTION_WALK_SLICE,
    SEQS_AT_SLICE,
    SETTLE_COMMIT_DELAY_S,
    SNAPSHOT_LOOK,
    STALL_GRACE_S,
    STALL_S,
    STORAGE_PROBE_S,
    STORAGE_READ_BYTES,
    STORAGE_READ_PAGE,
    STORAGE_RETRY_S,
    SWEEP_INTERVAL_S,
)
from ..protocol import frames as f
from ..storage.base import Housekeeping, Storage, Syncing
from ..storage.factory import open_storage
from . import oplog
from .admission import Admission, descriptor_limit, raise_descriptor_limit
from .binding import bind_listener
from .connection import NativeConnection
from .datadir import DataDirLocks
from .delivery_budget import DeliveryBudget
from .engine import Engine, Load
from .federation import LOCAL_CREDENTIAL, Federation
from .http_unread import UnreadAnswers, cut_all
from .input_budget import InputBudget, input_budget_limits
from .kv import read_buckets
from .lookups import ClientLookups
from .oplog import watch_handshakes
from .syncer import IntervalSync
from .wire import internal_error, native_error

if TYPE_CHECKING:
    from ..core.log import ChannelLog
    from .http_stream import StreamSession
    from .primary import PrimaryRole
    from .spread import SpreadRole

log = logging.getLogger("minou.server")
# How long after a first start another broker's admin key stored over this one's is taken
# for the race of brokers started together (after that, it is a rotation)
ADMIN_RACE_S = 60.0


class _TcpProtocol(asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.conn: NativeConnection | None = None
        self.transport: asyncio.Transport | None = None
        self.refusal: TooManyConnections | None = None  # over the limit: to answer
        self._refusal_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        refusal = self.server.admission.enter(transport, "native", peer)
        if refusal is not None:
            if not transport.is_closing():
                # Answered when the HELLO comes (a client reads the error as the answer
                # to it), or after REFUSAL_WAIT_S; self.conn stays None.
                self.refusal = refusal
                self._refusal_timer = asyncio.get_running_loop().call_later(
                    REFUSAL_WAIT_S, self._refuse)
            return
        transport.set_write_buffer_limits(CONSUMER_WRITE_HIGH, CONSUMER_WRITE_LOW)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self.conn = NativeConnection(self.server, transport, oplog.peer_text(peer))
        self.server.admit(conn)
        self.server.admission.idle(transport, conn.evicted)  # until its HELLO

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.receive(data)
        elif self.refusal is not None:
            self._refuse()  # and what comes after is dropped

    def _refuse(self) -> None:
        """The fatal error frame, then our half of the connection closes; the socket is
        read (and dropped) until the peer closes or REFUSAL_LINGER_S passes: closing it
        with data unread would make the kernel send a reset, which can destroy the error
        before the peer reads it."""
        exc, transport, self.refusal = self.refusal, self.transport, None
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
        if exc is None or transport is None or transport.is_closing():
            return
        transport.write(f.encode(native_error(0, exc, fatal=True)))
        if not transport.can_write_eof():  # TLS
            transport.close()
            return
        transport.write_eof()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.admission.leave(self.transport)
        if self._refusal_timer is not None:
            self._refusal_timer.cancel()
        if self.conn is not None:
            self.conn.lost()
            self.server.connections.discard(self.conn)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_paused(True)

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.set_paused(False)


def _sync_commit(storage: Syncing) -> None:
    """The fdatasync that makes a commit written on the loop durable (writer thread);
    its failure told as the writer's own commit failures are."""
    try:
        storage.sync()
    except OSError as exc:
        raise StorageUnavailable(f"commit failed: fsync of the write-ahead log failed "
                                 f"({exc.strerror or exc})") from exc


def _channel_totals(logs: Iterable[ChannelLog]) -> tuple[int, int, int]:
    """What ``logs`` published, and delivered and acked over all their readers."""
    published = delivered = acked = 0
    for log_ in logs:
        published += log_.published
        for reader in log_.states:
            delivered += reader.delivered
            acked += reader.acks
    return published, delivered, acked


def _add_queue_stats(totals: dict[str, float], logs: Iterable[ChannelLog],
                     oldest: dict[str, float | None], now: float) -> None:
    """Add ``logs``' numbers to their queue's ``totals`` for a scrape (metrics.Metrics)."""
    for log_ in logs:
        totals["published"] += log_.published
        totals["dropped"] += log_.dropped
        totals["expired"] += log_.expired
        totals["depth"] += log_.count
        totals["unsettled"] += sum(len(gc.pending) for gc in log_.states)
        published = oldest.get(log_.name)
        if published:  # the queue's oldest message is the oldest over its channels
            totals["oldest_age_s"] = max(totals["oldest_age_s"], round(now - published, 3))


class BrokerServer:
    def __init__(self, settings: Settings, storage: Storage | None = None) -> None:
        self.settings = settings
        self.core = Broker(
            broker_id=settings.broker_id,
            channel_options=settings.channel_options,
            max_message_size=settings.max_message_size,
            dedup_window=settings.dedup_window,
            default_lease=settings.default_lease,
        )
        self.core.rules = settings.rules
        self.core.strict_schemas = settings.strict_schemas
        self.core.any_interval = settings.any_interval
        self.core.dedup.max_keys = settings.max_dedup_keys
        self.core.max_channels = settings.max_channels
        self.core.in_flight.configure(settings.in_flight_bytes)
        self.registry = Registry()
        self.credentials = Credentials()
        self.authentications: Counter[str] = Counter()  # native HELLOs, by method
        self.admin_key_path: Path | None = None
        self._made_admin_key = ""  # its fingerprint, if this start made the admin key
        self._admin_race_until = 0.0
        self.tls: Any = None  # tls.TlsFiles when the listeners speak TLS
        self.federation = Federation(self)  # [[federation]] links (started with start())
        self.overrides: dict[str, Any] = {}  # command-line settings a reload keeps
        self.reloads = 0
        self._dedup_warned = (0.0, 0)  # (when, evicted count then): see _warn_dedup_evictions
        from .metrics import Metrics

        self.metrics = Metrics(self.metrics_snapshot)
        self.rates = self.metrics.rates
        self._queue_names: dict[str, str] = {}  # "orders/v1/" -> its queue (_sample_rates)
        self._retention_walked = 0  # channels before it were looked at (_apply_retention)
        self.core.delivery_latency = self.metrics.delivery_latency
        self.core.ack_latency = self.metrics.ack_latency
        self.http_consumers: Any = None  # http_consumers.HttpConsumers with the HTTP API
        self.http_asks: set[asyncio.Future[Any]] = set()  # HTTP requests awaiting replies
        self.closing = False  # stop() has begun: long polls answer at once
        # Passed in (tests, the simulator) or chosen by Settings.storage.
        self.storage: Storage = storage if storage is not None else open_storage(settings)
        local = [Path(self.storage.path).parent] if self.storage.backend == "sqlite" else []
        self._dir_lock = DataDirLocks(settings.data_dir, *local)
        self.max_frame_size = max(MAX_FRAME_SIZE, settings.max_message_size * 2)
        self.input_budget = InputBudget(*input_budget_limits(self.max_frame_size))
        self.connections: set[NativeConnection] = set()
        self.streams: set[StreamSession] = set()  # /v1/stream sockets
        # Every client socket of both listeners, against one limit (admission.py).
        self.admission = Admission(max_connections=lambda: self.settings.max_connections,
                                   per_client=lambda: self.settings.max_connections_per_client,
                                   count_refusal=self.core.counters.refuse)
        self.counters_internal = 0
        self.slow_consumers = 0
        self.dead_connections = 0  # cut after missing their heartbeats
        self.unsent_delivery_bytes = 0  # deliveries written but not yet sent (last tick)
        self.delivery_budget = DeliveryBudget()
        self.http_unread = UnreadAnswers()  # HTTP answers written, not read (last tick)
        self.started_at = time.time()
        self.native_address: tuple[str, int] | None = None
        self.http_address: tuple[str, int] | None = None
        self.resp_address: tuple[str, int] | None = None  # the Redis protocol's
        self.resp_connections: set[Any] = set()
        # The Redis door's read answers: bytes being gathered, and the connections
        # with more than their water mark of replies unsent (resp._answers_held).
        self.resp_range_held = 0
        self.resp_unread: set[Any] = set()
        self.resp_multi_bytes = 0  # MULTI queues' bytes, all connections (resp.py)
        self._resp_socket: socket.socket | None = None
        self._resp: Any = None
        self.resp_groups: Any = None  # resp_groups.RespGroups with the Redis protocol
        self.serving = False  # listening and open: what the Redis door waits for
        self._http_auth: Any = None
        self.commit_seconds_total = 0.0
        self.commits = 0
        self.commits_here = 0  # of them, written to the OS by the loop (_write_here)
        self.commits_here_slow = 0  # of those, the ones that took the loop too long
        self._write_here_after = 0.0  # perf_counter before which none is made there
        self._slow_commits_here: collections.deque[float] = collections.deque(
            maxlen=COMMIT_HERE_SLOW_COUNT)  # when the last slow ones ended
        self.messages_committed = 0
        self.stop_reason = ""  # what asked for the stop (a signal, a soft stop, a failure)
        self.exit_status = 0  # non-zero when the broker stops because it cannot go on
        # While the disk (or [storage] max_size) is full: the refusal publishes get.
        self.storage_full: StorageFull | None = None
        self.storage_full_since = 0.0
        self.storage_full_commits = 0  # commits refused for want of space, since start
        # While a storage that comes back by itself (Redis) cannot be reached: the
        # refusal publishes get (STORAGE_UNAVAILABLE), since when, commits it failed.
        self.storage_down: StorageUnavailable | None = None
        self._wal_rescue: asyncio.Future[None] | None = None  # the WAL removed: _watch_wal
        self._down_locked = False  # storage_down: a write lock another process holds
        self.storage_down_since = 0.0
        self.storage_down_commits = 0
        # Several brokers on one Redis (a storage with ``lease``): this broker's part.
        self.primary: PrimaryRole | SpreadRole | None = None
        self.stopped_in_standby = False
        self._retry_at = 0.0  # while full, no commit before this (monotonic)
        self._retry_timer = False
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="minou-writer")
        self._reader_pool = ThreadPoolExecutor(1, thread_name_prefix="minou-reader")
        # OFFSETS-at being answered, per client
        self.lookups = ClientLookups(settings.max_offsets_at_per_client)
        self._house_pool = ThreadPoolExecutor(1, thread_name_prefix="minou-checkpoint")
        # Writes the text of a scrape (one at a time): never on the loop, never with storage
        self._metrics_pool = ThreadPoolExecutor(1, thread_name_prefix="minou-metrics")
        self._series_omitted_said = float("-inf")  # monotonic: metrics_max_queues logged
        self._scrape: asyncio.Future[bytes] | None = None  # the scrape being made, shared
        self._checkpoint: asyncio.Future[None] | None = None
        self._idle_checkpoint_after = -1.0  # the last commit's time at the last idle one
        self.syncer: IntervalSync | None = None  # durability "interval": the fsyncs after
        # Every door's commands, commits, answers and deliveries (engine.py: no I/O; this
        # server is its Host: the writer thread, the reader thread, the loop's timers).
        self.engine = Engine(
            self.core, self, settle_delay=SETTLE_COMMIT_DELAY_S,
            pause_bytes=lambda: self.settings.publish_pause_bytes,
            resume_bytes=PUBLISH_RESUME_BYTES)
        self.engine.publish_latency = self.metrics.publish_latency
        self.engine.long_polls.per_client = settings.max_long_polls_per_client
        self.scheduler = self.engine.scheduler
        self._last_commit_at = 0.0
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._tcp: asyncio.base_events.Server | None = None
        self._http: Any = None
        self._stopping = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def spread(self) -> SpreadRole | None:
        """This broker's part when the queues are spread over several brokers."""
        primary = self.primary
        if primary is None:  # asked on every HTTP publish: no import machinery then
            return None
        from .spread import SpreadRole

        return primary if isinstance(primary, SpreadRole) else None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        # Millions of small long-lived objects (messages, leases) make the default cyclic
        # GC thresholds stall the loop for milliseconds; nothing here relies on cycles.
        gc.set_threshold(GC_THRESHOLD, 50, 100)
        before, _ = raise_descriptor_limit()
        self.admission.descriptor_limit = descriptor_limit
        self.admission.descriptors_before = before
        if self.settings.http_port is not None:
            from .http import check_fast_path

            check_fast_path()  # a uvicorn without what the HTTP protocol needs: fail now
        # Lock the directory, then bind, then open storage: a second broker on this
        # directory or a busy port fails here, before anything is written.
        self._dir_lock.acquire()
        sockets: list[socket.socket] = []
        try:
            s = self.settings
            sockets.append(bind_listener(s.host, s.port, "native protocol", "--port"))
            if s.http_port is not None:
                sockets.append(bind_listener(s.host, s.http_port, "HTTP", "--http-port"))
            if s.resp_port is not None:
                self._resp_socket = bind_listener(s.host, s.resp_port, "Redis protocol",
                                                  "--resp-port")
        except StartupError:
            for sock in sockets:
                sock.close()
            self._dir_lock.remove_if_fresh()
            raise
        if self._resp_socket is not None:
            await self._serve_resp()  # LOADING until this broker serves (redis-py retries)
        try:
            if hasattr(self.storage, "spread_as") and \
                    self.settings.storage_placement == "spread":
                from .spread import SpreadRole

                self.primary = SpreadRole(self, sockets)
                await self.primary.join()
                self._tasks.append(asyncio.create_task(self.primary.keep(),
                                                       name="minou-alive"))
            elif hasattr(self.storage, "lease"):  # shared storage: one primary serves
                from .primary import PrimaryRole

                self.primary = PrimaryRole(self, sockets)
                if not await self.primary.acquire():  # asked to stop while standby
                    self.stopped_in_standby = True
                    await self.primary.release()
                    for sock in sockets:
                        sock.close()
                    if self._resp is not None:
                        self._resp.close()
                    self._dir_lock.release()
                    return
                # Renewed from now on, not once the state is open: opening it (claims,
                # reading every queue) can take longer than owner_lease (a big state, a
                # slow link to Redis, a loaded machine), and a lease that ran out
                # meanwhile is taken by another standby before this broker served at all.
                self._tasks.append(asyncio.create_task(self.primary.keep(),
                                                       name="minou-lease"))
            await self.open()
            if self.spread is not None:
                await self.spread.settle_in()  # its share of the queues, before serving
            await self._listen(*sockets)
        except BaseException:
            for task in self._tasks:
                task.cancel()
            for sock in sockets:
                sock.close()
            if self._resp is not None:
                self._resp.close()
            self._dir_lock.release()
            raise
        self._tasks.append(asyncio.create_task(self._ticker(), name="minou-ticker"))
        self._tasks.append(asyncio.create_task(self._rate_sampler(), name="minou-rates"))
        self.engine.commit()
        self.engine.request_pump()
        self.federation.apply(self.settings.federation)  # links to other places

    async def _serve_resp(self) -> None:
        from .resp import start_resp
        from .resp_groups import RespGroups
        from .resp_keys import Scripts

        assert self._resp_socket is not None
        self.resp_groups = RespGroups(self)
        self.resp_scripts = Scripts()
        self.resp_script_lock = asyncio.Lock()  # one Lua script at a time
        self._resp = await start_resp(self, self._resp_socket, self._tls_context())
        name = self._resp_socket.getsockname()
        self.resp_address = (name[0], name[1])

    def local_url(self) -> str:
        """This broker's native URL as a process on its own machine reaches it."""
        assert self.native_address is not None
        host, port = self.native_address
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return _addr((host, port), "minous" if self.tls else "minou") or ""

    async def open(self) -> None:
        """Open storage and restore the broker's state, listening to nothing: what
        ``start`` does before it accepts connections, and all an in-process test or a
        simulator needs (connections are then made over their own transports)."""
        self.loop = asyncio.get_running_loop()
        if isinstance(self.storage, Syncing):
            self.syncer = IntervalSync(self.storage, self.loop, self._sync_failed)
        now = time.time()
        opening = self.storage.open_shared if self.spread is not None else self.storage.open
        snap = await self.loop.run_in_executor(self._writer_pool, opening, now)
        buckets = await self.loop.run_in_executor(self._writer_pool, read_buckets,
                                                  self.storage, snap)
        self.core.restore(snap, now)
        for name, msgs in buckets.items():
            self.core.index_bucket(name, msgs)
        self.registry = Registry((decode_record(blob) for blob in snap.clients),
                                 admins=self.settings.admins)
        self.credentials = Credentials(decode_credential(b) for b in snap.credentials)
        self._stage_registry()  # records of older versions, with their admin answer
        for old, new in self.core.migrate_listen_keys(self.registry.records).items():
            log.warning("durable listener %r of an older version is now %r (its client "
                        "id has ':' or '%%')", old, new)
        self.registry.replay.load(snap.used_tokens, time.time())
        self._ensure_admin_key()

    async def _listen(self, native: socket.socket, http: socket.socket | None = None) -> None:
        assert self.loop is not None
        ssl_context = self._tls_context()
        self._tcp = await self.loop.create_server(
            lambda: _TcpProtocol(self), sock=native, ssl=ssl_context,
            # A socket holds a descriptor through its handshake, before it is counted.
            ssl_handshake_timeout=self.settings.hello_timeout if ssl_context else None,
        )
        name = native.getsockname()
        self.native_address = (name[0], name[1])
        if http is not None:
            from .http import start_http
            from .http_consumers import HttpConsumers

            self.http_consumers = HttpConsumers(self)

            self._http, self.http_address = await start_http(self, http)
        self.serving = True  # the Redis protocol door stops answering LOADING

    async def serve_forever(self) -> None:
        await self._stopping.wait()

    def request_stop(self) -> None:
        self._stopping.set()

    def _end_http_waits(self) -> None:
        """Stopping: the HTTP long polls still waiting are answered now, not cut after
        the stop's wait for them: KV watches with what they have, requests awaiting a
        reply with SHUTTING_DOWN (503)."""
        for wakes in list(self.engine.channel_waiters.values()):
            for wake in list(wakes):
                wake()
        for fut in list(self.http_asks):
            if not fut.done():
                fut.set_exception(ShuttingDown(
                    "the broker is stopping: the reply cannot come back through it; ask "
                    "again (another broker, or this one once restarted)"))

    async def stop(self) -> None:
        self.accepting = False
        self.closing = True
        await self.federation.stop()
        if self._tcp is not None:
            self._tcp.close()
        if self._http is not None:
            self._http.should_exit = True
            if self.http_consumers is not None:
                self.http_consumers.end_waits()
            self._end_http_waits()
        if self._resp is not None:
            self._resp.close()
        elif self._resp_socket is not None:  # bound, never served (stopped in standby)
            self._resp_socket.close()
        closed = len(self.connections) + len(self.streams)
        for conn in list(self.connections):
            conn.close()
        commits, messages = self.commits, self.messages_committed
        # Let the writer commit what is staged (confirms for accepted publishes), unless
        # this broker lost its lease: its writes are fenced, there is nothing to wait for.
        lost = self.primary is not None and self.primary.role == "lost"
        self.engine.commit(force=True)
        for _ in range(0 if lost else 500):
            if self.scheduler.idle and (self.scheduler.stopped or (
                    not self.core.batch and not self.core.has_dirty)):
                break
            if self.scheduler.idle:
                self.engine.commit(force=True)
            await asyncio.sleep(0.01)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.http_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.http_task, 5)
        loop = asyncio.get_running_loop()
        if self.primary is not None:
            await self.primary.release()
        if lost:  # a commit may be stuck in a partition: not waited for (run_broker)
            if self.syncer is not None:
                self.syncer.abandon()
            for pool in (self._writer_pool, self._reader_pool, self._house_pool,
                         self._metrics_pool):
                pool.shutdown(wait=False, cancel_futures=True)
            self._dir_lock.release()
            log.info("stopped on %s: %d connection(s) closed; nothing more is written",
                     self.stop_reason, closed)
            return
        if self.syncer is not None:
            with contextlib.suppress(OSError):  # logged; the exit status says it
                await self.syncer.close()
        if self.commits_here and self.syncer is not None:
            # The loop's own connection (_write_here), first: SQLite's last close
            # checkpoints the whole WAL, which must not happen on the loop.
            self.syncer.storage.close_here()
        await loop.run_in_executor(self._writer_pool, self.storage.close)
        await loop.run_in_executor(self._reader_pool, self.storage.close)
        await loop.run_in_executor(self._house_pool, self.storage.close)
        for pool in (self._writer_pool, self._reader_pool, self._house_pool,
                     self._metrics_pool):
            pool.shutdown()
        self._dir_lock.release()
        left = len(self.core.batch.messages)
        log.info("stopped%s: %d connection(s) closed; flushed %d message(s) in %d commit(s)%s; "
                 "%s closed", f" on {self.stop_reason}" if self.stop_reason else "", closed,
                 self.messages_committed - messages, self.commits - commits,
                 f"; {left} staged message(s) NOT committed" if left else "", self.storage.path)

    http_task: asyncio.Task[Any] | None = None

    @property
    def accepting(self) -> bool:
        return self.engine.accepting

    @accepting.setter
    def accepting(self, value: bool) -> None:
        self.engine.accepting = value

    @property
    def draining(self) -> bool:
        """A soft stop: what is out settles, nothing new goes out."""
        return self.engine.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.engine.draining = value

    # -------------------------------------------------------------- sessions
    @property
    def http_auth(self) -> Any:
        """Bearer authentication as HTTP does it (the Redis protocol's AUTH uses it)."""
        if self._http_auth is None:
            from .http_auth import HttpAuth

            self._http_auth = HttpAuth(self)
        return self._http_auth

    def input_done(self, holder: Any) -> None:
        """``holder``'s large frame or body is whole, or its connection gone: its room
        goes to the connections waiting for some (input_budget.py)."""
        for granted in self.input_budget.release(holder, time.monotonic()):
            granted.input_granted()

    def admit(self, conn: NativeConnection) -> None:
        """A new native connection (TCP or /v1/ws), its socket already within the
        connection limit (self.admission): enforce the HELLO deadline."""
        self.connections.add(conn)
        assert self.loop is not None

        def hello_deadline() -> None:
            conn.hello_timer = None
            if conn.session is None and not conn.closed:
                conn.refuse(UnexpectedFrame(f"no HELLO within {deadline:g} s"))

        deadline = self.settings.hello_timeout
        # Cancelled by the HELLO or the connection's end: left to ring, it held every
        # connection for hello_timeout (10 s) after it went, long enough for the cyclic
        # GC to move it to the old generation, freed only by a rare full collection: a
        # client reconnecting in a loop grew the broker ~3-5 KiB a connection.
        conn.hello_timer = self.loop.call_later(deadline, hello_deadline)

    # ------------------------------------------------------------ security
    def _ensure_admin_key(self) -> None:
        """Secure by default: a fresh broker makes the key of its first admin."""
        if self.settings.auth_mode != "keys" or "admin" not in self.settings.admins:
            return
        path = Path(self.settings.data_dir) / "admin.key"
        if "admin" not in self.registry.records:
            if path.exists():
                key = keyfiles.load_private(path)
            else:
                key = keyfiles.generate()
                keyfiles.save(key, self.settings.data_dir, "admin")
            self.registry.register("admin", keyfiles.public_pem(key).decode(),
                                   note="made by the broker at first start")
            self.persist_registry()
            self._made_admin_key = keyfiles.fingerprint(key)
            self._admin_race_until = time.monotonic() + ADMIN_RACE_S
        self.admin_key_path = path if path.exists() else None

    def _check_admin_key(self, stored: ClientRecord | None) -> None:
        """Brokers on one Redis started together for the first time: each found no admin
        and made a key; the one stored last is the admin's (whichever was made first).
        The others take it, say so (once), set their key file aside and stop pointing
        at it."""
        made, path = self._made_admin_key, self.admin_key_path
        if made and time.monotonic() > self._admin_race_until:
            self._made_admin_key = ""  # past the start: a change is a rotation, not a race
            return
        if not made or stored is None or stored.fingerprint == made:
            return
        self._made_admin_key = ""
        self.registry.overwrite(stored)
        self.drop_client("admin", "the admin key is another broker's (made at the same "
                                  "first start)")
        if path is None:
            return
        aside = path.with_name("admin.key.unused")
        with contextlib.suppress(OSError):
            path.rename(aside)
        self.admin_key_path = None
        log.warning("another broker on %s started for the first time together with this "
                    "one and its admin key was stored last: the admin's key is %s (the "
                    "admin.key in that broker's data dir); this broker's, never the "
                    "admin's, is set aside as %s", self.storage.path, stored.fingerprint,
                    aside)

    def _tls_context(self) -> Any:
        if not self.settings.tls_enabled:
            return None
        from ..tls import ensure_self_signed, load_files, server_context

        s = self.settings
        if s.tls_cert and s.tls_key:
            self.tls = load_files(Path(s.tls_cert), Path(s.tls_key))
        else:
            self.tls = ensure_self_signed(Path(s.data_dir) / "tls", hosts=[s.host])
        return watch_handshakes(server_context(self.tls), "native", self.count_tls_failure)

    def count_tls_failure(self) -> None:
        self.registry.failures["tls_handshake"] += 1

    def authenticate(self, hello: f.Hello, peer: str = "") -> Identity:
        """Who the HELLO proves to be, or NotAuthenticated with the precise reason.
        What it learnt (a first registration, the token's id) is staged in the core's
        batch but not written yet: the caller first hangs its answer on that commit."""
        s = self.settings
        if s.broker_token is not None:
            why = None
            if not hello.broker_token:
                why, text = "broker_token_required", "this broker requires the broker token"
            elif not hmac.compare_digest(hello.broker_token.encode(), s.broker_token.encode()):
                why, text = "bad_broker_token", "the broker token does not match"
            if why is not None:
                self.registry.failures[why] += 1
                raise NotAuthenticated(text, why=why)
        if hello.credential and hello.credential.startswith(LOCAL_CREDENTIAL):
            if not self.federation.credential_ok(hello.credential):
                self.registry.failures["bad_federation_credential"] += 1
                raise NotAuthenticated("this credential is not this broker's own",
                                       why="bad_credential")
            # A federation link of this very process, reading or writing here.
            return Identity(hello.client_id, True, method="federation")
        if hello.credential and hello.credential.startswith("mlk1.") and \
                self.spread is not None:
            try:  # another broker of the cluster, forwarding for a client it authenticated
                self.spread.verify_link(hello.credential, hello.client_id)
            except NotAuthenticated as exc:
                self.registry.failures[str(exc.detail.get("why", "bad_link"))] += 1
                raise
            return Identity(hello.client_id,
                            self.registry.is_admin(hello.client_id, s.admins), method="link")
        if s.auth_mode == "off":
            # No key, but the same id rules: an id with control characters or "/" would
            # forge lines of the log and listings here as anywhere.
            check_client_id(hello.client_id)
            return Identity(hello.client_id, True, method="development")
        if s.auth_mode == "token":
            return Identity(hello.client_id, True, method="broker_token")
        if hello.credential:
            return self.delegated(hello.credential, hello.client_id)
        if not hello.token:
            raise NotAuthenticated(
                f"broker {self.core.broker_id!r} requires a token signed with the client's "
                f"key (aud = {self.core.broker_id!r})",
                why="token_required", broker_id=self.core.broker_id)
        try:
            return self.registry.authenticate(
                client_id=hello.client_id, token=hello.token, public_key=hello.public_key,
                audience=self.core.broker_id, admins=s.admins, accepts=s.rules.accepts,
                address=oplog.peer_host(peer), max_clients=s.max_clients)
        finally:
            if self.spread is not None:
                # Its id is claimed in Redis before the WELCOME (SpreadRole.token_claim):
                # stored by the commit first, it would be found there, as if replayed.
                self.registry.replay.take_new()
            self._stage_registry()

    def delegated(self, credential: str, client_id: str | None = None) -> Identity:
        """Who a delegated credential speaks for (auth.credentials), or NotAuthenticated.
        Admin operations stay refused to it (admin.run_admin), whatever its owner is."""
        try:
            record = self.credentials.verify(credential, self.registry.records,
                                             client_id=client_id)
        except NotAuthenticated as exc:
            self.registry.failures[str(exc.detail.get("why", "bad_credential"))] += 1
            raise
        admin = self.registry.is_admin(record.client_id, self.settings.admins)
        return Identity(record.client_id, admin, record.fingerprint, method="credential",
                        credential=record.id)

    def _stage_registry(self) -> bool:
        """Key registrations, used token ids and credentials into the next commit (a
        restart must not make a captured token usable again); whether there were any."""
        changes = self.registry.take_changes()
        for client_id, record in changes.items():
            self.core.batch.clients[client_id] = (
                encode_record(record) if record is not None else None)
        used = self.registry.replay.take_new()
        self.core.batch.used_tokens.extend(used)
        issued = self.credentials.take_changes()
        for credential_id, credential in issued.items():
            self.core.batch.credentials[credential_id] = (
                encode_credential(credential) if credential is not None else None)
        return bool(changes or used or issued)

    def refresh_registry(self, clients: dict[Any, bytes], credentials: dict[Any, bytes]
                         ) -> None:
        """Queues spread over brokers: what the others stored of the key registry and
        the delegated credentials (read every third of the lease), so that a client
        registered, approved or revoked on one broker is so on every broker within a
        second or so; the connections of a client revoked elsewhere go."""
        records = [decode_record(b) for b in clients.values()]
        gone = self.registry.refresh(records)
        voided = self.credentials.refresh(decode_credential(b) for b in credentials.values())
        self._check_admin_key(next((r for r in records if r.client_id == "admin"), None))
        for client_id in gone:
            self.drop_client(client_id, "revoked (or its key rotated) on another broker")
        for credential_id in voided:  # revoked (or expired and forgotten) elsewhere
            self.drop_client("", f"credential {credential_id!r} was revoked on another "
                                 "broker (or expired there)", credential=credential_id)

    def persist_registry(self) -> None:
        if self._stage_registry():
            self.engine.commit()

    def access_for(self, identity: Identity) -> Any:
        return ALLOW_ALL if identity.admin else self.settings.rules.for_client(identity.client_id)

    def open_session(self, identity: Identity, conn: NativeConnection) -> Session:
        return Session(identity.client_id, conn, access=self.access_for(identity),
                       admin=identity.admin)

    def drop_client(self, client_id: str, reason: str, *, credential: str = "") -> int:
        """Close every connection of ``client_id`` (revoked or its key rotated) and void
        its credentials; with ``credential``, only the connections that presented it."""
        if credential:
            def gone(identity: Identity) -> bool:
                return identity.credential == credential
        else:
            def gone(identity: Identity) -> bool:
                return identity.client_id == client_id and \
                    identity.method in ("key", "credential")
            if self.credentials.revoke_client(client_id):
                self.persist_registry()
        return self._close_where(gone, lambda _: NotAuthenticated(reason, why="revoked"))

    def end_lapsed_credentials(self, now: float) -> int:
        """Close the connections (every door) that presented a credential which has
        just expired: it was good until then, and so are they."""
        ended = self.credentials.lapsed(now)
        if not ended:
            return 0

        def gone(identity: Identity) -> bool:
            return identity.method == "credential" and identity.credential in ended

        def why(identity: Identity) -> NotAuthenticated:
            return NotAuthenticated(
                f"credential {identity.credential!r} of client {identity.client_id!r} "
                "expired; the process holding the client's key must issue or renew one",
                why="credential_expired")

        closed = self._close_where(gone, why)
        if closed:
            log.info("%d connection(s) closed: their delegated credential expired", closed)
        return closed

    def _close_where(self, gone: Callable[[Identity], bool],
                     refusal: Callable[[Identity], NotAuthenticated]) -> int:
        dropped = 0
        for conn in list(self.connections):
            if conn.identity is not None and gone(conn.identity):
                conn.refuse(refusal(conn.identity))
                dropped += 1
        for stream in list(self.streams):
            if gone(stream.identity):
                stream.end(int(NotAuthenticated.code), refusal(stream.identity).message,
                           "not_authenticated")
                dropped += 1
        return dropped

    # --------------------------------------------------------------- reload
    def reload(self, *, by: str = "admin request") -> dict[str, Any]:
        """Re-read the config file and apply rules, schemas, limits and channel options
        to the running broker without dropping a connection. A config that does not
        validate changes nothing (BadRequest says why). Logs one line; ``by`` says what
        asked for it."""
        from dataclasses import replace

        from ..config import load_settings
        from ..errors import BadRequest, ConfigError

        old = self.settings
        if old.config_path is None:
            raise BadRequest("the broker was started without --config: nothing to reload")
        try:
            new = load_settings(old.config_path, **self.overrides)
        except ConfigError as exc:
            if by != "SIGHUP":  # (the SIGHUP handler logs its own failure)
                log.error("reload (%s) refused, nothing changed: %s", by, exc)
            raise BadRequest(f"reload refused, nothing changed: {exc}") from None
        restart = [k for k in _RESTART_KEYS if getattr(new, k) != getattr(old, k)]
        new = replace(new, **{k: getattr(old, k) for k in _RESTART_KEYS})
        changed = [k for k in _RELOAD_KEYS if _comparable(getattr(new, k)) !=
                   _comparable(getattr(old, k))]
        self.settings = new
        core = self.core
        core.options_for = new.channel_options
        core.apply_options(time.time())
        core.rules = new.rules
        core.strict_schemas = new.strict_schemas
        core.any_interval = new.any_interval
        core.max_message_size = new.max_message_size
        core.dedup_window = new.dedup_window
        core.dedup.max_keys = new.max_dedup_keys
        core.max_channels = new.max_channels
        self.engine.long_polls.per_client = new.max_long_polls_per_client
        self.lookups.per_client = new.max_offsets_at_per_client  # from the next request
        core.default_lease = new.default_lease
        core.in_flight.configure(new.in_flight_bytes)
        self.max_frame_size = max(MAX_FRAME_SIZE, new.max_message_size * 2)
        self.input_budget.resize(*input_budget_limits(self.max_frame_size))
        self.storage.max_size = new.storage_max_size  # the writer applies it at its next commit
        closed = self._reapply_access()
        self.federation.apply(new.federation)
        self.reloads += 1
        log.info("configuration reloaded (%s): changed %s%s", by,
                 "; ".join(_what_changed(k, getattr(old, k), getattr(new, k))
                           for k in changed) or "nothing",
                 f"; not applied until a restart: {', '.join(restart)}" if restart else "")
        return {
            "reloaded": old.config_path, "changed": changed, "needs_restart": restart,
            "subscriptions_closed": closed,
            "schemas": [c.summary() for c in new.schema_report],
        }

    def reapply_identities(self) -> list[dict[str, Any]]:
        """After an approval: live connections get the admin rights they now have."""
        return self._reapply_access()

    def _reapply_access(self) -> list[dict[str, Any]]:
        """New rules apply to live sessions too: subscriptions they forbid now end (the
        connection stays)."""
        from ..errors import RequestError

        closed: list[dict[str, Any]] = []
        now = time.time()
        for conn in list(self.connections):
            session, identity = conn.session, conn.identity
            if session is None or identity is None:
                continue
            if identity.method in ("key", "credential"):
                identity = conn.identity = self.http_identity(identity)
            session.admin = identity.admin
            session.access = self.access_for(identity)
            for sid, sub in list(session.subs.items()):
                try:
                    for pattern in sub.group.patterns:
                        self.core.check_read(session, pattern.text)
                except RequestError as exc:
                    self.core.unsubscribe(session, sid, now)
                    conn.send(native_error(
                        0, exc, message=f"subscription {sid} ended by a reload: {exc.message}",
                        sid=sid))
                    closed.append({"client_id": session.client_id, "sid": sid,
                                   "reason": exc.message})
        for stream in list(self.streams):
            closed += stream.reapply_access(now)
        consumers = self.http_consumers
        for consumer in list(consumers.by_key.values()) if consumers is not None else []:
            consumer.identity = self.http_identity(consumer.identity)
            if consumer.session is None:
                continue
            consumer.session.access = self.access_for(consumer.identity)
            consumer.session.admin = consumer.identity.admin
            try:
                patterns = consumer.sub.group.patterns if consumer.sub is not None else []
                for pattern in patterns:
                    self.core.check_read(consumer.session, pattern.text)
            except RequestError as exc:
                consumers.close(consumer)
                closed.append({"client_id": consumer.identity.client_id, "sid": 0,
                               "reason": f"HTTP consumer {consumer.key[2]!r}: {exc.message}"})
        if closed or self.core.batch:  # ended subscriptions, reservations claimed
            self.engine.commit(urgent=False)
            self.engine.request_pump()
        return closed

    def http_identity(self, identity: Identity) -> Identity:
        """An identity with admin rights as the live config and the registry say (after a
        reload, an approval or a revocation): listed in auth.admins AND approved as one."""
        if identity.method not in ("key", "credential"):
            return identity
        return Identity(identity.client_id,
                        self.registry.is_admin(identity.client_id, self.settings.admins),
                        identity.fingerprint, identity.method, identity.credential)

    def wake_groups(self, session: Session) -> None:
        for sub in session.subs.values():
            self.core.mark_ready(sub.group)
        self.engine.request_pump()

    # ------------------------------------------------------------- writing
    @property
    def uncommitted_bytes(self) -> int:
        """Publish bytes staged or being written, not yet durable (flow control)."""
        return self.scheduler.uncommitted_bytes

    @property
    def flow_pauses(self) -> int:
        return self.scheduler.flow_pauses

    @property
    def handoffs(self) -> int:
        return self.scheduler.handoffs

    # The engine's Host: the writer and reader threads, the loop's timers.
    def write(self, batch: WriteBatch) -> None:
        assert self.loop is not None
        started = time.perf_counter()
        if self._write_here(batch, started):
            return
        self._hand_to_writer(batch, started)

    def _hand_to_writer(self, batch: WriteBatch, started: float) -> None:
        assert self.loop is not None
        writing = self.loop.run_in_executor(self._writer_pool, self.storage.apply, batch)
        writing.add_done_callback(lambda fut: self._committed(fut, batch, started))

    def _write_here(self, batch: WriteBatch, started: float) -> bool:
        """Commit a small batch to the OS on the loop itself (SQLite's writes, ~0.1 ms,
        no fsync): handing it to the writer thread cost more than that, two wake-ups
        across threads (and the VM's vCPUs) and the GIL passed back and forth through
        every statement (docs/benchmarks.md, "Interval commits on the loop"). An
        "interval" batch is answered a turn later, as from the writer; one that must be
        on the disk first is answered once the writer thread's fdatasync is done. Larger
        batches and any that would wait for a checkpoint go to the writer whole, so the
        loop never waits on the disk."""
        if self.syncer is None or batch.bytes > COMMIT_HERE_MAX_BYTES or \
                len(batch.messages) > COMMIT_HERE_MAX_MESSAGES or \
                started < self._write_here_after:
            return False
        assert self.loop is not None
        if batch.sync_within is None:
            # A loop turn later: the deliveries and answers of the commit that just
            # ended (this batch was taken in its callback) go out first, not after
            # this one's statements (docs/benchmarks.md: "delivery written" 0.19 ->
            # 0.09 ms). An "interval" commit is better made at once (measured too).
            self.loop.call_soon(self._write_here_now, batch, started)
            return True
        self._write_here_now(batch, started)
        return True

    def _write_here_now(self, batch: WriteBatch, started: float) -> None:
        assert self.loop is not None and self.syncer is not None
        done: asyncio.Future[None] = self.loop.create_future()
        began = time.perf_counter()
        try:
            if not self.syncer.storage.apply_now(batch):
                self._hand_to_writer(batch, started)  # a checkpoint holds the writers
                return
        except Exception as exc:  # the writer's failures, told the same way
            done.set_exception(exc)
        else:
            done.set_result(None)
        self.commits_here += 1
        now = time.perf_counter()
        if now - began > COMMIT_HERE_SLOW_S:
            self._commit_here_was_slow(began, now)
        if batch.sync_within is None and done.exception() is None:
            syncing = self.loop.run_in_executor(self._writer_pool, _sync_commit,
                                                self.syncer.storage)
            syncing.add_done_callback(lambda fut: self._committed(fut, batch, started))
            return
        self.loop.call_soon(self._committed, done, batch, started)

    def _commit_here_was_slow(self, started: float, now: float) -> None:
        """Writes to the OS can wait too (a page read from the disk, the kernel holding
        writers back behind a slow disk), and the loop serves every connection: after
        one very slow commit, or a few slow ones close together, the writer thread makes
        them for a while. One slow now and then is the loop losing its CPU (a busy
        machine: 2 of 13,000 commits at a load of 1.7), not the disk."""
        self.commits_here_slow += 1
        recent = self._slow_commits_here
        recent.append(now)
        took = now - started
        if took < COMMIT_HERE_STALL_S and (len(recent) < COMMIT_HERE_SLOW_COUNT or
                                           now - recent[0] > COMMIT_HERE_SLOW_WINDOW_S):
            return
        recent.clear()
        self._write_here_after = now + COMMIT_HERE_BACKOFF_S
        log.info("an interval commit made on the event loop took %.1f ms (the disk or the "
                 "page cache is slow): the writer thread makes them for the next %g s",
                 took * 1e3, COMMIT_HERE_BACKOFF_S)

    def call_soon(self, callback: Callable[[], None]) -> None:
        if self.loop is not None:
            self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        if self.loop is not None:
            self.loop.call_later(delay, callback)

    def load(self, load: Load) -> None:
        self._spawn(self._load(load))

    def _committed(self, fut: asyncio.Future[None], batch: WriteBatch, started: float) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self._commit_failed(batch, None if fut.cancelled() else fut.exception())
            return
        took = time.perf_counter() - started
        self.commit_seconds_total += took
        self.metrics.commit_duration.observe(took)
        self.commits += 1
        self.messages_committed += len(batch.messages)
        self._last_commit_at = time.time()
        if batch.sync_within is not None and self.syncer is not None:
            self.syncer.committed(batch.sync_within)
        self.engine.committed(batch)

    def _sync_status(self) -> dict[str, Any]:
        """The fsyncs after "interval" commits (none when every channel is "fsync")."""
        sync = self.syncer
        if sync is None:
            return {}
        return {"syncs": sync.syncs, "sync_seconds": round(sync.sync_seconds, 3),
                "syncs_late": sync.late, "commits_on_loop": self.commits_here,
                "commits_on_loop_slow": self.commits_here_slow}

    def _wal_status(self) -> dict[str, Any]:
        """The write-ahead log's file (SQLite): part of ``bytes``; kept written out ahead
        while the disk has room (docs/reliability.md), so an empty broker has ~32 MiB."""
        if not isinstance(self.storage, Housekeeping):
            return {}
        return {"wal_bytes": self.storage.wal_bytes()}

    def _body_file_status(self) -> dict[str, Any]:
        """Large bodies kept beside the database (SQLite): how many files, how big."""
        bodies = getattr(self.storage, "bodies", None)
        if bodies is None:
            return {}
        return {"body_files": bodies.files(), "body_file_bytes": bodies.size_bytes()}

    def _sync_failed(self, exc: BaseException) -> None:
        """The fsync after "interval" commits failed: what they wrote may not be on the
        disk, and retrying would not tell. Stop, as for any other storage failure."""
        self.exit_status = 1
        self.stop_reason = self.stop_reason or f"storage failure (fsync: {exc})"
        self.request_stop()

    # ----------------------------------------------------------- full disk
    # A commit that fails wrote nothing (SQLite rolled it back). A full disk or quota
    # (StorageFull) is not a crash: publishes are refused at the door with it, the
    # failed batch's publishers get it, its other state is carried into the next
    # commit (core.on_failed), deliveries and acks go on, and a probe every
    # STORAGE_PROBE_S accepts publishes again once there is room. A storage that
    # recovers by itself (Redis: ``recovers``) being out of reach is the same kind of
    # episode (STORAGE_UNAVAILABLE), ended by a probe that reaches it; so is a write lock
    # another process holds (StorageLocked: an operator's sqlite3 shell), ended by a
    # probe that finds it free. Any other failure
    # stops the broker with a non-zero exit status.
    def _commit_failed(self, batch: WriteBatch, exc: BaseException | None) -> None:
        if isinstance(exc, StorageFull):
            self.storage_full_commits += 1
            self._retry_at = time.monotonic() + STORAGE_RETRY_S
            self._enter_full(exc)
            self.engine.not_written(batch, exc, stop=False)
            return
        if isinstance(exc, StorageFenced) and self.primary is not None and \
                self.primary.lapsed(exc):
            self.storage_down_commits += 1
            self._retry_at = time.monotonic() + STORAGE_RETRY_S
            refusal = self._enter_down(StorageUnavailable(
                f"this broker's lease (the primary's, or its record among brokers "
                f"spreading the queues) had run out (it was paused or cut off, or Redis was "
                f"down longer than the lease) and nobody took over: taking it again "
                f"({exc})"), why="refuses this broker's writes until it holds the lease")
            self.engine.not_written(batch, refusal, stop=False)
            return
        if isinstance(exc, StorageFenced) and self.primary is not None:
            self.primary.fenced(exc)
            error = StorageUnavailable(
                "this broker no longer serves (another broker took over: its writes are "
                "refused): nothing was stored; the client reconnects to the primary")
            self.engine.not_written(batch, error, stop=True)
            return
        if isinstance(exc, StorageUnavailable) and (self._recovers or
                                                    isinstance(exc, StorageLocked)):
            self.storage_down_commits += 1
            self._retry_at = time.monotonic() + STORAGE_RETRY_S
            refusal = self._enter_down(exc)
            self.engine.not_written(batch, refusal, stop=False)
            return
        cause = str(exc) if exc is not None else "the commit was cancelled"
        log.error("storage commit failed, the broker stops: %s", cause,
                  exc_info=exc if not isinstance(exc, StorageError) else None)
        self.exit_status = 1
        self.stop_reason = self.stop_reason or f"storage failure ({cause})"
        error = RequestError(f"storage failed, nothing was stored; the broker stops: {cause}")
        error.code = ErrorCode.STORAGE_UNAVAILABLE
        try:
            self.engine.not_written(batch, error, stop=True)
        finally:
            self.request_stop()

    def _enter_full(self, exc: StorageFull) -> None:
        """Refuse publishes with ``exc``; log the cause once per episode; probe."""
        first = self.storage_full is None
        self.storage_full = self.core.storage_refusal = exc
        if not first:
            log.debug("a commit found storage still full: %s", exc.message)
            return
        self.storage_full_since = time.time()
        reserve = exc.detail.get("reserve_released")
        log.error("%s Deliveries and acks go on%s; publishing resumes by itself once there "
                  "is room (checked every %g s).", exc.message,
                  f" (the {self.settings.storage_reserve / (1 << 20):g} MiB reserve was "
                  "given back for them)" if reserve else "", STORAGE_PROBE_S)
        self._schedule_probe()

    @property
    def _recovers(self) -> bool:
        """Whether this storage comes back by itself after StorageUnavailable."""
        return bool(getattr(self.storage, "recovers", False))

    def _enter_down(self, exc: StorageUnavailable, why: str = "cannot be reached"
                    ) -> StorageUnavailable:
        """Refuse publishes while storage is out of reach (or, ``why`` says, refuses
        this broker's writes for a moment); log once per episode; probe. Returns the
        refusal (what the failed batch's publishers get too)."""
        self._down_locked = isinstance(exc, StorageLocked)
        if self._down_locked:
            why = "is locked by another process"
        first = self.storage_down is None
        refusal = StorageUnavailable(
            f"storage {self.storage.path} {why} ({exc.message}); nothing was "
            f"stored: retry later (the broker tries again every {STORAGE_PROBE_S:g} s)",
            storage=self.storage.path)
        self.storage_down = refusal
        if self.storage_full is None:
            self.core.storage_refusal = refusal
        if not first:
            log.debug("storage still out of reach: %s", exc.message)
            return refusal
        self.storage_down_since = time.time()
        log.error("storage %s %s: %s. Publishes are refused with "
                  "STORAGE_UNAVAILABLE and nothing unconfirmed is confirmed; the broker "
                  "resumes by itself once it is back (tried every %g s).",
                  self.storage.path, why, exc.message, STORAGE_PROBE_S)
        if self.loop is not None:
            self.loop.call_later(STORAGE_PROBE_S, self._probe_down)
        return refusal

    def _probe_down(self) -> None:
        if self.storage_down is None or self.scheduler.stopped or self._stopping.is_set():
            return
        assert self.loop is not None
        try:
            probe = self.loop.run_in_executor(self._writer_pool, self.storage.probe)
        except RuntimeError:  # the pool is shut down: the broker is stopping
            return
        probe.add_done_callback(self._probed_down)

    def _probed_down(self, fut: asyncio.Future[tuple[bool, dict[str, Any]]]) -> None:
        if self.storage_down is None or fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            if isinstance(exc, StorageUnavailable):
                # Refusals and /health say why now (under Sentinel: first "cannot reach",
                # then which new primary lacks the replicas a commit waits for).
                self._enter_down(exc)
            else:
                log.debug("storage still out of reach: %s", exc)
            assert self.loop is not None
            self.loop.call_later(STORAGE_PROBE_S, self._probe_down)
            return
        self.storage_down = None
        if self.storage_full is None:
            self.core.storage_refusal = None
        self._retry_at = 0.0
        log.warning("storage %s %s after %.0f s: publishes are accepted", self.storage.path,
                    "is no longer locked" if self._down_locked
                    else "can be reached again", time.time() - self.storage_down_since)
        self.engine.commit()

    def backing_off(self) -> bool:
        """While full, a commit that failed is retried only after STORAGE_RETRY_S."""
        wait = self._retry_at - time.monotonic()
        if wait <= 0:
            return False
        if not self._retry_timer and self.loop is not None:
            self._retry_timer = True

            def retry() -> None:
                self._retry_timer = False
                self.engine.kick()

            self.loop.call_later(wait, retry)
        return True

    def _schedule_probe(self) -> None:
        if self.loop is not None:
            self.loop.call_later(STORAGE_PROBE_S, self._probe_storage)

    def _probe_storage(self) -> None:
        if self.storage_full is None or self.scheduler.stopped or self._stopping.is_set():
            return
        assert self.loop is not None
        try:
            probe = self.loop.run_in_executor(self._writer_pool, self.storage.probe)
        except RuntimeError:  # the pool is shut down: the broker is stopping
            return
        probe.add_done_callback(self._probed)

    def _probed(self, fut: asyncio.Future[tuple[bool, dict[str, Any]]]) -> None:
        full = self.storage_full
        if full is None or fut.cancelled():
            return
        if fut.exception() is not None:
            log.debug("storage probe failed: %s", fut.exception())
            self._schedule_probe()
            return
        room, space = fut.result()
        if not room:  # the refusal tells the space as it is now
            text = self.storage.full_message(space, full.detail.get("cause", "full"))
            detail = {**full.detail, "free_bytes": space["free"],
                      "disk_free_bytes": space["disk_free"]}
            self.storage_full = self.core.storage_refusal = StorageFull(text, **detail)
            self._schedule_probe()
            return
        self.storage_full = None
        self.core.storage_refusal = self.storage_down
        self._retry_at = 0.0
        log.warning("storage has room again (%d MiB free for %s after %.0f s full): "
                    "publishes are accepted", space["free"] >> 20, self.storage.path,
                    time.time() - self.storage_full_since)
        self.engine.commit()

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _load(self, load: Load) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                msgs = await loop.run_in_executor(
                    self._reader_pool, self.storage.read_range, load.channel,
                    load.from_seq, load.upto, STORAGE_READ_PAGE, STORAGE_READ_BYTES)
                break
            except StorageUnavailable as exc:
                if not self._recovers or self._stopping.is_set():
                    raise
                # Its readers wait for this page: try again until storage is back.
                log.debug("reading %s waits for storage: %s", load.channel, exc.message)
                await asyncio.sleep(STORAGE_PROBE_S)
        self.engine.loaded(load, msgs, STORAGE_READ_PAGE, STORAGE_READ_BYTES)

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        last_expiry_scan = 0.0
        swept = loop.time()
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            if loop.time() - swept > SWEEP_INTERVAL_S + STALL_S:
                # This process was not running (stopped, a VM frozen, the loop held):
                # what clients sent meanwhile waits in the sockets, and uvloop runs timers
                # before it polls them, so acks sent within their leases found them
                # expired and every message went out again (an 8 s SIGSTOP: 50 of 50
                # acked within a 5 s lease refused and redelivered). Serve them first,
                # new connections (an HTTP ack) included, then sweep.
                await asyncio.sleep(STALL_GRACE_S)
            self._watch_wal()  # first: a read below may be the first to find it gone
            now = time.time()
            expired = self.core.tick(now)
            swept = loop.time()  # a stall anywhere until the next sweep counts
            for channel, messages in expired[:EXPIRY_LOG_LINES]:
                log.info("channel %s expired: idle for %g s (expire_idle); removed with %d "
                         "message(s) and the groups that read only it", channel,
                         self.core.options(channel).expire_idle, messages)
            if len(expired) > EXPIRY_LOG_LINES:  # a burst of short-lived channels
                log.info("%d more channels expired (minou_channels_expired_total)",
                         len(expired) - EXPIRY_LOG_LINES)
            self._warn_dedup_evictions(now)
            self.watch_consumers(time.monotonic())
            if self.input_budget.held:
                for holder in self.input_budget.overdue(time.monotonic()):
                    holder.input_too_slow()
            if now - last_expiry_scan >= 1.0:
                last_expiry_scan = now
                self.core.expire_txns(now)
                self.end_lapsed_credentials(now)
                if self.credentials.expire(now):
                    self._stage_registry()
                if self.http_consumers is not None:
                    self.http_consumers.sweep(now)
                if self.resp_groups is not None:
                    self.resp_groups.sweep(now)
                try:
                    expired = await loop.run_in_executor(
                        self._reader_pool, self.storage.expired, now, 1000)
                    if expired:
                        self.core.expire(expired, time.time())
                    await self._apply_retention(now)
                except StorageUnavailable as exc:
                    if not self._recovers:
                        # Raised, it ended this task without a word: no more sweeps,
                        # leases or checkpoints, a broker that answered and did nothing.
                        self._storage_failed(exc)
                        return
                    # TTLs and retention are looked at again once storage is back.
            self._maybe_checkpoint(now)
            if self.core.batch or self.core.has_dirty:
                self.engine.commit(force=True)
            self.engine.request_pump()

    def _warn_dedup_evictions(self, now: float) -> None:
        """While the dedup window is capped by max_dedup_keys (its oldest keys expire
        early, so a resend may be stored twice), say so: at most once a minute."""
        dedup = self.core.dedup
        when, seen = self._dedup_warned
        if dedup.evicted > seen and now - when >= 60.0:
            log.warning("dedup window narrowed: %d keys expired early because "
                        "max_dedup_keys=%d was reached; a publish repeated after its key "
                        "went is stored again. Raise max_dedup_keys (~50 bytes a key) or "
                        "lower dedup_window (%g s)", dedup.evicted - seen, dedup.max_keys,
                        self.core.dedup_window)
            self._dedup_warned = (now, dedup.evicted)

    def _watch_wal(self) -> None:
        """The write-ahead log removed under the broker is noticed within a tick, not at
        the next commit (none may come before a crash): what it holds is copied into the
        database file by the writer's connection (older than the removal: a connection
        opened since sees a new, empty log), and the broker stops saying why."""
        storage = self.storage
        if self._wal_rescue is not None or not isinstance(storage, Housekeeping) or \
                not storage.wal_moved():
            return
        assert self.loop is not None
        self._wal_rescue = self.loop.run_in_executor(self._writer_pool,
                                                     storage.check_wal_in_place)
        self._wal_rescue.add_done_callback(self._wal_checked)

    def _wal_checked(self, fut: asyncio.Future[None]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        if exc is not None:  # else a commit said it meanwhile, and stops the broker
            self._storage_failed(exc)

    def _storage_failed(self, exc: BaseException) -> None:
        """Storage failed outside a commit (a read, the log's rescue): stop, as a failed
        commit does, first rescuing the write-ahead log if that is what failed."""
        if self._wal_rescue is None and isinstance(self.storage, Housekeeping) and \
                self.storage.wal_moved():
            self._watch_wal()  # then here again, with what the rescue says
            return
        log.error("storage failure, the broker stops: %s", exc)
        self.exit_status = 1
        self.stop_reason = self.stop_reason or f"storage failure ({exc})"
        self.request_stop()

    def _maybe_checkpoint(self, now: float) -> None:
        """Keep the WAL near its threshold: checked every tick (0.25 s); once the file is
        past half of it, a passive checkpoint every tick (the writer goes on meanwhile),
        and a RESTART one whenever what the WAL holds since it last started over is past
        half again (the file is written over from its start: it stops growing), or at
        once while it crowds a nearly full disk; when idle a TRUNCATE one (the file is
        cut: the disk given back while no commit waits for it), or, while the disk has
        room to spare, one RESTART per idle spell (the file kept, written out ahead:
        ``SQLiteStorage.keeps_wal``). Checkpoints compete with commits for the disk: one
        at a time."""
        if not isinstance(self.storage, Housekeeping):
            return
        if self._checkpoint is not None and not self._checkpoint.done():
            return
        wal = self.storage.wal_bytes()
        if not wal:
            return
        idle = now - self._last_commit_at > 2.0
        crowded = self._wal_crowds_disk(wal)
        if idle and not crowded and self._idle_checkpoint_after == self._last_commit_at \
                and self.storage.keeps_wal():
            return  # folded in once since the last commit, the file kept: nothing to do
        if idle or crowded or wal > self.settings.storage_wal_checkpoint // 2:
            assert self.loop is not None
            self._checkpoint = self.loop.run_in_executor(
                self._house_pool, partial(self.storage.checkpoint, idle, restart=crowded))
            self._checkpoint.add_done_callback(
                partial(self._checkpointed, self._last_commit_at if idle else None))

    def _checkpointed(self, idle_after: float | None, fut: asyncio.Future[None]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:  # a line in the log (rate-limited), not a traceback a tick
            oplog.checkpoint_failed(exc)
        elif idle_after is not None:
            self._idle_checkpoint_after = idle_after

    def _wal_crowds_disk(self, wal: int) -> bool:
        """Whether the WAL holds more than a quarter of what the disk has left: on a
        nearly full disk it is checkpointed long before its threshold, or a fast
        publisher fills the disk with a WAL no checkpoint can take in any more."""
        if wal < MIN_CHECKPOINT_WAL_BYTES:
            return False
        try:
            st = os.statvfs(self.storage.data_dir)  # type: ignore[attr-defined]
        except (OSError, AttributeError):
            return False
        return wal > st.f_bavail * st.f_frsize // 4

    def note_unsent(self, conn: NativeConnection, buffered: int) -> bool:
        """A delivery write left ``buffered`` bytes unsent on ``conn``: whether it must
        get no more deliveries now (``DeliveryBudget.note``)."""
        return self.delivery_budget.note(conn, buffered,
                                         self.settings.delivery_buffer_bytes)

    def watch_consumers(self, now: float) -> int:
        """Every tick: recount the unsent deliveries of every connection against
        ``delivery_buffer_bytes`` (``DeliveryBudget``: so the memory consumers that stop
        reading can pin is about the budget plus a share per connection, not the water
        mark per connection), and cut a consumer that stopped reading with deliveries
        out for ``slow_consumer_seconds`` (``NativeConnection.watch_progress``).
        Returns the total; ``now`` is monotonic."""
        conns = [c for c in self.connections if not c.closed and c.session is not None]
        sizes = [c.transport.get_write_buffer_size() for c in conns]
        total = self.delivery_budget.recount(zip(conns, sizes, strict=True),
                                             self.settings.delivery_buffer_bytes)
        for conn, size in zip(conns, sizes, strict=True):
            conn.watch_progress(size, now)
        self.unsent_delivery_bytes = total
        self._watch_http_answers(now)
        return total

    def _watch_http_answers(self, now: float) -> None:
        """Cut the HTTP sockets that hold answers unread too long, or too many of them
        (``http_unread``); upgraded ones (WebSockets) have bounds of their own."""
        sockets = [(sock, proto) for sock, kind in self.admission.open.items()
                   if kind == "http" and not getattr(proto := sock.get_protocol(),
                                                     "upgraded", False)]
        cut = self.http_unread.check(sockets, now, self.settings.slow_consumer_seconds,
                                     HTTP_UNSENT_BYTES)
        if cut:
            self.slow_consumers += cut_all(cut, self._http_answer_cut)

    def _http_answer_cut(self, sock: Any, size: int, silent: float) -> None:
        self.core.counters.refuse("slow_consumer")
        oplog.http_answer_unread(sock.get_extra_info("peername"), size, silent,
                                 self.http_unread.unsent, HTTP_UNSENT_BYTES)

    async def _apply_retention(self, now: float) -> None:
        """Settled messages past their channel's retention go: the candidates looked up
        in storage a slice per turn of the reader thread (one turn per channel, and every
        candidate each second, held a core at 20,000 channels), at most
        ``RETENTION_LOOKS_PER_TICK`` a tick."""
        loop = asyncio.get_running_loop()
        start = self._retention_walked if self._retention_walked < len(self.core.channels) \
            else 0
        self._retention_walked = start + RETENTION_WALK_SLICE
        candidates = self.core.retention_candidates(
            now, start, RETENTION_WALK_SLICE)[:RETENTION_LOOKS_PER_TICK]
        for start in range(0, len(candidates), RETENTION_LOOK_SLICE):
            part = [(channel, floor, now - (log_.options.retention or 0.0))
                    for channel, floor in candidates[start:start + RETENTION_LOOK_SLICE]
                    if (log_ := self.core.channels.get(channel)) is not None]
            firsts = await loop.run_in_executor(self._reader_pool, self._retained, part)
            for (channel, floor, _), first in zip(part, firsts, strict=True):
                self.core.retention_looked(channel, floor, first, now)

    def _retained(self, part: list[tuple[str, int, float]]) -> list[int | None]:
        """On the reader thread: ``retained_until`` of each (channel, floor, cutoff)."""
        return [self.storage.retained_until(channel, floor, cutoff)
                for channel, floor, cutoff in part]

    # ------------------------------------------------------------ reading
    def read_range(self, conn: NativeConnection, frame: f.Read) -> asyncio.Future[Any] | None:
        """Answer a READ: at once (None) or once storage was read (the task)."""
        from ..names import validate_channel

        validate_channel(frame.channel)
        self.core.check_read(conn.session, frame.channel)
        log_ = self.core.channels.get(frame.channel)
        if log_ is None:
            conn.send(f.ReadResult(frame.req, [], 1, 1))
            return None
        upper = log_.end if not frame.to_seq else min(frame.to_seq, log_.end)
        limit = max(1, min(frame.limit or STORAGE_READ_PAGE, 10_000))
        start = max(frame.from_seq, log_.first_seq, 1)
        # Recent ones come from memory; either way a page holds at most
        # STORAGE_READ_BYTES (read_weight), so its answer fits in one frame.
        cached = log_.cached_range(start, upper, limit, STORAGE_READ_BYTES)

        async def run() -> None:
            loop = asyncio.get_running_loop()
            msgs = cached if cached is not None else await loop.run_in_executor(
                self._reader_pool, self.storage.read_range, frame.channel,
                max(frame.from_seq, 1), upper, limit, STORAGE_READ_BYTES,
            )
            items = [
                f.Delivery(0, m.channel, m.seq, m.id, m.data, m.raw, m.headers, 0,
                           m.published_at, m.priority, m.key)
                for m in msgs
            ]
            next_seq = page_end(msgs, limit, STORAGE_READ_BYTES, upper)
            conn.send(f.ReadResult(frame.req, items, next_seq, log_.first_seq))

        return self._spawn(run())

    # -------------------------------------------------------------- admin
    def admin(self, op: str, args: dict[str, Any], caller: Identity | None = None) -> Any:
        """Run an admin operation: a value, or an awaitable of one (storage reads)."""
        from .admin import run_admin

        before = self.handoffs
        result = run_admin(self, op, args, caller)
        if inspect.isawaitable(result):  # it changes state (if at all) after its reads
            return self._after_handoff(result)
        self._wait_for_handoff(before)
        return result

    async def _after_handoff(self, pending: Awaitable[Any]) -> Any:
        before = self.handoffs
        result = await pending
        self._wait_for_handoff(before)
        return result

    def _wait_for_handoff(self, before: int) -> None:
        """An admin operation's changes may already have gone to the writer (it was
        idle): then what the caller waits for (``Engine.when_durable``: the core's batch)
        is empty though the commit is not done. A no-op in the next batch makes the
        caller answer once that one commits, which comes after. (An awaitable operation,
        ``dead.requeue``, was answered before the commit of its moves.)"""
        if self.handoffs != before:
            self.core.after_commit(lambda: None)

    async def read_messages(self, channel: str, from_seq: int, upto: int,
                            limit: int, max_bytes: int = STORAGE_READ_BYTES) -> list[Msg]:
        """Committed, live messages of ``channel`` from storage (the reader thread): at
        most ``limit`` and ``max_bytes`` (``page_end`` says where the next page
        starts)."""
        assert self.loop is not None
        return await self.loop.run_in_executor(
            self._reader_pool, self.storage.read_range, channel, from_seq, upto, limit,
            max_bytes)

    async def oldest_published(self, log_: Any, group: str | None = None) -> float | None:
        """When the oldest message not yet settled (by ``group``) was published."""
        from ..core import maintenance
        from .admin import published_at

        return await published_at(self, log_, maintenance.oldest_unsettled(self.core, log_,
                                                                           group))

    def metrics_snapshot(self) -> dict[str, Any]:
        """What a scrape shows (see metrics.Metrics), built at once; a scrape itself
        (render_metrics) builds it a slice at a time, with the oldest messages' ages."""
        return self._build_snapshot({})

    def _build_snapshot(self, oldest: dict[str, float | None]) -> dict[str, Any]:
        snapshot: dict[str, Any] = {}
        for _ in self._snapshot_steps(oldest, snapshot):
            pass
        return snapshot

    def _snapshot_steps(self, oldest: dict[str, float | None], out: dict[str, Any]
                        ) -> Iterator[None]:
        """Fill ``out`` with what a scrape shows, yielding every ``SNAPSHOT_LOOK``
        channels or groups (the caller lets the loop go between): at 100,000 channels
        the whole walk held the loop ~0.4 s a scrape."""
        from ..core.maintenance import queue_of

        now = time.time()
        # Summed per queue here (a dict per channel, summed on the metrics thread, was
        # most of a scrape at 100,000 channels of one queue).
        queues: dict[str, dict[str, float]] = {}
        queue_names = self._queue_names
        walked, next_look = 0, SNAPSHOT_LOOK
        for prefix, bucket in self.core.channel_index.buckets():
            if not bucket:
                continue  # its last channel went since the list was taken
            q = queue_names.get(prefix)
            if q is None:
                q = queue_names[prefix] = queue_of(prefix + "x")
            totals = queues[q] = dict.fromkeys(
                ("published", "dropped", "expired", "depth", "unsettled", "oldest_age_s"), 0)
            logs = list(bucket.values())
            for at in range(0, len(logs), SNAPSHOT_LOOK):
                _add_queue_stats(totals, logs[at:at + SNAPSHOT_LOOK], oldest, now)
                walked += min(SNAPSHOT_LOOK, len(logs) - at)
                if walked >= next_look:
                    next_look = walked + SNAPSHOT_LOOK
                    yield
        groups: list[dict[str, Any]] = []
        for done, group in enumerate(list(self.core.groups.values()), 1):
            groups.append(self.core.group_stats(group, now))
            if done % SNAPSHOT_LOOK == 0:
                yield
        out.update({
            "uptime_s": now - self.started_at,
            "connections": len(self.connections),
            "sockets": self.admission.stats(),
            "unfinished_input": self.input_budget.stats(),
            "counters": self.core.counters.as_dict(),
            "dedup": {"keys": len(self.core.dedup), "evicted": self.core.dedup.evicted},
            "producers": {"states": len(self.core.producers),
                          "evicted": self.core.producers.evicted},
            "dead_connections": self.dead_connections,
            "storage": {"bytes": self.storage.size_bytes(), "commits": self.commits,
                        "commit_seconds": self.commit_seconds_total,
                        **self._sync_status(), **self._body_file_status(),
                        **self._wal_status(),
                        "full": int(self.storage_full is not None),
                        "unavailable": int(self.storage_down is not None),
                        "unavailable_commits": self.storage_down_commits},
            "cluster": self.primary.status() if self.primary is not None else None,
            "auth_failures": dict(self.registry.failures),
            "authentications": dict(self.authentications),
            "credentials": self.credentials.live(time.time()),
            "schema_refused": dict(self.core.schema_refusals),
            "queues": queues,
            "groups": groups,
            "max_queue_series": self.settings.metrics_max_queues,
            "federation": self.federation.pipe_views(),
        })

    async def render_metrics(self) -> bytes:
        """The Prometheus text of one scrape. Scrapes that come while one is being made
        get its text: each making its own held a snapshot apiece (tens of MB at 100,000
        queues) while the one metrics thread wrote them in turn, without bound."""
        scrape = self._scrape
        if scrape is None:
            scrape = self._scrape = asyncio.ensure_future(self._make_scrape())
            scrape.add_done_callback(self._scrape_done)
        # A scraper that hangs up must not cancel the scrape the others wait for
        return await asyncio.shield(scrape)

    def _scrape_done(self, scrape: asyncio.Future[bytes]) -> None:
        if self._scrape is scrape:
            self._scrape = None
        if not scrape.cancelled():
            scrape.exception()  # retrieved: with every scraper gone, no "never retrieved"

    async def _make_scrape(self) -> bytes:
        """A scrape's snapshot taken on the loop a slice at a time, its text written on a
        thread of its own. Both on the loop held it ~3 s a scrape at 100,000 queues."""
        snapshot = await self.refresh_metrics_snapshot()
        self._say_series_omitted(snapshot)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._metrics_pool, self.metrics.render, snapshot)

    def _say_series_omitted(self, snapshot: dict[str, Any]) -> None:
        """A line in the log, at most once an hour, when a scrape leaves queues or groups
        out (metrics_max_queues): the operator's dashboard is missing some."""
        most = snapshot["max_queue_series"]
        queues, groups = len(snapshot["queues"]), len(snapshot["groups"])
        now = time.monotonic()
        if max(queues, groups) <= most or now < self._series_omitted_said + 3600:
            return
        self._series_omitted_said = now
        log.warning("/metrics: %d queues and %d reader groups, past metrics_max_queues = %d: "
                    "only the first %d of each by name have series of their own; the rest "
                    "are counted in minou_metrics_series_omitted and in the totals (said at "
                    "most once an hour)", queues, groups, most, most)

    async def refresh_metrics_snapshot(self, max_reads: int = 200) -> dict[str, Any]:
        """Build a scrape's snapshot, reading the oldest unsettled message of each
        channel from storage when memory does not have it (at most ``max_reads``)."""
        oldest: dict[str, float | None] = {}
        for name, log_ in list(self.core.channels.items())[:max_reads]:
            oldest[name] = await self.oldest_published(log_)
        snapshot: dict[str, Any] = {}
        for _ in self._snapshot_steps(oldest, snapshot):
            await asyncio.sleep(0)
        return snapshot

    def queue_rates(self, queue: str) -> dict[str, float]:
        from .metrics import QUEUE_RATES

        rates = self.rates.queue_rates(queue) or (0.0,) * len(QUEUE_RATES)
        return {name: round(rate, 3) for name, rate in zip(QUEUE_RATES, rates, strict=True)}

    async def _rate_sampler(self) -> None:
        """Each queue's totals for the rate gauges and charts, about once a second, in
        a task of its own (the ticker's sweeps never wait for it). At 100,000 queues a
        sample holds the loop ~60-120 ms in all (a 2 ms slice at a time): the next one
        waits ``RATE_SAMPLE_SPACING`` times that, so sampling never takes more than a
        small part of the broker's time whatever the number of queues."""
        while True:
            began = time.monotonic()
            try:
                held = await self._sample_rates(time.time())
            except Exception:  # a bug here must not freeze the gauges without a word
                log.exception("sampling the queues' rates failed; trying again")
                held = 1.0
            wait = max(1.0, RATE_SAMPLE_SPACING * held) - (time.monotonic() - began)
            await asyncio.sleep(max(wait, 0.0))

    async def _sample_rates(self, now: float) -> float:
        """Sample each queue's (published, delivered, acked, schema_refused) by walking
        its channels through the channel index, a slice of ~``RATE_SAMPLE_SLICE_S`` of
        the loop at a time, and hand the rate tracker those and the queues that changed
        since the last sample (it keeps only those). Returns the seconds it held the
        loop. At 100,000 queues a flat ``queue|counter`` key each, built and compared
        whole, held the loop ~0.4-1 s every second (docs/benchmarks.md)."""
        from ..core.maintenance import queue_of

        clock = time.perf_counter
        began = clock()
        held = 0.0
        previous = self.rates.latest_queues()
        refusals = self.core.schema_refusals
        queue_names = self._queue_names
        queues: dict[str, tuple[int, ...]] = {}
        changed: dict[str, tuple[int, ...]] = {}
        buckets = self.core.channel_index.buckets()
        walked, next_look = 0, RATE_SAMPLE_LOOK
        for prefix, bucket in buckets:
            if not bucket:
                continue  # its last channel went since the list was taken
            if len(bucket) <= RATE_SAMPLE_LOOK:
                published, delivered, acked = _channel_totals(bucket.values())
            else:  # a queue of many channels: looked at in parts, the loop let go between
                logs = list(bucket.values())
                published = delivered = acked = 0
                for at in range(0, len(logs), RATE_SAMPLE_LOOK):
                    p, d, a = _channel_totals(logs[at:at + RATE_SAMPLE_LOOK])
                    published, delivered, acked = published + p, delivered + d, acked + a
                    if clock() - began > RATE_SAMPLE_SLICE_S:
                        held += clock() - began
                        await asyncio.sleep(0)
                        began = clock()
            q = queue_names.get(prefix)
            if q is None:
                q = queue_names[prefix] = queue_of(prefix + "x")
            # A channel is endpoint/version/id (no "/" in an id): one prefix a queue.
            totals = queues[q] = (published, delivered, acked, refusals.get(q, 0))
            if previous.get(q) != totals:
                changed[q] = totals
            walked += len(bucket)
            if walked >= next_look:
                next_look = walked + RATE_SAMPLE_LOOK
                if clock() - began > RATE_SAMPLE_SLICE_S:
                    held += clock() - began
                    await asyncio.sleep(0)
                    began = clock()
        if len(queue_names) > 2 * len(buckets) + RATE_SAMPLE_LOOK:
            self._queue_names = {prefix: queue_names[prefix] for prefix, _ in buckets
                                 if prefix in queue_names}  # prefixes gone since
        for key, refused in refusals.items():
            if key not in queues:  # refused payloads on a queue of no channel
                totals = queues[key] = (0, 0, 0, refused)
                if previous.get(key) != totals:
                    changed[key] = totals
        c = self.core.counters
        self.rates.sample(now, {"published": c.published, "delivered": c.delivered,
                                "acked": c.acked}, queues, changed)
        return held + clock() - began

    def offsets_at(self, session: Session, patterns: list[str], at: float,
                   limit: int | None) -> asyncio.Future[dict[str, list[int]]]:
        """OFFSETS: read rules checked now (refused here); then, in a task, the channels
        matched a slice a turn of the loop and, with ``at`` > 0, looked up in storage
        (``seqs_at``). Past ``limit`` channels matched, ``BadRequest`` before any
        lookup (None: the caller checks, a front merging every broker's part)."""
        found: dict[str, list[int]] = {}
        steps = self.core.match_offsets(session, patterns, found, OFFSETS_MATCH_SLICE)

        async def run() -> dict[str, list[int]]:
            for _ in steps:  # whole, 50,000 channels held the loop ~60 ms
                await asyncio.sleep(0)
            if limit is not None and len(found) > limit:
                raise BadRequest(f"the patterns match {len(found)} channels; one OFFSETS "
                                 f"answer lists at most {limit}: narrow the patterns")
            return await self.seqs_at(found, at) if at > 0 else found

        return asyncio.ensure_future(run())

    async def seqs_at(self, found: dict[str, list[int]], at: float) -> dict[str, list[int]]:
        """``found`` (channel -> [first, next]) with a third seq each: the first one
        published at or after ``at`` (``next`` if none was), from storage (publish
        times grow with seqs: a binary search over segments, no scan)."""
        def lookup(part: list[tuple[str, list[int]]]) -> None:
            for channel, (first, nxt) in part:
                seq = self.storage.retained_until(channel, nxt, at)
                out[channel] = [first, nxt, first if seq is None else max(first, seq)]

        # In slices, each its own turn on the one reader thread: other clients' reads
        # queued meanwhile go between them. (Whole, 20 requests of 50,000 channels from
        # a few connections made another client's one-channel lookup wait 5 s.)
        out: dict[str, list[int]] = {}
        items = list(found.items())
        loop = asyncio.get_running_loop()
        for start in range(0, len(items), SEQS_AT_SLICE):
            await loop.run_in_executor(self._reader_pool, lookup,
                                       items[start:start + SEQS_AT_SLICE])
        return out

    def spawn_reply(self, conn: NativeConnection, req: int, pending: Any, *,
                    read_only: bool = False) -> asyncio.Future[Any]:
        """Finish an admin operation that reads storage; reply (after its commit, if it
        changed state; at once if ``read_only``: it read committed state only) or send
        the error."""
        from ..errors import RequestError

        async def run() -> None:
            try:
                result = await pending
            except RequestError as exc:
                conn._refused(exc)
                conn._error(req, exc)
                conn.flush()
                return
            except Exception:
                log.exception("admin operation failed")
                conn.send(native_error(req, internal_error()))
                return
            if read_only:
                conn.send(f.Result(req, result))
            else:
                self.engine.when_durable(lambda: conn.send(f.Result(req, result)),
                                         lambda exc: conn.send(native_error(req, exc)))

        return self._spawn(run())

    def ended_subscriptions(self, subs: list[Any], reason: str) -> None:
        """Tell the connections whose subscriptions an admin ended."""
        for sub in subs:
            conn = sub.session.conn
            if conn is not None and hasattr(conn, "send"):
                conn.send(native_error(0, NotAuthorized(
                    f"subscription {sub.sid} ended: {reason}"), sid=sub.sid))

    def soft_stop(self, by: str) -> dict[str, Any]:
        """Stop gracefully with exit status 0: no new deliveries, let those out settle
        (up to the default lease), commit, stop. Alone (on SQLite, or on Redis with no
        other broker alive) it takes no publish or subscription meanwhile; as the
        primary of a cluster it goes on taking
        publishes until it stops (they are committed before it hands the lease over,
        so producers keep flowing), then wakes a standby to take over at once."""
        spread = self.spread
        if spread is not None and spread.role == "spread":
            from .spread import HANDOVER_COMMIT_S

            log.warning("soft stop requested by %s: handing every queue over", by)

            async def hand_over() -> None:
                await spread.hand_over_all(by)
                self.request_stop()

            self._spawn(hand_over())
            return {"stopping": True, "unsettled": 0, "deadline_s": HANDOVER_COMMIT_S,
                    "native": _addr(self.native_address, "minous" if self.tls else "minou")}
        # A primary with standbys goes on taking publishes for them; a lone one on Redis
        # (none alive at its last renewal) has nobody to hand over to: it stops as alone.
        cluster = self.primary is not None and self.primary.role == "primary" \
            and self.primary.lease.alive > 1
        if not cluster:
            self.accepting = False
        self.draining = True
        unsettled = sum(len(s.leases) for s in self._live_sessions())
        log.warning("soft stop requested by %s: %d deliveries to settle%s", by, unsettled,
                    "; publishes go on until the lease is handed over" if cluster else "")

        async def drain() -> None:
            deadline = time.monotonic() + self.settings.default_lease
            while time.monotonic() < deadline:
                if not any(s.leases for s in self._live_sessions()) \
                        and not self.http_consumers_busy():
                    break
                await asyncio.sleep(0.05)
            # The acks that ended the last deliveries are answered once their commit is
            # durable: let it come before stop() closes the connections, or a consumer is
            # told "not known to be durable" (ack() False) for an ack that was.
            self.engine.commit(force=True)
            settle_by = time.monotonic() + DRAIN_COMMIT_WAIT_S
            while time.monotonic() < settle_by and not (
                    self.scheduler.idle and not self.core.batch):
                await asyncio.sleep(0.01)
            self.request_stop()

        if cluster:
            self._spawn(self.primary.hand_over(by))  # type: ignore[union-attr]
        self._spawn(drain())
        return {"stopping": True, "unsettled": unsettled,
                "deadline_s": self.settings.default_lease,
                # The broker that stops: with several on one Redis, the one that serves
                # (a standby relays the request there).
                "native": _addr(self.native_address, "minous" if self.tls else "minou")}

    def _live_sessions(self) -> list[Session]:
        """Sessions of native connections (TCP, /v1/ws) and JSON streams."""
        return [*(c.session for c in self.connections if c.session is not None),
                *(s.session for s in self.streams)]

    def http_consumers_busy(self) -> bool:
        consumers = getattr(self, "http_consumers", None)
        return bool(consumers and consumers.unsettled())

    async def _dead_letters(self, dead: Any, most: int = 10_000) -> AsyncIterator[Msg]:
        """The first ``most`` dead letters of ``dead``, a page at a time (a page holds
        at most STORAGE_READ_BYTES: dead letters may be 1 MiB each)."""
        seq = dead.first_seq
        while most > 0 and seq < dead.end:
            limit, upto = min(most, STORAGE_READ_PAGE), dead.end
            page = await self.read_messages(dead.name, seq, upto, limit)
            if not page:
                return
            for m in page:
                yield m
            most -= len(page)
            seq = page_end(page, limit, STORAGE_READ_BYTES, upto)

    async def message_receipt(self, message_id: str) -> dict[str, Any]:
        from ..core import maintenance
        from ..errors import UnknownDelivery

        found = self.core.find_message(message_id)
        if found is None:
            raise UnknownDelivery(f"no message {message_id!r} is known to this broker",
                                  id=message_id)
        log_, seq = found
        out = {"id": message_id, **maintenance.receipt(self.core, log_, seq)}
        if out["state"] == "unknown":
            raise UnknownDelivery(f"no message {message_id!r} is known to this broker",
                                  id=message_id)
        if out["state"] == "removed":
            dead = self.core.channels.get("_dead/" + log_.name)
            if dead is not None:
                async for m in self._dead_letters(dead):
                    headers = m.headers or {}
                    if headers.get("x-original-id") == message_id:
                        out["state"] = "dead_lettered"
                        out["dead_letter"] = {
                            "channel": m.channel, "seq": m.seq, "id": m.id,
                            "reason": headers.get("x-dead-reason"),
                            "detail": headers.get("x-dead-detail"),
                            "group": headers.get("x-dead-group")}
                        break
            if out["state"] == "removed":
                out["detail"] = ("settled by every reader, expired, dropped or purged; "
                                 "no longer stored")
        return out

    def status(self) -> dict[str, Any]:
        now = time.time()
        return {
            "broker_id": self.core.broker_id,
            "version": __version__,
            "uptime_s": round(now - self.started_at, 3),
            "storage": {"backend": self.storage.backend, "path": self.storage.path,
                        "bytes": self.storage.size_bytes(), "commits": self.commits,
                        "commit_seconds": round(self.commit_seconds_total, 3),
                        **self._sync_status(), **self._body_file_status(),
                        **self._wal_status(),
                        "max_size": self.storage.max_size,
                        "full": self.storage_full.message if self.storage_full else None,
                        "full_commits": self.storage_full_commits,
                        "unavailable": self.storage_down.message if self.storage_down
                        else None,
                        "unavailable_commits": self.storage_down_commits},
            "cluster": self.primary.status() if self.primary is not None else None,
            "native": _addr(self.native_address, "minous" if self.tls else "minou"),
            "http": _addr(self.http_address, "https" if self.tls else "http"),
            "resp": _addr(self.resp_address, "rediss" if self.tls else "redis"),
            "auth": {"mode": self.settings.auth_mode,
                     "broker_token": self.settings.broker_token is not None,
                     "admin_key": str(self.admin_key_path) if self.admin_key_path else None,
                     "clients": len(self.registry.records),
                     "pending": sum(r.status == "pending"
                                    for r in self.registry.records.values()),
                     "failures": dict(self.registry.failures),
                     "rules": len(self.settings.rules.rules)},
            "tls": ({"fingerprint": self.tls.fingerprint, "cert": str(self.tls.cert),
                     "self_signed": self.settings.tls_cert is None} if self.tls else None),
            "schemas": {"strict": self.settings.strict_schemas,
                        "declared": sorted(self.settings.schemas()),
                        "refused": dict(self.core.schema_refusals),
                        "compatibility": [c.as_dict() for c in self.settings.schema_report]},
            "reloads": self.reloads,
            "transactions": self.core.transactions.stats(),
            "connections": len(self.connections),
            "long_polls": dict(self.engine.long_polls.kinds),  # waiting now, by kind
            "offsets_at": len(self.lookups),  # OFFSETS with at being answered now
            "admission": self.admission.stats(),
            "unfinished_input": self.input_budget.stats(),
            "flow": {"publisher_pauses": self.flow_pauses,
                     "uncommitted_bytes": self.uncommitted_bytes,
                     "publish_pause_bytes": self.settings.publish_pause_bytes,
                     "slow_consumers_cut": self.slow_consumers,
                     "dead_connections_cut": self.dead_connections,
                     "unsent_delivery_bytes": self.unsent_delivery_bytes,
                     "delivery_buffer_budget": self.settings.delivery_buffer_bytes,
                     "unread_http_answer_bytes": self.http_unread.unsent,
                     "unread_http_answer_limit": HTTP_UNSENT_BYTES,
                     "in_flight_bytes": self.core.in_flight.total,
                     "in_flight_limit": self.core.in_flight.limit,
                     "budget_paused_connections": sum(c.budget_paused
                                                      for c in self.connections)},
            "producers": {"states": len(self.core.producers),
                          "evicted": self.core.producers.evicted},
            "channels": len(self.core.channels),
            "groups": len(self.core.groups),
            "counters": self.core.counters.as_dict(),
            "accepting": self.accepting,
        }


_RESTART_KEYS = ("broker_id", "host", "port", "http_port", "resp_port", "data_dir", "storage",
                 "tls_cert",
                 "tls_key",
                 "tls_self_signed", "storage_reserve", "storage_wal_checkpoint",
                 "storage_owner_lease", "storage_replicas", "storage_standby",
                 "websocket_heartbeat")
def _what_changed(key: str, before: Any, after: Any) -> str:
    """One reloaded setting for the log: a number's values, a table's entries by name
    (never a secret's value)."""
    if isinstance(before, dict) and isinstance(after, dict):
        names = sorted({*before, *after} - {k for k in before.keys() & after.keys()
                                            if _comparable(before[k]) == _comparable(after[k])})
        shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10
                                         else "")
        return f"{key} ({shown})"
    if isinstance(before, int | float | bool) and isinstance(after, int | float | bool):
        return f"{key} {before} -> {after}"
    return key


_RELOAD_KEYS = ("max_message_size", "max_connections", "max_connections_per_client",
                "default_lease", "dedup_window",
                "max_dedup_keys", "max_channels", "max_clients", "max_long_polls_per_client",
                "max_offsets_at_per_client", "metrics_max_queues",
                "publish_pause_bytes", "slow_consumer_bytes", "slow_consumer_seconds",
                "delivery_buffer_bytes", "in_flight_bytes", "hello_timeout",
                "http_header_timeout", "http_idle_timeout", "strict_schemas",
                "channels", "kv", "federation", "auth_mode", "broker_token", "admins",
                "rules", "storage_max_size")


def _comparable(value: Any) -> Any:
    """Settings values in a form ``!=`` can compare (compiled objects by their source).
    A compiled schema is its fingerprint: it is a dataclass too, but its validator is a
    new function object at every load, so comparing its fields would always differ."""
    if hasattr(value, "describe"):
        return value.describe()
    if hasattr(value, "fingerprint") and hasattr(value, "source"):
        return value.fingerprint
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {k: _comparable(getattr(value, k)) for k in value.__dataclass_fields__}
    return value


def _addr(addr: tuple[str, int] | None, scheme: str) -> str | None:
    if not addr:
        return None
    host = f"[{addr[0]}]" if ":" in addr[0] else addr[0]
    return f"{scheme}://{host}:{addr[1]}"


async def run_broker(settings: Settings, *, announce: Any = print,
                     overrides: dict[str, Any] | None = None) -> int:
    """Start, announce the addresses, run until SIGTERM/SIGINT, stop cleanly."""
    server = BrokerServer(settings)
    server.overrides = dict(overrides or {})
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not server.stop_reason:
            server.stop_reason = sig.name
            log.info("%s received: stopping (no new connections, committing what is staged)",
                     sig.name)
        server.request_stop()

    # Before start: a standby waiting for the primary's lease stops cleanly on SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, on_signal, sig)

    def on_sighup() -> None:
        # One line per reload: reload() logs what changed, this only what failed.
        try:
            server.reload(by="SIGHUP")
        except Exception as exc:  # a bad config must never stop the broker
            log.error("reload on SIGHUP failed: %s", getattr(exc, "message", exc))

    await server.start()
    if server.stopped_in_standby:
        log.info("stopped while standby")
        return 0
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGHUP, on_sighup)
    announce(server)
    await server.serve_forever()
    await server.stop()
    if server.primary is not None and server.primary.lost:
        # Its writes are fenced and its clients gone: nothing is lost by not waiting
        # for a storage thread stuck in a partition (interpreter exit would join it).
        logging.shutdown()
        os._exit(server.exit_status)
    return server.exit_status  # non-zero: it stopped because it could not go on
