"""JSON from clients, decoded without surprises.

Every way client bytes can fail to be JSON -- not UTF-8, nested deeper than
``MAX_JSON_DEPTH``, malformed -- is an ``InvalidPayload`` saying which, never a
``RecursionError`` or ``UnicodeDecodeError`` escaping a handler. The depth is
measured on the bytes before decoding (strings removed, then brackets summed),
and only when the text holds more brackets than the limit: a payload with a few
brackets costs two ``count`` calls.
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate
from typing import Any

import msgspec

from .errors import InvalidPayload, RequestError
from .limits import MAX_JSON_DEPTH

_decoder = msgspec.json.Decoder()
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKETS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 / -1 as signed bytes
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def json_depth(data: bytes | str) -> int:
    """How deep arrays and objects nest in JSON text (exact for valid JSON; 0 for a
    scalar)."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    bare = _STRING.sub(b"", raw).translate(_BRACKETS, _NOT_BRACKETS)
    return max(accumulate(array("b", bare)), default=0)


def check_depth(data: bytes | str, *, what: str = "payload", limit: int = MAX_JSON_DEPTH,
                outer: int = 0) -> None:
    """InvalidPayload if ``data`` nests more than ``limit`` levels (plus ``outer``
    levels of an envelope around the value that is limited, e.g. a batch's array)."""
    if isinstance(data, str):
        opening = data.count("[") + data.count("{")
    else:
        opening = data.count(b"[") + data.count(b"{")
    if opening <= limit + outer:
        return
    depth = json_depth(data) - outer
    if depth > limit:
        raise InvalidPayload(
            f"{what} nests arrays and objects {depth} deep; the limit is {limit} "
            "(MAX_JSON_DEPTH)", limit=limit, depth=depth)


def not_utf8(exc: UnicodeError, what: str) -> InvalidPayload:
    """The refusal of text that is not UTF-8 (JSON text is UTF-8)."""
    if isinstance(exc, UnicodeDecodeError) and 0 <= exc.start < len(exc.object):
        return InvalidPayload(f"{what} is not UTF-8 (JSON text is UTF-8): it holds byte "
                              f"0x{exc.object[exc.start]:02x} where UTF-8 cannot")
    return InvalidPayload(f"{what} is not UTF-8 (JSON text is UTF-8)")


def undecodable(exc: msgspec.DecodeError, data: bytes | str, what: str,
                malformed: type[RequestError] = InvalidPayload) -> RequestError:
    """The refusal of text msgspec could not decode. msgspec < 0.23 raised
    UnicodeDecodeError for bytes that are not UTF-8; later ones say only "Invalid
    UTF-8" in a DecodeError: either way the client hears which byte."""
    if not isinstance(data, str):
        try:
            bytes(data).decode("utf-8")
        except UnicodeDecodeError as bad:
            return not_utf8(bad, what)
    return malformed(f"{what} is not valid JSON: {exc}")


def decode_json(data: bytes | str, *, what: str = "payload",
                malformed: type[RequestError] = InvalidPayload) -> Any:
    """The value of the JSON text ``data``, or InvalidPayload naming what is wrong
    (``malformed`` when it is no JSON at all: a request rather than a payload may
    say BadRequest)."""
    check_depth(data, what=what)
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise undecodable(exc, data, what, malformed) from None
    except UnicodeError as exc:  # invalid UTF-8 bytes; lone surrogates in a str
        raise not_utf8(exc, what) from None
    except RecursionError:  # the stack was already deep: the limit is the message
        raise InvalidPayload(f"{what} nests arrays and objects too deep; the limit is "
                             f"{MAX_JSON_DEPTH} (MAX_JSON_DEPTH)",
                             limit=MAX_JSON_DEPTH) from None


# Every string in turn (outside strings valid JSON has no quote), and the ":" after it
# when it is a key: matching strings alone keeps the scan aligned on real strings.
_STRING_OR_KEY = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"(\s*:)?')


def _keys_in(value: Any) -> int:
    """How many keys the objects in a decoded JSON value hold, all levels."""
    if isinstance(value, dict):
        return len(value) + sum(_keys_in(v) for v in value.values())
    if isinstance(value, list):
        return sum(_keys_in(v) for v in value)
    return 0


def repeated_key(data: bytes | str, value: Any) -> str | None:
    """A key that one object of the JSON text ``data`` holds twice (``value`` is its
    decoded value), or None. Decoders keep one of the two (msgspec the last, others the
    first), so such a payload may mean one thing to the schema and another to a reader.
    Cheap when there is none: keys counted in the text against those decoded."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if sum(1 for colon in _STRING_OR_KEY.findall(raw) if colon) == _keys_in(value):
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen and not found:
                found.append(key)
            seen.add(key)
        return dict(items)

    json.loads(raw, object_pairs_hook=pairs)
    return found[0] if found else None


def check_json(data: bytes | str, *, what: str = "payload") -> None:
    """InvalidPayload unless ``data`` is JSON text within the limits."""
    decode_json(data, what=what)
