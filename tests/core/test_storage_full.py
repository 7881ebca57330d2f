"""A commit that fails (a full disk) wrote nothing: what the core believes afterwards.

Its publishes are dropped (their seqs become gaps, their publishers are told, their
dedup keys and fences undone); everything else the core holds in memory (acks, group
states, dead letters) is carried into the next commit. Nothing is confirmed that was
not written, nothing confirmed is lost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.core.writes import WriteBatch
from minou.errors import ErrorCode, RequestError, StorageFull
from minou.limits import STAGED_TTL_S
from minou.storage.sqlite import SQLiteStorage

from .helpers import Harness, payloads, send, seqs

CH = "orders/v1/1"
FULL = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)
_opened: list[SQLiteStorage] = []


@pytest.fixture(autouse=True)
def _close_storages() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _storage(path: Path, **kw: object) -> SQLiteStorage:
    st = SQLiteStorage(path, **kw)  # type: ignore[arg-type]
    _opened.append(st)
    st.open(0.0)
    return st


def fail(h: Harness, error: RequestError = FULL) -> WriteBatch:
    """A commit that wrote nothing: take the pending batch, report its failure."""
    batch = h.broker.take_writes()
    h.broker.on_failed(batch, error)
    return batch


def restart(h: Harness, path: Path) -> Harness:
    assert h.storage is not None
    h.storage.close()
    st = SQLiteStorage(path)
    _opened.append(st)
    broker = Broker()
    broker.restore(st.open(h.now + 1), h.now + 1)
    return Harness(broker=broker, storage=st, now=h.now + 1)


def test_publishes_of_a_failed_commit_are_dropped_told_and_never_visible() -> None:
    h = Harness()
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    told: list[object] = []
    h.broker.publish([send(CH, 3), send(CH, 4)], h.now)
    h.broker.after_commit(lambda: told.append("confirmed"), told.append)
    fail(h)
    assert told == [FULL]
    log = h.broker.channels[CH]
    assert (log.end, log.next_seq, log.inflight, log.count) == (3, 5, 0, 2)
    assert h.broker.counters.published == 2
    (o,) = h.publish_values(CH, [5])
    assert o.seq == 5  # the dropped seqs are gaps, never given again
    assert payloads(h.take(sub)) == [1, 2, 5]
    assert not h.broker.batch  # nothing of the failed batch is left to write


def test_publishes_staged_during_the_failed_commit_go_with_the_next_one() -> None:
    h = Harness()
    sub = h.subscribe(Session("a"), patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1])
    h.broker.publish([send(CH, 2)], h.now)
    failing = h.broker.take_writes()  # being written...
    h.broker.publish([send(CH, 3)], h.now)  # ...while this one arrives
    h.broker.on_failed(failing, FULL)
    h.commit()
    got = h.take(sub)
    assert (seqs(got), payloads(got)) == ([1, 3], [1, 3])  # 2 is a gap


def test_the_dedup_key_of_a_dropped_publish_is_forgotten() -> None:
    h = Harness()
    h.broker.publish([send(CH, "a", dedup="k")], h.now)
    fail(h)
    (again,) = h.publish(send(CH, "a", dedup="k"))
    assert not again.duplicate and again.seq == 2
    (dup,) = h.publish(send(CH, "a", dedup="k"))
    assert dup.duplicate and dup.seq == 2


def test_an_ack_in_a_failed_commit_is_not_confirmed_and_is_written_with_the_next(
    tmp_path: Path,
) -> None:
    h = Harness(storage=_storage(tmp_path))
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    got = h.take(sub)
    h.ack(a, got[:1])
    acked: list[object] = []
    waiting: list[str] = []
    h.broker.after_commit(lambda: acked.append(True), acked.append)  # an ack's reply
    h.broker.after_commit(lambda: waiting.append("subscribed"))  # no failure handler
    fail(h)
    assert acked == [FULL] and waiting == []  # "not durable"; the other waits
    h.commit()  # the next commit carries the ack's state
    assert acked == [FULL] and waiting == ["subscribed"]
    h2 = restart(h, tmp_path)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert seqs(h2.take(sub2)) == [2]  # the ack is durable: 1 does not come back


def test_an_ack_never_written_comes_back_after_a_crash(tmp_path: Path) -> None:
    h = Harness(storage=_storage(tmp_path))
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=10)
    h.publish_values(CH, [1, 2])
    h.ack(a, h.take(sub))
    fail(h)
    h2 = restart(h, tmp_path)  # a crash before any commit made the acks durable
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert payloads(h2.take(sub2)) == [1, 2]


def test_dead_letters_of_a_failed_commit_are_carried_not_lost(tmp_path: Path) -> None:
    h = Harness(storage=_storage(tmp_path),
                broker=Broker(channel_options=lambda key: ChannelOptions(requeue_limit=0)))
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g")
    h.publish_values(CH, ["poison"])
    h.nack(a, h.take(sub))  # over the limit: moved to _dead/ in the pending batch
    fail(h)
    h.commit()
    h2 = restart(h, tmp_path)
    reader = h2.subscribe(Session("ops"), patterns="_dead/" + CH, group="ops")
    assert payloads(h2.take(reader)) == ["poison"]
    plain = h2.subscribe(Session("c"), patterns=CH, group="g")
    assert h2.take(plain) == []  # moved, not copied


def test_a_failed_transaction_commit_moves_no_fence() -> None:
    h = Harness()
    w = Session("writer")
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(w, "job", 1, ["t1"], h.now)["published"] == 1
    fail(h)
    assert h.broker.transactions.fences == {}
    # The replayed batch is published, not discarded as already seen.
    h.broker.stage(w, "t2", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(w, "job", 1, ["t2"], h.now)["published"] == 1
    h.commit()
    assert h.broker.transactions.fences == {("job", CH): 1}


def test_fences_of_two_failed_commits_in_a_row_go_back_to_the_durable_one() -> None:
    h = Harness()
    w = Session("writer")
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)
    h.broker.commit_txns(w, "job", 1, ["t1"], h.now)
    h.commit()
    h.broker.stage(w, "t2", [send(CH, 2)], h.now)
    h.broker.commit_txns(w, "job", 2, ["t2"], h.now)
    failing = h.broker.take_writes()
    h.broker.stage(w, "t3", [send(CH, 3)], h.now)
    h.broker.commit_txns(w, "job", 3, ["t3"], h.now)  # while batch 2 is being written
    h.broker.on_failed(failing, FULL)
    assert h.broker.transactions.fences == {("job", CH): 3}
    fail(h)  # batch 3 fails too: back to 1, the last one written
    assert h.broker.transactions.fences == {("job", CH): 1}


def test_while_storage_is_full_publishes_and_commits_are_refused_at_the_door() -> None:
    h = Harness()
    h.broker.storage_refusal = FULL
    outcomes, staged = h.broker.publish([send(CH, 1), send("orders/v1/*", 2)], h.now)
    assert staged == [] and not h.broker.batch
    assert [(o.code, o.error) for o in outcomes] == [(int(ErrorCode.STORAGE_FULL),
                                                      FULL.message)] * 2
    assert h.broker.counters.as_dict()["refused"]["storage_full"] == 2
    w = Session("writer")
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)  # staging is memory only: allowed
    with pytest.raises(StorageFull):
        h.broker.commit_txns(w, "job", 1, ["t1"], h.now)
    h.broker.storage_refusal = None
    assert h.broker.commit_txns(w, "job", 1, ["t1"], h.now)["published"] == 1


def test_a_real_quota_end_to_end_confirms_only_what_is_stored(tmp_path: Path) -> None:
    """The core over a SQLiteStorage with max_size: fill it, fail, free, go on, restart."""
    st = _storage(tmp_path, max_size=1 << 20, reserve=128 << 10)
    h = Harness(storage=st)
    a = Session("a")
    sub = h.subscribe(a, patterns=CH, group="g", prefetch=1000)
    confirmed: list[int] = []
    refused = 0
    for i in range(200):
        outcomes, _ = h.broker.publish([send(CH, "x" * 20_000, dedup=f"d{i}")], h.now)
        batch = h.broker.take_writes()
        try:
            st.apply(batch)
        except StorageFull as exc:
            h.broker.on_failed(batch, exc)
            refused += 1
            break
        h.broker.on_committed(batch, h.now)
        confirmed += [o.seq for o in outcomes]
    assert refused == 1 and confirmed
    got = h.take(sub)
    assert seqs(got) == confirmed  # what is stored is delivered, nothing else
    h.ack(a, got)
    h.commit()  # acks fit in the reserve; the whole channel is settled and truncated
    assert st.probe()[0] is True
    (o,) = h.publish(send(CH, "after", dedup=f"d{len(confirmed)}"))
    assert o.seq == confirmed[-1] + 2 and not o.duplicate  # one seq went with the failure
    h2 = restart(h, tmp_path)
    sub2 = h2.subscribe(Session("b"), patterns=CH, group="g", prefetch=10)
    assert payloads(h2.take(sub2)) == ["after"]


def test_drop_oldest_past_a_failed_seq_drops_a_message_in_flight() -> None:
    # Regression: expiring seq 1 moved first_seq past the gap seq 2's failed commit
    # left (end stayed 2), and the overflow then "dropped" that never-stored seq 2
    # instead of a message in flight: four stored, inflight -1.
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=3, overflow="drop_oldest"))
    h.publish(send(CH, 1, ttl=1.0))
    h.broker.publish([send(CH, 2)], h.now)
    fail(h)
    h.advance(2.0)
    assert h.broker.expire([(CH, 1)], h.now) == 1  # storage's TTL scan found it
    h.commit()
    log = h.broker.channels[CH]
    assert (log.count, log.first_seq) == (0, 3)
    h.broker.publish([send(CH, v) for v in (3, 4, 5, 6)], h.now)
    batch = h.commit()
    assert (CH, 3) in batch.deletes
    assert (log.count, log.inflight) == (3, 0)
    sub = h.subscribe(Session("a"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == [4, 5, 6]
    assert h.storage.open(h.now).channels[0].count == 3


def test_a_message_the_overflow_dropped_before_a_failed_commit_is_not_given_back_twice(
) -> None:
    """drop_oldest dropped a message still in flight; the commit holding them all then
    failed: the room each took is given back once, so the channel's bound holds after."""
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2, overflow="drop_oldest"))
    h.broker.publish([send(CH, v) for v in (1, 2, 3)], h.now)  # 3 drops 1, in flight
    fail(h)
    log = h.broker.channels[CH]
    assert (log.count, log.inflight) == (0, 0)
    h.publish(*(send(CH, v) for v in (4, 5, 6)))
    assert (log.count, log.inflight) == (2, 0)
    sub = h.subscribe(Session("a"), patterns=CH, group="g", prefetch=10)
    assert payloads(h.take(sub)) == [5, 6]


def test_the_first_publish_of_a_channel_lost_to_a_full_disk_leaves_room_for_a_resend() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    (o,) = h.publish(send(CH, 1), commit=False)
    assert o.seq == 1
    fail(h)
    (again,) = h.publish(send(CH, 1))
    assert (again.code, again.seq) == (0, 2)
    assert h.broker.channels[CH].count == 1


def test_every_failure_handler_runs_and_the_first_ones_error_is_raised() -> None:
    h = Harness()
    h.publish(send(CH, 1), commit=False)
    told: list[tuple[str, RequestError]] = []

    def handler(name: str):
        def failed(error: RequestError) -> None:
            told.append((name, error))
            raise RuntimeError(name)
        return failed

    h.broker.after_commit(lambda: None, handler("a"))
    h.broker.after_commit(lambda: None, handler("b"))
    batch = h.broker.take_writes()
    with pytest.raises(RuntimeError, match=r"^a$"):
        h.broker.on_failed(batch, FULL)
    assert told == [("a", FULL), ("b", FULL)]


def test_a_transaction_commit_failing_after_its_answer_expired_is_dropped_all_the_same(
) -> None:
    """The write outlived the answer's time to live (a stalled disk): the failure still
    drops the publish, and a replay is published."""
    h = Harness()
    w = Session("writer")
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)
    h.broker.commit_txns(w, "job", 1, ["t1"], h.now)
    batch = h.broker.take_writes()
    h.advance(STAGED_TTL_S + 1)
    h.broker.expire_txns(h.now)
    h.broker.on_failed(batch, FULL)
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(w, "job", 1, ["t1"], h.now)["published"] == 1


def test_fences_dropped_by_an_admin_while_their_commit_is_written_stay_dropped() -> None:
    h = Harness()
    w = Session("writer")
    h.broker.stage(w, "t1", [send(CH, 1)], h.now)
    h.broker.commit_txns(w, "job", 1, ["t1"], h.now)
    batch = h.broker.take_writes()
    h.broker.release_writer("job", drop_fences=True)
    h.broker.on_failed(batch, FULL)
    assert h.broker.transactions.fences == {}
    h.broker.stage(w, "t2", [send(CH, 1)], h.now)
    assert h.broker.commit_txns(w, "job", 1, ["t2"], h.now)["published"] == 1


def test_an_explicit_stream_id_whose_commit_failed_may_be_given_again(tmp_path: Path) -> None:
    """An XADD with the client's id (core/stream_ids.py) that was never stored: its
    retry is not refused as "equal or smaller than the top", and no row of it stays."""
    from minou.core.stream_ids import ID_HEADER, StreamIds, point_key

    h = Harness(storage=_storage(tmp_path))
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}),
              send("orders/v1/9", 0, headers={ID_HEADER: "7-0"}), resp_door=True)
    held = StreamIds.held  # every stream's points count against one bound
    h.publish(send(CH, 2, headers={ID_HEADER: "200-0"}), send(CH, 3), commit=False,
              resp_door=True)
    assert StreamIds.held == held + 1
    failed = fail(h)
    assert StreamIds.held == held
    assert failed.meta == {point_key(CH, 2): "200-0"}
    ids = h.broker.channels[CH].stream_ids
    assert ids is not None and list(ids.seqs) == [1]
    (again,) = h.publish(send(CH, 2, headers={ID_HEADER: "200-0"}), resp_door=True)
    assert again.code == 0 and ids.text(again.seq) == b"200-0"
    h2 = restart(h, tmp_path)
    ids2 = h2.broker.channels[CH].stream_ids
    assert ids2 is not None and list(ids2.seqs) == [1, again.seq]
    assert [ids2.text(s) for s in (1, again.seq)] == [b"100-0", b"200-0"]


def test_a_failed_id_stays_used_when_a_later_publish_was_numbered_from_it(
        tmp_path: Path) -> None:
    """Removing the failed point would renumber what came after it (a later XADD was
    answered by it or checked against it): it stays, and is written with the next
    commit."""
    from minou.core.stream_ids import ID_HEADER, point_key

    h = Harness(storage=_storage(tmp_path))
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}), commit=False, resp_door=True)
    batch = h.broker.take_writes()  # in flight
    h.publish(send(CH, 2, headers={ID_HEADER: "100-1"}), commit=False, resp_door=True)
    h.broker.on_failed(batch, FULL)
    ids = h.broker.channels[CH].stream_ids
    assert ids is not None and ids.text(2) == b"100-1"
    assert h.broker.state.batch.meta[point_key(CH, 1)] == "100-0"
    h.commit()
    h2 = restart(h, tmp_path)
    assert h2.broker.channels[CH].stream_ids.text(2) == b"100-1"


def test_a_failed_id_stays_when_the_commit_may_have_been_written(tmp_path: Path) -> None:
    """Only a full disk says nothing was written; an unavailable storage may have
    written it (Redis: the connection lost in the middle): the id stays used."""
    from minou.core.stream_ids import ID_HEADER
    from minou.errors import StorageUnavailable

    h = Harness(storage=_storage(tmp_path))
    h.publish(send(CH, 1, headers={ID_HEADER: "100-0"}), commit=False, resp_door=True)
    fail(h, StorageUnavailable("lost in the middle"))
    ids = h.broker.channels[CH].stream_ids
    assert ids is not None and list(ids.seqs) == [1]


def test_every_failed_id_of_every_channel_may_be_given_again(tmp_path: Path) -> None:
    from minou.core.stream_ids import ID_HEADER, point_key

    other = "orders/v1/2"
    h = Harness(storage=_storage(tmp_path))
    h.publish(send(other, 0, headers={ID_HEADER: "5-0"}), resp_door=True)  # stored
    # (a channel without ids first: looking at it must not end the look at the others)
    h.publish(send("orders/v1/3", 9), send(CH, 1, headers={ID_HEADER: "100-0"}),
              send(CH, 2, headers={ID_HEADER: "200-0"}),
              send(other, 3, headers={ID_HEADER: "50-0"}), commit=False, resp_door=True)
    fail(h)
    assert h.broker.channels[CH].stream_ids is not None
    assert list(h.broker.channels[CH].stream_ids.seqs) == []
    assert list(h.broker.channels[other].stream_ids.seqs) == [1]
    meta = h.broker.state.batch.meta
    assert meta[point_key(CH, 1)] is None and meta[point_key(CH, 2)] is None
    assert meta[point_key(other, 2)] is None
