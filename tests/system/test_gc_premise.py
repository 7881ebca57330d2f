"""The broker raises the collector's threshold (GC_THRESHOLD) on the premise that
nothing it does relies on reference cycles to be freed: a cycle that holds an answer
keeps it until a rare collection (session 25 found three, each holding hundreds of MB
under load). This test runs every door's common work with large payloads against a
broker whose collector keeps what it frees (``gc_probe/sitecustomize.py``) and asserts
no cycle held a payload."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import wait_until
from .test_http_api import bearer
from .test_resp import connect as resp_connect

redis = pytest.importorskip("redis")
PROBE = Path(__file__).parent / "gc_probe"
BIG = "x" * 300_000  # payloads well over the probe's 64 KiB mark


def collected(folder: Path) -> dict[str, Any]:
    """Have the broker collect; what the cycles it freed held."""
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    (folder / "collect").write_text("")
    wait_until(report.exists, 30, what="the broker's collection report")
    return json.loads(report.read_text())


def test_no_reference_cycle_holds_a_payload_after_any_doors_work(
        broker_factory, tmp_path, monkeypatch) -> None:
    folder = tmp_path / "gc"
    folder.mkdir()
    monkeypatch.setenv("MINOU_GC_PROBE", str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(PROBE), os.environ.get("PYTHONPATH", "")) if p))
    broker = broker_factory.make(resp_port=0).start()
    collected(folder)  # what starting made: not this test's business
    with broker.connect_sync("native") as app:
        sub = app.consume("gc/v1/*", group="g")
        for i in range(5):
            app.send(f"gc/v1/{i % 2}", {"body": BIG})
        msgs, _ = app.read("gc/v1/0", 1)  # read back before the acks let them go
        assert len(msgs) >= 2
        for _ in range(5):
            sub.get(timeout=10).ack()
        kv = app.kv("gcbucket")
        for _ in range(3):
            kv.put("k", {"body": BIG})
        assert kv.get("k") is not None and kv.history("k")
        app.serve("gc/v1/rpc", lambda m: {"echo": m.payload["body"]})
        assert len(app.request("gc/v1/rpc", {"body": BIG}, timeout=10)["echo"]) == len(BIG)
    http, headers = broker.http, bearer(broker, "web")
    with httpx.Client(base_url=http, headers=headers, timeout=10) as web:
        for _ in range(3):
            web.post("/v1/messages/gc/v1/h", json={"body": BIG}).raise_for_status()
        got = web.post("/v1/consume/gc/v1/h", params={"group": "web", "wait": 2})
        web.post(f"/v1/ack/{got.json()['receipt']}").raise_for_status()
    r = resp_connect(broker, "resp")
    try:
        for _ in range(3):
            r.xadd("gc/v1/r", {"payload": json.dumps({"body": BIG})})
        assert len(r.xrange("gc/v1/r", count=8)) == 3
        r.xgroup_create("gc/v1/r", "rg", id="0")
        entries = r.xreadgroup("rg", "c1", {"gc/v1/r": ">"}, count=8)
        r.xack("gc/v1/r", "rg", *[e[0] for e in entries[0][1]])
        r.set("lock", BIG)
        assert len(r.get("lock")) == len(BIG)
        assert len(r.eval("return redis.call('GET', KEYS[1])", 1, "lock")) == len(BIG)
    finally:
        r.close()
    time.sleep(0.5)  # connections closed: their ends run on the broker's loop
    report = collected(folder)
    assert report["large"] == [], report["large"][:5]
