"""The dashboard's static files, served compressed and cached for as long as they last.

Every file is read once, at start, with its gzip form. They are served under
``/assets/<build>/<path>``, where ``<build>`` is a hash of all of them: any change to
any file gives every URL a new name, so a browser may keep them a year
(``immutable``), and the ES modules' relative imports stay inside one build.
``index.html`` names them so, and is never cached (``no-cache``: a new broker's
page is seen at once). A page still open from an earlier build asking its old
``<build>`` gets today's file, uncached. The plain paths (``/style.css``) answer too,
uncached, for anything that links them directly.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException

YEAR_S = 365 * 24 * 3600
IMMUTABLE = f"public, max-age={YEAR_S}, immutable".encode()
NO_CACHE = b"no-cache"
MIN_GZIP = 512  # smaller files go as they are: the header would eat the gain
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml",
          ".json": "application/json", ".txt": "text/plain; charset=utf-8"}
# href="x" / src="x" of index.html that name a file of the build (not a URL, not a hash)
_LINK = re.compile(r'(\b(?:href|src)=")(?![a-z]+:|/|#)([^"]+)(")')


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    gzipped: bytes | None
    content_type: bytes
    etag: bytes


def _asset(body: bytes, name: str) -> Asset:
    suffix = Path(name).suffix
    ctype = _TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
    packed = gzip.compress(body, compresslevel=9, mtime=0) if len(body) >= MIN_GZIP else None
    if packed is not None and len(packed) >= len(body):
        packed = None
    etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
    return Asset(body, packed, ctype.encode(), etag)


class DashboardAssets:
    """An ASGI app serving ``root`` (GET and HEAD)."""

    def __init__(self, root: Path) -> None:
        files: dict[str, bytes] = {}
        for path in sorted(root.rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_bytes()
        digest = hashlib.sha256()
        for name, body in files.items():
            digest.update(name.encode() + b"\0" + hashlib.sha256(body).digest())
        self.build = digest.hexdigest()[:12]
        self.prefix = f"/assets/{self.build}/"
        index = files.pop("index.html", b"").decode()
        index = _LINK.sub(lambda m: m[1] + self.prefix + m[2] + m[3], index)
        self.index = _asset(index.encode(), "index.html")
        self.files = {name: _asset(body, name) for name, body in files.items()}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise HTTPException(404)
        path: str = scope["path"]
        if path in ("/", "/index.html"):
            asset, cache = self.index, NO_CACHE
        elif path.startswith("/assets/"):
            build, _, name = path[len("/assets/"):].partition("/")
            found = self.files.get(name)
            if found is None:
                raise HTTPException(404)
            asset, cache = found, IMMUTABLE if build == self.build else NO_CACHE
        else:
            found = self.files.get(path.lstrip("/"))
            if found is None:
                raise HTTPException(404)
            asset, cache = found, NO_CACHE
        if scope["method"] not in ("GET", "HEAD"):
            raise HTTPException(405)
        await self._send(scope, send, asset, cache)

    @staticmethod
    async def _send(scope: Any, send: Any, asset: Asset, cache: bytes) -> None:
        request = dict(scope["headers"])
        headers = [(b"content-type", asset.content_type), (b"cache-control", cache),
                   (b"etag", asset.etag), (b"vary", b"accept-encoding")]
        if request.get(b"if-none-match") == asset.etag:
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        body = asset.body
        if asset.gzipped is not None and b"gzip" in request.get(b"accept-encoding", b""):
            body = asset.gzipped
            headers.append((b"content-encoding", b"gzip"))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})
