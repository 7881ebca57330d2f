"""The Redis protocol door (docs/redis-protocol.md): ``resp_port``, RESP2 and RESP3.

A thin adapter, like the WebSocket door: each Redis connection drives a native
connection of its own (``_Inner``), whose frames come back as objects instead of
bytes. So rules, schemas, quotas, queues spread over brokers, revocations and the
error table are the native protocol's, and this module only translates: a command
becomes native frames (PUBLISH, READ, ADMIN...), their answers become RESP replies.

Replies go out in the order the commands came (pipelining), whatever order their
answers arrive in: each command holds a slot in ``_slots``, filled when answered.
A connection authenticates with ``AUTH`` or ``HELLO ... AUTH`` using what HTTP
accepts as a bearer (a JWT signed with the client's key, reusable until it expires;
a delegated credential; the broker token); ``--dev`` needs none.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..core.log import READ_WEIGHT_BASE
from ..core.stream_ids import (
    EXHAUSTED_ERROR,
    ID_HEADER,
    TOP_ERROR,
    ZERO_ERROR,
    StreamIds,
    parse_explicit,
)
from ..errors import (
    ERROR_TABLE,
    BadRequest,
    ErrorCode,
    NotAuthenticated,
    RequestError,
    TooManyConnections,
)
from ..limits import (
    INPUT_SMALL_BYTES,
    INPUT_STEP_BYTES,
    MAX_DELETE,
    MAX_FROM_SEQ,
    MAX_HELLO_FRAME_SIZE,
    REFUSAL_LINGER_S,
    RESP_RANGE_BYTES,
    RESP_RANGE_TOTAL_BYTES,
    STORAGE_READ_BYTES,
)
from ..names import Pattern, is_inbox
from ..protocol import frames as f
from ..protocol.frames import Delivery
from ..protocol.resp import (
    NULL_ARRAY,
    OK,
    Encoded,
    Error,
    Map,
    RespParser,
    RespProtocolError,
    Simple,
    Verbatim,
    encode,
)
from ..protocol.resp_commands import COMMAND_DOCS, docs_reply, info_reply
from ..protocol.resp_streams import (
    StreamIdError,
    StreamKeyError,
    channel_to_key,
    encoded_id,
    encoded_message,
    entry_to_message,
    exact_seq,
    id_of,
    key_to_channel,
    message_to_entry,
    parse_id,
    stream_pattern,
)
from . import oplog, resp_keys
from .connection import NativeConnection
from .front import ADOPT
from .resp_groups import (
    DEFAULT_COUNT,
    MAX_COUNT,
    MAX_PENDING,
    RespConsumer,
    RespGroups,
    group_name,
)

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server as BrokerServer

log = logging.getLogger("minou.resp")

REDIS_VERSION = "7.2.0"  # the Redis release whose command forms this door follows
READ_PAGE = 1000  # messages one READ brings back for XRANGE
MAX_PENDING_REPLIES = 10_000  # commands in flight on one connection: then reading pauses
MAX_WAIT_S = 30.0  # one long poll of a blocking XREAD (then it asks again)
PUBLISH_BATCH = 1000  # pipelined XADDs gathered into one PUBLISH frame at most
try:  # hiredis's C reader, with the pure parser's results (minou[resp])
    from ..protocol.resp_hiredis import HiredisParser as RequestParser
except ImportError:
    RequestParser = RespParser  # type: ignore[misc,assignment]
WRITE_HIGH = 1 << 20  # unsent reply bytes past which a connection's commands wait
RUN_WINDOW = 256  # commands other than XADD run ahead of their replies, at most
MAX_CACHED_KEYS = 64  # stream keys whose channel one connection remembers
_XADD_NAMES = frozenset({b"XADD", b"xadd", b"Xadd"})
MAX_MULTI = 10_000  # commands one MULTI queues at most (then EXEC answers EXECABORT)
# ... and the bytes of their arguments (64 B more each), on one connection and on all of
# them together (1,500 SETs of 900 KB queued held 1.3 GB)
MAX_MULTI_BYTES = 64 << 20
MAX_MULTI_TOTAL_BYTES = 256 << 20
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
NOAUTH = "NOAUTH Authentication required."


def wrong_args(name: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{name.lower()}' command")


def refusal(exc: RequestError) -> Error:
    """A minou refusal in Redis's shape: ``-NOPERM`` for rules (as Redis ACL says),
    else ``-ERR``; then the minou reason in upper case and the message."""
    reason = ERROR_TABLE[ErrorCode(int(exc.code))].reason.upper()
    prefix = "NOPERM" if exc.code == ErrorCode.NOT_AUTHORIZED else "ERR"
    return Error(f"{prefix} {reason} {exc.message}")


def _frame_error(frame: f.Error) -> Error:
    try:
        reason = ERROR_TABLE[ErrorCode(frame.code)].reason.upper()
    except ValueError:
        reason = "ERROR"
    prefix = "NOPERM" if frame.code == int(ErrorCode.NOT_AUTHORIZED) else "ERR"
    return Error(f"{prefix} {reason} {frame.message}")


class _Inner(NativeConnection):
    """The native connection behind a Redis one: frames are handed over as objects."""

    # entry_to_message made or checked every JSON payload; an XADD's id is x-resp-id
    resp_door = True

    def __init__(self, server: BrokerServer, outer: RespConnection, peer: str) -> None:
        super().__init__(server, outer, peer)  # the outer connection is its transport
        self.outer = outer

    def _send(self, frame: f.Frame) -> None:
        if not self.closed:
            self.outer.frame(frame)

    def send(self, frame: f.Frame) -> None:
        if not self.closed:
            self.outer.frame(frame)

    def send_deliveries(self, sid: int, items: list[f.Delivery]) -> None:
        if not self.closed:
            self.outer.frame(f.Deliver(sid, items))

    def flush(self) -> None:
        pass


class _Slot:
    __slots__ = ("count", "done", "fut", "reply")

    def __init__(self, fut: asyncio.Future[Any] | None = None) -> None:
        self.reply: Any = None
        self.done = False
        self.fut = fut  # a command run from EXEC or a script: its reply goes there
        self.count = 1  # commands it answers: more for pipelined XADDs' one slot


class RespConnection(asyncio.Protocol):
    """One Redis protocol connection (see the module docstring)."""

    _ids = itertools.count(1)

    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = RequestParser(max_bulk=server.settings.max_message_size + 64 * 1024)
        self.proto = 2
        self.id = next(self._ids)
        self.name = b""
        self.lib: dict[str, bytes] = {}
        self.peer = "?"
        self.inner: _Inner | None = None
        self.identity: Identity | None = None
        self.closed = False
        self.closing = False  # QUIT or a protocol error: close once the replies are out
        self._slots: deque[_Slot] = deque()
        self._queued = 0  # commands the slots answer (the bound on pipelining)
        self._backlog: deque[list[bytes]] = deque()  # read, not run: replies are waiting
        self._writing_paused = False  # more than WRITE_HIGH bytes of replies unsent
        self._in_backlog = False
        self._group: _Slot | None = None  # the slot of XADDs on the fast lane, still open
        self._waiting: dict[int, Callable[[f.Frame], None]] = {}
        self._req = itertools.count(1)
        self._reading_paused = False
        self._since = time.monotonic()
        self.blocked: set[Callable[[], None]] = set()  # blocking reads: end them if closed
        self._batch: list[tuple[f.Send, _Slot, Callable[[f.Outcome], Any]]] = []
        self._channels: dict[bytes, str] = {}  # stream key -> channel, for XADD's fast lane
        self._tail: asyncio.Future[Any] | None = None  # the last command still running
        self._published: asyncio.Future[Any] | None = None  # the last PUBLISH's answer
        self.multi: list[list[bytes]] | None = None  # MULTI's queue
        self.multi_bytes = 0  # what it holds (counted in server.resp_multi_bytes too)
        self.mq: MiniqueueSubscriber | None = None  # after miniqueue's SUBSCRIBE
        self.range_held = 0  # bytes of XRANGE answers this connection is gathering
        # while a script runs: the plain keys it read, at which revision (0: none)
        self.script_reads: dict[bytes, int] | None = None
        self.multi_failed = False

    # ------------------------------------------------------------- transport
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        peer = transport.get_extra_info("peername")
        self.peer = oplog.peer_text(peer, "resp")
        refusal_ = self.server.admission.enter(transport, "resp", peer)
        if refusal_ is not None:
            transport.write(encode(Error(f"ERR max number of clients reached "
                                         f"({refusal_.message})")))
            transport.close()
            self.closed = True
            return
        self.server.resp_connections.add(self)
        if self.server.settings.auth_mode != "off":
            self.server.admission.idle(transport, self._evicted)  # until its AUTH
            assert self.server.loop is not None
            self.server.loop.call_later(self.server.settings.hello_timeout, self._auth_deadline)

    def _evicted(self) -> None:
        """Its place went to a new connection: at the limit, and no AUTH for
        EVICT_MIN_IDLE_S (admission.py)."""
        self._close_with("ERR max number of clients reached (no AUTH yet: this "
                         "connection's place went to a new one)")

    def _auth_deadline(self) -> None:
        if not self.server.serving and not self.closed:  # loading: wait with it
            assert self.server.loop is not None
            self.server.loop.call_later(self.server.settings.hello_timeout,
                                        self._auth_deadline)
            return
        if self.identity is None and not self.closed and self.transport is not None:
            self.transport.write(encode(Error(
                f"ERR no AUTH within {self.server.settings.hello_timeout:g} s")))
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        commands = self.parser.feed(data)
        if commands and self.input_reserved:  # whole: the next one's clock starts anew
            self.release_input()
        self._backlog.extend(commands)
        if self.identity is not None and (self.input_reserved or
                                          self.parser.pending > INPUT_SMALL_BYTES):
            self._reserve_input()
        self._run_backlog()

    input_reserved = 0  # bytes of the budget of unfinished input (input_budget.py)

    def _reserve_input(self) -> None:
        """A command still arriving holds room in the broker's budget of unfinished input
        past INPUT_SMALL_BYTES, a MiB at a time; a client that finds none is answered an
        error and closed (Redis clients reconnect), as an HTTP body gets a 503."""
        pending = self.parser.pending
        if pending <= INPUT_SMALL_BYTES:
            self.release_input()
            return
        if pending <= self.input_reserved or self.closing:
            return
        want = -(-pending // INPUT_STEP_BYTES) * INPUT_STEP_BYTES
        budget = self.server.input_budget
        client = self.identity.client_id
        if budget.grow(self, client, want, time.monotonic()):
            self.input_reserved = want
            return
        self.server.core.counters.refuse("input_busy")
        budget.waits += 1
        oplog.input_budget_full(self.peer, client, want, budget.stats())
        self.release_input()
        self._close_with("ERR input busy: too many large commands arriving at once; try again")

    def release_input(self) -> None:
        if self.input_reserved:
            self.input_reserved = 0
            self.server.input_done(self)

    def input_granted(self) -> None:  # never queued: answered an error instead
        pass

    def input_too_slow(self) -> None:
        size = self.input_reserved
        self.release_input()
        if self.closing or self.closed:
            return
        seconds = self.server.input_budget.allowed_seconds(size)
        self.server.core.counters.refuse("request_timeout")
        oplog.input_too_slow(self.peer, self.identity.client_id if self.identity else None,
                             "command", size, seconds)
        self._close_with(f"ERR a command of over {size >> 20} MiB did not arrive within "
                         f"{seconds:.0f} s")

    def _close_with(self, message: str) -> None:
        self.closing = True
        self._backlog.clear()
        if self.transport is not None:
            self.transport.write(encode(Error(message)))
            self.transport.close()

    def _run_backlog(self) -> None:
        """Run the commands read, until a client that does not read its replies has
        ``WRITE_HIGH`` bytes of them waiting (the rest wait, and reading stops, until
        ``resume_writing``) or ``RUN_WINDOW`` commands are unanswered (until ``_drain``
        sends some): what the broker holds for a client stays bounded."""
        backlog = self._backlog
        self._in_backlog = True
        try:
            while True:
                fast = self._fast_lane()
                while backlog and not self._writing_paused:
                    if self.closing:
                        backlog.clear()
                        break
                    args = backlog[0]
                    if fast and args[0] in _XADD_NAMES:
                        backlog.popleft()
                        if self._xadd_fast(args):
                            continue
                    elif self._queued >= RUN_WINDOW:
                        break  # replies not answered yet: their size is not known, wait
                    else:
                        backlog.popleft()
                    self._command(args)
                    fast = self._fast_lane()
                if backlog:
                    self.pause_reading()
                self._finish_read()
                # The replies made meanwhile went out (``_drain``), which does not run
                # the backlog again from in here: go on while the window has room, or
                # what waited for those replies waited for a restart nothing made.
                if not backlog or self._writing_paused or self.closing or \
                        self._queued >= RUN_WINDOW:
                    break
        finally:
            self._in_backlog = False

    def _finish_read(self) -> None:
        self._publish_batch()
        if (self.identity is None and not self._backlog and self.parser.error is None
                and self.server.settings.auth_mode != "off"
                and self.parser.pending > MAX_HELLO_FRAME_SIZE):
            # Before AUTH a request is an AUTH or a HELLO (a token is 4 KiB at most): a
            # stranger's unfinished 1 MiB XADD was held until hello_timeout, per socket.
            # Checked once what came before it ran, so an AUTH pipelined ahead of a large
            # command lets it through, as Redis limits unauthenticated requests.
            self.parser.error = RespProtocolError(
                f"Protocol error: unauthenticated request of over {MAX_HELLO_FRAME_SIZE} "
                f"bytes; AUTH first")
        if self.parser.error is not None and not self.closing and not self._backlog:
            self.server.core.counters.refuse("malformed_frame")
            self._fill(self._slot(), Error(f"ERR {self.parser.error}"))
            self.closing = True
        if self.inner is not None:
            self.inner.engine.after_input()
        self._drain()

    def end_multi(self) -> list[list[bytes]] | None:
        """Leave MULTI (EXEC, DISCARD, RESET, the connection lost): its queue, whose
        bytes are no longer counted."""
        queued, self.multi, self.multi_failed = self.multi, None, False
        self.server.resp_multi_bytes -= self.multi_bytes
        self.multi_bytes = 0
        return queued

    def hold_range(self, change: int) -> None:
        """Count ``change`` more bytes of range answers being gathered, here and in the
        server's total (what a lost connection held leaves the total with it)."""
        if self in self.server.resp_connections:
            self.range_held += change
            self.server.resp_range_held += change

    def pause_writing(self) -> None:  # the client is not reading its replies
        self._writing_paused = True
        self.server.resp_unread.add(self)
        self.pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.server.resp_unread.discard(self)
        self._run_backlog()
        self.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._backlog.clear()
        self.release_input()
        for end in list(self.blocked):  # what their waiting reads get goes back
            end()
        if self.mq is not None:
            self.mq.close()
        self.server.admission.leave(self.transport)
        self.hold_range(-self.range_held)
        self.end_multi()
        self.server.resp_connections.discard(self)
        self.server.resp_unread.discard(self)
        if self.inner is not None:
            self.inner.lost()
            self.server.connections.discard(self.inner)

    # what _Inner needs of its transport
    def write(self, data: bytes) -> None:  # never called: _Inner hands frames over
        raise AssertionError("RESP inner connection wrote bytes")

    def close(self) -> None:
        self.closing = True
        self._drain()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport else 0

    def pause_reading(self) -> None:
        if self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and self._reading_paused and \
                self._queued < MAX_PENDING_REPLIES and not self._writing_paused and \
                not self._backlog:
            self._reading_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------- replies
    def _slot(self) -> _Slot:
        slot = _Slot()
        self._slots.append(slot)
        self._group = None  # XADDs after this command answer after it
        self._queued += 1
        if self._queued >= MAX_PENDING_REPLIES:
            self.pause_reading()
        return slot

    def _fill(self, slot: _Slot, reply: Any) -> None:
        slot.reply, slot.done = reply, True
        if slot.fut is not None and not slot.fut.done():
            slot.fut.set_result(reply)

    def _answer(self, slot: _Slot, reply: Any) -> None:
        """Fill ``slot`` later (an answer that came back) and send what is ready."""
        self._fill(slot, reply)
        self._drain()

    def _drain(self) -> None:
        if self.transport is None or self.closed:
            return
        out = bytearray()
        slots = self._slots
        proto = self.proto
        while slots and slots[0].done:
            slot = slots.popleft()
            self._queued -= slot.count
            reply = slot.reply
            out += reply if type(reply) is Encoded else encode(reply, proto)
        if out:
            self.transport.write(bytes(out))
        if self._backlog and not self._in_backlog and not self._writing_paused and \
                self._queued < RUN_WINDOW:
            self._run_backlog()  # what waited for these replies runs now
        if self._reading_paused and self._queued < MAX_PENDING_REPLIES // 2:
            self.resume_reading()
        if self.closing and not slots:
            self.closed = True
            if self.parser.error is None:
                self.transport.close()
            else:
                self._linger(self.transport)

    @staticmethod
    def _linger(transport: asyncio.Transport) -> None:
        """Close after a protocol error, reading (and dropping: ``data_received`` is
        closing) what the client still sends for REFUSAL_LINGER_S: a client library
        writes a whole too-big command before it reads, and a close with bytes unread
        makes the kernel send a reset, which can destroy the error before it is read."""
        if transport.can_write_eof():  # not TLS: the client sees the end after the error
            transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def frame(self, frame: f.Frame) -> None:
        """A frame from the inner native connection: the answer to one of ours."""
        req = getattr(frame, "req", 0)
        handler = self._waiting.pop(req, None) if req else None
        if handler is not None:
            handler(frame)
            return
        if isinstance(frame, f.Error) and frame.fatal:  # revoked, refused: the end
            slot = self._slot()
            self._fill(slot, _frame_error(frame))
            self.closing = True
            self._drain()

    def spawn(self, coro: Any) -> None:
        """Run a command's coroutine, ended if the connection goes."""
        task = asyncio.ensure_future(coro)

        def end() -> None:
            task.cancel()

        self.blocked.add(end)
        task.add_done_callback(lambda _: self.blocked.discard(end))

    def request(self, frame: Any) -> asyncio.Future[Any]:
        """Send ``frame`` to the inner connection; a future of its answer (a frame)."""
        assert self.inner is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[frame.req] = lambda reply: fut.done() or fut.set_result(reply)
        self.inner._handle(frame)
        self.inner.engine.after_input()
        return fut

    def _ask(self, frame: Any, slot: _Slot, then: Callable[[Any], Any]) -> None:
        """Send ``frame`` to the inner connection; ``then(answer)`` fills ``slot``
        (an ERROR answer becomes the Redis error)."""
        assert self.inner is not None

        def answered(reply: f.Frame) -> None:
            if isinstance(reply, f.Error):
                self._answer(slot, _frame_error(reply))
                return
            try:
                self._answer(slot, then(reply))
            except RequestError as exc:
                self._answer(slot, refusal(exc))

        self._waiting[frame.req] = answered
        self.inner._handle(frame)

    # ------------------------------------------------------------- commands
    def _command(self, args: list[bytes]) -> None:
        if not self.server.serving:  # opening its state, or a standby: clients retry
            self._fill(self._slot(), Error("LOADING minou is loading its state (or waits "
                                           "as a standby); try again in a moment"))
            return
        if self.identity is None and self.server.settings.auth_mode == "off":
            from ..auth.registry import Identity

            self._begin(Identity("resp-dev", True, method="development"))
        name = args[0].upper().decode(errors="replace")
        if self.mq is not None and name in MQ_COMMANDS:  # answered by the subscriber
            self.mq.command(name, args)
            return
        slot = self._slot()
        if self._queued_in_multi(name, args, slot):
            return
        tail = self._tail
        if (tail is None or tail.done()) and name != "XADD":
            if self._batch:
                self._publish_batch()  # what came before takes effect first
            tail = self._published  # a read after XADDs sees them, as in Redis
        if tail is not None and not tail.done():
            # An earlier command is still running (a plain key's, a script's, XADDs'
            # PUBLISH): this one starts once it is done, so its effects come in the
            # order sent.
            async def later(tail: asyncio.Future[Any] = tail) -> None:
                with contextlib.suppress(Exception):
                    await tail
                # What the commands before it did is known only now: a MULTI that
                # ran meanwhile queues this one, and XADDs published meanwhile (by
                # the general path) are committed before it runs, as above.
                while not self._queued_in_multi(name, args, slot):
                    published = self._published
                    if name != "XADD":
                        if self._batch:
                            self._publish_batch()
                            published = self._published
                        if published is not None and not published.done():
                            with contextlib.suppress(Exception):
                                await published
                            continue
                    await self._start(args, slot)
                    break
                self._drain()  # a command answered at once: nothing else sends it

            self._tail = asyncio.ensure_future(later())
            return
        self._run(args, slot)

    def _queued_in_multi(self, name: str, args: list[bytes], slot: _Slot) -> bool:
        """Inside MULTI: queue the command (QUEUED, or the error that will make EXEC
        abort) into ``slot``, and say so."""
        if self.multi is None or name in ("EXEC", "DISCARD", "MULTI", "WATCH", "QUIT",
                                          "RESET"):
            return False
        known = name in COMMANDS or name in ASYNC_COMMANDS
        if len(self.multi) >= MAX_MULTI:
            self.multi_failed = True
            self._fill(slot, Error(f"ERR a transaction holds at most {MAX_MULTI} "
                                   "commands here"))
            return True
        size = sum(len(a) for a in args) + 64 * len(args)
        total = self.server.resp_multi_bytes
        if self.multi_bytes + size > MAX_MULTI_BYTES or total + size > MAX_MULTI_TOTAL_BYTES:
            self.multi_failed = True
            self.server.core.counters.refuse("multi_too_large")
            self._fill(slot, Error(
                f"ERR a transaction holds at most {MAX_MULTI_BYTES >> 20} MiB of commands "
                "here" if self.multi_bytes + size > MAX_MULTI_BYTES else
                f"ERR the transactions being queued hold {total >> 20} MiB, the most all "
                f"of them may ({MAX_MULTI_TOTAL_BYTES >> 20} MiB): retry in a moment"))
            return True
        self.multi_bytes += size
        self.server.resp_multi_bytes += size
        doc = COMMAND_DOCS.get(name)
        if known and doc is not None and (len(args) != doc.arity if doc.arity > 0
                                          else len(args) < -doc.arity):
            # Refused when queued, as Redis does: EXEC then aborts the whole transaction.
            self.multi_failed = True
            self._fill(slot, wrong_args(name.lower()))
            return True
        self.multi_failed = self.multi_failed or not known
        self.multi.append(args)
        self._fill(slot, Simple("QUEUED") if known else _unknown(args))
        return True

    async def _start(self, args: list[bytes], slot: _Slot) -> None:
        task = self._run(args, slot, nested=True)
        self._publish_batch()
        if task is not None:
            await task

    async def call(self, args: list[bytes]) -> Any:
        """Run one command now and return its reply (EXEC's queue, a script's
        redis.call): not queued among the connection's replies."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._start(args, _Slot(fut))
        return await fut

    def _run(self, args: list[bytes], slot: _Slot, *, nested: bool = False
             ) -> asyncio.Task[None] | None:
        """Run a command into ``slot``; the task it goes on in (a coroutine's), if any."""
        name = args[0].upper().decode(errors="replace")
        if self.identity is None and name not in BEFORE_AUTH:
            self._fill(slot, Error(NOAUTH) if name in COMMANDS or name in ASYNC_COMMANDS
                       else _unknown(args))
            return None
        coroutine = ASYNC_COMMANDS.get(name)
        if coroutine is not None:
            if self._batch:
                self._publish_batch()  # what came before takes effect first
            task = asyncio.ensure_future(self._run_async(coroutine, args, slot))
            if not nested:
                self._tail = task
            return task
        handler = COMMANDS.get(name)
        if handler is None:
            self._fill(slot, _unknown(args))
            return None
        if self._batch and name != "XADD":
            self._publish_batch()  # what came before takes effect first
        try:
            reply = handler(self, args, slot)
        except _Reply as early:
            reply = early.reply
        except RequestError as exc:
            self.server.core.counters.refuse(exc.reason)
            reply = refusal(exc)
        except (StreamKeyError, StreamIdError) as exc:
            reply = Error(f"ERR {exc}")
        except Exception:  # a bug must cost one command, never the broker
            log.exception("internal error handling RESP %s from %s", name, self.peer)
            reply = Error("ERR INTERNAL internal error (logged by the broker)")
        if reply is not _LATER:
            self._fill(slot, reply)
        return None

    async def _run_async(self, handler: Callable[..., Any], args: list[bytes],
                         slot: _Slot) -> None:
        try:
            reply = await handler(self, args)
        except resp_keys.Failed as failed:
            reply = _frame_error(failed.frame)
        except RequestError as exc:
            self.server.core.counters.refuse(exc.reason)
            reply = refusal(exc)
        except (StreamKeyError, StreamIdError) as exc:
            reply = Error(f"ERR {exc}")
        except asyncio.CancelledError:
            self._fill(slot, Error("ERR connection closed"))
            raise
        except Exception:  # a bug must cost one command, never the broker
            log.exception("internal error handling RESP %s from %s",
                          args[0][:32].decode(errors="replace"), self.peer)
            reply = Error("ERR INTERNAL internal error (logged by the broker)")
        self._answer(slot, reply)

    def _fast_lane(self) -> bool:
        """Whether the next plain ``XADD`` may skip the general dispatch: the broker
        serves, the client is known, no MULTI, subscriber or earlier command is running."""
        tail = self._tail
        return (self.identity is not None and self.server.serving and self.multi is None
                and self.mq is None and (tail is None or tail.done()))

    def _xadd_fast(self, args: list[bytes]) -> bool:
        """``XADD key * field value ...`` (what producers send) queued for this read's
        PUBLISH; False for any other form, which the general path answers."""
        if len(args) < 5 or args[2] != b"*" or not len(args) % 2:
            return False
        key = args[1]
        channel = self._channels.get(key)
        if channel is None:
            try:
                channel = key_to_channel(key)
            except StreamKeyError:
                return False
            if len(self._channels) >= MAX_CACHED_KEYS:
                self._channels.clear()
            self._channels[key] = channel
        try:
            data, raw, headers = entry_to_message(args[3:])
        except RequestError:  # the general path refuses it, counted
            return False
        group = self._group
        if group is None:  # one slot answers the XADDs of one PUBLISH, in one write
            group = self._group = _Slot()
            group.count = 0
            self._slots.append(group)
        group.count += 1
        self._queued += 1
        if self._queued >= MAX_PENDING_REPLIES:
            self.pause_reading()
        self._batch.append((f.Send(channel, data, raw, headers or None), group, None))
        if len(self._batch) >= PUBLISH_BATCH:
            self._publish_batch()
        return True

    def batch_publish(self, send: f.Send, slot: _Slot,
                      answer: Callable[[f.Outcome], Any] | None) -> None:
        """Queue a publish of this read's commands: pipelined XADDs travel as one
        PUBLISH frame (one pass through the engine, one commit), each answered from
        its own outcome, in order (``answer`` None: into the fast lane's group slot,
        already as RESP)."""
        self._batch.append((send, slot, answer))
        if len(self._batch) >= PUBLISH_BATCH:
            self._publish_batch()

    def _publish_batch(self) -> None:
        batch, self._batch = self._batch, []
        self._group = None
        if not batch:
            return
        frame = f.Publish(next(self._req), [send for send, _, _ in batch])
        published = self._published = asyncio.get_running_loop().create_future()

        def confirmed(reply: f.Frame) -> None:
            published.set_result(None)
            if isinstance(reply, f.Error):
                error, outcomes = _frame_error(reply), [None] * len(batch)
            else:
                assert isinstance(reply, f.Confirm)
                error, outcomes = None, reply.outcomes
            group: _Slot | None = None
            parts: list[bytes] = []
            channels = self.server.core.channels
            for (_, slot, answer), outcome in zip(batch, outcomes, strict=False):
                if answer is not None:
                    self._fill(slot, error or answer(outcome))
                    continue
                if slot is not group:
                    if group is not None:
                        self._fill(group, Encoded(b"".join(parts)))
                    group, parts = slot, []
                parts.append(encode(error, self.proto) if error is not None else
                             encode(_xadd_answer(self, outcome), self.proto)
                             if outcome.code or _has_ids(channels, outcome.channel) else
                             encoded_id(outcome.seq))
            if group is not None:
                self._fill(group, Encoded(b"".join(parts)))
            self._drain()

        self._waiting[frame.req] = confirmed
        assert self.inner is not None
        self.inner._handle(frame)

    def _begin(self, identity: Identity) -> None:
        """Serve ``identity`` (TooManyConnections: its client has its share already)."""
        inner = _Inner(self.server, self, self.peer)
        inner.begin(identity)
        self.server.admission.busy(self.transport)  # logged in: keeps its place
        self.identity = identity
        self.inner = inner
        self.server.connections.add(inner)

    def authenticate(self, user: bytes | None, password: bytes) -> Any:
        """AUTH / HELLO AUTH: a bearer as HTTP takes it; ``user`` (unless ``default``)
        must be the client it names."""
        server = self.server
        if server.settings.auth_mode == "off":
            return OK
        try:
            identity = server.http_auth.identify("Bearer " + password.decode(),
                                                 peer=self.peer)
        except (NotAuthenticated, UnicodeDecodeError) as exc:
            why = exc.message if isinstance(exc, RequestError) else "not UTF-8"
            return Error(f"{WRONGPASS} (minou: {why})")
        except RequestError as exc:  # pending approval
            return refusal(exc)
        if user not in (None, b"default") and user != identity.client_id.encode():
            return Error(f"{WRONGPASS} (minou: the token is client "
                         f"{identity.client_id!r}'s, not {user[:64].decode(errors='replace')!r})")
        if self.identity is not None and self.inner is not None:  # AUTH again: a new identity
            self.inner.lost()
            self.server.connections.discard(self.inner)
            self.identity = self.inner = None
        try:
            self._begin(identity)
        except TooManyConnections as exc:  # max_connections_per_client: not logged in
            return refusal(exc)
        return OK


_LATER = object()  # a handler that fills its slot when the answer comes


def _unknown(args: list[bytes]) -> Error:
    shown = " ".join(f"'{a[:64].decode(errors='replace')}'" for a in args[1:4])
    return Error(f"ERR unknown command '{args[0][:64].decode(errors='replace')}', with "
                 f"args beginning with: {shown}")


# ------------------------------------------------------------------ handlers
def _ping(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) > 2:
        return wrong_args("ping")
    return args[1] if len(args) == 2 else Simple("PONG")


def _echo(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    return args[1] if len(args) == 2 else wrong_args("echo")


def _quit(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    c.closing = True
    return OK


def _reset(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    c.proto, c.name = 2, b""
    c.end_multi()
    if c.server.settings.auth_mode != "off" and c.inner is not None:
        c.inner.lost()
        c.server.connections.discard(c.inner)
        c.inner, c.identity = None, None
    return Simple("RESET")


def _select(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) != 2:
        return wrong_args("select")
    if args[1] != b"0":
        return Error("ERR DB index is out of range")
    return OK


def _auth(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) == 2:
        return c.authenticate(None, args[1])
    if len(args) == 3:
        return c.authenticate(args[1], args[2])
    return Error("ERR syntax error")


def _hello(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    proto = c.proto
    i = 1
    if len(args) > 1:
        try:
            proto = int(args[1])
        except ValueError:
            return Error("ERR Protocol version is not an integer or out of range")
        if proto not in (2, 3):
            return Error("NOPROTO unsupported protocol version")
        i = 2
    name = None
    while i < len(args):
        opt = args[i].upper()
        if opt == b"AUTH" and i + 2 < len(args):
            done = c.authenticate(args[i + 1], args[i + 2])
            if isinstance(done, Error):
                return done
            i += 3
        elif opt == b"SETNAME" and i + 1 < len(args):
            name = args[i + 1]
            i += 2
        else:
            shown = args[i][:64].decode(errors="replace")
            return Error(f"ERR Syntax error in HELLO option '{shown}'")
    if c.identity is None:
        return Error("NOAUTH HELLO must be called with the client already authenticated, "
                     "otherwise the HELLO <proto> AUTH <user> <pass> option can be used to "
                     "authenticate the client and select the RESP protocol version at the "
                     "same time")
    c.proto = proto
    if name is not None:
        c.name = name
    return Map([(b"server", b"redis"), (b"version", REDIS_VERSION.encode()),
                (b"proto", proto), (b"id", c.id), (b"mode", b"standalone"),
                (b"role", b"master"), (b"modules", []),
                (b"minou", __version__.encode())])


def _client(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 2:
        return wrong_args("client")
    sub = args[1].upper()
    if sub == b"SETNAME" and len(args) == 3:
        if b" " in args[2] or b"\n" in args[2]:
            return Error("ERR Client names cannot contain spaces, newlines or special "
                         "characters.")
        c.name = args[2]
        return OK
    if sub == b"GETNAME" and len(args) == 2:
        return c.name or None
    if sub == b"ID" and len(args) == 2:
        return c.id
    if sub == b"SETINFO" and len(args) == 4:
        attr = args[2].upper()
        if attr not in (b"LIB-NAME", b"LIB-VER"):
            return Error(f"ERR Unrecognized option '{args[2][:64].decode(errors='replace')}'")
        c.lib[attr.decode().lower()] = args[3]
        return OK
    if sub == b"INFO" and len(args) == 2:
        return Verbatim(_client_line(c) + "\n")
    if sub in (b"SETNAME", b"GETNAME", b"ID", b"SETINFO", b"INFO"):
        return wrong_args(f"client|{sub.decode().lower()}")
    return Error(f"ERR unknown subcommand '{args[1][:64].decode(errors='replace')}'. "
                 "Try CLIENT HELP.")


def _client_line(c: RespConnection) -> str:
    who = c.identity.client_id if c.identity is not None else ""
    return (f"id={c.id} addr={c.peer.split(' ')[0]} name={c.name.decode(errors='replace')} "
            f"age={int(time.monotonic() - c._since)} db=0 user={who} resp={c.proto} "
            f"lib-name={c.lib.get('lib-name', b'').decode(errors='replace')} "
            f"lib-ver={c.lib.get('lib-ver', b'').decode(errors='replace')}")


def _info(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    st = c.server.status()
    wanted = {a.decode(errors="replace").lower() for a in args[1:]} or {"default"}
    every = bool(wanted & {"all", "everything", "default"})
    port = (c.server.resp_address or ("", 0))[1]
    sections = {
        "server": [("redis_version", REDIS_VERSION), ("minou_version", __version__),
                   ("redis_mode", "standalone"), ("broker_id", st["broker_id"]),
                   # which request parser runs: "python" says `pip install 'minou[resp]'`
                   ("minou_request_parser",
                    "python" if RequestParser is RespParser else "hiredis"),
                   ("tcp_port", port), ("uptime_in_seconds", int(st.get("uptime_s", 0)))],
        "clients": [("connected_clients", len(c.server.resp_connections))],
        "persistence": [("loading", 0), ("storage", st["storage"]["path"])],
        "replication": [("role", "master")],
        "keyspace": [],
    }
    lines: list[str] = []
    for name, fields in sections.items():
        if not every and name not in wanted:
            continue
        lines.append(f"# {name.capitalize()}")
        lines += [f"{k}:{v}" for k, v in fields]
        lines.append("")
    return Verbatim("\r\n".join(lines))


def _command_cmd(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    sub = args[1].upper() if len(args) > 1 else b""
    names = [_text(a) for a in args[2:]]
    if sub == b"COUNT":
        return len(COMMAND_DOCS)
    if sub == b"LIST":
        return [n.lower() for n in COMMAND_DOCS]
    if sub == b"DOCS":
        return Map([(name, _as_map(doc)) for name, doc in docs_reply(names)])
    if sub in (b"INFO", b""):
        return info_reply(names)
    return Error(f"ERR unknown subcommand '{args[1][:64].decode(errors='replace')}'. "
                 "Try COMMAND HELP.")


def _as_map(value: Any) -> Any:
    """COMMAND DOCS's nested dicts as RESP maps (flat arrays in RESP2, as Redis sends)."""
    if isinstance(value, dict):
        return Map([(k, _as_map(v)) for k, v in value.items()])
    if isinstance(value, list):
        return [_as_map(v) for v in value]
    return value


# -------------------------------------------------------------------- streams
def _xadd(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 5:
        return wrong_args("xadd")
    key = args[1]
    i = 2
    nomkstream = False
    while i < len(args):
        opt = args[i].upper()
        if opt == b"NOMKSTREAM":
            nomkstream = True
            i += 1
        elif opt in (b"MAXLEN", b"MINID"):
            i += 1
            approx = i < len(args) and args[i] == b"~"
            if i < len(args) and args[i] in (b"~", b"="):
                i += 1
            if opt == b"MAXLEN" and i < len(args):
                try:
                    if _int(args[i]) < 0:
                        return Error("ERR The MAXLEN argument must be >= 0.")
                except _Reply as early:
                    return early.reply
            i += 1  # the threshold
            if i + 1 < len(args) and args[i].upper() == b"LIMIT":
                i += 2
            if not approx:
                return Error(f"ERR {opt.decode()} with an exact threshold is not supported: "
                             "minou keeps a channel's messages by its retention and "
                             "max_items (config [channels]); '~' (approximate) is accepted "
                             "and trims nothing")
        else:
            break
    if i >= len(args):
        return wrong_args("xadd")
    entry_id = args[i]
    fields = args[i + 1:]
    if not fields or len(fields) % 2:
        return wrong_args("xadd")
    channel = key_to_channel(key)
    if nomkstream and channel not in c.server.core.channels and not is_inbox(channel):
        # the refusal an existing stream's XADD gets, before saying there is none (an
        # inbox's writes are the publish's to judge, whether it exists or not)
        assert c.inner is not None
        c.inner.session.access.check_write(channel)
        return None
    data, raw, headers = entry_to_message(fields)
    if entry_id != b"*":  # checked against the top, and kept, by the core (stream_ids.py)
        try:
            parse_explicit(entry_id.decode("ascii"))
        except (BadRequest, UnicodeDecodeError):
            return Error("ERR Invalid stream ID specified as stream command argument")
        owner = c.server.spread.route_channel(channel) if c.server.spread else None
        if owner not in (None, ADOPT):  # its ids live in that broker's memory
            return Error(f"ERR an XADD with an id of its own is stored by the broker that "
                         f"owns the stream's queue ({owner}): connect to that one, or give "
                         "'*' as the id")
        headers = {**headers, ID_HEADER: entry_id.decode("ascii")}
    c.batch_publish(f.Send(channel, data, raw, headers or None), slot,
                    lambda outcome: _xadd_answer(c, outcome))
    return _LATER


REDIS_XADD_ERRORS = (TOP_ERROR, ZERO_ERROR, EXHAUSTED_ERROR)


def _xadd_answer(c: RespConnection, outcome: f.Outcome) -> Any:
    """An XADD's id, or its refusal (in Redis's own words where Redis has them)."""
    if outcome.code:
        if outcome.error in REDIS_XADD_ERRORS:
            return Error(f"ERR {outcome.error}")
        return _outcome_error(outcome)
    return id_of(outcome.seq, _stream_ids(c, outcome.channel))


def _has_ids(channels: dict[str, Any], channel: str) -> bool:
    log_ = channels.get(channel)
    return log_ is not None and log_.stream_ids is not None


def _stream_ids(c: RespConnection, channel: str) -> StreamIds | None:
    """The channel's explicit ids (None: every id is ``<seq>-0``)."""
    log_ = c.server.core.channels.get(channel)
    return log_.stream_ids if log_ is not None else None



def _outcome_error(outcome: f.Outcome) -> Error:
    return _frame_error(f.Error(0, outcome.code, outcome.error))


def _publish(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    """miniqueue's PUBLISH topic value: a durable publish answered OK once stored, as
    miniqueue does (not Redis's fire-and-forget pub/sub)."""
    if len(args) != 3:
        return wrong_args("publish")
    channel = key_to_channel(args[1])
    data, raw, headers = entry_to_message([b"payload", args[2]])
    if raw or headers:  # not JSON: kept as bytes
        data, raw, headers = args[2], True, {}
    frame = f.Publish(next(c._req), [f.Send(channel, data, raw, headers or None)])

    def confirmed(reply: f.Frame) -> Any:
        assert isinstance(reply, f.Confirm)
        outcome = reply.outcomes[0]
        return _outcome_error(outcome) if outcome.code else OK

    c._ask(frame, slot, confirmed)
    return _LATER


def _xlen(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) != 2:
        return wrong_args("xlen")
    channel = key_to_channel(args[1])
    assert c.inner is not None
    c.server.core.check_read(c.inner.session, channel)
    log_ = c.server.core.channels.get(channel)
    return log_.count if log_ is not None else 0


def _xrange(c: RespConnection, args: list[bytes], slot: _Slot, *, reverse: bool = False
            ) -> Any:
    name = "xrevrange" if reverse else "xrange"
    if len(args) not in (4, 6):
        return wrong_args(name)
    key = args[1]
    # the rights first: nothing said of a stream it may not read (the READ claims)
    channel = _readable(c, key, claim=False)
    ids = _stream_ids(c, channel)
    lo_text, hi_text = (args[3], args[2]) if reverse else (args[2], args[3])
    lo, hi = parse_id(lo_text, high=False, ids=ids), parse_id(hi_text, high=True, ids=ids)
    count = None
    if len(args) == 6:
        if args[4].upper() != b"COUNT":
            return Error("ERR syntax error")
        try:
            count = int(args[5])
        except ValueError:
            return Error("ERR value is not an integer or out of range")
        if count <= 0:
            return []
    entries: list[Any] = []
    c.inner_read(channel, lo, hi, count, reverse, slot, entries)
    return _LATER


def _xrevrange(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    return _xrange(c, args, slot, reverse=True)


def _read_into(self: RespConnection, channel: str, lo: int, hi: int, count: int | None,
               reverse: bool, slot: _Slot, entries: list[Any]) -> None:
    """XRANGE / XREVRANGE: the channel's bounds first (OFFSETS), then READ pages of
    ``[lo, hi]`` within them into ``entries`` (Redis entries), then fill ``slot``;
    backwards a page at a time from the top for a reverse range. An answer past
    RESP_RANGE_BYTES is refused (RANGE_TOO_LARGE) as soon as it is."""
    _RangeRead(self, channel, lo, hi, count, reverse, slot, entries).start()


RespConnection.inner_read = _read_into  # type: ignore[attr-defined]


class _RangeRead:
    """One XRANGE / XREVRANGE being gathered (``_read_into``). An object, not nested
    closures: a closure calling itself is a reference cycle, which held every answer
    (up to 64 MiB) until the cyclic GC ran, rarely with GC_THRESHOLD: reading 1 MB
    entries grew the broker by gigabytes."""

    __slots__ = ("c", "channel", "count", "entries", "gathered", "hi", "lo", "reverse",
                 "slot")

    def __init__(self, c: RespConnection, channel: str, lo: int, hi: int,
                 count: int | None, reverse: bool, slot: _Slot, entries: list[Any]) -> None:
        self.c, self.channel, self.lo, self.hi = c, channel, lo, hi
        self.count, self.reverse, self.slot, self.entries = count, reverse, slot, entries
        self.gathered = 0  # what the answer weighs so far (payloads + READ_WEIGHT_BASE)

    def start(self) -> None:
        c = self.c
        offsets = f.Offsets(next(c._req), [self.channel])
        c._waiting[offsets.req] = self.bounded
        assert c.inner is not None
        c.inner._handle(offsets)

    def finish(self, reply: Any) -> None:
        self.c.hold_range(-self.gathered)
        self.gathered = 0
        self.c._answer(self.slot, reply)

    def refuse(self, why: str) -> None:
        self.c.server.core.counters.refuse("range_too_large")
        self.finish(Error(f"ERR RANGE_TOO_LARGE {why}; read the range in parts with COUNT"))

    def bounded(self, reply: f.Frame) -> None:
        if isinstance(reply, f.Error):
            self.finish(_frame_error(reply))
            return
        found = (reply.value or {}).get(self.channel) if isinstance(reply, f.Result) else None
        if not found:
            self.finish([])
            return
        first, nxt = found
        low, top = max(self.lo, int(first), 1), min(self.hi, int(nxt) - 1)
        if low > top:
            self.finish([])
            return
        self.page(low, top)

    def page(self, low: int, top: int, start: int | None = None,
             window: list[Any] | None = None, first: int | None = None) -> None:
        # Backwards: the window [start, top] is read forwards (``window`` holds what
        # came so far: a page cut short by bytes goes on from ``first``, its
        # next_seq), then added reversed.
        c, count = self.c, self.count
        if start is None:
            # Backwards with COUNT: a window of what is still wanted (a few seqs gone
            # cost another window), not 1,000 entries read for one.
            span = READ_PAGE if count is None else min(READ_PAGE, count - len(self.entries))
            start = max(low, top - span + 1) if self.reverse else low
        if first is None:
            first = start
        if (held := _answers_held(c.server)) > RESP_RANGE_TOTAL_BYTES:
            self.refuse(_total_held(held))  # before a page more is read for nothing
            return
        want = READ_PAGE if count is None or self.reverse else \
            min(READ_PAGE, count - len(self.entries))
        frame = f.Read(next(c._req), self.channel, first, want, top + 1)
        c._waiting[frame.req] = lambda reply: self.answered(reply, low, top, start, window)
        assert c.inner is not None
        c.inner._handle(frame)

    def answered(self, reply: f.Frame, low: int, top: int, start: int,
                 window: list[Any] | None) -> None:
        c, channel, count, entries = self.c, self.channel, self.count, self.entries
        if isinstance(reply, f.Error):
            self.finish(_frame_error(reply))
            return
        assert isinstance(reply, f.ReadResult)
        weight = sum(len(d.data) + READ_WEIGHT_BASE for d in reply.items)
        self.gathered += weight
        c.hold_range(weight)
        if self.gathered > RESP_RANGE_BYTES:
            self.refuse(f"the entries of {channel!r} asked for are more than "
                        f"{RESP_RANGE_BYTES >> 20} MiB (an answer is held whole before it "
                        "is sent)")
            return
        # Every connection's answers being gathered, or written and not read yet,
        # share one bound too: many clients asking for big ranges at once, or
        # asking and never reading, held their sum (gigabytes).
        held = _answers_held(c.server)
        if held > RESP_RANGE_TOTAL_BYTES:
            self.refuse(_total_held(held))
            return
        ids = _stream_ids(c, channel)
        if self.reverse:
            got = (window or []) + [(d.seq, _entry(d, ids)) for d in reply.items
                                     if low <= d.seq <= top]
            if reply.items and reply.next_seq <= top:
                self.page(low, top, start, got, reply.next_seq)  # this window's rest
                return
            entries.extend(e for _, e in reversed(got))
            more_from = None if start <= low else start - 1
        else:
            entries.extend(_entry(d, ids) for d in reply.items if low <= d.seq <= top)
            more_from = reply.next_seq if reply.items and reply.next_seq <= top else None
        if count is not None and len(entries) >= count:
            del entries[count:]
            more_from = None
        if more_from is None:
            self.finish(entries)
        elif self.reverse:
            self.page(low, more_from)
        else:
            self.page(more_from, top)


def _total_held(held: int) -> str:
    return (f"range reads in progress hold {held >> 20} MiB, the most all of them may "
            f"({RESP_RANGE_TOTAL_BYTES >> 20} MiB): retry in a moment")


def _answers_held(server: Any) -> int:
    """The bytes of read answers the RESP connections hold: being gathered, or handed
    to a socket and not read by the client yet (counted on the connections past their
    water mark: looking at every one of 10,000 per page read would cost more)."""
    return server.resp_range_held + sum(c.get_write_buffer_size() for c in server.resp_unread)


# ------------------------------------------------------------- consumer groups
NOGROUP = "NOGROUP No such key '{key}' or consumer group '{group}' in {cmd} with GROUP option"


def _existing_group(c: RespConnection, key: bytes, group: bytes) -> str:
    """The minou group of Redis group ``group`` on ``key`` (readable by this client),
    or the NOGROUP answer."""
    channel = _readable(c, key, claim=False)
    gname = group_name(group, channel)
    if not _groups(c).exists(gname):
        raise _Reply(Error(f"NOGROUP No such key '{_text(key)}' or consumer group "
                           f"'{_text(group)}'"))
    assert c.inner is not None
    c.server.core.check_read(c.inner.session, channel)  # the group's work reads it: claims
    return gname


def _groups(c: RespConnection) -> RespGroups:
    groups = c.server.resp_groups
    assert groups is not None
    return groups


def _text(b: bytes) -> str:
    return b[:200].decode(errors="replace")


def _readable(c: RespConnection, key: bytes, *, claim: bool = True) -> str:
    """The key's channel, which this client may read (its rules), or the refusal. The
    check claims a free exclusive channel as a read does, unless not ``claim`` (a check
    before a refusal the command may still give, NOGROUP say: the read claims later)."""
    channel = key_to_channel(key)
    assert c.inner is not None
    core, session = c.server.core, c.inner.session
    if claim or core.read_refusal(session, channel) is not None:
        core.check_read(session, channel)  # raises, counted, when refused
    return channel


def _writable(c: RespConnection, key: bytes) -> str:
    """The key's channel, which this client may write: changing a group (destroying
    it, its consumers) is a write, as Redis's ACL counts XGROUP."""
    channel = _readable(c, key)
    assert c.inner is not None
    c.inner.session.access.check_write(channel)
    return channel


def _int(value: bytes) -> int:
    """A 64-bit signed integer argument, as Redis reads them."""
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not -(1 << 63) <= number < 1 << 63:
        raise _Reply(Error("ERR value is not an integer or out of range"))
    return number


class _Reply(Exception):
    """Answer the command with ``reply`` now (raised from deep in an argument check)."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply


def _xgroup(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 2:
        return wrong_args("xgroup")
    sub = args[1].upper()
    groups = _groups(c)
    assert c.identity is not None and c.inner is not None
    if sub == b"CREATE":
        if len(args) < 5:
            return wrong_args("xgroup|create")
        key, group, start_id = args[2], args[3], args[4]
        opts = [a.upper() for a in args[5:]]
        # before BUSYGROUP or "requires the key to exist" (making the group claims)
        channel = _readable(c, key, claim=False)
        gname = group_name(group, channel)
        if groups.exists(gname):
            return Error("BUSYGROUP Consumer Group name already exists")
        if b"MKSTREAM" not in opts and channel not in c.server.core.channels:
            return Error("ERR The XGROUP subcommand requires the key to exist. Note that for "
                         "CREATE you may want to use the MKSTREAM option to create an empty "
                         "stream automatically.")
        if start_id == b"$":
            start = "new"
        elif start_id in (b"0", b"0-0", b"-"):
            start = "oldest"
        else:
            after = parse_id(start_id, high=True, ids=_stream_ids(c, channel))
            start = f"seq:{after + 1}"
        groups.create(c.identity, channel, gname, start)
        return OK
    if sub == b"DESTROY" and len(args) == 4:
        channel = _writable(c, args[2])
        return 1 if groups.destroy(group_name(args[3], channel)) else 0
    if sub in (b"CREATECONSUMER", b"DELCONSUMER") and len(args) == 5:
        channel = _writable(c, args[2])
        gname = group_name(args[3], channel)
        if not groups.exists(gname):
            return Error(f"NOGROUP No such consumer group '{_text(args[3])}' for key name "
                         f"'{_text(args[2])}'")
        if sub == b"CREATECONSUMER":
            if args[4] in groups.names.get(gname, {}):
                return 0
            groups.seen(gname, args[4], c.identity)  # raises past the bounds on names
            return 1
        mine = [e for e in groups.entries(gname).values() if e.consumer == args[4]]
        groups.ack(gname, [])  # (drops stale entries)
        for entry in mine:  # what it held goes back to the group
            groups.entries(gname).pop(entry.item.seq, None)
            groups._settle(entry, "nack")
        groups.forget(gname, args[4])
        return len(mine)
    if sub == b"SETID" and len(args) >= 5:
        channel = _writable(c, args[2])
        gname = group_name(args[3], channel)
        if not groups.exists(gname):
            return Error(f"NOGROUP No such key '{_text(args[2])}' or consumer group "
                         f"'{_text(args[3])}' in XGROUP SETID")
        start_id = args[4]
        log_ = c.server.core.channels.get(channel)
        nxt = log_.end if log_ is not None else 1
        after = nxt - 1 if start_id == b"$" else parse_id(
            start_id, high=True, ids=_stream_ids(c, channel))
        groups.set_position(c.identity, channel, gname, after + 1)
        return OK
    return Error(f"ERR unknown subcommand '{_text(args[1])}'. Try XGROUP HELP.")


def _parse_streams(args: list[bytes], at: int, cmd: str) -> tuple[list[bytes], list[bytes]]:
    rest = args[at:]
    if not rest or len(rest) % 2:
        raise _Reply(Error("ERR Unbalanced 'xreadgroup' list of streams: for each stream key "
                           "an ID or '>' must be specified." if cmd == "XREADGROUP" else
                           "ERR Unbalanced 'xread' list of streams: for each stream key an "
                           "ID or '$' must be specified."))
    half = len(rest) // 2
    return rest[:half], rest[half:]


def _streams_reply(c: RespConnection, found: list[tuple[bytes, list[Any]]]) -> Any:
    if c.proto >= 3 and c.script_reads is None:  # a script sees RESP2's shape, as in Redis
        return Map([(k, v) for k, v in found])
    return [[k, v] for k, v in found]


def _entry(item: Delivery, ids: StreamIds | None) -> list[Any]:
    return [id_of(item.seq, ids), message_to_entry(item.data, item.raw, item.headers)]


def _streams_wire(c: RespConnection, found: list[tuple[bytes, list[bytes]]]) -> Encoded:
    """``_streams_reply`` of entries already in RESP (``encoded_message``), as RESP."""
    parts = [(b"%%%d\r\n" if c.proto >= 3 else b"*%d\r\n") % len(found)]
    for key, entries in found:
        head = b"$%d\r\n%b\r\n*%d\r\n" % (len(key), key, len(entries))
        parts.append(head if c.proto >= 3 else b"*2\r\n" + head)
        parts += entries
    return Encoded(b"".join(parts))


def _xreadgroup(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 7 or args[1].upper() != b"GROUP":
        return wrong_args("xreadgroup")
    group, name = args[2], args[3]
    try:
        count, block, noack, keys, ids = _read_options(args, 4, "XREADGROUP")
    except _Reply as early:
        return early.reply
    groups = _groups(c)
    assert c.identity is not None and c.inner is not None
    targets = []
    new = 0  # names this read makes: each group's counts towards the bounds on all
    for key in keys:  # the rights on every stream before any group is looked for
        _readable(c, key, claim=False)
    for key, sid in zip(keys, ids, strict=True):
        channel = key_to_channel(key)
        gname = group_name(group, channel)
        if not groups.exists(gname):
            return Error(NOGROUP.format(key=_text(key), group=_text(group), cmd="XREADGROUP"))
        c.server.core.check_read(c.inner.session, channel)  # reading it claims it
        new += groups.admit(gname, name, c.identity, more=new)
        targets.append((key, channel, gname, sid))
    for _key, _channel, gname, _sid in targets:  # once every group would take the name
        groups.seen(gname, name, c.identity)
    if any(sid != b">" for *_, sid in targets):
        # The consumer's own pending entries after the id: history, never blocking.
        found = []
        for key, channel, gname, sid in targets:
            ids = _stream_ids(c, channel)
            after = parse_id(sid, high=True, ids=ids) if sid != b">" else 2 ** 62
            mine = sorted((e for e in groups.entries(gname).values()
                           if e.consumer == name and e.item.seq > after),
                          key=lambda e: e.item.seq)[:count or MAX_COUNT]
            found.append((key, [_entry(e.item, ids) for e in mine]))
        return _streams_reply(c, found)
    for _key, _channel, gname, _sid in targets:
        if groups.pending(gname) >= MAX_PENDING:
            return Error(f"ERR group has {MAX_PENDING} pending entries on this broker: "
                         "XACK (or XCLAIM) them before reading more")
    want = count or DEFAULT_COUNT
    wait = 0.0 if block is None else (block / 1000 if block else 24 * 3600.0)
    _take(c, slot, groups, targets, name, want, wait, noack)
    return _LATER


def _take(c: RespConnection, slot: _Slot, groups: RespGroups,
          targets: list[tuple[bytes, str, str, bytes]], name: bytes, want: int,
          wait: float, noack: bool) -> None:
    """Ask each stream's consumer for up to ``want`` messages; answer with what came
    once the first batch is here (one stream's, the others' ready by then with it), or
    null once ``wait`` passed."""
    assert c.identity is not None
    got: dict[bytes, list[Any]] = {}
    ends: list[Callable[[], None]] = []
    state = {"open": len(targets), "finished": False}
    # To the socket: the entries are written as RESP at once; to a script or EXEC: values
    wire = slot.fut is None

    def finish() -> None:
        if state["finished"]:
            return
        state["finished"] = True
        # Named through ``registered``, emptied here: ``finish`` naming itself would be a
        # reference cycle holding ``got`` (the whole answer) and the slot until the
        # cyclic GC ran, rarely with GC_THRESHOLD.
        c.blocked.discard(registered.pop())
        for end in ends:
            end()  # the others answer with what they hold now (counted in ``got``)
        if got:
            found = [(k, got[k]) for k, *_ in targets if k in got]
            c._answer(slot, _streams_wire(c, found) if wire else _streams_reply(c, found))
        else:
            c._answer(slot, NULL_ARRAY)

    for key, channel, gname, _sid in targets:
        holder = groups.consumer(c.identity, channel, gname)

        def done(items: list[Delivery], key: bytes = key, gname: str = gname,
                 holder: RespConsumer = holder, channel: str = channel) -> None:
            state["open"] -= 1
            if items:
                if state["finished"]:  # answered meanwhile (the connection went away)
                    for item in items:
                        holder.give_back(item)
                    return
                entries = got.setdefault(key, [])
                groups.delivered_all(gname, name, holder, items, noack)
                ids = _stream_ids(c, channel)
                if wire and ids is None:
                    entries += [encoded_message(i.seq, i.data, i.raw, i.headers)
                                for i in items]
                elif wire:
                    entries += [encoded_message(i.seq, i.data, i.raw, i.headers,
                                                ids.text(i.seq)) for i in items]
                else:
                    entries += [_entry(i, ids) for i in items]
                finish()
            elif state["open"] == 0:
                finish()

        ends.append(holder.take(want, wait, done))
    registered = [finish]
    c.blocked.add(finish)


def _read_options(args: list[bytes], i: int, cmd: str
                  ) -> tuple[int | None, int | None, bool, list[bytes], list[bytes]]:
    """XREAD's and XREADGROUP's options from ``args[i]`` on: (COUNT, BLOCK ms, NOACK
    — XREADGROUP's only —, keys, ids); raises ``_Reply`` with the error."""
    count, block, noack = None, None, False
    while i < len(args):
        opt = args[i].upper()
        if opt == b"COUNT" and i + 1 < len(args):
            asked = _int(args[i + 1])  # 0 or less: no limit, as in Redis (a bounded batch)
            count = min(asked, MAX_COUNT) if asked > 0 else None
            i += 2
        elif opt == b"BLOCK" and i + 1 < len(args):
            block = _int(args[i + 1])
            if block < 0:
                raise _Reply(Error("ERR timeout is negative"))
            i += 2
        elif opt == b"NOACK" and cmd == "XREADGROUP":
            noack, i = True, i + 1
        elif opt == b"STREAMS":
            break
        else:
            raise _Reply(Error("ERR syntax error"))
    keys, ids = _parse_streams(args, i + 1, cmd)
    return count, block, noack, keys, ids


def _xread(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    try:
        count, block, _, keys, ids = _read_options(args, 1, "XREAD")
        targets: list[tuple[bytes, str | Pattern, bytes]] = []
        for key, sid in zip(keys, ids, strict=True):
            pattern = stream_pattern(key)
            if pattern is not None:  # every stream it matches (read rights on it first)
                assert c.inner is not None
                c.server.core.check_read(c.inner.session, pattern.text)
                targets.append((key, pattern, sid))
            else:  # the rights first, as the other streams commands
                targets.append((key, _readable(c, key, claim=False), sid))
        for _, _, sid in targets:
            if sid not in (b"$", b"+"):
                parse_id(sid, high=True)
    except _Reply as early:
        return early.reply
    task = asyncio.ensure_future(_xread_run(c, slot, targets, count or DEFAULT_COUNT, block))

    def end() -> None:
        task.cancel()
    c.blocked.add(end)
    task.add_done_callback(lambda _: c.blocked.discard(end))
    return _LATER


MAX_PATTERN_STREAMS = 100  # the streams one pattern of an XREAD reads at most


def _xread_streams(c: RespConnection, targets: list[tuple[bytes, str | Pattern, bytes]]
                   ) -> list[tuple[bytes, str, bytes]]:
    """The streams XREAD reads now: each key's channel; for a pattern, the channels it
    matches that this client may read (at most MAX_PATTERN_STREAMS, in name order),
    each under its own key."""
    assert c.inner is not None
    access = c.inner.session.access
    out: list[tuple[bytes, str, bytes]] = []
    for key, target, sid in targets:
        if isinstance(target, str):
            out.append((key, target, sid))
            continue
        names = sorted(n for n in c.server.core.channels
                       if target.matches(n) and access.may_read(n))
        out += [(channel_to_key(n), n, sid) for n in names[:MAX_PATTERN_STREAMS]]
    return out


async def _xread_run(c: RespConnection, slot: _Slot,
                     targets: list[tuple[bytes, str | Pattern, bytes]], count: int,
                     block: int | None) -> None:
    """XREAD: the entries after each id (``$``: after the last one now); with BLOCK,
    a long poll (channels.wait) until one of the streams has something or time is up.
    A pattern's streams are looked for again after each wait: one made meanwhile is
    read from its start."""
    try:
        streams = _xread_streams(c, targets)
        offsets = await c.request(f.Offsets(next(c._req), [ch for _, ch, _ in streams]))
        if isinstance(offsets, f.Error):
            c._answer(slot, _frame_error(offsets))
            return
        known = offsets.value or {}
        after: dict[str, int] = {}
        for _, ch, sid in streams:
            nxt = int(known[ch][1]) if ch in known else 1
            after[ch] = nxt - 1 if sid in (b"$", b"+") else parse_id(
                sid, high=True, ids=_stream_ids(c, ch))
        deadline = None if block is None else (
            time.monotonic() + (block / 1000 if block else 10 ** 9))
        while True:
            found = []
            # An answer is held whole until the client reads it: it stops at a page's
            # bytes, and at what the answers of every connection may hold together
            # (always one entry: the client reads on from the last id it got).
            room = min(STORAGE_READ_BYTES, RESP_RANGE_TOTAL_BYTES - _answers_held(c.server))
            for key, ch, _ in streams:
                if room <= 0 and found:
                    break
                reply = await c.request(f.Read(next(c._req), ch, after[ch] + 1, count))
                if isinstance(reply, f.Error):
                    c._answer(slot, _frame_error(reply))
                    return
                items = []
                for d in reply.items:
                    if d.seq <= after[ch]:
                        continue
                    if len(items) == count or (room <= 0 and (items or found)):
                        break
                    items.append(d)
                    room -= len(d.data) + READ_WEIGHT_BASE
                if items:
                    ids = _stream_ids(c, ch)
                    found.append((key, [_entry(d, ids) for d in items]))
            if found:
                c._answer(slot, _streams_reply(c, found))
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is None or left <= 0:
                c._answer(slot, NULL_ARRAY)
                return
            wait = min(left, MAX_WAIT_S)
            reply = await c.request(f.Admin(next(c._req), "channels.wait", {
                "patterns": json.dumps([t if isinstance(t, str) else t.text
                                        for _, t, _ in targets]),
                "after": json.dumps({ch: after[ch] + 1 for _, ch, _ in streams}),
                "wait": wait}))
            if isinstance(reply, f.Error):
                c._answer(slot, _frame_error(reply))
                return
            streams = _xread_streams(c, targets)
            for _, ch, sid in streams:  # a stream made since the read began: all of it
                after.setdefault(ch, 0 if sid in (b"$", b"+") else parse_id(
                    sid, high=True, ids=_stream_ids(c, ch)))
    except asyncio.CancelledError:
        if getattr(c.server, "closing", False) and not c.closed:
            # The broker stops: cut the connection as Redis's SHUTDOWN does (a nil
            # would read as "nothing came", which a BLOCK 0 never answers).
            c.abort()
        else:
            c._answer(slot, NULL_ARRAY)  # the connection is gone: nobody reads it
        raise


async def _xinfo_stream(c: RespConnection, slot: _Slot, channel: str, head: list[Any]
                        ) -> None:
    """XINFO STREAM: what the channel's log says, with its first and last entries."""
    last_id, length, groups = head
    ends: list[Any] = []
    try:
        bounds = await c.request(f.Offsets(next(c._req), [channel]))
        first, nxt = (bounds.value or {}).get(channel, (1, 1)) \
            if isinstance(bounds, f.Result) else (1, 1)
        for start in (int(first), max(int(first), int(nxt) - 1)):
            reply = await c.request(f.Read(next(c._req), channel, start, 1, int(nxt)))
            items = reply.items if isinstance(reply, f.ReadResult) else []
            ends.append(_entry(items[0], _stream_ids(c, channel)) if items else None)
    except asyncio.CancelledError:
        raise
    except Exception:  # the entries are a courtesy: the rest is answered anyway
        ends = [None, None]
    c._answer(slot, Map([(b"length", length), (b"last-generated-id", last_id),
                         (b"first-entry", ends[0]), (b"last-entry", ends[1]),
                         (b"groups", groups)]))


def _xdel(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 3:
        return wrong_args("xdel")
    channel = key_to_channel(args[1])
    assert c.inner is not None
    c.inner.session.access.check_write(channel)  # a write, as Redis's ACL counts XDEL
    seqs = _exact_ids(args[2:], _stream_ids(c, channel))
    if len(args) - 2 > MAX_DELETE:
        return Error(f"ERR XDEL takes at most {MAX_DELETE} ids at once")
    if not seqs:
        return 0
    c._ask(f.Admin(next(c._req), "messages.delete",
                   {"channel": channel, "seqs": ",".join(map(str, seqs))}),
           slot, lambda reply: reply.value["messages"])
    return _LATER


def _xtrim(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 4:
        return wrong_args("xtrim")
    assert c.inner is not None
    # a write, as Redis's ACL counts XTRIM (and XDEL): refused alike, stream or none
    c.inner.session.access.check_write(key_to_channel(args[1]))
    if args[3] == b"~":
        return 0  # approximate: nothing trimmed (retention and max_items keep the size)
    return Error(f"ERR XTRIM {_text(args[2].upper())} with an exact threshold is not "
                 "supported: minou keeps a channel's messages by its retention and max_items "
                 "(config [channels]); '~' (approximate) is accepted and trims nothing")


def _exact_ids(values: list[bytes], ids: StreamIds | None) -> list[int]:
    """The seqs of the entries these ids name (an id no entry can have names none)."""
    seqs = []
    for value in values:
        seq = exact_seq(value, ids)
        if seq is not None and 0 < seq <= MAX_FROM_SEQ:
            seqs.append(seq)
    return seqs


_ID_LIST = re.compile(rb"\d{1,18}-0(?: \d{1,18}-0)*")


def _ids(values: list[bytes], ids: StreamIds | None) -> list[int]:
    """XACK's and XCLAIM's ids as seqs (an id no entry has: -1, which settles none)."""
    if ids is None:
        joined = b" ".join(values)
        if _ID_LIST.fullmatch(joined):  # minou's own ids (XACK's): read at C speed
            seqs = list(map(int, joined.replace(b"-0", b"").split()))
            # (no value held a space of its own; none names a seq no entry can have)
            if len(seqs) == len(values) and max(seqs) <= MAX_FROM_SEQ:
                return seqs
    return [-1 if seq is None or seq > MAX_FROM_SEQ else seq
            for seq in (exact_seq(v, ids) for v in values)]


def _xack(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 4:
        return wrong_args("xack")
    channel = _readable(c, args[1])
    return _groups(c).ack(group_name(args[2], channel), _ids(args[3:], _stream_ids(c, channel)))


def _xpending(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 3:
        return wrong_args("xpending")
    key, group = args[1], args[2]
    gname = _existing_group(c, key, group)
    groups = _groups(c)
    ids = _stream_ids(c, key_to_channel(key))
    entries = sorted(groups.entries(gname).values(), key=lambda e: e.item.seq)
    if len(args) == 3:
        if not entries:
            return [0, None, None, None]
        per: dict[bytes, int] = {}
        for e in entries:
            per[e.consumer] = per.get(e.consumer, 0) + 1
        return [len(entries), id_of(entries[0].item.seq, ids), id_of(entries[-1].item.seq, ids),
                [[k, str(v).encode()] for k, v in per.items()]]
    i, min_idle = 3, 0
    try:
        if args[i].upper() == b"IDLE" and len(args) > i + 1:
            min_idle, i = _int(args[i + 1]), i + 2
        if len(args) < i + 3:
            return Error("ERR syntax error")
        lo, hi = parse_id(args[i], high=False, ids=ids), parse_id(args[i + 1], high=True,
                                                                   ids=ids)
        count = _int(args[i + 2])
    except _Reply as early:
        return early.reply
    who = args[i + 3] if len(args) > i + 3 else None
    now = time.monotonic()
    out = []
    for e in entries:
        idle = int((now - e.since) * 1000)
        if lo <= e.item.seq <= hi and idle >= min_idle and (who is None or e.consumer == who):
            out.append([id_of(e.item.seq, ids), e.consumer, idle, e.count])
            if len(out) >= count:
                break
    return out


def _claim_options(args: list[bytes]) -> tuple[list[bytes], bool]:
    ids: list[bytes] = []
    justid = False
    i = 0
    while i < len(args):
        opt = args[i].upper()
        if opt == b"JUSTID":
            justid, i = True, i + 1
        elif opt == b"FORCE":
            i += 1
        elif opt in (b"IDLE", b"TIME", b"RETRYCOUNT", b"LASTID"):
            i += 2
        else:
            ids.append(args[i])
            i += 1
    return ids, justid


def _xclaim(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 6:
        return wrong_args("xclaim")
    key, group, name = args[1], args[2], args[3]
    try:
        min_idle = _int(args[4])
    except _Reply as early:
        return early.reply
    gname = _existing_group(c, key, group)
    groups = _groups(c)
    given, justid = _claim_options(args[5:])
    ids = _stream_ids(c, key_to_channel(key))
    assert c.identity is not None
    claimed = groups.claim(gname, name, c.identity, min_idle, _ids(given, ids),
                           bump=not justid)
    return [id_of(e.item.seq, ids) if justid else _entry(e.item, ids) for e in claimed]


def _xautoclaim(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 6:
        return wrong_args("xautoclaim")
    key, group, name = args[1], args[2], args[3]
    count, justid = DEFAULT_COUNT, False
    channel = _readable(c, key, claim=False)  # the rights before the stream's ids or group
    try:
        min_idle = _int(args[4])
        ids = _stream_ids(c, channel)
        start = parse_id(args[5], high=False, ids=ids)
        i = 6
        while i < len(args):
            opt = args[i].upper()
            if opt == b"COUNT" and i + 1 < len(args):
                asked = _int(args[i + 1])
                if asked < 1:
                    return Error("ERR COUNT must be > 0")
                count, i = min(asked, MAX_COUNT), i + 2
            elif opt == b"JUSTID":
                justid, i = True, i + 1
            else:
                return Error("ERR syntax error")
    except _Reply as early:
        return early.reply
    gname = _existing_group(c, key, group)
    groups = _groups(c)
    now = time.monotonic()
    candidates = sorted((e for e in groups.entries(gname).values()
                         if e.item.seq >= start and (now - e.since) * 1000 >= min_idle),
                        key=lambda e: e.item.seq)
    taken, rest = candidates[:count], candidates[count:]
    assert c.identity is not None
    claimed = groups.claim(gname, name, c.identity, min_idle, [e.item.seq for e in taken],
                           bump=not justid)
    nxt = id_of(rest[0].item.seq, ids) if rest else b"0-0"
    return [nxt, [id_of(e.item.seq, ids) if justid else _entry(e.item, ids) for e in claimed],
            []]


def _xinfo(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 3:
        return wrong_args("xinfo")
    sub = args[1].upper()
    channel = _readable(c, args[2])
    groups = _groups(c)
    core = c.server.core
    log_ = core.channels.get(channel)
    if sub == b"GROUPS":
        out = []
        suffix = f"@{channel}"
        for key, grp in core.state.groups.items():
            gname = key.removeprefix("consume:")
            if not key.startswith("consume:") or not gname.endswith(suffix):
                continue
            gc = grp.gcs.get(channel)
            last = max(0, (gc.cursor if gc is not None else 1) - 1)
            pending = len(groups.entries(gname))
            lag = max(0, (log_.end if log_ is not None else 1) - (gc.cursor if gc else 1))
            out.append(Map([(b"name", gname[:-len(suffix)].encode()),
                            (b"consumers", len(groups.names.get(gname, {}))),
                            (b"pending", pending),
                            (b"last-delivered-id", id_of(last, log_.stream_ids if log_ else None)),
                            (b"entries-read", last), (b"lag", lag)]))
        return out
    if sub == b"CONSUMERS" and len(args) == 4:
        gname = group_name(args[3], channel)
        if not groups.exists(gname):
            return Error(f"NOGROUP No such consumer group '{_text(args[3])}' for key name "
                         f"'{_text(args[2])}'")
        now = time.monotonic()
        held = groups.consumer_pending(gname)  # one pass: not one per name
        return [Map([(b"name", n), (b"pending", held[n]), (b"idle", int((now - seen) * 1000)),
                     (b"inactive", int((now - seen) * 1000))])
                for n, seen in sorted(groups.names.get(gname, {}).items())]  # as Redis
    if sub == b"STREAM":
        if log_ is None:
            return Error("ERR no such key")
        head = [id_of(max(0, log_.end - 1), log_.stream_ids), log_.count, sum(
            1 for k in core.state.groups
            if k.startswith("consume:") and k.endswith(f"@{channel}"))]
        c.spawn(_xinfo_stream(c, slot, channel, head))
        return _LATER
    return Error(f"ERR unknown subcommand '{_text(args[1])}'. Try XINFO HELP.")

# --------------------------------------------------------------- miniqueue
MQ_COMMANDS = frozenset({"INIT", "ACK", "NACK", "BACK", "DACK"})


class MiniqueueSubscriber:
    """miniqueue's consumer over RESP: after ``SUBSCRIBE topic`` the connection gets one
    message at a time (a bulk string of its bytes), and answers each with ``ACK``,
    ``NACK`` (back to the front), ``BACK`` (to the back) or ``DACK [seconds]`` (back
    after a delay, 1 s by default); each is answered ``OK``, then the next message comes.
    ``INIT`` (miniqueue's README; its code starts without it) is accepted and ignored.
    Subscribers of a topic share it (group ``miniqueue@<channel>``); what one holds
    when it leaves goes back to the front. ``SUBSCRIBE topic JSON`` sends each message
    as miniqueue's HTTP consumer payload instead: ``{"msg": <base64>}``, with
    ``"dackCount"`` once the message was DACK'ed (its Redis mode has no room for it)."""

    def __init__(self, c: RespConnection, channel: str, *, as_json: bool = False) -> None:
        assert c.identity is not None
        self.c = c
        self.channel = channel
        self.as_json = as_json
        self.holder = _groups(c).consumer(c.identity, channel, f"miniqueue@{channel}")
        self.current: Delivery | None = None
        self.end: Callable[[], None] | None = None

    def next(self, slot: _Slot) -> None:
        """Wait for the next message and send it in ``slot``."""
        def done(items: list[Delivery]) -> None:
            self.end = None
            if self.c.closed:
                for item in items:
                    self.holder.give_back(item)
                return
            if not items:  # waited a day: keep waiting
                self.next(slot)
                return
            self.current = items[0]
            for extra in items[1:]:
                self.holder.give_back(extra)
            self.c._answer(slot, self._payload(items[0]))

        self.end = self.holder.take(1, 24 * 3600.0, done)

    def _payload(self, item: Delivery) -> bytes:
        if not self.as_json:
            return bytes(item.data)
        body: dict[str, Any] = {"msg": base64.b64encode(item.data).decode()}
        count = _groups(self.c).dacks.get((self.channel, item.seq))
        if count:
            body["dackCount"] = count
        return json.dumps(body).encode()

    def command(self, name: str, args: list[bytes]) -> None:
        c = self.c
        if name == "INIT":
            return  # the subscription started with SUBSCRIBE
        if self.current is None:
            c._fill(c._slot(), Error("ERR no message to settle: wait for one"))
            return
        item, self.current = self.current, None
        session = self.holder.session
        op, kw = "ack", {}
        if name == "NACK":
            op, kw = "nack", {"front": True}
        elif name == "BACK":
            op, kw = "nack", {"front": False}
        elif name == "DACK":
            try:
                seconds = float(args[1]) if len(args) > 1 else 1.0
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds <= 86400:
                self.current = item
                c._fill(c._slot(), Error("ERR DACK takes seconds: 0..86400"))
                return
            op, kw = "nack", {"delay": seconds}
            _groups(c).dacked(self.channel, item.seq)
        if op == "ack":
            _groups(c).dacks.pop((self.channel, item.seq), None)
        answer, message = c._slot(), c._slot()
        if session is None:
            c._fill(answer, Error("ERR failed: the subscription ended"))
            return

        def settled(failed: list[tuple[int, int, str]], exc: RequestError | None) -> None:
            # Once durable: a message sent back is in the queue again before the next
            # one is taken (else NACK's "front" would come after the next message).
            self.holder._credit()
            c._answer(answer, refusal(exc) if exc is not None else
                      Error(f"ERR failed to {op}: {failed[0][2]}") if failed else OK)
            self.next(message)

        c.server.engine.settle(session, op, [item.tag], settled, **kw)

    def close(self) -> None:
        if self.end is not None:
            self.end()
        if self.current is not None and self.holder.session is not None:
            self.c.server.engine.settle(self.holder.session, "nack", [self.current.tag],
                                        None, front=True)
            self.current = None


def _subscribe(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    as_json = len(args) == 3 and args[2].upper() == b"JSON"
    if len(args) != 2 and not as_json:
        return Error("ERR invalid number of args, want: 2 (miniqueue's SUBSCRIBE topic, "
                     "or SUBSCRIBE topic JSON; minou has no Redis pub/sub)")
    if c.mq is not None:
        return Error("ERR this connection is subscribed already: ACK, NACK, BACK or DACK")
    channel = key_to_channel(args[1])
    assert c.inner is not None
    c.server.core.check_read(c.inner.session, channel)
    c.mq = MiniqueueSubscriber(c, channel, as_json=as_json)
    c.mq.next(slot)
    return _LATER


# ------------------------------------------------- transactions and scripts
def _multi(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if c.multi is not None:
        return Error("ERR MULTI calls can not be nested")
    c.multi, c.multi_failed = [], False
    return OK


def _discard(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if c.multi is None:
        return Error("ERR DISCARD without MULTI")
    c.end_multi()
    return OK


def _watch(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if c.multi is not None:
        return Error("ERR WATCH inside MULTI is not allowed")
    return Error("ERR WATCH is not supported: minou's compare-and-set is SET ... NX, or "
                 "a KV bucket's revisions")


def _unwatch(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    return OK


async def _exec(c: RespConnection, args: list[bytes]) -> Any:
    failed = c.multi_failed
    queued = c.end_multi()
    if queued is None:
        return Error("ERR EXEC without MULTI")
    if failed:
        return Error("EXECABORT Transaction discarded because of previous errors.")
    # In order; the XADDs side by side travel as one publish (one commit: all of them
    # durable or none), as a pipeline's do. Any other command waits for what came first.
    loop = asyncio.get_running_loop()
    replies: list[asyncio.Future[Any]] = []
    adding: list[asyncio.Future[Any]] = []  # the XADDs not yet sent
    for cmd in queued:
        is_xadd = cmd[0].upper() == b"XADD"
        if adding and not is_xadd:  # what comes next sees them done
            c._publish_batch()
            await asyncio.gather(*adding)
            adding = []
        fut: asyncio.Future[Any] = loop.create_future()
        replies.append(fut)
        task = c._run(cmd, _Slot(fut), nested=True)
        if task is not None:
            await task
        if is_xadd:
            adding.append(fut)
        else:
            await fut
    c._publish_batch()
    return [await fut for fut in replies]


async def _eval(c: RespConnection, args: list[bytes]) -> Any:
    name = args[0].upper()
    if len(args) < 3:
        return wrong_args(name.decode().lower())
    scripts = c.server.resp_scripts
    if name in (b"EVALSHA", b"EVALSHA_RO"):
        body = scripts.by_sha.get(args[1].decode(errors="replace").lower())
        if body is None:
            return Error("NOSCRIPT No matching script. Please use EVAL.")
    else:
        body = args[1]
        if len(body) > resp_keys.MAX_SCRIPT_BYTES:
            return Error(f"ERR a script is at most {resp_keys.MAX_SCRIPT_BYTES} bytes here")
        scripts.add(body)
    try:
        numkeys = int(args[2])
    except ValueError:
        return Error("ERR value is not an integer or out of range")
    if numkeys < 0:
        return Error("ERR Number of keys can't be negative")
    if numkeys > len(args) - 3:
        return Error("ERR Number of keys can't be greater than number of args")
    try:
        import lupa  # noqa: F401
    except ImportError:
        return Error("ERR Lua scripts need lupa: pip install 'minou[resp]'")
    loop = asyncio.get_running_loop()
    keys, argv = args[3:3 + numkeys], args[3 + numkeys:]
    async with c.server.resp_script_lock:  # one script at a time
        c.script_reads = {}
        try:
            return await loop.run_in_executor(None, resp_keys.run_script, c, loop, body,
                                              keys, argv)
        finally:
            c.script_reads = None


def _script(c: RespConnection, args: list[bytes], slot: _Slot) -> Any:
    if len(args) < 2:
        return wrong_args("script")
    sub = args[1].upper()
    scripts = c.server.resp_scripts
    if sub == b"LOAD" and len(args) == 3:
        if len(args[2]) > resp_keys.MAX_SCRIPT_BYTES:
            return Error(f"ERR a script is at most {resp_keys.MAX_SCRIPT_BYTES} bytes here")
        return scripts.add(args[2]).encode()
    if sub == b"EXISTS":
        return [int(a.decode(errors="replace").lower() in scripts.by_sha) for a in args[2:]]
    if sub == b"FLUSH":
        scripts.by_sha.clear()
        return OK
    return Error(f"ERR unknown subcommand '{_text(args[1])}'. Try SCRIPT HELP.")


ASYNC_COMMANDS: dict[str, Callable[..., Any]] = {
    **resp_keys.KEY_COMMANDS, "EXEC": _exec, "EVAL": _eval, "EVALSHA": _eval,
    "EVAL_RO": _eval, "EVALSHA_RO": _eval,
}


COMMANDS: dict[str, Callable[[RespConnection, list[bytes], _Slot], Any]] = {
    "PING": _ping, "ECHO": _echo, "QUIT": _quit, "RESET": _reset, "SELECT": _select,
    "AUTH": _auth, "HELLO": _hello, "CLIENT": _client, "INFO": _info,
    "COMMAND": _command_cmd,
    "XADD": _xadd, "XLEN": _xlen, "XRANGE": _xrange, "XREVRANGE": _xrevrange,
    "PUBLISH": _publish,
    "XGROUP": _xgroup, "XREADGROUP": _xreadgroup, "XACK": _xack, "XPENDING": _xpending,
    "XCLAIM": _xclaim, "XAUTOCLAIM": _xautoclaim, "XINFO": _xinfo,
    "XREAD": _xread, "XDEL": _xdel, "XTRIM": _xtrim,
    "MULTI": _multi, "DISCARD": _discard, "WATCH": _watch, "UNWATCH": _unwatch,
    "SCRIPT": _script, "SUBSCRIBE": _subscribe,
}
BEFORE_AUTH = frozenset({"AUTH", "HELLO", "QUIT", "RESET"})


async def start_resp(server: BrokerServer, sock: Any, ssl: Any) -> Any:
    """Serve the Redis protocol on ``sock`` (bound by the caller)."""
    assert server.loop is not None
    return await server.loop.create_server(lambda: RespConnection(server), sock=sock, ssl=ssl)


def close_all(server: BrokerServer) -> None:
    for conn in list(server.resp_connections):
        with contextlib.suppress(Exception):
            conn.close()
