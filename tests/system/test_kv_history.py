"""A key's history is answered in pages of a few MiB (an outside audit): 64 revisions of
900 KB were one 57.6 MB answer, over the native frame limit (the client read an
unreadable stream and timed out), and the HTTP answer decoded every stored value into
Python objects (60 MiB of ``[[],[],...]`` took the broker +1.5 GB and 6 s). The stored
JSON is now embedded as is in HTTP answers, transcoded one value at a time in native
ones, and both doors page."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec

from minou.limits import MAX_FRAME_SIZE

from .test_http_api import bearer

CONFIG = '[kv."big"]\nhistory = 64\n'


def _big_broker(broker_factory: Any, tmp_path: Path) -> Any:
    cfg = tmp_path / "kv.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


def test_a_history_over_the_frame_limit_comes_in_pages_the_client_joins(broker_factory,
                                                                         tmp_path):
    broker = _big_broker(broker_factory, tmp_path)
    # 900 KB of JSON each, 57.6 MB in all; a native answer carries them as msgpack,
    # where each 0.5 takes 9 bytes instead of 4: 130 MB, eight 16 MiB frames' worth.
    values = [[0.5] * 224_999 + [n] for n in range(64)]

    async def scenario() -> None:
        c = await broker.connect("app", request_timeout=20)
        kv = c.kv("big")
        revs = [await kv.put("k", v) for v in values]
        history = await kv.history("k")
        assert [e.revision for e in history] == revs
        assert [e.value for e in history] == values
        pages, seen, after = 0, [], 0
        while True:
            page = await c.admin("kv.history", bucket="big", key="k", after=after)
            assert len(msgspec.msgpack.encode(page)) < MAX_FRAME_SIZE
            pages += 1
            seen += [e["revision"] for e in page["entries"]]
            if not page["more"]:
                break
            after = page["next"]
        assert pages > 1 and seen == revs
        one = await c.admin("kv.history", bucket="big", key="k", after=revs[10], limit=2)
        assert [e["revision"] for e in one["entries"]] == revs[11:13] and one["more"]
        await c.close()

    asyncio.run(asyncio.wait_for(scenario(), 240))


class _Entry(msgspec.Struct):
    revision: int
    value: msgspec.Raw  # the value's text in the answer, as is


class _Page(msgspec.Struct):
    entries: list[_Entry]
    more: bool = False
    next: int = 0


def _peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_an_http_history_embeds_the_stored_json_as_is(broker_factory, tmp_path):
    broker = _big_broker(broker_factory, tmp_path)
    app = bearer(broker, "app-1")
    # ~1 MiB of nested JSON each (260,000 lists), spaces and all: 60 MiB in all.
    bodies = [b"[" + b"[], " * 260_000 + b'{"n": %d}]' % n for n in range(60)]
    with httpx.Client(base_url=broker.http, timeout=60) as http:
        for body in bodies:
            r = http.put("/v1/kv/big/k", content=body, headers=app)
            assert r.status_code == 200, r.text
        pid = broker.proc.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
        before = _peak_mib(pid)
        got: list[_Entry] = []
        pages, after = 0, 0
        while True:
            r = http.get("/v1/kv/big/k", params={"history": "true", "after": after},
                         headers=app)
            assert r.status_code == 200, r.text
            page = msgspec.json.decode(r.content, type=_Page)
            got += page.entries
            pages += 1
            if not page.more:
                break
            assert len(r.content) < 5 << 20  # KV_PAGE_BYTES (4 MiB) of values at most
            after = page.next
        grown = _peak_mib(pid) - before
        # Decoding them all took +1.5 GB; a page is a few MiB of text.
        assert grown < 150, f"the broker's peak RSS grew {grown:.0f} MiB"
        assert pages > 1
        assert [bytes(e.value) for e in got] == bodies  # byte for byte
    with broker.connect_sync("app-1") as c:  # the native door carries the value itself
        assert c.kv("big").get("k").value == msgspec.json.decode(bodies[-1])


def test_the_current_values_come_in_pages_that_fit_a_frame_too(broker_factory, tmp_path):
    # kv.read (items(), a watch's start) paged by STORAGE_READ_BYTES: ten values of
    # 900 KB of JSON were one 20 MB native answer once transcoded (floats: 9 bytes).
    broker = _big_broker(broker_factory, tmp_path)
    values = {f"k{n}": [0.5] * 224_999 + [n] for n in range(20)}

    async def scenario() -> None:
        c = await broker.connect("app", request_timeout=20)
        kv = c.kv("big")
        for key, value in values.items():
            await kv.put(key, value)
        assert {k: e.value for k, e in (await kv.items()).items()} == values
        page = await c.admin("kv.read", bucket="big", after=0)
        assert 0 < len(page["entries"]) < len(values)
        assert len(msgspec.msgpack.encode(page)) < MAX_FRAME_SIZE
        await c.close()

    asyncio.run(asyncio.wait_for(scenario(), 240))
