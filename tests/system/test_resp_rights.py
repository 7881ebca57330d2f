"""The Redis door under the rules (docs/redis-protocol.md, docs/security.md): a client
learns nothing of a stream it may not read — not whether it exists, nor which groups
it has. Every command that names such a key gets the same ``-NOPERM NOT_AUTHORIZED``
refusal whether the stream (or the group) is there or not: the rights are checked
before anything is looked up. Against a real broker with authentication, with
redis-py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import BrokerProcess
from .test_resp import connect

redis = pytest.importorskip("redis")

RULES = """
[[rules]]
client = "eu-*"          # its own streams only: no hr/*, no plain keys
read = ["orders/v1/eu", "eu/v1/*"]
write = ["orders/v1/eu", "eu/v1/*"]

[[rules]]
client = "kv-*"          # plain keys (the KV bucket 'redis') and one stream
read = ["kv/redis", "orders/v1/eu"]
write = ["kv/redis", "orders/v1/eu"]

[[rules]]
client = "reader-*"      # reads everything, writes nothing
read = ["*"]
write = []

[[rules]]
client = "solo-*"        # an exclusive stream each: the first reader owns it
read = ["!solo/*"]
write = ["solo/*"]

[[rules]]
client = "good-*"
read = ["*"]
write = ["*"]
"""

SECRET, ABSENT = "hr/v1/layoffs", "hr/v1/nothing-here"  # a stream, and no stream
PLAIN_SECRET, PLAIN_ABSENT = "payroll-jobs", "nothing-jobs"  # redis/v1/<key> streams
GROUP, NO_GROUP = "payroll", "nogroup"

# Every command of the door that names a stream (and a group): {k} the key, {g} the group
STREAM_COMMANDS = [
    "XLEN {k}",
    "XRANGE {k} - +",
    "XRANGE {k} 1-0 1-0",
    "XREVRANGE {k} + - COUNT 1",
    "XREAD STREAMS {k} 0",
    "XREAD COUNT 5 BLOCK 10 STREAMS {k} $",
    "XREADGROUP GROUP {g} c STREAMS {k} >",
    "XREADGROUP GROUP {g} c COUNT 1 STREAMS {k} 0",
    "XACK {k} {g} 1-0",
    "XPENDING {k} {g}",
    "XPENDING {k} {g} - + 10",
    "XCLAIM {k} {g} c 0 1-0",
    "XAUTOCLAIM {k} {g} c 0 0-0",
    "XINFO STREAM {k}",
    "XINFO GROUPS {k}",
    "XINFO CONSUMERS {k} {g}",
    "XGROUP CREATE {k} {g} 0",
    "XGROUP CREATE {k} {g} $ MKSTREAM",
    "XGROUP SETID {k} {g} 0",
    "XGROUP DESTROY {k} {g}",
    "XGROUP CREATECONSUMER {k} {g} c",
    "XGROUP DELCONSUMER {k} {g} c",
    "XTRIM {k} MAXLEN ~ 10",
    "XTRIM {k} MAXLEN 10",
    "XDEL {k} 1-0",
    "XADD {k} NOMKSTREAM * f v",
    "XADD {k} * f v",
    "EXISTS {k}",
    "TYPE {k}",
    "GET {k}",
    "DEL {k}",
    "TTL {k}",
    "PTTL {k}",
]
# The write commands, for a client that may read the stream but not write it
WRITE_COMMANDS = [
    "XTRIM {k} MAXLEN ~ 10",
    "XDEL {k} 1-0",
    "XADD {k} NOMKSTREAM * f v",
    "XGROUP SETID {k} {g} 0",
    "XGROUP DESTROY {k} {g}",
    "XGROUP CREATECONSUMER {k} {g} c",
    "XGROUP DELCONSUMER {k} {g} c",
]


@pytest.fixture
def guarded(broker_factory: Any, tmp_path: Path) -> BrokerProcess:
    """A broker with rules, a stream only some may read, and a group on it."""
    cfg = tmp_path / "resp-rights.toml"
    cfg.write_text(RULES)
    b = broker_factory.make(resp_port=0, config=cfg).start()
    owner = connect(b, "good-1")
    for key in (SECRET, PLAIN_SECRET):
        first = owner.xadd(key, {"payload": '{"who": "x"}'})
        owner.xgroup_create(key, GROUP, id="0")
        owner.xreadgroup(GROUP, "c", {key: ">"})  # a pending entry, a consumer
        assert first == b"1-0"
    assert owner.exists(SECRET, ABSENT) == 1
    return b


def answer(r: Any, cmd: str, **names: str) -> tuple[str, Any]:
    """What ``cmd`` (its {k} and {g} filled) gets: its error's class and text with the
    names put back as {k} and {g}, or its reply."""
    args = cmd.format(**names).split()
    try:
        return ("reply", r.execute_command(*args))
    except redis.ResponseError as exc:
        text = str(exc)
        for placeholder, value in names.items():
            text = text.replace(value, "{" + placeholder + "}")
        return (type(exc).__name__, text)


def variants(secret: str, absent: str) -> list[dict[str, str]]:
    """The stream with its group, the stream with a group it lacks, no stream."""
    return [{"k": secret, "g": GROUP}, {"k": secret, "g": NO_GROUP},
            {"k": absent, "g": NO_GROUP}]


@pytest.mark.parametrize(("secret", "absent"), [(SECRET, ABSENT),
                                                (PLAIN_SECRET, PLAIN_ABSENT)])
def test_a_stream_the_client_may_not_read_gets_one_refusal_whether_it_exists(
        guarded, secret, absent) -> None:
    """eu-1 may read neither the stream nor plain keys: every command that names the
    stream is refused alike with -NOPERM, whether it or its group exists or not (the
    old door answered EXISTS 1 / TYPE stream, NOGROUP for a missing group, XTRIM 0)."""
    eu = connect(guarded, "eu-1")
    for cmd in STREAM_COMMANDS:
        got = [answer(eu, cmd, **names) for names in variants(secret, absent)]
        assert got[0] == got[1] == got[2], (cmd, got)
        kind, text = got[0]
        assert kind == "NoPermissionError" and text.startswith("NOT_AUTHORIZED"), (cmd, got)
    # Nothing of it was made or changed by the refused commands
    owner = connect(guarded, "good-1")
    assert owner.exists(absent) == 0 and owner.xlen(secret) == 1
    assert [g["name"] for g in owner.xinfo_groups(secret)] == [GROUP.encode()]
    assert owner.xpending(secret, GROUP)["pending"] == 1
    assert eu.xadd("orders/v1/eu", {"payload": "{}"}) and eu.ping()  # it goes on


def test_a_transaction_and_a_script_see_the_same_refusals(guarded) -> None:
    """MULTI/EXEC and a script's redis.call run the same commands: the same answers."""
    eu = connect(guarded, "eu-1")
    cmds = ["EXISTS {k}", "TYPE {k}", "XLEN {k}", "XREADGROUP GROUP {g} c STREAMS {k} >",
            "XTRIM {k} MAXLEN ~ 10", "XINFO GROUPS {k}"]

    def in_exec(names: dict[str, str]) -> list[Any]:
        with eu.pipeline(transaction=True) as pipe:
            for cmd in cmds:
                pipe.execute_command(*cmd.format(**names).split())
            out = []
            for reply in pipe.execute(raise_on_error=False):
                text = str(reply)
                for placeholder, value in names.items():
                    text = text.replace(value, "{" + placeholder + "}")
                out.append((type(reply).__name__, text))
            return out

    def in_script(names: dict[str, str]) -> list[Any]:
        out = []
        for cmd in cmds:
            args = cmd.format(**names).split()
            body = "return redis.pcall(" + ", ".join(f"'{a}'" for a in args) + ")"
            out.append(_eval(eu, body, names))
        return out

    for run in (in_exec, in_script):
        got = [run(names) for names in variants(SECRET, ABSENT)]
        assert got[0] == got[1] == got[2], (run.__name__, got)
        assert all("NOT_AUTHORIZED" in text for _, text in got[0]), got[0]


def _eval(r: Any, body: str, names: dict[str, str]) -> tuple[str, str]:
    try:
        reply = r.eval(body, 0)
    except redis.ResponseError as exc:
        text = str(exc)
        for placeholder, value in names.items():
            text = text.replace(value, "{" + placeholder + "}")
        return (type(exc).__name__, text)
    return ("reply", repr(reply))


def test_plain_key_commands_count_a_forbidden_stream_as_no_stream(guarded) -> None:
    """kv-1 may use plain keys but not read hr/*: EXISTS, TYPE, GET, DEL, TTL answer for
    a stream it may not read what they answer where there is no stream (a forbidden
    key counts as not existing, as XREAD's patterns skip the streams a client may not
    read); a stream it may read and its plain keys are answered as before."""
    kv = connect(guarded, "kv-1")
    assert kv.set("marker", "1") is True
    kv.xadd("orders/v1/eu", {"payload": '{"n": 1}'})
    for secret, absent in ((SECRET, ABSENT), (PLAIN_SECRET, PLAIN_ABSENT)):
        for cmd in ("EXISTS {k}", "TYPE {k}", "GET {k}", "DEL {k}", "TTL {k}", "PTTL {k}"):
            got = [answer(kv, cmd, k=k) for k in (secret, absent)]
            assert got[0] == got[1], (cmd, got)
        assert kv.exists(secret) == 0 and kv.type(secret) == b"none"
        assert kv.get(secret) is None and kv.ttl(secret) == -2
        # several keys: each forbidden stream counts as none, the others as they are
        assert kv.exists(secret, "marker", "orders/v1/eu", absent) == 2
    assert kv.type("orders/v1/eu") == b"stream" and kv.type("marker") == b"string"
    with pytest.raises(redis.ResponseError, match=r"^WRONGTYPE"):
        kv.get("orders/v1/eu")  # one it may read is a stream, as before
    with pytest.raises(redis.ResponseError, match="DEL of a stream is not supported"):
        kv.delete("orders/v1/eu")
    owner = connect(guarded, "good-1")
    assert owner.xlen(SECRET) == 1 and owner.type(SECRET) == b"stream"  # untouched


def test_write_commands_need_write_rights_whether_the_stream_exists(guarded) -> None:
    """reader-1 reads everything and writes nothing: a write command on a stream is
    refused alike, whether the stream and its group exist or not (XTRIM too)."""
    reader = connect(guarded, "reader-1")
    for cmd in WRITE_COMMANDS:
        got = [answer(reader, cmd, **names) for names in variants(SECRET, ABSENT)]
        assert got[0] == got[1] == got[2], (cmd, got)
        kind, text = got[0]
        assert kind == "NoPermissionError" and text.startswith("NOT_AUTHORIZED"), (cmd, got)
    # What it may read answers as Redis does, NOGROUP for a missing group included
    assert reader.xlen(SECRET) == 1 and reader.exists(SECRET, ABSENT) == 1
    with pytest.raises(redis.ResponseError, match=r"^NOGROUP"):
        reader.xreadgroup(NO_GROUP, "c", {SECRET: ">"})
    with pytest.raises(redis.ResponseError, match=r"^NOGROUP"):
        reader.xpending(SECRET, NO_GROUP)
    with pytest.raises(redis.ResponseError, match=r"^BUSYGROUP"):
        reader.xgroup_create(SECRET, GROUP, id="0")
    with pytest.raises(redis.ResponseError, match="requires the key to exist"):
        reader.xgroup_create(ABSENT, GROUP, id="0")
    good = connect(guarded, "good-1")
    assert good.xtrim(SECRET, maxlen=10, approximate=True) == 0  # accepted, trims nothing


def test_a_plain_key_too_long_is_refused_naming_its_own_length(guarded) -> None:
    """A key is stored as it is (letters, digits, _=./:@-: up to 256 of them) or
    encoded (any other bytes: up to 191 of them); the refusal names the key's length
    as sent and the limit that applies to it, not the encoded key's."""
    r = connect(guarded, "good-1")
    assert r.set("k" * 256, "v") is True and r.get("k" * 256) == b"v"
    assert r.set(" " * 191, "v") is True and r.get(" " * 191) == b"v"
    for key, limit in (("k" * 300, 256), ("k" * 5000, 256), (" " * 192, 191),
                       ("k" * 250 + " ", 191)):
        for cmd in (["SET", key, "v"], ["GET", key], ["EXISTS", key]):
            with pytest.raises(redis.ResponseError) as err:
                r.execute_command(*cmd)
            text = str(err.value)
            assert f"key is {len(key)} bytes" in text and f"limit is {limit}" in text, text
            encoded = 1 + -(-len(key) * 4 // 3)  # "=" + base64 without padding
            assert f"is {encoded}" not in text  # not the encoded key's length
    assert r.ping() is True


def test_a_refused_command_claims_no_exclusive_stream(guarded) -> None:
    """NOGROUP, BUSYGROUP or a bad id refuse the command: it read nothing, so the free
    exclusive stream it names stays free for the client that reads it first."""
    first, second = connect(guarded, "solo-1"), connect(guarded, "solo-2")
    second.xadd("solo/v1/x", {"payload": "{}"})  # a write claims nothing
    for call in (lambda: first.xreadgroup("nogroup", "c", {"solo/v1/x": ">"}),
                 lambda: first.xrange("solo/v1/x", "not-an-id", "+"),
                 lambda: first.xautoclaim("solo/v1/x", "nogroup", "c", 0)):
        with pytest.raises(redis.ResponseError):
            call()
    assert second.xlen("solo/v1/x") == 1  # still free: solo-2 reads it, and owns it now
    with pytest.raises(redis.exceptions.NoPermissionError):
        first.xlen("solo/v1/x")
    first.close()
    second.close()
