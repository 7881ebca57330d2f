"""The second round of the attack table (docs/security.md, "Second round: reading and
naming"): attacks that went beyond the first table, against a real broker process.

Every read route goes through one check of the rules and the reservations; names
built from what clients choose (listener keys, transaction ids, writer ids) cannot
reach another client's. Each refusal is a precise error to the sender, counted, and
the connection stays usable.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets.sync.client as wsc

import minou
from minou.errors import BadRequest, NotAuthorized, Timeout

from ..conftest import client_key, wait_until
from .test_http_api import bearer

CONFIG = """
[[rules]]
client = "billing-*"
read = ["orders/*", "!invoice/*", "_dead/invoice/*"]   # its own dead letters, by name
write = ["orders/v1/*"]

[[rules]]
client = "shop-*"
read = ["orders/*"]
write = ["invoice/v1/*", "orders/v1/*", "calm/v1/*"]

[[rules]]
client = "audit-*"
read = ["*"]

[[rules]]
client = "team"
read = ["orders/*"]

[[rules]]
client = "team:*"
read = ["calm/*"]

[[rules]]
client = "spark-*"
read = ["out/*"]
write = ["out/v1/*"]

[channels."invoice/v1"]
requeue_limit = 0
"""


@pytest.fixture
def secure(broker_factory, tmp_path):
    cfg = tmp_path / "access.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


def connect(broker, client_id: str, **extra: Any) -> minou.SyncClient:
    return minou.connect_sync(broker.url, client_id=client_id, key=str(client_key(client_id)),
                              reconnect=False, request_timeout=5, **extra)


def admin(broker) -> minou.SyncClient:
    return minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False))


def refused(broker) -> int:
    with admin(broker) as a:
        return a.admin("status")["counters"]["refused"].get("not_authorized", 0)


def reservations(broker) -> dict[str, str]:
    with admin(broker) as a:
        return a.admin("clients.list")["reservations"]


# ------------------------------------------------------- exclusive channels
def test_position_claims_an_exclusive_channel_like_any_read(secure):
    """The attack: POSITION put a ! channel into the thief's own group without reserving
    it, so the owner reserved it afterwards while the thief's group read along."""
    before = refused(secure)
    thief = connect(secure, "billing-2")
    side = thief.consume("orders/v1/*", group="side")
    thief.set_position("side", {"invoice/v1/b1": 1})
    owner = connect(secure, "billing-1")
    with pytest.raises(NotAuthorized, match="'invoice/v1/b1' is reserved by client 'billing-2'"):
        owner.listen("invoice/v1/b1", start="oldest")
    assert reservations(secure) == {"invoice/v1/b1": "billing-2"}
    # Once reserved, a POSITION by anyone else is refused the same way.
    with connect(secure, "billing-3") as third, \
            pytest.raises(NotAuthorized, match="reserved by client 'billing-2'"):
        third.set_position("other", {"invoice/v1/b1": 1})
    with connect(secure, "shop-1") as shop:
        shop.send("invoice/v1/b1", {"invoice": 1})
    assert side.get(timeout=5).payload == {"invoice": 1}  # its one reader: the reserver
    owner.send("orders/v1/1", {"still": "connected"})  # the refused connection stays
    assert refused(secure) >= before + 2
    thief.close()
    owner.close()


def _stream_consume(broker, client_id: str, channel: str) -> None:
    url = broker.http.replace("http://", "ws://") + "/v1/stream"
    with wsc.connect(url, additional_headers=bearer(broker, client_id)) as ws:
        ws.send(json.dumps({"op": "consume", "pattern": channel, "group": "s"}))
        while (message := json.loads(ws.recv(5)))["type"] not in ("subscribed", "error"):
            pass
        assert message["type"] == "subscribed", message


def test_every_read_route_claims_an_exclusive_channel(secure):
    def http_consume(c: Any, channel: str) -> None:
        with httpx.Client(base_url=secure.http, timeout=10) as http:
            got = http.post(f"/v1/consume/{channel}", params={"group": "h", "wait": 0},
                            headers=bearer(secure, "billing-2"))
            assert got.status_code == 204, got.text

    def add_id(c: Any, channel: str) -> None:
        c.consume("orders/v1/*", group="a").add_id(channel)

    routes = {
        "listen": lambda c, ch: c.listen(ch),
        "consume": lambda c, ch: c.consume(ch),
        "add_id": add_id,
        "read": lambda c, ch: c.read(ch),
        "offsets": lambda c, ch: c.offsets([ch]),
        "position": lambda c, ch: c.set_position("p", {ch: 1}),
        "http_consume": http_consume,
        "stream": lambda c, ch: _stream_consume(secure, "billing-2", ch),
        "dead_letters": lambda c, ch: c.read("_dead/" + ch),
    }
    first, second = connect(secure, "billing-2"), connect(secure, "billing-1")
    for route, read in routes.items():
        channel = f"invoice/v1/{route.replace('_', '-')}"
        read(first, channel)
        assert reservations(secure).get(channel) == "billing-2", route
        with pytest.raises(NotAuthorized, match="reserved by client 'billing-2'"):
            second.listen(channel)
    first.close()
    second.close()


def test_dead_letters_of_an_exclusive_channel_stay_its_owners(secure):
    owner = connect(secure, "billing-1")
    sub = owner.consume("invoice/v1/d1")
    with connect(secure, "shop-1") as shop:
        shop.send("invoice/v1/d1", {"invoice": 9})
    assert sub.get(timeout=5).nack()  # requeue_limit 0: straight to _dead/invoice/v1/d1
    with admin(secure) as a:
        wait_until(lambda: a.read("_dead/invoice/v1/d1")[0], what="the dead letter")
    before = refused(secure)
    with connect(secure, "audit-1") as auditor:  # may read "*", but not reserved channels
        for wildcard in ("_dead/invoice/*", "_dead/invoice/v1/*"):
            with pytest.raises(NotAuthorized, match="dead letters of !invoice/\\*"):
                auditor.listen(wildcard, start="oldest")
        reserved = "'_dead/invoice/v1/d1' \\(the dead letters of 'invoice/v1/d1'\\) is " \
                   "reserved by client 'billing-1'"
        with pytest.raises(NotAuthorized, match=reserved):
            auditor.read("_dead/invoice/v1/d1")
        with pytest.raises(NotAuthorized, match=reserved):
            auditor.consume("_dead/invoice/v1/d1")
        with pytest.raises(NotAuthorized, match=reserved):
            auditor.offsets(["_dead/invoice/v1/d1"])
        with httpx.Client(base_url=secure.http, timeout=10) as http:
            got = http.post("/v1/consume/_dead/invoice/v1/d1", params={"wait": 0},
                            headers=bearer(secure, "audit-1"))
        assert got.status_code == 403 and "reserved by client 'billing-1'" in got.text
        assert auditor.offsets(["orders/v1/*"]) == {}  # the connection stays
    assert refused(secure) >= before + 6
    owner.close()


def test_a_receipt_is_a_read_through_the_reservation(secure):
    with connect(secure, "shop-1") as shop:
        message_id = shop.send("invoice/v1/r1", {"invoice": 3}).id
    owner = connect(secure, "billing-1")
    owner.listen("invoice/v1/r1")
    path = f"/v1/messages/{message_id}/receipt"
    with httpx.Client(base_url=secure.http, timeout=10) as http:
        got = http.get(path, headers=bearer(secure, "billing-2"))
        assert got.status_code == 403, got.text
        assert "reserved by client 'billing-1'" in got.text
        for allowed in ("billing-1", "shop-1"):  # its reader, its publisher
            assert http.get(path, headers=bearer(secure, allowed)).status_code == 200
    owner.close()


def test_a_reservation_is_not_released_under_a_live_reader(secure):
    owner = connect(secure, "billing-1")
    owner.listen("invoice/v1/l1")
    with admin(secure) as a:
        with pytest.raises(BadRequest, match="still read by client 'billing-1'"):
            a.admin("reservations.release", channel="invoice/v1/l1")
        owner.close()
        wait_until(lambda: not any(g["members"] for g in a.admin("list")["groups"]
                                   if "invoice/v1/l1" in g["patterns"]),
                   what="the owner's subscription to end")
        assert a.admin("reservations.release", channel="invoice/v1/l1")["released_from"] == \
            "billing-1"


# -------------------------------------------------------------------- names
def test_a_colon_in_a_client_id_takes_over_no_listener(secure):
    """The attack: ``listen:<client>:<name>`` with client "team", name "x:feed" was the
    key of client "team:x", name "feed" too: the second took over the first's durable
    listener, with channels its own rules do not let it read."""
    with connect(secure, "team") as victim:
        victim.listen("orders/v1/*", name="x:feed")
    with connect(secure, "shop-1") as shop:
        shop.send("orders/v1/1", {"for": "team"})
    with connect(secure, "team:x") as attacker:
        stolen = attacker.listen("calm/v1/*", name="feed")
        with pytest.raises(Timeout):
            stolen.get(timeout=1)
    with connect(secure, "team") as victim:
        assert victim.listen("orders/v1/*", name="x:feed").get(timeout=5).payload == \
            {"for": "team"}
    with admin(secure) as a:
        keys = {g["group"] for g in a.admin("list")["groups"]}
    assert {"listen:team:x:feed", "listen:team%3Ax:feed"} <= keys


@pytest.mark.sqlite_only
def test_listeners_of_an_older_version_are_migrated_to_their_client(secure):
    """Stored data of an older version: listener keys were unescaped. On the first start
    after the upgrade the registered ids decide whose each one is."""
    with connect(secure, "team:y") as victim:
        victim.listen("calm/v1/*", name="n")
    with connect(secure, "shop-1") as shop:
        shop.send("calm/v1/1", {"for": "team:y"})
    secure.stop()
    with sqlite3.connect(secure.data_dir / "minou.db") as db:  # as an older version wrote it
        db.execute("UPDATE groups SET key = 'listen:team:y:n' WHERE key = 'listen:team%3Ay:n'")
        db.execute("UPDATE group_states SET grp = 'listen:team:y:n' "
                   "WHERE grp = 'listen:team%3Ay:n'")
        db.execute("DELETE FROM meta WHERE key = 'listen_keys'")
    secure.start()
    # "team" + "y:n" spelled the same old key.
    with connect(secure, "team") as attacker, pytest.raises(Timeout):
        attacker.listen("orders/v1/*", name="y:n").get(timeout=1)
    assert "is now 'listen:team%3Ay:n'" in secure.output
    with connect(secure, "team:y") as victim:
        assert victim.listen("calm/v1/*", name="n").get(timeout=5).payload == \
            {"for": "team:y"}


def test_transaction_ids_are_per_client(secure):
    with connect(secure, "spark-2") as squatter:
        squatter.stage("t1", [("out/v1/x", {"from": "squatter"})])
        with connect(secure, "spark-1") as owner:
            assert owner.stage("t1", [("out/v1/a", {"from": "owner"})]) == 1
            result = owner.commit_transactions("w-owner", 1, ["t1"])
            assert result["published"] == 1
            messages, _ = owner.read("out/v1/a")
            assert [m.payload for m in messages] == [{"from": "owner"}]
        assert squatter.abort_transactions(["t1"]) == 1  # its own t1, untouched


def test_a_writer_id_belongs_to_the_client_that_first_commits_under_it(secure):
    """The attack: one commit under the victim's writer id with batch 2^62 moved the
    fence, and every later commit of the victim became a silent "already published"."""
    victim = connect(secure, "spark-1")
    victim.stage("a", [("out/v1/1", {"batch": 1})])
    assert victim.commit_transactions("nightly", 1, ["a"])["published"] == 1
    before = refused(secure)
    attacker = connect(secure, "spark-2")
    attacker.stage("x", [("out/v1/1", {"evil": True})])
    with pytest.raises(NotAuthorized, match="writer id 'nightly' belongs to client 'spark-1'"):
        attacker.commit_transactions("nightly", 2**62, ["x"])
    assert refused(secure) == before + 1
    assert attacker.commit_transactions("mine", 2**62, ["x"])["published"] == 1  # still up
    victim.stage("b", [("out/v1/1", {"batch": 2})])
    result = victim.commit_transactions("nightly", 2, ["b"])
    assert result["published"] == 1 and result["discarded"] == 0
    attacker.close()
    victim.close()
    secure.stop()
    secure.start()
    with connect(secure, "spark-2") as attacker:  # the owner is stored
        attacker.stage("y", [("out/v1/1", {"evil": True})])
        with pytest.raises(NotAuthorized, match="belongs to client 'spark-1'"):
            attacker.commit_transactions("nightly", 2**62, ["y"])
    with admin(secure) as a:
        a.stage("z", [("out/v1/1", {"admin": True})])
        with pytest.raises(NotAuthorized, match="belongs to client 'spark-1'"):
            a.commit_transactions("nightly", 3, ["z"])  # admins too: a fence is a promise
        assert a.admin("clients.list")["writers"] == {"mine": "spark-2", "nightly": "spark-1"}
        # Moving the job to another client id is an admin's decision (fences kept).
        assert a.admin("writers.release", writer_id="nightly")["released_from"] == "spark-1"
        result = a.commit_transactions("nightly", 2, ["z"])
        assert result["published"] == 0 and result["discarded"] == 1  # still fenced


def test_the_second_round_table_lists_every_attack():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    section = doc.split("### Second round: reading and naming", 1)[1].split("\n## ", 1)[0]
    this = "test_the_second_round_table_lists_every_attack"
    names = [n for n in globals() if n.startswith("test_") and n != this]
    assert [n for n in names if f"`{n}`" not in section] == []
