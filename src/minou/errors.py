"""Every exception minou raises, and the one table of wire error codes.

::

    MinouError
    ├── ProtocolError          malformed frame, frame too large, unexpected frame,
    │                          request timeout
    ├── RequestError           sent back to the peer with its code
    │   ├── InvalidChannel  InvalidPayload  NotAuthorized  NotAuthenticated
    │   ├── MessageTooLarge  QueueFull  UnknownDelivery  BadRequest  ShuttingDown
    │   └── StorageFull        (also a StorageError) the disk or max_size is full
    ├── StorageError           StorageUnavailable, StorageFull, StorageFenced
    ├── StartupError           data directory in use, port busy
    └── ClientError            ConnectionClosed, Timeout, SendQueueFull

Each adapter turns these into an error frame (or an HTTP response) in exactly
one place; the ``code`` is what crosses the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class ErrorCode(IntEnum):
    # 1xx: framing and protocol; the connection may be closed after these.
    MALFORMED_FRAME = 100
    FRAME_TOO_LARGE = 101
    UNKNOWN_COMMAND = 102
    UNEXPECTED_FRAME = 103
    REQUEST_TIMEOUT = 104
    # 2xx: a request was refused; the connection stays usable.
    BAD_REQUEST = 200
    INVALID_CHANNEL = 201
    INVALID_PAYLOAD = 202
    MESSAGE_TOO_LARGE = 203
    QUEUE_FULL = 204
    UNKNOWN_DELIVERY = 205
    UNKNOWN_SUBSCRIPTION = 206
    NOT_AUTHENTICATED = 207
    NOT_AUTHORIZED = 208
    SHUTTING_DOWN = 209
    PENDING_APPROVAL = 210
    SCHEMA_MISMATCH = 211
    NOT_FOUND = 212
    OUT_OF_SEQUENCE = 213
    NO_RESPONDERS = 214
    REVISION_MISMATCH = 215
    # 3xx: the broker could not do it.
    STORAGE_UNAVAILABLE = 300
    INTERNAL = 301
    SLOW_CONSUMER = 302
    TOO_MANY_CONNECTIONS = 303
    STORAGE_FULL = 304
    PUBLISH_BACKLOG = 305
    STANDBY = 306
    REPLY_TIMEOUT = 307
    RESPONDER_ERROR = 308
    INPUT_BUSY = 309


@dataclass(frozen=True, slots=True)
class CodeInfo:
    http_status: int
    reason: str  # short snake_case label, used as the metrics "reason"
    text: str


ERROR_TABLE: dict[ErrorCode, CodeInfo] = {
    ErrorCode.MALFORMED_FRAME: CodeInfo(400, "malformed_frame", "malformed frame"),
    ErrorCode.FRAME_TOO_LARGE: CodeInfo(413, "frame_too_large", "frame too large"),
    ErrorCode.UNKNOWN_COMMAND: CodeInfo(400, "unknown_command", "unknown command"),
    ErrorCode.UNEXPECTED_FRAME: CodeInfo(400, "unexpected_frame", "unexpected frame"),
    ErrorCode.REQUEST_TIMEOUT: CodeInfo(408, "request_timeout", "request not received in time"),
    ErrorCode.BAD_REQUEST: CodeInfo(400, "bad_request", "bad request"),
    ErrorCode.INVALID_CHANNEL: CodeInfo(400, "invalid_channel", "invalid channel name"),
    ErrorCode.INVALID_PAYLOAD: CodeInfo(400, "invalid_payload", "invalid payload"),
    ErrorCode.MESSAGE_TOO_LARGE: CodeInfo(413, "message_too_large", "message too large"),
    ErrorCode.QUEUE_FULL: CodeInfo(429, "queue_full", "queue full"),
    ErrorCode.UNKNOWN_DELIVERY: CodeInfo(404, "unknown_delivery", "unknown delivery tag"),
    ErrorCode.UNKNOWN_SUBSCRIPTION: CodeInfo(404, "unknown_subscription", "unknown subscription"),
    ErrorCode.NOT_AUTHENTICATED: CodeInfo(401, "not_authenticated", "not authenticated"),
    ErrorCode.NOT_AUTHORIZED: CodeInfo(403, "not_authorized", "not authorized"),
    ErrorCode.SHUTTING_DOWN: CodeInfo(503, "shutting_down", "broker is shutting down"),
    ErrorCode.PENDING_APPROVAL: CodeInfo(403, "pending_approval",
                                         "client waits for an admin's approval"),
    ErrorCode.SCHEMA_MISMATCH: CodeInfo(422, "schema_mismatch",
                                        "payload does not match the channel's schema"),
    ErrorCode.NOT_FOUND: CodeInfo(404, "not_found", "no such queue, channel, group or client"),
    ErrorCode.OUT_OF_SEQUENCE: CodeInfo(409, "out_of_sequence",
                                        "a producer sequence skipped messages"),
    ErrorCode.NO_RESPONDERS: CodeInfo(503, "no_responders",
                                      "no consumer serves the request's channel"),
    ErrorCode.REVISION_MISMATCH: CodeInfo(412, "revision_mismatch",
                                          "the key is not at the expected revision"),
    ErrorCode.STORAGE_UNAVAILABLE: CodeInfo(503, "storage_unavailable", "storage unavailable"),
    ErrorCode.INTERNAL: CodeInfo(500, "internal", "internal error"),
    ErrorCode.SLOW_CONSUMER: CodeInfo(503, "slow_consumer", "slow consumer disconnected"),
    ErrorCode.TOO_MANY_CONNECTIONS: CodeInfo(503, "too_many_connections", "too many connections"),
    ErrorCode.STORAGE_FULL: CodeInfo(507, "storage_full",
                                     "storage full: nothing was stored (or made durable)"),
    ErrorCode.PUBLISH_BACKLOG: CodeInfo(503, "publish_backlog",
                                        "the disk is behind: nothing was stored; retry"),
    ErrorCode.INPUT_BUSY: CodeInfo(503, "input_busy",
                                   "too many large bodies arriving at once; retry"),
    ErrorCode.STANDBY: CodeInfo(503, "standby",
                                "this broker is a standby: another broker serves"),
    ErrorCode.REPLY_TIMEOUT: CodeInfo(504, "reply_timeout", "no reply in time"),
    ErrorCode.RESPONDER_ERROR: CodeInfo(502, "responder_error",
                                        "the responder's handler failed"),
}


class MinouError(Exception):
    """Base of every minou exception."""


class RequestError(MinouError):
    """A request was refused; sent back to the peer with ``code``."""

    code: ErrorCode = ErrorCode.BAD_REQUEST

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    @property
    def reason(self) -> str:
        return ERROR_TABLE[self.code].reason


class ProtocolError(RequestError):
    """The peer broke the framing or the protocol."""

    code = ErrorCode.MALFORMED_FRAME


class FrameTooLarge(ProtocolError):
    code = ErrorCode.FRAME_TOO_LARGE


class UnknownCommand(ProtocolError):
    code = ErrorCode.UNKNOWN_COMMAND


class UnexpectedFrame(ProtocolError):
    code = ErrorCode.UNEXPECTED_FRAME


class RequestTimeout(ProtocolError):
    """An HTTP request's headers did not arrive in time (the connection is closed)."""

    code = ErrorCode.REQUEST_TIMEOUT


class BadRequest(RequestError):
    code = ErrorCode.BAD_REQUEST


class InvalidChannel(RequestError):
    code = ErrorCode.INVALID_CHANNEL


class InvalidPayload(RequestError):
    code = ErrorCode.INVALID_PAYLOAD


class SchemaMismatch(InvalidPayload):
    code = ErrorCode.SCHEMA_MISMATCH


class MessageTooLarge(RequestError):
    code = ErrorCode.MESSAGE_TOO_LARGE


class QueueFull(RequestError):
    code = ErrorCode.QUEUE_FULL


class UnknownDelivery(RequestError):
    code = ErrorCode.UNKNOWN_DELIVERY


class UnknownSubscription(RequestError):
    code = ErrorCode.UNKNOWN_SUBSCRIPTION


class NotAuthenticated(RequestError):
    code = ErrorCode.NOT_AUTHENTICATED


class PendingApproval(NotAuthenticated):
    """A new client's key is registered but waits for an admin (``minou clients approve``)."""

    code = ErrorCode.PENDING_APPROVAL


class NotFound(RequestError):
    """An admin operation named a queue, channel, group or client that does not exist."""

    code = ErrorCode.NOT_FOUND


class OutOfSequence(RequestError):
    """An idempotent publish skipped sequence numbers: the messages between were never
    received (the message names the expected and the received number: an outcome
    carries a code and a message, no detail)."""

    code = ErrorCode.OUT_OF_SEQUENCE


class NotAuthorized(RequestError):
    code = ErrorCode.NOT_AUTHORIZED


class NoResponders(RequestError):
    """A request (a publish naming a reply inbox) to a channel no connected consumer or
    listener reads: nothing was stored, the caller knows at once (as NATS answers)."""

    code = ErrorCode.NO_RESPONDERS


class RevisionMismatch(RequestError):
    """A compare-and-set put or delete of a KV key (``revision=``, HTTP ``If-Match``)
    found the key at another revision: nothing was stored. The message names the
    revision found (0: the key has no value)."""

    code = ErrorCode.REVISION_MISMATCH


class ReplyTimeout(RequestError):
    """An HTTP request got no reply within its ``timeout`` (the request may still be
    served later: it expires from its channel after that long). The native client
    raises :class:`Timeout` instead."""

    code = ErrorCode.REPLY_TIMEOUT


class ResponderError(RequestError):
    """The responder's handler raised: ``detail["type"]`` is the exception's class name,
    the message its text."""

    code = ErrorCode.RESPONDER_ERROR


class ShuttingDown(RequestError):
    code = ErrorCode.SHUTTING_DOWN


class SlowConsumer(RequestError):
    code = ErrorCode.SLOW_CONSUMER


class TooManyConnections(RequestError):
    code = ErrorCode.TOO_MANY_CONNECTIONS


class Standby(RequestError):
    """This broker waits as a standby (several brokers on one Redis: another holds the
    primary lease). ``detail``: ``primary`` (its native URL) and ``primary_http``, when
    known; the client connects there instead."""

    code = ErrorCode.STANDBY


class PublishBacklog(RequestError):
    """An HTTP publish while the disk is behind (past ``publish_pause_bytes``, or while
    socket publishers are paused for it): nothing was stored; retry after
    ``detail.retry_after`` seconds. A socket publisher is paused instead."""

    code = ErrorCode.PUBLISH_BACKLOG


class InputBusy(RequestError):
    """An HTTP request with a body over 64 KiB while the broker's budget of unfinished
    bodies and frames (or its client's share) is taken: nothing was done; retry after
    ``Retry-After``. A socket connection waits for room instead."""

    code = ErrorCode.INPUT_BUSY


class StorageError(MinouError):
    """The storage backend failed."""


class StorageUnavailable(RequestError, StorageError):
    """Storage cannot be reached or failed (Redis down, an I/O error): nothing of what
    the request wanted stored was. With a storage that comes back by itself (Redis) the
    broker stays up, refuses publishes with this, and resumes on its own."""

    code = ErrorCode.STORAGE_UNAVAILABLE


class StorageLocked(StorageUnavailable):
    """Another process holds the storage's write lock (SQLite: an ``sqlite3`` shell
    inside a transaction, a ``VACUUM``, a backup tool that writes) past the busy
    timeout: nothing was written. It ends when that process lets go, so the broker
    refuses publishes meanwhile and resumes on its own, as for Redis out of reach."""


class StorageFenced(StorageError):
    """A shared store (Redis) refused this broker's writes to some queues: another
    broker claimed them since (their epoch moved on). Nothing was written for
    ``queues``; what the batch held for other queues and shared state was written.
    The broker no longer owns ``queues`` and must stop serving them."""

    def __init__(self, message: str, queues: dict[str, int], holder: str = "") -> None:
        super().__init__(message)
        self.queues = queues  # queue -> the epoch found (the claimant's)
        self.holder = holder  # the broker holding the primary lease, when that refused


class StorageFull(RequestError, StorageError):
    """The disk, or the database's ``[storage] max_size``, is full (SQLITE_FULL, ENOSPC):
    what the request wanted stored was not. ``detail`` names the data directory and
    the free space. The broker stays up and accepts publishes again by itself once
    space is freed."""

    code = ErrorCode.STORAGE_FULL


class StartupError(MinouError):
    """The broker cannot start: its data directory is in use, a port is taken, ..."""


class ClientError(MinouError):
    """Raised by the client library."""


class ConnectionClosed(ClientError):
    pass


class Timeout(ClientError, TimeoutError):
    """No answer in time; also a ``TimeoutError``, so ``except TimeoutError`` works as
    with asyncio."""


class SendQueueFull(ClientError):
    """The client's bounded send queue is full (the broker is unreachable or slow)."""


class ConfigError(MinouError):
    """The configuration is invalid; the message names the bad key."""


_BY_CODE: dict[int, type[RequestError]] = {}
for _cls in (
    ProtocolError, FrameTooLarge, UnknownCommand, UnexpectedFrame, RequestTimeout, BadRequest,
    InvalidChannel, InvalidPayload, SchemaMismatch, MessageTooLarge, QueueFull, UnknownDelivery,
    UnknownSubscription, NotAuthenticated, PendingApproval, NotAuthorized, ShuttingDown,
    SlowConsumer, TooManyConnections, NotFound, StorageFull, StorageUnavailable,
    OutOfSequence, Standby, NoResponders, ReplyTimeout, ResponderError, RevisionMismatch,
):
    _BY_CODE.setdefault(int(_cls.code), _cls)


def error_from_code(code: int, message: str, detail: dict[str, Any] | None = None) -> RequestError:
    """Rebuild the exception a peer reported (used by the client)."""
    cls = _BY_CODE.get(code, RequestError)
    err = cls(message, **(detail or {}))
    if cls is RequestError:
        try:
            err.code = ErrorCode(code)
        except ValueError:
            err.code = ErrorCode.INTERNAL
    return err


def describe(exc: BaseException) -> str:
    """An exception's text for a person, never empty (``TimeoutError()`` says nothing)."""
    text = str(exc)
    if text:
        return text
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return type(exc).__name__
