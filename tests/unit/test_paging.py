"""Admin listings' pages (core/paging.py) and the hint of a too large answer."""

from __future__ import annotations

import pytest

from minou.core.paging import page_args, page_of
from minou.errors import BadRequest
from minou.limits import DEFAULT_ADMIN_PAGE, MAX_ADMIN_PAGE
from minou.server.admin import narrowing


def test_page_args_default_to_the_first_page_and_accept_http_strings() -> None:
    assert page_args({}) == ("", DEFAULT_ADMIN_PAGE)
    assert page_args({"after": "b", "limit": "10"}) == ("b", 10)
    assert page_args({"after": None, "limit": MAX_ADMIN_PAGE}) == ("", MAX_ADMIN_PAGE)


@pytest.mark.parametrize("args", [{"limit": 0}, {"limit": MAX_ADMIN_PAGE + 1},
                                  {"limit": "x"}, {"limit": True}, {"limit": 1.5},
                                  {"after": 3}])
def test_page_args_refuse_what_is_no_page(args: dict[str, object]) -> None:
    with pytest.raises(BadRequest):
        page_args(args)


def test_pages_follow_each_other_sorted_without_gap_or_repeat() -> None:
    names = [f"n{i:03d}" for i in range(250)][::-1]
    seen: list[str] = []
    after, more = "", True
    while more:
        page, more = page_of(names, after, 100)
        seen += page
        after = page[-1] if page else after
    assert seen == sorted(names)
    assert page_of(names, "n249", 100) == ([], False)
    assert page_of(names, "", 250) == (sorted(names), False)


def test_a_too_large_answer_names_the_narrowing_of_its_operation() -> None:
    assert "minou clients list --limit N" in narrowing("clients.list")
    assert "minou list -q QUEUE" in narrowing("list")
    assert "limit" in narrowing(None) and "minou list -q QUEUE" in narrowing(None)
