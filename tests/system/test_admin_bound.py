"""Admin views stay answerable whatever clients made: a group's patterns and a
channel's readers are listed up to MAX_LISTED_NAMES (with their count), and an answer
that would still pass the frame limit is refused precisely, on a connection that goes on.

One client's groups of many long patterns (within its own bounds) made `list` a 17 MB
answer: the admin's client refused the frame and dropped the connection, `minou list`
ended in a traceback, `client.admin("list")` retried until its 30 s timeout, and the
broker logged nothing."""

from __future__ import annotations

import json

import pytest

import minou
from minou.errors import FrameTooLarge
from minou.limits import MAX_FRAME_SIZE, MAX_LISTED_NAMES

from ..conftest import auth
from .test_admin_cli import cli

PATTERN_CHARS = 240  # a wildcard needs no channel: only the group's definition is held


def long_patterns(group: int, n: int) -> list[str]:
    return [f"g{group}p{i:05d}" + "y" * (PATTERN_CHARS - 12) + "/v1/*" for i in range(n)]


def make_groups(broker, client_id: str, groups: int, patterns: int) -> None:
    """``groups`` consumer groups of ``patterns`` long patterns each, made by a client
    that is not an admin (each kept for good once made: the subscription is closed)."""
    with minou.connect_sync(broker.url, **auth(client_id)) as c:
        for g in range(groups):
            c.consume(long_patterns(g, patterns), group=f"{client_id}-{g}").close()


def refused(client) -> dict[str, int]:
    return client.admin("status")["counters"]["refused"]


def test_a_clients_groups_of_many_long_patterns_leave_list_and_queues_answerable(broker):
    make_groups(broker, "hog", 7, 10_000)  # 7 x 10,000 x 240 characters: 17 MB
    listed = cli(broker, "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "Traceback" not in listed.stderr
    groups = {g["group"]: g for g in json.loads(listed.stdout)["groups"]}
    assert len(groups) == 7
    for g in range(7):
        one = groups[f"consume:hog-{g}"]
        assert one["patterns_total"] == 10_000
        assert one["patterns"] == long_patterns(g, MAX_LISTED_NAMES)
    human = cli(broker, "list")
    assert human.returncode == 0 and "more)" in human.stdout, human.stderr[-2000:]
    with minou.connect_sync(broker.url, **broker.admin_auth(request_timeout=60)) as admin:
        assert len(admin.admin("list")["groups"]) == 7
        queues = admin.admin("queues")
        assert {g["patterns_total"] for g in queues["groups"]} == {10_000}


def test_an_answer_over_the_frame_limit_is_refused_precisely_and_the_connection_goes_on(
        broker):
    # 700 groups of 100 patterns (the most listed): ~17 MB of patterns listed whole
    make_groups(broker, "hoarder", 700, MAX_LISTED_NAMES)
    with minou.connect_sync(broker.url, **broker.admin_auth(request_timeout=60)) as admin:
        before = refused(admin).get("frame_too_large", 0)
        # answered so (before: the connection dropped, the request retried until its
        # timeout, 60 s here, and failed as Timeout)
        with pytest.raises(FrameTooLarge, match=f"over the {MAX_FRAME_SIZE} byte limit"):
            admin.admin("list")
        assert refused(admin)["frame_too_large"] == before + 1  # the same connection
        narrow = admin.admin("list", queue="nothing/v1")
        assert narrow == {"channels": [], "groups": []}
    listed = cli(broker, "list")
    assert listed.returncode == 1
    assert "refused:" in listed.stderr and "minou list -q QUEUE" in listed.stderr
    assert "ask for less (list: " in listed.stderr  # the hint of its own op
    assert "Traceback" not in listed.stderr
    assert "over the 16777216 byte limit: refused with frame_too_large" in \
        broker.log_path.read_text()
