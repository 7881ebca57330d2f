"""Request/reply (issue 21, item 1) against a real broker process: the async and sync
clients, HTTP's POST /v1/request, the CLI, and the broker's checks — an inbox only
its owner reads, a reply only from the connection that holds the request, nobody
serving refused at once, a request delivered again after its reply not run twice."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

import minou
from minou.errors import BadRequest, NoResponders, NotAuthorized, ResponderError, Timeout
from minou.names import CORRELATION_ID, REPLY_TO, REPLY_TOKEN, REQUEST_ID, inbox_of

from .test_http_api import bearer

RULES = """
[[rules]]
client = "shop-*"
read = ["orders/*"]
write = ["pricing/v1/*"]

[[rules]]
client = "pricing-*"
read = ["pricing/*"]
write = []

[[rules]]
client = "admin"
read = ["*"]
write = ["*"]
"""


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _quote(msg: minou.Message) -> dict[str, Any]:
    return {"item": msg.payload["item"], "price": 2 * msg.payload["qty"]}


@pytest.fixture
def ruled(broker_factory, tmp_path):
    cfg = tmp_path / "rules.toml"
    cfg.write_text(RULES)
    return broker_factory.make(config=cfg).start()


def test_a_request_gets_the_handlers_return_value(ruled):
    """The rules let shop-1 write pricing/v1/* and pricing-1 read it; neither may read or
    write anything called _inbox: the inbox and the reply need no rule."""

    async def scenario() -> None:
        responder = await ruled.connect("pricing-1")
        requester = await ruled.connect("shop-1")
        try:
            await responder.serve("pricing/v1/quote", _quote, group="pricing")
            answers = await asyncio.gather(*(
                requester.request("pricing/v1/quote", {"item": f"i{n}", "qty": n})
                for n in range(20)))
            assert answers == [{"item": f"i{n}", "price": 2 * n} for n in range(20)]
            # Headers the caller gives travel with the request.
            seen: list[dict[str, str]] = []

            async def echo(msg: minou.Message) -> str:
                seen.append(dict(msg.headers or {}))
                return "ok"

            await responder.serve("pricing/v1/echo", echo, group="echo")
            assert await requester.request("pricing/v1/echo", 1, headers={"trace": "t1"}) == "ok"
            assert seen[0]["trace"] == "t1"
            assert seen[0][REPLY_TO].startswith(inbox_of("shop-1") + "!")
        finally:
            await requester.close()
            await responder.close()

    run(scenario())


def test_requests_are_shared_by_the_responders_of_a_group(broker):
    async def scenario() -> None:
        a, b = await broker.connect("resp-a"), await broker.connect("resp-b")
        requester = await broker.connect("asker")
        try:
            for name, client in (("a", a), ("b", b)):
                await client.serve("work/v1/*", lambda m, n=name: n, group="workers",
                                   prefetch=1)
            answers = await asyncio.gather(*(requester.request("work/v1/job", n)
                                             for n in range(40)))
            assert set(answers) == {"a", "b"}
        finally:
            for c in (a, b, requester):
                await c.close()

    run(scenario())


def test_a_responder_answers_up_to_prefetch_requests_at_once(broker):
    async def scenario() -> None:
        responder = await broker.connect("resp")
        requester = await broker.connect("asker")
        running, most = 0, 0
        gate = asyncio.Event()

        async def slow(msg: minou.Message) -> int:
            nonlocal running, most
            running += 1
            most = max(most, running)
            if most == 5:
                gate.set()
            await gate.wait()  # each waits until five run at once
            running -= 1
            return msg.payload

        try:
            await responder.serve("slow/v1/*", slow, prefetch=5)
            answers = await asyncio.gather(*(requester.request("slow/v1/q", n, timeout=10)
                                             for n in range(12)))
            assert answers == list(range(12))
            assert most == 5  # no more than prefetch, and that many
        finally:
            await requester.close()
            await responder.close()

    run(scenario())


def test_nobody_serving_is_refused_at_once_and_nothing_is_stored(broker):
    async def scenario() -> None:
        requester = await broker.connect("asker")
        admin = await minou.connect(broker.url, **broker.admin_auth())
        try:
            # At once: well before the request's own 30 s.
            with pytest.raises(NoResponders, match="no consumer or listener is connected "
                                                   "to 'idle/v1/q'"):
                await asyncio.wait_for(requester.request("idle/v1/q", {}, timeout=30), 5)
            assert "idle/v1/q" not in json.dumps(await admin.admin("list"))
            status = await admin.admin("status")
            assert status["counters"]["refused"]["no_responders"] == 1
            # A listener serves too (it is a reader); once it is gone, refused again.
            sub = await admin.listen("idle/v1/q")
            with pytest.raises(Timeout, match=r"no reply to the request on 'idle/v1/q' "
                                              r"within 0\.3 s"):
                await requester.request("idle/v1/q", {}, timeout=0.3)
            await sub.close()
            with pytest.raises(NoResponders):
                await requester.request("idle/v1/q", {})
        finally:
            await admin.close()
            await requester.close()

    run(scenario())


def test_an_unanswered_request_times_out_and_expires_unserved(broker):
    """A responder that holds the request past the requester's timeout: Timeout, and the
    request (its TTL is the timeout) is not handed to anyone afterwards."""

    async def scenario() -> None:
        slow = await broker.connect("slow")
        requester = await broker.connect("asker")
        try:
            sub = await slow.consume("slow/v1/*", group="slow", prefetch=1)
            task = asyncio.create_task(requester.request("slow/v1/q", {"n": 1}, timeout=0.5))
            first = await sub.get(timeout=5)
            with pytest.raises(Timeout):
                await task
            # The request's TTL started when the broker stored it, a little after the
            # requester's clock: give it that moment, then return it to the queue.
            await asyncio.sleep(0.3)
            assert await first.nack() is True  # back to the queue, already expired
            with pytest.raises(Timeout):
                await sub.get(timeout=1.0)
        finally:
            await requester.close()
            await slow.close()

    run(scenario())


def test_the_handlers_error_reaches_the_requester(broker):
    async def scenario() -> None:
        responder = await broker.connect("resp")
        requester = await broker.connect("asker")
        try:
            def fails(msg: minou.Message) -> Any:
                raise ValueError(f"no price for {msg.payload['item']}")

            await responder.serve("pricing/v1/*", fails)
            with pytest.raises(ResponderError, match="ValueError: no price for tea") as err:
                await requester.request("pricing/v1/q", {"item": "tea"})
            assert err.value.detail["type"] == "ValueError"
            # The failed request was answered (with the error): it does not come back.
            with pytest.raises(ResponderError):
                await requester.request("pricing/v1/q", {"item": "tea"})
        finally:
            await requester.close()
            await responder.close()

    run(scenario())


def test_an_inbox_is_read_by_its_owner_alone(ruled):
    """Not by another client, not by a pattern, not by an admin: whatever the rules say."""

    async def scenario() -> None:
        owner = await ruled.connect("shop-1")
        await owner.serve("orders/v1/x", lambda m: None)  # any subscription works
        thief = await ruled.connect("shop-2")
        admin = await minou.connect(ruled.url, **ruled.admin_auth())
        mine = inbox_of("shop-1", "abc")
        try:
            for client, target in ((thief, mine), (thief, "_inbox/v1/*"),
                                   (thief, "_inbox/*"), (thief, "_dead/" + mine),
                                   (admin, mine), (admin, "_inbox/*")):
                with pytest.raises(NotAuthorized, match="reads inboxes"):
                    await client.listen(target)
                with pytest.raises(NotAuthorized, match="reads inboxes"):
                    await client.consume(target, group="steal")
            with pytest.raises(NotAuthorized, match="reads inboxes"):
                await thief.read(mine)
            # The owner reads its own inboxes by name, with no rule naming them.
            await owner.listen(mine)
            await owner.listen(inbox_of("shop-1", "other"))
        finally:
            for c in (owner, thief, admin):
                await c.close()

    run(scenario())


def test_only_who_was_handed_the_request_writes_the_reply(ruled):
    async def scenario() -> None:
        responder = await ruled.connect("pricing-1")
        requester = await ruled.connect("shop-1")
        intruder = await ruled.connect("pricing-2")
        admin = await minou.connect(ruled.url, **ruled.admin_auth())
        try:
            sub = await responder.consume("pricing/v1/*", group="pricing")
            task = asyncio.create_task(requester.request("pricing/v1/q", {"n": 1}, timeout=10))
            req = await sub.get(timeout=5)
            inbox, correlation = req.headers[REPLY_TO], req.headers[CORRELATION_ID]
            token = req.headers[REPLY_TOKEN]
            good = {CORRELATION_ID: correlation, REQUEST_ID: req.id, REPLY_TOKEN: token}
            # The request as stored (a browse, a range read) carries no token.
            stored = await admin.admin("browse", channel="pricing/v1/q")
            assert REPLY_TOKEN not in stored["messages"][0]["headers"]
            # Straight into the inbox without the token, or with one made up, or with
            # the token and another correlation id or request id: refused, for an admin
            # too.
            for client, headers in ((intruder, {CORRELATION_ID: correlation}),
                                    (admin, {**good, REPLY_TOKEN: "0" * 32}),
                                    (responder, {**good, REPLY_TOKEN: token[:-1] + "x"}),
                                    (responder, {**good, CORRELATION_ID: "nope"}),
                                    (responder, {**good, REQUEST_ID: req.id + "0"})):
                with pytest.raises(NotAuthorized, match="another client's inbox"):
                    await client.send(inbox, "forged", headers=headers)
            # A request may not name another client's inbox for its replies.
            with pytest.raises(NotAuthorized, match="inbox of the requester's own"):
                await intruder.send("pricing/v1/q", 1, headers={
                    REPLY_TO: inbox, CORRELATION_ID: "c"})
            # A request is not staged in a transaction.
            with pytest.raises(BadRequest, match="not staged in a transaction"):
                await responder.stage("t1", [{"channel": inbox, "payload": 1}])
            # The real reply, and nothing forged, reaches the requester; the token is
            # not stored with it.
            await responder.send(inbox, "real", headers=good)
            assert await task == "real"
            assert await req.ack() is True
        finally:
            for c in (responder, requester, intruder, admin):
                await c.close()

    run(scenario())


def test_a_request_delivered_again_after_its_reply_is_not_run_twice(broker):
    """The responder stored its reply and died before its ack: the request comes again,
    marked as answered; an idempotent handler is not run, a plain one is (and its second
    reply is dropped by the broker as a duplicate of the first)."""

    async def scenario(idempotent: bool) -> tuple[Any, int, int]:
        group = f"g-{idempotent}"
        queue = f"jobs{int(idempotent)}"
        first = await broker.connect(f"first-{idempotent}")
        requester = await broker.connect(f"asker-{idempotent}")
        sub = await first.consume(f"{queue}/v1/*", group=group, prefetch=1)
        task = asyncio.create_task(requester.request(f"{queue}/v1/once", {"n": 7}, timeout=20))
        req = await sub.get(timeout=5)
        await first.send(req.headers[REPLY_TO], {"ran": "first"}, headers={
            CORRELATION_ID: req.headers[CORRELATION_ID], REQUEST_ID: req.id,
            REPLY_TOKEN: req.headers[REPLY_TOKEN]})
        answer = await task
        await first.close()  # no ack: the broker delivers it again
        runs = 0

        def handler(msg: minou.Message) -> Any:
            nonlocal runs
            runs += 1
            return {"ran": "second"}

        second = await broker.connect(f"second-{idempotent}")
        await second.serve(f"{queue}/v1/*", handler, group=group, idempotent=idempotent)
        admin = await minou.connect(broker.url, **broker.admin_auth())
        try:
            async def settled() -> bool:
                info = await admin.admin("queue", queue=f"{queue}/v1")
                return info["depth"] == 0 and info["in_flight"] == 0 and \
                    info["delivered"] >= 2

            for _ in range(200):
                if await settled():
                    break
                await asyncio.sleep(0.05)
            assert await settled(), json.dumps(await admin.admin("queue", queue=f"{queue}/v1"))
            stats = await admin.admin("status")
            duplicates = stats["counters"]["duplicates"]
        finally:
            for c in (second, requester, admin):
                await c.close()
        return answer, runs, duplicates

    answer, runs, duplicates = run(scenario(True))
    assert (answer, runs, duplicates) == ({"ran": "first"}, 0, 0)
    answer, runs, duplicates = run(scenario(False))
    assert (answer, runs) == ({"ran": "first"}, 1)
    assert duplicates == 1  # the second run's reply: the same request, stored once


def test_sync_client_request_and_serve(broker):
    with broker.connect_sync("sync-resp") as responder, \
            broker.connect_sync("sync-asker") as requester:
        responder.serve("calc/v1/*", lambda msg: sum(msg.payload), group="calc")
        assert requester.request("calc/v1/sum", [1, 2, 3]) == 6
        with pytest.raises(NoResponders):
            requester.request("calc/v2/sum", [1])


def test_http_request_route(broker):
    headers = bearer(broker, "http-asker")

    async def scenario() -> None:
        responder = await broker.connect("resp")
        try:
            async def quote(msg: minou.Message) -> Any:
                if msg.payload.get("fail"):
                    raise KeyError("fail")
                return {"price": msg.payload["qty"] * 3, "trace": msg.headers.get("trace")}

            await responder.serve("pricing/v1/*", quote)
            async with httpx.AsyncClient(base_url=broker.http, timeout=10) as http:
                r = await http.post("/v1/request/pricing/v1/q?timeout=5", json={"qty": 2},
                                    headers={**headers, "x-minou-header-trace": "t9"})
                assert r.status_code == 200, r.text
                assert r.json() == {"price": 6, "trace": "t9"}
                assert r.headers["x-minou-correlation-id"]
                r = await http.post("/v1/request/pricing/v1/q", json={"fail": True},
                                    headers=headers)
                assert r.status_code == 502, r.text
                assert r.json()["error"]["reason"] == "responder_error"
                assert r.json()["error"]["detail"]["type"] == "KeyError"
                r = await http.post("/v1/request/nobody/v1/q", json={}, headers=headers)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["reason"] == "no_responders"
                for bad in ("0", "-1", "nan", "x", "301"):
                    r = await http.post(f"/v1/request/pricing/v1/q?timeout={bad}", json={},
                                        headers=headers)
                    assert r.status_code == 400, (bad, r.text)
                    assert "timeout must be a number of seconds" in r.text
                sub = await responder.consume("held/v1/*", group="held")
                r = await http.post("/v1/request/held/v1/q?timeout=0.3", json={},
                                    headers=headers)
                assert r.status_code == 504, r.text
                assert r.json()["error"]["reason"] == "reply_timeout"
                await sub.close()
        finally:
            await responder.close()

    run(scenario())


def test_cli_request(broker):
    env = broker.cli_env()
    with broker.connect_sync("cli-resp") as responder:
        responder.serve("calc/v1/*", lambda msg: {"double": msg.payload * 2}, group="calc")
        out = subprocess.run([sys.executable, "-m", "minou", "request", "calc/v1/x", "21",
                              "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"double": 42}
    out = subprocess.run([sys.executable, "-m", "minou", "request", "calc/v1/x", "21"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "no reply:" in out.stderr and "no consumer or listener" in out.stderr



def test_an_http_consumer_answers_a_request_with_its_token(broker):
    headers = bearer(broker, "http-responder")

    async def scenario() -> None:
        requester = await broker.connect("asker")
        try:
            async with httpx.AsyncClient(base_url=broker.http, timeout=10) as http:
                async def respond() -> None:
                    r = await http.post("/v1/consume/quotes/v1/q?group=q&wait=10",
                                        headers=headers)
                    assert r.status_code == 200, r.text
                    req = r.json()
                    h = req["headers"]
                    reply = {f"x-minou-header-{k}": h[k] for k in
                             (CORRELATION_ID, REPLY_TOKEN)}
                    reply["x-minou-header-" + REQUEST_ID] = req["id"]
                    r = await http.post(f"/v1/messages/{h[REPLY_TO]}", json={"price": 3},
                                        headers={**headers, **reply})
                    assert r.status_code == 201, r.text
                    r = await http.post(f"/v1/ack/{req['receipt']}", headers=headers)
                    assert r.status_code == 200, r.text

                waiting = asyncio.create_task(
                    http.post("/v1/consume/quotes/v1/q?group=q&wait=0.1", headers=headers))
                await waiting  # the HTTP consumer's group exists: someone serves
                answering = asyncio.create_task(respond())
                assert await requester.request("quotes/v1/q", {"qty": 1}) == {"price": 3}
                await answering
        finally:
            await requester.close()

    run(scenario())


def test_one_client_cannot_take_every_channel_with_inboxes(broker_factory, tmp_path):
    """Every client writes and reads its own inboxes without a rule, under any instance
    name (``_inbox/v1/<id>!<anything>``): pricing-1, whose rules let it write nothing,
    made one new channel per instance until the broker held ``max_channels``, and from
    then on every other client's first publish to a new channel was refused. One
    client's inboxes are now a tenth of ``max_channels`` at most: past that its new
    inbox is refused (a publish or a listen), precisely, and everyone else goes on."""
    cfg = tmp_path / "rules.toml"
    cfg.write_text("max_channels = 2000\n" + RULES)
    b = broker_factory.make(config=cfg).start()

    async def scenario() -> None:
        hog = await b.connect("pricing-1")
        shop = await b.connect("shop-1")
        responder = await b.connect("pricing-2")
        try:
            with pytest.raises(NotAuthorized):  # it may write nothing...
                await hog.send("pricing/v1/x", 1)
            made = 0
            for start in range(0, 2100, 100):  # ...but its inboxes, as many as it likes
                try:
                    await hog.send_many([(inbox_of("pricing-1", str(n)), n)
                                         for n in range(start, start + 100)])
                except minou.QueueFull as exc:
                    made += sum(1 for r in exc.results if not isinstance(r, Exception))
                    assert "inboxes" in str(exc) and "pricing-1" in str(exc), exc
                    break
                made += 100
            assert made == 200  # 2000 // 10
            # A listen on one more is refused too; those it has go on.
            with pytest.raises(minou.QueueFull, match="inboxes"):
                await hog.listen(inbox_of("pricing-1", "one-more"))
            await hog.send(inbox_of("pricing-1", "7"), "again")
            # Every other client still makes channels, and requests still work.
            await shop.send("pricing/v1/new", 1)
            await responder.serve("pricing/v1/*", _quote, group="pricing")
            assert await shop.request("pricing/v1/q", {"item": "tea", "qty": 2},
                                      timeout=10) == {"item": "tea", "price": 4}
        finally:
            for c in (hog, shop, responder):
                await c.close()

    run(scenario())


def test_one_http_client_cannot_hold_every_connection_with_requests_waiting(broker_factory,
                                                                            tmp_path):
    """``POST /v1/request`` holds its connection until the reply, up to 300 s: a client
    whose requests a responder takes and never answers (its own, or a stuck one) held
    as many connections as it opened, up to ``max_connections``, and every other
    client was refused (503) until they timed out. A request waiting for its reply is
    now one of the client's long polls (``max_long_polls_per_client``): past it, 503
    ``too_many_connections`` naming the client at once, and the others are served."""
    cfg = tmp_path / "limits.toml"
    cfg.write_text("max_connections = 24\nmax_long_polls_per_client = 4\n")
    b = broker_factory.make(config=cfg).start()
    hog, shop = bearer(b, "hog"), bearer(b, "shop")

    async def scenario() -> None:
        responder = await b.connect("resp")
        try:
            await responder.consume("held/v1/*", group="held")  # takes them, never answers
            await responder.serve("pricing/v1/*", _quote, group="pricing")
            limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=b.http, timeout=30, limits=limits) as http:
                held = []
                for _ in range(30):  # one after the other: a refused one frees its socket
                    held.append(asyncio.ensure_future(http.post(
                        "/v1/request/held/v1/q?timeout=25", json={}, headers=hog)))
                    await asyncio.sleep(0.1)
                done, _ = await asyncio.wait(held, timeout=3)
                refused = [t.result() for t in done if not t.exception()]
                assert len(refused) == 26, [r.status_code for r in refused]
                for r in refused:
                    assert r.status_code == 503, r.text
                    error = r.json()["error"]
                    assert error["reason"] == "too_many_connections", error
                    assert error["detail"]["client"] == "hog" and \
                        error["detail"]["limit"] == 4, error
                r = await http.post("/v1/request/pricing/v1/q?timeout=10",
                                    json={"item": "tea", "qty": 2}, headers=shop)
                assert r.status_code == 200, r.text
                assert r.json() == {"item": "tea", "price": 4}
                for t in held:
                    t.cancel()
                await asyncio.gather(*held, return_exceptions=True)
        finally:
            await responder.close()

    run(scenario())
