"""HTTP answers a client asks for and never reads: the broker holds them a bounded time
and a bounded amount in all (server/http_unread.py), and a client that reads is served.

Before, each socket kept its whole answer in the broker until read: 100 sockets asking
a 4.5 MB KV watch page and reading nothing held 434 MiB, still held 25 s later (the idle
timeout's close waits for the buffer to drain); max_connections of them, 40 GB."""

from __future__ import annotations

import socket
from typing import Any

import httpx

import minou
from minou.limits import HTTP_UNSENT_BYTES

from ..conftest import wait_until
from .test_http_api import bearer
from .test_slow_consumers import _anon_mib, _steady_anon_mib

PAGE = 5 * 900_000  # one KV watch page: every value of the bucket


def fill_bucket(broker: Any) -> None:
    with broker.connect_sync("app-w") as c:
        bucket = c.kv("wide")
        for i in range(5):
            bucket.put(f"k{i}", "x" * 900_000)


def silent_askers(broker: Any, n: int, token: str) -> list[socket.socket]:
    """``n`` sockets with a tiny receive window, each asking the page once and reading
    nothing."""
    out = []
    request = (f"GET /v1/kv-watch/wide?after=0 HTTP/1.1\r\nHost: t\r\n"
               f"Authorization: {token}\r\n\r\n").encode()
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", broker.http_port))
        s.sendall(request)
        out.append(s)
    return out


def flow_status(broker: Any) -> dict[str, Any]:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        return a.admin("status")["flow"]


def cut_so_far(broker: Any) -> int:
    return int(flow_status(broker)["slow_consumers_cut"])


def served_whole(broker: Any, token: str) -> None:
    """A client that reads its answer gets the whole bucket page."""
    with httpx.Client(base_url=broker.http, timeout=30) as http:
        page = http.get("/v1/kv-watch/wide", params={"after": 0},
                        headers={"Authorization": token})
        assert page.status_code == 200 and len(page.json()["entries"]) == 5


def test_http_sockets_reading_no_answer_are_cut_after_slow_consumer_seconds(
        broker_factory, tmp_path):
    cfg = tmp_path / "stall.toml"
    cfg.write_text("slow_consumer_seconds = 2\n")
    broker = broker_factory.make(config=cfg).start()
    fill_bucket(broker)
    token = bearer(broker, "app-r")["Authorization"]
    before = _anon_mib(broker.proc.pid)
    silent = silent_askers(broker, 40, token)  # 180 MB of answers asked for
    try:
        wait_until(lambda: cut_so_far(broker) >= 40, 30, what="the 40 silent sockets cut")
        grown = _steady_anon_mib(broker.proc.pid) - before
        assert grown < 60, f"40 cut sockets still hold {grown:.0f} MiB"
        assert "HTTP connection from" in broker.log_path.read_text()
        served_whole(broker, token)  # a client that reads, on a broker that goes on
    finally:
        for s in silent:
            s.close()


def test_http_answers_unread_over_all_sockets_stay_near_the_budget(broker):
    """slow_consumer_seconds (30 s) has not passed: the budget cuts the sockets that
    have read nothing for a second, the fullest first, until the rest fit."""
    fill_bucket(broker)
    token = bearer(broker, "app-r")["Authorization"]
    silent = silent_askers(broker, 100, token)  # 450 MB of answers asked for
    try:
        fits = HTTP_UNSENT_BYTES // PAGE

        def within() -> bool:  # answers still coming in go past it until the next tick
            flow = flow_status(broker)
            return cut_so_far(broker) >= 100 - fits - 1 and \
                0 < flow["unread_http_answer_bytes"] <= flow["unread_http_answer_limit"]

        wait_until(within, 20, what="the sockets past the budget cut")
        # (what the process's RSS shows: the allocator keeps the pages the cut answers
        # freed while the answers kept are held beside them)
        assert flow_status(broker)["unread_http_answer_limit"] == HTTP_UNSENT_BYTES
        assert cut_so_far(broker) <= 100 - fits + 1  # the rest are kept: they fit
        served_whole(broker, token)
    finally:
        for s in silent:
            s.close()
