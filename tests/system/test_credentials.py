"""Delegated credentials against a real broker (docs/security.md, "Delegated credentials").

A client that proved itself with its key issues a credential; whoever holds it acts as
that client, under its rules, with no admin rights, until it expires or is revoked —
and the key never leaves the issuer. Each refusal is precise and counted.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

import minou
from minou.errors import BadRequest, NotAuthenticated, NotAuthorized, NotFound

from ..conftest import client_key, wait_until
from .test_http_api import admin_bearer, bearer

CONFIG = """
[[rules]]
client = "job-*"
read = ["in/*"]
write = ["out/v1/*"]
"""


@pytest.fixture
def secure(broker_factory, tmp_path):
    cfg = tmp_path / "jobs.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


def keyed(broker, client_id: str) -> minou.SyncClient:
    return minou.connect_sync(broker.url, client_id=client_id,
                              key=str(client_key(client_id)), reconnect=False,
                              request_timeout=5)


def delegated(broker, client_id: str, credential: str, **kw: Any) -> minou.SyncClient:
    return minou.connect_sync(broker.url, client_id=client_id, credential=credential,
                              reconnect=False, request_timeout=5, **kw)


def failures(broker, why: str) -> float:
    """minou_auth_failures_total{why=...} as /metrics says."""
    text = httpx.get(broker.http + "/metrics", headers=admin_bearer(broker), timeout=5).text
    for line in text.splitlines():
        if line.startswith(f'minou_auth_failures_total{{why="{why}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_credential_acts_as_its_client_under_its_rules(secure):
    with minou.connect_sync(secure.url, **secure.admin_auth(reconnect=False)) as a:
        a.send("in/v1/a", {"n": 1})
    with keyed(secure, "job-1") as owner:
        issued = owner.issue_credential(ttl=600, purpose="nightly load")
    secret = issued["credential"]
    assert secret.startswith("mdc1.") and issued["id"] in secret
    assert 590 < issued["expires_at"] - issued["issued_at"] <= 600
    with delegated(secure, "job-1", secret) as worker:
        assert worker.admin("whoami")["client_id"] == "job-1"
        msgs, _ = worker.read("in/v1/a")
        assert [m.payload for m in msgs] == [{"n": 1}]
        worker.send("out/v1/x", {"done": True})
        with pytest.raises(NotAuthorized):  # the rules of job-1 still apply
            worker.send("in/v1/a", {"n": 2})
        with pytest.raises(NotAuthorized, match="needs an admin identity"):
            worker.admin("status")
        with pytest.raises(NotAuthorized, match="a credential cannot issue another"):
            worker.issue_credential()
        with pytest.raises(NotAuthorized, match="cannot renew itself"):
            worker.renew_credential(issued["id"])
        listed = worker.admin("credentials.list")["credentials"]
        assert [c["id"] for c in listed] == [issued["id"]]
        assert "credential" not in listed[0] and "secret_sha256" not in listed[0]


def test_an_admins_credential_reads_like_the_admin_but_runs_no_admin_operation(secure):
    with minou.connect_sync(secure.url, **secure.admin_auth(reconnect=False)) as a:
        secret = a.issue_credential(ttl=60)["credential"]
        a.send("anything/v1/x", {"n": 1})
    with delegated(secure, "admin", secret) as worker:
        assert worker.read("anything/v1/x")[0][0].payload == {"n": 1}
        for op in ("status", "clients.list", "reload"):
            with pytest.raises(NotAuthorized, match="delegated credential"):
                worker.admin(op)
        with pytest.raises(NotAuthorized):
            worker.admin("clients.revoke", client_id="job-1")


def test_wrong_forged_and_foreign_credentials_are_refused_precisely(secure):
    with keyed(secure, "job-2") as owner:
        secret = owner.issue_credential(ttl=60)["credential"]
    prefix, cid, tail = secret.split(".")
    forged = f"{prefix}.{cid}.{'A' * len(tail)}"
    cases = [
        ("job-2", forged, "unknown to this broker"),
        ("job-2", "mdc1.nothing", "malformed"),
        ("job-2", "x" * 500, "too long"),
        ("job-3", secret, "belongs to client 'job-2', not 'job-3'"),
    ]
    before = failures(secure, "bad_credential")
    for client_id, credential, why in cases:
        with pytest.raises(NotAuthenticated, match=why):
            delegated(secure, client_id, credential)
    assert failures(secure, "bad_credential") == before + len(cases)
    with delegated(secure, "job-2", secret) as worker:  # the real one still works
        assert worker.admin("whoami")["client_id"] == "job-2"


def test_expiry_renewal_and_revocation(secure):
    with keyed(secure, "job-4") as owner:
        short = owner.issue_credential(ttl=1)
        kept = owner.issue_credential(ttl=1)
        renewed = owner.renew_credential(kept["id"], ttl=600)
        assert renewed["expires_at"] > short["expires_at"] + 500
        wait_until(lambda: _refused(secure, "job-4", short["credential"]),
                   what="the short credential expired")
        with pytest.raises(NotAuthenticated, match="expired"):
            delegated(secure, "job-4", short["credential"])
        worker = delegated(secure, "job-4", kept["credential"])  # renewed: still good
        assert worker.admin("whoami")["client_id"] == "job-4"
        with pytest.raises(NotFound, match="expired"):
            owner.renew_credential(short["id"])
        revoked = owner.revoke_credential(kept["id"])
        assert revoked["connections_closed"] == 1
        wait_until(lambda: _closed(worker), what="the credential's connection was closed")
        with pytest.raises(NotAuthenticated, match="unknown to this broker"):
            delegated(secure, "job-4", kept["credential"])
        with pytest.raises(NotFound, match="no credential"):
            owner.revoke_credential(kept["id"])


def test_another_client_cannot_see_renew_or_revoke_my_credential(secure):
    with keyed(secure, "job-5") as mine, keyed(secure, "job-6") as theirs:
        issued = mine.issue_credential(ttl=60)
        assert theirs.admin("credentials.list")["credentials"] == []
        with pytest.raises(NotFound, match="no credential"):
            theirs.renew_credential(issued["id"])
        with pytest.raises(NotFound, match="no credential"):
            theirs.revoke_credential(issued["id"])
    with delegated(secure, "job-5", issued["credential"]):
        pass


def test_revoking_or_rotating_the_client_voids_its_credentials(secure):
    with keyed(secure, "job-7") as owner:
        first = owner.issue_credential(ttl=600)["credential"]
    with keyed(secure, "job-8") as owner:
        second = owner.issue_credential(ttl=600)["credential"]
    worker = delegated(secure, "job-7", first)
    with minou.connect_sync(secure.url, **secure.admin_auth(reconnect=False)) as a:
        closed = a.admin("clients.revoke", client_id="job-7")["connections_closed"]
        assert closed == 1
        wait_until(lambda: _closed(worker), what="the delegated connection was closed")
        with pytest.raises(NotAuthenticated, match="unknown"):
            delegated(secure, "job-7", first)
        a.admin("clients.approve", client_id="job-7")  # approved again: still void
        with pytest.raises(NotAuthenticated, match="unknown"):
            delegated(secure, "job-7", first)
        new_key = minou.auth.keys.public_pem(minou.auth.keys.generate()).decode()
        a.admin("clients.rotate", client_id="job-8", public_key=new_key)
        with pytest.raises(NotAuthenticated, match="unknown"):
            delegated(secure, "job-8", second)


def test_an_issued_credential_survives_a_kill_at_once(secure):
    """Answered only once durable: kill -9 right after the answer, each time."""
    for _ in range(4):
        with keyed(secure, "job-9") as owner:
            issued = owner.issue_credential(ttl=600)
            secure.kill()
        secure.start()
        with delegated(secure, "job-9", issued["credential"]) as worker:
            assert worker.admin("whoami")["client_id"] == "job-9"


def test_http_bearer_credential_and_routes(secure):
    headers = bearer(secure, "job-10")
    with httpx.Client(base_url=secure.http, timeout=5) as http:
        r = http.post("/v1/credentials", json={"ttl": 120, "purpose": "http"}, headers=headers)
        assert r.status_code == 200, r.text
        issued = r.json()
        as_job = {"Authorization": f"Bearer {issued['credential']}"}
        r = http.post("/v1/messages/out/v1/a", json={"x": 1}, headers=as_job)
        assert r.status_code == 201, r.text
        r = http.post("/v1/messages/in/v1/a", json={"x": 1}, headers=as_job)
        assert r.status_code == 403, r.text
        assert http.get("/v1/status", headers=as_job).status_code == 403
        r = http.post("/v1/credentials", json={}, headers=as_job)  # no chaining
        assert r.status_code == 403 and "own key" in r.json()["error"]["message"]
        r = http.post(f"/v1/credentials/{issued['id']}/renew", json={"ttl": 5000},
                      headers=headers)
        assert r.status_code == 200 and r.json()["expires_at"] > issued["expires_at"]
        r = http.post("/v1/credentials", json={"ttl": 10 ** 9}, headers=headers)
        assert r.status_code == 400 and "ttl must be" in r.json()["error"]["message"]
        assert http.delete(f"/v1/credentials/{issued['id']}",
                           headers=headers).status_code == 200
        r = http.post("/v1/messages/out/v1/a", json={"x": 1}, headers=as_job)
        assert r.status_code == 401 and "unknown" in r.json()["error"]["message"]


def _refused(broker, client_id: str, credential: str) -> bool:
    try:
        delegated(broker, client_id, credential).close()
    except NotAuthenticated:
        return True
    return False


def _closed(client: minou.SyncClient) -> bool:
    try:
        client.admin("whoami")
    except Exception:  # closed by the broker: any error says so
        return True
    return False


def test_cli_issue_list_renew_revoke(secure):
    import os
    import subprocess
    import sys

    with keyed(secure, "job-11"):
        pass  # registered (the rule accepts job-*)
    env = {**os.environ, "MINOU_URL": secure.url, "MINOU_CLIENT_ID": "job-11",
           "MINOU_KEY": str(client_key("job-11"))}

    def cli(*args: str, who: dict[str, str] = env) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "minou", "credentials", *args],
                              capture_output=True, text=True, timeout=60, env=who)

    issued = cli("issue", "--ttl", "120", "--purpose", "from the CLI")
    assert issued.returncode == 0, issued.stderr
    secret = issued.stdout.strip()  # the secret alone on stdout, for $(...)
    assert secret.startswith("mdc1.") and "expires in" in issued.stderr
    with delegated(secure, "job-11", secret) as worker:
        assert worker.admin("whoami")["client_id"] == "job-11"
    credential_id = secret.split(".")[1]
    listed = cli("list")
    assert credential_id in listed.stdout and "from the CLI" in listed.stdout
    assert secret.split(".")[2] not in listed.stdout
    everyone = cli("list", "--json", who=secure.cli_env())  # the admin sees all
    assert credential_id in everyone.stdout
    assert "renewed" in cli("renew", credential_id, "--ttl", "600").stdout
    assert cli("revoke", credential_id).returncode == 0
    gone = cli("revoke", credential_id)
    assert gone.returncode != 0 and "no credential" in gone.stderr


def test_renew_and_revoke_by_purpose_touch_only_my_credentials_for_it(secure):
    with keyed(secure, "job-12") as mine, keyed(secure, "job-13") as theirs:
        a = mine.issue_credential(ttl=30, purpose="spark read q1")
        b = mine.issue_credential(ttl=30, purpose="spark read q1")
        other = mine.issue_credential(ttl=30, purpose="spark read q2")
        foreign = theirs.issue_credential(ttl=30, purpose="spark read q1")
        renewed = mine.admin("credentials.renew", purpose="spark read q1", ttl=900)["renewed"]
        assert sorted(r["id"] for r in renewed) == sorted([a["id"], b["id"]])
        worker = delegated(secure, "job-12", a["credential"])
        revoked = mine.admin("credentials.revoke", purpose="spark read q1")
        assert sorted(r["id"] for r in revoked["revoked"]) == sorted([a["id"], b["id"]])
        assert revoked["connections_closed"] == 1
        wait_until(lambda: _closed(worker), what="the revoked credential's connection closed")
        left = {c["id"] for c in mine.admin("credentials.list")["credentials"]}
        assert left == {other["id"]}
        assert theirs.admin("credentials.list")["credentials"][0]["id"] == foreign["id"]
        with pytest.raises(BadRequest, match="give id"):
            mine.admin("credentials.renew")


def test_connections_a_credential_opened_end_when_it_expires(broker_factory, tmp_path):
    """A credential is good until it expires: the connections it opened too, by every
    door (native, /v1/stream, the Redis protocol). They lived on for good, so whoever
    held it for a second (a leaked one, a job whose driver stopped renewing) kept the
    client's rights for as long as it kept a socket open. A renewed one goes on."""
    import json

    import redis
    import websockets.sync.client as wsc
    from websockets.exceptions import ConnectionClosed

    cfg = tmp_path / "jobs.toml"
    cfg.write_text(CONFIG)
    b = broker_factory.make(config=cfg, resp_port=0).start()
    with keyed(b, "job-30") as owner:
        short = owner.issue_credential(ttl=3)
        kept = owner.issue_credential(ttl=3)
        owner.renew_credential(kept["id"], ttl=600)
        worker = delegated(b, "job-30", short["credential"])
        steady = delegated(b, "job-30", kept["credential"])
        ws = wsc.connect(b.http.replace("http://", "ws://") + "/v1/stream",
                         additional_headers={"Authorization": f"Bearer {short['credential']}"})
        r = redis.Redis(host="127.0.0.1", port=b.resp_port, username="job-30",
                        password=short["credential"], socket_timeout=5)
        assert r.ping() and worker.admin("whoami")["client_id"] == "job-30"
        wait_until(lambda: _closed(worker), timeout=15,
                   what="the expired credential's native connection to be closed")
        deadline = time.monotonic() + 10
        closed_by_broker = False
        with ws:
            try:
                while time.monotonic() < deadline:
                    message = json.loads(ws.recv(max(0.01, deadline - time.monotonic())))
                    if message["type"] == "error":
                        assert message["reason"] == "not_authenticated", message
                        assert "expired" in message["message"], message
            except ConnectionClosed:
                closed_by_broker = True
            except TimeoutError:
                pass
        assert closed_by_broker, "the expired credential's /v1/stream went on"
        with pytest.raises(redis.ResponseError, match="expired"):  # the broker's last word
            r.ping()
        with pytest.raises(redis.ConnectionError):  # then it closed the connection
            r.ping()
        assert steady.admin("whoami")["client_id"] == "job-30"  # renewed: goes on
        steady.close()
        worker.close()


def test_an_admins_credential_opens_no_admin_route(secure):
    """Admin routes that answer without an admin operation (metrics, statistics, rate
    history, a federation link's check) took the admin's credential for the admin: it
    carries the admin's reading rights, never its admin rights."""
    with minou.connect_sync(secure.url, **secure.admin_auth(reconnect=False)) as a:
        secret = a.issue_credential(ttl=120)["credential"]
        a.send("in/v1/a", {"n": 1})
    as_worker = {"Authorization": f"Bearer {secret}"}
    admin = admin_bearer(secure)
    with httpx.Client(base_url=secure.http, timeout=5) as http:
        for path in ("/metrics", "/statistics", "/v1/rates/history", "/v1/queues",
                     "/status/federation/nowhere", "/status/queues/in/v1",
                     "/status/nagios/in/v1", "/v1/status", "/v1/clients"):
            assert http.get(path, headers=admin).status_code == 200, path
            r = http.get(path, headers=as_worker)
            assert r.status_code == 403, (path, r.status_code, r.text[:200])
            assert "delegated credential" in r.json()["error"]["message"], path
        assert http.get("/v1/whoami", headers=as_worker).json()["client_id"] == "admin"
