"""A key-value bucket with one cold key and one hot key, against a real broker (SQLite,
kill -9, restart): the cold key's revision pins the channel's first seq, so every older
revision of the hot key stays deleted inside the log. They are held as one run of
deleted seqs, running and after the restart (the broker reports what it holds for them
in ``admin list``), and reads give the right revisions."""

from __future__ import annotations

import asyncio

import minou

BUCKET = "_kv/v1/hotcold"
UPDATES = 30_000


def channel_row(broker) -> dict:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        (row,) = admin.admin("list", channel=BUCKET)["channels"]
    return row


def test_a_hot_keys_deleted_revisions_are_one_run_running_and_after_a_restart(broker):
    async def fill() -> int:
        async with await broker.connect("writer") as c:
            await c.kv("hotcold").put("cold", "still here")
            for start in range(0, UPDATES, 5_000):
                await c.send_many([{"channel": BUCKET, "payload": n, "key": "hot"}
                                   for n in range(start, start + 5_000)])
            return (await c.kv("hotcold").get("hot")).revision

    last = asyncio.run(asyncio.wait_for(fill(), 300))
    assert last == UPDATES + 1
    for when in ("running", "restarted"):
        row = channel_row(broker)
        assert (row["depth"], row["first_seq"], row["next_seq"]) == (2, 1, UPDATES + 2), when
        assert row["deleted"] == UPDATES - 1, when  # revisions 2 .. UPDATES
        # one run: a set held ~80 B a deleted revision (2.4 MB here), for ever
        assert row["deleted_bytes"] < 1024, (when, row["deleted_bytes"])
        with broker.connect_sync("reader") as c:
            kv = c.kv("hotcold")
            cold, hot = kv.get("cold"), kv.get("hot")
            assert (cold.value, cold.revision) == ("still here", 1), when
            assert (hot.value, hot.revision) == (UPDATES - 1, last), when
            assert [e.revision for e in kv.history("hot")] == [last], when
            assert kv.get("hot", revision=last - 1) is None, when  # compacted away
            assert sorted(kv.keys()) == ["cold", "hot"], when
        if when == "running":
            broker.kill()
            broker.start(timeout=60)
    with broker.connect_sync("writer") as c:  # and the bucket goes on from there
        kv = c.kv("hotcold")
        assert kv.put("hot", "again") == last + 1
        assert kv.get("hot").value == "again"
    row = channel_row(broker)
    assert (row["depth"], row["deleted"]) == (2, UPDATES)
