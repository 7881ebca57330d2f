"""A channel's deleted seqs (``ChannelLog.gone``, a ``SeqRuns``: core/seq_runs.py) hold
memory for their runs, not for every seq deleted. That they answer as the plain set they
replace: tests/unit/test_seq_runs.py."""

from __future__ import annotations

import sys

from minou.core.broker import Broker
from minou.core.log import GONE
from minou.protocol.frames import Send


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
