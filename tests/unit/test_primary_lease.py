"""``PrimaryRole.lease_holds``: whether a cluster primary may deliver now.

It delivers only while its lease surely holds in Redis (less than ``owner_lease`` since
the last successful take or renewal was *sent*: Redis started its timer no sooner), or
while Redis is out of its reach and it was the only broker alive at its last renewal (a
lone broker goes on). A primary woken from a pause past its lease must deliver nothing
from memory until its next renewal answers, even if it was alone at the last one (a
standby started since may have taken over): another broker may have served, and acked,
those messages already (``make chaos`` under load).

The role is the real one, driven through its real ``acquire``, ``keep`` and ``retake``;
around it, a server with what the role reads, a lease that answers like Redis would and
a clock of the test's own (``primary.time``), so that the lease runs out exactly when the
test says. One test uses the real clock.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from minou.config import Settings
from minou.server import primary
from minou.server.primary import PrimaryRole

LEASE = 1.0
T0 = 1000.0  # the test clock when the lease is first taken


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def monotonic(self) -> float:
        return self.now


class Lease:
    """Answers as storage.redis.lease.PrimaryLease does, without Redis: ``trip`` is how
    long (on the test clock) each call to Redis takes, the reply coming that much after
    the request was sent."""

    def __init__(self, clock: Clock, alive: int = 2) -> None:
        self.clock = clock
        self.alive = alive  # brokers alive at the last renewal or record, this one too
        self.trip = 0.0
        self.renewals = 0
        # what keep()'s renewals get, in turn: True, False (not ours) or a Redis error
        self.answers: list[bool | Exception] = [True]
        self.holder_now: dict[str, str] | None = None
        self.sent: list[float] = []  # when each take or renewal was sent
        self.more_asked = threading.Event()  # a renewal came after the last answer
        self.release = threading.Event()

    def _round_trip(self) -> None:
        self.sent.append(self.clock.now)
        self.clock.now += self.trip

    def try_acquire(self, info: dict[str, str]) -> bool:
        self._round_trip()
        return True

    def renew(self) -> bool:
        if not self.answers:  # keep() handled every answer: it waits here, cancelled,
            self.more_asked.set()  # and this changes nothing
            self.release.wait(5)
            return True
        self._round_trip()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        self.renewals += answer
        return answer

    def holder(self) -> dict[str, str] | None:
        return self.holder_now

    def members(self) -> list[dict[str, Any]]:
        return []  # the other brokers' records: none that can be asked here

    def other_placements(self, placement: str) -> list[dict[str, Any]]:
        return []  # no broker of the other placement

    def take_handoff(self) -> bool:
        return False

    def note(self, what: str, **detail: Any) -> None:
        pass


class Server:
    """What PrimaryRole reads of app.py's BrokerServer."""

    def __init__(self, lease: Lease, lease_s: float = LEASE) -> None:
        self.settings = Settings(storage_owner_lease=lease_s)
        self.storage = SimpleNamespace(lease=lambda member, seconds: lease,
                                       path="redis://test")
        self.admission = SimpleNamespace(limit=100)
        self.tls = None
        self.exit_status = 0
        self.stop_reason = ""
        self.stop_requested = False
        self._stopping = asyncio.Event()
        self.engine = SimpleNamespace(may_deliver=lambda: True)

    def _tls_context(self) -> None:
        return None

    def request_stop(self) -> None:
        self.stop_requested = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    # primary.py's clock only: asyncio keeps the real one
    monkeypatch.setattr(primary, "time", SimpleNamespace(monotonic=c.monotonic,
                                                         time=time.time))
    return c


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s
    s.close()


def primary_role(lease: Lease, sock: socket.socket, lease_s: float = LEASE
                 ) -> tuple[PrimaryRole, Server]:
    server = Server(lease, lease_s)
    role = PrimaryRole(server, [sock])  # type: ignore[arg-type]
    assert asyncio.run(role.acquire()) is True
    return role, server


def keep(role: PrimaryRole, lease: Lease) -> None:
    """Run the role's keep() until it has had every answer in ``lease.answers`` (it asks
    for one more, or returns: it stopped serving). lease_s sets its pace: a third of it."""
    async def run() -> None:
        keeping = asyncio.ensure_future(role.keep())
        try:
            for _ in range(500):  # at most 5 s, however loaded the machine
                if lease.more_asked.is_set() or keeping.done():
                    break
                await asyncio.sleep(0.01)
            assert lease.more_asked.is_set() or keeping.done(), "keep() did not renew"
        finally:
            keeping.cancel()
            lease.release.set()
            await asyncio.gather(keeping, return_exceptions=True)
    asyncio.run(run())


def test_the_engine_asks_the_role_and_a_standby_delivers_nothing(
        clock: Clock, sock: socket.socket) -> None:
    lease = Lease(clock)
    server = Server(lease)
    role = PrimaryRole(server, [sock])  # type: ignore[arg-type]
    assert not role.lease_holds()  # a standby, even one alone
    lease.alive = 1
    assert not role.lease_holds()
    asyncio.run(role.acquire())
    assert role.role == "primary"
    assert server.engine.may_deliver == role.lease_holds  # the engine's gate is this
    assert server.engine.may_deliver() is True


def test_it_holds_until_the_lease_runs_out_counted_from_when_the_take_was_sent(
        clock: Clock, sock: socket.socket) -> None:
    """The take's reply came 0.3 s after it was sent: the lease runs out in Redis at
    the latest LEASE after it was *sent* (when Redis got it is unknown, but not sooner)."""
    lease = Lease(clock, alive=2)
    lease.trip = 0.3
    role, _ = primary_role(lease, sock)
    assert lease.sent == [T0] and clock.now == T0 + 0.3
    assert role.lease_holds()
    clock.now = T0 + LEASE - 0.01
    assert role.lease_holds()
    clock.now = T0 + LEASE  # the lease may have run out in Redis
    assert not role.lease_holds()
    clock.now = T0 + LEASE + 0.2  # still within LEASE of the reply: not good enough
    assert not role.lease_holds()
    clock.now = T0 + 30  # woken from a long pause
    assert not role.lease_holds()


def test_a_renewal_extends_it_from_when_the_renewal_was_sent(
        clock: Clock, sock: socket.socket) -> None:
    """keep() renews; the renewal took half a lease to answer. The lease then holds
    until LEASE after the renewal was sent, no longer (and longer than the take's)."""
    lease = Lease(clock, alive=3)
    lease_s = 0.25  # keep() renews every 83 ms; a power of two: exact sums below
    role, _ = primary_role(lease, sock, lease_s=lease_s)
    sent = T0 + 0.75 * lease_s
    clock.now = sent
    lease.trip = 0.5 * lease_s
    keep(role, lease)
    assert lease.renewals == 1 and lease.sent == [T0, sent]
    clock.now = T0 + lease_s + 0.01  # past the take's lease: the renewal's holds
    assert role.lease_holds()
    clock.now = sent + lease_s - 0.001
    assert role.lease_holds()
    clock.now = sent + lease_s
    assert not role.lease_holds()
    assert role.role == "primary"


def test_a_renewal_that_finds_the_lease_gone_extends_nothing(
        clock: Clock, sock: socket.socket) -> None:
    """Another broker holds the lease now: the renewal fails, the role stops serving and
    delivers nothing, not even within LEASE of its last renewal."""
    lease = Lease(clock, alive=2)
    role, server = primary_role(lease, sock, lease_s=0.25)
    lease.answers = [False]
    lease.holder_now = {"id": "other-broker"}
    clock.now = T0 + 0.01
    keep(role, lease)
    assert role.role == "lost" and server.stop_requested and server.exit_status == 1
    assert not role.lease_holds()  # well within LEASE of the take, yet lost


def test_alone_and_cut_off_from_redis_it_goes_on_past_the_lease(
        clock: Clock, sock: socket.socket) -> None:
    """Redis out of reach, and nobody else was alive on this Redis at the last renewal:
    a lone broker delivers on past its lease (keep() keeps it up too). With a standby
    counted at that renewal, or once lost, it does not."""
    lease = Lease(clock, alive=1)
    role, _ = primary_role(lease, sock, lease_s=0.25)
    lease.answers = [redis.ConnectionError("Redis is down")]
    clock.now = T0 + 0.1
    keep(role, lease)
    assert role.role == "primary"
    clock.now = T0 + 40.0
    assert role.lease_holds()
    lease.alive = 2  # one standby is enough to take over
    assert not role.lease_holds()
    lease.alive = 1
    assert role.lease_holds()
    role.stop_serving("test")  # lost, even alone: nothing more
    assert not role.lease_holds()


def test_alone_at_the_last_renewal_but_woken_from_a_pause_it_waits_for_the_next(
        clock: Clock, sock: socket.socket) -> None:
    """Its renewals succeeded, alone, then nothing for a long while (paused): a standby
    started since was not counted and may have taken over, so it delivers nothing until
    the next renewal says. Here nobody did: the lease, run out, is taken again."""
    lease = Lease(clock, alive=1)
    role, _ = primary_role(lease, sock, lease_s=0.25)
    clock.now = T0 + 0.125
    keep(role, lease)  # renewed, alone
    assert lease.renewals == 1 and lease.alive == 1
    clock.now = T0 + 40.0  # woken
    assert not role.lease_holds()
    lease.answers = [False]  # the lease ran out and nobody holds it: retake() takes it
    lease.more_asked.clear()
    lease.release.clear()
    keep(role, lease)
    assert lease.sent[-1] == T0 + 40.0 and role.role == "primary"
    assert role.lease_holds()


def test_a_renewal_that_works_again_ends_the_cut_off(clock: Clock, sock: socket.socket
                                                     ) -> None:
    """Redis out of reach, then back: the lease holds from the renewal that worked, and
    once that runs out, alone no longer counts (nothing tells it Redis is out of reach)."""
    lease = Lease(clock, alive=1)
    role, _ = primary_role(lease, sock, lease_s=0.25)
    lease.answers = [redis.TimeoutError("no answer"), True]
    keep(role, lease)
    assert lease.renewals == 1
    clock.now = T0 + 0.2
    assert role.lease_holds()  # from the renewal that worked (sent at T0)
    clock.now = T0 + 40.0
    assert not role.lease_holds()


def test_a_lapsed_lease_taken_again_holds_from_when_it_was_taken(
        clock: Clock, sock: socket.socket) -> None:
    """retake(): the lease had run out and nobody took it; taken again, it holds for
    LEASE from when that take was sent."""
    lease = Lease(clock, alive=2)
    role, _ = primary_role(lease, sock)
    clock.now = T0 + 5 * LEASE
    assert not role.lease_holds()
    lease.trip = 0.4
    taken_at = clock.now
    assert asyncio.run(role.retake()) is True
    assert lease.sent[-1] == taken_at
    assert role.lease_holds()
    clock.now = taken_at + LEASE - 0.01
    assert role.lease_holds()
    clock.now = taken_at + LEASE
    assert not role.lease_holds()


def test_on_the_real_clock_the_lease_runs_out(sock: socket.socket) -> None:
    lease = Lease(Clock(), alive=1)  # its calls take no time; alone, and in reach
    role, _ = primary_role(lease, sock, lease_s=0.05)
    time.sleep(0.06)
    assert not role.lease_holds()


class HandedOverLease(Lease):
    """A standby's view of a primary's clean stop that its look raced: the primary
    holds the lease at the first look, the next look finds it already given back (the
    take tried just before it lost), then the hand-over wakes the standby and it takes
    the lease. The events it records are kept."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.takes = [False, False, True]
        self.holders: list[dict[str, str] | None] = [{"id": "old-primary",
                                                      "native": "minou://10.0.0.9:7700"},
                                                     None]
        self.events: list[dict[str, Any]] = []

    def try_acquire(self, info: dict[str, str]) -> bool:
        self._round_trip()
        return self.takes.pop(0)

    def holder(self) -> dict[str, str] | None:
        return self.holders.pop(0)

    def wait_handoff(self, seconds: float) -> bool:
        return True  # handed over: the standby tries again at once

    def note(self, what: str, **detail: Any) -> None:
        self.events.append({"what": what, **detail})


def test_a_standby_handed_the_lease_names_the_primary_it_last_saw_not_the_empty_lease(
        clock: Clock, sock: socket.socket) -> None:
    lease = HandedOverLease(clock)
    role = PrimaryRole(Server(lease), [sock])  # type: ignore[arg-type]
    assert asyncio.run(role.acquire()) is True
    assert role.role == "primary" and role.door is None
    assert lease.events == [{"what": "took over (handed over)", "from": "old-primary"}]
