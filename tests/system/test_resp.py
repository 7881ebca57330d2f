"""The Redis protocol door (issue 26) against a real broker process, with real
clients: redis-py (sync and asyncio, RESP2 and RESP3) and redis-cli. Stream entries
round-trip byte for byte; messages cross between RESP, the native protocol and HTTP;
authentication is the broker's; errors are Redis's words and minou's reasons."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from typing import Any

import httpx
import pytest

from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, client_key

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


def connect(b: BrokerProcess, client_id: str = "app", **kw: Any) -> Any:
    return redis.Redis(host="127.0.0.1", port=b.resp_port, username=client_id,
                       password=token(b, client_id), socket_timeout=10, **kw)


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
