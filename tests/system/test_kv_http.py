"""KV buckets over HTTP (issue 21, item 3): GET/PUT/DELETE /v1/kv/{bucket}/{key} with
the revision in ETag and If-Match / If-None-Match for compare-and-set, the keys and
buckets listings, the watch's long poll, and the rules applied to every route."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from .test_http_api import admin_bearer, bearer

RULES = """
[[rules]]
client = "app-*"
read = ["kv/config"]
write = ["kv/config"]

[[rules]]
client = "viewer-*"
read = ["kv/config"]

[kv."config"]
history = 5
"""


@pytest.fixture
def kv_broker(broker_factory, tmp_path):
    cfg = tmp_path / "kv.toml"
    cfg.write_text(RULES)
    return broker_factory.make(config=cfg).start()


@pytest.fixture
def http(kv_broker):
    with httpx.Client(base_url=kv_broker.http, timeout=40) as client:
        yield client


def test_put_get_delete_with_revisions_in_etags(kv_broker, http):
    app = bearer(kv_broker, "app-1")
    assert http.get("/v1/kv/config/limit", headers=app).status_code == 404
    r = http.put("/v1/kv/config/limit", json={"max": 10}, headers=app)
    assert r.status_code == 200, r.text
    rev = r.json()["revision"]
    assert r.headers["etag"] == f'"{rev}"'
    got = http.get("/v1/kv/config/limit", headers=app)
    body = got.json()
    assert (body["key"], body["value"], body["revision"], body["op"]) == (
        "limit", {"max": 10}, rev, "put")
    assert got.headers["etag"] == f'"{rev}"'
    # Compare-and-set: the ETag of the read, in If-Match.
    r2 = http.put("/v1/kv/config/limit", json={"max": 20},
                  headers={**app, "If-Match": got.headers["etag"]})
    assert r2.status_code == 200
    stale = http.put("/v1/kv/config/limit", json={"max": 30},
                     headers={**app, "If-Match": f'"{rev}"'})
    assert stale.status_code == 412
    err = stale.json()["error"]
    assert err["reason"] == "revision_mismatch"
    assert f"at revision {r2.json()['revision']}, not {rev}" in err["message"]
    # Create only: If-None-Match: *
    assert http.put("/v1/kv/config/limit", json=1,
                    headers={**app, "If-None-Match": "*"}).status_code == 412
    assert http.put("/v1/kv/config/new", json=1,
                    headers={**app, "If-None-Match": "*"}).status_code == 200
    # Keys may hold "/"; history lists the revisions kept (history = 5 here).
    assert http.put("/v1/kv/config/app/a.b", json="x", headers=app).status_code == 200
    keys = http.get("/v1/kv/config", headers=app).json()
    assert keys["keys"] == ["app/a.b", "limit", "new"] and keys["more"] is False
    assert http.get("/v1/kv/config", params={"prefix": "app/"},
                    headers=app).json()["keys"] == ["app/a.b"]
    hist = http.get("/v1/kv/config/limit", params={"history": "true"}, headers=app).json()
    assert [e["value"] for e in hist["entries"]] == [{"max": 10}, {"max": 20}]
    old = http.get("/v1/kv/config/limit", params={"revision": rev}, headers=app).json()
    assert old["value"] == {"max": 10}
    d = http.delete("/v1/kv/config/limit", headers={**app, "If-Match": f'"{rev}"'})
    assert d.status_code == 412
    d = http.delete("/v1/kv/config/limit", headers=app)
    assert d.status_code == 200
    assert http.get("/v1/kv/config/limit", headers=app).status_code == 404
    buckets = http.get("/v1/kv", headers=admin_bearer(kv_broker)).json()["buckets"]
    (config,) = buckets
    assert (config["bucket"], config["keys"], config["history"]) == ("config", 2, 5)


def test_watch_long_poll_returns_on_the_next_change(kv_broker, http):
    app = bearer(kv_broker, "app-2")
    http.put("/v1/kv/config/a", json=1, headers=app)
    snap = http.get("/v1/kv-watch/config", params={"latest": "true"}, headers=app).json()
    assert [(e["key"], e["value"]) for e in snap["entries"]] == [("a", 1)]
    after = snap["revision"]

    def later() -> None:
        time.sleep(0.5)
        with httpx.Client(base_url=kv_broker.http) as other:
            other.put("/v1/kv/config/a", json=2, headers=app)

    threading.Thread(target=later).start()
    t0 = time.monotonic()
    res = http.get("/v1/kv-watch/config", params={"after": after, "wait": 20},
                   headers=app).json()
    assert time.monotonic() - t0 < 15  # answered by the put, not the wait running out
    assert [(e["key"], e["value"]) for e in res["entries"]] == [("a", 2)]
    assert res["next"] == res["entries"][0]["revision"]
    empty = http.get("/v1/kv-watch/config", params={"after": res["next"], "wait": 0.2},
                     headers=app).json()
    assert empty["entries"] == [] and empty["next"] == res["next"]


def test_rules_and_bad_input_get_precise_answers(kv_broker, http):
    viewer = bearer(kv_broker, "viewer-1")
    app = bearer(kv_broker, "app-3")
    http.put("/v1/kv/config/k", json=1, headers=app)
    assert http.get("/v1/kv/config/k", headers=viewer).json()["value"] == 1
    assert http.put("/v1/kv/config/k", json=2, headers=viewer).status_code == 403
    assert http.get("/v1/kv/other/k", headers=app).status_code == 403
    assert http.get("/v1/kv-watch/other", headers=app).status_code == 403
    cases = [
        (http.put("/v1/kv/config/k", content=b"{bad", headers=app), 400, "invalid_payload"),
        (http.put("/v1/kv/config/k", headers=app), 400, "bad_request"),
        (http.put("/v1/kv/config/k", json=1, headers={**app, "If-Match": "abc"}), 400,
         "bad_request"),
        (http.put("/v1/kv/config/a%20b", json=1, headers=app), 400, "bad_request"),
        (http.put("/v1/kv/bad.name/k", json=1, headers=app), 400, "invalid_channel"),
        (http.get("/v1/kv-watch/config", params={"wait": 99}, headers=app), 400,
         "bad_request"),
        (http.put("/v1/kv/config/k", json=1, params={"ttl": "x"}, headers=app), 400,
         "bad_request"),
    ]
    for response, status, reason in cases:
        assert response.status_code == status, response.text
        assert response.json()["error"]["reason"] == reason
    assert http.get("/v1/kv/config/k", headers=app).json()["value"] == 1  # unharmed
    assert http.get("/v1/kv/config/k").status_code == 401
