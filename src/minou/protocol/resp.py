"""The Redis protocol (RESP2 and RESP3) without I/O: a request parser and a reply encoder.

``RespParser.feed(data)`` takes bytes as they arrive, in any split, and returns the
commands complete so far, each a list of ``bytes`` arguments. Requests are what Redis
accepts: arrays of bulk strings (what every client library sends, pipelined or not)
and inline commands (a line of words, as ``redis-cli`` in a pipe or ``nc`` send), with
Redis's quoting. Anything else is a ``RespProtocolError`` in ``error``, with Redis's
own wording ("Protocol error: invalid bulk length"): the connection answers the
commands before it, then the error, and closes, as Redis does, since the stream can
no longer be framed.

Everything a peer can make the parser hold is bounded: an array's element count, a
bulk string's length (``max_bulk``, the broker's message size plus room), the bytes of
one command's arguments together (``max_request``: twice ``max_bulk``, at least 1 MiB,
each argument counted ``ARG_OVERHEAD`` more), and an inline line (64 KiB, Redis's own
limit).

``resp_hiredis.HiredisParser`` gives the same results read by hiredis's C reader; the
broker uses it when ``minou[resp]`` installed hiredis.

``encode(value, proto)`` writes one reply. Python values map the obvious way (``None``
is a null, ``int`` an integer, ``bytes``/``str`` a bulk string, ``list`` an array); the
wrappers below carry the types RESP3 has and RESP2 shows another way (a ``Map`` is a
flat array in RESP2, a ``Double`` a bulk string, a ``Bool`` an integer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_INLINE = 64 * 1024  # Redis's PROTO_INLINE_MAX_SIZE
MAX_ARRAY = 1024 * 1024  # elements in one request (Redis: 1M for a client)
# What an argument costs held beyond its bytes (a bytes object, a list slot), counted
# against max_request so a million empty arguments are bounded as their bytes are.
ARG_OVERHEAD = 64
CRLF = b"\r\n"


class RespProtocolError(Exception):
    """The request stream cannot be read on: answer ``-ERR <message>`` and close."""


@dataclass(frozen=True, slots=True)
class Simple:
    """A status reply: ``+OK``."""

    text: str


@dataclass(frozen=True, slots=True)
class Error:
    """An error reply: ``-<CODE> <message>`` (the code is the first word)."""

    text: str


@dataclass(frozen=True, slots=True)
class Map:
    """RESP3 ``%`` (RESP2: a flat array of key, value, key, value...)."""

    pairs: list[tuple[Any, Any]]


@dataclass(frozen=True, slots=True)
class Set:
    """RESP3 ``~`` (RESP2: an array)."""

    items: list[Any]


@dataclass(frozen=True, slots=True)
class Double:
    """RESP3 ``,`` (RESP2: a bulk string)."""

    value: float


@dataclass(frozen=True, slots=True)
class Bool:
    """RESP3 ``#t``/``#f`` (RESP2: the integer 1 or 0)."""

    value: bool


@dataclass(frozen=True, slots=True)
class Verbatim:
    """RESP3 ``=`` text (``txt:``), e.g. INFO (RESP2: a bulk string)."""

    text: str


@dataclass(frozen=True, slots=True)
class Push:
    """RESP3 ``>`` out-of-band data (RESP2: an array), e.g. a pub/sub message."""

    items: list[Any]


@dataclass(frozen=True, slots=True)
class NullArray:
    """A null where an array was expected (``*-1`` in RESP2, ``_`` in RESP3): what
    XREAD answers when BLOCK timed out."""


class Encoded(bytes):
    """A reply already in RESP (one that reads the same in RESP2 and RESP3): sent as it
    is. What a hot path builds once instead of handing ``encode`` a value per reply."""

    __slots__ = ()


NULL_ARRAY = NullArray()
OK = Simple("OK")


# ----------------------------------------------------------------------- requests
class RespParser:
    """Incremental request parser (see the module docstring). Not thread-safe."""

    def __init__(self, max_bulk: int, max_request: int | None = None) -> None:
        self.max_bulk = max_bulk
        self.max_request = max_request if max_request is not None else \
            default_max_request(max_bulk)
        self._buf = bytearray()
        self._pos = 0
        # An array being read: the elements still to come, those read so far and their
        # bytes together.
        self._left = 0
        self._args: list[bytes] = []
        self._held = 0
        self.error: RespProtocolError | None = None  # the stream broke: close after

    @property
    def buffered(self) -> int:
        """Bytes held for a request not complete yet (bounded by the limits)."""
        return len(self._buf) - self._pos

    @property
    def pending(self) -> int:
        """Bytes held of the request not complete yet: what is buffered and the
        arguments of it already read."""
        return len(self._buf) - self._pos + (self._held if self._left else 0)

    @property
    def at_boundary(self) -> bool:
        """Between two commands: nothing of a next one read yet."""
        return not self._left and len(self._buf) == self._pos and self.error is None

    def feed(self, data: bytes) -> list[list[bytes]]:
        """Add ``data``; return every command now complete (empty ones skipped). If the
        stream broke after them, ``error`` says how (what came before is still
        answered, as Redis does); nothing more is read then."""
        if self.error is not None:
            return []
        self._buf += data
        out: list[list[bytes]] = []
        try:
            while True:
                command = self._next()
                if command is None:
                    break
                if command:
                    out.append(command)
        except RespProtocolError as exc:
            self.error = exc
            self._buf.clear()
            self._pos = 0
        finally:
            if self._pos:
                del self._buf[:self._pos]
                self._pos = 0
        return out

    def _line(self, limit: int, what: str) -> bytes | None:
        """The next CRLF-ended line (without it), or None until it is all here."""
        buf, pos = self._buf, self._pos
        end = buf.find(b"\n", pos)
        if end < 0:
            if len(buf) - pos > limit:
                raise RespProtocolError(f"Protocol error: too big {what}")
            return None
        if end - pos > limit:
            raise RespProtocolError(f"Protocol error: too big {what}")
        self._pos = end + 1
        line = bytes(buf[pos:end])
        return line[:-1] if line.endswith(b"\r") else line

    def _next(self) -> list[bytes] | None:
        # The hot path of every client library: written flat, on local names.
        buf, pos = self._buf, self._pos
        n = len(buf)
        if self._left == 0:
            if pos >= n:
                return None
            if buf[pos] != 42:  # not '*': an inline command
                return self._inline()
            end = buf.find(b"\r\n", pos)
            if end < 0 or end - pos > 32:
                if end >= 0 or n - pos > 32:
                    raise RespProtocolError("Protocol error: too big mbulk count string")
                return None
            count = _count(buf[pos + 1:end], "invalid multibulk length", negative=True)
            self._pos = pos = end + 2
            if count > MAX_ARRAY:
                raise RespProtocolError("Protocol error: invalid multibulk length")
            if count <= 0:
                return []  # Redis ignores an empty or null array
            self._left, self._args, self._held = count, [], 0
        args, left, max_bulk, held = self._args, self._left, self.max_bulk, self._held
        while left:
            if pos >= n:
                break
            if buf[pos] != 36:  # '$'
                c = buf[pos]
                got = chr(c) if 32 <= c < 127 else f"\\x{c:02x}"
                raise RespProtocolError(f"Protocol error: expected '$', got '{got}'")
            end = buf.find(b"\r\n", pos)
            if end < 0 or end - pos > 32:
                if end >= 0 or n - pos > 32:
                    raise RespProtocolError("Protocol error: too big bulk count string")
                break
            size = _count(buf[pos + 1:end], "invalid bulk length", negative=False)
            if size > max_bulk:
                raise RespProtocolError("Protocol error: invalid bulk length")
            if held + size + ARG_OVERHEAD > self.max_request:  # the arguments together
                raise RespProtocolError("Protocol error: too big request")
            start = end + 2
            stop = start + size
            if stop + 2 > n:
                break  # its length line is read again once the body is here
            if buf[stop] != 13 or buf[stop + 1] != 10:
                raise RespProtocolError("Protocol error: bulk string not followed by CRLF")
            args.append(bytes(buf[start:stop]))
            held += size + ARG_OVERHEAD
            pos = stop + 2
            left -= 1
        self._pos, self._left, self._held = pos, left, held
        if left:
            return None
        self._args = []
        return args

    def _inline(self) -> list[bytes] | None:
        line = self._line(MAX_INLINE, "inline request")
        if line is None:
            return None
        return split_inline(line)


def default_max_request(max_bulk: int) -> int:
    """The bytes one command's arguments may hold together, by default."""
    return max(2 * max_bulk, 1 << 20)


def _count(text: bytes | bytearray, why: str, *, negative: bool) -> int:
    """A length line's number: digits only (``-`` first for an array's -1)."""
    if text.isdigit():
        return int(text)
    if negative and text[:1] == b"-" and text[1:].isdigit():
        return int(text)
    raise RespProtocolError(f"Protocol error: {why}")


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b",
            ord("a"): b"\a"}
_HEX = b"0123456789abcdefABCDEF"


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline command as Redis's ``sdssplitargs`` does: words separated by
    spaces; "double quotes" with \\n, \\xHH... escapes; 'single quotes' with \\' only.
    A closing quote must be followed by a space or the end."""
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in b" \t\n\r\v\f":
            i += 1
        if i >= n:
            return args
        word = bytearray()
        quote = 0
        while True:
            if i >= n:
                if quote:
                    raise RespProtocolError("Protocol error: unbalanced quotes in request")
                break
            c = line[i]
            if quote == ord('"'):
                if c == ord("\\") and i + 3 < n and line[i + 1] == ord("x") and \
                        line[i + 2] in _HEX and line[i + 3] in _HEX:
                    word.append(int(line[i + 2:i + 4], 16))
                    i += 4
                    continue
                if c == ord("\\") and i + 1 < n:
                    i += 1
                    word += _ESCAPES.get(line[i], bytes([line[i]]))
                elif c == ord('"'):
                    if i + 1 < n and line[i + 1] not in b" \t\n\r\v\f":
                        raise RespProtocolError(
                            "Protocol error: unbalanced quotes in request")
                    quote = 0
                    i += 1
                    break
                else:
                    word.append(c)
            elif quote == ord("'"):
                if c == ord("\\") and i + 1 < n and line[i + 1] == ord("'"):
                    i += 1
                    word.append(ord("'"))
                elif c == ord("'"):
                    if i + 1 < n and line[i + 1] not in b" \t\n\r\v\f":
                        raise RespProtocolError(
                            "Protocol error: unbalanced quotes in request")
                    quote = 0
                    i += 1
                    break
                else:
                    word.append(c)
            elif c in b" \t\n\r\v\f":
                break
            elif c in (ord('"'), ord("'")):
                quote = c
            else:
                word.append(c)
            i += 1
        args.append(bytes(word))


# ------------------------------------------------------------------------ replies
def encode(value: Any, proto: int = 2) -> bytes:
    """One reply in RESP2 (``proto`` 2) or RESP3 (3)."""
    if type(value) is Encoded:
        return value
    out = bytearray()
    _encode(out, value, proto)
    return bytes(out)


def _encode(out: bytearray, value: Any, proto: int) -> None:
    if type(value) is Encoded:
        out += value
    elif value is None:
        out += b"_\r\n" if proto >= 3 else b"$-1\r\n"
    elif isinstance(value, bytes | bytearray | memoryview):
        out += b"$%d\r\n" % len(value)
        out += value
        out += CRLF
    elif isinstance(value, str):
        _encode(out, value.encode(), proto)
    elif isinstance(value, Bool):
        if proto >= 3:
            out += b"#t\r\n" if value.value else b"#f\r\n"
        else:
            out += b":1\r\n" if value.value else b":0\r\n"
    elif isinstance(value, bool):
        _encode(out, Bool(value), proto)
    elif isinstance(value, int):
        out += b":%d\r\n" % value
    elif isinstance(value, list | tuple):
        out += b"*%d\r\n" % len(value)
        for item in value:
            _encode(out, item, proto)
    elif isinstance(value, Simple):
        out += b"+" + _one_line(value.text) + CRLF
    elif isinstance(value, Error):
        out += b"-" + _one_line(value.text) + CRLF
    elif isinstance(value, Map):
        out += (b"%%%d\r\n" % len(value.pairs)) if proto >= 3 else \
            (b"*%d\r\n" % (2 * len(value.pairs)))
        for k, v in value.pairs:
            _encode(out, k, proto)
            _encode(out, v, proto)
    elif isinstance(value, Set):
        out += (b"~%d\r\n" if proto >= 3 else b"*%d\r\n") % len(value.items)
        for item in value.items:
            _encode(out, item, proto)
    elif isinstance(value, Push):
        out += (b">%d\r\n" if proto >= 3 else b"*%d\r\n") % len(value.items)
        for item in value.items:
            _encode(out, item, proto)
    elif isinstance(value, Double):
        text = _double(value.value)
        if proto >= 3:
            out += b"," + text + CRLF
        else:
            _encode(out, text, proto)
    elif isinstance(value, Verbatim):
        body = value.text.encode()
        if proto >= 3:
            out += b"=%d\r\ntxt:" % (len(body) + 4) + body + CRLF
        else:
            _encode(out, body, proto)
    elif isinstance(value, NullArray):
        out += b"_\r\n" if proto >= 3 else b"*-1\r\n"
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as RESP")


def _one_line(text: str) -> bytes:
    """A status or error line: CR and LF would end it early, so they become spaces."""
    return text.replace("\r", " ").replace("\n", " ").encode()


def _double(x: float) -> bytes:
    if math.isnan(x):
        return b"nan"
    if math.isinf(x):
        return b"inf" if x > 0 else b"-inf"
    return repr(float(x)).encode()
