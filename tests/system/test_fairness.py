"""Redelivery goes to someone who can take it, and idle members share spaced messages
evenly: against a real broker process over real sockets."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from minou.errors import Timeout


def test_an_expired_lease_goes_to_the_idle_member_not_back_to_the_silent_one(broker):
    with broker.connect_sync("silent") as a, broker.connect_sync("healthy") as b:
        silent = a.consume("work/v1/*", group="g", lease=2.0, prefetch=10)
        healthy = b.consume("work/v1/*", group="g", lease=2.0)
        a.send("work/v1/1", {"job": 1})
        # Whoever got it first: if the healthy member did, it lets it go unacked once so
        # that the silent member holds it.
        try:
            first = healthy.get(timeout=1)
            assert first.payload == {"job": 1}
            got = silent.get(timeout=5)  # after the 2 s lease: the other member
        except Timeout:
            got = silent.get(timeout=5)
        assert got.payload == {"job": 1}
        # The silent member never acks: at its lease's end the healthy member gets it.
        again = healthy.get(timeout=5)
        assert again.payload == {"job": 1} and again.attempts >= 2
        assert again.ack()


def test_spaced_messages_are_shared_evenly_by_three_idle_members(broker):
    clients = [broker.connect_sync(f"member-{i}") for i in range(3)]
    got: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def work(name: str, sub) -> None:
        while not stop.is_set():
            try:
                msg = sub.get(timeout=0.2)
            except Timeout:
                continue
            with lock:
                got[name] += 1
            msg.ack()

    try:
        threads = [threading.Thread(target=work, daemon=True,
                                    args=(f"member-{i}", c.consume("spread/v1/*", group="g")))
                   for i, c in enumerate(clients)]
        for t in threads:
            t.start()
        for i in range(30):
            clients[0].send(f"spread/v1/{i % 5}", {"i": i})
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while sum(got.values()) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(5)
    finally:
        for c in clients:
            c.close()
    assert sum(got.values()) == 30
    assert all(abs(got[f"member-{i}"] - 10) <= 1 for i in range(3)), got


@pytest.mark.parametrize("lease", [1.0])
def test_a_never_acked_message_is_not_dead_lettered_while_a_member_could_take_it(broker,
                                                                                  lease):
    """With a 1 s lease and the default requeue limit, the idle member gets the message
    long before the silent one uses up every attempt."""
    with broker.connect_sync("hog") as a, broker.connect_sync("idle") as b:
        hog = a.consume("hog/v1/*", group="g", lease=lease, prefetch=100)
        idle = b.consume("hog/v1/*", group="g", lease=lease)
        a.send("hog/v1/1", {"n": 1})
        try:
            msg = idle.get(timeout=1)  # its turn came first: fine, that is the point
        except Timeout:
            assert hog.get(timeout=2).payload == {"n": 1}
            msg = idle.get(timeout=3 * lease)
        assert msg.payload == {"n": 1} and msg.attempts <= 2
        assert msg.ack()
