"""The Redis protocol door (issue 26) against a real broker process, with real
clients: redis-py (sync and asyncio, RESP2 and RESP3) and redis-cli. Stream entries
round-trip byte for byte; messages cross between RESP, the native protocol and HTTP;
authentication is the broker's; errors are Redis's words and minou's reasons."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, client_key, wait_until
from .test_http_api import admin_bearer

redis = pytest.importorskip("redis")
REDIS_CLI = shutil.which("redis-cli")


@pytest.fixture
def broker(broker_factory: Any) -> BrokerProcess:
    return broker_factory.make(resp_port=0).start()


def token(b: BrokerProcess, client_id: str) -> str:
    """The client's key is registered by a first native connection, then its JWT is
    the Redis password (reusable until it expires, as an HTTP bearer)."""
    with b.connect_sync(client_id):
        pass
    return make_token(client_id, keyfiles.load_private(client_key(client_id)), "minou",
                      ttl=600)


def connect(b: BrokerProcess, client_id: str = "app", *, timeout: float = 10, **kw: Any
            ) -> Any:
    """``timeout``: how long an answer may take before the client gives up (a deadline
    for a hang: raise it for a command whose work is long on a loaded machine)."""
    return redis.Redis(host="127.0.0.1", port=b.resp_port, username=client_id,
                       password=token(b, client_id), socket_timeout=timeout, **kw)


# A script that runs into its time limit (5 s of wall-clock time) answers late on a
# loaded machine, and more than 10 s late made redis-py send it again: such scripts are
# awaited this long.
SCRIPT_DEADLINE_S = 120.0


def test_a_connection_must_authenticate_and_wrong_passwords_say_wrongpass(broker) -> None:
    anonymous = redis.Redis(host="127.0.0.1", port=broker.resp_port, socket_timeout=10)
    # NOAUTH, as a Redis with a password says (redis-py 8 says HELLO first: that one)
    with pytest.raises(redis.AuthenticationError,
                       match=r"Authentication required|already authenticated"):
        anonymous.ping()
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        redis.Redis(host="127.0.0.1", port=broker.resp_port, password="not-a-token",
                    socket_timeout=10).ping()
    jwt = token(broker, "app")
    with pytest.raises(redis.AuthenticationError, match="client 'app'"):
        redis.Redis(host="127.0.0.1", port=broker.resp_port, username="someone-else",
                    password=jwt, socket_timeout=10).ping()
    for proto in (2, 3):  # AUTH <user> <pass>, HELLO 3 AUTH <user> <pass>
        r = redis.Redis(host="127.0.0.1", port=broker.resp_port, username="app",
                        password=jwt, protocol=proto, socket_timeout=10)
        assert r.ping() is True
    assert redis.Redis(host="127.0.0.1", port=broker.resp_port, password=jwt,
                       socket_timeout=10).ping()  # the password alone (user "default")


def test_pipelined_xadds_answer_each_in_order_and_a_payload_too_deep_alone(broker) -> None:
    """The fast lane answers a pipeline's XADDs from one slot: a refusal among them
    still answers that command alone, in its place, and the others are stored."""
    r = connect(broker)
    deep = b"[" * 65 + b"]" * 65  # MAX_JSON_DEPTH is 64
    pipe = r.pipeline(transaction=False)
    pipe.xadd("deep", {"n": "1"}).xadd("deep", {"payload": deep}).xadd("deep", {"n": "3"})
    pipe.xadd("deep", {"payload": b"[1, 2"})  # not JSON: a text field like any other
    pipe.xlen("deep").xadd("deep", {"n": "5"})
    first, refused, third, fourth, length, fifth = pipe.execute(raise_on_error=False)
    assert isinstance(refused, redis.ResponseError)
    assert str(refused).startswith("INVALID_PAYLOAD payload nests arrays and objects 65 deep")
    ids = [first, third, fourth, fifth]
    assert [int(i.split(b"-")[0]) for i in ids] == sorted(int(i.split(b"-")[0]) for i in ids)
    assert length == 3
    assert [e[1] for e in r.xrange("deep")] == [{b"n": b"1"}, {b"n": b"3"},
                                                {b"payload": b"[1, 2"}, {b"n": b"5"}]
    text = httpx.get(f"{broker.http}/metrics", headers=admin_bearer(broker), timeout=10).text
    assert 'minou_requests_refused_total{reason="invalid_payload"} 1.0' in text  # counted


def test_entries_round_trip_byte_for_byte_in_resp2_and_resp3(broker) -> None:
    entries = [
        {b"payload": b'{"order": 1, "items": ["tea"]}'},  # a JSON payload
        {b"user": b"ann", b"action": b"login"},  # text fields: a JSON object
        {b"blob": b"\xff\x00\xfe", b"": b"empty name"},  # binary, an empty name
    ]
    for proto in (2, 3):
        r = connect(broker, protocol=proto)
        key = f"events-{proto}"
        ids = [r.xadd(key, e) for e in entries]
        assert ids == [b"1-0", b"2-0", b"3-0"]
        # repeated and ordered fields, as a raw command (redis-py's dict cannot say it)
        assert r.execute_command("XADD", key, "*", "b", "1", "a", "2", "b", "3") == b"4-0"
        got = r.xrange(key)
        assert [i for i, _ in got] == [b"1-0", b"2-0", b"3-0", b"4-0"]
        assert [e for _, e in got[:3]] == entries
        conn = r.connection_pool.get_connection()  # the reply as sent, unparsed
        try:
            conn.send_command("XRANGE", key, "4-0", "4-0")
            assert conn.read_response() == [[b"4-0", [b"b", b"1", b"a", b"2", b"b", b"3"]]]
        finally:
            r.connection_pool.release(conn)
        assert r.xlen(key) == 4
        assert [i for i, _ in r.xrevrange(key, count=2)] == [b"4-0", b"3-0"]
        assert [i for i, _ in r.xrange(key, "(2-0", "+")] == [b"3-0", b"4-0"]
        assert r.xrange("never-written") == []


def test_what_resp_writes_other_interfaces_read_and_the_other_way_round(broker) -> None:
    r = connect(broker)
    r.xadd("orders/v1/eu", {"payload": '{"n": 1}'})
    r.xadd("mystream", {"user": "ann"})
    r.xadd("mystream", {"bin": b"\xff"})
    with broker.connect_sync("reader") as c:
        (m,) = c.read("orders/v1/eu", 1)[0]
        assert m.payload == {"n": 1}
        plain, binary = c.read("redis/v1/mystream", 1)[0]  # a plain key's channel
        assert plain.payload == {"user": "ann"}
        assert plain.headers["x-resp-entry"] == "fields"
        assert binary.headers["x-resp-entry"] == "binary"
        c.send("orders/v1/eu", {"n": 2}, headers={"trace": "t"})
    key = keyfiles.load_private(client_key("http-app"))
    with broker.connect_sync("http-app"):
        pass
    bearer = {"Authorization": f"Bearer {make_token('http-app', key, 'minou', ttl=600)}"}
    httpx.post(broker.http + "/v1/messages/orders/v1/eu", json={"n": 3}, headers=bearer,
               timeout=10).raise_for_status()
    got = r.xrange("orders/v1/eu")
    assert [e for _, e in got] == [{b"payload": b'{"n": 1}'}, {b"payload": b'{"n":2}'},
                                   {b"payload": b'{"n":3}'}]


def test_refusals_are_redis_errors_and_the_connection_goes_on(broker_factory) -> None:
    cfg = broker_factory.make().data_dir.parent / "resp-rules.toml"
    cfg.write_text('[[rules]]\nclient = "ro"\nread = ["*"]\nwrite = []\n'
                   '[[rules]]\nclient = "writer"\nread = ["*"]\nwrite = ["*"]\n'
                   '[[rules]]\nclient = "outsider"\nread = ["other/*"]\n'
                   'write = ["other/*"]\n'
                   '[channels."orders/v1"]\nschema = { type = "object", required = ["id"] }\n')
    b = broker_factory.make(resp_port=0, config=cfg).start()
    r = connect(b, "ro")
    with pytest.raises(redis.ResponseError) as err:
        r.xadd("orders/v1/eu", {"payload": '{"id": 1}'})
    assert str(err.value).startswith("NOT_AUTHORIZED client 'ro' may not")  # -NOPERM ...
    assert r.xlen("orders/v1/eu") == 0  # the connection goes on
    w = connect(b, "writer")
    with pytest.raises(redis.ResponseError, match=r"^SCHEMA_MISMATCH"):
        w.xadd("orders/v1/eu", {"payload": '{"no_id": 1}'})
    with pytest.raises(redis.ResponseError, match="unknown command 'NOSUCH'"):
        w.execute_command("NOSUCH", "a")
    with pytest.raises(redis.ResponseError, match="wrong number of arguments for 'xadd'"):
        w.execute_command("XADD", "k", "*", "odd")
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        w.execute_command("XRANGE", "k", "x-y", "+")
    with pytest.raises(redis.ResponseError, match="exact threshold is not supported"):
        w.xadd("k", {"a": "1"}, maxlen=10, approximate=False)
    assert w.xadd("k", {"a": "1"}, maxlen=10) == b"1-0"  # ~ : kept, trims nothing
    assert w.xadd("nothing-here", {"a": "1"}, nomkstream=True) is None
    with pytest.raises(redis.ResponseError, match="DB index is out of range"):
        w.execute_command("SELECT", "1")
    # Groups are under the rules too: reading them needs read rights, changing them write
    first = w.xadd("orders/v1/eu", {"payload": '{"id": 1}'})
    w.xgroup_create("orders/v1/eu", "billing", id="0")
    with pytest.raises(redis.exceptions.NoPermissionError, match="NOT_AUTHORIZED"):
        r.xgroup_destroy("orders/v1/eu", "billing")  # ro: may read, not write
    outsider = connect(b, "outsider")
    for attempt in (lambda: outsider.xack("orders/v1/eu", "billing", "1-0"),
                    lambda: outsider.xpending("orders/v1/eu", "billing"),
                    lambda: outsider.xinfo_groups("orders/v1/eu"),
                    lambda: outsider.xreadgroup("billing", "x", {"orders/v1/eu": ">"}),
                    lambda: outsider.xrange("orders/v1/eu")):
        with pytest.raises(redis.exceptions.NoPermissionError, match="NOT_AUTHORIZED"):
            attempt()
    assert w.xgroup_destroy("orders/v1/eu", "billing") == 1
    with pytest.raises(redis.exceptions.NoPermissionError, match="NOT_AUTHORIZED"):
        r.xdel("orders/v1/eu", first)  # deleting is a write
    assert w.xlen("orders/v1/eu") == 1 and w.xdel("orders/v1/eu", first) == 1
    assert w.xlen("orders/v1/eu") == 0
    with pytest.raises(redis.ResponseError, match="unknown subcommand 'MAINT_NOTIFICATIONS'"):
        w.execute_command("CLIENT", "MAINT_NOTIFICATIONS", "on")
    assert w.ping() is True


def test_connection_commands_clients_send(broker) -> None:
    r = connect(broker, protocol=3, client_name="worker-1")
    hello = r.execute_command("HELLO", "3")
    assert hello[b"server"] == b"redis" and hello[b"version"] >= b"7.0"
    assert hello[b"proto"] == 3 and isinstance(hello[b"id"], int)
    assert r.client_getname() == b"worker-1"
    assert isinstance(r.client_id(), int)
    assert r.echo("hi") == b"hi"
    info = r.info()
    assert info["redis_version"] == "7.2.0" and info["role"] == "master"
    assert info["minou_request_parser"] == "hiredis"  # minou[resp] is installed here
    assert r.execute_command("SELECT", "0")
    pipe = r.pipeline(transaction=False)
    for i in range(200):
        pipe.xadd("piped", {"i": str(i)})
    ids = pipe.execute()
    assert ids == [f"{i}-0".encode() for i in range(1, 201)]  # replies in order


def test_asyncio_redis_py(broker) -> None:
    import redis.asyncio as aredis

    jwt = token(broker, "async-app")

    async def run() -> list[Any]:
        r = aredis.Redis(host="127.0.0.1", port=broker.resp_port, username="async-app",
                         password=jwt, protocol=3)
        try:
            await asyncio.gather(*(r.xadd("a-stream", {"n": str(n)}) for n in range(50)))
            return await r.xrange("a-stream")
        finally:
            await r.aclose()

    got = asyncio.run(run())
    assert sorted(int(e[b"n"]) for _, e in got) == list(range(50))


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli (redis-tools) is not installed")
def test_redis_cli_scripted(broker) -> None:
    jwt = token(broker, "cli")
    base = [REDIS_CLI, "-h", "127.0.0.1", "-p", str(broker.resp_port), "--user", "cli",
            "--pass", jwt, "--no-auth-warning"]

    def cli(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run([*base, *args], input=stdin, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert cli("XADD", "orders/v1/cli", "*", "payload", '{"n":1}').strip() == "1-0"
    assert cli("XLEN", "orders/v1/cli").strip() == "1"
    assert cli("XRANGE", "orders/v1/cli", "-", "+").split() == ["1-0", "payload", '{"n":1}']
    # A pipe of inline commands, as `cat commands.txt | redis-cli` sends them
    out = cli(stdin='XADD orders/v1/cli * payload "{\\"n\\":2}"\nXLEN orders/v1/cli\nNOPE\n')
    assert out.split("\n")[:2] == ["2-0", "2"]
    assert "ERR unknown command 'NOPE'" in out
    assert cli("PING").strip() == "PONG"
    anonymous = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(broker.resp_port),
                                "XLEN", "k"], capture_output=True, text=True, timeout=30)
    assert "NOAUTH Authentication required" in anonymous.stdout + anonymous.stderr


def test_consumer_groups_as_a_streams_worker_uses_them(broker) -> None:
    r = connect(broker, "worker")
    for n in range(5):
        r.xadd("jobs", {"n": str(n)})
    assert r.xgroup_create("jobs", "workers", id="0") is True
    with pytest.raises(redis.ResponseError, match=r"^BUSYGROUP Consumer Group name already"):
        r.xgroup_create("jobs", "workers", id="0")
    with pytest.raises(redis.ResponseError, match="requires the key to exist"):
        r.xgroup_create("no-such-stream", "workers", id="$")
    assert r.xgroup_create("no-such-stream", "workers", id="$", mkstream=True) is True
    with pytest.raises(redis.ResponseError, match=r"^NOGROUP No such key 'jobs'"):
        r.xreadgroup("nobody", "c1", {"jobs": ">"})
    for missing in (lambda: r.xpending("jobs", "nobody"),
                    lambda: r.xclaim("jobs", "nobody", "c1", 0, [b"1-0"]),
                    lambda: r.xautoclaim("jobs", "nobody", "c1", 0, "0-0")):
        with pytest.raises(redis.ResponseError, match=r"^NOGROUP No such key 'jobs' or "
                           "consumer group 'nobody'"):
            missing()

    ((key, got),) = r.xreadgroup("workers", "c1", {"jobs": ">"}, count=2)
    assert key == b"jobs" and [i for i, _ in got] == [b"1-0", b"2-0"]
    assert got[0][1] == {b"n": b"0"}
    summary = r.xpending("jobs", "workers")
    assert summary["pending"] == 2 and summary["consumers"] == [{"name": b"c1", "pending": 2}]
    # Its own pending entries again (id 0): what a restarted worker reads first
    assert [i for i, _ in r.xreadgroup("workers", "c1", {"jobs": "0"})[0][1]] == \
        [b"1-0", b"2-0"]
    assert r.xack("jobs", "workers", b"1-0") == 1
    assert r.xack("jobs", "workers", b"1-0") == 0  # not pending any more
    # c1 went quiet: c2 claims what it held
    claimed = r.xautoclaim("jobs", "workers", "c2", min_idle_time=0, start_id="0-0")
    assert claimed[0] == b"0-0" and [i for i, _ in claimed[1]] == [b"2-0"]
    (entry,) = r.xpending_range("jobs", "workers", "-", "+", 10)
    assert entry["consumer"] == b"c2" and entry["times_delivered"] == 2
    assert r.xclaim("jobs", "workers", "c3", 0, [b"2-0"], justid=True) == [b"2-0"]
    # the rest, then nothing: a blocking read times out with nil
    rest = r.xreadgroup("workers", "c2", {"jobs": ">"}, count=10, block=100)
    assert [i for i, _ in rest[0][1]] == [b"3-0", b"4-0", b"5-0"]
    assert not r.xreadgroup("workers", "c2", {"jobs": ">"}, count=10, block=200)
    assert r.xack("jobs", "workers", b"2-0", b"3-0", b"4-0", b"5-0") == 4
    assert r.xpending("jobs", "workers")["pending"] == 0
    (info,) = r.xinfo_groups("jobs")
    assert info["name"] == b"workers" and info["last-delivered-id"] == b"5-0"
    assert {c["name"] for c in r.xinfo_consumers("jobs", "workers")} >= {b"c1", b"c2"}


def test_a_blocked_read_gets_what_is_published_meanwhile_and_noack(broker) -> None:
    r = connect(broker, "blocker")
    r.xgroup_create("events", "g", id="$", mkstream=True)
    out: list[Any] = []
    reader = threading.Thread(target=lambda: out.append(
        r.xreadgroup("g", "c", {"events": ">"}, count=5, block=10_000, noack=True)))
    reader.start()
    time.sleep(0.5)
    connect(broker, "producer").xadd("events", {"hello": "world"})
    reader.join(15)
    ((_, entries),) = out[0]
    assert entries[0][1] == {b"hello": b"world"}
    assert r.xpending("events", "g")["pending"] == 0  # NOACK: nothing pending


def test_a_streams_worker_survives_a_kill_9_losing_nothing_confirmed(broker) -> None:
    """A typical worker loop (xreadgroup / xack / xautoclaim) against a broker killed -9
    mid-flow: every XADD that returned an id is processed, at least once."""
    producer = connect(broker, "producer")
    producer.xgroup_create("work", "workers", id="0", mkstream=True)
    confirmed: list[int] = []
    processed: set[int] = set()
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        n = 0
        while not stop.is_set() and n < 400:
            try:
                connect(broker, "producer").xadd("work", {"n": str(n)})
            except Exception as exc:  # the broker is down: again
                errors.append(repr(exc))
                time.sleep(0.2)
                continue
            confirmed.append(n)
            n += 1

    def work() -> None:
        client = None
        while not stop.is_set():
            try:
                client = client or connect(broker, "worker")
                client.xautoclaim("work", "workers", "w1", min_idle_time=5000,
                                  start_id="0-0")
                got = client.xreadgroup("workers", "w1", {"work": ">"}, count=50, block=200)
                for _, entries in got or []:
                    for msg_id, fields in entries:
                        processed.add(int(fields[b"n"]))
                        client.xack("work", "workers", msg_id)
            except Exception as exc:  # the broker is down: again
                errors.append(repr(exc))
                client = None
                time.sleep(0.2)

    threads = [threading.Thread(target=produce), threading.Thread(target=work)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(confirmed) < 150 and time.monotonic() < deadline:
            time.sleep(0.05)
        broker.kill()
        broker.start()
        deadline = time.monotonic() + 60
        while (len(confirmed) < 400 or not set(confirmed) <= processed) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert len(confirmed) == 400, errors[-5:]
    assert set(confirmed) <= processed, sorted(set(confirmed) - processed)[:10]


def test_xread_reads_after_an_id_and_blocks_for_new_entries(broker) -> None:
    r = connect(broker, "reader")
    for n in range(3):
        r.xadd("feed", {"n": str(n)})
    ((key, entries),) = r.xread({"feed": "0"})
    assert key == b"feed" and [i for i, _ in entries] == [b"1-0", b"2-0", b"3-0"]
    assert [i for i, _ in r.xread({"feed": "1-0"}, count=1)[0][1]] == [b"2-0"]
    assert not r.xread({"feed": "$"}, block=200)  # nothing new: nil after the wait
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(r.xread({"feed": "$"}, block=10_000)))
    t.start()
    time.sleep(0.5)
    connect(broker, "writer").xadd("feed", {"n": "new"})
    t.join(15)
    ((_, got),) = out[0]
    assert got == [(b"4-0", {b"n": b"new"})]
    # XDEL: gone for every reader, across interfaces; ids that name no entry count 0
    assert r.xdel("feed", b"2-0", b"2-1", b"99-0", b"2-0") == 1
    assert r.xdel("feed", b"2-0") == 0 and r.xdel("no-such-stream", b"1-0") == 0
    assert [i for i, _ in r.xrange("feed")] == [b"1-0", b"3-0", b"4-0"]
    assert r.xlen("feed") == 3
    r.xgroup_create("feed", "g", id="0")
    assert [i for i, _ in r.xreadgroup("g", "c", {"feed": ">"})[0][1]] == \
        [b"1-0", b"3-0", b"4-0"]
    with pytest.raises(redis.ResponseError, match="Invalid stream ID"):
        r.xdel("feed", b"x")
    broker.kill()  # the delete was durable when answered
    broker.start()
    r = connect(broker, "reader")
    assert [i for i, _ in r.xrange("feed")] == [b"1-0", b"3-0", b"4-0"]
    assert r.xtrim("feed", maxlen=1, approximate=True) == 0


def test_a_pipeline_that_ends_with_a_command_waiting_for_another_is_answered(broker) -> None:
    """A read after XADDs waits for their commit, a command after a plain key's waits for
    it: when such a command ends the pipeline, its answer still goes out (nothing else
    arrives to send it)."""
    r = connect(broker)
    pipe = r.pipeline(transaction=False)
    pipe.xadd("ends", {"a": "1"}).xadd("ends", {"a": "2"}).xlen("ends")
    assert pipe.execute()[2] == 2
    pipe = r.pipeline(transaction=False)
    pipe.set("ends-key", "v").xlen("ends")  # SET runs on a task; XLEN after it
    assert pipe.execute() == [True, 2]


def test_a_client_that_does_not_read_its_replies_holds_little_of_the_broker(broker) -> None:
    """Pipelined reads whose replies the client never takes: once a megabyte of replies
    waits, the broker runs no more of its commands and stops reading it (before, 3,000
    XRANGEs of 100 KB made it hold 720 MB). Others are served meanwhile; once the client
    reads, every reply comes, in order."""
    import socket

    import hiredis

    def rss_mb() -> float:
        status = Path(f"/proc/{broker.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    r = connect(broker)
    pipe = r.pipeline(transaction=False)
    for _ in range(100):
        pipe.xadd("wide", {"d": "x" * 500})
    pipe.execute()
    before = rss_mb()
    s = socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10)
    password = token(broker, "app").encode()
    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password))
    xrange = b"*4\r\n$6\r\nXRANGE\r\n$4\r\nwide\r\n$1\r\n-\r\n$1\r\n+\r\n"
    s.sendall(xrange * 2000)  # ~100 MB of replies, none read yet
    assert r.xlen("wide") == 100  # another client is served meanwhile
    assert rss_mb() - before < 40, (before, rss_mb())
    reader, replies = hiredis.Reader(), []
    deadline = time.monotonic() + 60
    while len(replies) < 2001 and time.monotonic() < deadline:
        reader.feed(s.recv(1 << 20))
        while (reply := reader.gets()) is not False:
            replies.append(reply)
    s.close()
    assert replies[0] == b"OK" and len(replies) == 2001
    assert all(len(reply) == 100 for reply in replies[1:])


def test_without_hiredis_the_pure_parser_serves_the_same(broker_factory, tmp_path,
                                                       monkeypatch) -> None:
    """A core install (no minou[resp]): the broker reads requests with the pure-Python
    parser, and a client sees no difference."""
    blocker = tmp_path / "no-hiredis"
    blocker.mkdir()
    (blocker / "hiredis.py").write_text("raise ImportError('hiredis blocked by the test')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocker))  # the broker's import finds this first
    b = broker_factory.make(resp_port=0).start()
    r = connect(b)
    assert r.info()["minou_request_parser"] == "python"
    pipe = r.pipeline(transaction=False)
    for i in range(300):
        pipe.xadd("plain", {"i": str(i)})
    pipe.xlen("plain")
    *ids, length = pipe.execute()
    assert ids == [f"{i}-0".encode() for i in range(1, 301)] and length == 300
    r.xgroup_create("plain", "g", id="0")
    got = r.xreadgroup("g", "c", {"plain": ">"}, count=1000)[0][1]
    assert len(got) == 300 and got[7][1] == {b"i": b"7"}
    assert r.xack("plain", "g", *[i for i, _ in got]) == 300
    import socket

    with socket.create_connection(("127.0.0.1", b.resp_port), timeout=10) as s:
        s.sendall(b"PING\r\n")  # inline, before AUTH
        assert s.recv(100).startswith(b"-NOAUTH")


def test_bad_bytes_get_a_protocol_error_the_broker_goes_on(broker) -> None:
    """Bad input from outside (raw sockets: no client library sends these): a precise
    error in Redis's words, the connection closed, the broker unharmed and counting."""
    import socket

    def send(data: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    assert send(b"*1\r\n$99999999999\r\n") == b"-ERR Protocol error: invalid bulk length\r\n"
    assert send(b"*2\r\n:1\r\n") == b"-ERR Protocol error: expected '$', got ':'\r\n"
    assert send(b'PING "open\r\n') == b"-ERR Protocol error: unbalanced quotes in request\r\n"
    # many arguments, each within the limit, together over it: refused before the rest
    # arrives (the C reader hands such a command to the pure parser, which counts)
    arg = b"$1000000\r\n" + b"x" * 1_000_000 + b"\r\n"
    jwt = token(broker, "bytes").encode()
    auth = b"*3\r\n$4\r\nAUTH\r\n$5\r\nbytes\r\n$%d\r\n%s\r\n" % (len(jwt), jwt)
    assert send(auth + b"*40\r\n" + arg * 2 + b"$1000000\r\n") == \
        b"+OK\r\n-ERR Protocol error: too big request\r\n"
    # before AUTH, a request over 64 KiB at all (it can only be an AUTH or a HELLO)
    assert send(b"*40\r\n" + arg * 2 + b"$1000000\r\n") == \
        b"-ERR Protocol error: unauthenticated request of over 65536 bytes; AUTH first\r\n"
    # before them, what was well framed is answered (here: it needs AUTH first)
    assert send(b"XLEN k\r\n*x\r\n") == (b"-NOAUTH Authentication required.\r\n"
                                        b"-ERR Protocol error: invalid multibulk length\r\n")
    assert connect(broker, "after").ping() is True
    assert broker.alive


def test_a_client_sending_an_argument_too_big_reads_why_before_the_close(broker) -> None:
    """redis-py writes a whole 10 MB key before it reads: the broker refuses at the
    length line, then keeps reading (and dropping) the rest for a while, so the error
    reaches the client rather than a reset (closing a socket with bytes unread makes
    the kernel send one, which can destroy the reply)."""
    r = connect(broker, "big")
    with pytest.raises(redis.ResponseError, match="Protocol error: invalid bulk length"):
        r.set(b"k" * 10_000_000, b"v")
    assert r.ping() is True  # redis-py reconnects; the broker goes on
    assert broker.alive


def test_a_connection_that_never_authenticates_is_closed(broker_factory) -> None:
    import socket

    cfg = broker_factory.make().data_dir.parent / "short-hello.toml"
    cfg.write_text("hello_timeout = 1.0\n")
    b = broker_factory.make(resp_port=0, config=cfg).start()
    with socket.create_connection(("127.0.0.1", b.resp_port), timeout=10) as s:
        started = time.monotonic()
        assert s.recv(1000) == b"-ERR no AUTH within 1 s\r\n"
        assert s.recv(1000) == b""  # closed
        assert time.monotonic() - started < 5


def test_a_stranger_cannot_make_the_broker_hold_a_large_request_before_auth(broker) -> None:
    """Before AUTH a request is an AUTH's size (64 KiB): a stranger's unfinished 1 MB
    command was held whole until hello_timeout, per socket (40 sockets: +43 MiB). An
    AUTH pipelined ahead of a large XADD, in the same write, lets the XADD through."""
    import socket

    from minou.limits import MAX_HELLO_FRAME_SIZE

    def bulk(*args: bytes) -> bytes:
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a)
                                                 for a in args)

    with socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10) as s:
        s.sendall(b"*3\r\n$4\r\nAUTH\r\n$1\r\nx\r\n$1000000\r\n" + b"x" * 100_000)
        started = time.monotonic()
        answer = s.recv(1000)  # at once: not at hello_timeout (10 s)
        assert answer.startswith(b"-ERR Protocol error: unauthenticated request of over "
                                 b"%d bytes" % MAX_HELLO_FRAME_SIZE), answer
        assert time.monotonic() - started < 5
    jwt = token(broker, "app").encode()
    with socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10) as s:
        s.sendall(bulk(b"AUTH", b"app", jwt)
                  + bulk(b"XADD", b"big/v1/a", b"*", b"f", b"x" * 500_000))
        answers = b""
        while answers.count(b"\r\n") < 3:
            answers += s.recv(1000)
        assert answers.startswith(b"+OK\r\n$") and b"-0\r\n" in answers, answers
    assert connect(broker).xlen("big/v1/a") == 1


def test_plain_keys_for_locks_and_markers_are_durable(broker) -> None:
    """SET/GET/DEL/EXISTS/TYPE/EXPIRE/TTL: a framework's locks and markers, kept in the
    KV bucket 'redis' (durable, under the rules), across a restart."""
    r = connect(broker, "locker")
    assert r.set("marker", b"\x00v1") is True and r.get("marker") == b"\x00v1"
    assert r.set("marker", "v2", nx=True) is None  # NX: a value is there
    assert r.set("marker", "v3", xx=True) is True and r.get("marker") == b"v3"
    assert r.set("nothing", "x", xx=True) is None
    assert r.set("marker", "v4", get=True) == b"v3"
    assert r.set("lock:jobs", "token-1", nx=True, px=60_000) is True
    assert 0 < r.pttl("lock:jobs") <= 60_000 and r.ttl("marker") == -1 and r.ttl("nope") == -2
    assert r.exists("marker", "lock:jobs", "nope") == 2
    r.xadd("events", {"a": "1"})
    assert (r.type("marker"), r.type("events"), r.type("nope")) == (b"string", b"stream",
                                                                    b"none")
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        r.get("events")
    assert r.expire("marker", 100) is True and 95 <= r.ttl("marker") <= 100
    assert r.persist("marker") is True and r.ttl("marker") == -1
    assert r.set("short", "x", px=200) is True
    time.sleep(0.4)
    assert r.get("short") is None  # expired
    assert r.set("key with spaces/and//slashes", "ok") is True  # stored encoded
    assert r.get("key with spaces/and//slashes") == b"ok"
    broker.kill()
    broker.start()
    r = connect(broker, "locker")
    assert r.get("marker") == b"v4" and r.get("lock:jobs") == b"token-1"  # durable
    assert r.delete("marker", "nope") == 1 and r.get("marker") is None
    with broker.connect_sync("kv-reader") as c:  # the same values through KV
        assert c.kv("redis").get("lock:jobs").value == b"token-1"
        c.kv("redis").put("made-by-kv", {"a": [1, 2]})
    assert r.get("made-by-kv") == b'{"a":[1,2]}'  # a JSON value: its text


def test_multi_exec_and_lua_as_redis_py_uses_them(broker) -> None:
    r = connect(broker, "scripted", timeout=SCRIPT_DEADLINE_S)
    with r.pipeline(transaction=True) as pipe:  # MULTI ... EXEC
        pipe.set("a", "1").get("a").xadd("tx-stream", {"f": "v"}).xlen("tx-stream")
        assert pipe.execute() == [True, b"1", b"1-0", 1]
    # The XADDs of one EXEC are one publish: nothing another client sends meanwhile
    # comes between them (one commit)
    stop = threading.Event()

    def other() -> None:
        o = connect(broker, "other")
        while not stop.is_set():
            o.xadd("tx-shared", {"from": "other"})

    t = threading.Thread(target=other)
    t.start()
    try:
        # the other client is writing (a count, not a time: on a loaded machine it took
        # more than the 10 s this once waited, and the EXECs ran alone)
        wait_until(lambda: r.xlen("tx-shared") >= 20, 60, what="the other client's XADDs")
        for _ in range(3):
            with r.pipeline(transaction=True) as pipe:
                for n in range(30):
                    pipe.xadd("tx-shared", {"n": str(n)})
                seqs = [int(i.split(b"-")[0]) for i in pipe.execute()]
            assert seqs == list(range(seqs[0], seqs[0] + 30))
    finally:
        stop.set()
        t.join(10)
    r.execute_command("MULTI")
    with pytest.raises(redis.ResponseError, match="unknown command 'NOSUCH'"):
        r.execute_command("NOSUCH")  # refused when queued, as Redis does
    with pytest.raises(redis.exceptions.ExecAbortError, match="Transaction discarded"):
        r.execute_command("EXEC")  # -EXECABORT
    lock = r.lock("jobs-lock", timeout=300)  # SET NX PX, then a Lua release (EVALSHA)
    assert lock.acquire(blocking=False)
    assert not r.lock("jobs-lock", timeout=300).acquire(blocking=False)
    lock.release()
    assert r.get("jobs-lock") is None
    assert r.eval("return redis.call('GET', KEYS[1])", 1, "a") == b"1"
    # Stream replies reach a script and EXEC as values (the fast lanes answer sockets
    # with RESP they made in one go; these must not get those bytes)
    sid = r.eval("return redis.call('XADD', KEYS[1], '*', 'f', 'v')", 1, "lua-stream")
    assert re.fullmatch(rb"\d+-0", sid)
    r.xgroup_create("lua-stream", "lg", id="0")
    assert r.eval("local got = redis.call('XREADGROUP', 'GROUP', 'lg', 'c', 'COUNT', 5, "
                  "'STREAMS', KEYS[1], '>'); return got[1][2][1]", 1,
                  "lua-stream") == [sid, [b"f", b"v"]]
    with r.pipeline(transaction=True) as pipe:
        pipe.xadd("lua-stream", {"g": "w"}).xreadgroup("lg", "c", {"lua-stream": ">"}, count=5)
        added, read = pipe.execute()
    assert read == [[b"lua-stream", [(added, {b"g": b"w"})]]]
    assert r.xack("lua-stream", "lg", sid, added) == 2
    assert r.eval("return {1, 'two', {3}}", 0) == [1, b"two", [3]]
    assert r.eval("return redis.status_reply('FINE')", 0) == b"FINE"
    with pytest.raises(redis.ResponseError, match="Error running script"):
        r.eval("return redis.call('NOSUCH')", 0)
    # pcall gives the error to the script as a table {err = ...}
    assert r.eval("local e = redis.pcall('NOSUCH'); return type(e) .. ':' .. "
                  "string.sub(e.err, 1, 3)", 0) == b"table:ERR"
    with pytest.raises(redis.ResponseError, match=r"^BUSY"):
        r.eval("while true do end", 0)  # stopped after its time limit
    assert r.eval("return os == nil and io == nil", 0) == 1  # sandboxed
    # A script's writes are compare-and-set on what it read: a client writing the key
    # while the script runs fails the script, its write is not lost
    other = connect(broker, "other", timeout=SCRIPT_DEADLINE_S)
    answer = _script_meets_a_write(r, other)
    assert "'counter' was changed by another client while the script ran" in answer, answer
    assert r.get("counter") == b"100"
    assert r.eval("local v = redis.call('GET', KEYS[1]); "  # alone: it goes through
                  "redis.call('SET', KEYS[1], v + 1); return redis.call('GET', KEYS[1])",
                  1, "counter") == b"101"
    sha = r.script_load("return ARGV[1]")
    assert r.evalsha(sha, 0, "hi") == b"hi"
    assert r.script_exists(sha, "0" * 40) == [True, False]
    with pytest.raises(redis.exceptions.NoScriptError):
        r.evalsha("0" * 40, 0)
    assert r.ping() is True


def test_a_scripts_time_limit_is_wall_clock_time(broker) -> None:
    """The limit is time a client waits, as Redis's: it counted the broker's CPU time
    (Lua's os.clock), so a broker paused (or starved of CPU) past the limit let the
    script run its whole 5 s of CPU again once it woke, and a loaded machine stretched
    it to 28 s. Paused 1.5 x the limit mid-script, it now stops at its next check."""
    r = connect(broker, timeout=SCRIPT_DEADLINE_S)
    watcher = connect(broker, "watcher")
    answer: list[Any] = []

    def run() -> None:
        try:
            answer.append(r.eval("redis.call('SET', KEYS[1], '1'); while true do end", 1,
                                 "looping"))
        except redis.ResponseError as exc:
            answer.append(exc)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: watcher.get("looping") is not None, 30, what="the script to start")
    broker.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(1.5 * 5.0)  # SCRIPT_TIME_S
    finally:
        broker.proc.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    t.join(SCRIPT_DEADLINE_S)
    waited = time.monotonic() - resumed
    assert answer and str(answer[0]).startswith("BUSY"), answer
    # Past its limit when it woke: stopped at once, not after 5 s more of running (the
    # old clock: >= 5 s; at once is milliseconds, 2.5 s is for a loaded machine)
    assert waited < 2.5, f"the script ran {waited:.1f} s more after the broker woke"
    assert watcher.ping() is True


def _script_meets_a_write(r: Any, other: Any) -> str:
    """A script reads ``counter``, then waits for ``other`` to write it (once the script
    says it started) and writes it itself: what the script was answered. The script
    waits within its time limit: on a loaded machine the other client may come only
    after it, and the script ends BUSY with nothing written, which decides nothing.
    That is tried again (until a deadline): the answer wanted is the one of a write
    that came in time."""
    deadline = time.monotonic() + SCRIPT_DEADLINE_S
    while True:
        r.set("counter", "0")
        r.delete("started", "written")

        def writer() -> None:  # once the script has read the counter, another writes it
            wait_until(lambda: other.get("started") is not None, SCRIPT_DEADLINE_S,
                       what="the script to start")
            other.set("counter", "100")
            other.set("written", "1")

        t = threading.Thread(target=writer)
        t.start()
        try:
            got = r.eval("local v = redis.call('GET', KEYS[1]); "
                         "redis.call('SET', KEYS[2], '1'); "
                         "repeat until redis.call('GET', KEYS[3]); "
                         "return redis.call('SET', KEYS[1], v + 1)", 3, "counter", "started",
                         "written")
            return f"the script's write went through ({got!r}) over the other client's"
        except redis.ResponseError as exc:
            if not str(exc).startswith("BUSY") or time.monotonic() > deadline:
                return str(exc)
        finally:
            t.join(SCRIPT_DEADLINE_S)


def test_faststream_and_taskiq_run_their_ordinary_workers(broker) -> None:
    """Two widely used frameworks built on Redis Streams consumer groups, unchanged,
    against minou's door: FastStream (XGROUP CREATE, XREADGROUP, XACK) and
    taskiq-redis (the same, plus MULTI/EXEC, a lock and XAUTOCLAIM)."""
    faststream_redis = pytest.importorskip("faststream.redis")
    taskiq_redis = pytest.importorskip("taskiq_redis")
    from taskiq.api import run_receiver_task

    jwt = token(broker, "framework")
    url = f"redis://framework:{jwt}@127.0.0.1:{broker.resp_port}"

    async def faststream_app() -> list[Any]:
        app_broker = faststream_redis.RedisBroker(url)
        got: list[Any] = []
        done = asyncio.Event()

        @app_broker.subscriber(stream=faststream_redis.StreamSub("orders", group="billing",
                                                                 consumer="w1"))
        async def handle(msg: dict) -> None:
            got.append(msg)
            if len(got) == 3:
                done.set()

        async with app_broker:
            await app_broker.start()
            for n in range(3):
                await app_broker.publish({"n": n}, stream="orders")
            await asyncio.wait_for(done.wait(), 30)
        return got

    assert asyncio.run(faststream_app()) == [{"n": 0}, {"n": 1}, {"n": 2}]

    async def taskiq_app() -> list[int]:
        app_broker = taskiq_redis.RedisStreamBroker(url=url, idle_timeout=1000)
        results: list[int] = []

        @app_broker.task
        async def add(a: int, b: int) -> int:
            results.append(a + b)
            return a + b

        await app_broker.startup()
        worker = asyncio.create_task(run_receiver_task(app_broker))
        for n in range(5):
            await add.kiq(n, 10)
        for _ in range(600):
            if len(results) >= 5:
                break
            await asyncio.sleep(0.05)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await app_broker.shutdown()
        return sorted(results)

    assert asyncio.run(taskiq_app()) == [10, 11, 12, 13, 14]


def test_miniqueue_publish_subscribe_and_its_settlements(broker) -> None:
    """miniqueue's own commands (its Redis mode, through redis-py's plain connection):
    PUBLISH answers OK once durable; SUBSCRIBE hands one message at a time, each
    answered with ACK, NACK (front), BACK (back) or DACK [s] (later); INIT is accepted."""
    jwt = token(broker, "mq")
    producer = redis.Connection(host="127.0.0.1", port=broker.resp_port, username="mq",
                                password=jwt, socket_timeout=10)
    for value in (b"value1", b"value2", b"value3"):
        producer.send_command("PUBLISH", "topic", value)
        assert producer.read_response() == b"OK"
    sub = redis.Connection(host="127.0.0.1", port=broker.resp_port, username="mq",
                           password=jwt, socket_timeout=10)
    sub.send_command("SUBSCRIBE", "topic")
    assert sub.read_response() == b"value1"
    sub.send_command("INIT")  # the README's first command: nothing to answer
    steps = [("ACK", b"value2"), ("NACK", b"value2"), ("BACK", b"value3"),
             ("DACK", b"value2")]  # DACK (no seconds: 1 s, as miniqueue's code)
    for command, then in steps:
        sub.send_command(command)
        assert sub.read_response() == b"OK", command
        assert sub.read_response() == then, command
    started = time.monotonic()
    sub.send_command("ACK")  # value2 done; value3 comes back after its second
    assert sub.read_response() == b"OK" and sub.read_response() == b"value3"
    assert time.monotonic() - started > 0.5
    sub.disconnect()  # held value3 goes back to the front
    again = redis.Connection(host="127.0.0.1", port=broker.resp_port, username="mq",
                             password=jwt, socket_timeout=10)
    again.send_command("SUBSCRIBE", "topic")
    assert again.read_response() == b"value3"
    again.send_command("ACK")
    assert again.read_response() == b"OK"
    # SUBSCRIBE topic JSON: miniqueue's consumer payload, with dackCount once DACK'ed
    again.disconnect()
    producer.send_command("PUBLISH", "topic", b"\xffbytes")
    assert producer.read_response() == b"OK"
    js = redis.Connection(host="127.0.0.1", port=broker.resp_port, username="mq",
                          password=jwt, socket_timeout=10)
    js.send_command("SUBSCRIBE", "topic", "JSON")
    assert json.loads(js.read_response()) == {"msg": base64.b64encode(b"\xffbytes").decode()}
    for count in (1, 2):
        js.send_command("DACK", "0")
        assert js.read_response() == b"OK"
        assert json.loads(js.read_response())["dackCount"] == count
    js.send_command("ACK")
    assert js.read_response() == b"OK"
    js.disconnect()
    js.send_command("SUBSCRIBE", "topic", "XML")
    with pytest.raises(redis.ResponseError, match="SUBSCRIBE topic JSON"):
        js.read_response()
    again.disconnect()


@pytest.mark.skipif(not shutil.which("redis-server"), reason="redis-server is not installed")
def test_a_standby_answers_loading_until_it_serves(broker_factory, tmp_path) -> None:
    """Two brokers on one Redis: the standby's Redis port answers LOADING (redis-py
    raises BusyLoadingError: clients retry), until it takes over and serves."""
    from ..redis_server import RedisServer, free_port

    server = RedisServer(tmp_path / "redis").start()
    try:
        cfg = tmp_path / "cluster.toml"
        cfg.write_text(f'[storage]\nurl = "{server.url}"\nowner_lease = 1.0\n')
        primary = broker_factory.make(config=cfg, storage=server.url, resp_port=0).start()
        standby = broker_factory.make(config=cfg, storage=server.url,
                                      resp_port=free_port())
        standby.port, standby.http_port = free_port(), free_port()
        standby.start(ready="standby:")
        jwt = token(primary, "app")
        assert connect(primary, "app").xadd("s", {"a": "1"}) == b"1-0"
        waiting = redis.Redis(host="127.0.0.1", port=standby.resp_port, username="app",
                              password=jwt, socket_timeout=10, retry_on_error=[])
        with pytest.raises(redis.exceptions.BusyLoadingError, match="loading its state"):
            waiting.xlen("s")
        primary.kill()
        deadline = time.monotonic() + 30
        while True:
            try:
                assert waiting.xlen("s") == 1  # taken over: the same stream, served
                break
            except (redis.exceptions.BusyLoadingError, redis.ConnectionError):
                assert time.monotonic() < deadline, "the standby never served"
                time.sleep(0.2)
    finally:
        server.stop()


def test_redis_connections_count_towards_max_connections(broker_factory) -> None:
    cfg = broker_factory.make().data_dir.parent / "few.toml"
    cfg.write_text("max_connections = 3\n")
    b = broker_factory.make(resp_port=0, config=cfg).start()
    jwt = token(b, "many")
    held = [redis.Redis(host="127.0.0.1", port=b.resp_port, username="many", password=jwt,
                        socket_timeout=10, retry_on_error=[]) for _ in range(3)]
    for r in held:
        assert r.ping()
    extra = redis.Redis(host="127.0.0.1", port=b.resp_port, username="many", password=jwt,
                        socket_timeout=10, retry_on_error=[])
    with pytest.raises(redis.exceptions.RedisError, match="max number of clients reached"):
        extra.ping()
    held[0].close()
    time.sleep(0.3)
    assert extra.ping() is True  # room again


def test_a_revoked_client_is_cut_off_and_cannot_come_back(broker) -> None:
    r = connect(broker, "doomed")
    assert r.xadd("s", {"a": "1"}) == b"1-0"
    done = subprocess.run([sys.executable, "-m", "minou", "clients", "revoke", "doomed"],
                          env=broker.cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with pytest.raises(redis.exceptions.RedisError):
        r.xadd("s", {"a": "2"})  # the connection was closed with the reason
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        r.ping()  # and its token is refused from now on


def test_setid_moves_a_group_and_xinfo_stream_shows_its_ends(broker_factory) -> None:
    """With retention (else what every group passed is gone, unlike Redis: documented)."""
    cfg = broker_factory.make().data_dir.parent / "keep.toml"
    cfg.write_text('[channels."redis/v1"]\nretention = 3600\n')
    broker = broker_factory.make(resp_port=0, config=cfg).start()
    r = connect(broker, "mover")
    for n in range(5):
        r.xadd("moving", {"n": str(n)})
    r.xgroup_create("moving", "g", id="$")
    assert not r.xreadgroup("g", "c", {"moving": ">"}, count=10)  # created at the end
    assert r.xgroup_setid("moving", "g", id="2-0") is True
    got = r.xreadgroup("g", "c", {"moving": ">"}, count=10)
    assert [i for i, _ in got[0][1]] == [b"3-0", b"4-0", b"5-0"]
    assert r.xgroup_setid("moving", "g", id="0") is True  # from the start again
    got = r.xreadgroup("g", "c", {"moving": ">"}, count=10)
    assert [i for i, _ in got[0][1]] == [b"1-0", b"2-0", b"3-0", b"4-0", b"5-0"]
    info = r.xinfo_stream("moving")
    assert info["length"] == 5 and info["last-generated-id"] == b"5-0"
    assert info["first-entry"] == (b"1-0", {b"n": b"0"})
    assert info["last-entry"] == (b"5-0", {b"n": b"4"})
    with pytest.raises(redis.ResponseError, match="equal or smaller than the target stream"):
        r.xadd("moving", {"n": "again"}, id="3-0")  # Redis's words for a replayed id


def test_explicit_xadd_ids_are_honoured_named_by_every_command_and_kept_by_a_kill(
        broker_factory) -> None:
    """XADD with an id of the client's (issue 26, item 4): honoured when above the top,
    '*' after it numbers on from it as Redis does, every command that names or answers
    ids uses them, and a kill -9 keeps them (they are stored with their messages)."""
    cfg = broker_factory.make().data_dir.parent / "keep.toml"
    cfg.write_text('[channels."redis/v1"]\nretention = 3600\n')
    broker = broker_factory.make(resp_port=0, config=cfg).start()
    r = connect(broker, "ider")
    assert r.xadd("ev", {"n": "1"}) == b"1-0"
    assert r.xadd("ev", {"n": "2"}, id="1700000000000-0") == b"1700000000000-0"
    assert r.xadd("ev", {"n": "3"}) == b"1700000000000-1"  # '*' after an id from the future
    assert r.xadd("ev", {"n": "4"}, id="1700000000000-7") == b"1700000000000-7"
    assert r.xadd("ev", {"n": "5"}, id="1700000000005-*") == b"1700000000005-0"
    for stale, words in (("1700000000000-7", "equal or smaller than the target stream top"),
                         ("5-0", "equal or smaller than the target stream top"),
                         ("not-an-id", "Invalid stream ID")):
        with pytest.raises(redis.ResponseError, match=words):
            r.xadd("ev", {"n": "x"}, id=stale)
    pipe = r.pipeline(transaction=False)  # in one pipeline: each checked against the last
    pipe.xadd("ev", {"n": "6"}, id="1700000000009-0")
    pipe.xadd("ev", {"n": "x"}, id="1700000000008-0")
    pipe.xadd("ev", {"n": "7"})
    first, refused, after = pipe.execute(raise_on_error=False)
    assert first == b"1700000000009-0" and after == b"1700000000009-1"
    assert isinstance(refused, redis.ResponseError) and "equal or smaller" in str(refused)
    ids = [b"1-0", b"1700000000000-0", b"1700000000000-1", b"1700000000000-7",
           b"1700000000005-0", b"1700000000009-0", b"1700000000009-1"]
    assert [i for i, _ in r.xrange("ev")] == ids
    assert [i for i, _ in r.xrange("ev", "(1700000000000-0", "1700000000005")] == ids[2:5]
    assert [i for i, _ in r.xrevrange("ev", "+", "1700000000000-2", count=2)] == ids[:2:-1][:2]
    assert r.xrange("ev", "1700000000000-2", "1700000000000-6") == []
    assert r.xinfo_stream("ev")["last-generated-id"] == ids[-1]
    assert [i for i, _ in r.xread({"ev": "1700000000000-1"})[0][1]] == ids[3:]

    r.xgroup_create("ev", "g", id="1700000000000-0")  # reads what is after that id
    got = r.xreadgroup("g", "c1", {"ev": ">"}, count=3)
    assert [i for i, _ in got[0][1]] == ids[2:5]
    assert r.xpending("ev", "g")["min"] == ids[2] and r.xpending("ev", "g")["max"] == ids[4]
    assert [e["message_id"] for e in r.xpending_range("ev", "g", ids[3], "+", 10)] == ids[3:5]
    assert r.xack("ev", "g", ids[2], "1700000000000-2") == 1  # an id no entry has: none
    claimed = r.xclaim("ev", "g", "c2", 0, [ids[3]], justid=True)
    assert claimed == [ids[3]]
    nxt, auto, _ = r.xautoclaim("ev", "g", "c3", 0, start_id=ids[4])
    assert [i for i, _ in auto] == [ids[4]] and nxt == b"0-0"
    assert [i for i, _ in r.xreadgroup("g", "c2", {"ev": "0"})[0][1]] == [ids[3]]
    assert r.xdel("ev", ids[1], "1700000000000-2") == 1
    assert r.xgroup_setid("ev", "g", id=ids[4]) is True
    assert [i for i, _ in r.xreadgroup("g", "c1", {"ev": ">"}, count=9)[0][1]] == ids[5:]
    with broker.connect_sync("ider-native") as c:  # other interfaces see the id given
        msgs = c.read("redis/v1/ev", 1)[0]
        given = {m.headers["x-resp-id"] for m in msgs if "x-resp-id" in m.headers}
        assert given == {"1700000000000-7", "1700000000005-0", "1700000000009-0"}

    broker.kill()
    broker.start()
    r = connect(broker, "ider")
    assert [i for i, _ in r.xrange("ev")] == [ids[0], *ids[2:]]
    assert r.xadd("ev", {"n": "8"}) == b"1700000000009-2"
    with pytest.raises(redis.ResponseError, match="equal or smaller"):
        r.xadd("ev", {"n": "x"}, id="1700000000009-2")
    assert r.xadd("ev", {"n": "9"}, id="1800000000000-0") == b"1800000000000-0"
    assert [i for i, _ in r.xrange("ev", "1700000000009-1", "+")] == [
        b"1700000000009-1", b"1700000000009-2", b"1800000000000-0"]


def test_small_explicit_ids_as_tests_and_imports_give_them_are_found_by_every_read(
        broker_factory) -> None:
    """Ids below <seq>-0 (``1-1``, ``1-2``, ... as test suites and imports give them):
    a reader that carries on from the last id it saw gets each entry once, exact ids
    settle and delete (a lookup bounded by the seq alone found none of them)."""
    cfg = broker_factory.make().data_dir.parent / "keep.toml"
    cfg.write_text('[channels."redis/v1"]\nretention = 3600\n')
    broker = broker_factory.make(resp_port=0, config=cfg).start()
    r = connect(broker, "small-ids")
    ids = [r.xadd("imp", {"n": str(i)}, id=f"1-{i}") for i in range(1, 11)]
    assert ids == [b"1-%d" % i for i in range(1, 11)]
    assert r.xadd("imp", {"n": "ms only"}, id="7") == b"7-0"  # XADD s 7: 7-0, as Redis
    assert [i for i, _ in r.xrange("imp", "1-3", "1-3")] == [b"1-3"]
    seen, last = [], "0"
    while True:  # an XREAD loop carrying its last id on
        got = r.xread({"imp": last}, count=4)
        if not got:
            break
        entries = got[0][1]
        seen += [i for i, _ in entries]
        last = entries[-1][0].decode()
    assert seen == [*ids, b"7-0"]
    r.xgroup_create("imp", "g", id="0")
    assert len(r.xreadgroup("g", "c", {"imp": ">"}, count=20)[0][1]) == 11
    assert r.xack("imp", "g", "1-7", "1-8", "1-99") == 2
    assert r.xdel("imp", "1-9") == 1  # still pending, by its id, as in Redis
    assert [e["message_id"] for e in r.xpending_range("imp", "g", "-", "+", 20)] == [
        *ids[:6], ids[8], ids[9], b"7-0"]


def test_command_docs_and_info_describe_the_commands(broker) -> None:
    """What redis-cli builds its help and hints from (COMMAND DOCS) and cluster-aware
    clients their key positions (COMMAND INFO)."""
    for proto in (2, 3):
        r = connect(broker, protocol=proto)
        conn = r.connection_pool.get_connection()  # raw: redis-py parses all COMMANDs alike
        conn.send_command("COMMAND", "DOCS", "XADD", "NOSUCH")
        docs = conn.read_response()
        r.connection_pool.release(conn)
        if proto == 2:  # RESP2: flat arrays, as Redis sends them
            assert docs[0] == b"xadd" and len(docs) == 2
            doc = dict(zip(docs[1][::2], docs[1][1::2], strict=True))
        else:
            assert list(docs) == [b"xadd"]
            doc = docs[b"xadd"]
        assert doc[b"group"] == b"stream" and b"fsync" in doc[b"summary"]
        assert len(doc[b"arguments"]) == 5  # key, NOMKSTREAM, the trim block, id, pairs
    r = connect(broker)
    assert r.command_count() == len(r.command_list()) >= 40
    assert set(r.command_list()) >= {b"xadd", b"xreadgroup", b"set", b"eval"}
    table = r.command()
    assert table["xack"]["arity"] == -4 and table["xack"]["first_key_pos"] == 1
    assert table["get"]["flags"] == ["readonly", "fast"]


@pytest.mark.skipif(REDIS_CLI is None, reason="redis-cli (redis-tools) is not installed")
def test_redis_cli_help_comes_from_the_broker(broker) -> None:
    """Interactive redis-cli (on a terminal) asks COMMAND DOCS for `help <command>`."""
    import os
    import pty
    import select

    jwt = token(broker, "cli")
    pid, fd = pty.fork()
    if pid == 0:  # the child: redis-cli on the terminal
        os.execv(REDIS_CLI, [REDIS_CLI, "-h", "127.0.0.1", "-p", str(broker.resp_port),
                             "--user", "cli", "--pass", jwt, "--no-auth-warning"])
    out = b""

    def read_until(marker: bytes) -> None:
        nonlocal out
        deadline = time.monotonic() + 20
        while marker not in out and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return
                out += chunk
                for _ in range(chunk.count(b"\x1b[6n")):  # linenoise asks where the cursor is
                    os.write(fd, b"\x1b[1;1R")

    try:
        read_until(b"> ")  # the prompt
        os.write(fd, b"help XDEL\r")
        read_until(b"a write")
        os.write(fd, b"quit\r")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.decode(errors="replace"))  # colours
    assert "XDEL key id [id ...]" in text and "Deletes entries (a write)." in text, text[-500:]


def test_xread_reads_every_stream_a_pattern_matches(broker) -> None:
    """A wildcard key (orders/v1/*) is every stream it matches, each answered under its
    own key; with $ and BLOCK a stream made meanwhile is read from its start. Other
    commands name one stream and refuse a pattern."""
    r = connect(broker, "reader")
    for key in ("orders/v1/eu", "orders/v1/us", "other/v1/x"):
        r.xadd(key, {"payload": '{"n": 1}'})
    r.xadd("orders/v1/eu", {"payload": '{"n": 2}'})
    got = {key: [i for i, _ in entries] for key, entries in r.xread({"orders/v1/*": "0"})}
    assert got == {b"orders/v1/eu": [b"1-0", b"2-0"], b"orders/v1/us": [b"1-0"]}
    got = {key: [i for i, _ in entries] for key, entries in r.xread({"orders/*": "1-0"})}
    assert got == {b"orders/v1/eu": [b"2-0"]}  # an id applies to each stream
    assert not r.xread({"orders/v1/*": "$"}, block=200)
    out: list[Any] = []
    waiter = connect(broker, "reader")
    t = threading.Thread(target=lambda: out.append(
        waiter.xread({"orders/v1/*": "$"}, block=20_000)))
    t.start()
    # A new stream each time until the blocked read answers: whichever was made after
    # it began is read from its start (one made before it is past its "$")
    writer, made = connect(broker, "writer"), 0
    while t.is_alive() and made < 100:
        made += 1
        writer.xadd(f"orders/v1/new-{made}", {"payload": '{"n": 3}'})
        t.join(0.1)
    t.join(15)
    ((key, entries),) = out[0]
    assert key.startswith(b"orders/v1/new-") and [i for i, _ in entries] == [b"1-0"]
    with pytest.raises(redis.ResponseError, match="is a pattern: XREAD reads every stream"):
        r.xadd("orders/v1/*", {"payload": "1"})
    with pytest.raises(redis.ResponseError, match="is a pattern"):
        r.xgroup_create("orders/v1/*", "g", id="0")


def test_ranges_of_large_entries_come_whole_and_in_order_both_ways(broker) -> None:
    """XRANGE / XREVRANGE over 1 MB entries: the broker reads them STORAGE_READ_BYTES
    at a time (pages shorter than asked); forwards and backwards, with and without
    COUNT, every entry comes once, in order -- none skipped where a page was cut."""
    r = connect(broker)
    bodies = [b"%02d" % i + os.urandom(1_000_000 - 2) for i in range(30)]
    pipe = r.pipeline(transaction=False)
    for b in bodies:
        pipe.xadd("large/v1/1", {"blob": b})
    ids = pipe.execute()
    assert [int(i.split(b"-")[0]) for i in ids] == list(range(1, 31))
    forward = r.xrange("large/v1/1")
    assert [fields[b"blob"] for _, fields in forward] == bodies
    backward = r.xrevrange("large/v1/1")
    assert [fields[b"blob"] for _, fields in backward] == bodies[::-1]
    assert [e[0] for e in r.xrevrange("large/v1/1", count=20)] == ids[::-1][:20]
    assert [e[0] for e in r.xrange("large/v1/1", min=ids[3], count=20)] == ids[3:23]
    assert [e[0] for e in r.xrevrange("large/v1/1", max=ids[25], min=ids[2])] == \
        ids[2:26][::-1]
    r.close()


def _anon_mib(b: BrokerProcess) -> float:
    """The broker's anonymous memory (its heap: not the files it maps)."""
    status = Path(f"/proc/{b.proc.pid}/status").read_text()
    return int(re.search(r"RssAnon:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _steady_anon_mib(b: BrokerProcess) -> float:
    """``_anon_mib`` once it stopped moving (answers being made, then written)."""
    last = _anon_mib(b)
    for _ in range(50):
        time.sleep(0.2)
        now = _anon_mib(b)
        if abs(now - last) < 2:
            return now
        last = now
    return last


def _silent_reader(b: BrokerProcess, command: bytes) -> Any:
    """A raw client that sends ``command`` after AUTH and never reads: its answer
    stays in the broker's socket buffer (a small receive window keeps it there)."""
    import socket

    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", b.resp_port))
    password = token(b, "app").encode()
    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(password), password) + command)
    return s


def test_range_answers_being_gathered_or_unread_share_one_bound(broker) -> None:
    """Answers of 60 MB (under the 64 MiB of one) that clients ask for and never read
    stay held in the broker until they are read: together past RESP_RANGE_TOTAL_BYTES
    (128 MiB) a range is refused with RANGE_TOO_LARGE saying so, before it is read
    (twelve such clients held 1.4 GB); once they go, the same range is answered whole."""
    r = connect(broker)
    body = os.urandom(1_000_000)
    pipe = r.pipeline(transaction=False)
    for _ in range(60):
        pipe.xadd("large/v1/total", {"blob": body})
    ids = pipe.execute()
    xrange = (b"*6\r\n$6\r\nXRANGE\r\n$14\r\nlarge/v1/total\r\n$1\r\n-\r\n$1\r\n+\r\n"
              b"$5\r\nCOUNT\r\n$2\r\n60\r\n")
    base = _anon_mib(broker)
    silent = [_silent_reader(broker, xrange) for _ in range(2)]
    try:
        wait_until(lambda: _anon_mib(broker) - base > 100, what="two answers held")
        before = _steady_anon_mib(broker)
        for _ in range(20):
            with pytest.raises(redis.ResponseError,
                               match=r"RANGE_TOO_LARGE range reads in progress hold \d+ MiB"):
                r.xrange("large/v1/total", count=60)
        # (each refused before this bound read a page and kept it: ~17 MiB a refusal)
        grown = _anon_mib(broker) - before
        assert grown < 120, f"20 refused ranges grew the broker by {grown:.0f} MiB"
    finally:
        for s in silent:
            s.close()
    wait_until(lambda: _try_range(r, 60) == ids, timeout=20, what="answered once they went")
    # clients that go while their range is being gathered leave nothing counted
    import socket
    import struct

    for _ in range(6):
        s = _silent_reader(broker, xrange)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset, at once
    time.sleep(1)
    assert _try_range(r, 60) == ids


def _try_range(r: Any, count: int) -> list[bytes] | None:
    try:
        return [e for e, _ in r.xrange("large/v1/total", count=count)]
    except redis.ResponseError:
        return None


def test_large_entries_read_again_and_again_leave_the_broker_as_it_was(broker) -> None:
    """Each XRANGE, XREADGROUP and EVAL answered left its answer (or Lua runtime) in a
    reference cycle that only the cyclic GC frees, and the broker runs it rarely: reading
    1 MB entries grew it by ~1 MB per entry read (40 ranges of 8: +334 MiB), a
    group's 60 entries by 143 MiB, 2,000 scripts by ~90 MiB."""
    r = connect(broker)
    body = os.urandom(1_000_000)

    def publish(n: int) -> None:
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd("large/v1/again", {"blob": body})
        pipe.execute()

    publish(60)
    r.xgroup_create("large/v1/again", "g", id="0")
    assert len(r.xrange("large/v1/again", count=8)) == 8
    before = _anon_mib(broker)
    for _ in range(40):
        assert len(r.xrange("large/v1/again", count=8)) == 8
    grown = _anon_mib(broker) - before
    assert grown < 150, f"40 ranges of 8 MB grew the broker by {grown:.0f} MiB"
    for _round in range(3):
        read = 0
        while read < 60:
            got = r.xreadgroup("g", "c", {"large/v1/again": ">"}, count=8, block=5000)
            entries = got[0][1]
            assert r.xack("large/v1/again", "g", *[i for i, _ in entries]) == len(entries)
            read += len(entries)
        publish(60)
    grown = _anon_mib(broker) - before
    assert grown < 200, f"reading 180 MB in a group grew the broker by {grown:.0f} MiB"
    r.set("k", "v")
    before = _anon_mib(broker)
    for _ in range(2000):
        assert r.eval("return redis.call('GET', KEYS[1])", 1, "k") == b"v"
    grown = _anon_mib(broker) - before
    assert grown < 25, f"2,000 scripts grew the broker by {grown:.0f} MiB"


def test_transactions_being_queued_hold_only_so_much(broker) -> None:
    """A MULTI's queue is bounded in bytes (64 MiB), and all of them together (256 MiB):
    1,500 SETs of 900 KB queued held 1.3 GB. Past it the command is refused, EXEC
    aborts, it is counted; the broker goes on."""
    import socket

    import hiredis

    password = token(broker, "app").encode()
    value = b"v" * 900_000
    set_cmd = b"*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$%d\r\n%s\r\n" % (len(value), value)

    def queue(n: int) -> tuple[socket.socket, list[Any]]:
        """A connection in MULTI that queued ``n`` SETs: its replies so far."""
        s = socket.create_connection(("127.0.0.1", broker.resp_port), timeout=10)
        s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$5\r\nMULTI\r\n"
                  % (len(password), password) + set_cmd * n)
        reader, replies = hiredis.Reader(), []
        while len(replies) < n + 2:
            reader.feed(s.recv(1 << 16))
            while (reply := reader.gets()) is not False:
                replies.append(reply)
        return s, replies

    before = _anon_mib(broker)
    s, replies = queue(80)  # 72 MB
    opened = [s]
    errors = [r for r in replies if isinstance(r, hiredis.ReplyError)]
    assert replies[:2] == [b"OK", b"OK"] and replies[2] == b"QUEUED"
    assert errors and "a transaction holds at most 64 MiB of commands here" in str(errors[0])
    s.sendall(b"*1\r\n$4\r\nEXEC\r\n")
    assert s.recv(100).startswith(b"-EXECABORT")
    try:
        for _ in range(4):  # 59 MB each, 238 MB together
            opened.append(queue(66)[0])
        s, replies = queue(66)
        opened.append(s)
        assert any("the transactions being queued hold" in str(r) for r in replies
                   if isinstance(r, hiredis.ReplyError))
        assert _anon_mib(broker) - before < 400
    finally:
        for c in opened:
            c.close()
    r = connect(broker)
    wait_until(lambda: _try_multi(r, value), what="a transaction queued once the others went")
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        assert admin.admin("status")["counters"]["refused"]["multi_too_large"] >= 2


def _try_multi(r: Any, value: bytes) -> bool:
    try:
        with r.pipeline(transaction=True) as p:
            p.set("k2", value)
            p.get("k2")
            return p.execute() == [True, value]
    except redis.ResponseError:
        return False


def test_a_script_may_hold_only_so_much_memory(broker) -> None:
    """A script's Lua is bounded in memory (64 MiB): 300 strings of 10 MB kept in a
    table held 2.9 GB of the broker before (and ran three times its time limit). It is
    answered with the reason, counted, and the broker and the connection go on."""
    r = connect(broker)
    base = _anon_mib(broker)
    peak = [0.0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _anon_mib(broker) - base)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(redis.ResponseError,
                           match=r"not enough memory \(a script may hold 64 MiB\)"):
            r.eval("local t = {} for i = 1, 300 do t[i] = string.rep('x', 10000000) .. i end "
                   "return #t", 0)
    finally:
        done.set()
        watcher.join()
    assert peak[0] < 400, f"the script grew the broker by {peak[0]:.0f} MiB"
    assert r.eval("return #string.rep('x', 1000000)", 0) == 1_000_000  # within: fine
    assert r.ping()
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        assert admin.admin("status")["counters"]["refused"].get("script_memory") == 1


def test_xread_answers_a_page_of_large_entries_and_reads_on(broker) -> None:
    """XREAD holds its answer whole: entries of 1 MB asked for on four streams at once
    (a page of 8 MiB each: 32 MB, and a pattern reads up to 100 streams) come a page
    in all at a time, and the client reads on from the last ids it got, as it does
    when a COUNT cuts an answer short."""
    r = connect(broker)
    body = os.urandom(1_000_000)
    keys = [f"large/v1/x{i}" for i in range(4)]
    pipe = r.pipeline(transaction=False)
    for key in keys:
        for _ in range(20):
            pipe.xadd(key, {"blob": body})
    pipe.execute()
    last = dict.fromkeys(keys, "0")
    got = 0
    while got < 80:
        answer = r.xread(last, count=20)
        entries = [(key.decode(), e) for key, es in answer for e in es]
        assert 1 <= len(entries) <= 9, len(entries)
        assert all(fields == {b"blob": body} for _, (_, fields) in entries)
        for key, (eid, _) in entries:
            last[key] = eid.decode()
        got += len(entries)
    assert last == dict.fromkeys(keys, "20-0")


def test_a_range_larger_than_an_answer_may_hold_is_refused_and_read_in_parts(broker) -> None:
    """XRANGE / XREVRANGE without COUNT over 70 MB of entries: the answer would be held
    whole in the broker's memory before it is sent, so past RESP_RANGE_BYTES (64 MiB) it
    is refused with RANGE_TOO_LARGE (counted); the connection goes on, and the same
    range read in parts with COUNT comes whole."""
    r = connect(broker)
    body = os.urandom(1_000_000)
    pipe = r.pipeline(transaction=False)
    for _ in range(70):
        pipe.xadd("large/v1/range", {"blob": body})
    ids = pipe.execute()
    for call in (lambda: r.xrange("large/v1/range"), lambda: r.xrevrange("large/v1/range")):
        with pytest.raises(redis.ResponseError, match=r"RANGE_TOO_LARGE .* COUNT"):
            call()
    assert r.ping()
    got: list[bytes] = []
    start = "-"
    while True:
        part = r.xrange("large/v1/range", min=start, count=20)
        if not part:
            break
        got += [entry_id for entry_id, _ in part]
        start = "(" + part[-1][0].decode()
    assert got == ids
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        assert admin.admin("status")["counters"]["refused"]["range_too_large"] == 2
    r.close()


def test_a_multi_behind_xadds_in_one_pipeline_queues_and_aborts_as_alone(broker) -> None:
    """MULTI waited behind the XADDs' commit, and the commands pipelined after it ran at
    once instead of being queued: a transaction that had to abort was partly stored."""
    r = connect(broker)
    pipe = r.pipeline(transaction=False)
    pipe.xadd("tx-a", {"n": "1"})
    pipe.execute_command("MULTI")
    pipe.xadd("tx-a", {"n": "2"})
    pipe.execute_command("NOPE")
    pipe.xadd("tx-a", {"n": "3"})
    pipe.execute_command("EXEC")
    out = pipe.execute(raise_on_error=False)
    assert out[0] == b"1-0" and out[1] in (b"OK", True) and out[2] in (b"QUEUED", True)
    assert "unknown command 'NOPE'" in str(out[3])
    assert isinstance(out[5], redis.exceptions.ExecAbortError), out
    assert r.xlen("tx-a") == 1
    # And one that holds: queued behind a SET, applied whole at EXEC.
    pipe = r.pipeline(transaction=False)
    pipe.set("tx-marker", "x")
    pipe.execute_command("MULTI")
    pipe.xadd("tx-b", {"n": "1"})
    pipe.xadd("tx-b", {"n": "2"})
    pipe.execute_command("EXEC")
    out = pipe.execute()
    assert out[2] in (b"QUEUED", True) and out[4] == [b"1-0", b"2-0"], out
    assert r.xlen("tx-b") == 2


def test_a_read_after_xadds_sees_every_one_before_it_whatever_is_between(broker) -> None:
    """XADD; PING; XADD; XLEN: the second XADD (run after the PING) was not yet
    committed when XLEN ran, which counted 1."""
    r = connect(broker)
    for i in range(5):
        pipe = r.pipeline(transaction=False)
        pipe.xadd(f"rd-{i}", {"n": "1"})
        pipe.ping()
        pipe.xadd(f"rd-{i}", {"n": "2"})
        pipe.xlen(f"rd-{i}")
        pipe.xrange(f"rd-{i}")
        out = pipe.execute()
        assert out[3] == 2 and [entry_id for entry_id, _ in out[4]] == [b"1-0", b"2-0"], out


def test_arguments_redis_refuses_are_refused_as_redis_words_them(broker) -> None:
    r = connect(broker)
    r.xadd("args-a", {"n": "1"})
    r.xgroup_create("args-a", "g", id="0")
    for command, message in (
            (("XAUTOCLAIM", "args-a", "g", "c", "0", "0", "COUNT", "0"), "COUNT must be > 0"),
            (("XAUTOCLAIM", "args-a", "g", "c", "0", "0", "COUNT", "-3"), "COUNT must be > 0"),
            (("XADD", "args-a", "MAXLEN", "~", "-1", "*", "n", "2"),
             "The MAXLEN argument must be >= 0"),
            (("XCLAIM", "args-a", "g", "c", "99999999999999999999", "1-0"),
             "value is not an integer or out of range")):
        with pytest.raises(redis.ResponseError, match=message):
            r.execute_command(*command)
    # COUNT 0 or less is no limit in Redis: a (bounded) batch here, not one entry.
    r.xadd("args-a", {"n": "2"})
    got = r.execute_command("XREADGROUP", "GROUP", "g", "c", "COUNT", "-1", "STREAMS",
                            "args-a", ">")
    entries = got[0][1] if isinstance(got, list) else got[b"args-a"][0]
    assert len(entries) == 2
    assert r.xlen("args-a") == 2  # the refused XADD stored nothing


def test_a_block_0_reader_sees_the_connection_go_when_the_broker_stops(broker) -> None:
    """It was answered nil (redis-py: [], "nothing came"), which BLOCK 0 never means."""
    import threading

    r = connect(broker)
    r.xadd("blk", {"n": "1"})
    seen: list[Any] = []

    def reader() -> None:
        try:
            seen.append(r.xread({"blk": "$"}, block=0))
        except redis.ConnectionError as exc:
            seen.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.5)  # the read is waiting (nothing to see it from outside)
    assert broker.stop() == 0
    t.join(20)
    assert len(seen) == 1 and isinstance(seen[0], redis.ConnectionError), seen


def test_a_command_with_the_wrong_number_of_arguments_inside_multi_aborts_exec(broker) -> None:
    """Queued, it ran alone at EXEC beside the others, which were stored; Redis refuses
    it when queued and EXEC aborts the whole transaction."""
    r = connect(broker)
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("MULTI")
    pipe.xadd("arity-a", {"n": "1"})
    pipe.execute_command("XADD", "arity-a", "*", "odd")
    pipe.execute_command("GET")
    pipe.xadd("arity-a", {"n": "2"})
    pipe.execute_command("EXEC")
    out = pipe.execute(raise_on_error=False)
    assert "wrong number of arguments for 'xadd' command" in str(out[2])
    assert "wrong number of arguments for 'get' command" in str(out[3])
    assert isinstance(out[5], redis.exceptions.ExecAbortError), out
    assert r.xlen("arity-a") == 0


def _refused(b: BrokerProcess, reason: str) -> float:
    text = httpx.get(f"{b.http}/metrics", headers=admin_bearer(b), timeout=10).text
    found = re.search(rf'minou_requests_refused_total{{reason="{reason}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def test_a_consumer_name_too_long_is_refused_by_every_command_naming_one(broker) -> None:
    """Consumer names are kept per group (as Redis keeps them): each is bounded, so
    that one XGROUP CREATECONSUMER cannot make the broker keep a megabyte."""
    r = connect(broker)
    r.xadd("names-a", {"n": "1"})
    r.xgroup_create("names-a", "g", id="0")
    long, limit = b"n" * 513, b"n" * 512
    for command in (("XGROUP", "CREATECONSUMER", "names-a", "g", long),
                    ("XREADGROUP", "GROUP", "g", long, "STREAMS", "names-a", ">"),
                    ("XCLAIM", "names-a", "g", long, "0", "1-0"),
                    ("XAUTOCLAIM", "names-a", "g", long, "0", "0")):
        with pytest.raises(redis.ResponseError,
                           match=r"^BAD_REQUEST consumer name is 513 bytes, the limit is 512$"):
            r.execute_command(*command)
    assert r.ping() is True  # the connection goes on
    assert _refused(broker, "bad_request") == 4
    assert r.xpending("names-a", "g")["pending"] == 0  # the refused read took nothing
    assert r.execute_command("XGROUP", "CREATECONSUMER", "names-a", "g", limit) == 1
    assert [c["name"] for c in r.xinfo_consumers("names-a", "g")] == [limit]


def test_consumer_names_of_a_megabyte_leave_the_broker_as_it_was(broker) -> None:
    """1,000 names of 512 KiB held 513 MiB for good (closing the connection freed
    nothing); refused, they leave nothing behind."""
    r = connect(broker)
    r.xgroup_create("names-m", "g", id="$", mkstream=True)
    before = _steady_anon_mib(broker)
    kept = 0
    for batch in range(20):
        pipe = r.pipeline(transaction=False)
        for i in range(50):
            pipe.execute_command("XGROUP", "CREATECONSUMER", "names-m", "g",
                                 b"%04d-%03d-" % (batch, i) + b"x" * (512 << 10))
        kept += sum(x == 1 for x in pipe.execute(raise_on_error=False))
    r.close()
    grown = _steady_anon_mib(broker) - before
    assert grown < 64, f"the broker's heap grew {grown:.0f} MiB ({kept} names kept)"
    assert kept == 0
    assert connect(broker).xinfo_consumers("names-m", "g") == []


def test_a_group_keeps_10000_consumer_names_and_lists_them_at_once(broker) -> None:
    r = connect(broker)
    r.xgroup_create("names-c", "g", id="0", mkstream=True)
    names = [b"worker-%05d-" % i + b"h" * 100 for i in range(10_000)]
    for at in range(0, len(names), 200):  # pipelines under the door's RUN_WINDOW (256)
        pipe = r.pipeline(transaction=False)
        for name in names[at:at + 200]:
            pipe.execute_command("XGROUP", "CREATECONSUMER", "names-c", "g", name)
        assert pipe.execute() == [1] * len(names[at:at + 200])
    for at in range(0, 5_000, 200):
        pipe = r.pipeline(transaction=False)
        for n in range(at, at + 200):
            pipe.xadd("names-c", {"n": str(n)})
        pipe.execute()
    assert len(r.xreadgroup("g", names[0], {"names-c": ">"}, count=5_000)[0][1]) == 5_000
    # Every name's pending entries counted in one pass over the group's (one pass per
    # name: 10,000 x 5,000 comparisons, seconds in which the broker served no one)
    listed = r.xinfo_consumers("names-c", "g")
    assert [c["name"] for c in listed] == names  # in order, as Redis lists them
    assert listed[0]["pending"] == 5_000 and {c["pending"] for c in listed[1:]} == {0}
    full = (r"^QUEUE_FULL group 'g@redis/v1/names-c' has 10000 consumer names \(the limit "
            r"is 10000\); reuse a name, or XGROUP DELCONSUMER those no longer used \(one "
            r"unused for 300 s that holds no pending entry is forgotten\)$")
    with pytest.raises(redis.ResponseError, match=full):
        r.execute_command("XGROUP", "CREATECONSUMER", "names-c", "g", "one-more")
    with pytest.raises(redis.ResponseError, match=full):
        r.xreadgroup("g", "one-more", {"names-c": ">"})
    assert _refused(broker, "queue_full") == 2
    assert r.xreadgroup("g", names[1], {"names-c": "0"}) == [[b"names-c", []]]  # a known one
    r.xgroup_delconsumer("names-c", "g", names[-1])
    assert r.execute_command("XGROUP", "CREATECONSUMER", "names-c", "g", "one-more") == 1
    assert r.xinfo_groups("names-c")[0]["consumers"] == 10_000


def _make_names(r: Any, key: str, names: list[str]) -> list[Any]:
    """XGROUP CREATECONSUMER of each of ``names`` in group g of ``key``: the answers."""
    out: list[Any] = []
    for at in range(0, len(names), 200):  # pipelines under the door's RUN_WINDOW (256)
        pipe = r.pipeline(transaction=False)
        for name in names[at:at + 200]:
            pipe.execute_command("XGROUP", "CREATECONSUMER", key, "g", name)
        out += pipe.execute(raise_on_error=False)
    return out


def test_one_client_makes_only_its_share_of_the_consumer_names(broker) -> None:
    """One client creating fresh names (and keeping them used) could take all 100,000
    the broker keeps, and every other client's XREADGROUP with a new name was refused:
    a client makes at most 10,000 (MAX_CONSUMER_NAMES_PER_CLIENT), the others go on, and
    each way a name goes gives its maker the slot back."""
    hog, other = connect(broker, "hog"), connect(broker, "other")
    for key in ("share-a", "share-b", "share-c"):
        hog.xgroup_create(key, "g", id="0", mkstream=True)
    hog.xadd("share-c", {"n": "1"})
    # 5,000 in each of two groups: under the bound per group, the whole of its share
    assert _make_names(hog, "share-a", [f"hog-a-{i:04d}" for i in range(5_000)]) == [1] * 5_000
    assert _make_names(hog, "share-b", [f"hog-b-{i:04d}" for i in range(5_000)]) == [1] * 5_000
    full = (r"^QUEUE_FULL client 'hog' made 10000 of the consumer names this broker keeps "
            r"over every group \(a client may make 10000 of the 100000, so that no one uses "
            r"them all\); reuse a name, or XGROUP DELCONSUMER those no longer used \(one "
            r"unused for 300 s that holds no pending entry is forgotten\)$")
    for command in (("XGROUP", "CREATECONSUMER", "share-c", "g", "hog-new"),
                    ("XREADGROUP", "GROUP", "g", "hog-new", "STREAMS", "share-c", ">"),
                    ("XCLAIM", "share-c", "g", "hog-new", "0", "1-0"),
                    ("XAUTOCLAIM", "share-c", "g", "hog-new", "0", "0")):
        with pytest.raises(redis.ResponseError, match=full):
            hog.execute_command(*command)
    assert _refused(broker, "queue_full") == 4
    assert broker.output.count("client 'hog' made 10000 Redis consumer names, its share") == 1
    assert hog.xpending("share-c", "g")["pending"] == 0  # the refused read took nothing
    assert hog.xreadgroup("g", "hog-a-0000", {"share-a": "0"}) == [[b"share-a", []]]  # its own
    # Another client makes names and reads; using one of hog's costs it no slot.
    assert other.execute_command("XGROUP", "CREATECONSUMER", "share-a", "g", "other-1") == 1
    got = other.xreadgroup("g", "other-2", {"share-c": ">"})
    assert [fields for _id, fields in got[0][1]] == [{b"n": b"1"}]
    other.xack("share-c", "g", got[0][1][0][0])
    assert other.xreadgroup("g", "hog-a-0001", {"share-a": "0"}) == [[b"share-a", []]]
    assert {c["name"] for c in other.xinfo_consumers("share-c", "g")} == {b"other-2"}
    # XGROUP DELCONSUMER gives the slot back (and only that one).
    assert hog.xgroup_delconsumer("share-a", "g", "hog-a-0002") == 0
    assert _make_names(hog, "share-c", ["hog-c-0000", "hog-c-0001"])[0] == 1
    assert _make_names(hog, "share-c", ["hog-c-0001"])[0].args[0].startswith(
        "QUEUE_FULL client 'hog' made 10000")
    # XGROUP DESTROY gives back the group's 5,000, an admin deleting a group (HTTP) its own.
    assert hog.xgroup_destroy("share-b", "g") == 1
    assert _make_names(hog, "share-c", [f"hog-c-{i:04d}" for i in range(1, 5_001)]) == \
        [1] * 5_000
    assert isinstance(_make_names(hog, "share-c", ["hog-c-5001"])[0], redis.ResponseError)
    deleted = httpx.delete(f"{broker.http}/v1/groups/consume:g@redis/v1/share-a",
                           params={"force": "true"}, headers=admin_bearer(broker), timeout=10)
    assert deleted.status_code == 200, deleted.text
    assert _make_names(hog, "share-c", [f"hog-c-{i:04d}" for i in range(5_001, 9_000)]) == \
        [1] * 3_999
    assert hog.xinfo_groups("share-c")[0]["consumers"] == 1 + 9_000


def test_a_long_pipeline_of_commands_answered_at_once_is_answered_whole(broker) -> None:
    """Commands run ahead of their replies by RUN_WINDOW (256) at most; a pipeline of
    more, each answered at once, read in several pieces, stopped at the window: the
    replies went out, and the rest waited for a restart nothing made (the client timed
    out, 4 times out of 4 with 300-500 XGROUP CREATECONSUMER of 500-byte names)."""
    r = connect(broker)
    try:
        r.xadd("redis/v1/pipe", {"f": "v"})
        r.xgroup_create("redis/v1/pipe", "g", id="0")
        for batch in range(3):
            pipe = r.pipeline(transaction=False)
            for i in range(500):
                pipe.execute_command("XGROUP", "CREATECONSUMER", "redis/v1/pipe", "g",
                                     f"{batch}-{i:03d}-".encode() + b"x" * 480)
            assert pipe.execute() == [1] * 500
        assert r.ping()
    finally:
        r.close()
