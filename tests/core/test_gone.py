"""A channel's deleted seqs (core/gone.py): they answer as the plain set they replace,
and hold memory for their runs, not for every seq deleted."""

from __future__ import annotations

import sys
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from minou.core.broker import Broker
from minou.core.log import GONE, Gone
from minou.protocol.frames import Send

SEQ = st.integers(0, 60)
OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["add", "discard", "drop_below", "drop_from", "skip",
                               "contains"]), SEQ),
    st.tuples(st.just("add_run"), SEQ, st.integers(0, 12)),
    st.tuples(st.just("count_between"), SEQ, SEQ),
), max_size=150)


@given(st.lists(SEQ, max_size=40), OPS)
def test_the_deleted_seqs_answer_as_a_plain_set(start, ops) -> None:
    gone, model = Gone(start), set(start)
    for op, seq, *more in ops:
        if op == "add":
            gone.add(seq)
            model.add(seq)
        elif op == "add_run":
            gone.add_run(seq, seq + more[0])
            model.update(range(seq, seq + more[0]))
        elif op == "discard":
            gone.discard(seq)
            model.discard(seq)
        elif op == "drop_below":
            assert gone.drop_below(seq) == len({s for s in model if s < seq})
            model = {s for s in model if s >= seq}
        elif op == "drop_from":
            assert gone.drop_from(seq) == len({s for s in model if s >= seq})
            model = {s for s in model if s < seq}
        elif op == "skip":
            past = seq
            while past in model:
                past += 1
            assert gone.skip(seq) == past
        elif op == "count_between":
            assert gone.count_between(seq, more[0]) == \
                len([s for s in model if seq <= s < more[0]])
        else:
            assert (seq in gone) == (seq in model)
        assert list(gone) == sorted(model) and len(gone) == len(model)
        assert bool(gone) == bool(model) and gone.n == len(model)
        runs = list(gone.runs())  # disjoint, not touching, ascending
        assert all(a < b for a, b in runs)
        assert all(b < c for (_, b), (c, _) in pairwise(runs))
    assert Gone.from_sorted(sorted(list(model) * 2)) == Gone(model) == model  # repeats
    assert Gone.from_runs(gone.runs()) == gone


def test_forgetting_the_oldest_runs_compacts_them_away_and_answers_the_same() -> None:
    """Runs forgotten by ``drop_below`` stay in the arrays until they are half of
    them (forgetting costs what it forgets); every answer ignores them."""
    gone, model = Gone(range(0, 2000, 2)), set(range(0, 2000, 2))
    for below in range(0, 2100, 37):
        gone.add(below + 1)
        model.add(below + 1)
        assert gone.drop_below(below) == len([s for s in model if s < below])
        model = {s for s in model if s >= below}
        assert list(gone) == sorted(model) and len(gone) == len(model)
        assert all((s in gone) == (s in model) for s in range(below - 5, below + 80))
        assert gone.count_between(0, 3000) == len(model)
        assert gone.skip(below) == min(set(range(below, 3000)) - model)
        assert gone.run_count() == len(list(gone.runs()))
    assert gone.nbytes() < 1024  # compacted: the arrays shrank with it


def held(gone: object) -> int:
    """What the structure holds: itself and the containers in its slots (a set's and a
    heap's size, or two arrays' buffers)."""
    return sys.getsizeof(gone) + sum(sys.getsizeof(getattr(gone, s))
                                     for s in getattr(type(gone), "__slots__", ())
                                     if hasattr(gone, s))


CH = "_kv/v1/b"


def test_a_hot_key_holds_one_run_whatever_its_deleted_revisions() -> None:
    """A cold key pins first_seq; each update of the hot key deletes its older revision:
    20,000 deleted seqs in a row. As a set they held ~80 B each (1.6 MB), for ever."""
    b, now = Broker(), 1000.0
    b.publish([Send(CH, b"1", key="cold")], now)
    b.on_committed(b.take_writes(), now)
    for _ in range(20):
        b.publish([Send(CH, b"2", key="hot") for _ in range(1000)], now)
        b.on_committed(b.take_writes(), now)
    log = b.state.channels[CH]
    assert (log.first_seq, log.end, log.count, len(log.gone)) == (1, 20_002, 2, 19_999)
    assert held(log.gone) < 1024, held(log.gone)
    assert list(log.gone.runs()) == [(2, 20_001)]
    stats = b.channel_stats(log, now)
    assert stats["deleted"] == 19_999 and stats["deleted_bytes"] < 1024


def test_every_other_seq_deleted_holds_no_more_runs_than_live_messages() -> None:
    """The worst case for runs: each deleted seq alone, between live ones. A run is
    16 bytes: still bounded by what the channel holds live."""
    b, now = Broker(), 1000.0
    for start in range(0, 4000, 1000):
        b.publish([s for i in range(start, start + 1000)
                   for s in (Send(CH, b"3", key=f"k{i}"), Send(CH, b"2", key="hot"))], now)
        b.on_committed(b.take_writes(), now)
    log = b.state.channels[CH]
    assert log.count == 4001 and len(log.gone) == 3999
    assert log.gone.run_count() <= log.count + 1
    assert log.gone.nbytes() <= 16 * log.count * 1.2 + 128
    # and reads and deliveries see the same messages as before
    assert log.lookup(2) is GONE and log.lookup(3).data == b"3"  # type: ignore[union-attr]
    assert log.oldest_live() == 1
