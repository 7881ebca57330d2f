"""Admin listings a page at a time, as ``kv.keys`` pages: at most ``limit`` names,
sorted, after the ``after`` cursor; ``more`` says others follow (asked for with
``after=next``, the last name answered). A caller that gives neither gets the first
page (DEFAULT_ADMIN_PAGE) and the marker, never an answer over the frame limit."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from ..errors import BadRequest
from ..limits import DEFAULT_ADMIN_PAGE, MAX_ADMIN_PAGE


def page_args(args: dict[str, Any]) -> tuple[str, int]:
    """``after`` and ``limit`` from an operation's arguments (HTTP gives strings)."""
    after = args.get("after") or ""
    if not isinstance(after, str):
        raise BadRequest("after must be a string: the next of the page before")
    limit: Any = args.get("limit", DEFAULT_ADMIN_PAGE)
    if isinstance(limit, str):
        limit = int(limit) if limit.isascii() and limit.isdigit() else -1
    if isinstance(limit, bool) or not isinstance(limit, int) \
            or not 1 <= limit <= MAX_ADMIN_PAGE:
        raise BadRequest(f"limit must be a number 1..{MAX_ADMIN_PAGE}", limit=MAX_ADMIN_PAGE)
    return after, limit


def page_of(names: Iterable[str], after: str, limit: int) -> tuple[list[str], bool]:
    """The first ``limit`` of ``names`` past ``after``, sorted, and whether more follow.
    A partial selection (O(n log limit)), not a sort of all: a whole listing of 200,000
    names in pages of 1,000 then costs ~8 ms a page, whatever order they were registered in."""
    found = heapq.nsmallest(limit + 1, (n for n in names if n > after))
    return found[:limit], len(found) > limit

