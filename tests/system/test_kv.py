"""KV buckets and persistent objects (issue 21, items 3 and 4) against a real broker:
put/get/delete/keys/history, compare-and-set, watch (current values, then changes,
across a kill -9), the bucket's options from the config, the read/write rules, and
objects whose concurrent saves of different fields both survive."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import minou
from minou.errors import NotAuthorized, RevisionMismatch

from ..conftest import BrokerProcess


def run(coro: Any, timeout: float = 90) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_put_get_delete_keys_and_history(broker):
    async def scenario() -> None:
        c = await broker.connect("app")
        kv = c.kv("config")
        assert await kv.get("limit") is None
        r1 = await kv.put("limit", 10)
        r2 = await kv.put("currency", "EUR")
        r3 = await kv.put("limit", 20)
        assert r1 < r2 < r3
        entry = await kv.get("limit")
        assert (entry.key, entry.value, entry.revision, entry.op) == ("limit", 20, r3, "put")
        assert await kv.keys() == ["currency", "limit"]
        assert await kv.keys("cur") == ["currency"]
        # History 1 (the default): only the latest revision is kept.
        assert [e.value for e in await kv.history("limit")] == [20]
        assert await kv.put("blob", b"\x00\xff") > r3
        assert (await kv.get("blob")).value == b"\x00\xff"
        rd = await kv.delete("limit")
        assert await kv.get("limit") is None
        assert await kv.keys() == ["blob", "currency"]
        (tomb,) = await kv.history("limit")
        assert (tomb.revision, tomb.op, tomb.deleted, tomb.value) == (rd, "del", True, None)
        assert (await kv.get("limit", revision=rd)).deleted
        items = await kv.items()
        assert {k: e.value for k, e in items.items()} == {"blob": b"\x00\xff",
                                                          "currency": "EUR"}
        await c.close()

    run(scenario())


def test_compare_and_set_lets_one_of_two_writers_win(broker):
    async def scenario() -> None:
        a, b = await broker.connect("a"), await broker.connect("b")
        ka, kb = a.kv("config"), b.kv("config")
        rev = await ka.create("leader", "a")
        with pytest.raises(RevisionMismatch, match=f"at revision {rev}, not 0"):
            await kb.create("leader", "b")
        # Both read revision `rev`, both try to move it on: exactly one wins.
        results = await asyncio.gather(ka.put("leader", "a2", revision=rev),
                                       kb.put("leader", "b2", revision=rev),
                                       return_exceptions=True)
        assert sum(isinstance(r, RevisionMismatch) for r in results) == 1
        winner = next(r for r in results if isinstance(r, int))
        assert (await ka.get("leader")).revision == winner
        with pytest.raises(RevisionMismatch):
            await kb.delete("leader", revision=rev)
        await kb.delete("leader", revision=winner)
        assert await kb.create("leader", "b3") > winner  # no value again: create works
        await a.close()
        await b.close()

    run(scenario())


def test_watch_starts_with_the_current_values_then_follows_changes(broker):
    async def scenario() -> None:
        writer, reader = await broker.connect("w"), await broker.connect("r")
        kv = writer.kv("config")
        await kv.put("app/limit", 1)
        await kv.put("app/currency", "EUR")
        await kv.put("other", True)
        watch = reader.kv("config").watch("app/")
        first = [await anext(watch), await anext(watch)]
        assert sorted((e.key, e.value) for e in first) == [("app/currency", "EUR"),
                                                           ("app/limit", 1)]
        later = asyncio.create_task(anext(watch))
        await asyncio.sleep(0.3)
        assert not later.done()  # waits for a change, does not spin
        await kv.put("other", False)  # outside the prefix: not seen
        await kv.put("app/limit", 2)
        entry = await asyncio.wait_for(later, 10)
        assert (entry.key, entry.value) == ("app/limit", 2)
        await kv.delete("app/currency")
        entry = await asyncio.wait_for(anext(watch), 10)
        assert (entry.key, entry.op) == ("app/currency", "del")
        watch.close()
        await writer.close()
        await reader.close()

    run(scenario())


def test_sync_facade_and_persistent_objects(broker):
    with broker.connect_sync("sync") as c:
        kv = c.kv("settings")
        rev = kv.put("mode", "fast")
        assert kv.get("mode").revision == rev
        assert kv.keys() == ["mode"]
        one = c.persist("orders-config", fields=["limit", "currency"])
        two = c.persist("orders-config", fields=["limit", "currency"])
        assert (one.limit, one.currency) == (None, None)
        one.limit = 100
        two.currency = "EUR"
        assert one.save() == ["limit"]  # only what changed
        assert two.save() == ["currency"]
        fresh = c.persist("orders-config", fields=["limit", "currency"])
        assert fresh.as_dict() == {"limit": 100, "currency": "EUR"}  # both survived
        assert fresh.save() == []
        one.load()
        assert one.currency == "EUR"
        # check=True: refuses to overwrite a field saved by someone else since.
        two.limit = 5
        fresh.limit = 7
        fresh.save()
        with pytest.raises(RevisionMismatch):
            two.save(check=True)
        with pytest.raises(AttributeError, match="not a field"):
            one.other = 1


def test_values_and_options_survive_a_kill_and_watch_rides_through_it(tmp_path: Path):
    config = tmp_path / "minou.toml"
    config.write_text('[kv."config"]\nhistory = 3\n')
    broker = BrokerProcess(tmp_path / "data", config=config).start()
    try:
        async def before() -> dict[str, int]:
            c = await broker.connect("w")
            kv = c.kv("config")
            revs = {}
            for n in range(5):
                revs["k"] = await kv.put("k", n)
            revs["gone"] = await kv.put("gone", 1)
            await kv.delete("gone")
            await c.close()
            return revs

        revs = run(before())
        broker.kill()
        broker.start()

        async def after() -> None:
            c = await broker.connect("r", reconnect=True, request_timeout=10)
            kv = c.kv("config")
            assert (await kv.get("k")).value == 4
            assert [e.value for e in await kv.history("k")] == [2, 3, 4]  # history = 3
            assert await kv.get("gone") is None
            # The index came back whole: a compare-and-set against the old revision works.
            assert await kv.put("k", 5, revision=revs["k"]) > revs["k"]
            watch = kv.watch("k", initial=False)
            nxt = asyncio.create_task(anext(watch))
            await asyncio.sleep(0.3)
            broker.kill()
            await asyncio.to_thread(broker.start)
            w = await broker.connect("w2")
            await w.kv("config").put("k", 6)
            entry = await asyncio.wait_for(nxt, 30)
            assert (entry.key, entry.value) == ("k", 6)
            await w.close()
            await c.close()

        run(after(), 120)
    finally:
        broker.stop()


def test_rules_guard_a_bucket_like_any_channel(tmp_path: Path):
    config = tmp_path / "minou.toml"
    config.write_text(
        '[[rules]]\nclient = "admin"\nread = ["*"]\nwrite = ["*"]\n'
        '[[rules]]\nclient = "writer"\nread = ["kv/config"]\nwrite = ["kv/config"]\n'
        '[[rules]]\nclient = "reader"\nread = ["_kv/v1/config"]\n'
        '[[rules]]\nclient = "stranger"\nread = ["other/v1/*"]\nwrite = ["other/v1/*"]\n')
    broker = BrokerProcess(tmp_path / "data", config=config).start()
    try:
        async def scenario() -> None:
            w, r, x = (await broker.connect("writer"), await broker.connect("reader"),
                       await broker.connect("stranger"))
            await w.kv("config").put("k", 1)
            assert (await r.kv("config").get("k")).value == 1
            with pytest.raises(NotAuthorized):
                await r.kv("config").put("k", 2)
            for call in (x.kv("config").get("k"), x.kv("config").keys(),
                         x.kv("config").history("k"), w.kv("other").get("k")):
                with pytest.raises(NotAuthorized):
                    await call
            for c in (w, r, x):
                await c.close()

        run(scenario())
    finally:
        broker.stop()


def test_bad_kv_input_is_refused_precisely_and_the_broker_goes_on(broker):
    async def scenario() -> None:
        c = await broker.connect("app")
        with pytest.raises(minou.InvalidChannel, match="invalid bucket"):
            c.kv("no/slash")
        for bad in ("", "a b", "/x", "a" * 300):
            with pytest.raises(minou.RequestError):
                await c.kv("config").get(bad)
        with pytest.raises(minou.RequestError, match="names its key"):
            await c.send("_kv/v1/config", 1)
        with pytest.raises(minou.RequestError, match="must be a number"):
            await c.admin("kv.read", bucket="config", wait=1000)
        await c.kv("config").put("ok", 1)
        assert (await c.kv("config").get("ok")).value == 1
        await c.close()

    run(scenario())



def cli(broker, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minou", *args], env=broker.cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def test_cli_put_get_del_ls_history_and_watch(broker):
    out = cli(broker, "kv", "put", "config", "limit", '{"max": 10}')
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("stored config/limit revision ")
    rev = int(out.stdout.split()[-1])
    got = cli(broker, "kv", "get", "config", "limit", "--json")
    assert json.loads(got.stdout)["value"] == {"max": 10}
    stale = cli(broker, "kv", "put", "config", "limit", "1", "--revision", str(rev + 100))
    assert stale.returncode == 1 and "revision mismatch:" in stale.stderr
    assert cli(broker, "kv", "put", "config", "limit", "1", "--create").returncode == 1
    bad = cli(broker, "kv", "put", "config", "limit", "{nope")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    assert cli(broker, "kv", "put", "config", "limit", "2", "-r", str(rev)).returncode == 0
    assert cli(broker, "kv", "put", "config", "other", '"x"').returncode == 0
    assert cli(broker, "kv", "ls", "config").stdout.split() == ["limit", "other"]
    listed = cli(broker, "kv", "ls").stdout
    assert "config: 2 key(s)" in listed
    assert "rev=" in cli(broker, "kv", "ls", "config", "--values").stdout
    assert cli(broker, "kv", "history", "config", "limit").stdout.count("rev=") == 1
    # watch: the current values, then a change made while it waits.
    watching = subprocess.Popen([sys.executable, "-m", "minou", "kv", "watch", "config",
                                 "--prefix", "lim", "--count", "2", "--json"],
                                env=broker.cli_env(), stdout=subprocess.PIPE, text=True)
    try:
        first = json.loads(watching.stdout.readline())
        assert (first["key"], first["value"]) == ("limit", 2)
        assert cli(broker, "kv", "del", "config", "limit").returncode == 0
        second = json.loads(watching.stdout.readline())
        assert (second["key"], second["op"]) == ("limit", "del")
        assert watching.wait(30) == 0
    finally:
        watching.kill()
        watching.wait()
        watching.stdout.close()
    missing = cli(broker, "kv", "get", "config", "limit")
    assert missing.returncode == 1 and "not found:" in missing.stderr
    assert "has no value" in missing.stderr


def test_reload_applies_bucket_options(tmp_path: Path):
    open_rules = '[[rules]]\nclient = "*"\nread = ["*"]\nwrite = ["*"]\n'
    config = tmp_path / "minou.toml"
    config.write_text(open_rules)
    broker = BrokerProcess(tmp_path / "data", config=config).start()
    try:
        with broker.connect_sync("app") as c:
            kv = c.kv("config")
            for n in range(3):
                kv.put("k", n)
            assert [e.value for e in kv.history("k")] == [2]
            config.write_text(open_rules + '[kv."config"]\nhistory = 3\nttl = 0.5\n')
            out = cli(broker, "reload")
            assert out.returncode == 0, out.stderr
            assert "kv" in out.stdout
            for n in range(3, 6):
                kv.put("k", n)
            assert [e.value for e in kv.history("k")] == [3, 4, 5]
            (bucket,) = c.admin("kv.buckets")["buckets"]
            assert (bucket["history"], bucket["ttl"]) == (3, 0.5)
            time.sleep(0.7)  # past the new ttl: no value, at once
            assert kv.get("k") is None
            assert kv.keys() == []
    finally:
        broker.stop()


def test_two_clients_saving_different_fields_at_once_both_survive(broker):
    async def scenario() -> None:
        a, b = await broker.connect("proc-a"), await broker.connect("proc-b")
        one = await a.persist("job-state", fields=["progress", "status", "owner"])
        two = await b.persist("job-state", fields=["progress", "status", "owner"])

        async def work(obj: Any, field: str, values: list[Any]) -> None:
            for v in values:
                setattr(obj, field, v)
                assert await obj.save() == [field]

        await asyncio.gather(work(one, "progress", list(range(20))),
                             work(two, "status", [f"step {n}" for n in range(20)]))
        await one.load()
        assert one.as_dict() == {"progress": 19, "status": "step 19", "owner": None}
        assert one.revisions["owner"] == 0 and one.revisions["progress"] > 0
        assert [e.value for e in await a.kv("job-state").history("status")] == ["step 19"]
        await a.close()
        await b.close()

    run(scenario())
