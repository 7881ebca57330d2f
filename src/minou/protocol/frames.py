"""The native wire format: frame types and pure encoders/decoders.

A frame is ``u32 length | u8 type | body`` (big-endian length counting the type
byte and the body). The body is a MessagePack array whose shape is the msgspec
Struct registered for that type (``array_like``: field order is the wire
order, so new optional fields go at the end). No I/O here.
"""

from __future__ import annotations

import gc
import struct
from enum import IntEnum
from typing import Any

import msgspec

from ..errors import ProtocolError, UnknownCommand

HEADER = struct.Struct(">IB")
HEADER_SIZE = HEADER.size


class FrameType(IntEnum):
    HELLO = 1
    WELCOME = 2
    PUBLISH = 3
    CONFIRM = 4
    SUBSCRIBE = 5
    UNSUBSCRIBE = 6
    SUB_ADD = 7
    SUB_REMOVE = 8
    DELIVER = 9
    ACK = 10
    NACK = 11
    EXTEND = 12
    SETTLED = 13
    READ = 14
    READ_RESULT = 15
    ADMIN = 16
    RESULT = 17
    ERROR = 18
    PING = 19
    PONG = 20
    BYE = 21
    STAGE = 22
    TXN_COMMIT = 23
    TXN_ABORT = 24
    OFFSETS = 25
    POSITION = 26
    HEARTBEAT = 27


class Frame(msgspec.Struct, array_like=True, frozen=True, omit_defaults=False):
    """Base of every frame body."""


class Hello(Frame):
    """The first frame. ``token`` is a JWT the client signed with its key (aud = broker
    id); ``public_key`` (PEM) registers the key on first contact; ``broker_token`` is the
    shared secret when the broker requires one. A HELLO without a token is answered
    with a non-fatal NOT_AUTHENTICATED error carrying ``broker_id`` (the audience to
    sign for), then the client sends HELLO again."""

    client_id: str
    version: int = 1
    token: str | None = None
    session: str | None = None
    public_key: str | None = None
    broker_token: str | None = None
    # Seconds between heartbeats the client wants (0: none, as clients before them).
    heartbeat: float = 0.0
    # The producer id a WELCOME gave this client before (its publishes' sequences are
    # kept per producer id, so a resend after a reconnect is stored once); "" for a new one.
    producer_id: str = ""
    # A delegated credential (``mdc1.<id>.<secret>``, from ``credentials.issue``) in place
    # of a token: for work the key's holder runs elsewhere (Spark executors).
    credential: str | None = None


class Welcome(Frame):
    broker_id: str
    version: int
    session: str
    max_message_size: int
    client_id: str = ""
    admin: bool = False
    heartbeat: float = 0.0  # the interval both sides keep (0: no heartbeats)
    producer_id: str = ""  # number publishes with Send.pseq under this id


class Send(msgspec.Struct, array_like=True, frozen=True):
    """One message inside a Publish. ``data`` is JSON text unless ``raw``."""

    channel: str
    data: bytes
    raw: bool = False
    headers: dict[str, str] | None = None
    priority: int = 0
    ttl: float | None = None  # seconds
    delay: float | None = None  # seconds before first delivery
    dedup: str | None = None
    key: str | None = None
    # Idempotent publishing: 1, 2, 3... per (producer id, channel) of this connection's
    # producer; a resend the broker already handled is answered as a duplicate.
    pseq: int = 0


class Publish(Frame):
    req: int
    msgs: list[Send]


class Outcome(msgspec.Struct, array_like=True, frozen=True):
    """The fate of one Send: stored (seq, id), a dedup hit, or an error."""

    seq: int = 0
    id: str = ""
    channel: str = ""
    duplicate: bool = False
    code: int = 0
    error: str = ""
    fanout: int = 1  # how many channels a broadcast reached


class Confirm(Frame):
    req: int
    outcomes: list[Outcome]


class Subscribe(Frame):
    req: int
    sid: int
    kind: str  # "listen" | "consume"
    patterns: list[str]
    group: str | None = None
    start: str = ""  # "new" | "oldest" | "seq:<n>"; "" means the kind's default
    prefetch: int = 0  # 0: the channel default
    lease: float = 0.0  # 0: the broker default
    name: str | None = None  # durable listener name (defaults to the pattern)
    # One channel, by name, in a consumer group: the first client to read it this way
    # reserves it (as a "!" rule does), and one connection at a time holds the group.
    exclusive: bool = False


class Unsubscribe(Frame):
    req: int
    sid: int


class SubAdd(Frame):
    req: int
    sid: int
    pattern: str


class SubRemove(Frame):
    req: int
    sid: int
    pattern: str


class Delivery(msgspec.Struct, array_like=True, frozen=True):
    tag: int
    channel: str
    seq: int
    id: str
    data: bytes
    raw: bool
    headers: dict[str, str] | None
    attempts: int
    published_at: float
    priority: int = 0
    key: str | None = None


class Deliver(Frame):
    sid: int
    items: list[Delivery]


class Ack(Frame):
    req: int  # 0: no Settled reply wanted
    tags: list[int]


class Nack(Frame):
    req: int
    tags: list[int]
    delay: float = 0.0
    front: bool = True


class Extend(Frame):
    req: int
    tags: list[int]
    seconds: float


class Settled(Frame):
    """Reply to Ack/Nack/Extend once durable. ``failed`` lists (tag, code, text)."""

    req: int
    failed: list[tuple[int, int, str]]


class Read(Frame):
    req: int
    channel: str
    from_seq: int
    limit: int
    to_seq: int = 0  # exclusive; 0 means no upper bound


class ReadResult(Frame):
    req: int
    items: list[Delivery]
    next_seq: int
    first_seq: int = 0  # the channel's oldest retained seq when read (0: not known)


class Admin(Frame):
    """A request/response call with a JSON-like argument map (list, status...)."""

    req: int
    op: str
    args: dict[str, Any] = {}


class Result(Frame):
    req: int
    value: Any = None


class Error(Frame):
    req: int  # 0 when not tied to a request
    code: int
    message: str
    detail: dict[str, Any] = {}
    fatal: bool = False


class Ping(Frame):
    req: int


class Pong(Frame):
    req: int


class Heartbeat(Frame):
    """Sent by either side when it has sent nothing for one negotiated interval; no
    reply. A side that hears nothing for two intervals declares the connection dead."""


class Bye(Frame):
    reason: str = ""


class Stage(Frame):
    """Stage messages under a transaction id (invisible until TXN_COMMIT)."""

    req: int
    txn: str
    msgs: list[Send]


class TxnCommit(Frame):
    """Publish the named transactions at once, fenced per (writer_id, channel) on
    batch_id: a channel already at or past batch_id discards its messages."""

    req: int
    writer_id: str
    batch_id: int
    txns: list[str]
    # The identity of the run of batches (a streaming query's id, kept in its
    # checkpoint): bound to the writer id by its first commit; another one is refused,
    # since its batches would be taken for replays of the first run's and discarded.
    lineage: str = ""
    # The fence the writer believes its channels are at (-1: no such check): a channel
    # whose fence moved past it but not to batch_id is refused (OUT_OF_SEQUENCE), as
    # another session of the writer committed part of this batch's range.
    after: int = -1


class TxnAbort(Frame):
    req: int
    txns: list[str]


class Offsets(Frame):
    """Earliest and next seq of every channel the patterns match (one round trip); with
    ``at`` (seconds since the epoch), also the first seq published at or after it."""

    req: int
    patterns: list[str]
    at: float = 0.0


class Position(Frame):
    """Move a consumer group's position: everything below ``positions[channel]`` is
    settled for it (a reader that keeps its own offsets, e.g. Spark, reports progress)."""

    req: int
    group: str
    positions: dict[str, int]


FRAME_CLASSES: dict[FrameType, type[Frame]] = {
    FrameType.HELLO: Hello,
    FrameType.WELCOME: Welcome,
    FrameType.PUBLISH: Publish,
    FrameType.CONFIRM: Confirm,
    FrameType.SUBSCRIBE: Subscribe,
    FrameType.UNSUBSCRIBE: Unsubscribe,
    FrameType.SUB_ADD: SubAdd,
    FrameType.SUB_REMOVE: SubRemove,
    FrameType.DELIVER: Deliver,
    FrameType.ACK: Ack,
    FrameType.NACK: Nack,
    FrameType.EXTEND: Extend,
    FrameType.SETTLED: Settled,
    FrameType.READ: Read,
    FrameType.READ_RESULT: ReadResult,
    FrameType.ADMIN: Admin,
    FrameType.RESULT: Result,
    FrameType.ERROR: Error,
    FrameType.PING: Ping,
    FrameType.PONG: Pong,
    FrameType.BYE: Bye,
    FrameType.STAGE: Stage,
    FrameType.TXN_COMMIT: TxnCommit,
    FrameType.TXN_ABORT: TxnAbort,
    FrameType.OFFSETS: Offsets,
    FrameType.POSITION: Position,
    FrameType.HEARTBEAT: Heartbeat,
}
TYPE_OF: dict[type[Frame], FrameType] = {cls: t for t, cls in FRAME_CLASSES.items()}


class JsonText:
    """A JSON value kept as its text (a stored KV value, checked when it was published),
    so that an answer holding many need not decode them: a JSON answer embeds the text
    as is (``json_text_hook``); a frame carries the value in msgpack, transcoded one
    value at a time as the frame is encoded (the bytes a decoded value would give)."""

    __slots__ = ("text",)

    def __init__(self, text: msgspec.Raw) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"JsonText({len(self.text)} bytes)"


def _unsupported(obj: Any) -> TypeError:
    # msgspec's own words for a type without a hook (a hook's NotImplementedError would
    # reach the caller as it is, without them)
    return TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")


def json_text_hook(obj: Any) -> Any:
    """``enc_hook`` of a JSON encoder of answers that may hold JsonText."""
    if isinstance(obj, JsonText):
        return obj.text
    raise _unsupported(obj)


def _msgpack_hook(obj: Any) -> Any:
    if not isinstance(obj, JsonText):
        raise _unsupported(obj)
    # The decoded value is a tree that reference counting frees as soon as it is
    # encoded: collections meanwhile find nothing of it, and the 300,000 small lists of
    # a 1 MiB value would start several (they tripled the time).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return msgspec.Raw(msgspec.msgpack.encode(msgspec.json.decode(obj.text)))
    finally:
        if enabled:
            gc.enable()


_DECODERS = {t: msgspec.msgpack.Decoder(cls) for t, cls in FRAME_CLASSES.items()}
_encoder = msgspec.msgpack.Encoder(enc_hook=_msgpack_hook)


def encode(frame: Frame) -> bytes:
    """Encode one frame, header included."""
    body = _encoder.encode(frame)
    return HEADER.pack(len(body) + 1, TYPE_OF[type(frame)]) + body


def decode_body(frame_type: int, body: bytes | memoryview) -> Frame:
    """Decode a frame body; raise ProtocolError/UnknownCommand with a precise reason."""
    try:
        decoder = _DECODERS[FrameType(frame_type)]
    except ValueError:
        raise UnknownCommand(f"unknown frame type {frame_type}", frame_type=frame_type) from None
    try:
        return decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        name = FrameType(frame_type).name
        raise ProtocolError(f"malformed {name} frame: {exc}", frame_type=frame_type) from None
    except RecursionError:
        name = FrameType(frame_type).name
        raise ProtocolError(f"malformed {name} frame: nested too deeply",
                            frame_type=frame_type) from None
