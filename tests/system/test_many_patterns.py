"""A group that reads thousands of channels by name (a Spark source positions each one)
costs the broker time in proportion to them, not to their square: one client's large
SUBSCRIBE or POSITION must not stall everybody else. Real broker, raw sockets."""

from __future__ import annotations

from minou.limits import MAX_PATTERNS_PER_GROUP
from minou.protocol import frames as f

from ..conftest import RawPeer

N = MAX_PATTERNS_PER_GROUP  # the most one request may carry


def answer_to(peer: RawPeer, req: int) -> f.Frame:
    while True:
        frame = peer.read()
        if getattr(frame, "req", None) == req:
            return frame


def test_large_subscribe_and_position_leave_other_clients_answered(broker):
    big, other = RawPeer(broker.url), RawPeer(broker.url)
    try:
        big.hello("big")
        other.hello("other")
        big.sock.settimeout(120)
        other.sock.settimeout(120)
        names = [f"many/v1/{i}" for i in range(N)]
        big.write(f.encode(f.Subscribe(1, 1, "consume", names, group="g")) +
                  f.encode(f.Position(2, "spark", {n: 1 for n in names})) +
                  f.encode(f.Position(3, "g", {n: 1 for n in names})))
        # Behind all three requests on the broker's one loop, and answered (that the
        # work is in proportion to the patterns is tests/core/test_readers.py's).
        other.write(f.encode(f.Ping(9)))
        assert isinstance(answer_to(other, 9), f.Pong)
        for req in (1, 2, 3):
            assert isinstance(answer_to(big, req), f.Result)
        # One more than a group may read is refused, precisely, and changes nothing.
        big.write(f.encode(f.SubAdd(4, 1, "more/v1/x")))
        refused = answer_to(big, 4)
        assert isinstance(refused, f.Error) and refused.detail["reason"] == "queue_full", refused
        assert f"the limit is {MAX_PATTERNS_PER_GROUP}" in refused.message
        big.write(f.encode(f.Subscribe(5, 2, "consume", ["more/v1/*"], group="g")))
        assert isinstance(answer_to(big, 5), f.Error)
    finally:
        big.close()
        other.close()


def test_one_clients_groups_read_a_bounded_number_of_patterns(broker):
    """Groups stay once made (their patterns with them): one client's 2,000 groups of
    10,000 patterns held ~5 GiB. Its groups may read 100,000 patterns in all
    (MAX_GROUP_PATTERNS_PER_CLIENT); past that it is refused, precisely, and new
    channels of other clients still cost a few lookups per group."""
    from minou.limits import MAX_GROUP_PATTERNS_PER_CLIENT

    big = RawPeer(broker.url)
    try:
        big.hello("big")
        big.sock.settimeout(120)
        for g in range(MAX_GROUP_PATTERNS_PER_CLIENT // N + 1):
            req = g + 1
            big.write(f.encode(f.Subscribe(req, req, "consume",
                                           [f"w{g}x{i}/*" for i in range(N)], group=f"g{g}")))
            answer = answer_to(big, req)
        assert isinstance(answer, f.Error) and answer.detail["reason"] == "queue_full", answer
        assert answer.detail["limit"] == MAX_GROUP_PATTERNS_PER_CLIENT
        assert f"client 'big' made read {MAX_GROUP_PATTERNS_PER_CLIENT} patterns" in \
            answer.message
        with broker.connect_sync("other") as other:
            assert other.send("fresh/v1/1", {"n": 1}).seq == 1
    finally:
        big.close()
