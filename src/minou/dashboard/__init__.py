"""The admin dashboard: static assets served by the broker at ``/`` of its HTTP port.

The page holds no data of its own: it signs in with an admin token and reads
everything through the authenticated HTTP API. Its one JavaScript dependency
(uPlot) is vendored under ``static/vendor`` by ``dashboard/build.sh`` (npm, at
build time), never fetched at run time.
"""

from __future__ import annotations

from pathlib import Path

STATIC_DIR = Path(__file__).resolve().parent / "static"
