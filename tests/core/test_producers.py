"""Idempotent producers in the core: a sequence handled before is answered as it was,
a skipped sequence is refused, refusals and failed commits are remembered, and the
state survives a restart through real SQLite storage."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.core.producers import Producers, ProducerState
from minou.errors import ErrorCode, StorageFull
from minou.protocol.frames import Send
from minou.storage.sqlite import SQLiteStorage

from .helpers import T0, Harness, js

CH = "orders/v1/1"
FULL = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)


def producer(client: str = "app", pid: str = "00000000000000aa") -> Session:
    return Session(client, producer_id=pid)


def numbered(channel: str, pseq: int, value: object = None, **kw: object) -> Send:
    return Send(channel, js(value if value is not None else pseq), pseq=pseq, **kw)


def with_row(state: ProducerState) -> ProducerState:
    """A state as storage knows it: loaded, or written with a message (a state only
    ever refused has no row, and none is deleted when it goes)."""
    state.written = True
    return state


def publish(h: Harness, session: Session, *sends: Send, commit: bool = True):
    outcomes, _ = h.broker.publish(sends, h.now, session=session)
    if commit:
        h.commit()
    return outcomes


def test_a_resend_is_answered_with_the_original_seq_and_id_and_stored_once() -> None:
    h = Harness()
    p = producer()
    first = publish(h, p, *(numbered(CH, i) for i in range(1, 6)))
    again = publish(h, p, *(numbered(CH, i) for i in range(3, 8)))
    assert [o.duplicate for o in again] == [True, True, True, False, False]
    assert [(o.seq, o.id) for o in again[:3]] == [(o.seq, o.id) for o in first[2:]]
    assert h.broker.channels[CH].count == 7
    assert h.broker.counters.duplicates == 3


def test_a_skipped_sequence_is_refused_with_what_was_expected_and_nothing_moves() -> None:
    h = Harness()
    p = producer()
    publish(h, p, numbered(CH, 1), numbered(CH, 2))
    gap = publish(h, p, numbered(CH, 5))[0]
    assert gap.code == ErrorCode.OUT_OF_SEQUENCE
    assert "expected 3, got 5" in gap.error and "3..4 never reached" in gap.error
    assert publish(h, p, numbered(CH, 3))[0].code == 0  # the expected one still goes
    assert h.broker.channels[CH].count == 3
    assert h.broker.counters.refused["out_of_sequence"] == 1


def test_a_sequence_that_is_not_positive_is_refused() -> None:
    h = Harness()
    out = publish(h, producer(), numbered(CH, 1), Send(CH, js(1), pseq=-3))
    assert out[0].code == 0
    assert out[1].code == ErrorCode.OUT_OF_SEQUENCE


def test_sequences_are_per_channel_and_per_producer_and_per_client() -> None:
    h = Harness()
    a1, a2, b = producer("a", "00000000000000a1"), producer("a", "00000000000000a2"), \
        producer("b", "00000000000000a1")
    publish(h, a1, numbered(CH, 1), numbered("orders/v1/2", 1))
    # Another producer id of the same client, and another client presenting a1's id:
    # fresh states, never answered from a1's.
    for session in (a2, b):
        out = publish(h, session, numbered(CH, 1))
        assert out[0].duplicate is False and out[0].seq
    assert h.broker.channels[CH].count == 3


def test_a_refused_sequence_gets_the_same_refusal_when_sent_again() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    p = producer()
    assert publish(h, p, numbered(CH, 1))[0].code == 0
    full = publish(h, p, numbered(CH, 2))[0]
    assert full.code == ErrorCode.QUEUE_FULL
    again = publish(h, p, numbered(CH, 2))[0]
    assert (again.code, again.error) == (full.code, full.error)
    assert publish(h, p, numbered(CH, 3))[0].code == ErrorCode.QUEUE_FULL  # no gap


def test_a_replay_waits_for_the_commit_and_a_failed_commit_turns_it_into_the_error() -> None:
    h = Harness()
    p = producer()
    publish(h, p, numbered(CH, 1), numbered(CH, 2), commit=False)
    failing = h.broker.take_writes()
    # The client reconnected and sends both again before the commit is known.
    again = publish(h, p, numbered(CH, 1), numbered(CH, 2), commit=False)
    assert all(o.duplicate for o in again)
    replays = list(h.broker.replays)
    h.broker.on_failed(failing, FULL)
    answers = [state.replay(pseq, CH) for _, state, pseq in replays]
    assert [a.code for a in answers] == [ErrorCode.STORAGE_FULL] * 2
    assert not any(a.duplicate for a in answers)
    # The next sequence goes on (no gap), and is stored.
    assert publish(h, p, numbered(CH, 3))[0].code == 0
    assert h.broker.channels[CH].count == 1


def test_broadcast_and_single_channels_number_alike() -> None:
    h = Harness()
    reader = Session("reader")
    for i in (1, 2):
        h.subscribe(reader, i, patterns=f"orders/v1/{i}", kind="listen")
    p = producer()
    first = publish(h, p, numbered("orders/v1/*", 1))[0]
    assert first.fanout == 2
    again = publish(h, p, numbered("orders/v1/*", 1))[0]
    assert again.duplicate and (again.seq, again.id) == (first.seq, first.id)
    assert sum(log.count for log in h.broker.channels.values()) == 2


def test_a_session_without_a_producer_id_is_never_numbered() -> None:
    h = Harness()
    out = publish(h, Session("legacy"), numbered(CH, 1), numbered(CH, 1))
    assert [o.duplicate for o in out] == [False, False]
    assert len(h.broker.producers) == 0


def test_a_sequence_without_a_session_is_ignored_even_on_an_early_duplicate() -> None:
    """A publish with no session (no producer) is unnumbered: its sequence plays no part,
    also when its dedup key names a message not committed yet."""
    h = Harness()
    h.broker.publish([numbered(CH, 1, dedup="k")], h.now)
    (dup,), _ = h.broker.publish([numbered(CH, 7, dedup="k")], h.now)
    assert (dup.code, dup.duplicate, dup.seq) == (0, True, 1)
    h.commit()
    assert len(h.broker.producers) == 0


def test_the_state_is_stored_with_the_messages_and_survives_a_restart(tmp_path: Path) -> None:
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(T0)
    h = Harness(storage=st)
    p = producer()
    first = publish(h, p, *(numbered(CH, i) for i in range(1, 4)))
    refused = publish(h, p, Send(CH, b"{not json", pseq=4))[0]
    assert refused.code == ErrorCode.INVALID_PAYLOAD
    st.close()
    st = SQLiteStorage(tmp_path / "m.db")
    broker = Broker()
    broker.restore(st.open(T0 + 10), T0 + 10)
    h2 = Harness(storage=st, broker=broker, now=T0 + 10)
    again = publish(h2, p, *(numbered(CH, i) for i in range(2, 6)))
    assert [o.duplicate for o in again[:2]] == [True, True]
    assert [o.seq for o in again[:2]] == [first[1].seq, first[2].seq]
    assert (again[2].code, again[2].error) == (refused.code, refused.error)
    assert again[3].code == 0 and not again[3].duplicate
    assert broker.channels[CH].count == 4
    st.close()


def test_states_are_bounded_least_recently_used_first_and_expire_when_idle() -> None:
    prods = Producers(max_states=10, idle=100.0)
    states = [with_row(prods.state(("c", f"{i:016x}", CH), float(i))) for i in range(11)]
    assert len(prods) <= 10 and prods.evicted >= 1
    assert states[0].evicted and not states[10].evicted
    assert ("c", f"{0:016x}", CH) in prods.take()  # its row is deleted
    # A producer that was evicted while alive is brought back with what it knew.
    states[0].last = 7
    back = prods.state(states[0].key, 20.0, states[0])
    assert back is states[0] and back.last == 7 and not back.evicted
    alive = len(prods)
    assert prods.expire(500.0) == alive
    assert len(prods) == 0


@pytest.mark.parametrize("pseqs, expected", [
    ([1, 2, 3], (1, 3)),  # one run
    ([5], (5, 5)),  # a fresh producer may start anywhere
])
def test_runs_of_consecutive_seqs_are_one_record(pseqs: list[int], expected) -> None:
    state = ProducerState(("c", "p", CH))
    for i, pseq in enumerate(pseqs):
        state.stored(pseq, 10 + i, f"{'ab' * 8}{10 + i:x}")
    assert (state.run_pseq, state.run_last) == expected
    assert state.replay(pseqs[-1], CH).seq == 10 + len(pseqs) - 1


# ------------------------------------------------ sequences, windows, answers
def test_skipping_a_single_sequence_is_refused_too() -> None:
    h = Harness()
    p = producer()
    publish(h, p, numbered(CH, 1), numbered(CH, 2))
    (gap,) = publish(h, p, numbered(CH, 4))
    assert (gap.code, gap.seq, gap.channel) == (ErrorCode.OUT_OF_SEQUENCE, 0, CH)
    assert gap.error
    assert h.broker.channels[CH].count == 2


@pytest.mark.parametrize("first", [1, 2, 7, 1000])
def test_a_new_producer_may_start_at_any_sequence_then_goes_on_by_one(first: int) -> None:
    h = Harness()
    p = producer()
    out = publish(h, p, numbered(CH, first), numbered(CH, first + 1))
    assert [o.code for o in out] == [0, 0] and [o.seq for o in out] == [1, 2]
    assert publish(h, p, numbered(CH, first + 3))[0].code == ErrorCode.OUT_OF_SEQUENCE


def test_a_sequence_that_is_not_positive_is_refused_with_a_message() -> None:
    h = Harness()
    (o,) = publish(h, producer(), Send(CH, js(1), pseq=-1))
    assert (o.code, o.channel) == (ErrorCode.OUT_OF_SEQUENCE, CH) and o.error
    assert CH not in h.broker.channels
    # Not remembered: the producer still starts where it likes.
    assert publish(h, producer(), numbered(CH, 3))[0].code == 0


def test_a_sequence_past_64_bits_is_refused_and_the_commit_goes_on() -> None:
    """A pseq over 2**63 - 1 (msgpack carries up to 2**64 - 1) reached the producers'
    table, and SQLite refused the whole commit: the broker stopped (found by the
    fuzzer). Refused alone, precisely; nothing of it is remembered."""
    h = Harness()
    p = producer()
    out = publish(h, p, numbered(CH, 1), Send(CH, js(1), pseq=2**64 - 1), numbered(CH, 2))
    assert [o.code for o in out] == [0, ErrorCode.BAD_REQUEST, 0]
    assert "a producer sequence (pseq) is 1..9223372036854775807" in out[1].error
    assert max(s.last for s in h.broker.state.producers.states.values()) == 2


def test_replayed_answers_name_their_channel() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=2))
    p = producer()
    publish(h, p, numbered(CH, 1), numbered(CH, 2), numbered(CH, 3))
    again = publish(h, p, numbered(CH, 2), numbered(CH, 3))
    assert [(o.channel, o.duplicate, o.code) for o in again] == [
        (CH, True, 0), (CH, False, ErrorCode.QUEUE_FULL)]


def test_a_resend_of_a_numbered_broadcast_that_reached_nobody_is_a_duplicate_without_a_seq(
        tmp_path: Path) -> None:
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(T0)
    h = Harness(storage=st)
    p = producer()
    (first,) = publish(h, p, numbered("orders/v1/*", 1))
    assert (first.code, first.fanout, first.seq) == (0, 0, 0)
    (again,) = publish(h, p, numbered("orders/v1/*", 1))
    assert (again.duplicate, again.seq, again.id, again.channel) == (True, 0, "", "orders/v1/*")
    (nxt,) = publish(h, p, numbered(CH, 2))  # the next goes on, on a channel
    assert (nxt.code, nxt.seq) == (0, 1)
    (dup,) = publish(h, p, numbered(CH, 2))
    assert (dup.duplicate, dup.seq, dup.id) == (True, 1, nxt.id)
    st.close()


def test_a_failed_commit_of_the_end_of_a_run_keeps_the_answers_of_its_start() -> None:
    """Sequences 1..3 stored, 4..5 in a commit that fails: a resend of 1..3 is answered
    with their seqs and ids, of 4..5 with the failure, and 6 goes on."""
    h = Harness()
    p = producer()
    stored = publish(h, p, *(numbered(CH, i) for i in (1, 2, 3)))
    publish(h, p, numbered(CH, 4), numbered(CH, 5), commit=False)
    h.broker.on_failed(h.broker.take_writes(), FULL)
    again = publish(h, p, *(numbered(CH, i) for i in (1, 2, 3, 4, 5)))
    assert [(o.seq, o.id) for o in again[:3]] == [(o.seq, o.id) for o in stored]
    assert all(o.duplicate for o in again[:3])
    assert [o.code for o in again[3:]] == [ErrorCode.STORAGE_FULL] * 2
    (nxt,) = publish(h, p, numbered(CH, 6))
    assert nxt.code == 0 and not nxt.duplicate


def test_a_failed_commit_of_a_whole_run_turns_every_resend_into_the_error() -> None:
    h = Harness()
    p = producer()
    publish(h, p, *(numbered(CH, i) for i in (1, 2, 3)), commit=False)
    h.broker.on_failed(h.broker.take_writes(), FULL)
    again = publish(h, p, *(numbered(CH, i) for i in (1, 2, 3)))
    assert [(o.code, o.duplicate, o.seq) for o in again] == [
        (ErrorCode.STORAGE_FULL, False, 0)] * 3
    (nxt,) = publish(h, p, numbered(CH, 4))
    assert (nxt.code, nxt.seq) == (0, 4)
    assert publish(h, p, numbered(CH, 4))[0].seq == 4  # a new run, answered by its seq


def test_consecutive_refusals_of_one_kind_are_remembered_as_one_range() -> None:
    """A refused sequence is answered the same when sent again; runs of one refusal
    merge, so many refusals in a row do not push older ones out of the window."""
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    p = producer()
    publish(h, p, numbered(CH, 1))
    refusals = publish(h, p, *(numbered(CH, i) for i in range(2, 30)))
    assert {o.code for o in refusals} == {ErrorCode.QUEUE_FULL}
    (bad,) = publish(h, p, Send(CH, b"{bad", pseq=30))  # another refusal after them
    again = publish(h, p, *(numbered(CH, i) for i in (1, 2, 17, 29, 30)))
    assert again[0].duplicate and again[0].seq == 1
    assert [o.code for o in again[1:4]] == [ErrorCode.QUEUE_FULL] * 3
    assert [o.error for o in again[1:4]] == [refusals[0].error] * 3
    assert (again[4].code, again[4].error) == (bad.code, bad.error)


def test_refusals_of_different_kinds_are_kept_apart() -> None:
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=1))
    p = producer()
    publish(h, p, numbered(CH, 1))
    out = publish(h, p, numbered(CH, 2), Send(CH, b"{bad", pseq=3), numbered(CH, 4),
                  Send(CH, b"{bad", pseq=5))
    again = publish(h, p, *(numbered(CH, i) for i in (2, 3, 4, 5)))
    assert [(o.code, o.error) for o in again] == [(o.code, o.error) for o in out]


def test_a_numbered_refusal_is_stored_for_a_resend_after_a_restart(tmp_path: Path) -> None:
    st = SQLiteStorage(tmp_path / "m.db")
    st.open(T0)
    h = Harness(storage=st)
    p = producer()
    publish(h, p, numbered(CH, 1))
    (bad,) = publish(h, p, Send(CH, b"{bad", pseq=2))
    st.close()
    st = SQLiteStorage(tmp_path / "m.db")
    broker = Broker()
    broker.restore(st.open(T0 + 1), T0 + 1)
    h2 = Harness(storage=st, broker=broker, now=T0 + 1)
    (again,) = publish(h2, p, Send(CH, b"{bad", pseq=2))
    assert (again.code, again.error) == (bad.code, bad.error)
    st.close()


@settings(derandomize=True, max_examples=30, deadline=None)
@given(cap=st.integers(1, 40))
def test_past_max_states_a_tenth_of_the_least_recently_used_go_counted(cap: int) -> None:
    prods = Producers(max_states=cap, idle=1e9)
    states = [with_row(prods.state(("c", f"{i:016x}", CH), float(i))) for i in range(cap)]
    assert len(prods) == cap and prods.evicted == 0
    prods.state(("c", "new", CH), float(cap))
    gone = max(1, 1 + cap // 10)  # the one over, and a tenth more at once
    assert prods.evicted == gone and len(prods) == cap + 1 - gone
    assert [s.evicted for s in states] == [True] * gone + [False] * (cap - gone)
    assert prods.take() == {s.key: None for s in states[:gone]}  # their rows go
    for i in range(cap):  # every state that went is counted
        prods.state(("c", f"more-{i}", CH), float(cap + 1 + i))
        assert prods.evicted == cap + 2 + i - len(prods) and len(prods) <= cap


def test_a_state_used_again_is_kept_over_older_ones() -> None:
    prods = Producers(max_states=3, idle=1e9)
    a, b, c = (prods.state(("c", x, CH), t) for x, t in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    prods.state(a.key, 4.0)  # a is used again: b is now the least recently used
    prods.state(("c", "d", CH), 5.0)
    assert (a.evicted, b.evicted, c.evicted) == (False, True, False)


def test_idle_states_expire_after_their_idle_time() -> None:
    prods = Producers(max_states=10, idle=100.0)
    old = with_row(prods.state(("c", "a", CH), 0.0))
    young = prods.state(("c", "b", CH), 50.0)
    assert prods.expire(100.0) == 0  # exactly idle: kept
    assert prods.expire(100.5) == 1 and old.evicted and not young.evicted
    assert prods.take() == {old.key: None}


def test_a_state_brought_back_keeps_its_row_and_the_others_still_go() -> None:
    prods = Producers(max_states=2, idle=1e9)
    a = with_row(prods.state(("c", "a", CH), 1.0))
    b = with_row(prods.state(("c", "b", CH), 2.0))
    prods.state(("c", "x", CH), 3.0)  # a goes
    prods.state(("c", "y", CH), 4.0)  # b goes
    assert a.evicted and b.evicted
    prods.state(a.key, 5.0, a)  # its producer is still connected
    assert not a.evicted
    assert {k for k, row in prods.take().items() if row is None} >= {b.key}
    assert a.key not in prods.take()


def test_a_resend_of_a_sequence_before_a_failed_run_is_a_duplicate_without_a_seq() -> None:
    """Another producer's message came between: the run that failed started a new one,
    and what was before it is known as a duplicate only (never another's seq)."""
    h = Harness()
    p, q = producer(), producer("other", "00000000000000bb")
    publish(h, q, numbered(CH, 1))  # seq 1
    (mine,) = publish(h, p, numbered(CH, 1))  # seq 2
    publish(h, q, numbered(CH, 2))  # seq 3
    publish(h, p, numbered(CH, 2), commit=False)  # seq 4, in a commit that fails
    h.broker.on_failed(h.broker.take_writes(), FULL)
    (again,) = publish(h, p, numbered(CH, 1))
    assert again.duplicate and again.seq in (0, mine.seq)
    assert publish(h, p, numbered(CH, 2))[0].code == ErrorCode.STORAGE_FULL


def test_a_new_numbered_publish_is_refused_while_storage_is_full_and_then_stored() -> None:
    h = Harness()
    p = producer()
    h.broker.storage_refusal = FULL
    (o,) = publish(h, p, numbered(CH, 1))
    assert o.code == ErrorCode.STORAGE_FULL
    assert CH not in h.broker.channels or h.broker.channels[CH].count == 0
    h.broker.storage_refusal = None
    (again,) = publish(h, p, numbered(CH, 2))
    assert (again.code, again.seq) == (0, 1)


def test_restored_states_idle_past_their_time_are_deleted_the_others_kept() -> None:
    """At a restart (now 200, idle 100), a state last used more than idle seconds ago
    is not brought back and its row is deleted with the next commit; one used exactly
    idle seconds ago, or later, is kept, whatever order the rows come in."""
    def row(client: str, used: float) -> tuple[object, ...]:
        return (client, "00000000000000aa", CH, 5, 0, 0, 0, 0, used, None)

    prods = Producers(max_states=10, idle=100.0)
    prods.load([row("old", 99.5), row("edge", 100.0), row("young", 150.0),
                row("older", 0.0)], 200.0)
    assert sorted(k[0] for k in prods.states) == ["edge", "young"]
    assert prods.states[("edge", "00000000000000aa", CH)].last == 5
    assert prods.take() == {("old", "00000000000000aa", CH): None,
                            ("older", "00000000000000aa", CH): None}


def test_after_a_failed_commit_a_resend_from_before_it_never_names_another_message() -> None:
    """A commit that fails undoes the producer's latest run of seqs; a resend of an
    older sequence is still a duplicate, and never answered with some other message's
    seq (seq 1 here is another publisher's)."""
    h = Harness()
    p, other = producer(), Session("other")
    publish(h, other, Send(CH, js("o1")))  # seq 1
    first = publish(h, p, numbered(CH, 1), numbered(CH, 2))  # seqs 2, 3
    publish(h, other, Send(CH, js("o2")))  # seq 4
    publish(h, p, numbered(CH, 3), commit=False)  # seq 5, a new run: its commit fails
    h.broker.on_failed(h.broker.take_writes(), FULL)
    (again,) = publish(h, p, numbered(CH, 1))
    assert again.duplicate and again.seq in (0, first[0].seq)


def test_a_refused_first_sequence_on_a_channel_writes_no_row_until_one_is_stored() -> None:
    """A producer's first publishes to a channel refused (an invalid name, a full
    channel): no row is written for them (on Redis such a row claimed the channel's
    queue, so publishes to names a client made up, or to queues it may not write,
    each left a queue in the registry, keyed by whatever the name said). The refusal is
    kept in memory, answered the same when sent again, and written with the state once
    a message of that producer is stored there."""
    h = Harness(channel_options=lambda key: ChannelOptions(max_items=0))
    p = producer()
    refused = publish(h, p, numbered("orders}/v1/x", 1), numbered("a/{b}/x", 1),
                      numbered(CH, 1), commit=False)
    assert [o.code for o in refused] == [ErrorCode.INVALID_CHANNEL] * 2 + [ErrorCode.QUEUE_FULL]
    assert not h.broker.take_writes().producers
    again = publish(h, p, numbered("orders}/v1/x", 1), commit=False)[0]
    assert (again.code, again.error) == (refused[0].code, refused[0].error)
    assert not h.broker.take_writes().producers
    # A refusal followed by a stored message: a resend of the refused one is refused,
    # not taken for a duplicate of something stored, and the row holds both.
    h2, p2 = Harness(), producer("another")
    bad = publish(h2, p2, Send(CH, b"{not json", pseq=1))[0]
    assert bad.code == ErrorCode.INVALID_PAYLOAD
    assert publish(h2, p2, numbered(CH, 2), commit=False)[0].code == 0
    rows = h2.broker.take_writes().producers
    assert [row[-1] is not None for row in rows.values()] == [True]  # refusals kept
    resent = publish(h2, p2, Send(CH, b"{not json", pseq=1))[0]
    assert (resent.code, resent.duplicate) == (bad.code, False)
