"""Several brokers on one Redis: which one serves, and what the others do meanwhile.

A broker whose storage can be shared (``storage.lease``: Redis) takes the primary
lease before it opens anything. If another broker holds it, this one is a standby: its
ports answer with where the primary is (standby.py) and it tries the lease again every
third of ``owner_lease``; once the primary stops renewing it (killed, paused, cut off),
it takes over: ``open`` claims every queue, raising their epochs, so whatever the old
primary still tries to write is refused inside Redis. The primary renews the lease on
its own thread; if it ever finds the lease someone else's (it was paused past it), it
stops serving at once: its writes are fenced anyway, and its clients reconnect to the
new primary. A clean stop gives the lease back, so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import redis

from ..config import Settings
from ..errors import StartupError, StorageFenced
from .peer_reach import reaches_redis
from .standby import StandbyDoor


class Server(Protocol):
    """What of the broker this needs (app.py's BrokerServer)."""

    settings: Settings
    storage: Any  # with lease(member, seconds)
    admission: Any  # its limit: connections the process can hold
    tls: Any  # tls.TlsFiles once _tls_context() made it
    exit_status: int
    stop_reason: str
    _stopping: asyncio.Event

    def _tls_context(self) -> Any: ...

    def request_stop(self) -> None: ...

log = logging.getLogger("minou.cluster")


def member_id(port: int) -> str:
    """This broker among those on one Redis: readable, and unique per process start."""
    return f"{socket.gethostname()}:{port}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def check_placement(lease: Any, placement: str, path: str) -> None:
    """Refuse to start beside live brokers of the other placement on this Redis: a
    spreading broker would take a primary's queues (and the primary take them back),
    each stopping the other in turn. Runs on a thread (it calls Redis)."""
    others = lease.other_placements(placement)
    if not others:
        return
    them = ", ".join(f"{r['id']} ({r.get('native') or '?'})" for r in others[:3])
    theirs = others[0].get("placement", "?")
    raise StartupError(
        f"{'a live broker' if len(others) == 1 else f'{len(others)} live brokers'} on "
        f"{path} ({them}) {'runs' if len(others) == 1 else 'run'} placement = "
        f"\"{theirs}\"; "
        f"this one is set to \"{placement}\". Every broker on one Redis (and key "
        f"prefix) must use the same placement, or each takes the others' queues and "
        f"stops them: set [storage] placement = \"{theirs}\" here, or stop those "
        "brokers first to change it (docs/cluster.md)")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, redis.AuthenticationError):
        return f"{exc} (check the password)"
    return str(exc) or type(exc).__name__


def broker_info(server: Server, sockets: list[socket.socket]) -> dict[str, str]:
    """This broker's record in Redis: where clients and other brokers reach it."""
    s = server.settings
    host = s.host if s.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    tls = s.tls_enabled
    info = {"native": f"{'minous' if tls else 'minou'}://{host}:"
                      f"{sockets[0].getsockname()[1]}",
            "host": socket.gethostname(), "pid": str(os.getpid()),
            "since": f"{time.time():.3f}", "placement": s.storage_placement}
    if len(sockets) > 1:
        info["http"] = f"{'https' if tls else 'http'}://{host}:{sockets[1].getsockname()[1]}"
    if tls and server.tls is not None:
        # What a broker relaying or forwarding clients here pins: Redis is the brokers'
        # trust.
        info["tls_fingerprint"] = server.tls.fingerprint
    return info


class PrimaryRole:
    def __init__(self, server: Server, sockets: list[socket.socket]) -> None:
        self.server = server
        self.sockets = sockets
        port = sockets[0].getsockname()[1]
        self.member = member_id(port)
        self.lease_s = server.settings.storage_owner_lease
        self.lease = server.storage.lease(self.member, self.lease_s)
        self._door_tls = server._tls_context()  # also publishes the fingerprint below
        self.info = self._info()
        self.role = "standby"
        self.since = 0.0  # wall time this broker became primary
        # monotonic time a successful take or renewal of the lease was sent: the lease
        # holds in Redis until at least this + lease_s
        self.lease_from = 0.0
        # the last renewal found Redis out of reach (none succeeded since): see lease_holds
        self.cut_off = False
        self.takeovers = 0  # times this broker took over from a live-looking primary
        self.lost = 0
        self.fenced_writes = 0
        self.handing_over = False  # a soft stop is draining, to give the lease up
        self._handed = False  # woken by a primary giving its lease up
        self.door: StandbyDoor | None = None
        # The last primary a standby saw: the one it takes over from, even when its last
        # look found the lease already given up (a clean stop hands it over).
        self.last_primary: dict[str, Any] | None = None
        self._retaking: asyncio.Future[bool] | None = None
        # monotonic time of the last call to Redis that was answered (/health's
        # redis_seen_s, asked by a primary cut off: peer_reach.py)
        self.seen_from = time.monotonic()
        # A standby that lost Redis leaves the lease to the primary for one lease once
        # Redis answers again (both were cut off: the primary retakes it and goes on).
        self.take_after = 0.0
        self.peers: list[dict[str, str]] = []  # the other brokers' records (last look)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="minou-lease")

    def _info(self) -> dict[str, str]:
        return broker_info(self.server, self.sockets)

    def _record(self) -> dict[str, str]:
        """This broker's record in Redis, with what its door does for `minou cluster`."""
        door = self.door
        if door is None:
            return self.info
        return {**self.info, "relaying": str(door.relaying), "relayed": str(door.relayed),
                "refused": str(door.refused), "full": str(door.full)}

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def acquire(self) -> bool:
        """Wait until this broker is primary (True), or the broker is asked to stop
        meanwhile (False). Redis unreachable at the first try: StartupError."""
        server, first, out = self.server, True, False
        while True:
            try:
                sent = time.monotonic()
                if first:
                    await self._call(check_placement, self.lease, "primary",
                                     server.storage.path)
                if out or sent < self.take_after:
                    # Redis answers again after an outage every broker may have lived
                    # through: the primary's lease ran out in it, not its life. It renews
                    # every third of the lease and retakes it; taking it first would
                    # stop it (one broker fewer after every Redis restart).
                    holder = await self._call(self.lease.holder)
                    if out:
                        self.take_after, out = sent + self.lease_s, False
                elif await self._call(self.lease.try_acquire, self._record()):
                    self.lease_from, self.cut_off = sent, False
                    break
                else:
                    holder = await self._call(self.lease.holder)
                self.seen_from = sent
                if holder and holder.get("id") != self.member \
                        and holder.get("native") == self.info.get("native"):
                    # This broker's own previous process (killed, restarted at once):
                    # dead, so no primary to relay to or name until its lease runs out.
                    holder = None
                if holder:
                    self.last_primary = holder
            except redis.RedisError as exc:
                if first:
                    raise StartupError(f"cannot use Redis at {server.storage.path}: "
                                       f"{_reason(exc)}") from exc
                log.debug("standby: Redis out of reach: %s", exc)
                holder = self.door.holder if self.door is not None else None
                out = True
            first = False
            if self.door is None:
                relay = server.settings.storage_standby == "relay"
                # A relayed connection holds two descriptors: the client's, the primary's.
                limit = server.admission.limit
                self.door = StandbyDoor(holder, relay=relay, max_relays=max(1, limit // 2),
                                        max_held=limit)
                self.door.redis_seen_s = lambda: time.monotonic() - self.seen_from
                await self.door.start(self.sockets[0], self.sockets[1] if len(self.sockets) > 1
                                      else None, self._door_tls)
                log.warning(
                    "standby: broker %r (%s) is the primary on %s; this broker serves once "
                    "it stops renewing its lease for %g s (owner_lease); clients asking here "
                    "are %s", (holder or {}).get("id", "?"),
                    (holder or {}).get("native", "?"), server.storage.path, self.lease_s,
                    "relayed there" if relay else "sent there")
            elif (holder or {}).get("id") != (self.door.holder or {}).get("id"):
                self.door.primary_changed(holder)
            else:
                self.door.holder = holder
            if await self._until_next_try():
                await self.close_door()
                return False
        was_standby = self.door is not None
        previous = self.last_primary if self.door is not None else None
        handed = self._handed
        if was_standby and not handed:  # the lease was given up between two waits
            with contextlib.suppress(redis.RedisError):
                handed = await self._call(self.lease.take_handoff)
        if self.door is not None:
            await self.close_door()
            if not handed:  # a hand-over is no failure: not counted as a takeover
                self.takeovers += 1
            log.warning("took over as the primary on %s (%s): opening its state",
                        server.storage.path, "handed over by the primary" if handed
                        else "the primary stopped renewing its lease")
        self.role, self.since = "primary", time.time()
        self.server.engine.may_deliver = self.lease_holds
        try:
            # A standby that waited took over, even if it last saw the lease empty.
            what = ("took over (handed over)" if handed else "took over") if was_standby \
                else "became primary"
            detail = {"from": previous.get("id")} if previous else {}
            await self._call(lambda: self.lease.note(what, **detail))
        except redis.RedisError as exc:  # only the record of it is lost
            log.debug("could not record the takeover: %s", exc)
        return True

    async def _until_next_try(self) -> bool:
        """Wait a third of the lease, or less: woken at once by a stop (True) or by a
        primary handing over (a clean or soft stop of it)."""
        self._handed = False
        stopping = asyncio.ensure_future(self.server._stopping.wait())
        handoff = asyncio.ensure_future(self._call(self.lease.wait_handoff, self.lease_s / 3))
        await asyncio.wait([stopping, handoff], return_when=asyncio.FIRST_COMPLETED)
        if stopping.done():
            handoff.cancel()  # its thread ends its wait; release() queues behind it
            return True
        if handoff.exception() is None:
            if handoff.result():
                self._handed = True
                log.info("standby: the primary gave its lease up: taking over now")
            stopping.cancel()
            return False
        try:  # Redis out of reach: wait the whole third, as without the wake-up
            await asyncio.wait_for(stopping, self.lease_s / 3)
            return True
        except TimeoutError:
            return False

    async def close_door(self) -> None:
        if self.door is not None:
            await self.door.close()
            self.door = None

    async def keep(self) -> None:
        """Renew the lease every third of it while primary; stop serving if it is lost,
        or if Redis stays out of reach past it while another broker could take over."""
        last_ok, warned, alone, looked = time.monotonic(), False, False, 0.0
        while True:
            await asyncio.sleep(self.lease_s / 3)
            sent = time.monotonic()
            try:
                ok = await self._call(self.lease.renew)
                self.seen_from = sent
            except redis.RedisError as exc:
                self.cut_off = True
                out_for = time.monotonic() - last_ok
                peers = self.lease.alive - 1  # as of the last renewal
                if out_for > self.lease_s and peers > 0:
                    if await self._others_reach_redis():
                        # Cut off from Redis alone (a partition): the lease has run out
                        # there and a standby that still reaches Redis serves, or soon
                        # will. Clients held here would get nothing but refusals: stop,
                        # so they reconnect to the others.
                        self.stop_serving(f"Redis at {self.server.storage.path} has been "
                                          f"out of reach for {out_for:.1f} s ({exc}), past "
                                          f"the lease, and another broker reaches it to "
                                          "take over")
                        return
                    if not alone:  # Redis itself is down: stopping would serve nobody
                        alone = True
                        log.error("Redis at %s has been out of reach for %.1f s (%s), past "
                                  "the lease, and no standby reaches it either: this "
                                  "primary stays up, delivers nothing and refuses "
                                  "publishes until Redis answers, then goes on if no "
                                  "standby took over meanwhile", self.server.storage.path,
                                  out_for, exc)
                    continue
                if not warned and out_for > self.lease_s / 2:
                    warned = True
                    log.error("cannot renew the primary lease on %s: %s; a standby takes "
                              "over if this lasts %g s", self.server.storage.path, exc,
                              self.lease_s)
                continue
            if alone:
                log.warning("Redis at %s answers again", self.server.storage.path)
                alone = False
            if ok:
                last_ok, warned = time.monotonic(), False
                self.lease_from, self.cut_off = sent, False
                if sent - looked > self.lease_s:
                    looked = sent
                    await self._look_at_peers()
                continue
            if await self.retake():
                last_ok = time.monotonic()
                continue
            return

    def _other_records(self) -> list[dict[str, str]]:
        return [r for r in self.lease.members() if r.get("id") != self.member and r["alive"]]

    async def _look_at_peers(self) -> None:
        """Note who could take over, and where to ask them, for a later cut-off. A
        failed look keeps the last one: the next renewal tells whether Redis is gone."""
        try:
            self.peers = await self._call(self._other_records)
        except redis.RedisError as exc:
            log.debug("cannot list the other brokers: %s", exc)

    async def _others_reach_redis(self) -> bool:
        """Whether another broker (at the last look) reached Redis lately, as its
        ``/health`` says: then this one is cut off alone. One that cannot be asked (dead,
        paused) takes nothing over."""
        asked = await asyncio.gather(*(reaches_redis(r, self.lease_s / 2)
                                       for r in self.peers))
        return any(asked)

    def redis_seen_s(self) -> float:
        """Seconds since this broker's last call to Redis that was answered."""
        return time.monotonic() - self.seen_from

    def lease_holds(self) -> bool:
        """Whether this primary may deliver now: its lease surely holds (it runs out in
        Redis no sooner than lease_s after the last renewal was sent), or Redis is out of
        its reach and it was alone on this Redis at its last renewal (a lone broker goes
        on, as keep() lets it). A primary woken from a pause past its lease delivers
        nothing until it knows whether it is still primary: what it would deliver may be
        served, and acked, elsewhere already. Alone at its last renewal is not enough
        then: a standby started after that renewal was not counted, and took over once
        the lease ran out; the next renewal's answer says (retake() if nobody did)."""
        if self.role != "primary":
            return False
        if time.monotonic() - self.lease_from < self.lease_s:
            return True
        return self.cut_off and self.lease.alive <= 1

    async def retake(self) -> bool:
        """The lease was found not ours. If it ran out with nobody taking over (this
        broker was paused, no standby was there), take it again: safe, since had anyone
        claimed the queues meanwhile their epochs would refuse this broker's writes.
        Else stop serving. True if this broker is primary again."""
        try:
            holder = await self._call(self.lease.holder)
            if holder is not None and holder.get("id") == self.member:
                return True  # taken again meanwhile (the renewal and a commit both asked)
            sent = time.monotonic()
            if holder is None and await self._call(self.lease.try_acquire, self.info):
                self.lease_from, self.cut_off = sent, False
                log.warning("the primary lease on %s had run out (this broker was paused "
                            "or cut off) and nobody took over: taken again",
                            self.server.storage.path)
                return True
        except redis.RedisError:
            holder = None
        self.stop_serving(f"broker {(holder or {}).get('id', '?')!r} holds the primary "
                          "lease now")
        return False

    def lapsed(self, exc: StorageFenced) -> bool:
        """A commit refused only because the lease ran out and nobody holds it (no
        queue was claimed by anyone): take it again in the background and say True (the
        commit is tried again); False: another broker took over."""
        if exc.queues or exc.holder or self.role != "primary":
            return False
        if self._retaking is None or self._retaking.done():
            self._retaking = asyncio.ensure_future(self.retake())
        return True

    def fenced(self, exc: Exception) -> None:
        """A commit was refused inside Redis: another broker took over."""
        self.fenced_writes += 1
        self.stop_serving(f"a write was refused (fenced): {exc}")

    def stop_serving(self, why: str) -> None:
        server = self.server
        if self.role != "primary":
            return
        self.role = "lost"
        self.lost += 1
        log.error("%s: this broker was paused or cut off past owner_lease (%g s) and another "
                  "broker took over or may; it writes nothing more (its writes are fenced) "
                  "and stops now (exit status 1); its clients reconnect to the primary",
                  why, self.lease_s)
        server.exit_status = 1
        server.stop_reason = server.stop_reason or "lost the primary lease"
        server.request_stop()

    async def hand_over(self, by: str) -> None:
        """A soft stop began: say so where every broker's ``minou cluster`` shows it."""
        self.handing_over = True
        try:
            await self._call(lambda: self.lease.note("handing over (soft stop)", by=by))
        except redis.RedisError as exc:  # only the record of it is lost
            log.debug("could not record the hand-over: %s", exc)

    async def release(self) -> None:
        """A clean stop: give the lease back (only if it is still ours), and leave."""
        try:
            if self.role == "primary":
                await self._call(self.lease.note, "gave the lease back (clean stop)")
                await self._call(self.lease.release)
            await self._call(self.lease.leave)
        except redis.RedisError as exc:
            log.warning("could not give the primary lease back (%s): a standby takes "
                        "over when it runs out", exc)
        with contextlib.suppress(Exception):
            await self._call(self.lease.close)
        self.role = "stopped"
        self._pool.shutdown(wait=False)

    async def view(self) -> dict[str, Any]:
        """``minou cluster``: the brokers on this Redis, the primary, the queues it owns
        with their epochs, and the recent takeovers."""
        members, holder, events = await asyncio.gather(
            self._call(self.lease.members), self._call(self.lease.holder),
            self._call(self.lease.events))
        primary = (holder or {}).get("id")
        for m in members:
            m["role"] = "primary" if m["id"] == primary else \
                "standby" if m.get("alive") else "gone"  # its record outlives it a little
            m["self"] = m["id"] == self.member
            for counter in ("relaying", "relayed", "refused", "full"):  # a standby's door
                m[counter] = int(m.get(counter) or 0) if m["role"] != "primary" else 0
        epochs = dict(self.server.storage.epochs)
        return {"storage": self.server.storage.path, "owner_lease": self.lease_s,
                "primary": primary, "brokers": members,
                "queues": [{"queue": q, "epoch": e, "owner": primary}
                           for q, e in sorted(epochs.items())],
                "events": events, "this_broker": self.status()}

    def status(self) -> dict[str, Any]:
        return {"member": self.member, "role": self.role, "owner_lease": self.lease_s,
                "handing_over": self.handing_over,
                "primary_since": round(self.since, 3) if self.since else None,
                "lease_renewals": self.lease.renewals, "takeovers": self.takeovers,
                "lost": self.lost, "fenced_writes": self.fenced_writes,
                "standby_refused": self.door.refused if self.door is not None else 0,
                "standby_relaying": self.door.relaying if self.door is not None else 0,
                "standby_relayed": self.door.relayed if self.door is not None else 0,
                "standby_full": self.door.full if self.door is not None else 0,
                **{k: v for k, v in self.info.items() if k in ("native", "http")}}
