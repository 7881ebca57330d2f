"""Staged, fenced publishes, offsets and positions: the broker side of an exactly-once
sink and of a reader that keeps its own offsets (Spark), over a real broker."""

from __future__ import annotations

import asyncio

import pytest

import minou
from minou.errors import InvalidChannel, NotAuthorized, NotFound, SchemaMismatch

from ..conftest import auth

CONFIG = """
[[rules]]
client = "job-*"
read = ["orders/*", "reports/*"]
write = ["reports/*"]

[channels."reports/v1".schema]
type = "object"
required = ["total"]
"""


@pytest.fixture
def txn_broker(broker_factory, tmp_path):
    cfg = tmp_path / "txn.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


def depth(broker, channel: str) -> int:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        rows = a.admin("list", channel=channel)["channels"]
    return sum(r["depth"] for r in rows if r["channel"] == channel)


def test_staged_messages_appear_only_on_commit_and_a_replay_is_discarded(txn_broker):
    with minou.connect_sync(txn_broker.url, **auth("job-1")) as c:
        assert c.stage("w:b0:p0", [("reports/v1/a", {"total": 1}),
                                   ("reports/v1/b", {"total": 2})]) == 2
        assert c.stage("w:b0:p1", [{"channel": "reports/v1/a", "payload": {"total": 3},
                                    "key": "k"}]) == 1
        assert depth(txn_broker, "reports/v1/a") == 0  # nothing visible yet
        result = c.commit_transactions("w", 0, ["w:b0:p0", "w:b0:p1"])
        assert result == {"published": 3, "discarded": 0, "replayed_channels": [],
                          "failed": []}
        assert depth(txn_broker, "reports/v1/a") == 2
        # The same batch again (a job replayed after a crash): the fence discards it.
        c.stage("w:b0:p0:retry", [("reports/v1/a", {"total": 1})])
        again = c.commit_transactions("w", 0, ["w:b0:p0:retry"])
        assert again["published"] == 0 and again["replayed_channels"] == ["reports/v1/a"]
        assert depth(txn_broker, "reports/v1/a") == 2
        # Abort drops; an unknown transaction cannot be committed.
        c.stage("w:b1:p0", [("reports/v1/a", {"total": 9})])
        assert c.abort_transactions(["w:b1:p0"]) == 1
        with pytest.raises(NotFound, match="unknown transaction"):
            c.commit_transactions("w", 1, ["w:b1:p0"])
    # Fences are durable: after a restart the replay is still discarded.
    txn_broker.stop()
    txn_broker.start()
    with minou.connect_sync(txn_broker.url, **auth("job-1")) as c:
        c.stage("w:b0:again", [("reports/v1/a", {"total": 1})])
        assert c.commit_transactions("w", 0, ["w:b0:again"])["published"] == 0
        c.stage("w:b1", [("reports/v1/a", {"total": 5})])
        assert c.commit_transactions("w", 1, ["w:b1"])["published"] == 1
    assert depth(txn_broker, "reports/v1/a") == 3


def test_staging_checks_rules_names_and_schemas_at_once(txn_broker):
    with minou.connect_sync(txn_broker.url, **auth("job-2")) as c:
        with pytest.raises(NotAuthorized):
            c.stage("t", [("orders/v1/1", {"total": 1})])
        with pytest.raises(SchemaMismatch):
            c.stage("t", [("reports/v1/1", {"no": "total"})])
        with pytest.raises(InvalidChannel):
            c.stage("t", [("reports/x/1", {"total": 1})])
    with minou.connect_sync(txn_broker.url, **auth("job-3")) as other:
        with minou.connect_sync(txn_broker.url, **auth("job-2")) as c:
            c.stage("mine", [("reports/v1/z", {"total": 1})])
        # Transaction ids are per client: another's "mine" is not this one's to commit.
        with pytest.raises(minou.errors.NotFound, match="never staged \\(by this client\\)"):
            other.commit_transactions("w2", 0, ["mine"])


def test_offsets_and_positions(txn_broker):
    with minou.connect_sync(txn_broker.url, **txn_broker.admin_auth()) as a:
        for i in range(5):
            a.send("orders/v1/x", {"i": i})
        a.send("orders/v1/y", {"i": 0})
    with minou.connect_sync(txn_broker.url, **auth("job-4")) as c:
        offsets = c.offsets("orders/v1/*")
        assert offsets == {"orders/v1/x": (1, 6), "orders/v1/y": (1, 2)}
        assert c.offsets(["orders/v1/x"]) == {"orders/v1/x": (1, 6)}
        with pytest.raises(NotAuthorized):
            c.offsets("secret/v1/*")
        lags = c.set_position("spark:q1", {"orders/v1/x": 4, "orders/v1/y": 2})
        assert lags == {"orders/v1/x": 2, "orders/v1/y": 0}
        # The group now exists for retention and lag; a consumer of it starts at 4.
        sub = c.consume("orders/v1/x", group="spark:q1")
        assert sub.get(timeout=5).seq == 4


def test_a_read_page_says_what_the_channel_still_retains(txn_broker):
    with minou.connect_sync(txn_broker.url, **txn_broker.admin_auth()) as a:
        for i in range(6):
            a.send("orders/v1/r", {"i": i})
        page = a.read_page("orders/v1/r", 1, limit=2)
        assert (page.next_seq, page.first_seq) == (3, 1)
        assert [m.seq for m in page.messages] == [1, 2]
        a.admin("purge", queue="orders/v1", channel="r")
        a.send("orders/v1/r", {"i": 6})
        after = a.read_page("orders/v1/r", 3)
        assert after.first_seq == 7 and [m.seq for m in after.messages] == [7]


def test_commit_answers_kept_for_a_commit_sent_again_are_bounded(txn_broker):
    """Each committed transaction's answer is kept (an hour) for a TXN_COMMIT sent
    again; a client committing small transactions fast held ~1.3 KB of the broker a
    commit for that hour, unbounded (20,000 commits: +24 MiB). Past 10,000 a client the
    oldest are forgotten (MAX_ANSWERS_PER_CLIENT), in memory and on disk."""
    MAX_ANSWERS_PER_CLIENT = 10_000  # (limits.py)
    n = MAX_ANSWERS_PER_CLIENT + 50

    async def commit_many() -> list[dict]:
        c = await minou.connect(txn_broker.url, **auth("job-1"))
        try:
            async def one(i: int) -> dict:  # (one in flight may pass another: its
                await c.stage(f"t{i}", [("reports/v1/a", {"total": i})])  # fence then
                return await c.commit_transactions("w", i, [f"t{i}"])  # discards it)

            got = [await one(0)]  # the oldest
            for lo in range(1, n, 64):  # 64 at a time: the commits share fsyncs
                got += await asyncio.gather(*(one(i) for i in range(lo, min(n, lo + 64))))
            return got
        finally:
            await c.close()

    results = asyncio.run(commit_many())
    with minou.connect_sync(txn_broker.url, **auth("job-1")) as c:
        # the newest's answer is kept; the oldest's is forgotten, as after an hour
        assert c.commit_transactions("w", n - 1, [f"t{n - 1}"]) == results[-1]
        with pytest.raises(NotFound, match="unknown transaction"):
            c.commit_transactions("w", 0, ["t0"])

    def answers() -> dict:
        with minou.connect_sync(txn_broker.url, **txn_broker.admin_auth()) as a:
            return a.admin("status")["transactions"]

    st = answers()
    assert (st["answers"], st["answers_forgotten"]) == (MAX_ANSWERS_PER_CLIENT, 50)
    txn_broker.stop()
    txn_broker.start()
    assert answers()["answers"] == MAX_ANSWERS_PER_CLIENT  # the disk held no more either
    assert depth(txn_broker, "reports/v1/a") == sum(r["published"] for r in results)
