"""Federation (issue 22) between two real broker processes on loopback: a link pushes
chosen channels into the remote and pulls others from it, each message exactly once and
in order per channel, across cuts of the link's connection and kill -9 of either
broker; links both ways do not loop; a remote that refuses the link is reported and
retried, losing nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, client_key, wait_until
from .netproxy import Proxy

OPEN = '[[rules]]\nclient = "*"\nread = ["*"]\nwrite = ["*"]\n'
# A channel a link reads is a queue its group drains: settled messages go unless kept.
KEEP = '[channels."chat/v1"]\nretention = 3600\n'


def start(tmp_path: Path, name: str, extra: str = "") -> BrokerProcess:
    config = tmp_path / f"{name}.toml"
    config.write_text(f'broker_id = "{name}"\n{OPEN}{extra}')
    return BrokerProcess(tmp_path / name, config=config).start()


def link(name: str, remote: str, *, push: list[str] = (), pull: list[str] = (),
         prefix: str = "", client: str = "bridge") -> str:
    return (f'\n[[federation]]\nname = "{name}"\nremote = "{remote}"\n'
            f'key = "{client_key(client)}"\npush = {json.dumps(list(push))}\n'
            f'pull = {json.dumps(list(pull))}\nprefix = "{prefix}"\n')


def read_all(broker: BrokerProcess, channel: str) -> list[Any]:
    with broker.connect_sync("reader") as c:
        out: list[Any] = []
        seq = 1
        while True:
            msgs, nxt = c.read(channel, seq, limit=1000)
            out += msgs
            if not msgs or nxt == seq:
                return out
            seq = nxt


def status(broker: BrokerProcess) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "minou", "federation", "--json"],
                          env=broker.cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_push_and_pull_carry_each_message_once_in_order_with_its_origin(tmp_path):
    us = start(tmp_path, "us")
    eu = start(tmp_path, "eu", link("eu-us", us.url, push=["orders/v1/*"],
                                    pull=["prices/*"], prefix=""))
    try:
        with eu.connect_sync("shop") as shop, us.connect_sync("pricing") as pricing:
            for n in range(300):
                shop.send(f"orders/v1/{n % 3}", {"n": n}, headers={"trace": str(n)},
                          key=f"k{n}")
            shop.send("other/v1/x", "not federated")
            pricing.send("prices/v2/tea", {"eur": 4.2})
        wait_until(lambda: sum(len(read_all(us, f"orders/v1/{i}")) for i in range(3)) == 300,
                   timeout=30, what="the orders on the remote")
        for i in range(3):
            got = read_all(us, f"orders/v1/{i}")
            assert [m.payload["n"] for m in got] == list(range(i, 300, 3))  # in order, once
            assert all(m.headers["x-federated-from"] == "eu" for m in got)
            assert got[0].headers["trace"] == str(i) and got[0].key == f"k{i}"
            assert got[0].headers["x-federated-seq"] == f"orders/v1/{i}:1"
        assert read_all(us, "other/v1/x") == []
        wait_until(lambda: len(read_all(eu, "prices/v2/tea")) == 1, timeout=30,
                   what="the price pulled")
        (price,) = read_all(eu, "prices/v2/tea")
        assert price.payload == {"eur": 4.2} and price.headers["x-federated-from"] == "us"
        view = status(eu)
        (ln,) = view["links"]
        pipes = {p["direction"]: p for p in ln["pipes"]}
        assert pipes["push"]["state"] == "up" and pipes["push"]["forwarded"] == 300
        assert pipes["push"]["rate"] > 0  # 300 carried within the last 10 s
        assert pipes["pull"]["forwarded"] == 1 and pipes["pull"]["remote_broker"] == "us"
        key = keyfiles.load_private(eu.admin_key)
        admin = {"Authorization": f"Bearer {make_token('admin', key, 'eu', ttl=600)}"}
        metrics = httpx.get(eu.http + "/metrics", headers=admin, timeout=10).text
        assert 'minou_federation_forwarded_total{direction="push",link="eu-us"} 300.0' in metrics
        assert 'minou_federation_up{direction="pull",link="eu-us"} 1.0' in metrics
        assert 'minou_federation_lag_messages{direction="push",link="eu-us"} 0.0' in metrics
        check = httpx.get(eu.http + "/status/federation/eu-us", headers=admin, timeout=10)
        assert check.headers["x-nagios-exit"] == "0", check.text
        assert check.text.startswith("OK - federation eu-us: push up, 0 behind")
        assert httpx.get(eu.http + "/v1/federation", headers=admin,
                         timeout=10).json()["links"][0]["name"] == "eu-us"
        missing = httpx.get(eu.http + "/status/federation/nope", headers=admin, timeout=10)
        assert missing.headers["x-nagios-exit"] == "3"
    finally:
        eu.stop()
        us.stop()


def test_links_both_ways_on_the_same_pattern_do_not_loop(tmp_path):
    a_port_holder = start(tmp_path, "b")  # b first: a's link needs its URL
    b = a_port_holder
    a = start(tmp_path, "a", KEEP + link("a-b", b.url, push=["chat/*"]))
    b.stop()
    b_config = tmp_path / "b.toml"
    b_config.write_text('broker_id = "b"\n' + OPEN + KEEP + link("b-a", a.url,
                                                                  push=["chat/*"]))
    b = BrokerProcess(tmp_path / "b", config=b_config, port=b.port).start()
    try:
        with a.connect_sync("alice") as alice, b.connect_sync("bob") as bob:
            for n in range(20):
                alice.send("chat/v1/room", {"from": "a", "n": n})
                bob.send("chat/v1/room", {"from": "b", "n": n})
        wait_until(lambda: len(read_all(a, "chat/v1/room")) >= 40 and
                   len(read_all(b, "chat/v1/room")) >= 40, timeout=30, what="both sides")
        time.sleep(1.5)  # what would loop would have come back by now
        for side in (a, b):
            got = [(m.payload["from"], m.payload["n"]) for m in read_all(side, "chat/v1/room")]
            assert sorted(got) == sorted([(s, n) for s in "ab" for n in range(20)])
        skipped = sum(p["skipped_loops"] for ln in status(a)["links"] for p in ln["pipes"])
        assert skipped >= 20  # b's own messages coming back from a were not sent
    finally:
        a.stop()
        b.stop()


def test_a_remote_that_refuses_the_link_is_reported_and_nothing_is_lost(tmp_path):
    rules = ('[[rules]]\nclient = "bridge"\nread = ["prices/*"]\nwrite = ["prices/*"]\n'
             '[[rules]]\nclient = "*"\nread = ["*"]\nwrite = ["*"]\n')
    config = tmp_path / "us.toml"
    config.write_text('broker_id = "us"\n' + rules.replace(
        'client = "*"', 'client = "reader"'))
    us = BrokerProcess(tmp_path / "us", config=config).start()
    eu = start(tmp_path, "eu", link("eu-us", us.url, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            for n in range(10):
                shop.send("orders/v1/1", n)
        wait_until(lambda: "orders/v1/1" in status(eu)["links"][0]["pipes"][0]["last_error"],
                   timeout=30, what="the refusal reported")
        assert "may not write" in status(eu)["links"][0]["pipes"][0]["last_error"]
        assert read_all(us, "orders/v1/1") == []
        # The rule is fixed: everything crosses, once.
        config.write_text('broker_id = "us"\n[[rules]]\nclient = "*"\nread = ["*"]\n'
                          'write = ["*"]\n')
        assert subprocess.run([sys.executable, "-m", "minou", "reload"], env=us.cli_env(),
                              capture_output=True, timeout=60).returncode == 0
        wait_until(lambda: len(read_all(us, "orders/v1/1")) == 10, timeout=60,
                   what="the orders once the rule allows them")
        assert [m.payload for m in read_all(us, "orders/v1/1")] == list(range(10))
    finally:
        eu.stop()
        us.stop()


def test_exactly_once_across_cuts_and_kills(tmp_path):
    """50,000 messages over four channels through a link whose TCP connection a proxy
    cuts six times, the remote and then the local broker killed -9 meanwhile: the remote
    holds every message the source holds, once each, in the source's order."""
    total, batch = 50_000, 250
    keep = '[channels."orders/v1"]\nretention = 3600\n'  # to compare with the source
    us = start(tmp_path, "us")
    proxy = Proxy("127.0.0.1", us.port).start()
    eu = start(tmp_path, "eu", keep + link("eu-us", proxy.url, push=["orders/v1/*"]))
    sent = [0]
    failures = [0]

    def produce() -> None:
        import minou

        with eu.connect_sync("shop", reconnect=True, request_timeout=10) as shop:
            while sent[0] < total:
                items = [(f"orders/v1/{n % 4}", n) for n in range(sent[0], sent[0] + batch)]
                try:
                    shop.send_many(items)
                except minou.MinouError:
                    failures[0] += 1  # not confirmed: sent again (the source may hold both)
                    time.sleep(0.2)
                    continue
                sent[0] += batch

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        for step in range(8):
            wait_until(lambda s=step: sent[0] >= total * (s + 1) // 10, timeout=120,
                       what="the producer")
            if step == 3:
                us.kill()  # the remote, mid-flow
                us.start()
            elif step == 6:
                eu.kill()  # the source with the link, mid-flow
                eu.start()
            else:
                proxy.cut()
        producer.join(180)
        assert not producer.is_alive()

        def same() -> bool:
            return all(len(read_all(us, f"orders/v1/{i}")) >= len(read_all(eu, f"orders/v1/{i}"))
                       for i in range(4))
        wait_until(same, timeout=180, interval=1.0, what="the remote catching up")
        for i in range(4):
            source = [m.payload for m in read_all(eu, f"orders/v1/{i}")]
            remote = [m.payload for m in read_all(us, f"orders/v1/{i}")]
            assert len(source) >= total // 4
            assert remote == source, f"orders/v1/{i}: not each once in order"
        assert proxy.cuts >= 6
    finally:
        producer.join(5)
        eu.stop()
        us.stop()
        proxy.close()


def test_over_websocket_a_payload_the_remote_refuses_is_dead_lettered_here(tmp_path):
    schema = ('[channels."orders/v1"]\nschema = { type = "object", required = ["id"] }\n')
    us = start(tmp_path, "us", schema)
    ws = us.http.replace("http://", "ws://") + "/v1/ws"  # firewall friendly: one socket
    eu = start(tmp_path, "eu", link("eu-us", ws, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            for value in ({"id": 1}, "not an order", {"id": 2}, [3], {"id": 4}):
                shop.send("orders/v1/1", value)
        wait_until(lambda: len(read_all(us, "orders/v1/1")) == 3, timeout=30,
                   what="the good orders on the remote")
        assert [m.payload for m in read_all(us, "orders/v1/1")] == [
            {"id": 1}, {"id": 2}, {"id": 4}]
        wait_until(lambda: len(read_all(eu, "_dead/orders/v1/1")) == 2, timeout=30,
                   what="the refused ones dead-lettered here")
        dead = read_all(eu, "_dead/orders/v1/1")
        assert [m.payload for m in dead] == ["not an order", [3]]
        assert dead[0].headers["x-dead-reason"] == "federation"
        assert "schema" in dead[0].headers["x-dead-detail"]
        assert dead[0].headers["x-federated-seq"] == "orders/v1/1:2"
        (push,) = status(eu)["links"][0]["pipes"]
        assert push["dead_lettered"] == 2 and push["forwarded"] == 3
    finally:
        eu.stop()
        us.stop()


def test_a_link_waiting_for_approval_says_so_and_crosses_once_approved(tmp_path):
    approval = ('[[rules]]\nclient = "bridge"\nread = ["*"]\nwrite = ["*"]\naccept = false\n'
                '[[rules]]\nclient = "reader"\nread = ["*"]\n')
    config = tmp_path / "us.toml"
    config.write_text('broker_id = "us"\n' + approval)
    us = BrokerProcess(tmp_path / "us", config=config).start()
    eu = start(tmp_path, "eu", link("eu-us", us.url, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/1", "waits")
        wait_until(lambda: "approval" in status(eu)["links"][0]["pipes"][0]["last_error"],
                   timeout=30, what="the link saying it waits for approval")
        assert status(eu)["links"][0]["pipes"][0]["state"] == "retrying"
        assert subprocess.run([sys.executable, "-m", "minou", "clients", "approve", "bridge"],
                              env=us.cli_env(), capture_output=True,
                              timeout=60).returncode == 0
        wait_until(lambda: [m.payload for m in read_all(us, "orders/v1/1")] == ["waits"],
                   timeout=60, what="the message once the link is approved")
    finally:
        eu.stop()
        us.stop()


def test_reload_starts_and_stops_links(tmp_path):
    us = start(tmp_path, "us")
    config = tmp_path / "eu.toml"
    config.write_text('broker_id = "eu"\n' + OPEN)
    eu = BrokerProcess(tmp_path / "eu", config=config).start()
    try:
        assert status(eu) == {"links": []}
        config.write_text('broker_id = "eu"\n' + OPEN + link("later", us.url,
                                                             push=["orders/v1/*"]))
        out = subprocess.run([sys.executable, "-m", "minou", "reload"], env=eu.cli_env(),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "federation" in out.stdout, out.stdout + out.stderr
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/1", 1)
        wait_until(lambda: len(read_all(us, "orders/v1/1")) == 1, timeout=30,
                   what="the link started by the reload")
        config.write_text('broker_id = "eu"\n' + OPEN)
        assert subprocess.run([sys.executable, "-m", "minou", "reload"], env=eu.cli_env(),
                              capture_output=True, timeout=60).returncode == 0
        assert status(eu) == {"links": []}
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/1", 2)
        time.sleep(1.0)
        assert len(read_all(us, "orders/v1/1")) == 1  # stopped: nothing more crosses
    finally:
        eu.stop()
        us.stop()
