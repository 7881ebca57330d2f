"""The HTTP API as its users use it: curl-style requests through a real HTTP client
against a real broker process, with real tokens, rules and storage."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import auth, client_key, wait_until

RULES = """
[[rules]]
client = "app-*"
read = ["orders/*", "_dead/orders/*"]
write = ["orders/*"]

[[rules]]
client = "viewer-*"
read = ["orders/*"]

[channels."orders/v1"]
requeue_limit = 1
"""


@pytest.fixture
def http_broker(broker_factory, tmp_path):
    cfg = tmp_path / "http.toml"
    cfg.write_text(RULES)
    return broker_factory.make(config=cfg).start()


def bearer(broker, client_id: str) -> dict[str, str]:
    """A client registers its key once (native HELLO), then signs bearer tokens."""
    with minou.connect_sync(broker.url, **auth(client_id)):
        pass
    key = keyfiles.load_private(client_key(client_id))
    return {"Authorization": f"Bearer {make_token(client_id, key, 'minou', ttl=600)}"}


def admin_bearer(broker) -> dict[str, str]:
    key = keyfiles.load_private(broker.admin_key)
    return {"Authorization": f"Bearer {make_token('admin', key, 'minou', ttl=600)}"}


@pytest.fixture
def http(http_broker):
    with httpx.Client(base_url=http_broker.http, timeout=15) as client:
        yield client


def test_publish_consume_ack_over_http(http_broker, http):
    h = bearer(http_broker, "app-1")
    r = http.post("/v1/messages/orders/v1/42", json={"total": 12.5}, headers=h)
    assert r.status_code == 201, r.text
    published = r.json()
    assert published["seq"] == 1 and published["channel"] == "orders/v1/42"
    r = http.post("/v1/messages/orders/v1/42", params={"payload": "plain text"},
                  headers={**h, "X-Minou-Header-Source": "curl"})
    assert r.status_code == 201 and r.json()["seq"] == 2
    got = http.post("/v1/consume/orders/v1/42", params={"group": "billing", "wait": 2},
                    headers=h)
    assert got.status_code == 200, got.text
    first = got.json()
    assert first["payload"] == {"total": 12.5} and first["id"] == published["id"]
    second = http.post("/v1/consume/orders/v1/*", params={"group": "billing", "wait": 2},
                       headers=h)
    # A different pattern is a different consumer of the same group: it gets message 2.
    assert second.status_code == 200 and second.json()["payload"] == "plain text"
    assert second.json()["headers"] == {"source": "curl"}
    assert http.post(f"/v1/ack/{first['receipt']}", headers=h).json()["settled"] == "ack"
    again = http.post(f"/v1/ack/{first['receipt']}", headers=h)
    assert again.status_code == 404 and again.json()["error"]["reason"] == "unknown_delivery"
    # Nothing more: a long-poll that times out answers 204.
    t0 = time.monotonic()
    empty = http.post("/v1/consume/orders/v1/42", params={"group": "billing", "wait": 0.5},
                      headers=h)
    assert empty.status_code == 204 and time.monotonic() - t0 >= 0.45


def test_a_channel_id_is_the_same_whether_the_endpoint_is_percent_encoded_or_not(
        http_broker):
    """The id is taken from the path as sent (ids are URL-encoded inside channel names);
    an endpoint or version sent percent-encoded ("ord%65rs", "v%31") made it fall back to
    the decoded id: "a%2Fb" was refused as "a/b" and "a%252F" stored in "a%2F"."""
    u = http_broker.http.removeprefix("http://")
    host, port = u.rsplit(":", 1)
    token = bearer(http_broker, "app-enc")["Authorization"].encode()

    def post(path: str) -> tuple[int, dict[str, Any]]:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                      b"Authorization: " + token + b"\r\ncontent-type: application/json"
                      b"\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body or b"{}")

    for path, channel in [("/v1/messages/orders/v1/a%2Fb", "orders/v1/a%2Fb"),
                          ("/v1/messages/ord%65rs/v1/a%2Fb", "orders/v1/a%2Fb"),
                          ("/v1/messages/orders/v%31/a%2Fb", "orders/v1/a%2Fb"),
                          ("/v1/messages/orders/v1/a%252F", "orders/v1/a%252F"),
                          ("/v1/messages/ord%65rs/v1/a%252F", "orders/v1/a%252F")]:
        status, answer = post(path)
        assert (status, answer.get("channel")) == (201, channel), (path, answer)
    status, got = post("/v1/consume/ord%65rs/v1/a%2Fb?group=g&wait=1")
    assert status == 200 and got["channel"] == "orders/v1/a%2Fb", got


def test_long_poll_wakes_when_a_message_arrives(http_broker, http):
    h = bearer(http_broker, "app-2")

    async def scenario() -> tuple[int, float]:
        async with httpx.AsyncClient(base_url=http_broker.http, timeout=15) as c:
            waiting = asyncio.create_task(c.post("/v1/consume/orders/v1/7",
                                                 params={"group": "g", "wait": 10}, headers=h))
            # Publish only once the long poll is in: the group has its (HTTP) member.
            deadline = time.monotonic() + 10
            while not await _group_has_a_member(c, http_broker, "consume:g"):
                assert time.monotonic() < deadline, "the long poll never arrived"
                await asyncio.sleep(0.02)
            t0 = time.monotonic()
            await c.post("/v1/messages/orders/v1/7", json={"n": 1}, headers=h)
            r = await waiting
            return r.status_code, time.monotonic() - t0

    status, took = asyncio.run(scenario())
    assert status == 200 and took < 5


def test_a_queue_shows_its_rates_and_its_last_minutes(http_broker, http):
    """Each queue's rates come from the once-a-second sample of its channels (a tuple
    per queue since a flat key per queue and counter was most of the CPU at 100,000
    queues): published, delivered and acked show in the queue's view, its history and
    its diagnosis; a queue with nothing going on shows none."""
    h, admin = bearer(http_broker, "app-2"), admin_bearer(http_broker)
    for i in range(6):
        http.post(f"/v1/messages/orders/v1/{i % 2}", json={"n": i}, headers=h)
        http.post("/v1/messages/orders/v2/0", json={"n": i}, headers=h)
        got = http.post("/v1/consume/orders/v1/*", params={"group": "rates", "wait": 2},
                        headers=h).json()
        assert http.post(f"/v1/ack/{got['receipt']}", headers=h).status_code == 200
        time.sleep(0.3)

    def rates(queue: str) -> dict[str, float]:
        return http.get(f"/v1/queues/{queue}", headers=admin).json()["rates"]

    wait_until(lambda: rates("orders/v1")["acked"] > 0, what="the acks' rate")
    busy = http.get("/v1/queues/orders/v1", headers=admin).json()
    # 6 published; a rate over a second or more (the sampler's clock may read a hair less)
    assert 0 < busy["rates"]["published"] <= 6.1 and busy["rates"]["schema_refused"] == 0
    assert busy["rates"]["delivered"] > 0
    assert rates("orders/v2")["delivered"] == 0 < rates("orders/v2")["published"]
    listed = {q["queue"]: q["rates"] for q in
              http.get("/v1/queues", headers=admin).json()["queues"]}
    assert listed["orders/v1"]["published"] > 0 and listed["orders/v2"]["acked"] == 0

    def history(queue: str) -> dict[str, Any]:
        return http.get("/v1/rates/history", params={"queue": queue}, headers=admin).json()

    # A chart's point is the rate between two samples: the first one with the queue
    # in it has none, the next (about a second later) has one.
    wait_until(lambda: any(history("orders/v1")["published"][1:]), what="a chart's point")
    # A queue of more channels than the sampler sums at once (RATE_SAMPLE_LOOK): in parts.
    with minou.connect_sync(http_broker.url, **auth("app-2")) as native:
        native.send_many([(f"orders/v3/{i}", {"n": i}) for i in range(600)])
    wait_until(lambda: rates("orders/v3")["published"] > 0, what="the many channels' rate")
    # The chart's points add up to the 600 published, however commits and samples fell.
    def charted() -> float:
        h = history("orders/v3")
        return sum(rate * (h["t"][i] - h["t"][i - 1])
                   for i, rate in enumerate(h["published"]) if i and rate)

    wait_until(lambda: charted() == pytest.approx(600, abs=1), what="600 on the chart")


async def _group_has_a_member(c: httpx.AsyncClient, broker, group: str) -> bool:
    r = await c.get("/v1/queues/orders/v1", headers=admin_bearer(broker))
    return any(g.get("group") == group and g.get("members", 0) >= 1
               for g in r.json().get("groups", []))


def test_nack_with_delay_and_dead_letter_after_the_requeue_limit(http_broker, http):
    h = bearer(http_broker, "app-3")
    message_id = http.post("/v1/messages/orders/v1/9", json={"bad": True}, headers=h).json()["id"]
    for _ in range(2):  # requeue_limit = 1: the second return dead-letters it
        d = http.post("/v1/consume/orders/v1/9", params={"group": "w", "wait": 3},
                      headers=h).json()
        r = http.post(f"/v1/nack/{d['receipt']}", params={"delay": 0.2, "front": "false"},
                      headers=h)
        assert r.status_code == 200, r.text
    dead = http.post("/v1/consume/_dead/orders/v1/9", params={"group": "ops", "wait": 3},
                     headers=h)
    assert dead.status_code == 200, dead.text
    assert dead.json()["headers"]["x-dead-reason"] == "requeue_limit"
    receipt = http.get(f"/v1/messages/{message_id}/receipt", headers=h).json()
    assert receipt["state"] == "dead_lettered"
    assert receipt["dead_letter"]["reason"] == "requeue_limit"


def test_the_same_message_crosses_protocols(http_broker, http):
    h = bearer(http_broker, "app-4")
    with minou.connect_sync(http_broker.url, **auth("app-4")) as native:
        sub = native.consume("orders/v2/*", group="x")
        http.post("/v1/messages/orders/v2/1", json={"from": "http"}, headers=h)
        msg = sub.get(timeout=5)
        assert msg.payload == {"from": "http"} and msg.ack()
        native.send("orders/v3/1", {"from": "native"})
    got = http.post("/v1/consume/orders/v3/1", params={"wait": 3}, headers=h).json()
    assert got["payload"] == {"from": "native"}


def test_authentication_and_rules_over_http(http_broker, http):
    none = http.post("/v1/messages/orders/v1/1", json={})
    assert none.status_code == 401 and "Bearer" in none.headers["www-authenticate"]
    assert none.json()["error"]["reason"] == "not_authenticated"
    garbage = http.get("/v1/whoami", headers={"Authorization": "Bearer x.y.z"})
    assert garbage.status_code == 401
    basic = http.get("/v1/whoami", headers={"Authorization": "Basic abc"})
    assert basic.status_code == 401 and "Bearer" in basic.json()["error"]["message"]
    viewer = bearer(http_broker, "viewer-1")
    assert http.get("/v1/whoami", headers=viewer).json()["client_id"] == "viewer-1"
    forbidden = http.post("/v1/messages/orders/v1/1", json={}, headers=viewer)
    assert forbidden.status_code == 403
    assert "may not write to 'orders/v1/1'" in forbidden.json()["error"]["message"]
    for path in ("/v1/queues", "/metrics", "/v1/clients", "/status/nagios/orders/v1"):
        r = http.get(path, headers=viewer)
        assert r.status_code == 403 and "admin" in r.json()["error"]["message"], path
    # Another client's receipt is not yours to settle.
    app = bearer(http_broker, "app-5")
    http.post("/v1/messages/orders/v1/5", json={"n": 5}, headers=app)
    d = http.post("/v1/consume/orders/v1/5", params={"wait": 3}, headers=app).json()
    stolen = http.post(f"/v1/ack/{d['receipt']}", headers=bearer(http_broker, "app-6"))
    assert stolen.status_code == 404
    assert http.post(f"/v1/ack/{d['receipt']}", headers=app).status_code == 200
    # Revocation applies to a token already in use.
    with minou.connect_sync(http_broker.url, **http_broker.admin_auth()) as a:
        a.admin("clients.revoke", client_id="viewer-1")
    revoked = http.get("/v1/whoami", headers=viewer)
    assert revoked.status_code == 401 and "revoked" in revoked.json()["error"]["message"]
    with minou.connect_sync(http_broker.url, **http_broker.admin_auth()) as a:
        refused = a.admin("status")["counters"]["refused"]
    assert refused["not_authenticated"] >= 3 and refused["not_authorized"] >= 5


def test_broker_token_is_an_admin_bearer(broker_factory, tmp_path):
    cfg = tmp_path / "bt.toml"
    cfg.write_text('[auth]\nbroker_token = "a-long-shared-secret"\n' + RULES)
    broker = broker_factory.make(config=cfg).start()
    with httpx.Client(base_url=broker.http) as http:
        h = {"Authorization": "Bearer a-long-shared-secret"}
        assert http.get("/v1/whoami", headers=h).json()["method"] == "broker_token"
        assert http.post("/v1/messages/any/v1/1", json=1, headers=h).status_code == 201
        assert http.get("/v1/queues", headers=h).status_code == 200


def test_metrics_parse_with_prometheus_own_parser(http_broker, http):
    h = bearer(http_broker, "app-7")
    for i in range(3):
        http.post("/v1/messages/orders/v1/m", json={"i": i}, headers=h)
    d = http.post("/v1/consume/orders/v1/m", params={"wait": 3}, headers=h).json()
    http.post(f"/v1/ack/{d['receipt']}", headers=h)
    for i in range(2):  # another channel of the queue: the queue's series sum both
        http.post("/v1/messages/orders/v1/n", json={"i": i}, headers=h)
    held = http.post("/v1/consume/orders/v1/n", params={"wait": 3, "group": "held"},
                     headers=h)
    assert held.status_code == 200  # delivered, not settled
    http.post("/v1/messages/orders/x/m", json={}, headers=h)  # refused: bad version
    r = http.get("/metrics", headers=admin_bearer(http_broker))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert samples[("kitten_mq_messages_received_count", ())] == 5
    assert samples[("kitten_mq_messages_sent_count", ())] == 2
    assert samples[("kitten_mq_messages_acked_count", ())] == 1
    queue = (("queue", "orders/v1"),)
    assert samples[("kitten_mq_queue_messages_count", queue)] == 5
    assert samples[("minou_queue_depth", queue)] == 4
    assert samples[("minou_queue_unsettled", queue)] == 1
    assert samples[("minou_queue_oldest_age_seconds", queue)] > 0
    assert samples[("minou_requests_refused_total", (("reason", "invalid_channel"),))] == 1
    assert samples[("kitten_mq_info_uptime", ())] > 0
    assert samples[("minou_storage_commit_duration_seconds_count", ())] > 0
    assert samples[("minou_delivery_latency_seconds_count", ())] == 2
    assert samples[("minou_ack_latency_seconds_count", ())] == 1
    assert ("kitten_mq_messages_received_per_seconds_average", ()) in samples
    assert http.get("/statistics", headers=admin_bearer(http_broker)).text.count(
        "kitten_mq_messages_received_count") >= 1


def test_a_scrape_lists_the_first_queues_and_groups_past_metrics_max_queues(broker_factory,
                                                                          tmp_path):
    """``metrics_max_queues``: past it the first queues and reader groups by name keep
    their series, the rest are counted (and said in the log); a reload raises it."""
    cfg = tmp_path / "few.toml"
    cfg.write_text("metrics_max_queues = 2\n" + RULES)
    broker = broker_factory.make(config=cfg).start()
    with httpx.Client(base_url=broker.http, timeout=30) as http:
        h, admin = bearer(broker, "app-8"), admin_bearer(broker)
        names = ["orders/v3", "orders/v1", "orders/v4", "orders/v2"]
        for name in names:  # a reader group of its own each: g3, g1, g4, g2
            assert http.post(f"/v1/messages/{name}/1", json={}, headers=h).status_code == 201
            consumed = http.post(f"/v1/consume/{name}/1",
                                 params={"wait": 3, "group": f"g{name[-1]}"}, headers=h)
            assert consumed.status_code == 200

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            r = http.get("/metrics", headers=admin)
            assert r.status_code == 200
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(r.text)
                    for s in family.samples}

        samples = scrape()
        assert sorted(dict(labels)["queue"] for n, labels in samples
                      if n == "minou_queue_depth") == ["orders/v1", "orders/v2"]
        assert samples[("minou_metrics_series_omitted", (("kind", "queue"),))] == 2
        groups = [dict(labels)["group"] for n, labels in samples if n == "minou_group_lag"]
        assert groups == ["consume:g1", "consume:g2"]
        assert samples[("minou_metrics_series_omitted", (("kind", "group"),))] == 2
        assert samples[("kitten_mq_messages_received_count", ())] == 4  # totals: all
        wait_until(lambda: "metrics_max_queues = 2" in broker.output)
        scrape()
        assert broker.output.count("past metrics_max_queues") == 1  # once an hour

        cfg.write_text("metrics_max_queues = 10\n" + RULES)
        assert http.post("/v1/admin/reload", headers=admin).status_code == 200
        samples = scrape()
        assert sorted(dict(labels)["queue"] for n, labels in samples
                      if n == "minou_queue_depth") == sorted(names)
        assert samples[("minou_metrics_series_omitted", (("kind", "queue"),))] == 0
        assert samples[("minou_metrics_series_omitted", (("kind", "group"),))] == 0


def test_scrapes_that_come_while_one_is_made_get_its_text(http_broker, http):
    """Concurrent scrapes share the one being made instead of each holding a snapshot
    of its own while they wait for the metrics thread: same text, uptime and all."""
    with minou.connect_sync(http_broker.url, **auth("app-2")) as native:
        native.send_many([(f"orders/v{i}/c", {"n": i}) for i in range(1, 3001)])
    admin = admin_bearer(http_broker)

    async def scrapes() -> list[str]:
        async with httpx.AsyncClient(base_url=http_broker.http, timeout=30) as c:
            answers = await asyncio.gather(*(c.get("/metrics", headers=admin)
                                             for _ in range(8)))
        assert all(a.status_code == 200 for a in answers)
        return [a.text for a in answers]

    texts = asyncio.run(scrapes())
    assert len(set(texts)) < len(texts)  # made apart, each would say another uptime
    for text in set(texts):
        depths = [s for f in text_string_to_metric_families(text)
                  if f.name == "minou_queue_depth" for s in f.samples]
        assert len(depths) == 3000
    later = http.get("/metrics", headers=admin)  # the shared one over: a new scrape
    assert later.status_code == 200 and later.text not in texts


def test_nagios_and_queue_status(http_broker, http):
    h = bearer(http_broker, "app-8")
    admin = admin_bearer(http_broker)
    http.post("/v1/messages/orders/v1/n", json={"n": 1}, headers=h)
    http.post("/v1/consume/orders/v1/n", params={"group": "slow", "wait": 0}, headers=h)
    ok = http.get("/status/nagios/orders/v1", params={"minutes": 5}, headers=admin)
    assert ok.text.startswith("OK - orders/v1") and ok.headers["x-nagios-exit"] == "0"
    assert "| oldest_age=" in ok.text
    time.sleep(1.2)
    warn = http.get("/status/nagios/orders/v1", params={"minutes": 0.015}, headers=admin)
    assert warn.text.startswith("WARNING"), warn.text
    assert warn.headers["x-nagios-exit"] == "1"
    crit = http.get("/status/nagios/orders/v1/n", params={"minutes": 0.005, "group":
                                                          "consume:slow"}, headers=admin)
    assert crit.text.startswith("CRITICAL") and crit.headers["x-nagios-exit"] == "2"
    unknown = http.get("/status/nagios/nothing/v1", headers=admin)
    assert unknown.text.startswith("UNKNOWN") and unknown.headers["x-nagios-exit"] == "3"
    status = http.get("/status/queues/orders/v1", headers=admin).json()
    assert status["depth"] == 1 and status["unsettled"] == 1 and status["consumers"] == 1
    assert status["oldest_age_s"] >= 1.0
    # Waiting and in flight are named apart, each with the age of its own oldest.
    assert (status["waiting"], status["in_flight"]) == (0, 1)
    assert status["oldest_in_flight_age_s"] >= 1.0 and status["oldest_waiting_age_s"] is None
    assert "; 0 waiting (oldest none), 1 in flight (oldest 1 s)" in warn.text, warn.text
    assert " waiting=0;;;0 in_flight=1;;;0 " in warn.text and " unsettled=1;;;0 " in warn.text


def test_an_http_consumer_with_no_request_waiting_holds_nothing(http_broker, http):
    h = bearer(http_broker, "app-20")
    admin = admin_bearer(http_broker)
    consume = {"group": "pollers", "wait": 0}
    http.post("/v1/messages/orders/v1/p", json={"n": 1}, headers=h)
    got = http.post("/v1/consume/orders/v1/p", params=consume, headers=h)
    assert http.post(f"/v1/ack/{got.json()['receipt']}", headers=h).status_code == 200
    assert http.post("/v1/consume/orders/v1/p", params=consume, headers=h).status_code == 204
    http.post("/v1/messages/orders/v1/p", json={"n": 2}, headers=h)
    status = http.get("/status/queues/orders/v1", headers=admin).json()
    assert (status["waiting"], status["in_flight"], status["consumers"]) == (1, 0, 1)
    # Not "flowing", not "deliveries should follow": its one consumer is not asking.
    assert status["diagnosis"].startswith(
        "Nobody is asking for messages: 1 HTTP consumer(s) are connected but no consume "
        "request is waiting"), status["diagnosis"]
    listed = http.get("/v1/queues", headers=admin).json()["queues"]
    (row,) = [q for q in listed if q["queue"] == "orders/v1"]
    assert (row["waiting"], row["in_flight"]) == (1, 0) and row["oldest_waiting_age_s"] >= 0
    # Another consumer of the group gets it at once; the poller's next request gets none.
    with minou.connect_sync(http_broker.url, **auth("app-21")) as c:
        msg = c.consume("orders/v1/*", group="pollers").get(timeout=5)
        assert msg.payload == {"n": 2} and msg.attempts == 1
        assert msg.ack()


def test_a_consume_whose_client_left_does_not_keep_the_next_message(http_broker, http):
    """A long poll on the Starlette path (``Expect: 100-continue`` sends it there) whose
    client disconnects stops waiting: the message published next goes to a consumer that
    is there, not into an answer nobody reads (it was leased to nobody for a minute)."""
    h = bearer(http_broker, "app-22")
    host, port = http_broker.http.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall((f"POST /v1/consume/orders/v1/gone?group=leavers&wait=20 HTTP/1.1\r\n"
                      f"Host: {host}\r\nAuthorization: {h['Authorization']}\r\n"
                      "Expect: 100-continue\r\nContent-Length: 0\r\n\r\n").encode())
        admin = admin_bearer(http_broker)
        wait_until(lambda: any(
            g["group"] == "consume:leavers" and g["members"] == 1
            for g in http.get("/v1/queues", headers=admin).json()["groups"]), 10,
            what="the long poll to wait")
    http.post("/v1/messages/orders/v1/gone", json={"n": 3}, headers=h)
    with minou.connect_sync(http_broker.url, **auth("app-23")) as c:
        msg = c.consume("orders/v1/gone", group="leavers").get(timeout=5)
        assert msg.payload == {"n": 3} and msg.attempts == 1
        assert msg.ack()


def test_admin_routes_that_change_state_refuse_arguments_they_would_ignore(http_broker,
                                                                          http):
    """A purge given its channel as a JSON body, or as a misspelt parameter, emptied
    every channel of the queue (the route read neither and went on without them), and a
    requeue given ``{"seqs": ...}`` moved every dead letter. Now: 400 naming what the
    route takes, counted, nothing done."""
    h = bearer(http_broker, "app-7")
    admin = admin_bearer(http_broker)
    for channel in ("a", "b"):
        http.post(f"/v1/messages/orders/v1/{channel}", json={"c": channel}, headers=h)

    def depths() -> dict[str, int]:
        return {c["channel"]: c["depth"] for c in http.get(
            "/v1/queues/orders/v1", headers=admin).json()["channels"]}

    def refused() -> int:
        return http.get("/v1/status", headers=admin).json()["counters"]["refused"].get(
            "bad_request", 0)

    before = refused()
    for kw in ({"json": {"channel": "a"}}, {"params": {"chanel": "a"}},
               {"content": b"channel=a"}):
        r = http.post("/v1/queues/orders/v1/purge", headers=admin, **kw)
        assert r.status_code == 400, r.text
        assert "(it takes: channel); nothing was done" in r.json()["error"]["message"]
    r = http.post("/v1/dead/orders/v1/requeue", json={"seqs": "1"}, headers=admin)
    assert r.status_code == 400 and "takes no body" in r.json()["error"]["message"]
    r = http.post("/v1/credentials", params={"ttl": "60"}, headers=h)  # ttl is in the body
    assert r.status_code == 400 and "'ttl'" in r.json()["error"]["message"]
    assert refused() == before + 5
    assert depths() == {"orders/v1/a": 1, "orders/v1/b": 1}
    purged = http.post("/v1/queues/orders/v1/purge", params={"channel": "a"}, headers=admin)
    assert purged.status_code == 200 and purged.json()["messages"] == 1
    assert depths() == {"orders/v1/a": 0, "orders/v1/b": 1}
    token = admin["Authorization"].removeprefix("Bearer ")  # as the dashboard's links do
    r = http.post("/v1/queues/orders/v1/purge", params={"channel": "b",
                                                        "access_token": token})
    assert r.status_code == 200 and r.json()["messages"] == 1


def test_admin_routes_browse_purge_requeue_delete(http_broker, http):
    h = bearer(http_broker, "app-9")
    admin = admin_bearer(http_broker)
    for i in range(5):
        http.post("/v1/messages/orders/v1/b", json={"i": i}, headers={
            **h, "X-Minou-Header-Trace": f"t{i}"})
    page = http.get("/v1/queues/orders/v1/b/messages", params={"limit": 2}, headers=admin)
    body = page.json()
    assert [m["payload"] for m in body["messages"]] == [{"i": 0}, {"i": 1}]
    assert body["messages"][0]["headers"] == {"trace": "t0"} and body["next_seq"] == 3
    rest = http.get("/v1/queues/orders/v1/b/messages", params={"from_seq": body["next_seq"]},
                    headers=admin).json()
    assert [m["seq"] for m in rest["messages"]] == [3, 4, 5]
    inspect = http.get("/v1/queues/orders/v1", headers=admin).json()
    assert inspect["depth"] == 5 and inspect["options"]["requeue_limit"] == 1
    listing = http.get("/v1/queues", headers=admin).json()
    assert any(q["queue"] == "orders/v1" and q["depth"] == 5 for q in listing["queues"])
    gone = http.delete("/v1/queues/orders/v1/b/messages/2", headers=admin)
    assert gone.json() == {"channel": "orders/v1/b", "deleted": [2], "messages": 1}
    assert http.delete("/v1/queues/orders/v1/b/messages/2", headers=admin).json()[
        "messages"] == 0
    assert http.delete("/v1/queues/orders/v1/b/messages/2", headers=h).status_code == 403
    for bad in ("abc", "0", "-1", str(2**60)):  # not a message seq: said, nothing deleted
        r = http.delete(f"/v1/queues/orders/v1/b/messages/{bad}", headers=admin)
        assert r.status_code == 400 and "is not a message seq" in r.json()["error"]["message"]
    too_many = ",".join(str(n) for n in range(1, 1002))
    r = http.post("/v1/dead/orders/v1/requeue", params={"seqs": too_many}, headers=admin)
    assert r.status_code == 400 and "at most 1000 seqs" in r.json()["error"]["message"]
    assert [m["seq"] for m in http.get("/v1/queues/orders/v1/b/messages",
                                       headers=admin).json()["messages"]] == [1, 3, 4, 5]
    purged = http.post("/v1/queues/orders/v1/purge", params={"channel": "b"}, headers=admin)
    assert purged.json()["messages"] == 4
    assert http.get("/v1/queues/orders/v1", headers=admin).json()["depth"] == 0
    # Dead letters: make two, requeue them, consume them again.
    for i in range(2):
        http.post("/v1/messages/orders/v1/d", json={"d": i}, headers=h)
    for _ in range(4):
        d = http.post("/v1/consume/orders/v1/d", params={"group": "dl", "wait": 3},
                      headers=h).json()
        http.post(f"/v1/nack/{d['receipt']}", headers=h)
    wait_until(lambda: http.get("/v1/queues/_dead/orders/v1", headers=admin).json()[
        "depth"] == 2, 10, what="two dead letters")
    moved = http.post("/v1/dead/orders/v1/requeue", headers=admin).json()
    assert moved["messages"] == 2
    back = http.post("/v1/consume/orders/v1/d", params={"group": "dl", "wait": 3}, headers=h)
    assert back.json()["payload"] in ({"d": 0}, {"d": 1}) and back.json()["attempts"] == 1
    assert "x-dead-reason" not in back.json()["headers"]
    # A durable group nobody will use again can be deleted.
    with minou.connect_sync(http_broker.url, **auth("app-9")) as c:
        c.listen("orders/v9/*", name="gone").close()
    groups = {g["group"] for g in http.get("/v1/queues", headers=admin).json()["groups"]}
    assert "listen:app-9:gone" in groups
    deleted = http.delete("/v1/groups/listen:app-9:gone", headers=admin)
    assert deleted.status_code == 200, deleted.text
    missing = http.delete("/v1/groups/listen:app-9:gone", headers=admin)
    assert missing.status_code == 404 and "no group" in missing.json()["error"]["message"]


def test_receipt_follows_a_message(http_broker, http):
    h = bearer(http_broker, "app-10")
    mid = http.post("/v1/messages/orders/v1/r", json={"r": 1}, headers=h).json()["id"]
    http.post("/v1/consume/orders/v1/zz", params={"group": "other", "wait": 0}, headers=h)
    assert http.get(f"/v1/messages/{mid}/receipt", headers=h).json()["state"] == "stored"
    d = http.post("/v1/consume/orders/v1/r", params={"group": "rg", "wait": 3},
                  headers=h).json()
    receipt = http.get(f"/v1/messages/{mid}/receipt", headers=h).json()
    assert receipt["state"] == "delivered"
    assert receipt["groups"] == [{"group": "consume:rg", "state": "delivered", "attempts": 1}]
    http.post(f"/v1/ack/{d['receipt']}", headers=h)
    wait_until(lambda: http.get(f"/v1/messages/{mid}/receipt", headers=h).json()["state"]
               in ("acked", "removed"), 5, what="acked")
    assert http.get("/v1/messages/ffffffffffffffff1/receipt", headers=h).status_code == 404


def test_stream_over_websocket(http_broker):
    import websockets.sync.client as wsc

    h = bearer(http_broker, "app-11")
    url = http_broker.http.replace("http://", "ws://") + "/v1/stream"
    with wsc.connect(url, additional_headers=h) as ws:
        ws.send(json.dumps({"op": "consume", "pattern": "orders/v1/*", "group": "ws",
                            "prefetch": 5, "ref": "sub"}))
        assert json.loads(ws.recv(5))["type"] == "subscribed"
        ws.send(json.dumps({"op": "publish", "channel": "orders/v1/s", "payload": {"w": 1},
                            "ref": "p1"}))
        seen = {}
        while "message" not in seen or "published" not in seen:
            m = json.loads(ws.recv(5))
            seen[m["type"]] = m
        assert seen["published"]["ref"] == "p1" and seen["message"]["payload"] == {"w": 1}
        ws.send(json.dumps({"op": "ack", "receipt": seen["message"]["receipt"]}))
        assert json.loads(ws.recv(5)) == {"type": "settled",
                                          "receipt": seen["message"]["receipt"], "op": "ack"}
        ws.send(json.dumps({"op": "publish", "channel": "secret/v1/1", "payload": 1}))
        err = json.loads(ws.recv(5))
        assert err["type"] == "error" and err["reason"] == "not_authorized"
        ws.send("not json")
        assert json.loads(ws.recv(5))["reason"] == "bad_request"
    # Refused before the upgrade: no token, no socket.
    with pytest.raises(Exception, match="HTTP 403"), wsc.connect(url) as ws:
        ws.recv(5)


def test_openapi_document_is_served(http_broker, http):
    doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/messages/{endpoint}/{version}/{id}",
                 "/v1/consume/{endpoint}/{version}/{id}",
                 "/v1/ack/{receipt}", "/v1/nack/{receipt}", "/metrics", "/statistics",
                 "/status/nagios/{endpoint}/{version}", "/status/queues/{endpoint}/{version}",
                 "/health",
                 "/v1/messages/{message_id}/receipt", "/v1/queues/{endpoint}/{version}/purge",
                 "/v1/dead/{endpoint}/{version}/requeue",
                 "/v1/queues/{endpoint}/{version}/{id}/messages/{seq}"):
        assert path in doc["paths"], path
    assert http.get("/health").json()["status"] == "ok"


def test_batch_publish_one_result_per_message(http_broker, http):
    h = bearer(http_broker, "app-12")
    batch = [{"channel": "orders/v1/batch", "payload": {"n": i}, "headers": {"k": "v"}}
             for i in range(3)]
    batch.append({"channel": "secret/v1/1", "payload": 1})  # refused alone by the rules
    batch.append({"channel": "orders/v1/batch", "payload": 4, "priority": 12})  # bad priority
    r = http.post("/v1/messages", json=batch, headers=h)
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x.get("seq") for x in results[:3]] == [1, 2, 3]
    assert results[3]["error"]["reason"] == "not_authorized"
    assert results[4]["error"]["reason"] == "bad_request"
    assert http.post("/v1/messages", json=[], headers=h).status_code == 400
    assert http.post("/v1/messages", json=[{"channel": "a/v1/1"}], headers=h).status_code == 400
    got = [http.post("/v1/consume/orders/v1/batch", params={"wait": 2}, headers=h).json()
           for _ in range(3)]
    assert [g["payload"] for g in got] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_clean_stop_answers_the_long_polls_waiting_and_does_not_wait_for_them(broker):
    """SIGTERM with three long polls waiting 30 s: a consume and a KV watch are
    answered at once with nothing (204, no entries), a request awaiting its reply with
    503 shutting_down; the stop does not wait for them (it waited 5 s for them, then
    closed the sockets unanswered)."""
    import threading

    headers = bearer(broker, "poller")
    holder = broker.connect_sync("holder")
    held = holder.consume("held/v1/*", group="held")  # takes the request, never answers
    holder.kv("flags").put("a", 1)
    answers: dict[str, Any] = {}

    def poll(name: str, method: str, path: str, **kw: Any) -> None:
        with httpx.Client(base_url=broker.http, headers=headers, timeout=40) as http:
            r = http.request(method, path, **kw)
            answers[name] = (r.status_code, r.json() if r.content else None)

    waits = [threading.Thread(target=poll, args=a, kwargs=kw) for a, kw in (
        (("consume", "POST", "/v1/consume/poll/v1/*"), {"params": {"group": "g",
                                                                   "wait": 30}}),
        (("watch", "GET", "/v1/kv-watch/flags"), {"params": {"after": 1, "wait": 30}}),
        (("request", "POST", "/v1/request/held/v1/q"), {"params": {"timeout": 30},
                                                        "json": {}}))]
    for t in waits:
        t.start()
    admin = admin_bearer(broker)

    def polling() -> bool:
        text = httpx.get(f"{broker.http}/metrics", headers=admin, timeout=10).text
        return any(line.startswith('minou_group_members{group="consume:g"}')
                   and not line.endswith(" 0.0") for line in text.splitlines())

    wait_until(polling, 10, what="the long poll to wait in group g")
    held.get(timeout=10)  # the request reached its responder: its asker is waiting
    # (The watch shows nothing from outside; its thread started before the request's.)
    assert broker.stop() == 0
    for t in waits:
        t.join(10)
    holder.close()
    assert answers["consume"] == (204, None)  # (an empty reply before)
    assert answers["watch"][0] == 200 and answers["watch"][1]["entries"] == []
    assert answers["request"][0] == 503
    assert answers["request"][1]["error"]["reason"] == "shutting_down"
