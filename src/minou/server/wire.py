"""How a refusal is written on each wire: one renderer per door, so every door says
the same code, reason, message and detail for the same error (SPEC.md "Errors").

No I/O: each returns what its door writes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import ERROR_TABLE, ErrorCode, RequestError
from ..protocol import frames as f

_encode = msgspec.json.Encoder().encode


def internal_error(text: str = "internal error") -> RequestError:
    """What a client is told when a bug cost its request (the log has the traceback)."""
    exc = RequestError(text)
    exc.code = ErrorCode.INTERNAL
    return exc


def error_detail(exc: RequestError) -> dict[str, Any]:
    """The error's detail as it goes out: scalars only, with its reason."""
    detail = {k: v for k, v in exc.detail.items() if isinstance(v, str | int | float | bool)}
    detail.setdefault("reason", ERROR_TABLE[exc.code].reason)
    return detail


def native_error(req: int, exc: RequestError, *, fatal: bool = False,
                 message: str | None = None, **detail: Any) -> f.Error:
    """The native protocol's ERROR frame (TCP and /v1/ws); ``message`` replaces the
    error's own text, ``detail`` adds to its detail."""
    return f.Error(req, int(exc.code), exc.message if message is None else message,
                   {**error_detail(exc), **detail}, fatal)


def http_error(exc: RequestError) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """Status, JSON body and extra headers of a refused HTTP request (the Starlette
    routes and the protocol's fast path answer alike)."""
    info = ERROR_TABLE[exc.code]
    detail = {k: v for k, v in exc.detail.items() if isinstance(v, str | int | float | bool)}
    headers = [(b"www-authenticate", b'Bearer realm="minou"')] \
        if exc.code == ErrorCode.NOT_AUTHENTICATED else []
    if isinstance(exc.detail.get("retry_after"), int):  # a refusal that passes by itself
        headers.append((b"retry-after", b"%d" % exc.detail["retry_after"]))
    body = {"error": {"code": int(exc.code), "reason": info.reason, "message": exc.message,
                      "detail": detail}}
    return info.http_status, _encode(body), headers


def stream_error(exc: RequestError, ref: Any = None, **extra: Any) -> dict[str, Any]:
    """A ``/v1/stream`` error message (``ref`` matches the client's request)."""
    out = {"type": "error", "code": int(exc.code), "reason": ERROR_TABLE[exc.code].reason,
           "message": exc.message, "ref": ref, **extra}
    if "receipt" in exc.detail:  # which settlement failed, without a ref to match
        out["receipt"] = exc.detail["receipt"]
    return out
