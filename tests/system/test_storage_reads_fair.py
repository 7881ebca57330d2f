"""Storage reads of all clients share one reader thread: a large OFFSETS with ``at``
(Spark's starting timestamp over many channels) looks its channels up a slice at a
time, so another client's read queued meanwhile is answered between two slices, not
after the whole of it. Real broker, raw sockets."""

from __future__ import annotations

import select
import time

from minou.protocol import frames as f

from ..conftest import RawPeer

CHANNELS = 20_000


def test_another_clients_read_goes_between_the_slices_of_a_large_offsets_at(broker):
    writer, big, other = RawPeer(broker.url), RawPeer(broker.url), RawPeer(broker.url)
    try:
        for peer, name in ((writer, "writer"), (big, "big"), (other, "other")):
            peer.hello(name)
            peer.sock.settimeout(120)
        for lo in range(0, CHANNELS, 5_000):
            writer.write(f.encode(f.Publish(lo + 1, [f.Send(f"fair/v1/c{i}", b"1")
                                                     for i in range(lo, lo + 5_000)])))
            assert isinstance(writer.read(), f.Confirm)
        since = time.time() - 3600
        big.write(f.encode(f.Offsets(1, ["fair/*"], at=since)))
        time.sleep(0.03)  # the large lookup (~0.1 s) has begun when the small one comes
        other.write(f.encode(f.Offsets(1, ["fair/v1/c7"], at=since)))
        ready, _, _ = select.select([big.sock, other.sock], [], [], 60)
        # Whole, the large lookup held the thread and its answer came first.
        assert ready == [other.sock], "the small read waited for the whole large one"
        assert isinstance(other.read(), f.Result)
        assert isinstance(big.read(), f.Result)
    finally:
        for peer in (writer, big, other):
            peer.close()
