"""Idle expiry (issue 21, item 5) against a real broker: a channel version with
``expire_idle`` is removed with its messages and groups once nothing happened on it
for that long, counted, logged and shown; a connected reader keeps it; reload turns
it on; a request/reply inbox goes once its owner is gone; seqs go on after it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import httpx

import minou

from ..conftest import OPEN_RULES as OPEN
from ..conftest import wait_until
from .test_http_api import admin_bearer

CONFIG = """
[channels."tmp/v1"]
expire_idle = 1.5

[channels."_inbox/v1"]
expire_idle = 1.5
"""


def channels(broker: Any) -> list[str]:
    with minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False)) as admin:
        return [c["channel"] for c in admin.admin("list")["channels"]]


def metric(broker: Any, name: str) -> float:
    text = httpx.get(f"{broker.http}/metrics", headers=admin_bearer(broker), timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_an_idle_channel_goes_with_its_messages_and_a_read_one_stays(broker_factory,
                                                                      tmp_path):
    cfg = tmp_path / "expiry.toml"
    cfg.write_text(CONFIG)
    broker = broker_factory.make(config=cfg, extra=["--log-level", "info"]).start()
    with broker.connect_sync("app") as client:
        first = client.send("tmp/v1/idle", {"n": 1})
        client.send("tmp/v1/read", {"n": 1})
        client.send("keep/v1/x", {"n": 1})
        sub = client.consume("tmp/v1/read", group="g")  # connected: keeps its channel
        # A listener of it alone, that leaves: the channel is idle from then on.
        client.listen("tmp/v1/idle", name="gone-with-it", start="oldest").close()
        wait_until(lambda: "tmp/v1/idle" not in channels(broker), 15, what="tmp/v1/idle expired")
        assert {"tmp/v1/read", "keep/v1/x"} <= set(channels(broker))
        assert sub.get(timeout=5).ack()
        time.sleep(2.5)  # past expire_idle, with the consumer still connected
        assert "tmp/v1/read" in channels(broker)
        with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
            groups = [g["group"] for g in admin.admin("list")["groups"]]
            assert not any("gone-with-it" in g for g in groups), groups
            assert admin.admin("status")["counters"]["channels_expired"] == 1
        assert metric(broker, "minou_channels_expired_total") == 1
        assert "channel tmp/v1/idle expired: idle for 1.5 s (expire_idle); removed with 1 " \
               "message(s)" in broker.output
        # Made again, it goes on from its old seqs; a restart keeps that too.
        again = client.send("tmp/v1/idle", {"n": 2})
        assert again.seq == first.seq + 1 and again.id != first.id
    assert broker.stop() == 0
    broker.start()
    with broker.connect_sync("app") as client:
        assert client.send("tmp/v1/idle", {"n": 3}).seq == first.seq + 2


def test_reload_turns_it_on_and_list_shows_it(broker_factory, tmp_path):
    cfg = tmp_path / "expiry.toml"
    cfg.write_text(OPEN)  # rules of its own: the broker reads this very file at reload
    broker = broker_factory.make(config=cfg).start()
    env = broker.cli_env()
    with broker.connect_sync("app") as client:
        client.send("later/v1/a", 1)
    time.sleep(2.0)
    assert "later/v1/a" in channels(broker)
    cfg.write_text(OPEN + '[channels."later/v1"]\nexpire_idle = 30\n')
    out = subprocess.run([sys.executable, "-m", "minou", "reload"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = subprocess.run([sys.executable, "-m", "minou", "list", "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    (row,) = [c for c in json.loads(listed.stdout)["channels"] if c["channel"] == "later/v1/a"]
    assert row["expire_idle"] == 30
    human = subprocess.run([sys.executable, "-m", "minou", "list"], env=env,
                           capture_output=True, text=True, timeout=60, )
    assert "after 30 s idle" in human.stdout, human.stdout
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        assert admin.admin("queue", queue="later/v1")["options"]["expire_idle"] == 30
    cfg.write_text(OPEN + '[channels."later/v1"]\nexpire_idle = 1\n')
    assert subprocess.run([sys.executable, "-m", "minou", "reload"], env=env,
                          capture_output=True, timeout=60).returncode == 0
    wait_until(lambda: "later/v1/a" not in channels(broker), 15, what="later/v1/a expired")


def test_a_requesters_inbox_goes_once_it_is_gone(broker_factory, tmp_path):
    cfg = tmp_path / "expiry.toml"
    cfg.write_text(CONFIG)
    broker = broker_factory.make(config=cfg).start()

    async def scenario() -> str:
        responder = await broker.connect("resp")
        requester = await broker.connect("asker")
        await responder.serve("calc/v1/*", lambda m: m.payload + 1)
        assert await requester.request("calc/v1/x", 1) == 2
        inbox = requester._requester.inbox  # type: ignore[union-attr]
        await asyncio.sleep(2.5)  # the listener is connected: the inbox stays
        assert inbox in await asyncio.to_thread(channels, broker)
        await requester.close()
        await responder.close()
        return inbox

    inbox = asyncio.run(asyncio.wait_for(scenario(), 60))
    wait_until(lambda: inbox not in channels(broker), 15, what="the inbox expired")
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        assert not [g for g in admin.admin("list")["groups"] if inbox in g["patterns"]]
