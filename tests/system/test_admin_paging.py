"""Admin listings of everything registered come a page at a time (as ``kv.keys`` does):
at most ``limit`` (default DEFAULT_ADMIN_PAGE) sorted by name, after the ``after``
cursor, with ``more`` and ``next``; a call without them gets the first page and the
marker, never an answer over the frame limit. The CLI follows the pages.

A broker with 200,000 registered keys (an auto-accepting rule, pending approvals)
answered ``clients.list`` with every one in one frame: over 16 MiB it was refused as
FRAME_TOO_LARGE, with a hint (``minou list -q QUEUE``) that did not apply, and neither
``minou clients list`` nor the dashboard's clients page could show anyone."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import httpx
import msgspec
import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.registry import ACTIVE, ClientRecord, encode_record
from minou.auth.tokens import make_token
from minou.limits import DEFAULT_ADMIN_PAGE, MAX_CREDENTIALS_PER_CLIENT

from ..conftest import TEST_STORAGE
from .test_admin_cli import cli

# Registered through HELLOs, 100 new ids a minute from one address would take an hour:
# the records are written into the stopped broker's store, as registrations leave them.
MANY = 2_500


def client_ids(n: int) -> list[str]:
    return [f"reg-{i:05d}" for i in range(n)]


def stage_clients(broker, ids: list[str]) -> None:
    """``ids`` registered and active in ``broker``'s SQLite store (the broker stopped)."""
    key = keyfiles.generate()
    pem = keyfiles.public_pem(key).decode()
    now = time.time()
    template = ClientRecord(client_id="", public_key=pem, fingerprint=keyfiles.fingerprint(key),
                            algorithm="ed25519", status=ACTIVE, created_at=now,
                            updated_at=now, admin_approved=False)
    assert broker.stop() == 0
    with sqlite3.connect(broker.data_dir / "minou.db") as db:
        db.executemany("INSERT INTO clients(client_id, record) VALUES (?, ?)",
                       [(cid, encode_record(msgspec.structs.replace(template, client_id=cid)))
                        for cid in ids])
    broker.start()


@pytest.fixture
def crowded(broker):
    if TEST_STORAGE:
        pytest.skip("clients are staged in the SQLite store")
    stage_clients(broker, client_ids(MANY))
    return broker


def test_clients_list_answers_a_page_and_says_there_is_more(crowded):
    everyone = sorted([*client_ids(MANY), "admin"])
    with minou.connect_sync(crowded.url, **crowded.admin_auth(request_timeout=60)) as admin:
        first = admin.admin("clients.list")  # no paging arguments: an older caller
        assert [c["client_id"] for c in first["clients"]] == everyone[:DEFAULT_ADMIN_PAGE]
        assert first["more"] is True and first["next"] == everyone[DEFAULT_ADMIN_PAGE - 1]
        assert first["total"] == MANY + 1
        assert "rules" in first and "reservations" in first
        seen: list[str] = []
        after = ""
        while True:
            page = admin.admin("clients.list", limit=1_000, after=after)
            seen += [c["client_id"] for c in page["clients"]]
            if not page["more"]:
                break
            after = page["next"]
        assert seen == everyone
        assert admin.admin("clients.list", after=everyone[-1]) == {
            **admin.admin("clients.list", after=everyone[-1]), "clients": [], "more": False}
        with pytest.raises(minou.errors.BadRequest, match="limit must be a number"):
            admin.admin("clients.list", limit=0)


def test_clients_list_over_http_pages_with_query_arguments(crowded):
    token = make_token("admin", keyfiles.load_private(crowded.admin_key), "minou", ttl=600)
    got = httpx.get(f"{crowded.http}/v1/clients", params={"limit": 10, "after": "reg-00100"},
                    headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
    assert [c["client_id"] for c in got["clients"]] == client_ids(111)[101:]
    assert got["more"] is True and got["next"] == "reg-00110"


def test_minou_clients_list_prints_everyone_across_pages(crowded):
    listed = cli(crowded, "clients", "list", "--json", "--limit", "1000")
    assert listed.returncode == 0, listed.stderr[-2000:]
    whole = json.loads(listed.stdout)  # the pages joined: the shape of one answer
    assert [c["client_id"] for c in whole["clients"]] == sorted([*client_ids(MANY), "admin"])
    assert whole["more"] is False and "reservations" in whole
    human = cli(crowded, "clients", "list")
    assert human.returncode == 0, human.stderr[-2000:]
    for cid in ("admin", "reg-00000", "reg-00999", "reg-01000", "reg-02499"):
        assert f"  {cid}\n" in human.stdout  # its fingerprint line


def test_credentials_list_pages_and_minou_credentials_list_prints_them_all(broker):
    """An admin's own 1,000 credentials (MAX_CREDENTIALS_PER_CLIENT), issued at once."""
    async def issue_many() -> set[str]:
        c = await minou.connect(broker.url, **broker.admin_auth(request_timeout=60))
        try:
            got = await asyncio.gather(*(c.issue_credential(ttl=600, purpose="p" * 200)
                                         for _ in range(MAX_CREDENTIALS_PER_CLIENT)))
        finally:
            await c.close()
        return {g["id"] for g in got}

    issued = asyncio.run(issue_many())
    with minou.connect_sync(broker.url, **broker.admin_auth(request_timeout=60)) as admin:
        first = admin.admin("credentials.list", limit=300)
        assert [c["id"] for c in first["credentials"]] == sorted(issued)[:300]
        assert first["more"] is True and first["total"] == len(issued)
        assert first["next"] == sorted(issued)[299]
    listed = cli(broker, "credentials", "list", "--json", "--limit", "300")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [c["id"] for c in json.loads(listed.stdout)["credentials"]] == sorted(issued)
    human = cli(broker, "credentials", "list", "--limit", "300")
    assert human.returncode == 0, human.stderr[-2000:]
    assert all(i in human.stdout for i in issued)


BUCKETS = 1_200


def test_kv_buckets_pages_and_minou_kv_ls_prints_them_all(broker):
    names = sorted(f"b{i:04d}" for i in range(BUCKETS))

    async def make_buckets() -> None:
        c = await broker.connect("bucket-maker", request_timeout=60)
        try:
            await asyncio.gather(*(c.kv(b).put("k", 1) for b in names))
        finally:
            await c.close()

    asyncio.run(make_buckets())
    with minou.connect_sync(broker.url, **broker.admin_auth(request_timeout=60)) as admin:
        first = admin.admin("kv.buckets")  # no paging arguments: an older caller
        assert [b["bucket"] for b in first["buckets"]] == names[:DEFAULT_ADMIN_PAGE]
        assert first["more"] is True and first["total"] == BUCKETS
        second = admin.admin("kv.buckets", after=first["next"], limit=DEFAULT_ADMIN_PAGE)
        assert [b["bucket"] for b in second["buckets"]] == names[DEFAULT_ADMIN_PAGE:]
        assert second["more"] is False
    listed = cli(broker, "kv", "ls", "--json", "--limit", "500")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [b["bucket"] for b in json.loads(listed.stdout)] == names
    human = cli(broker, "kv", "ls", "--limit", "500")
    assert human.returncode == 0, human.stderr[-2000:]
    assert [line.split(":")[0] for line in human.stdout.splitlines()] == names
