"""The admin CLI against a running broker: list, delete, status, soft-stop, token."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

import minou
from minou.errors import ShuttingDown, UnknownDelivery

from ..conftest import auth, wait_until


def cli(broker, *args: str, env: dict[str, str] | None = None, input: str | None = None
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minou", *args], capture_output=True,
                          text=True, timeout=90, env=env or broker.cli_env(), input=input)


def test_list_by_queue_and_channel_with_messages(broker):
    with minou.connect_sync(broker.url, **auth("lister")) as c:
        for i in range(3):
            c.send("easilys/v1/movement", {"i": i}, headers={"h": str(i)})
        c.send("easilys/v1/other", {"o": 1})
        c.send("other/v1/x", {"x": 1})
    whole = json.loads(cli(broker, "list", "-q", "easilys/v1", "--json").stdout)
    assert sorted(ch["channel"] for ch in whole["channels"]) == [
        "easilys/v1/movement", "easilys/v1/other"]
    one = json.loads(cli(broker, "list", "-q", "easilys/v1", "--channel", "movement", "-m",
                         "--json").stdout)
    (ch,) = one["channels"]
    assert ch["depth"] == 3 and [m["payload"] for m in ch["messages"]] == [
        {"i": 0}, {"i": 1}, {"i": 2}]
    assert ch["messages"][1]["headers"] == {"h": "1"}
    human = cli(broker, "list", "-q", "easilys/v1", "--channel", "movement", "-m")
    assert human.returncode == 0 and "messages of easilys/v1/movement" in human.stdout
    assert '{"i": 2}' in human.stdout
    bad = cli(broker, "list", "-q", "nonsense")
    assert bad.returncode == 1 and "must be endpoint/version" in bad.stderr


def test_delete_empties_a_queue_or_one_channel(broker):
    with minou.connect_sync(broker.url, **auth("deleter")) as c:
        for i in range(4):
            c.send(f"jobs/v1/{i % 2}", {"i": i})
        sub = c.consume("jobs/v1/*", group="workers")
        held = sub.get(timeout=5)  # a delivery in flight when the queue is emptied
        asked = cli(broker, "delete", "-q", "jobs/v1", "--channel", "1", input="n\n")
        assert asked.returncode == 1  # said no: nothing removed
        one = json.loads(cli(broker, "delete", "-q", "jobs/v1", "--channel", "1", "--yes",
                             "--json").stdout)
        assert one["purged"] == {"jobs/v1/1": 2}
        rest = cli(broker, "delete", "-q", "jobs/v1", "-y")
        assert rest.returncode == 0 and "removed 2 message(s) from jobs/v1" in rest.stdout
        with pytest.raises(UnknownDelivery):  # purged while in flight: its tag is gone
            held.ack()
        c.send("jobs/v1/0", {"after": True})
        after = sub.get(timeout=5)
        assert after.payload == {"after": True} and after.ack()
    listed = json.loads(cli(broker, "list", "-q", "jobs/v1", "--json").stdout)
    assert sum(ch["depth"] for ch in listed["channels"]) == 0


def test_status_and_a_clear_message_when_no_broker_answers(broker):
    st = json.loads(cli(broker, "status", "--json").stdout)
    assert st["auth"]["mode"] == "keys" and st["accepting"] is True
    human = cli(broker, "status")
    assert "auth" in human.stdout and "uptime" in human.stdout
    gone = cli(broker, "status", env={**broker.cli_env(), "MINOU_URL": "minou://127.0.0.1:1"})
    assert gone.returncode == 3
    assert "cannot connect to minou://127.0.0.1:1: no broker answered" in gone.stderr


def test_token_is_a_bearer_for_the_http_api(broker):
    env = {**os.environ, "MINOU_URL": broker.url, "MINOU_KEY": str(broker.admin_key)}
    out = cli(broker, "token", "--ttl", "120", env=env)
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    r = httpx.get(f"{broker.http}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.json()["client_id"] == "admin" and r.json()["admin"] is True


def test_soft_stop_settles_in_flight_deliveries_then_exits_zero(broker):
    consumer = minou.connect_sync(broker.url, **auth("drainer"), reconnect=False)
    consumer.send("drain/v1/1", {"n": 1})
    consumer.send("drain/v1/1", {"n": 2})
    sub = consumer.consume("drain/v1/1", group="g", prefetch=1)
    held = sub.get(timeout=5)
    out = cli(broker, "soft-stop", "--no-wait", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["unsettled"] == 1
    with pytest.raises(ShuttingDown):
        consumer.send("drain/v1/1", {"n": 3})
    with pytest.raises(ShuttingDown):
        consumer.consume("drain/v1/*", group="late")
    assert broker.alive  # waits for the delivery in flight
    assert held.ack() is True
    wait_until(lambda: not broker.alive, 20, what="the broker to exit after the drain")
    assert broker.proc.returncode == 0
    consumer.close()
    broker.start()
    with minou.connect_sync(broker.url, **auth("drainer")) as again:
        left = again.consume("drain/v1/1", group="g").get(timeout=5)
        assert left.payload == {"n": 2}  # not handed out during the drain, not lost


def test_soft_stop_waits_for_the_broker_by_default(broker):
    t0 = time.monotonic()
    out = cli(broker, "soft-stop")
    assert out.returncode == 0, out.stderr
    assert "stopped" in out.stdout and time.monotonic() - t0 < 30
    wait_until(lambda: not broker.alive, 10, what="the process to exit")
    assert broker.proc.returncode == 0
