"""Staged transactions and fences (core, no I/O)."""

from __future__ import annotations

from pathlib import Path

import pytest

from minou.auth.rules import Rules
from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.core.transactions import (
    STAGED_TTL_S,
    Transactions,
    staged_txn_weight,
    staged_weight,
)
from minou.errors import BadRequest, NotAuthorized, NotFound, OutOfSequence, QueueFull
from minou.limits import MAX_TXN_ID
from minou.names import FEDERATED_FROM, FEDERATED_SEQ
from minou.protocol.frames import Send
from minou.storage.sqlite import SQLiteStorage

from .helpers import Harness, js, payloads


def reopen(tmp_path: Path, now: float) -> Harness:
    """A broker (re)started at ``now`` on the SQLite file in ``tmp_path``: what an
    earlier run stored there is restored."""
    st = SQLiteStorage(tmp_path / "m.db")
    broker = Broker()
    broker.restore(st.open(now), now)
    return Harness(storage=st, broker=broker, now=now)


def s(channel: str, body: bytes = b"{}") -> Send:
    return Send(channel, body)


def payload_only(monkeypatch) -> None:
    """Weigh staged messages by their payload: tests of the bookkeeping count bytes."""
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "staged_weight", lambda send: len(send.data))
    monkeypatch.setattr(tx, "staged_txn_weight", lambda txn: 0)


def test_stage_take_and_bytes_accounting() -> None:
    t = Transactions()
    first, second = s("a/v1/1", b"12345"), s("a/v1/2", b"123")
    assert t.stage("c", "t1", [first], 0.0) == 1
    assert t.stage("c", "t1", [second], 0.0) == 2
    assert t.bytes == t.owner_bytes["c"] == \
        staged_txn_weight("t1") + staged_weight(first) + staged_weight(second)
    sends = t.take("c", ["t1"])
    assert [x.channel for x in sends] == ["a/v1/1", "a/v1/2"]
    assert t.bytes == 0 and t.owner_bytes == {} and t.staged == {} and t.committed == 1
    with pytest.raises(NotFound, match="unknown transaction"):
        t.take("c", ["t1"])


def test_transaction_ids_are_per_client() -> None:
    t = Transactions()
    t.stage("c1", "t", [s("a/v1/1")], 0.0)
    # Another client's "t" is another transaction: it neither blocks nor sees c1's.
    assert t.stage("c2", "t", [s("a/v1/2"), s("a/v1/3")], 0.0) == 2
    assert [x.channel for x in t.take("c2", ["t"])] == ["a/v1/2", "a/v1/3"]
    with pytest.raises(NotFound, match="unknown transaction"):
        t.take("c2", ["t"])
    assert t.abort("c2", ["t"]) == 0 and t.abort("c1", ["t"]) == 1


def test_a_writer_id_belongs_to_its_first_committer() -> None:
    t = Transactions()
    t.check_writer("c1", "job")  # unowned: anyone may
    t.writers["job"] = "c1"
    t.check_writer("c1", "job")
    with pytest.raises(NotAuthorized, match="writer id 'job' belongs to client 'c1'"):
        t.check_writer("c2", "job")
    with pytest.raises(BadRequest, match="writer_id is empty"):
        t.check_writer("c1", "")


def test_fence_discards_what_a_batch_already_published() -> None:
    t = Transactions()
    keep, skipped, updates = t.fence("w", 3, [s("a/v1/1"), s("a/v1/2")])
    assert len(keep) == 2 and skipped == [] and updates == {("w", "a/v1/1"): 3,
                                                             ("w", "a/v1/2"): 3}
    t.fences.update(updates)
    keep, skipped, _ = t.fence("w", 3, [s("a/v1/1"), s("a/v1/3")])
    assert [x.channel for x in keep] == ["a/v1/3"] and skipped == ["a/v1/1"]
    keep, _, _ = t.fence("other-writer", 3, [s("a/v1/1")])
    assert len(keep) == 1  # fences are per writer
    keep, _, _ = t.fence("w", 4, [s("a/v1/1")])
    assert len(keep) == 1


def test_a_batch_whose_range_another_session_partly_committed_is_refused() -> None:
    """Two runners of one federation link, reading at different times, cut pages of
    different bounds: (0, 500] committed, then (0, 300] is a replay (discarded), but
    (300, 800] overlaps what is stored and would repeat 301..500."""
    t = Transactions()
    t.fences[("w", "a/v1/1")] = 500
    keep, skipped, _ = t.fence("w", 300, [s("a/v1/1")], after=0)
    assert keep == [] and skipped == ["a/v1/1"]  # all of it stored already
    with pytest.raises(OutOfSequence, match="at 500 on 'a/v1/1', inside this batch "
                       r"\(300, 800\]") as err:
        t.fence("w", 800, [s("a/v1/1")], after=300)
    assert err.value.detail == {"writer_id": "w", "channel": "a/v1/1", "fence": 500,
                                "after": 300, "batch_id": 800}
    with pytest.raises(OutOfSequence):  # a page from the very start overlaps too
        t.fence("w", 800, [s("a/v1/1")], after=0)
    keep, _, updates = t.fence("w", 800, [s("a/v1/1")], after=500)  # right after it
    assert len(keep) == 1 and updates == {("w", "a/v1/1"): 800}
    keep, _, _ = t.fence("w", 800, [s("a/v1/1")], after=600)  # a gap is no overlap
    assert len(keep) == 1
    keep, _, _ = t.fence("w", 800, [s("a/v1/1")])  # no after: the Spark sink's fences
    assert len(keep) == 1
    keep, _, _ = t.fence("w", 800, [s("a/v1/2")], after=300)  # no fence there yet
    assert len(keep) == 1


def test_an_overlapping_commit_publishes_nothing_and_keeps_its_transactions() -> None:
    h = Harness()
    c = Session("fed")
    h.broker.stage(c, "t1", [Send("out/v1/a", js(i)) for i in range(3)], h.now)
    h.broker.commit_txns(c, "w", 3, ["t1"], h.now, after=0)
    h.commit()
    h.broker.stage(c, "t2", [Send("out/v1/a", js(i)) for i in range(4)], h.now)
    with pytest.raises(OutOfSequence):
        h.broker.commit_txns(c, "w", 4, ["t2"], h.now, after=1)
    assert h.broker.state.channels["out/v1/a"].next_seq == 4  # nothing more published
    assert h.broker.commit_txns(c, "w", 4, ["t2"], h.now, after=3)["published"] == 4


def test_limits_and_expiry(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 10)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES_PER_CLIENT", 10)
    payload_only(monkeypatch)
    t = Transactions()
    t.stage("c", "a", [s("a/v1/1", b"123456")], 0.0)
    with pytest.raises(QueueFull):
        t.stage("c", "b", [s("a/v1/1", b"123456")], 0.0)
    with pytest.raises(BadRequest):
        t.stage("c", "", [s("a/v1/1")], 0.0)
    assert len(t.expire(now=10.0, ttl=5.0)) == 1 and t.bytes == 0 and t.expired == 1


def test_a_transaction_being_staged_does_not_expire_and_an_expired_one_stays_dead() -> None:
    t = Transactions()
    t.stage("c", "t", [s("a/v1/1")], 0.0)
    t.stage("c", "t", [s("a/v1/2")], STAGED_TTL_S - 10)  # still staging an hour later
    assert t.expire(now=STAGED_TTL_S + 10) == [] and len(t.peek("c", ["t"])) == 2
    assert t.expire(now=2 * STAGED_TTL_S) == [("c", "t")]
    # A late STAGE must not start a fresh "t" that a commit would publish alone.
    with pytest.raises(NotFound, match="expired"):
        t.stage("c", "t", [s("a/v1/3")], 2 * STAGED_TTL_S + 1)
    with pytest.raises(NotFound):
        t.take("c", ["t"])
    t.expire(now=4 * STAGED_TTL_S)  # forgotten after another TTL
    assert t.stage("c", "t", [s("a/v1/3")], 4 * STAGED_TTL_S) == 1


def _commit(h: Harness, session: Session, batch: int, txns: list[str]) -> dict:
    result = h.broker.commit_txns(session, "w", batch, txns, h.now)
    h.commit()
    return result


def test_a_commit_without_room_publishes_nothing_and_moves_no_fence() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=5))
    c = Session("spark")
    h.broker.stage(c, "t1", [Send("out/v1/a", js(i)) for i in range(8)], h.now)
    with pytest.raises(QueueFull, match="room for 5"):
        h.broker.commit_txns(c, "w", 3, ["t1"], h.now)
    assert "out/v1/a" not in h.broker.channels or h.broker.channels["out/v1/a"].count == 0
    assert h.broker.transactions.fences == {} and ("spark", "t1") in h.broker.transactions.staged
    # The writer aborts and replays batch 3 with fewer rows: nothing was fenced away.
    h.broker.transactions.abort("spark", ["t1"])
    h.broker.stage(c, "t2", [Send("out/v1/a", js(i)) for i in range(5)], h.now)
    assert _commit(h, c, 3, ["t2"])["published"] == 5
    assert h.broker.transactions.fences == {("w", "out/v1/a"): 3}


def test_a_commit_checks_rules_and_schemas_again() -> None:
    h = Harness()
    c = Session("spark", access=Rules.parse([{"client": "*", "write": ["out/*"]}])
                .for_client("spark"))
    h.broker.stage(c, "t1", [Send("out/v1/a", js(1)), Send("out/v1/b", js(2))], h.now)
    # A reload takes the write right on out/v1/b away before the driver commits.
    c.access = Rules.parse([{"client": "*", "write": ["out/v1/a"]}]).for_client("spark")
    with pytest.raises(NotAuthorized):
        h.broker.commit_txns(c, "w", 0, ["t1"], h.now)
    assert h.broker.transactions.fences == {} and "out/v1/a" not in h.broker.channels


def test_a_writer_fences_one_run_of_batches_across_a_restart(tmp_path) -> None:
    """The first commit with a lineage (a streaming query's id) binds it to the writer;
    another run's commit is refused (its batches would be discarded as replays) until
    the writer is released with its fences; the binding is stored."""
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(0.0)
    h = Harness(storage=st)
    app = Session("app")

    def commit(batch_id: int, lineage: str, txn: str) -> dict:
        h.broker.transactions.stage("app", txn, [Send("out/v1/x", js(batch_id))], h.now)
        result = h.broker.commit_txns(app, "job", batch_id, [txn], h.now, lineage)
        h.commit()
        return result

    assert commit(0, "query-1", "t0")["published"] == 1
    assert commit(0, "", "t1")["discarded"] == 1  # no lineage (a batch job): no check
    st.close()
    st = SQLiteStorage(tmp_path / "m.db")
    broker = Broker()
    broker.restore(st.open(1.0), 1.0)
    h = Harness(storage=st, broker=broker)
    with pytest.raises(BadRequest, match="writer id 'job' fences the batches of another run "
                                         r"\(query query-1"):
        commit(0, "query-2", "t2")
    assert commit(1, "query-1", "t3")["published"] == 1  # the same run goes on
    h.broker.release_writer("job", drop_fences=True)
    h.commit()
    assert commit(0, "query-2", "t4")["published"] == 1  # taken over: nothing discarded
    st.close()


def test_staged_transactions_are_stored_and_dropped_when_done(tmp_path) -> None:
    """STAGE parts are written with the next commit and read back at start; a commit,
    an abort or an expiry removes them, so a restart gives back exactly what is open."""
    h = reopen(tmp_path, 0.0)
    app = Session("app")
    for txn in ("kept", "committed", "aborted", "old"):
        h.broker.stage(app, txn, [Send("out/v1/x", js(txn)), Send("out/v1/x", js(1))],
                       0.0 if txn == "old" else 3000.0)
    h.broker.stage(app, "kept", [Send("out/v1/y", js(2))], 3000.0)  # a second part
    h.commit()
    h.broker.commit_txns(app, "job", 0, ["committed"], 3000.0)
    h.broker.abort_txns(app, ["aborted"])
    h.broker.expire_txns(3700.0)  # "old" was last staged an hour ago
    h.commit()
    h.storage.close()  # type: ignore[union-attr]
    h = reopen(tmp_path, 3700.0)
    staged = h.broker.transactions.staged
    assert list(staged) == [("app", "kept")]
    assert [s.channel for s in staged[("app", "kept")].sends] == ["out/v1/x"] * 2 + ["out/v1/y"]
    assert h.broker.transactions.bytes == staged[("app", "kept")].bytes > 0
    # Its client's share is counted again too (bounded per client after a restart).
    assert h.broker.transactions.owner_bytes == {"app": staged[("app", "kept")].bytes}
    assert staged[("app", "kept")].parts == 2  # the next STAGE is stored as part 3
    result = h.broker.commit_txns(app, "job", 1, ["kept"], 3700.0)
    assert result["published"] == 3
    h.storage.close()  # type: ignore[union-attr]


def test_a_commit_sent_again_gets_the_same_answer_even_after_a_restart(tmp_path) -> None:
    """Its answer lost with the connection (or the broker restarted), a writer sends
    TXN_COMMIT again: the same result, nothing published twice; a commit whose storage
    write failed is not answered as done."""
    from minou.errors import StorageFull

    st = SQLiteStorage(tmp_path / "m.db")
    st.open(0.0)
    h = Harness(storage=st)
    app = Session("app")
    h.broker.stage(app, "t1", [Send("out/v1/x", js(1))], 0.0)
    first = h.broker.commit_txns(app, "job", 0, ["t1"], 0.0)
    h.commit()
    assert h.broker.commit_txns(app, "job", 0, ["t1"], 0.0) == first
    st.close()
    st = SQLiteStorage(tmp_path / "m.db")
    broker = Broker()
    broker.restore(st.open(10.0), 10.0)
    assert broker.commit_txns(app, "job", 0, ["t1"], 10.0) == first
    assert broker.channels["out/v1/x"].count == 1
    # A commit that is not written (a full disk) is not remembered as answered.
    h = Harness(storage=st, broker=broker, now=10.0)
    broker.stage(app, "t2", [Send("out/v1/x", js(2))], 10.0)
    h.commit()
    broker.commit_txns(app, "job", 1, ["t2"], 10.0)
    broker.on_failed(broker.take_writes(), StorageFull("full", data_dir="/x", free_bytes=0))
    assert broker.transactions.answered("app", ["t2"]) is None
    broker.expire_txns(10.0 + 3601)  # an hour on, the answer is forgotten too
    assert broker.transactions.answered("app", ["t1"]) is None
    st.close()


def test_a_lineage_is_bounded_like_an_id() -> None:
    t = Transactions()
    with pytest.raises(BadRequest, match="a lineage is at most 200 characters, got 201"):
        t.check_lineage("job", "q" * 201)
    t.check_lineage("job", "q" * 200)


# ------------------------------------------------------ quota, limits, answers
def test_abort_gives_back_the_staged_bytes_so_a_client_can_stage_up_to_the_limit_again(
        monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 10)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES_PER_CLIENT", 10)
    payload_only(monkeypatch)
    h = Harness()
    c = Session("spark")
    assert h.broker.stage(c, "a", [Send("out/v1/a", b"1234")], h.now) == 1
    assert h.broker.stage(c, "b", [Send("out/v1/a", b"123456")], h.now) == 1  # 10: full
    with pytest.raises(QueueFull):
        h.broker.stage(c, "c", [Send("out/v1/a", b"1")], h.now)
    assert h.broker.abort_txns(c, ["a", "b", "never"]) == 2  # what it answers: aborted 2
    assert h.broker.transactions.stats()["staged_bytes"] == 0
    assert h.broker.stage(c, "c", [Send("out/v1/a", b"1234567890")], h.now) == 1
    with pytest.raises(QueueFull):
        h.broker.stage(c, "d", [Send("out/v1/a", b"1")], h.now)
    # Aborting one of two gives back its bytes only.
    assert h.broker.abort_txns(c, ["c"]) == 1
    h.broker.stage(c, "d", [Send("out/v1/a", b"123")], h.now)
    h.broker.stage(c, "e", [Send("out/v1/a", b"1234567")], h.now)
    assert h.broker.abort_txns(c, ["e"]) == 1
    assert h.broker.transactions.stats()["staged_bytes"] == 3
    h.broker.stage(c, "f", [Send("out/v1/a", b"1234567")], h.now)  # 3 + 7: up to the limit


def test_a_commit_gives_back_the_staged_bytes_too(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 4)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES_PER_CLIENT", 4)
    payload_only(monkeypatch)
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "a", [Send("out/v1/a", b"1234")], h.now)
    h.broker.commit_txns(c, "w", 0, ["a"], h.now)
    h.broker.stage(c, "b", [Send("out/v1/a", b"1234")], h.now)


@pytest.mark.parametrize("length, ok", [(1, True), (200, True), (201, False), (0, False)])
def test_a_transaction_id_and_a_writer_id_are_1_to_200_characters(length: int, ok: bool
                                                                  ) -> None:
    t = Transactions()
    name = "t" * length
    if ok:
        assert t.stage("c", name, [s("a/v1/1")], 0.0) == 1
        t.check_writer("c", name)
        return
    with pytest.raises(BadRequest) as caught:
        t.stage("c", name, [s("a/v1/1")], 0.0)
    assert caught.value.message
    with pytest.raises(BadRequest):
        t.check_writer("c", name)
    assert t.staged == {} and t.bytes == 0


def test_a_stage_frame_holds_at_most_max_batch_messages(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_BATCH", 3)
    t = Transactions()
    assert t.stage("c", "t", [s("a/v1/1")] * 3, 0.0) == 3
    with pytest.raises(BadRequest) as caught:
        t.stage("c", "t", [s("a/v1/1")] * 4, 0.0)
    assert caught.value.message
    assert len(t.peek("c", ["t"])) == 3


def test_staged_bytes_may_reach_the_limit_exactly(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 10)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES_PER_CLIENT", 10)
    payload_only(monkeypatch)
    t = Transactions()
    t.stage("c", "a", [s("a/v1/1", b"12345")], 0.0)
    t.stage("c", "b", [s("a/v1/1", b"12345")], 0.0)
    with pytest.raises(QueueFull) as caught:
        t.stage("c", "c", [s("a/v1/1", b"1")], 0.0)
    assert caught.value.message
    assert t.bytes == 10


def test_a_staged_message_weighs_what_it_holds_not_only_its_payload(monkeypatch) -> None:
    """Empty messages staged by the 10,000 held ~200 B of memory each and counted 0: a
    client held 747 MiB against a 256 MiB bound. Names, headers and a base count too."""
    import minou.core.transactions as tx

    empty = tx.staged_weight(Send("a/v1/1", b""))
    assert empty > 200
    full = Send("a/v1/1", b"12", headers={"k": "vv"}, key="kk", dedup="ddd")
    # a header is a dict and two str objects (~50 B each before their text), not 8 B
    assert tx.staged_weight(full) >= empty + 2 + 64 + 2 * 50 + 3 + 2 * 50 + 5
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", tx.staged_txn_weight("a") + 100 * empty)
    t = Transactions()
    t.stage("c", "a", [Send("a/v1/1", b"")] * 100, 0.0)  # exactly the bound
    with pytest.raises(QueueFull) as caught:
        t.stage("d", "b", [Send("a/v1/1", b"")], 0.0)
    assert caught.value.detail == {"limit": tx.MAX_STAGED_BYTES}
    t.abort("c", ["a"])
    assert t.bytes == 0 and t.owner_bytes == {}


def test_every_part_a_staged_message_holds_adds_to_its_weight() -> None:
    """Each optional part is an object the broker keeps while the message is staged:
    a long header name or value, a key, a dedup id, a TTL, a delay, a producer seq
    outside the small ints Python shares (-5..256) each weigh at least their size."""
    import sys

    import minou.core.transactions as tx

    def w(**kw: object) -> int:
        return tx.staged_weight(Send("a/v1/1", b"x", **kw))  # type: ignore[arg-type]

    base, one = w(), w(headers={"k": "v"})
    assert one > base
    assert w(headers={"k" * 101: "v"}) - one >= 100
    assert w(headers={"k": "v" * 101}) - one >= 100
    assert w(key="k" * 100) - base >= sys.getsizeof("k" * 100)
    assert w(dedup="d" * 100) - base >= sys.getsizeof("d" * 100)
    assert w(ttl=5.0) > base and w(delay=5.0) > base and w(ttl=5.0, delay=5.0) > w(ttl=5.0)
    assert w(pseq=-5) == w(pseq=256) == base
    assert w(pseq=-6) > base and w(pseq=257) > base
    assert tx.staged_txn_weight("t" * 201) - tx.staged_txn_weight("t") >= 200


def test_one_client_may_stage_only_its_share(monkeypatch) -> None:
    """A client may fill MAX_STAGED_BYTES_PER_CLIENT, not the broker's whole bound:
    another writer still stages. Its share comes back on commit, abort or expiry."""
    import minou.core.transactions as tx

    payload_only(monkeypatch)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES", 10)
    monkeypatch.setattr(tx, "MAX_STAGED_BYTES_PER_CLIENT", 6)
    t = Transactions()
    t.stage("c", "a", [s("a/v1/1", b"1234")], 0.0)
    t.stage("c", "b", [s("a/v1/1", b"12")], 0.0)  # 6: its share, full
    with pytest.raises(QueueFull) as caught:
        t.stage("c", "x", [s("a/v1/1", b"1")], 0.0)
    assert caught.value.detail == {"client": "c", "limit": 6}
    assert "client 'c' has 6 bytes staged already" in caught.value.message
    t.stage("d", "a", [s("a/v1/1", b"1234")], 0.0)  # another client: room left
    assert t.owner_bytes == {"c": 6, "d": 4} and t.bytes == 10
    t.take("c", ["a"])
    t.stage("c", "y", [s("a/v1/1", b"1234")], 0.0)
    t.expire(now=100.0, ttl=5.0)
    assert t.owner_bytes == {} and t.bytes == 0


def test_an_unknown_transaction_names_the_first_five_missing_ids() -> None:
    t = Transactions()
    t.stage("c", "known", [s("a/v1/1")], 0.0)
    missing = [f"m{i}" for i in range(7)]
    with pytest.raises(NotFound) as caught:
        t.peek("c", ["known", *missing])
    assert caught.value.detail == {"txns": "m0, m1, m2, m3, m4"}
    with pytest.raises(NotFound) as caught:
        t.peek("other-client", ["known"])  # ids are per client
    assert caught.value.detail == {"txns": "known"}


def test_a_commit_naming_a_transaction_twice_names_the_first_five_repeated() -> None:
    h = Harness()
    c = Session("spark")
    for t in ("a", "b"):
        h.broker.stage(c, t, [Send("out/v1/a", js(t))], h.now)
    with pytest.raises(BadRequest) as refused:
        h.broker.commit_txns(c, "w", 0, ["b", "a", "b"], h.now)
    assert refused.value.detail == {"txns": "b"}
    names = [f"t{i}" for i in range(7)]
    with pytest.raises(BadRequest) as refused:
        h.broker.commit_txns(c, "w", 0, ["a", *names, *reversed(names)], h.now)
    assert refused.value.detail == {"txns": "t0, t1, t2, t3, t4"}
    assert "['t0', 't1', 't2', 't3', 't4'] more than once" in refused.value.message
    assert h.broker.commit_txns(c, "w", 0, ["a", "b"], h.now)["published"] == 2


def test_a_late_stage_to_an_expired_transaction_names_it() -> None:
    t = Transactions()
    t.stage("c", "t", [s("a/v1/1")], 0.0)
    t.expire(now=STAGED_TTL_S + 1)
    with pytest.raises(NotFound) as caught:
        t.stage("c", "t", [s("a/v1/1")], STAGED_TTL_S + 2)
    assert caught.value.detail == {"txns": "t"}


def test_a_writer_owned_by_another_client_is_refused_with_who_owns_it() -> None:
    t = Transactions()
    t.writers["job"] = "c1"
    with pytest.raises(NotAuthorized) as caught:
        t.check_writer("c2", "job")
    assert caught.value.detail == {"writer_id": "job", "owner": "c1", "client": "c2"}


def test_a_lineage_refusal_names_the_writer_and_both_runs() -> None:
    t = Transactions()
    with pytest.raises(BadRequest) as caught:
        t.check_lineage("job", "q" * 201)
    assert caught.value.detail == {"limit": 200}
    t.lineages["job"] = "query-1"
    t.check_lineage("job", "query-1")
    t.check_lineage("job", "")  # no lineage (a batch job): no check
    t.check_lineage("other", "query-2")  # a writer without a run bound yet
    with pytest.raises(BadRequest) as caught:
        t.check_lineage("job", "query-2")
    assert caught.value.detail == {"writer_id": "job", "lineage": "query-2",
                                   "bound": "query-1", "why": "lineage"}


@pytest.mark.parametrize("age, kept", [(STAGED_TTL_S - 1, True), (STAGED_TTL_S, True),
                                       (STAGED_TTL_S + 0.5, False)])
def test_a_staged_transaction_lives_its_ttl_after_its_last_stage(age: float, kept: bool
                                                                ) -> None:
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "t", [Send("out/v1/a", js(1))], 100.0)
    assert h.broker.expire_txns(100.0 + age) == (0 if kept else 1)
    stats = h.broker.transactions.stats()
    assert (stats["staged"], stats["expired"]) == ((1, 0) if kept else (0, 1))
    assert h.broker.take_writes().unstaged == ([] if kept else [("spark", "t")])


def test_an_expired_id_is_remembered_for_one_ttl_more() -> None:
    t = Transactions()
    t.stage("c", "t", [s("a/v1/1")], 0.0)
    gone_at = STAGED_TTL_S + 1
    t.expire(gone_at)
    t.expire(gone_at + STAGED_TTL_S)  # exactly a TTL on: still refused
    with pytest.raises(NotFound, match="expired"):
        t.stage("c", "t", [s("a/v1/1")], gone_at + STAGED_TTL_S)
    t.expire(gone_at + STAGED_TTL_S + 0.5)
    assert t.stage("c", "t", [s("a/v1/1")], gone_at + STAGED_TTL_S + 0.5) == 1


def test_expired_counts_every_expiry_since_start() -> None:
    t = Transactions()
    t.stage("c", "a", [s("a/v1/1")], 0.0)
    t.expire(STAGED_TTL_S + 1)
    t.stage("c", "b", [s("a/v1/1")], STAGED_TTL_S + 1)
    t.stage("c", "c", [s("a/v1/1")], STAGED_TTL_S + 1)
    t.expire(3 * STAGED_TTL_S)
    assert t.stats()["expired"] == 3


@pytest.mark.parametrize("age, answered", [(STAGED_TTL_S, True), (STAGED_TTL_S + 0.5, False)])
def test_a_commit_answer_is_kept_one_ttl(age: float, answered: bool) -> None:
    h = Harness(now=5_000.0)
    c = Session("spark")
    h.broker.stage(c, "t", [Send("out/v1/a", js(1))], h.now)
    first = h.broker.commit_txns(c, "w", 0, ["t"], h.now)
    h.commit()
    h.broker.expire_txns(h.now + age)
    assert h.broker.transactions.answered("spark", ["t"]) == (first if answered else None)


def test_commits_count_transactions_since_start() -> None:
    h = Harness()
    c = Session("spark")
    for i, txns in enumerate((["a", "b"], ["c"])):
        for t in txns:
            h.broker.stage(c, t, [Send("out/v1/a", js(t))], h.now)
        h.broker.commit_txns(c, "w", i, txns, h.now)
    assert h.broker.transactions.stats()["committed"] == 3


def test_transaction_stats_are_what_the_stats_endpoint_shows() -> None:
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "a", [Send("out/v1/a", js(1)), Send("out/v1/b", js(2))], h.now)
    h.broker.commit_txns(c, "w", 1, ["a"], h.now)
    h.broker.stage(c, "b", [Send("out/v1/a", js(1)), Send("out/v1/c", js(3))], h.now)
    h.broker.commit_txns(c, "w", 1, ["b"], h.now)  # out/v1/a replays batch 1
    h.broker.stage(c, "open", [Send("out/v1/a", b"[1,2]")], h.now)
    assert h.broker.transactions.stats() == {
        "staged": 1, "committed": 2,
        "staged_bytes": staged_txn_weight("open") + staged_weight(Send("out/v1/a", b"[1,2]")),
        "discarded_by_fence": 1, "expired": 0, "answers": 2, "answers_forgotten": 0,
        "fences": 3, "writers": 1}


def test_commit_answers_are_bounded_per_client_and_in_all_oldest_first(tmp_path) -> None:
    """Each committed transaction's answer is kept an hour for a TXN_COMMIT sent again:
    with no bound, a client committing small transactions fast held ~1.3 KB of the
    broker a commit for an hour (stored too, read back by a restart). Past the bounds
    the oldest go, from memory and from storage."""
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(0.0)
    h = Harness(storage=st)
    h.broker.transactions.max_answers_per_client = 3
    h.broker.transactions.max_answers = 5
    answers: dict[tuple[str, str], dict] = {}
    for n in range(6):  # one client: its 3 newest stay
        h.broker.stage(Session("a"), f"t{n}", [Send("out/v1/x", js(n))], 0.0)
        answers[("a", f"t{n}")] = h.broker.commit_txns(Session("a"), "wa", n, [f"t{n}"], 0.0)
        h.commit()
    kept = {k for k in answers if h.broker.transactions.answered(*k[:1], [k[1]])}
    assert kept == {("a", "t3"), ("a", "t4"), ("a", "t5")}
    for client, txn in (("b", "u"), ("c", "u"), ("a", "t6"), ("d", "u")):
        h.broker.stage(Session(client), txn, [Send("out/v1/x", js(1))], 0.0)
        h.broker.commit_txns(Session(client), "w" + client, int(txn[1:] or 0), [txn], 0.0)
        h.commit()
    t = h.broker.transactions
    # a's t3 went for a's t6 (3 a client), then a's t4 for d's (5 in all: the oldest)
    assert list(t.done) == [("a", "t5"), ("b", "u"), ("c", "u"), ("a", "t6"), ("d", "u")]
    assert t.stats()["answers"] == 5 and t.stats()["answers_forgotten"] == 5
    # A forgotten one sent again: unknown, as after its hour (nothing published twice)
    with pytest.raises(NotFound, match="unknown transaction"):
        h.broker.commit_txns(Session("a"), "wa", 3, ["t3"], 0.0)
    assert h.broker.commit_txns(Session("a"), "wa", 6, ["t6"], 0.0)["published"] == 1
    # Storage holds what memory holds: the forgotten rows went with their commits
    st.close()
    again = reopen(tmp_path, 10.0)
    assert set(again.broker.transactions.done) == set(t.done)
    again.storage.close()  # type: ignore[union-attr]


def test_an_id_committed_again_keeps_the_newest_answer_and_its_age() -> None:
    """A writer may commit a transaction id again (staged anew after its commit): its
    answer is then the newest, so the bounds and the expiry take the others first."""
    t = Transactions(max_answers_per_client=2)
    t.remember("a", "t1", 0.0, {"published": 1})
    t.remember("a", "t2", 1.0, {"published": 2})
    assert t.remember("a", "t1", 2.0, {"published": 3}) == []
    assert t.answered("a", ["t1"]) == {"published": 3}
    assert t.expire(1.0 + STAGED_TTL_S + 0.5) == [("a", "t2")]  # t1 is an hour old later
    t.remember("a", "t2", 3.0, {"published": 4})
    assert t.remember("a", "t3", 4.0, {"published": 5}) == [("a", "t1")]  # the oldest


def test_answers_read_back_past_the_bounds_are_forgotten_and_their_rows_go(tmp_path) -> None:
    """A store written under wider bounds (an older broker) is cut to them at the
    start, oldest first (storage reads them by name, not by age); the rows of the
    answers dropped go with the next expiry sweep."""
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(0.0)
    h = Harness(storage=st)
    for n, name in enumerate(("t9", "t8", "t2", "t3")):  # by name: the newest first
        h.broker.stage(Session("a"), name, [Send("out/v1/x", js(n))], n * 0.1)
        h.broker.commit_txns(Session("a"), "wa", n, [name], n * 0.1)
        h.commit()
    st.close()
    st = SQLiteStorage(tmp_path / "m.db")
    snap = st.open(1.0)
    broker = Broker()
    broker.transactions.max_answers_per_client = 2
    broker.restore(snap, 1.0)
    assert list(broker.transactions.done) == [("a", "t2"), ("a", "t3")]
    h = Harness(storage=st, broker=broker, now=1.0)
    broker.expire_txns(2.0)  # nothing is an hour old: only the forgotten rows go
    h.commit()
    st.close()
    again = reopen(tmp_path, 3.0)
    assert list(again.broker.transactions.done) == [("a", "t2"), ("a", "t3")]
    assert [row[:3] for row in SQLiteStorage(tmp_path / "m.db").open(3.0).staged] == [
        ("a", "t2", 0), ("a", "t3", 0)]


def test_staged_parts_survive_restarts_in_order(tmp_path) -> None:
    """Each STAGE is stored as one part; after a restart the next STAGE adds a part
    after those read back, never over one of them."""
    app = Session("app")
    h = reopen(tmp_path, 0.0)
    for i in range(4):
        if i in (2, 3):  # two parts staged, then one part per run
            h.storage.close()  # type: ignore[union-attr]
            h = reopen(tmp_path, float(i))
        h.broker.stage(app, "t", [Send("out/v1/x", js(2 * i)), Send("out/v1/x", js(2 * i + 1))],
                       h.now)
        h.commit()
    h.storage.close()  # type: ignore[union-attr]
    h = reopen(tmp_path, 4.0)
    # what they hold counts against the bounds after a restart as when staged
    held = staged_txn_weight("t") + sum(staged_weight(Send("out/v1/x", js(i)))
                                        for i in range(8))
    assert (h.broker.transactions.bytes, h.broker.transactions.owner_bytes) == (
        held, {"app": held})
    result = h.broker.commit_txns(app, "job", 0, ["t"], h.now)
    h.commit()
    assert result["published"] == 8
    sub = h.subscribe(Session("r"), patterns="out/v1/x", group="g", prefetch=10)
    assert payloads(h.take(sub)) == list(range(8))
    h.storage.close()  # type: ignore[union-attr]


@pytest.mark.parametrize("batch_id", [-5, -1, 0, 2**62])
def test_a_writers_first_batch_is_published_whatever_its_id(batch_id: int) -> None:
    """No fence yet on a channel: nothing of it was seen, so nothing is a replay (a
    batch id of -1 used to be taken for one, and its messages silently discarded)."""
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "t", [Send("out/v1/a", js(1))], h.now)
    result = h.broker.commit_txns(c, "w", batch_id, ["t"], h.now)
    assert (result["published"], result["discarded"]) == (1, 0)
    h.commit()
    assert h.broker.transactions.fences == {("w", "out/v1/a"): batch_id}
    h.broker.stage(c, "t2", [Send("out/v1/a", js(1))], h.now)
    again = h.broker.commit_txns(c, "w", batch_id, ["t2"], h.now)  # a replay now
    assert (again["published"], again["discarded"]) == (0, 1)
    assert h.broker.txn_replay_holds("w", batch_id, ["out/v1/a"])


def test_a_replay_holds_only_while_the_commit_it_repeats_stands() -> None:
    """The engine answers a replay ("discarded") only if the fence that made it one is
    still in place once durable: a failed commit moves its fences back."""
    from minou.errors import StorageFull

    full = StorageFull("full", data_dir="/x", free_bytes=0)
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "t0", [Send("out/v1/a", js(0))], h.now)
    h.broker.commit_txns(c, "w", 0, ["t0"], h.now)
    h.commit()
    h.broker.stage(c, "t1", [Send("out/v1/a", js(1)), Send("out/v1/b", js(1))], h.now)
    h.broker.commit_txns(c, "w", 1, ["t1"], h.now)
    failing = h.broker.take_writes()
    h.broker.stage(c, "t2", [Send("out/v1/a", js(1)), Send("out/v1/b", js(1))], h.now)
    replay = h.broker.commit_txns(c, "w", 1, ["t2"], h.now)
    assert replay["replayed_channels"] == ["out/v1/a", "out/v1/b"]
    assert h.broker.txn_replay_holds("w", 1, ["out/v1/a", "out/v1/b"])
    h.broker.on_failed(failing, full)
    assert not h.broker.txn_replay_holds("w", 1, ["out/v1/a"])  # back at batch 0
    assert not h.broker.txn_replay_holds("w", 1, ["out/v1/b"])  # no fence at all now
    assert h.broker.txn_replay_holds("w", 0, ["out/v1/a"])
    assert not h.broker.txn_replay_holds("w", 0, ["out/v1/a", "out/v1/b"])


def test_a_transaction_publishes_to_channels_not_broadcasts() -> None:
    h = Harness()
    c = Session("spark")
    with pytest.raises(BadRequest) as caught:
        h.broker.stage(c, "t", [Send("out/v1/a", js(1)), Send("out/v1/*", js(2))], h.now)
    assert caught.value.message
    assert h.broker.transactions.staged == {}


def test_releasing_a_writer_frees_it_and_dropping_its_fences_forgets_them_durably(
        tmp_path) -> None:
    """release keeps the fences (a job moved to another client stays exactly-once);
    with drop_fences the writer's fences and run go, even those not written yet."""
    def commit(h: Harness, who: Session, writer: str, batch: int, txn: str,
               lineage: str = "") -> dict:
        h.broker.stage(who, txn, [Send("out/v1/a", js(batch))], h.now)
        return h.broker.commit_txns(who, writer, batch, [txn], h.now, lineage)

    first, second = Session("first"), Session("second")
    h = reopen(tmp_path, 0.0)
    assert h.broker.release_writer("job") is None  # never used: nothing to free
    commit(h, first, "job", 1, "t1", "run-1")
    commit(h, first, "keep", 1, "t2")
    h.commit()
    assert h.broker.release_writer("job") == "first"
    h.commit()
    h.storage.close()  # type: ignore[union-attr]
    h = reopen(tmp_path, 1.0)
    assert h.broker.transactions.writers == {"keep": "first"}
    assert commit(h, second, "job", 1, "t3", "run-1")["discarded"] == 1  # fences stayed
    commit(h, second, "job", 2, "t4", "run-1")  # not written yet when released:
    assert h.broker.release_writer("job", drop_fences=True) == "second"
    h.commit()
    h.storage.close()  # type: ignore[union-attr]
    h = reopen(tmp_path, 2.0)
    tx = h.broker.transactions
    assert tx.fences == {("keep", "out/v1/a"): 1}
    assert tx.writers == {"keep": "first"} and tx.lineages == {}
    assert commit(h, first, "job", 1, "t5", "run-2")["published"] == 1
    h.commit()
    h.storage.close()  # type: ignore[union-attr]


# ------------------------------------------------------------ commit checks
def test_a_commit_into_channels_without_max_items_or_dropping_the_oldest_publishes_all(
        ) -> None:
    """Plain and transactional publishes into a channel without max_items (or one that
    drops its oldest when full) are never refused for room."""
    def options(key: str) -> ChannelOptions:
        if key == "drop/v1":
            return ChannelOptions(max_items=2, overflow="drop_oldest")
        return ChannelOptions(max_items=3) if key == "full/v1" else ChannelOptions()

    h = Harness(channel_options=options)
    c = Session("spark")
    assert [o.code for o in h.publish(*(Send("free/v1/a", js(i)) for i in range(5)))] == [0] * 5
    h.broker.stage(c, "t", [Send("free/v1/a", js(i)) for i in range(5)]
                   + [Send("drop/v1/a", js(i)) for i in range(4)]
                   + [Send("full/v1/a", js(i)) for i in range(3)], h.now)
    result = h.broker.commit_txns(c, "w", 0, ["t"], h.now)
    h.commit()
    assert (result["published"], result["failed"]) == (12, [])
    counts = {name: log.count for name, log in h.broker.channels.items()}
    assert counts == {"free/v1/a": 10, "drop/v1/a": 2, "full/v1/a": 3}


def test_a_commit_is_refused_by_any_full_channel_it_names_counting_what_is_in_flight(
        ) -> None:
    def options(key: str) -> ChannelOptions:
        return ChannelOptions(max_items=5) if key == "full/v1" else ChannelOptions()

    h = Harness(channel_options=options)
    c = Session("spark")
    h.publish(*(Send("full/v1/a", js(i)) for i in range(2)))
    h.publish(*(Send("full/v1/a", js(i)) for i in range(2)), commit=False)  # in flight
    h.broker.stage(c, "t", [Send("free/v1/a", js(1)), Send("full/v1/a", js(1)),
                            Send("full/v1/a", js(2))], h.now)
    with pytest.raises(QueueFull, match="room for 1") as caught:
        h.broker.commit_txns(c, "w", 0, ["t"], h.now)
    assert caught.value.detail == {"channel": "full/v1/a", "limit": 5}
    h.commit()
    h.publish(Send("full/v1/a", js(5)))
    with pytest.raises(QueueFull, match="room for 0"):
        h.broker.commit_txns(c, "w", 0, ["t"], h.now)
    assert "free/v1/a" not in h.broker.channels  # nothing of it was published


def test_a_commit_while_storage_is_full_is_refused_with_the_storage_error() -> None:
    from minou.errors import StorageFull

    full = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "t", [Send("out/v1/a", js(1))], h.now)
    h.broker.storage_refusal = full
    with pytest.raises(StorageFull) as caught:
        h.broker.commit_txns(c, "w", 0, ["t"], h.now)
    assert (caught.value.message, caught.value.detail) == (full.message, full.detail)
    assert h.broker.transactions.staged  # still staged


def test_a_lineage_is_bound_by_the_first_commit_that_names_one() -> None:
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "a", [Send("out/v1/a", js(1))], h.now)
    h.broker.commit_txns(c, "w", 0, ["a"], h.now, "run-1")
    assert h.broker.take_writes().meta == {"writer_lineage:w": "run-1"}
    h.broker.stage(c, "b", [Send("out/v1/a", js(2))], h.now)
    h.broker.commit_txns(c, "w", 1, ["b"], h.now, "run-1")
    assert h.broker.take_writes().meta == {}  # bound already: nothing new to store
    h.broker.stage(c, "c", [Send("out/v1/a", js(3))], h.now)
    with pytest.raises(BadRequest) as caught:
        h.broker.commit_txns(c, "w", 2, ["c"], h.now, "run-2")
    assert caught.value.detail["bound"] == "run-1"


def test_commit_answers_count_what_each_published_and_discarded() -> None:
    h = Harness()
    c = Session("spark")
    answers = []
    for i, channels in enumerate((["a", "b"], ["a", "c"], ["a", "b", "d"])):
        h.broker.stage(c, f"t{i}", [Send(f"out/v1/{ch}", js(i)) for ch in channels], h.now)
        answers.append(h.broker.commit_txns(c, "w", 1, [f"t{i}"], h.now))
    assert [(a["published"], a["discarded"], a["replayed_channels"]) for a in answers] == [
        (2, 0, []), (1, 1, ["out/v1/a"]), (1, 2, ["out/v1/a", "out/v1/b"])]
    assert h.broker.transactions.stats()["discarded_by_fence"] == 3


def test_aborts_and_commits_in_one_batch_are_all_stored(tmp_path) -> None:
    """What one storage commit carries for transactions (parts dropped, answers kept)
    is everything done since the last: nothing of an earlier call is lost."""
    app = Session("app")
    h = reopen(tmp_path, 0.0)
    for t in ("aborted", "one", "two"):
        h.broker.stage(app, t, [Send("out/v1/x", js(t))], 0.0)
    h.commit()
    h.broker.abort_txns(app, ["aborted"])
    first = h.broker.commit_txns(app, "w", 0, ["one"], 0.0)
    second = h.broker.commit_txns(app, "w", 1, ["two"], 0.0)
    h.commit()
    h.storage.close()  # type: ignore[union-attr]
    h = reopen(tmp_path, 1.0)
    assert h.broker.transactions.staged == {}
    assert h.broker.commit_txns(app, "w", 0, ["one"], 1.0) == first
    assert h.broker.commit_txns(app, "w", 1, ["two"], 1.0) == second
    h.storage.close()  # type: ignore[union-attr]


def test_a_commit_naming_a_transaction_twice_is_refused_and_changes_nothing() -> None:
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "t11", [Send("out/v1/a", b"1")], h.now)
    with pytest.raises(BadRequest) as caught:
        h.broker.commit_txns(c, "w", 1, ["t11", "t11"], h.now)
    assert "t11" in caught.value.message and caught.value.detail == {"txns": "t11"}
    # Nothing was taken: the transaction is still staged, and commits once.
    assert h.broker.commit_txns(c, "w", 1, ["t11"], h.now)["published"] == 1
    assert h.broker.state.transactions.staged == {}


def test_a_commit_naming_no_transaction_does_not_claim_the_writer_id() -> None:
    h = Harness()
    squatter, job = Session("squatter"), Session("job")
    assert h.broker.commit_txns(squatter, "nightly", 1, [], h.now)["published"] == 0
    assert "nightly" not in h.broker.state.transactions.writers
    h.broker.stage(job, "t", [Send("out/v1/a", b"1")], h.now)
    assert h.broker.commit_txns(job, "nightly", 1, ["t"], h.now)["published"] == 1
    assert h.broker.state.transactions.writers["nightly"] == "job"


def test_a_commit_naming_no_transaction_binds_no_lineage_either() -> None:
    # A lineage bound by an empty commit would refuse the real job's first batch.
    h = Harness()
    squatter, job = Session("squatter"), Session("job")
    h.broker.commit_txns(squatter, "orders-job", 0, [], h.now, lineage="x")
    assert "orders-job" not in h.broker.state.transactions.lineages
    assert not any(k.startswith("writer_lineage:") for k in h.broker.state.batch.meta)
    h.broker.stage(job, "t", [Send("out/v1/a", b"1")], h.now)
    assert h.broker.commit_txns(job, "orders-job", 0, ["t"], h.now,
                                lineage="query-1")["published"] == 1


@pytest.mark.parametrize(("writer", "character"), [
    ("a\x00b", "U+0000"), ("job\u202e", "U+202E"), ("my job", "U+0020"),
    ("line\nbreak", "U+000A"), ("a/b c", "U+0020")])  # ("/" is allowed in a writer id)
def test_a_new_writer_id_must_be_printable_without_spaces(writer: str, character: str
                                                          ) -> None:
    t = Transactions()
    with pytest.raises(BadRequest) as caught:
        t.check_writer("c", writer)
    assert "printable" in caught.value.message
    assert caught.value.detail["character"] == character  # the first one refused


def test_a_new_writer_id_too_long_is_refused_with_the_limit() -> None:
    with pytest.raises(BadRequest) as caught:
        Transactions().check_writer("c", "w" * (MAX_TXN_ID + 1))
    assert caught.value.detail["limit"] == MAX_TXN_ID


def test_one_client_owns_at_most_max_writers_per_client_writer_ids(monkeypatch) -> None:
    import minou.core.transactions as tx

    monkeypatch.setattr(tx, "MAX_WRITERS_PER_CLIENT", 2)
    h = Harness()
    c, other = Session("spark"), Session("other")
    for i, writer in enumerate(["w1", "w2"]):
        h.broker.stage(c, f"t{i}", [Send("out/v1/a", b"1")], h.now)
        h.broker.commit_txns(c, writer, 1, [f"t{i}"], h.now)
    h.broker.stage(c, "t9", [Send("out/v1/a", b"1")], h.now)
    with pytest.raises(QueueFull) as caught:
        h.broker.commit_txns(c, "w3", 1, ["t9"], h.now)
    assert caught.value.detail == {"client": "spark", "limit": 2}
    assert "w3" not in h.broker.state.transactions.writers
    # Its own ids still commit, and the bound is per client.
    assert h.broker.commit_txns(c, "w1", 2, ["t9"], h.now)["published"] == 1
    h.broker.stage(other, "t", [Send("out/v1/a", b"1")], h.now)
    assert h.broker.commit_txns(other, "w3", 1, ["t"], h.now)["published"] == 1


def test_a_commit_is_refused_whole_past_the_bound_of_scheduled_messages(monkeypatch) -> None:
    """Messages with a priority or a delay are held in memory until taken; a commit
    that would pass MAX_SCHEDULED_MESSAGES is refused whole (nothing published), and
    one that fits exactly goes through. A priority of 1 and a delay alone both count."""
    import minou.core.state as state_module

    monkeypatch.setattr(state_module, "MAX_SCHEDULED_MESSAGES", 3)
    h = Harness()
    c = Session("spark")
    h.broker.stage(c, "a", [Send("out/v1/a", js(1), priority=1),
                            Send("out/v1/a", js(2), delay=60.0), Send("out/v1/a", js(3))], h.now)
    h.broker.stage(c, "b", [Send("out/v1/a", js(4), priority=1),
                            Send("out/v1/a", js(5), delay=60.0)], h.now)
    with pytest.raises(QueueFull) as caught:
        h.broker.commit_txns(c, "w", 1, ["a", "b"], h.now)
    assert caught.value.detail == {"limit": 3}
    assert "out/v1/a" not in h.broker.state.channels  # nothing published
    assert h.broker.commit_txns(c, "w", 1, ["a"], h.now)["published"] == 3
    h.commit()
    h.broker.stage(c, "c", [Send("out/v1/a", js(6), priority=1)], h.now)
    assert h.broker.commit_txns(c, "w", 2, ["c"], h.now)["published"] == 1  # 3: exactly
    h.commit()
    h.broker.stage(c, "d", [Send("out/v1/a", js(7), delay=1.0)], h.now)
    with pytest.raises(QueueFull):
        h.broker.commit_txns(c, "w", 3, ["d"], h.now)
    h.broker.stage(c, "e", [Send("out/v1/a", js(8)), Send("out/v1/a", js(9), priority=0)],
                   h.now)
    assert h.broker.commit_txns(c, "w", 3, ["e"], h.now)["published"] == 2  # plain: room


def _federation_page(n: int) -> list[Send]:
    """A page a federation link stages: its messages carry their key and the two
    headers the link adds (where they come from, their source channel and seq)."""
    return [Send(f"fed-orders/v1/{n % 4}", b"x" * 100, True,
                 {FEDERATED_FROM: "remote-broker",
                  FEDERATED_SEQ: f"orders/v1/{n % 4}:{n * 10 + i}"},
                 key=f"k{i}") for i in range(10)]


@pytest.mark.parametrize(("shape", "page"), [
    ("a federation page", _federation_page),
    ("one empty message", lambda n: [Send("a/v1/1", b"", True)]),
    ("10 of 100 B, empty headers", lambda n: [Send(f"bench/v1/{n % 4}", b"x" * 100, True, {})
                                             for _ in range(10)]),
    ("wide characters", lambda n: [Send("a/v1/1", b"", True, {"é" * 3: "\U0001F600" * 20}, 0,
                                        1.5, 2.5, "d" * 40, "k" * 40, 100_000)]),
])
def test_what_staged_pages_hold_is_counted_in_full(shape, page) -> None:
    """Pages a dropped connection (a federation link's) leaves staged are held until
    aborted or expired, bounded by what is counted (MAX_STAGED_BYTES_PER_CLIENT): the
    count must be at least the memory they hold. They are decoded from STAGE frames
    as a connection decodes them; what the decoded objects and the bookkeeping hold is
    traced. The old count (payload, names, 8 B a header, 200 B a message, nothing a
    transaction) was 56% of a federation page's 7.1 KB, 39% of a one-message page's."""
    import gc
    import tracemalloc

    from minou.protocol import frames as fr
    from minou.protocol.reader import FrameReader

    pages = 300
    frames = [fr.encode(fr.Stage(n + 1, f"fed:probe:push:orders/v1/{n % 4}:{n}:0a1b2c3d",
                                 page(n))) for n in range(pages)]
    t = Transactions()
    gc.collect()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        reader = FrameReader()
        for data in frames:
            reader.receive_data(data)
            frame = reader.next_event()
            assert isinstance(frame, fr.Stage)
            t.stage("bridge", frame.txn, list(frame.msgs), 0.0)
        del reader, frame
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    assert t.bytes >= held, f"{shape}: {held / pages:.0f} B a page held, " \
                            f"{t.bytes / pages:.0f} counted"
    assert t.bytes <= 1.5 * held, f"{shape}: counted {t.bytes / held:.2f}x what is held"


def test_a_broker_names_the_transactions_it_holds_staged_or_lately_committed() -> None:
    """A front asks every broker which of a commit's transactions it holds (queues
    spread over brokers: each part is staged on its queue's owner)."""
    h = Harness()
    c, other = Session("spark"), Session("other")
    h.broker.stage(c, "t1", [Send("out/v1/a", js(1))], h.now)
    h.broker.stage(c, "t2", [Send("out/v1/a", js(2))], h.now)
    h.broker.stage(other, "t3", [Send("out/v1/a", js(3))], h.now)
    h.broker.commit_txns(c, "w", 0, ["t1"], h.now)
    h.commit()
    asked = ["t3", "t2", "nothing", "t1"]
    assert h.broker.txns_present(c, asked) == ["t2", "t1"]  # in the order asked
    assert h.broker.txns_present(other, asked) == ["t3"]
    assert h.broker.txns_present(Session("nobody"), asked) == []
    h.broker.abort_txns(c, ["t2"])
    assert h.broker.txns_present(c, asked) == ["t1"]

