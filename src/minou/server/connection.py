"""One native-protocol connection: frames in, core calls, frames out.

The byte transport is abstract (``Transport`` below) so the TCP adapter and
the WebSocket adapter share this class. Every complete frame of one read is
handled before a single ``write`` of all the replies; confirms and settled
replies wait for the storage commit that makes them true.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..core.producers import PRODUCER_ID
from ..errors import (
    BadRequest,
    ErrorCode,
    FrameTooLarge,
    NotAuthenticated,
    NotAuthorized,
    ProtocolError,
    RequestError,
    RequestTimeout,
    SlowConsumer,
    TooManyConnections,
    UnexpectedFrame,
)
from ..limits import (
    EVICT_MIN_IDLE_S,
    HEARTBEAT_MISSES,
    INPUT_GRACE_S,
    INPUT_MIN_RATE,
    INPUT_SMALL_BYTES,
    MAX_BATCH,
    MAX_FRAME_SIZE,
    MAX_HEARTBEAT_S,
    MAX_HELLO_FRAME_SIZE,
    MAX_OFFSETS_CHANNELS,
    MAX_PATTERNS_PER_REQUEST,
    MAX_POSITION_CHANNELS,
    MIN_HEARTBEAT_S,
    OFFSETS_MATCH_SLICE,
    PROTOCOL_VERSION,
    READ_ANSWERS_UNSENT,
    READS_PER_CONNECTION,
    SLOW_CONSUMER_GRACE_S,
)
from ..protocol import frames as f
from ..protocol.reader import BadFrame, FrameReader
from . import oplog
from .admin import LOOK_OPS, NARROWING, SELF_SERVICE_OPS, narrowing, refuse_credential
from .front import LINK_CREDIT, MERGED_OPS, OWNER_OPS
from .kv import KV_OPS, POLL_DOOR
from .lookups import nothing
from .wire import internal_error, native_error

if TYPE_CHECKING:
    from .ports import Server

log = logging.getLogger("minou.connection")
HINTED_REQUESTS = 1_000  # admin requests in flight whose op a too-large refusal names


class Transport(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...
    def get_write_buffer_size(self) -> int: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class _PollCount:
    """A KV poll's place among its connection's reads (``kv.PollDoor``): held from
    its start and while it answers, given back while it waits for a commit."""

    __slots__ = ("conn", "held")

    def __init__(self, conn: NativeConnection) -> None:
        self.conn = conn
        self.held = False

    def start(self, task: asyncio.Future[Any]) -> None:
        self.held = True
        self.conn.reads_out += 1
        task.add_done_callback(self._done)

    def waiting(self) -> None:
        if self.held:
            self.held = False
            self.conn._read_done(None)

    async def answering(self) -> None:
        await self.conn.poll_room()
        self.held = True

    def _done(self, _: object) -> None:
        self.waiting()


class NativeConnection:
    # Whether what this connection publishes was made or checked as JSON (within the
    # depth limit) before it came: the Redis door's inner connection, never a socket's.
    resp_door = False

    def __init__(self, server: Server, transport: Transport, peer: str) -> None:
        self.server = server
        self.core = server.core
        self.engine = server.engine
        self.transport = transport
        self.admitted_as: Any = transport  # what the connection limit counts (a socket)
        self.peer = peer
        # Until a HELLO is accepted, frames are a HELLO's size: a stranger's partial frames
        # must not hold the broker's memory (begin() allows the full size).
        self.reader = FrameReader(
            max_frame_size=MAX_HELLO_FRAME_SIZE,
            why_limit=" before a HELLO is accepted (a HELLO is a few KiB)")
        self.session: Any = None
        self.identity: Any = None  # auth.registry.Identity once HELLO succeeded
        # Queues spread over brokers: what is for another broker's queue goes there.
        self.front: Any = None  # front.Front
        # On a link serving an HTTP consumer elsewhere: sid -> how many messages its
        # waiting requests want (link.credit): its credit, like an HTTP consumer's.
        self.wanted: dict[int, int] = {}
        self.hellos = 0
        self.closed = False
        self.reading_paused = False
        # A frame over INPUT_SMALL_BYTES being read: where it begins in the stream, once its
        # room is reserved (server/input_budget.py); -1: none. ``input_waiting``: no room
        # yet, reading paused until the budget grants it.
        self._input_frame = -1
        self.input_waiting = False
        # Deliveries stop for two reasons: the socket's write buffer is above its water
        # mark (the peer reads slowly), or all connections together hold more unsent
        # bytes than the broker's budget and this one holds a big share.
        self._water_paused = False
        self.budget_paused = False
        # Read progress: bytes handed to the transport minus those still buffered is what
        # the kernel took; when that stops moving with deliveries out, the peer stopped.
        self.bytes_written = 0
        self.unsent_noted = 0  # this connection's part of the server's running total
        self._sent_seen = 0
        self.stalled_since: float | None = None
        # Frames that came behind a HELLO whose WELCOME waits for a commit: nothing is
        # answered before the WELCOME (and before the token's id is durable).
        self._held: list[f.Frame | BadFrame] | None = None
        self.reads_out = 0  # READs being answered (storage read, not sent yet)
        # Long polls waiting (a KV watch, channels.wait): cancelled when the connection
        # goes, so that its client gets their slots back at once, not once they time out.
        self._long_polls: set[asyncio.Future[Any]] = set()
        # OFFSETS-at lookups (each holds a slot of its client's): cancelled likewise.
        self._lookups: set[asyncio.Future[Any]] = set()
        self._read_room: asyncio.Future[None] | None = None  # a READ waits for room
        self._poll_rooms: list[asyncio.Future[None]] = []  # woken KV polls, oldest first
        self._out: list[bytes] = []
        # The admin requests being answered whose answer can grow with what the broker
        # holds (NARROWING): their op names the hint of a FRAME_TOO_LARGE refusal. An
        # entry goes with its answer; at most HINTED_REQUESTS (one whose answer never
        # came, a forward that failed, stays), past which a refusal's hint is generic.
        self._listing_ops: dict[int, str] = {}
        self._out_bytes = 0  # in _out (written at the end of a read, or past 1 MiB)
        # Heartbeats (negotiated at HELLO; 0: the client did not ask, none are kept).
        self.heartbeat = 0.0
        self.last_heard = time.monotonic()  # any bytes from the peer
        self._beat_timer: asyncio.TimerHandle | None = None
        self.hello_timer: asyncio.TimerHandle | None = None  # the HELLO deadline (admit)
        self._beat_due = 0.0
        self._send_due = 0.0
        self._written_seen = 0
        self._handlers = {
            f.Publish: self._on_publish,
            f.Subscribe: self._on_subscribe,
            f.Unsubscribe: self._on_unsubscribe,
            f.SubAdd: self._on_sub_add,
            f.SubRemove: self._on_sub_remove,
            f.Ack: self._on_ack,
            f.Nack: self._on_nack,
            f.Extend: self._on_extend,
            f.Read: self._on_read,
            f.Admin: self._on_admin,
            f.Ping: self._on_ping,
            f.Heartbeat: self._on_heartbeat,
            f.Stage: self._on_stage,
            f.TxnCommit: self._on_txn_commit,
            f.TxnAbort: self._on_txn_abort,
            f.Offsets: self._on_offsets,
            f.Position: self._on_position,
            f.Bye: self._on_bye,
        }

    # ------------------------------------------------------------------ input
    def receive(self, data: bytes) -> None:
        self.last_heard = time.monotonic()
        self.reader.receive_data(data)
        try:
            while (event := self.reader.next_event()) is not None:
                if self.closed:
                    return
                if self._held is not None:
                    self._held.append(event)
                    continue
                if self._no_room():
                    self._wait_for_room(event)  # it does not read what it is answered
                    continue
                self._handle(event)
        except ProtocolError as exc:  # framing lost (too large, zero length): fatal
            self._refused(exc)
            self._error(0, exc, fatal=True)
            self.flush()
            self.close()
            return
        if self._input_frame >= 0 or self.reader.buffered > INPUT_SMALL_BYTES:
            self._reserve_input()
        self.flush()
        self.engine.after_input()

    def _reserve_input(self) -> None:
        """Room for the large frame being read (server/input_budget.py): released when it
        is whole, reserved when one begins; without room, nothing more is read until
        there is."""
        reader, server = self.reader, self.server
        size = reader.unfinished()
        if self._input_frame >= 0 and (not size or reader.offset != self._input_frame):
            self._input_frame = -1
            server.input_done(self)
        if not size or self._input_frame >= 0 or not server.input_budget.needs_room(size) \
                or self.closed:
            return
        client = self.identity.client_id if self.identity is not None else self.peer
        budget = server.input_budget
        if budget.reserve(self, client, size, time.monotonic()):
            self._input_frame = reader.offset
            return
        budget.enqueue(self, client, size)
        oplog.input_budget_full(self.peer, client, size, budget.stats())
        self.pause_reading()
        self.input_waiting = True

    def input_granted(self) -> None:
        """The budget reserved room for the frame this connection waited to read."""
        self.input_waiting = False
        self._input_frame = self.reader.offset
        self.resume_reading()

    def input_too_slow(self) -> None:
        """The large frame being read did not arrive in the time its reservation gave."""
        if self.closed:
            return
        size = self.reader.unfinished()
        seconds = self.server.input_budget.allowed_seconds(size)
        self._input_frame = -1
        self.server.input_done(self)  # the socket reads nothing more: its room is free
        exc = RequestTimeout(
            f"a frame of {size} bytes did not arrive within {seconds:.0f} s: frames over "
            f"{INPUT_SMALL_BYTES} bytes must come at {INPUT_MIN_RATE >> 10} KiB/s or faster "
            f"after the first {INPUT_GRACE_S:g} s", limit=seconds)
        oplog.input_too_slow(self.peer, self.identity.client_id if self.identity else None,
                             "frame", size, seconds)
        self.refuse(exc)

    def _handle(self, event: f.Frame | BadFrame) -> None:
        if isinstance(event, BadFrame):
            self._refused(event.error)
            self._error(0, event.error)
            return
        if self.session is None:
            if isinstance(event, f.Hello):
                self._on_hello(event)
            else:
                exc = UnexpectedFrame(f"expected HELLO first, got {type(event).__name__.upper()}")
                self._refused(exc)
                self._error(getattr(event, "req", 0), exc, fatal=True)
                self.flush()
                self.close()
            return
        handler = self._handlers.get(type(event))
        req = getattr(event, "req", 0)
        if handler is None:
            exc = UnexpectedFrame(f"a client may not send {type(event).__name__.upper()}")
            self._refused(exc)
            self._error(req, exc)
            return
        try:
            handler(event)
        except RequestError as exc:
            self._refused(exc)
            self._error(req, exc)
        except Exception:  # a bug must cost one request, never the broker
            log.exception("internal error handling %s from %s", type(event).__name__, self.peer)
            self.server.counters_internal += 1
            self._send(native_error(req, internal_error()))

    def evicted(self) -> None:
        """Its place went to a new connection (admission.py: the limit was reached and
        this one had not said HELLO for EVICT_MIN_IDLE_S)."""
        self.refuse(TooManyConnections(
            f"the broker is at its connection limit and this connection had not said "
            f"HELLO within {EVICT_MIN_IDLE_S:g} s: its place went to a new connection",
            limit=self.server.admission.limit))

    def refuse(self, exc: RequestError) -> None:
        """Refuse the whole connection: a fatal error frame, then close."""
        self._refused(exc)
        self._error(0, exc, fatal=True)
        self.flush()
        self.close()

    def _refused(self, exc: RequestError) -> None:
        self.core.counters.refuse(exc.reason)

    # ------------------------------------------------------------ handlers
    def _on_hello(self, hello: f.Hello) -> None:
        if hello.version != PROTOCOL_VERSION:
            raise_later = UnexpectedFrame(
                f"protocol version {hello.version} is not supported (this broker speaks "
                f"{PROTOCOL_VERSION})"
            )
            self._refused(raise_later)
            self._error(0, raise_later, fatal=True)
            self.flush()
            self.close()
            return
        if not hello.client_id or len(hello.client_id) > 200:
            exc = UnexpectedFrame("client_id must be 1..200 characters")
            self._refused(exc)
            self._error(0, exc, fatal=True)
            self.flush()
            self.close()
            return
        self.hellos += 1
        try:
            identity = self.server.authenticate(hello, self.peer)
        except NotAuthenticated as exc:
            oplog.refused(exc, hello.client_id, self.peer, "native")
            self.engine.commit()  # e.g. a pending registration
            if exc.detail.get("why") == "token_required" and self.hellos == 1:
                self._error(0, exc)  # a challenge, not a failure: sign for broker_id
                return
            self.refuse(exc)
            return
        try:
            producer = self.begin(identity, hello.producer_id)
        except TooManyConnections as exc:  # its client has max_connections_per_client
            self._error(0, exc, fatal=True)
            self.flush()
            self.close()
            return
        if hello.heartbeat > 0:
            self.heartbeat = min(max(float(hello.heartbeat), MIN_HEARTBEAT_S), MAX_HEARTBEAT_S)
        welcome = f.Welcome(self.core.broker_id, PROTOCOL_VERSION, str(id(self)),
                            self.core.max_message_size, identity.client_id, identity.admin,
                            self.heartbeat, producer)
        spread = getattr(self.server, "spread", None)
        if spread is not None and identity.method == "key" and hello.token:
            # Queues spread over brokers: the token's id must be new to every one of
            # them, not only to this one. Nothing is answered meanwhile.
            self._held = []
            self.pause_reading()
            token = hello.token
            spread.token_claim(token).add_done_callback(
                lambda claim: self._token_claimed(claim, welcome, token))
            return
        self._answer_hello(welcome)

    def _token_claimed(self, claim: asyncio.Future[bool], welcome: f.Welcome,
                       token: str) -> None:
        if self.closed or claim.cancelled():
            return
        exc = claim.exception()
        if exc is None and not claim.result():
            self.server.registry.failures["replayed_jti"] += 1
            refused = NotAuthenticated(
                "token already used (replayed jti) on another broker of this cluster; "
                "sign a new one", why="replayed_jti")
            oplog.refused(refused, welcome.client_id, self.peer, "native")
            self.refuse(refused)
            return
        if exc is not None:  # Redis out of reach (logged by the spread role): as when
            # storage is (_answer_hello), welcomed; this broker remembers the id, and
            # stores it with a later commit.
            log.debug("HELLO token of %s not claimed in Redis: %s", welcome.client_id, exc)
            self.server.spread.token_unclaimed(token)
        self._answer_hello(welcome)

    def _answer_hello(self, welcome: f.Welcome) -> None:
        refusal = self.core.storage_refusal
        unreachable = refusal is not None and refusal.code == ErrorCode.STORAGE_UNAVAILABLE
        if (self.core.batch.clients or self.core.batch.used_tokens) and not unreachable:
            # A first registration, or the token's id: welcome once they are durable
            # (hung on the batch before the write request hands it to the writer).
            # Not while storage is out of reach: nothing could be made durable, and an
            # operator must still get in to look (this process remembers the token's
            # id meanwhile, so it cannot be replayed here; it is stored once back).
            if self._held is None:  # else: held while its token was claimed
                self._held = []
            self.pause_reading()
            # A commit that fails for want of storage (a full disk, Redis gone) is no
            # reason to shut the client out: welcomed all the same, as when storage was
            # already known to be out of reach.
            self.engine.after_commit(lambda: self._welcome(welcome),
                                     lambda exc: self._welcome(welcome), urgent=True)
        elif self._held is not None:  # held while its token was claimed (stored there)
            self._welcome(welcome)
        else:
            self._send(welcome)
            self._start_heartbeats()

    def begin(self, identity: Any, producer_id: str | None = None) -> str:
        """Serve ``identity`` from now on (authenticated by the caller: a HELLO here, a
        Redis protocol AUTH for a connection that door drives); its producer id. Raises
        TooManyConnections when its client has ``max_connections_per_client`` already."""
        admission = self.server.admission
        admission.enter_client(self, identity, self.peer)
        admission.busy(self.admitted_as)  # logged in: keeps its place at the limit
        self.identity = identity
        self.reader.allow(self.server.max_frame_size)
        self._stop_hello_timer()
        self.server.authentications[identity.method] += 1
        self.session = self.server.open_session(identity, self)
        spread = getattr(self.server, "spread", None)
        if spread is not None and identity.method != "link":  # a link forwards no further
            from .front import Front

            self.front = Front(self, spread)
        # The producer id a client had keeps its sequences across reconnects; it is
        # only ever looked up with the authenticated client id, so presenting another
        # client's id reaches nothing of theirs.
        producer = producer_id if PRODUCER_ID.fullmatch(producer_id or "") \
            else secrets.token_hex(8)
        self.session.producer_id = producer
        return producer

    def hold(self, until: asyncio.Future[Any], then: Any) -> None:
        """Handle nothing more from this client until ``until`` is done, then call
        ``then`` and what came meanwhile, in order (a publish waiting for its queue to
        be taken over must not be overtaken by the next)."""
        self._held = []
        self.pause_reading()

        def go(_: asyncio.Future[Any]) -> None:
            held, self._held = self._held or [], None
            if self.closed:
                return
            self.resume_reading()
            try:
                then()
            except RequestError as exc:
                self._refused(exc)
                self._error(0, exc)
            for event in held:
                if self.closed:
                    return
                if self._held is not None:  # held again by one of them
                    self._held.append(event)
                    continue
                if self._no_room():
                    self._wait_for_room(event)
                    continue
                self._handle(event)
            self.flush()
            self.engine.after_input()

        until.add_done_callback(go)

    def _welcome(self, welcome: f.Welcome) -> None:
        """The HELLO's changes are durable: WELCOME, then what came behind it."""
        self.send(welcome)
        self._start_heartbeats()
        held, self._held = self._held or [], None
        if self.closed:
            return
        self.resume_reading()  # first: a held publish may pause it again (flow control)
        for event in held:
            if self.closed:
                return
            if self._held is not None:  # held again by one of them (a READ: no room)
                self._held.append(event)
                continue
            if self._no_room():
                self._wait_for_room(event)
                continue
            self._handle(event)
        self.flush()
        self.engine.after_input()

    def _on_publish(self, frame: f.Publish) -> None:
        if len(frame.msgs) > MAX_BATCH:
            raise RequestError(f"{len(frame.msgs)} messages in one frame; the limit is {MAX_BATCH}")
        if self.front is not None and self.front.publish(frame):
            return
        self.publish_here(frame)

    def publish_here(self, frame: f.Publish) -> None:
        req = frame.req

        def confirm(outcomes: list[f.Outcome], failure: RequestError | None) -> None:
            self.send(f.Confirm(req, outcomes))

        self.engine.publish(frame.msgs, self.session.access, confirm, session=self.session,
                            publisher=self, routed=self.front is not None,
                            resp_door=self.resp_door)

    def _on_subscribe(self, frame: f.Subscribe) -> None:
        reply = f.Result(frame.req, {"sid": frame.sid})
        front = self.front
        answer = (lambda: self.send(reply)) if front is None else \
            (lambda: front.subscribe(frame, reply))
        sub = self.engine.subscribe(
            self.session, frame.sid, answer, kind=frame.kind,
            patterns=list(frame.patterns), group=frame.group, start=frame.start,
            prefetch=frame.prefetch, lease=frame.lease, name=frame.name,
            exclusive=frame.exclusive)
        # Paused like the others while this socket is full or over its budget share: a
        # reader that stopped reading must not get round the pause by subscribing again.
        sub.paused = self._water_paused or self.budget_paused

    def _on_unsubscribe(self, frame: f.Unsubscribe) -> None:
        reply = f.Result(frame.req, None)
        self.engine.unsubscribe(self.session, frame.sid, lambda: self.send(reply))
        if self.front is not None:
            self.front.unsubscribe(frame)

    def _on_sub_add(self, frame: f.SubAdd) -> None:
        self.core.add_pattern(self.session, frame.sid, frame.pattern, time.time())
        self._reply_after_commit(f.Result(frame.req, None))
        if self.front is not None:
            self.front.sub_add(frame)

    def _on_sub_remove(self, frame: f.SubRemove) -> None:
        self.core.remove_pattern(self.session, frame.sid, frame.pattern, time.time())
        self._reply_after_commit(f.Result(frame.req, None))
        if self.front is not None:
            self.front.sub_remove(frame)

    def _settle(self, frame: f.Ack | f.Nack | f.Extend, op: str, **kw: Any) -> None:
        if self.front is not None:
            local, remote = self.front.split(frame.tags)
            if remote:
                self._settle_split(frame, op, local, remote, **kw)
                return
        req = frame.req

        def settled(failed: list[tuple[int, int, str]], exc: RequestError | None) -> None:
            if exc is not None:  # not durable (a full disk): every tag fails
                refused = {tag for tag, _, _ in failed}
                text = f"not made durable: {exc.message}"
                failed = [*failed, *((tag, int(exc.code), text)
                                     for tag in frame.tags if tag not in refused)]
            self.send(f.Settled(req, failed))

        failed = self.engine.settle(self.session, op, frame.tags, settled if req else None,
                                    **kw)
        if self.wanted:
            self._recredit()
        if not req:
            for tag, code, text in failed:
                self._send(f.Error(0, code, text, {"tag": tag}))

    def _settle_split(self, frame: f.Ack | f.Nack | f.Extend, op: str, local: list[int],
                      remote: list[int], **kw: Any) -> None:
        """Tags of this broker's deliveries and of others' (front.py): each part settled
        where it was delivered, one SETTLED (or the errors) once all answered."""
        req, failed_all = frame.req, []
        answered, expected = [0], [-1]

        def part(failed: list[tuple[int, int, str]]) -> None:
            failed_all.extend(failed)
            answered[0] += 1
            finish()

        def finish() -> None:
            if answered[0] != expected[0]:
                return
            if req:
                self.send(f.Settled(req, failed_all))
            else:
                for tag, code, text in failed_all:
                    self.send(f.Error(0, code, text, {"tag": tag}))

        def settled(failed: list[tuple[int, int, str]], exc: RequestError | None) -> None:
            if exc is not None:
                refused = {tag for tag, _, _ in failed}
                failed = [*failed, *((tag, int(exc.code), f"not made durable: {exc.message}")
                                     for tag in local if tag not in refused)]
            part(failed)

        parts = self.front.settle(frame, remote, part)
        if local:
            parts += 1
            failed = self.engine.settle(self.session, op, local, settled if req else None,
                                        **kw)
            if not req:
                part(failed)
        expected[0] = parts
        finish()

    def _on_ack(self, frame: f.Ack) -> None:
        self._settle(frame, "ack")

    def _on_nack(self, frame: f.Nack) -> None:
        self._settle(frame, "nack", delay=frame.delay, front=frame.front)

    def _on_extend(self, frame: f.Extend) -> None:
        self._settle(frame, "extend", seconds=frame.seconds)

    def _on_read(self, frame: f.Read) -> None:
        if self.front is not None and self.front.read(frame):
            return
        if not self.resp_door and (
                self.reads_out >= READS_PER_CONNECTION
                or self.transport.get_write_buffer_size() > READ_ANSWERS_UNSENT):
            # (The Redis door bounds its reads itself: RUN_WINDOW, its range bound.)
            self._wait_for_room(frame)
            return
        self._answer_later(self.server.read_range(self, frame))

    def _answer_later(self, task: asyncio.Future[Any] | None) -> None:
        """An answer that storage must be read for first (a READ, a KV read): counted
        until sent, READS_PER_CONNECTION at most at once (its size is not known before)."""
        if task is not None:
            self.reads_out += 1
            task.add_done_callback(self._read_done)

    def _no_room(self) -> bool:
        """Whether 16 MiB of answers wait for the client to read them (those of this
        read written first once they pass 1 MiB, so that they count), or
        READS_PER_CONNECTION answers wait for storage (READ, KV reads)."""
        if self._out_bytes > 1 << 20:
            self.flush()
        return self.reads_out >= READS_PER_CONNECTION or \
            self.transport.get_write_buffer_size() > READ_ANSWERS_UNSENT

    def _wait_for_room(self, event: f.Frame | BadFrame) -> None:
        """A client asking on without reading what it was answered: the answers would
        wait in this process (200 READs of 8 MiB held 1.1 GB, 20,000 OFFSETS 141 MB and
        counting). ``event`` and everything after it wait, nothing more is read from it
        until it reads some (TCP's own flow control from there)."""
        self._read_room = room = asyncio.get_running_loop().create_future()
        self.hold(room, lambda: self._handle(event))

    def _read_done(self, _: object) -> None:
        self.reads_out -= 1
        self._read_room_check()

    def _read_room_check(self) -> None:
        room = self._read_room
        if room is not None and not room.done() and not self.closed and \
                self.reads_out < READS_PER_CONNECTION and \
                self.transport.get_write_buffer_size() <= READ_ANSWERS_UNSENT:
            self._read_room = None
            room.set_result(None)
        # Woken KV polls, one at a time: each counts as a read once let through.
        while self._poll_rooms and not self.closed and not self._no_room():
            poll_room = self._poll_rooms.pop(0)
            if not poll_room.done():
                self.reads_out += 1
                poll_room.set_result(None)

    async def poll_room(self) -> None:
        """Once this connection may answer one more read (a woken KV poll's page);
        counted in ``reads_out`` from then."""
        if not self._poll_rooms and not self._no_room():
            self.reads_out += 1
            return
        room = asyncio.get_running_loop().create_future()
        self._poll_rooms.append(room)
        try:
            await room
        except asyncio.CancelledError:
            if room in self._poll_rooms:
                self._poll_rooms.remove(room)
            elif room.done() and not room.cancelled():  # counted just before the cancel
                self._read_done(None)
            raise

    def _on_admin(self, frame: f.Admin, adopted: bool = False) -> None:
        if frame.op == LINK_CREDIT:
            self._link_credit(frame)
            return
        if not self.session.admin and frame.op not in SELF_SERVICE_OPS:
            raise NotAuthorized(
                f"admin operation {frame.op!r} needs an admin identity (auth.admins); "
                f"client {self.session.client_id!r} is not one", op=frame.op)
        refuse_credential(frame.op, self.identity)  # before the queue's owner is asked
        if frame.op in NARROWING and len(self._listing_ops) < HINTED_REQUESTS:
            self._listing_ops[frame.req] = frame.op
        front = self.front
        if front is not None and isinstance(frame.args, dict):
            waiting = front.adopting(frame) if frame.op in KV_OPS and not adopted else None
            if waiting is not None:  # asked again once this broker holds the bucket
                waiting.add_done_callback(lambda _: self._answer_admin_later(frame))
                return
            there = front.ask_owner(frame) if frame.op in OWNER_OPS else None
            if there is not None:  # the queue's owner answers
                there.add_done_callback(lambda fut: self.send(
                    msgspec.structs.replace(fut.result(), req=frame.req)))
                return
        result = self.server.admin(frame.op, frame.args, self.identity)
        if front is not None and frame.op in MERGED_OPS and not frame.args.get("here"):
            result = self._everywhere(frame, result)  # every broker's queues, merged
        if inspect.isawaitable(result):  # KV reads read committed state: answered at once
            polls = isinstance(frame.args, dict) and bool(frame.args.get("wait"))
            count = _PollCount(self) if polls and frame.op == "kv.read" else None
            door = POLL_DOOR.set(count)  # the task copies it: its poll reports to count
            try:
                task = self.server.spawn_reply(self, frame.req, result,
                                               read_only=frame.op in KV_OPS
                                               or frame.op in LOOK_OPS)
            finally:
                POLL_DOOR.reset(door)
            if not polls:
                self._answer_later(task)
            else:  # a long poll waits: counted by its own bound (server/long_polls.py)
                self._long_polls.add(task)
                task.add_done_callback(self._long_polls.discard)
                if count is not None:  # ... and counted as a read while it answers
                    count.start(task)
        elif frame.op in LOOK_OPS:  # changed nothing: answered now
            self.send(f.Result(frame.req, result))
        else:  # changed state: answered once durable, or the commit's error
            reply = f.Result(frame.req, result)
            self.engine.when_durable(lambda: self.send(reply), lambda exc: self.send(
                native_error(frame.req, exc)))

    def _answer_admin_later(self, frame: f.Admin) -> None:
        try:
            self._on_admin(frame, adopted=True)
        except RequestError as exc:
            self._refused(exc)
            self._error(frame.req, exc)

    async def _everywhere(self, frame: f.Admin, local: Any) -> Any:
        if inspect.isawaitable(local):
            local = await local
        return await self.front.ask_everywhere(frame, local, MERGED_OPS[frame.op])

    def _link_credit(self, frame: f.Admin) -> None:
        """A front whose client is an HTTP consumer (front.Front.credit): deliveries
        nobody was there to take go back as if never sent (the attempt does not count),
        and the subscription's credit becomes what its waiting requests want."""
        if self.identity.method != "link":
            raise NotAuthorized(f"{LINK_CREDIT!r} is for the brokers' own links",
                                op=frame.op)
        args = frame.args if isinstance(frame.args, dict) else {}
        sid, wanted, back = args.get("sid"), args.get("wanted"), args.get("withdraw") or []
        if not (isinstance(sid, int) and isinstance(wanted, int) and wanted >= 0
                and isinstance(back, list) and all(isinstance(t, int) for t in back)):
            raise BadRequest(f"{LINK_CREDIT}: sid, wanted (>= 0) and withdraw (tags)")
        if back:
            self.core.withdraw(self.session, back, time.time())
        sub = self.session.subs.get(sid)
        if sub is not None:
            sub.on_demand = True
            self.wanted[sid] = wanted
            self._recredit()
        self.engine.changed()
        if frame.req:
            self.send(f.Result(frame.req, None))

    def _recredit(self) -> None:
        """Credit is what the waiting requests want, whatever is unsettled."""
        for sid, wanted in self.wanted.items():
            sub = self.session.subs.get(sid)
            if sub is not None:
                sub.prefetch = sub.unsettled + wanted
        self.server.wake_groups(self.session)

    def leases_expired(self) -> None:
        if self.wanted:
            self._recredit()

    def _on_stage(self, frame: f.Stage) -> None:
        if self.front is not None and self.front.stage(frame):
            return
        self.stage_here(frame)

    def stage_here(self, frame: f.Stage) -> None:
        self.engine.check_accepting()
        held = self.core.stage(self.session, frame.txn, list(frame.msgs), time.time())
        # Once stored: a broker restart before the TXN_COMMIT loses nothing staged.
        self._reply_after_commit(f.Result(frame.req, {"txn": frame.txn, "staged": held}))

    def _on_txn_commit(self, frame: f.TxnCommit) -> None:
        spread = getattr(self.server, "spread", None)
        if spread is not None and frame.txns:  # the writer id is one client's everywhere
            claim = spread.writer_claim(frame.writer_id, self.session.client_id)
            if claim is not None:
                claim.add_done_callback(lambda done: self._txn_commit_claimed(frame, done))
                return
            # Here too when nothing of it is staged on this broker: the others trust it.
            self.core.state.transactions.check_writer(self.session.client_id,
                                                      frame.writer_id)
        if self.front is not None:  # each queue's owner holds its part of a transaction
            self.front.commit_txns(frame)
            return
        if self.identity.method == "link":  # a front asks every broker: commit what is here
            self.commit_present(frame, self.send)
            return
        # A failed commit (a full disk) published nothing: the error, never the Result.
        self.engine.commit_txns(
            self.session, frame.writer_id, frame.batch_id, list(frame.txns),
            lambda result: self.send(f.Result(frame.req, result)),
            lambda exc: self.send(native_error(
                frame.req, exc,
                message=f"{exc.message} The transactions are dropped: stage them again.")),
            frame.lineage, frame.after)

    def _txn_commit_claimed(self, frame: f.TxnCommit, claim: asyncio.Future[None]) -> None:
        """The commit, once its writer id's owner is known on this broker."""
        if self.closed or claim.cancelled():
            return
        try:
            if (exc := claim.exception()) is not None:
                raise exc
            self._on_txn_commit(frame)
        except RequestError as exc:
            self._refused(exc)
            self._error(frame.req, exc)
        except Exception:  # a bug must cost one request, never the broker
            log.exception("internal error committing for %s", self.peer)
            self.server.counters_internal += 1
            self._send(native_error(frame.req, internal_error()))
        self.flush()

    def commit_present(self, frame: f.TxnCommit, answer: Any) -> None:
        """Commit those of ``frame``'s transactions staged on this broker (queues
        spread over brokers); ``answer`` gets the Result, with "absent": the others, or
        the error."""
        present = self.core.txns_present(self.session, list(frame.txns))
        absent = [t for t in frame.txns if t not in present]
        if not present:
            answer(f.Result(frame.req, {"published": 0, "discarded": 0,
                                        "replayed_channels": [], "failed": [],
                                        "absent": absent}))
            return
        self.engine.commit_txns(
            self.session, frame.writer_id, frame.batch_id, present,
            lambda result: answer(f.Result(frame.req, {**result, "absent": absent})),
            lambda exc: answer(native_error(
                frame.req, exc,
                message=f"{exc.message} The transactions are dropped: stage them again.")),
            frame.lineage, frame.after)

    def _on_txn_abort(self, frame: f.TxnAbort) -> None:
        dropped = self.core.abort_txns(self.session, list(frame.txns))
        if self.front is not None:  # and on every other broker (their parts)
            self.front.abort_txns(frame, dropped)
            return
        self._reply_after_commit(f.Result(frame.req, {"aborted": dropped}))

    def _on_offsets(self, frame: f.Offsets) -> None:
        if len(frame.patterns) > MAX_PATTERNS_PER_REQUEST:
            raise BadRequest(f"{len(frame.patterns)} patterns in one OFFSETS request; the limit "
                             f"is {MAX_PATTERNS_PER_REQUEST}")
        if frame.at > 0:  # the seqs by publish time are read from storage
            self._offsets_later(frame, bounded=True)
            return
        if len(self.core.state.channels) > OFFSETS_MATCH_SLICE and \
                any("*" in p for p in frame.patterns):
            # Wildcards over many channels are matched a slice a turn too (whole, 50
            # requests pipelined over 50,000 channels held every other client ~3.5 s).
            # Not refused per client as those with ``at`` are: a reader asks these at
            # every batch; a connection waits past READS_PER_CONNECTION of them.
            self._offsets_later(frame, bounded=False)
            return
        found = self.core.offsets(self.session, list(frame.patterns))
        if self.front is not None:  # every broker answers for the queues it owns
            self.front.offsets(frame, found, MAX_OFFSETS_CHANNELS)
            return
        if len(found) > MAX_OFFSETS_CHANNELS:
            raise BadRequest(f"the patterns match {len(found)} channels; one OFFSETS answer "
                             f"lists at most {MAX_OFFSETS_CHANNELS}: narrow the patterns")
        self._send(f.Result(frame.req, found))

    def _offsets_later(self, frame: f.Offsets, *, bounded: bool) -> None:
        """OFFSETS answered by a task that matches a slice a turn (and, with ``at``,
        looks up storage); cancelled if the connection goes (nobody is there to
        answer). ``bounded``: one of its client's lookups (max_offsets_at_per_client
        over all its connections: refused before any work past it), given back
        however it ends."""
        give_back = self.server.lookups.take(self.identity) if bounded else nothing
        try:
            lookup = self.server.offsets_at(self.session, list(frame.patterns), frame.at,
                                            None if self.front is not None
                                            else MAX_OFFSETS_CHANNELS)
        except BaseException:
            give_back()
            raise
        lookup.add_done_callback(lambda _: give_back())
        self._lookups.add(lookup)
        lookup.add_done_callback(self._lookups.discard)
        if self.front is not None:  # every broker answers for the queues it owns
            self.front.offsets(frame, lookup, MAX_OFFSETS_CHANNELS)
            return
        self._answer_later(self.server.spawn_reply(self, frame.req, lookup))

    def _on_position(self, frame: f.Position) -> None:
        if len(frame.positions) > MAX_POSITION_CHANNELS:
            raise BadRequest(f"{len(frame.positions)} channels in one POSITION request; the "
                             f"limit is {MAX_POSITION_CHANNELS}")
        if self.front is not None:
            mine = self.front.positions(frame)
            if mine is not None:  # some channels are other brokers': theirs go there
                lags = self.core.set_position(self.session, frame.group, mine, time.time()) \
                    if mine else {}
                self.front.merge_lags(frame, mine or None, lambda done: self.engine.after_commit(
                    lambda: done({"lag": lags})))
                return
        lags = self.core.set_position(self.session, frame.group, dict(frame.positions),
                                      time.time())
        self._reply_after_commit(f.Result(frame.req, {"lag": lags}))

    def _on_heartbeat(self, frame: f.Heartbeat) -> None:
        pass  # receive() noted the time: hearing it is all it is for

    def _on_ping(self, frame: f.Ping) -> None:
        self._send(f.Pong(frame.req))

    def _on_bye(self, frame: f.Bye) -> None:
        self.flush()
        self.close()

    # ----------------------------------------------------------------- output
    def _reply_after_commit(self, frame: f.Frame) -> None:
        self.engine.after_commit(lambda: self.send(frame))

    def _encoded(self, frame: f.Frame) -> bytes:
        """``frame`` as bytes; a RESULT over MAX_FRAME_SIZE becomes its request's error
        (FRAME_TOO_LARGE, not fatal), counted and logged: a client's reader refuses a
        larger frame and drops the connection, so the caller saw it closed, its library
        retried the request until its timeout, and nothing said why."""
        data = f.encode(frame)
        op = self._listing_ops.pop(frame.req, None) \
            if self._listing_ops and isinstance(frame, f.Result | f.Error) else None
        if len(data) - 4 > MAX_FRAME_SIZE and isinstance(frame, f.Result):
            exc = FrameTooLarge(
                f"the answer to request {frame.req} would be a frame of {len(data) - 4} "
                f"bytes, over the {MAX_FRAME_SIZE} byte limit: {narrowing(op)}",
                limit=MAX_FRAME_SIZE, size=len(data) - 4)
            self._refused(exc)
            oplog.answer_too_large(self.peer, self.identity.client_id
                                   if self.identity is not None else None,
                                   len(data) - 4, MAX_FRAME_SIZE)
            data = f.encode(native_error(frame.req, exc))
        return data

    def _send(self, frame: f.Frame) -> None:
        data = self._encoded(frame)
        self._out.append(data)
        self._out_bytes += len(data)

    def _error(self, req: int, exc: RequestError, *, fatal: bool = False) -> None:
        self._send(native_error(req, exc, fatal=fatal))

    def flush(self) -> None:
        self._out_bytes = 0
        if self._out and not self.closed:
            data = b"".join(self._out)
            self.bytes_written += len(data)
            self.transport.write(data)
        self._out.clear()

    def send(self, frame: f.Frame) -> None:
        """Write one frame now (used from commit callbacks and the pump)."""
        if not self.closed:
            data = self._encoded(frame)
            self.bytes_written += len(data)
            self.transport.write(data)

    def send_deliveries(self, sid: int, items: list[f.Delivery]) -> None:
        if self.closed:
            return
        data = f.encode(f.Deliver(sid, items))
        self.bytes_written += len(data)
        self.transport.write(data)
        limit = self.server.settings.slow_consumer_bytes
        buffered = self.transport.get_write_buffer_size()
        if self.server.note_unsent(self, buffered):
            self.set_budget_paused(True)  # at once, not at the next tick
        if buffered > limit:
            self._cut_slow(SlowConsumer(
                f"more than {limit} bytes of deliveries are waiting to be read; "
                "the connection is closed and its deliveries requeued",
                limit=limit,
            ))

    def _cut_slow(self, exc: SlowConsumer) -> None:
        """A consumer that does not read: error frame, close, deliveries back now."""
        if self.closed:
            return
        self.server.slow_consumers += 1
        log.warning("slow consumer %s (%s) cut: %s", self.peer,
                    self.session.client_id if self.session is not None else "?", exc.message)
        self._refused(exc)
        self._error(0, exc, fatal=True)
        self.flush()
        self.close()
        # Its deliveries go back now, not when the peer has read the backlog; and the
        # peer gets a short grace to read the error before the socket is dropped.
        if self.session is not None:
            self.engine.close(self.session)
            self.session = None
        asyncio.get_running_loop().call_later(SLOW_CONSUMER_GRACE_S, self.transport.abort)

    def set_paused(self, paused: bool) -> None:
        """The transport's write buffer crossed a water mark: stop or resume deliveries
        (and READs held for want of room)."""
        self._water_paused = paused
        self._apply_pause()
        if not paused:
            self._read_room_check()

    def set_budget_paused(self, paused: bool) -> None:
        if paused != self.budget_paused:
            self.budget_paused = paused
            self._apply_pause()

    def _apply_pause(self) -> None:
        if self.session is None:
            return
        paused = self._water_paused or self.budget_paused
        for sub in self.session.subs.values():
            sub.paused = paused
        if self.front is not None:  # the other brokers' deliveries, relayed here
            self.front.pause_links(paused)
        if not paused:
            self.server.wake_groups(self.session)

    def watch_progress(self, buffered: int, now: float) -> None:
        """Called every tick: a consumer that has unsettled deliveries and unsent bytes
        but read nothing for ``slow_consumer_seconds`` is cut, so it holds neither
        messages nor memory until its leases end; so is a client whose requests wait for
        it to read their answers. Deliveries relayed from the broker that owns a queue
        (front.py) count as its own: that broker sees a relay that reads, not the
        consumer that stopped."""
        sent = self.bytes_written - buffered
        held = 0 if self.session is None else len(self.session.leases) + (
            len(self.front.tags) if self.front is not None else 0)
        if not buffered or sent != self._sent_seen or self.session is None \
                or not (held or self._read_room is not None or self._poll_rooms):
            self._sent_seen = sent
            self.stalled_since = None
            return
        if self.stalled_since is None:
            self.stalled_since = now
            return
        seconds = self.server.settings.slow_consumer_seconds
        # Not ``now - stalled_since >= seconds``: a difference of two clock readings can
        # round below the sum it came from (when the sum crosses a power of two), so a
        # tick exactly ``seconds`` later could fail to cut (a test did, once).
        if now >= self.stalled_since + seconds and not held:
            self._cut_slow(SlowConsumer(
                f"no answers were read for {seconds:g} s while more requests waited for "
                "them to be; the connection is closed", seconds=seconds))
        elif now >= self.stalled_since + seconds:
            self._cut_slow(SlowConsumer(
                f"no deliveries were read for {seconds:g} s while {held} were unsettled; "
                "the connection is closed and its deliveries requeued", seconds=seconds))

    # ------------------------------------------------------------- heartbeats
    def _start_heartbeats(self) -> None:
        if not self.heartbeat or self.closed or self._beat_timer is not None:
            return
        now = time.monotonic()
        self.last_heard = now
        self._send_due = now + self.heartbeat / 2
        self._written_seen = self.bytes_written
        self._schedule_beat(now)

    def _schedule_beat(self, now: float) -> None:
        self._beat_due = min(self._send_due, self.last_heard + HEARTBEAT_MISSES * self.heartbeat)
        self._beat_timer = asyncio.get_running_loop().call_at(
            max(self._beat_due, now), self._beat)

    def silence_is_ours(self) -> bool:
        """Not reading this socket on purpose (flow control, frames held): a peer that
        seems silent meanwhile may not be."""
        return self.reading_paused or self._held is not None

    def _beat(self) -> None:
        """Send a heartbeat if nothing else went out for an interval; declare the peer
        dead if nothing came in for HEARTBEAT_MISSES intervals."""
        self._beat_timer = None
        if self.closed:
            return
        now = time.monotonic()
        interval = self.heartbeat
        if now - self._beat_due > interval or self.silence_is_ours():
            # This process was not running (paused, or the loop blocked) or is not
            # reading this socket (flow control): the silence is ours, not the peer's.
            self.last_heard = now
        silent = now - self.last_heard
        if silent >= HEARTBEAT_MISSES * interval:
            self._dead(silent)
            return
        if now >= self._send_due:
            if self.bytes_written == self._written_seen:
                self.send(f.Heartbeat())
            self._written_seen = self.bytes_written
            self._send_due = now + interval / 2
        self._schedule_beat(now)

    def _dead(self, silent: float) -> None:
        """The peer sent nothing for two intervals (a paused process, a black-holed
        network, a cable pulled): cut the connection and give its deliveries back now,
        not when their leases end."""
        self.server.dead_connections += 1
        held = len(self.session.leases) if self.session is not None else 0
        oplog.connection_dead(self.peer, self.session.client_id if self.session else None,
                              silent, self.heartbeat, held)
        self.closed = True
        if self.session is not None:
            self.engine.close(self.session)
            self.session = None
        self.transport.abort()

    def pause_reading(self) -> None:
        if not self.reading_paused and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and not self.closed and not self.input_waiting:
            self.reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
        self._stop_heartbeats()
        if self.front is not None:
            self.front.close()

    def _stop_heartbeats(self) -> None:
        if self._beat_timer is not None:
            self._beat_timer.cancel()
            self._beat_timer = None

    def _stop_hello_timer(self) -> None:
        if self.hello_timer is not None:
            self.hello_timer.cancel()
            self.hello_timer = None

    def lost(self) -> None:
        """The transport is gone: return unsettled deliveries."""
        if self.reader.buffered:
            self.core.counters.refuse("truncated_frame")
        self.closed = True
        self._stop_heartbeats()
        self._stop_hello_timer()
        self.server.admission.leave_client(self)
        if self._input_frame >= 0 or self.input_waiting:
            self._input_frame, self.input_waiting = -1, False
            self.server.input_done(self)
        for task in [*self._long_polls, *self._lookups]:  # nobody is there to answer
            task.cancel()
        if self.front is not None:
            self.front.close()
        if self.session is not None:
            self.engine.close(self.session)
            self.session = None
