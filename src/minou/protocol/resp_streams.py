"""How Redis Streams map onto minou's model, without I/O (docs/redis-protocol.md).

* A **stream key** is a channel. A key that already is a channel name
  (``orders/v1/eu``) is that channel; any other key (``mystream``, ``app:events``) is
  the channel ``redis/v1/<key URL-encoded>``, so Redis applications run unchanged and
  ``[channels."redis/v1"]`` configures their streams (rules: ``redis/v1/*``).
* A key that is a **wildcard pattern** (``orders/v1/*``, ``orders/*``) names every
  channel it matches: ``XREAD`` reads them all (each as a stream of its own in the
  answer); other commands name one stream and refuse it.
* A **stream id** is ``<seq>-0``: ordered and stable, the message's seq; a stream
  given ids of its own (``XADD key 1700000000000-0 ...``) numbers by them
  (core/stream_ids.py): ``ids`` arguments below are the channel's ``StreamIds``.
* An **entry** round-trips byte for byte. One field ``payload`` whose value is JSON is
  the message's JSON payload (what the other interfaces read). Fields that are all
  UTF-8 text with distinct names become a JSON object of strings (header
  ``x-resp-entry: fields``), so native, HTTP and Spark readers get ``{"field":
  "value"}``. Anything else (binary values, repeated or non-text names) is a binary
  payload: a msgpack array of the field and value byte strings, in order, with
  ``x-resp-entry: binary`` and its content type.
"""

from __future__ import annotations

from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

import msgspec

from ..core.stream_ids import ID_MAX, N_MASK, SEQ_BITS, StreamIds, make_id
from ..errors import InvalidChannel
from ..names import Pattern, parse_pattern, validate_channel
from ..payloads import check_depth

KEY_CHANNEL_PREFIX = "redis/v1/"
ENTRY_HEADER = "x-resp-entry"
FIELDS, BINARY = "fields", "binary"
BINARY_CONTENT_TYPE = "application/vnd.minou.resp-entry+msgpack"
PAYLOAD_FIELD = b"payload"
_json = msgspec.json.Encoder()
_fields = msgspec.json.Decoder(dict[str, str])
_SAFE = "._~!$&'()+,;=:@-"  # what a channel id keeps unescaped (names._ID)


class StreamKeyError(ValueError):
    """A key that cannot name a stream (empty, or too long once encoded)."""


def stream_pattern(key: bytes) -> Pattern | None:
    """The wildcard pattern a key is (``orders/v1/*``), else None."""
    if not key.endswith(b"/*"):
        return None
    try:
        pattern = parse_pattern(key.decode())
    except (InvalidChannel, UnicodeDecodeError):
        return None
    return None if pattern.concrete else pattern


@lru_cache(maxsize=8192)
def key_to_channel(key: bytes) -> str:
    """The channel a stream key names (see the module docstring)."""
    try:
        text = key.decode()
    except UnicodeDecodeError:
        text = ""
    if stream_pattern(key) is not None:
        raise StreamKeyError(f"{text!r} is a pattern: XREAD reads every stream it matches; "
                             "this command names one stream (e.g. "
                             f"{text[:-1]}<id>)")
    if text:
        try:
            return validate_channel(text)
        except InvalidChannel:
            pass
    if not key:
        raise StreamKeyError("a stream key may not be empty")
    channel = KEY_CHANNEL_PREFIX + quote(key, safe=_SAFE)
    try:
        return validate_channel(channel)
    except InvalidChannel as exc:
        shown = key[:64].decode(errors="backslashreplace") + ("..." if len(key) > 64 else "")
        raise StreamKeyError(f"stream key {shown!r}: {exc.message}") from None


def channel_to_key(channel: str) -> bytes:
    """The key a client names ``channel`` by (the inverse of ``key_to_channel``)."""
    if channel.startswith(KEY_CHANNEL_PREFIX):
        return unquote_to_bytes(channel[len(KEY_CHANNEL_PREFIX):])
    return channel.encode()


def format_id(seq: int) -> bytes:
    return b"%d-0" % seq


def encoded_id(seq: int) -> bytes:
    """``format_id(seq)`` as a RESP bulk string."""
    return b"$%d\r\n%d-0\r\n" % (len(b"%d" % seq) + 2, seq)


def encoded_entry(seq: int, fields: list[bytes], sid: bytes | None = None) -> bytes:
    """The entry ``[id, [field, value, ...]]`` as RESP (the same in RESP2 and RESP3);
    its id ``<seq>-0`` unless ``sid`` gives it (a stream with explicit ids)."""
    if sid is None:
        parts = [b"*2\r\n$%d\r\n%d-0\r\n*%d\r\n" % (len(b"%d" % seq) + 2, seq,
                                                        len(fields))]
    else:
        parts = [b"*2\r\n$%d\r\n%b\r\n*%d\r\n" % (len(sid), sid, len(fields))]
    parts += [b"$%d\r\n%b\r\n" % (len(value), value) for value in fields]
    return b"".join(parts)


def entry_to_message(fields: list[bytes]) -> tuple[bytes, bool, dict[str, str]]:
    """``(data, raw, headers)`` of the message an entry's field/value list makes. A
    JSON payload is valid JSON within the depth limit (``InvalidPayload`` if it nests
    deeper: the Redis door publishes these without the broker checking them again)."""
    if len(fields) == 2:  # the common entry, made without the general path's lists
        name, value = fields
        if name == PAYLOAD_FIELD and _is_json(value):
            check_depth(value)
            return value, False, {}
        try:
            return _json.encode({name.decode(): value.decode()}), False, {ENTRY_HEADER: FIELDS}
        except UnicodeDecodeError:
            pass
    try:
        texts = list(map(bytes.decode, fields))
    except UnicodeDecodeError:
        pass
    else:
        obj = dict(zip(texts[0::2], texts[1::2], strict=True))
        if 2 * len(obj) == len(fields):  # no field name twice
            return _json.encode(obj), False, {ENTRY_HEADER: FIELDS}
    return (msgspec.msgpack.encode(list(fields)), True,
            {ENTRY_HEADER: BINARY, "content-type": BINARY_CONTENT_TYPE})


def encoded_message(seq: int, data: bytes, raw: bool, headers: dict[str, str] | None,
                    sid: bytes | None = None) -> bytes:
    """``encoded_entry(seq, message_to_entry(data, raw, headers), sid)`` in one pass for
    the common entry (text fields), as XREADGROUP sends a thousand at a time."""
    if sid is not None:
        return encoded_entry(seq, message_to_entry(data, raw, headers), sid)
    if headers and not raw and headers.get(ENTRY_HEADER) == FIELDS:
        try:
            obj = _fields.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            parts = [b"*2\r\n$%d\r\n%d-0\r\n*%d\r\n" % (len(b"%d" % seq) + 2, seq,
                                                            2 * len(obj))]
            for k, v in obj.items():
                kb, vb = k.encode(), v.encode()
                parts.append(b"$%d\r\n%b\r\n$%d\r\n%b\r\n" % (len(kb), kb, len(vb), vb))
            return b"".join(parts)
    return encoded_entry(seq, message_to_entry(data, raw, headers))


def message_to_entry(data: bytes, raw: bool, headers: dict[str, str] | None) -> list[bytes]:
    """The field/value list a RESP reader gets for a message (any interface's)."""
    kind = (headers or {}).get(ENTRY_HEADER)
    if kind == FIELDS and not raw:
        try:
            obj = _fields.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            out: list[bytes] = []
            for k, v in obj.items():
                out += (k.encode(), v.encode())
            return out
    elif kind == BINARY and raw:
        try:
            items = msgspec.msgpack.decode(data, type=list[bytes])
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if len(items) % 2 == 0:
                return items
    return [PAYLOAD_FIELD, bytes(data)]


def _is_json(value: bytes) -> bool:
    try:
        msgspec.json.decode(value)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


class StreamIdError(ValueError):
    """Not a stream id: Redis's own words (``Invalid stream ID specified as stream
    command argument``)."""


MAX_BOUND = 2 ** 63 - 1  # the highest seq a bound names (frames carry int64)


def parse_id(text: bytes, *, high: bool, ids: StreamIds | None = None) -> int:
    """The seq bound a stream id stands for in a range, as Redis reads it: ``-``/``+``;
    ``<ms>-<n>``; ``<ms>`` (``<ms>-0`` at the low end, ``<ms>-<max>`` at the high one);
    ``(`` exclusive (the id after, or before, the one given). ``high`` False: the
    lowest seq whose id is at or above it; True: the highest seq whose id is at or
    below it. ``ids``: the channel's explicit ids (else every id is ``<seq>-0``)."""
    exclusive = text.startswith(b"(")
    body = text[1:] if exclusive else text
    if body == b"-":
        value = 0 if not exclusive else _bad()
    elif body == b"+":
        value = ID_MAX if not exclusive else _bad()
    else:
        first, dash, second = body.partition(b"-")
        if not first.isdigit() or (dash and not second.isdigit()):
            return _bad()
        ms = int(first)
        n = int(second) if dash else (N_MASK if high else 0)
        if ms > N_MASK or n > N_MASK:
            return _bad()
        value = make_id(ms, n)
        if exclusive:
            value += -1 if high else 1
            if not 0 <= value <= ID_MAX:
                return _bad()
    if high:  # the highest seq whose id is <= value
        seq = value >> SEQ_BITS if ids is None else ids.ceil(value + 1) - 1
    elif ids is None:  # the lowest seq whose id is >= value
        seq = max(1, (value + N_MASK) >> SEQ_BITS)
    else:
        seq = ids.ceil(value)
    return min(seq, MAX_BOUND)


def exact_seq(text: bytes, ids: StreamIds | None) -> int | None:
    """The seq of the entry whose id is exactly ``text`` (``<ms>`` is ``<ms>-0``); None
    if no entry can have it. StreamIdError if it is not an id."""
    first, dash, second = text.partition(b"-")
    if not first.isdigit() or (dash and not second.isdigit()):
        return _bad()
    ms, n = int(first), int(second) if dash else 0
    if ms > N_MASK or n > N_MASK:
        return _bad()
    if ids is None:
        return ms if n == 0 and ms <= MAX_BOUND else None
    value = make_id(ms, n)
    return ids.seq_of(value)


def id_of(seq: int, ids: StreamIds | None) -> bytes:
    return b"%d-0" % seq if ids is None else ids.text(seq)


def _bad() -> int:
    raise StreamIdError("Invalid stream ID specified as stream command argument")
