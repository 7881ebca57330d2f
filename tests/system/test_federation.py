"""Federation (issue 22) between two real broker processes on loopback: a link pushes
chosen channels into the remote and pulls others from it, each message exactly once and
in order per channel, across cuts of the link's connection and kill -9 of either
broker; links both ways do not loop; a remote that refuses the link is reported and
retried, losing nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, client_key, wait_until
from ..redis_server import REDIS_SERVER, RedisServer
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
        assert status(eu)["links"][0]["pipes"][0]["refused_channels"] == 1
        assert read_all(us, "orders/v1/1") == []
        time.sleep(5.0)  # the channel is tried again after 1 s, then 2 s, then 4 s
        # Logged once, not at each try (a rule refusing 10,000 channels wrote 10,000
        # lines every 30 s).
        refusals = [ln for ln in eu.output.splitlines() if "may not write" in ln]
        assert len(refusals) == 1, refusals
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


def test_a_page_another_runner_partly_committed_is_not_carried_twice(tmp_path):
    """Two runners of one link (a cluster's runner paused past its turn, then woken
    while the next one works) read at different moments and cut pages of different
    bounds. Here the test is the other runner: while the link's page 11..20 is on its
    way (the remote's replies slowed), it commits 11..15 under the link's writer id.
    The link's commit of 11..20 is refused OUT_OF_SEQUENCE and it goes on after 15:
    without that check the remote would hold 11..15 twice."""
    us = start(tmp_path, "us")
    proxy = Proxy("127.0.0.1", us.port).start()
    eu = start(tmp_path, "eu", KEEP.replace("chat/v1", "orders/v1")
               + link("eu-us", proxy.url, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            shop.send_many([("orders/v1/a", n) for n in range(1, 11)])
            wait_until(lambda: len(read_all(us, "orders/v1/a")) == 10, timeout=30,
                       what="the first ten on the remote")
            proxy.reply_delay = 2.0  # the link's STAGE and commit arrive, answers lag
            shop.send_many([("orders/v1/a", n) for n in range(11, 21)])
        time.sleep(1.0)  # the link has read 11..20 and staged them (its answer waits)
        with us.connect_sync("bridge") as other:
            other.stage("other-runner", [("orders/v1/a", n) for n in range(11, 16)])
            done = other.commit_transactions("fed:eu-us:push", 15, ["other-runner"],
                                             lineage="fed:eu-us:push", after=10)
            assert done["published"] == 5
        proxy.reply_delay = 0.0
        wait_until(lambda: len(read_all(us, "orders/v1/a")) >= 20, timeout=30,
                   what="the rest on the remote")
        time.sleep(1.0)  # anything carried twice would be there by now
        assert [m.payload for m in read_all(us, "orders/v1/a")] == list(range(1, 21))
        (push,) = status(eu)["links"][0]["pipes"]
        assert push["state"] == "up" and push["lag_messages"] == 0
    finally:
        eu.stop()
        us.stop()
        proxy.close()


def test_a_message_dead_lettered_before_a_restart_is_not_kept_twice(tmp_path):
    """The last message the remote refused moves no fence there: after a restart the
    link reads it again and is refused again, but the dead letters here keep it once
    (their own fence, stored with the dead letter)."""
    schema = '[channels."orders/v1"]\nschema = { type = "object", required = ["id"] }\n'
    us = start(tmp_path, "us", schema)
    # The source keeps its messages (retention): a restarted link reads from the fences.
    eu = start(tmp_path, "eu", KEEP.replace("chat/v1", "orders/v1")
               + link("eu-us", us.url, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/1", {"id": 1})
            shop.send("orders/v1/1", "not an order")
        wait_until(lambda: len(read_all(eu, "_dead/orders/v1/1")) == 1, timeout=30,
                   what="the refused one dead-lettered here")
        eu.kill()
        eu.start()
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/1", {"id": 3})
        # In seq order: once the third is on the remote, the second was read again.
        wait_until(lambda: len(read_all(us, "orders/v1/1")) == 2, timeout=30,
                   what="the third order on the remote")
        assert [m.payload for m in read_all(us, "orders/v1/1")] == [{"id": 1}, {"id": 3}]
        assert [m.payload for m in read_all(eu, "_dead/orders/v1/1")] == ["not an order"]
    finally:
        eu.stop()
        us.stop()


def test_a_full_destination_holds_the_link_back_and_it_resumes_with_nothing_lost(tmp_path):
    """The remote's storage fills up (its max_size): the link's commits are refused
    STORAGE_FULL, the direction says so and retries, the source keeps the messages;
    once the remote has room (a reload raises max_size) the rest crosses, each once, in
    order, and the remote never stopped."""
    us = start(tmp_path, "us", '[storage]\nmax_size = "3MB"\n')
    eu = start(tmp_path, "eu", KEEP.replace("chat/v1", "orders/v1")
               + link("eu-us", us.url, push=["orders/v1/*"]))
    pad = "x" * 2000
    try:
        with eu.connect_sync("shop") as shop:
            for start_n in range(0, 3000, 250):
                shop.send_many([("orders/v1/a", {"n": n, "pad": pad})
                                for n in range(start_n, start_n + 250)])

        def refused() -> bool:
            (push,) = status(eu)["links"][0]["pipes"]
            return push["state"] == "retrying" and "max_size" in push["last_error"]
        wait_until(refused, timeout=60, what="the link to report the remote full")
        (push,) = status(eu)["links"][0]["pipes"]
        assert 0 < len(read_all(us, "orders/v1/a")) < 3000 and push["lag_messages"] > 0
        assert us.alive
        assert us.config is not None
        us.config.write_text(us.config.read_text().replace('"3MB"', '"64MB"'))
        assert us.proc is not None
        us.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: len(read_all(us, "orders/v1/a")) >= 3000, timeout=120,
                   interval=1.0, what="the rest on the remote once it has room")
        assert [m.payload["n"] for m in read_all(us, "orders/v1/a")] == list(range(3000))
        wait_until(lambda: status(eu)["links"][0]["pipes"][0]["state"] == "up", timeout=30,
                   what="the link up again")
    finally:
        eu.stop()
        us.stop()


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_redis_gone_under_the_broker_running_a_link_loses_and_repeats_nothing(tmp_path):
    """The broker running a link stores on Redis, and Redis is killed -9 mid-flow, in
    both directions (its pushes read from Redis, its pulls commit into it): the pipes
    report the refusals and retry; once Redis is back every message crosses once, in
    order."""
    redis = RedisServer(tmp_path / "redis").start()
    us = start(tmp_path, "us", KEEP.replace("chat/v1", "prices/v1"))
    config = tmp_path / "eu.toml"
    config.write_text('broker_id = "eu"\n' + OPEN + KEEP.replace("chat/v1", "orders/v1")
                      + link("eu-us", us.url, push=["orders/v1/*"], pull=["prices/v1/*"]))
    eu = BrokerProcess(tmp_path / "eu", config=config, storage=redis.url).start()
    sent = {"orders": 0, "prices": 0}
    done = threading.Event()

    def produce(broker: BrokerProcess, what: str) -> None:
        import minou

        with broker.connect_sync(f"{what}-producer", reconnect=True,
                                 request_timeout=10) as c:
            while not done.is_set() and sent[what] < 3000:
                n = sent[what]
                try:
                    c.send_many([(f"{what}/v1/{i}", n + i) for i in range(2)])
                except minou.MinouError:
                    time.sleep(0.2)  # not confirmed: sent again (the source may hold both)
                    continue
                sent[what] += 2
                time.sleep(0.002)

    threads = [threading.Thread(target=produce, args=(eu, "orders")),
               threading.Thread(target=produce, args=(us, "prices"))]
    try:
        for t in threads:
            t.start()
        wait_until(lambda: sent["orders"] >= 600, timeout=60, what="the first orders")
        redis.kill()
        with us.connect_sync("more-prices") as c:  # something for the pull to carry now
            c.send_many([("prices/v1/0", -1), ("prices/v1/1", -1)])

        seen: list[Any] = []

        def refused() -> bool:  # prices come on in us, eu cannot store them (the push
            # direction may just wait: nothing new is stored in eu meanwhile)
            pipes = {p["direction"]: p for p in status(eu)["links"][0]["pipes"]}
            seen[:] = [pipes]
            return pipes["pull"]["state"] == "retrying" and bool(pipes["pull"]["last_error"])
        try:
            # 60 s: a page already on its way may wait out its commit's request timeout
            # (30 s) before the refusal reaches the pipe (twice under a full run's load
            # the pipes still said "up", no error, at 30 s).
            wait_until(refused, timeout=60, what="the pull direction to report Redis gone")
        except AssertionError as exc:  # what it reported instead (failed once, under load)
            raise AssertionError(f"{exc}; the pipes said last: {seen}") from None
        time.sleep(2.0)
        redis.start()
        for t in threads:
            t.join(120)
            assert not t.is_alive()
        assert eu.alive and us.alive
        for what, source, dest in (("orders", eu, us), ("prices", us, eu)):
            for i in range(2):
                ch = f"{what}/v1/{i}"

                def same(ch: str = ch, source: BrokerProcess = source,
                         dest: BrokerProcess = dest) -> bool:
                    return len(read_all(dest, ch)) >= len(read_all(source, ch))
                wait_until(same, timeout=120, interval=1.0, what=f"{ch} catching up")
                want = [m.payload for m in read_all(source, ch)]
                assert len(want) >= 1500
                assert [m.payload for m in read_all(dest, ch)] == want, \
                    f"{ch}: not each once in order"
    finally:
        done.set()
        for t in threads:
            t.join(30)
        eu.stop()
        us.stop()
        redis.stop()


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


def test_a_message_or_channel_legal_here_but_not_there_stops_only_itself(tmp_path):
    """Two things the source takes and the destination refuses for ever used to stop the
    whole direction (BAD_REQUEST, retried with backoff for ever, every channel waiting):
    a channel name of 190 characters (the link's transaction id went past 200) and a
    message with 64 headers (the link adds two: 66, over MAX_HEADERS). Now the long
    channel crosses, the message with 64 headers is dead-lettered here with the reason,
    and the channels after them go on."""
    us = start(tmp_path, "us")
    eu = start(tmp_path, "eu", KEEP.replace("chat/v1", "orders/v1")
               + link("eu-us", us.url, push=["orders/v1/*"]))
    long_channel = "orders/v1/" + "x" * 190
    try:
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/a", 1)
            shop.send(long_channel, 2)
            shop.send("orders/v1/h", 3, headers={f"h{i}": "v" for i in range(64)})
            shop.send("orders/v1/h", 4)
            shop.send("orders/v1/z", 5)
        wait_until(lambda: [m.payload for m in read_all(us, "orders/v1/z")] == [5],
                   timeout=30, what="the last channel on the remote")
        assert [m.payload for m in read_all(us, long_channel)] == [2]
        assert [m.payload for m in read_all(us, "orders/v1/h")] == [4]
        (dead,) = read_all(eu, "_dead/orders/v1/h")
        assert dead.payload == 3 and dead.headers["x-dead-reason"] == "federation"
        assert "66 headers" in dead.headers["x-dead-detail"]
        (push,) = status(eu)["links"][0]["pipes"]
        assert push["state"] == "up" and push["dead_lettered"] == 1
        assert push["forwarded"] == 4 and push["lag_messages"] == 0
    finally:
        eu.stop()
        us.stop()


def test_a_destination_refusing_every_message_costs_a_few_log_lines(tmp_path):
    """A destination whose schema refuses every message: each is dead-lettered here and
    counted, but the log has at most FEDERATION_LOG_LINES lines about them (it had one
    per message: 600 lines for 600 messages)."""
    schema = '[channels."orders/v1"]\nschema = { type = "object", required = ["id"] }\n'
    us = start(tmp_path, "us", schema)
    eu = start(tmp_path, "eu", link("eu-us", us.url, push=["orders/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            shop.send_many([(f"orders/v1/{n % 3}", "not an order") for n in range(600)])
        wait_until(lambda: status(eu)["links"][0]["pipes"][0]["dead_lettered"] == 600,
                   timeout=120, interval=0.5, what="every message dead-lettered here")
        assert sum(len(read_all(eu, f"_dead/orders/v1/{i}")) for i in range(3)) == 600
        lines = [ln for ln in eu.output.splitlines() if "dead-lettered here" in ln]
        assert 1 <= len(lines) <= 10, len(lines)  # limits.FEDERATION_LOG_LINES
    finally:
        eu.stop()
        us.stop()


def test_a_page_a_lost_connection_left_staged_is_aborted_on_the_next(tmp_path):
    """The link's STAGE reaches the remote, its answer is lost and the connection is
    cut before the commit: the page stays staged there (an hour, against the link
    identity's 128 MiB of staging room: a link cut so a few dozen times an hour was then
    refused QUEUE_FULL). The next connection aborts it: nothing stays staged, the
    messages cross once, and the link counts it (orphans_dropped)."""
    us = start(tmp_path, "us")
    proxy = Proxy("127.0.0.1", us.port).start()
    eu = start(tmp_path, "eu", KEEP.replace("chat/v1", "orders/v1")
               + link("eu-us", proxy.url, push=["orders/v1/*"]))

    def transactions() -> dict[str, Any]:
        import minou

        with minou.connect_sync(us.url, **us.admin_auth()) as admin:
            return admin.admin("status")["transactions"]
    try:
        with eu.connect_sync("shop") as shop:
            shop.send("orders/v1/a", 1)
            wait_until(lambda: len(read_all(us, "orders/v1/a")) == 1, timeout=30,
                       what="the first message on the remote")
            proxy.replies_lost = True  # the remote's answers go nowhere from now
            shop.send_many([("orders/v1/a", n) for n in range(2, 12)])
        wait_until(lambda: transactions()["staged"] == 1, timeout=30,
                   what="the link's page staged on the remote")
        proxy.replies_lost = False
        proxy.cut()
        wait_until(lambda: len(read_all(us, "orders/v1/a")) == 11, timeout=60,
                   what="the page carried on the next connection")
        assert [m.payload for m in read_all(us, "orders/v1/a")] == list(range(1, 12))
        assert transactions()["staged"] == 0
        (push,) = status(eu)["links"][0]["pipes"]
        assert push["orphans_dropped"] == 1
    finally:
        eu.stop()
        us.stop()
        proxy.close()


def test_a_push_direction_down_goes_on_counting_its_lag(tmp_path):
    """While the remote is gone the direction is retrying, and its lag (status, metrics)
    grows with what is published meanwhile, instead of freezing at the last connected
    figure; it falls back to 0 once the remote is back and everything crossed."""
    us = start(tmp_path, "us")
    eu = start(tmp_path, "eu", KEEP + link("eu-us", us.url, push=["chat/v1/*"]))
    try:
        with eu.connect_sync("shop") as shop:
            shop.send_many([("chat/v1/a", n) for n in range(5)])
            wait_until(lambda: len(read_all(us, "chat/v1/a")) == 5, timeout=60,
                       what="the first messages across")
            us.kill()
            shop.send_many([("chat/v1/a", n) for n in range(5, 25)])
            wait_until(lambda: status(eu)["links"][0]["pipes"][0]["state"] == "retrying",
                       timeout=60, what="the direction to notice the remote is gone")
            shop.send_many([("chat/v1/a", n) for n in range(25, 35)])  # while it is down
        time.sleep(1.0)
        push = status(eu)["links"][0]["pipes"][0]
        assert push["state"] == "retrying" and push["lag_messages"] == 30, push
        assert push["lag_seconds"] >= 1.0, push
        key = keyfiles.load_private(eu.admin_key)
        admin = {"Authorization": f"Bearer {make_token('admin', key, 'eu', ttl=600)}"}
        metrics = httpx.get(eu.http + "/metrics", headers=admin, timeout=30).text
        assert 'minou_federation_lag_messages{direction="push",link="eu-us"} 30.0' in metrics
        us.start()
        wait_until(lambda: len(read_all(us, "chat/v1/a")) == 35, timeout=120,
                   what="the rest across once the remote is back")
        wait_until(lambda: status(eu)["links"][0]["pipes"][0]["lag_messages"] == 0,
                   timeout=60, what="the lag back to 0")
    finally:
        eu.stop()
        us.stop()


def test_a_pull_direction_down_ages_its_lag_and_says_its_count_is_the_last_known(tmp_path):
    """A pull's source is the remote: while it is gone nothing can be counted there, and
    the lag froze at the last connected figure (0 msg, 0 s for as long as the outage
    lasted, the rate at its last figure). Now lag_seconds grows from the last contact
    that found nothing behind, lag_messages is marked as the last figure known (with
    when it was counted), the rate falls to 0, and the direction's "since" stays the
    moment it went down through its retries; all back to current once the remote is."""
    us = start(tmp_path, "us", KEEP)
    eu = start(tmp_path, "eu", link("eu-us", us.url, pull=["chat/v1/*"]))
    key = keyfiles.load_private(eu.admin_key)
    admin = {"Authorization": f"Bearer {make_token('admin', key, 'eu', ttl=600)}"}

    def pull() -> dict[str, Any]:
        return status(eu)["links"][0]["pipes"][0]

    try:
        with us.connect_sync("talk") as talk:
            talk.send_many([("chat/v1/a", n) for n in range(5)])
        wait_until(lambda: len(read_all(eu, "chat/v1/a")) == 5, timeout=60,
                   what="the first messages pulled")
        wait_until(lambda: pull()["forwarded"] == 5 and pull()["lag_messages"] == 0,
                   timeout=30, what="the pull caught up")
        us.kill()
        wait_until(lambda: pull()["state"] == "retrying", timeout=60,
                   what="the direction to notice the remote is gone")
        down = pull()
        wait_until(lambda: pull()["lag_seconds"] >= down["lag_seconds"] + 2.0, timeout=60,
                   what="the pull's lag to grow while the remote is gone")
        later = pull()
        assert later["state"] == "retrying" and later["since"] == down["since"], later
        assert later["lag_counted_at"] is not None, later
        assert later["lag_last_known"] is True and later["lag_messages"] == 0, later
        assert later["lag_counted_at"] <= down["since"], later  # counted before it went
        # The rate falls to 0 once its 10 s window passed (5 were carried just before).
        wait_until(lambda: pull()["rate"] == 0.0, timeout=60, what="the rate to fall")
        metrics = httpx.get(eu.http + "/metrics", headers=admin, timeout=30).text
        lag = float(_metric(metrics, "minou_federation_lag_seconds", "pull"))
        age = float(_metric(metrics, "minou_federation_lag_messages_age_seconds", "pull"))
        assert lag >= later["lag_seconds"] and age >= 2.0, (lag, age)
        cli = subprocess.run([sys.executable, "-m", "minou", "federation"],
                             env=eu.cli_env(), capture_output=True, text=True, timeout=60)
        assert "lag 0 msg (last known, at " in cli.stdout, cli.stdout
        us.start()
        with us.connect_sync("talk") as talk:
            talk.send_many([("chat/v1/a", n) for n in range(5, 8)])
        wait_until(lambda: len(read_all(eu, "chat/v1/a")) == 8, timeout=120,
                   what="the rest pulled once the remote is back")
        wait_until(lambda: pull()["lag_seconds"] == 0.0 and pull()["state"] == "up",
                   timeout=60, what="the lag back to 0")
        assert pull()["lag_last_known"] is False
    finally:
        eu.stop()
        us.stop()


def _metric(text: str, name: str, direction: str) -> str:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'direction="{direction}"' in line:
            return line.rsplit(" ", 1)[1]
    raise AssertionError(f"no {name} for {direction} in the metrics")


def test_a_remote_reconnecting_in_a_tight_loop_leaves_nothing_behind(tmp_path):
    """A remote whose link reconnects as fast as it can (a minou link backs off; another
    implementation or a script may not): HELLO with the link's key, a pull's handshake
    (its writer's fences, OFFSETS, SET_POSITION), its long poll sent, then the socket
    reset; 3 loops at once. Meanwhile the broker answers another client's every PING
    and publish, and once it ends nothing of those connections stays: no connection,
    no long poll waiting, no descriptor, the one group, nothing logged."""
    import asyncio
    import contextlib
    import os

    us = start(tmp_path, "us", KEEP)
    pid = us.proc.pid
    with us.connect_sync("talk") as talk:
        talk.send_many([(f"chat/v1/{i}", i) for i in range(4)])

    def held() -> list[str]:
        out = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # closed while listed
                out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        return sorted(out)

    def fds() -> int:
        # SQLite's files are opened once per thread that touches storage (the loop, the
        # writer, the reader, the checkpointer: at most four, some only when first
        # needed), never per connection: what a connection could leak is the rest.
        return sum(1 for path in held() if "/minou.db" not in path)

    async def one() -> None:
        c = await us.connect("bridge", reconnect=False)
        await c.admin("txn.fences", writer_id="fed:loop:pull")
        offsets = await c.offsets(["chat/v1/*"])
        await c.set_position("federation:loop:pull",
                             {ch: first for ch, (first, _) in offsets.items()})
        after = json.dumps({ch: nxt for ch, (_, nxt) in offsets.items()})
        poll = asyncio.ensure_future(c.admin("channels.wait", patterns='["chat/v1/*"]',
                                             after=after, wait=5))
        await asyncio.sleep(0.002)  # sent: the broker holds it
        poll.cancel()
        c._proto.transport.abort()  # no BYE: a crash, a cut
        await c.close()

    async def scenario() -> tuple[int, int]:
        other = await us.connect("other")
        served = 0
        stop = asyncio.Event()

        async def serve_other() -> None:
            nonlocal served
            while not stop.is_set():
                await other.ping()
                await other.send("chat/v1/other", served)
                served += 1
                await asyncio.sleep(0.01)

        async def loop(n: int) -> int:
            for _ in range(n):
                await one()
            return n

        side = asyncio.ensure_future(serve_other())
        made = sum(await asyncio.gather(*(loop(300) for _ in range(3))))
        stop.set()
        await side
        await other.close()
        return made, served

    before_held = held()
    before = fds()
    lines = len(us.output.splitlines())
    try:
        made, served = asyncio.run(scenario())
        assert made == 900 and served > 0
        assert len(read_all(us, "chat/v1/other")) == served  # every publish stored
        import minou

        with minou.connect_sync(us.url, **us.admin_auth()) as admin:
            wait_until(lambda: admin.admin("status")["connections"] == 1, timeout=30,
                       what="only the admin's connection left")
            st = admin.admin("status")
        assert st["long_polls"] == {} and st["groups"] == 1, st
        assert st["transactions"]["staged"] == 0
        # The admin's socket is closed by the broker a moment after the client's, and a
        # housekeeping step (a checkpoint, a disk check) may hold a descriptor for a moment:
        # a leak is what never goes away.
        try:
            wait_until(lambda: fds() <= before + 1, timeout=10, what="descriptors back")
        except AssertionError:
            raise AssertionError((before_held, held())) from None
        assert sum(1 for path in held() if path.endswith("/minou.db")) <= 4, held()
        assert us.output.splitlines()[lines:] == []  # nothing logged per connection
    finally:
        us.stop()


def test_a_message_from_a_third_broker_does_not_loop_between_two_linked_both_ways(tmp_path):
    """A hub with spokes: a pushes into b, and b shares chat/* both ways with c. A
    message of a's crosses to b, then c, and c's pull must not bring it back into b (it
    was there): x-federated-from names a, which is neither b nor c, so the origin alone
    let it go round b -> c -> b for ever, a new copy on each side at each turn."""
    c = start(tmp_path, "c", KEEP)
    b = start(tmp_path, "b", KEEP + link("b-c", c.url, push=["chat/*"], pull=["chat/*"]))
    a = start(tmp_path, "a", KEEP + link("a-b", b.url, push=["chat/*"]))
    try:
        with a.connect_sync("alice") as alice:
            for n in range(5):
                alice.send("chat/v1/room", {"n": n})
        wait_until(lambda: len(read_all(b, "chat/v1/room")) >= 5 and
                   len(read_all(c, "chat/v1/room")) >= 5, timeout=30,
                   what="a's messages on b and c")
        time.sleep(2.0)  # what would loop would have come back by now, many times
        for side in (b, c):
            got = [m.payload["n"] for m in read_all(side, "chat/v1/room")]
            assert got == list(range(5)), (side.data_dir.name, len(got))
            assert {m.headers["x-federated-from"] for m in read_all(side, "chat/v1/room")} \
                == {"a"}
        # Past its first hop a message names every broker it was on.
        assert "x-federated-path" not in read_all(b, "chat/v1/room")[0].headers
        assert read_all(c, "chat/v1/room")[0].headers["x-federated-path"] == '["a","b"]'
        skipped = sum(p["skipped_loops"] for ln in status(b)["links"] for p in ln["pipes"])
        assert skipped >= 5  # each came back from c once and went no further
    finally:
        a.stop()
        b.stop()
        c.stop()


def test_a_remote_naming_channels_outside_the_pull_patterns_writes_none_of_them(tmp_path):
    """A pull direction writes into this broker with the broker's own authority, into
    the channels its remote's OFFSETS answer names. A remote that lies (compromised, or
    another implementation with a bug) named channels its ``pull`` patterns do not
    match, and the link wrote them here: anything, an admin's channels included. Now
    only channels the patterns match cross; the others are refused, said (the
    direction's last_error, ``foreign_channels``) and logged, and the rest go on."""
    from .fake_remote import FakeRemote

    remote = FakeRemote("evil", {"prices/v1/tea": [b'{"eur": 4.2}'],
                                 "billing/v1/acct": [b'{"owed": 0}'],
                                 "_dead/orders/v1/1": [b'"forged"']}).start()
    eu = start(tmp_path, "eu", KEEP + link("eu-evil", remote.url, pull=["prices/*"]))
    try:
        wait_until(lambda: len(read_all(eu, "prices/v1/tea")) == 1, timeout=30,
                   what="the price pulled")
        time.sleep(1.0)  # the lie has been heard a few times over
        assert read_all(eu, "billing/v1/acct") == []
        assert read_all(eu, "_dead/orders/v1/1") == []
        assert set(remote.reads) == {"prices/v1/tea"}
        (pipe,) = status(eu)["links"][0]["pipes"]
        assert pipe["state"] == "up" and pipe["forwarded"] == 1
        assert pipe["foreign_channels"] == 2
        assert "billing/v1/acct" in pipe["last_error"] and "prices/*" in pipe["last_error"]
        lines = [ln for ln in eu.output.splitlines() if "billing/v1/acct" in ln]
        assert len(lines) == 1, lines  # once, not at each turn
    finally:
        eu.stop()
        remote.stop()
