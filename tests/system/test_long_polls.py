"""Long polls (KV watches, ``channels.wait``) against a real broker: one client may
have only so many waiting, whatever its connections, so that others still can; many
polls of many patterns cost a commit what it wrote, not every pattern of every poll."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import minou
from minou.errors import TooManyConnections

from ..conftest import wait_until
from .test_http_api import bearer

MAX_LONG_POLLS_PER_CLIENT = 100  # limits.py's, written out: what a client is told


def run(coro: Any, timeout: float = 120) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _refusals(admin: minou.Client) -> int:
    status = await admin.admin("status")
    return int(status["counters"]["refused"].get("too_many_connections", 0))


def test_one_client_gets_only_so_many_long_polls_and_another_still_waits(broker) -> None:
    """One client could take every slot (10,000 KV watches, as many channels.wait) and
    have every other refused. Now past MAX_LONG_POLLS_PER_CLIENT of its own, both kinds
    and all its connections together, it is refused, precisely and counted; another
    client still waits, and is answered by the commit it waits for; an admin is
    bounded in all only."""
    half = MAX_LONG_POLLS_PER_CLIENT // 2
    quiet = json.dumps(["quiet/*"])

    async def scenario() -> None:
        greedy = await broker.connect("greedy")
        again = await broker.connect("greedy")  # the same client, another connection
        patient = await broker.connect("patient")
        admin = await minou.connect(broker.url, **broker.admin_auth())
        try:
            revision = await greedy.kv("cfg").put("k", 1)
            watches = [asyncio.create_task(greedy.admin(
                "kv.read", bucket="cfg", after=revision, wait=25)) for _ in range(half)]
            waits = [asyncio.create_task(again.admin(
                "channels.wait", patterns=quiet, after="{}", wait=25))
                for _ in range(MAX_LONG_POLLS_PER_CLIENT - half)]
            await asyncio.sleep(0)
            await greedy.ping()
            await again.ping()  # all of them are waiting now
            before = await _refusals(admin)
            for client in (greedy, again):
                with pytest.raises(TooManyConnections) as refused:
                    await client.admin("kv.read", bucket="cfg", after=revision, wait=25)
                assert "max_long_polls_per_client" in refused.value.message
                assert f"may have {MAX_LONG_POLLS_PER_CLIENT} at once" in \
                    refused.value.message
                assert refused.value.detail["limit"] == MAX_LONG_POLLS_PER_CLIENT
            with pytest.raises(TooManyConnections, match="client 'greedy' has 100 long "
                               r"polls waiting \(KV watches, channels.wait and HTTP requests "):
                await greedy.admin("channels.wait", patterns=quiet, after="{}", wait=25)
            assert await _refusals(admin) - before == 3
            assert not any(t.done() for t in watches + waits)  # refusing cut none
            # Another client still waits, both kinds, and an admin past the bound.
            other_watch = asyncio.create_task(patient.admin(
                "kv.read", bucket="cfg", after=revision, wait=25))
            other_wait = asyncio.create_task(patient.admin(
                "channels.wait", patterns=quiet, after="{}", wait=25))
            admin_waits = [asyncio.create_task(admin.admin(
                "channels.wait", patterns=quiet, after="{}", wait=25))
                for _ in range(MAX_LONG_POLLS_PER_CLIENT + 1)]
            await asyncio.sleep(0)
            await patient.ping()
            await admin.ping()
            assert not any(t.done() for t in [other_watch, other_wait, *admin_waits])
            await patient.kv("cfg").put("k", 2)
            await patient.send("quiet/v1/x", 1)
            entries = (await asyncio.wait_for(other_watch, 20))["entries"]
            assert [e["key"] for e in entries] == ["k"]
            assert (await asyncio.wait_for(other_wait, 20))["ready"]
            answered = await asyncio.wait_for(
                asyncio.gather(*watches, *waits, *admin_waits), 20)
            assert len(answered) == 2 * MAX_LONG_POLLS_PER_CLIENT + 1
            # Answered: their slots are free again.
            assert (await greedy.admin("channels.wait", patterns=quiet,
                                       after=json.dumps({"quiet/v1/x": 2}), wait=0.1)
                    ) == {"ready": False}
        finally:
            for client in (greedy, again, patient, admin):
                await client.close()

    run(scenario())


def test_the_long_polls_of_a_connection_that_closes_give_their_slots_back(broker) -> None:
    """A client that goes away with 100 polls waiting, and comes back at once (a
    restart, a reconnect), was refused for as long as they would have waited (up to
    30 s): they are cancelled with the connection."""
    quiet = json.dumps(["quiet/*"])

    async def scenario() -> None:
        gone = await broker.connect("flaky")
        polls = [asyncio.create_task(gone.admin("channels.wait", patterns=quiet, after="{}",
                                                wait=25))
                 for _ in range(MAX_LONG_POLLS_PER_CLIENT)]
        await asyncio.sleep(0)
        await gone.ping()
        await gone.close()
        await asyncio.gather(*polls, return_exceptions=True)
        back = await broker.connect("flaky")
        try:
            deadline = time.monotonic() + 3
            while True:
                try:
                    answer = await back.admin("channels.wait", patterns=quiet, after="{}",
                                              wait=0.2)
                    break
                except TooManyConnections:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)
            assert answer == {"ready": False}
        finally:
            await back.close()

    run(scenario())


def test_the_http_watches_of_clients_that_left_give_their_slots_back(broker) -> None:
    """uvicorn does not cancel a request whose client left: 100 KV watches over HTTP
    whose sockets closed held their client's slots until they timed out (25 s here).
    Now a watch is given up with its socket."""
    h = bearer(broker, "http-flaky")
    with minou.connect_sync(broker.url, **broker.auth("http-flaky")) as c:
        revision = c.kv("cfg").put("k", 1)
    url = urlsplit(broker.http)
    watch = (f"GET /v1/kv-watch/cfg?after={revision}&wait=25 HTTP/1.1\r\nHost: t\r\n"
             f"Authorization: {h['Authorization']}\r\n\r\n").encode()
    socks = [socket.create_connection((url.hostname, url.port), timeout=10)
             for _ in range(MAX_LONG_POLLS_PER_CLIENT)]
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin, \
            httpx.Client(base_url=broker.http, timeout=30, headers=h) as http:
        def waiting() -> int:
            return int(admin.admin("status")["long_polls"].get("KV watches", 0))

        try:
            for sock in socks:
                sock.sendall(watch)
            wait_until(lambda: waiting() == MAX_LONG_POLLS_PER_CLIENT, 20, what="100 watches")
            r = http.get("/v1/kv-watch/cfg", params={"after": revision, "wait": 25})
            assert r.status_code == 503, r.text
            assert r.json()["error"]["reason"] == "too_many_connections"
            assert "max_long_polls_per_client" in r.json()["error"]["message"]
        finally:
            for sock in socks:
                sock.close()
        wait_until(lambda: waiting() == 0, 5, what="the watches of closed sockets to go")
        r = http.get("/v1/kv-watch/cfg", params={"after": revision, "wait": 0.2})
        assert r.status_code == 200 and r.json()["entries"] == [], r.text


def test_many_polls_of_many_patterns_do_not_stall_a_commit(broker) -> None:
    """1,000 channels.wait of 256 patterns each (an admin's: not bounded per client),
    none of which a publish to 500 channels matches: each poll's patterns were tried
    against each channel (128 million tries: 15 s before another client's PING was
    answered); now the commit looks up each channel's few keys."""
    patterns = json.dumps([f"idle{j}/v1/*" if j % 2 else f"idle{j}/*" for j in range(256)])

    async def scenario() -> None:
        waiter = await minou.connect(broker.url, **broker.admin_auth())
        other = await broker.connect("pinger")
        try:
            polls = [asyncio.create_task(waiter.admin("channels.wait", patterns=patterns,
                                                      after="{}", wait=25))
                     for _ in range(1_000)]
            await asyncio.sleep(0)
            await waiter.ping()  # answered after the 1,000 polls were taken: all wait
            assert not any(p.done() for p in polls)
            # (How long this takes is the bench's business; that a commit never tries
            # a poll's patterns is tests/unit/test_long_polls.py's.)
            await other.send_many([(f"busy/v1/{n}", n) for n in range(500)])
            await other.ping()
            assert not any(p.done() for p in polls)  # none matched: none was woken
            await other.send("idle7/v1/x", 1)  # matches them all
            answers = await asyncio.wait_for(asyncio.gather(*polls), 20)
            assert all(a["ready"] for a in answers)
        finally:
            await waiter.close()
            await other.close()

    run(scenario())


def test_the_bound_per_client_is_a_setting_a_reload_moves(broker_factory, tmp_path) -> None:
    """A fleet of workers under one identity (Redis workers blocked in XREAD, say) may
    need more: ``max_long_polls_per_client`` sets it, and a reload applies it."""
    from ..conftest import OPEN_RULES
    from .test_reload import minou_cli

    cfg = tmp_path / "polls.toml"
    cfg.write_text("max_long_polls_per_client = 2\n" + OPEN_RULES)
    b = broker_factory.make(config=cfg).start()
    quiet = json.dumps(["quiet/*"])

    async def polls(n: int) -> tuple[list[Any], minou.Client]:
        client = await b.connect("fleet")
        waiting = [asyncio.create_task(client.admin(
            "channels.wait", patterns=quiet, after="{}", wait=20)) for _ in range(n)]
        await asyncio.sleep(0)
        await client.ping()
        return waiting, client

    async def third_is_refused() -> bool:
        waiting, client = await polls(2)
        try:
            await client.admin("channels.wait", patterns=quiet, after="{}", wait=0.1)
            return False
        except TooManyConnections as exc:
            assert exc.detail["limit"] == 2
            return True
        finally:
            await client.close()
            await asyncio.gather(*waiting, return_exceptions=True)

    assert run(third_is_refused())
    cfg.write_text("max_long_polls_per_client = 3\n" + OPEN_RULES)
    out = minou_cli(b, "reload", "--json")
    assert out.returncode == 0 and "max_long_polls_per_client" in out.stdout, out.stderr
    assert not run(third_is_refused())
