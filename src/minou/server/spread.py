"""Queues spread over several brokers on one Redis (``[storage] placement = "spread"``).

Every broker is alive in Redis (a record renewed every third of ``owner_lease``, in
the ``{shared}alive`` set) and owns the queues that rendezvous hashing over the live
brokers gives it (``placement.owner``). Nothing coordinates them: each one looks at
the same two inputs every third of the lease and

* adopts a queue it ranks first for once no other live broker owns it (its owner died,
  handed it over, or it is new): the storage claims it (its epoch goes up, fencing the
  previous owner) and reads it, the core adds it (``Broker.adopt``);
* hands a queue over once another live broker ranks first for it (a broker joined):
  it commits what it staged for the queue, gives the queue up in Redis (the next
  owner may claim it at once) and forgets it (``Broker.release_queue``).

A broker's clients reach every queue: ``front.py`` forwards what is for a queue owned
elsewhere to its owner over a link connection authenticated with the cluster's link
secret (in Redis, the brokers' shared trust, as for TLS fingerprints).

Fencing is the queue epochs', as with one primary: a broker paused past its record
(SIGSTOP, a long GC) finds its queues claimed and its writes refused; it then stops
(exit status 1) and its clients reconnect to the others. While its record may have run
out it delivers nothing (``may_deliver``): what it holds may be served, and acked,
elsewhere already.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
import socket
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jwt
import redis

from ..core.snapshot import queue_of
from ..errors import (
    ErrorCode,
    NotAuthenticated,
    RequestError,
    StartupError,
    StorageError,
    StorageFenced,
    StorageUnavailable,
)
from ..names import REPLY_TO, is_inbox, is_queue_name
from ..storage.redis.keys import shared_base
from . import placement
from .front import ADOPT, Door, Front
from .kv import read_buckets
from .peer_reach import reaches_redis
from .primary import Server, _reason, broker_info, check_placement, member_id

log = logging.getLogger("minou.cluster")

LINK_PREFIX = "mlk1"  # a link credential: mlk1.<expires>.<hmac of client id, expires>
LINK_TTL_S = 300.0  # a link credential's life: links reconnect with a fresh one
HANDOVER_COMMIT_S = 5.0  # how long a hand-over waits for the queue's writes to commit
HANDOVER_DRAIN_S = 10.0  # ... and, before, for its deliveries out to settle (at most)
HISTORY_KEPT = 20  # recent adoptions and hand-overs `minou cluster` shows
HTTP_FRONTS = 256  # HTTP clients whose links to other brokers are kept
QUEUE_MEMO = 1 << 16  # channels whose queue route_channel remembers


def _token_id(token: str) -> tuple[str, float]:
    """A verified token's id and expiry."""
    claims = jwt.decode(token, options={"verify_signature": False})
    return str(claims["jti"]), float(claims["exp"])


class SpreadRole:
    role = "spread"

    def __init__(self, server: Server, sockets: list[socket.socket]) -> None:
        self.server = server
        self.member = member_id(sockets[0].getsockname()[1])
        self.lease_s = server.settings.storage_owner_lease
        self.lease = server.storage.lease(self.member, self.lease_s)
        server.storage.spread_as(self.member)
        server._tls_context()  # the listeners' certificate: its fingerprint is published
        self.info = broker_info(server, sockets)
        self.since = time.time()
        self.seen_from = 0.0  # monotonic send time of the last alive record that landed
        self.cut_off = False  # the last renewal found Redis out of reach
        self.alive: list[str] = [self.member]
        self.owners: dict[str, str] = {}  # queue -> the broker Redis says owns it
        self.queues: set[str] = set()  # every queue in the registry
        self.addresses: dict[str, dict[str, str]] = {}  # member -> its record
        self.adopting: dict[str, asyncio.Future[None]] = {}
        self.owned: set[str] = set()  # claimed by this broker (a new queue has no channel)
        self.leaving: dict[str, asyncio.Future[None]] = {}  # being handed over
        self.http_fronts: dict[str, Any] = {}  # client id -> front.Front, recent last
        # The fronts of /v1/stream sockets and HTTP consumers (front_for), followed
        # like the connections' when brokers come and go
        self.fronts: weakref.WeakSet[Front] = weakref.WeakSet()
        # The key registry and the delegated credentials as stored at the last look
        self.stored_registry: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})
        self.history: list[dict[str, Any]] = []
        self.adopted = self.handed = self.lost = self.fenced_writes = 0
        self.handing_over = False
        self.secret = b""
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="minou-spread")
        self._running: set[asyncio.Future[None]] = set()
        self._rebalancing: asyncio.Future[None] | None = None
        self._queues_of: dict[str, str | None] = {}  # channel -> its queue (route_channel)
        self._writer_claims: dict[str, asyncio.Future[None]] = {}  # writer id -> its binding
        self.adopt_after = 0.0  # monotonic: others' queues are adopted from then on

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # ------------------------------------------------------------- joining
    async def join(self) -> None:
        """Be alive in Redis and learn the others, before the state opens."""
        try:
            sent = time.monotonic()
            await self._call(self._join)
            self.seen_from = sent
        except redis.RedisError as exc:
            raise StartupError(f"cannot use Redis at {self.server.storage.path}: "
                               f"{_reason(exc)}") from exc
        self.server.engine.may_deliver = self.may_deliver
        self.server.engine.route = self.refuse_remote
        self.server.core.state.hosts = self.hosts
        # A reply may be stored by another broker than the one that delivered the
        # request: every broker checks reply tokens with the cluster's secret.
        self.server.core.state.reply_secret = self.secret
        log.warning("spread: broker %s joins %d live broker(s) on %s; it owns the queues "
                    "rendezvous hashing gives it", self.member, len(self.alive),
                    self.server.storage.path)

    def _join(self) -> None:
        check_placement(self.lease, "spread", self.server.storage.path)
        self.lease.seen(self.info)
        client, key = self.lease.client, shared_base(self.server.storage.prefix) + "link"
        client.set(key, secrets.token_bytes(32), nx=True)
        self.secret = bytes(client.get(key) or b"")
        self._look()

    def _look(self) -> None:
        """What Redis says now: the live brokers, their records, the queues, owners."""
        client, base = self.lease.client, shared_base(self.server.storage.prefix)
        alive = self.lease.alive_members()
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(base + "owners")
        pipe.smembers(base + "queues")
        pipe.hgetall(base + "clients")
        pipe.hgetall(base + "credentials")
        for m in alive:
            pipe.hgetall(base + "member:" + m)
        owners, queues, clients, credentials, *records = pipe.execute()
        self.stored_registry = (clients, credentials)
        self.alive = alive if self.member in alive else sorted([*alive, self.member])
        self.owners = {_text(q): _text(m) for q, m in owners.items()}
        self.queues = {_text(q) for q in queues}
        self.addresses = {m: {_text(k): _text(v) for k, v in r.items()}
                          for m, r in zip(alive, records, strict=True)}

    # ----------------------------------------------------------- routing
    def owner_of(self, queue: str) -> str:
        """The broker that serves ``queue`` now: its owner in Redis while that one is
        alive, else the one placement gives it to (which claims it at its first use)."""
        owner = self.owners.get(queue)
        if owner is not None and owner in self.alive:
            return owner
        return placement.owner(queue, self.alive) or self.member

    def route(self, queue: str) -> str | None:
        """Where what is for ``queue`` goes now: None here (this broker owns it), the
        member that does, or ``ADOPT``: here once this broker has claimed it. Even a
        queue this broker never heard of is claimed first: another broker may have
        made it since the last look, and served without its stored state it would
        start again from seq 1."""
        if queue in self.owned:
            return None
        if not is_queue_name(queue):  # an invalid channel's: refused here, never claimed
            return None
        if queue in self.adopting or queue in self.leaving:
            return ADOPT  # adoption() waits for either to end
        owner = self.owner_of(queue)
        return ADOPT if owner == self.member else owner

    def http_front(self, identity: Any) -> Any:
        """The front that forwards an HTTP client's publishes (its links kept for its
        next requests; the least recently used of more than ``HTTP_FRONTS`` close)."""
        front = self.http_fronts.pop(identity.client_id, None)
        if front is None:
            front = Front(Door(self.server, identity), self)
        self.http_fronts[identity.client_id] = front
        while len(self.http_fronts) > HTTP_FRONTS:
            oldest = next(iter(self.http_fronts))
            self.http_fronts.pop(oldest).close()
        return front

    def front_for(self, door: Any) -> Front:
        """A front for a door that subscribes (a /v1/stream socket, an HTTP consumer):
        its subscriptions are made on every live broker, like a connection's."""
        front = Front(door, self)
        self.fronts.add(front)
        return front

    def held(self) -> set[str]:
        """The queues this broker owns (claimed: a new one has no channel yet)."""
        return set(self.owned)

    def hosts(self, channel: str) -> bool:
        """Whether this broker serves ``channel``'s queue (the core asks before it makes
        a channel a reader names)."""
        q = queue_of(channel)
        return q is None or q in self.owned

    def route_channel(self, channel: str) -> str | None:
        """``route`` of ``channel``'s queue (None for a pattern: this broker's), its
        queue remembered: this is asked for every message."""
        memo = self._queues_of
        q = memo.get(channel, "")
        if q == "":
            if len(memo) >= QUEUE_MEMO:
                memo.clear()
            q = memo[channel] = queue_of(channel)
        return None if q is None else self.route(q)

    def adoption(self, queue: str) -> asyncio.Future[None]:
        """The adoption of ``queue``, started now if it is not under way."""
        if queue in self.leaving:  # being handed over: routed again once it is
            return self.leaving[queue]
        if queue in self.owned:  # adopted already (a route looked before it ended)
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        done = self.adopting.get(queue)
        if done is None:
            done = self.adopting[queue] = asyncio.get_running_loop().create_future()
            task = asyncio.ensure_future(self._adopt(queue, done))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return done

    def claimable(self, send: Any, access: Any) -> bool:
        """Whether ``send`` may go to its queue's owner, or make this broker claim the
        queue: False for a queue nobody made yet that the client may not write to (this
        broker's engine refuses it as the owner would). A claim enters the queue in the
        registry for good, and a client could fill it with names it may not write to.
        Replies may go where the rules say nothing: their owner checks them."""
        if access is None or access.unrestricted or is_inbox(send.channel) or \
                (send.headers and REPLY_TO in send.headers):
            return True
        q = queue_of(send.channel)
        return q is None or q in self.queues or access.may_write(send.channel)

    def refuse_remote(self, sends: Any, access: Any) -> RequestError | None:
        """For the doors without a front (the Redis protocol's): a publish to a queue
        another broker owns, or one being taken over, is refused with where to go."""
        for send in sends:
            where = self.route_channel(send.channel)
            if where is None or not self.claimable(send, access):
                continue
            q = queue_of(send.channel)
            if where == ADOPT:
                self.adoption(q)
                exc = RequestError(f"queue {q} is being taken over by this broker: "
                                   "send again in a moment")
                exc.code = ErrorCode.STORAGE_UNAVAILABLE
                return exc
            record = self.addresses.get(where, {})
            there = record.get("http") or record.get("native")
            exc = RequestError(
                f"queue {q} is owned by broker {where} ({there}); this door does not "
                "forward yet: send it there, or use the native protocol",
                owner=where, native=record.get("native"), http=record.get("http"))
            exc.code = ErrorCode.STANDBY
            return exc
        return None

    def link_members(self) -> list[str]:
        """The other live brokers to link to: one per address (a broker restarted on
        the same port has a new id; its old one stays alive until its record runs
        out, and two links there would subscribe twice): the newest record wins."""
        newest: dict[str, tuple[float, str]] = {}
        for m in self.alive:
            if m == self.member:
                continue
            record = self.addresses.get(m, {})
            where = record.get("native") or m
            since = float(record.get("since") or 0)
            if where not in newest or since > newest[where][0]:
                newest[where] = (since, m)
        return sorted(m for _, m in newest.values())

    def address(self, member: str) -> dict[str, str] | None:
        return self.addresses.get(member)

    def may_deliver(self) -> bool:
        """Deliver only while this broker's alive record surely holds (it runs out in
        Redis no sooner than a lease after it was sent), or while Redis is out of reach
        and no other broker was alive at the last look (a lone broker goes on). Woken
        from a pause, it delivers nothing until its next record says whether others
        took its queues meanwhile (a broker started since the last look was not seen)."""
        if self.role != "spread":  # lost its queues: stopping, it delivers nothing more
            return False
        if time.monotonic() - self.seen_from < self.lease_s:
            return True
        return self.cut_off and len(self.alive) <= 1

    # ------------------------------------------------------------ Spark writers
    def writer_claim(self, writer_id: str, client_id: str) -> asyncio.Future[None] | None:
        """Before the first commit under ``writer_id`` this broker sees: bind the id in
        Redis to ``client_id`` unless another client has it already, and learn who has
        it (a future to wait for); None when this broker knows the owner already.
        Each broker keeps the writers in memory, and one that never held a part of the
        owner's commits would otherwise give the id to any client committing under it
        here, whose batch ids would then fence the owner's next batches away."""
        tx = self.server.core.state.transactions
        if writer_id in tx.writers:
            return None
        pending = self._writer_claims.get(writer_id)
        if pending is not None:
            return pending
        tx.check_writer(client_id, writer_id)  # its name and the client's count first
        claim = asyncio.ensure_future(self._bind_writer(writer_id, client_id))
        self._writer_claims[writer_id] = claim
        claim.add_done_callback(lambda _: self._writer_claims.pop(writer_id, None))
        return claim

    async def _bind_writer(self, writer_id: str, client_id: str) -> None:
        try:
            owner = await self._call(self.server.storage.bind_writer, writer_id, client_id)
        except StorageError as exc:
            raise StorageUnavailable(f"cannot bind writer id {writer_id!r} in Redis: "
                                     f"{exc}") from None
        # As stored: the shared state is not written again by the commit that follows.
        self.server.core.state.transactions.writers.setdefault(writer_id, owner)

    # ------------------------------------------------------------ HELLO tokens
    def token_claim(self, token: str) -> asyncio.Future[bool]:
        """Claim a native HELLO token's id in Redis before the WELCOME: whether no broker
        of the cluster had it. Each broker's replay guard knows the ids it saw itself
        only; without this a token used on one opened a connection on every other."""
        jti, expires = _token_id(token)
        return asyncio.ensure_future(self._call(self.server.storage.claim_token, jti,
                                                expires))

    def token_unclaimed(self, token: str) -> None:
        """Redis was out of reach for the claim: the id goes with the next commit."""
        self.server.core.batch.used_tokens.append(_token_id(token))

    # ------------------------------------------------------- link credentials
    def link_credential(self, client_id: str) -> str:
        """What this broker presents, as ``client_id``, to the owner of a queue."""
        expires = int(time.time() + LINK_TTL_S)
        return f"{LINK_PREFIX}.{expires}.{self._sign(client_id, expires)}"

    def _sign(self, client_id: str, expires: int) -> str:
        mac = hmac.new(self.secret, f"{client_id}\0{expires}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")

    def verify_link(self, credential: str, client_id: str) -> None:
        """NotAuthenticated unless another broker of this cluster vouches for
        ``client_id`` with ``credential`` (it authenticated the client itself)."""
        try:
            prefix, expires_s, mac = credential.split(".")
            expires = int(expires_s)
        except ValueError:
            raise NotAuthenticated("malformed link credential", why="bad_link") from None
        if prefix != LINK_PREFIX or not self.secret or not hmac.compare_digest(
                mac, self._sign(client_id, expires)):
            raise NotAuthenticated("link credential refused: not signed with this "
                                   "cluster's link secret", why="bad_link")
        if expires < time.time():
            raise NotAuthenticated("link credential expired", why="link_expired")

    # ------------------------------------------------------------ ownership
    async def settle_in(self) -> None:
        """At start: adopt this broker's share before serving (keep() starts the next
        rebalance only once this one is done)."""
        self._rebalancing = asyncio.ensure_future(self.rebalance())
        await self._rebalancing

    async def keep(self) -> None:
        """Every third of the lease: stay alive, look, adopt and hand over."""
        last_ok, warned, alone = time.monotonic(), False, False
        while True:
            await asyncio.sleep(self.lease_s / 3)
            sent = time.monotonic()
            try:
                await self._call(self._renew)
            except redis.RedisError as exc:
                self.cut_off = True
                out_for = time.monotonic() - last_ok
                if out_for > self.lease_s and len(self.alive) > 1:
                    if await self._others_reach_redis():
                        self.stop_serving(f"Redis at {self.server.storage.path} has been out "
                                          f"of reach for {out_for:.1f} s ({exc}), past the "
                                          "lease, and other brokers reach it to take its "
                                          "queues over")
                        return
                    if not alone:  # Redis itself is down: stopping would serve nobody
                        alone = True
                        log.error("spread: Redis at %s has been out of reach for %.1f s "
                                  "(%s), past the lease, and no other live broker reaches "
                                  "it either: this broker stays up, delivers nothing and "
                                  "refuses publishes until Redis answers, then goes on if "
                                  "no other broker took its queues meanwhile",
                                  self.server.storage.path, out_for, exc)
                    continue
                if not warned and out_for > self.lease_s / 2:
                    warned = True
                    log.error("spread: cannot renew this broker's record on %s: %s",
                              self.server.storage.path, exc)
                continue
            if alone:
                log.warning("spread: Redis at %s answers again", self.server.storage.path)
            if self.cut_off:  # the others' records may have run out meanwhile, as this
                # one's did: a lease for them to renew before their queues are taken
                self.adopt_after = time.monotonic() + self.lease_s
            last_ok, warned, alone = time.monotonic(), False, False
            # Clients registered, approved, revoked, credentials issued on the others.
            self.server.refresh_registry(*self.stored_registry)
            # Woken from a pause, the record just renewed says nothing of the time it
            # had run out: deliveries resume only once no queue held here was taken.
            if not self._still_mine():
                return
            self.seen_from, self.cut_off = sent, False
            # In the background: a hand-over waits for deliveries to settle, and the
            # record must be renewed meanwhile.
            if self._rebalancing is None or self._rebalancing.done():
                self._rebalancing = asyncio.ensure_future(self.rebalance())
            for conn in list(self.server.connections):
                if conn.front is not None:
                    conn.front.sync()
            for front in [*self.http_fronts.values(), *self.fronts]:
                front.sync()

    def _owner_may_be_back(self, queue: str) -> bool:
        """Whether ``queue``'s owner, absent from the alive set, may only have missed its
        renewals while Redis was out of reach for this broker too: within a lease of
        Redis answering again, its queues are left to it (taken, they would fence it and
        it would stop, one broker fewer after a Redis outage every broker lived through)."""
        owner = self.owners.get(queue)
        return owner not in (None, self.member) and time.monotonic() < self.adopt_after

    async def _others_reach_redis(self) -> bool:
        """Whether another live broker (at the last look) renewed its record lately: then
        this one is cut off alone, and the others take its queues over. One that cannot
        be asked (dead, paused) takes nothing."""
        others = [r for m, r in self.addresses.items() if m != self.member]
        # A live broker renews every third of the lease: half of it is already late.
        asked = await asyncio.gather(*(reaches_redis(r, self.lease_s / 2) for r in others))
        return any(asked)

    def redis_seen_s(self) -> float:
        """Seconds since this broker sent the last renewal of its record that landed."""
        return time.monotonic() - self.seen_from

    def _renew(self) -> None:
        self.lease.seen(self.info)
        self._look()

    def _still_mine(self) -> bool:
        """A queue held here but owned by another broker in Redis: this broker was
        dead to the others for a while (paused, cut off) and they took it."""
        taken = sorted(q for q in self.held()
                       if self.owners.get(q, self.member) != self.member)
        if taken:
            self.stop_serving(f"queue(s) {', '.join(taken)} were claimed by another broker")
            return False
        return True

    async def rebalance(self) -> None:
        try:
            await self._rebalance()
        except Exception:  # a bug must not stop the record's renewals
            log.exception("spread: rebalancing failed")

    async def _rebalance(self) -> None:
        if self.server.draining or self.role != "spread":
            return
        for q in sorted(self.queues - self.held() - set(self.adopting)):
            # each looked at again: an adoption awaited before may have made it ours
            if q not in self.owned and self.owner_of(q) == self.member and \
                    not self._owner_may_be_back(q):
                await self.adopt(q)
        held = self.held()
        moves = [(q, target) for q in sorted(held)
                 if (target := placement.owner(q, self.alive)) not in (None, self.member)]
        await asyncio.gather(*(self.hand_over(q, t) for q, t in moves  # type: ignore[arg-type]
                               if q not in self.leaving))

    async def adopt(self, queue: str) -> None:
        await self.adoption(queue)

    async def _adopt(self, queue: str, done: asyncio.Future[None]) -> None:
        server = self.server
        loop = asyncio.get_running_loop()
        try:
            if self._owner_may_be_back(queue):  # a publish for it: it waits until then,
                # and the claim is refused if its owner renewed meanwhile (routed there)
                await asyncio.sleep(self.adopt_after - time.monotonic())
            now = time.time()
            snap = await loop.run_in_executor(server._writer_pool, server.storage.open_queue,
                                              queue, now)
            buckets = await loop.run_in_executor(server._writer_pool, read_buckets,
                                                 server.storage, snap)
            server.core.adopt(snap, now)  # with its buckets' index, before any write to one
            for name, msgs in buckets.items():
                server.core.index_bucket(name, msgs)
            self.owned.add(queue)
            if snap.channels:
                self._note("adopted", queue, previous=self.owners.get(queue))
                self.adopted += 1
                log.info("spread: adopted %s", queue)
            self.owners[queue] = self.member
            self.queues.add(queue)
        except StorageFenced as exc:
            if exc.holder:  # another live broker has it: send its messages there
                self.owners[queue] = exc.holder
            log.info("spread: %s not adopted yet: %s", queue, exc)
        except ValueError as exc:  # the core holds it already: claimed again, still ours
            self.owned.add(queue)
            self.owners[queue] = self.member
            log.warning("spread: %s adopted twice (%s): kept as it was", queue, exc)
        except StorageError as exc:
            log.warning("spread: could not adopt %s: %s", queue, exc)
        finally:
            del self.adopting[queue]
            done.set_result(None)
            server.engine.request_pump()

    async def hand_over(self, queue: str, to: str) -> None:
        """Commit what is staged for ``queue``, give it up in Redis, forget it. Its
        publishes meanwhile wait (front.py routes them again once it is done)."""
        server, core = self.server, self.server.core
        # First what is out settles (publishes go on here meanwhile), so that the
        # hand-over itself delivers nothing twice; past the drain time it goes anyway
        # (what is still out comes again from the new owner, as after a takeover).
        drain_until = time.monotonic() + min(server.settings.default_lease, HANDOVER_DRAIN_S)
        while core.freeze_queue(queue) and time.monotonic() < drain_until \
                and self.role == "spread":
            await asyncio.sleep(0.02)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.leaving[queue] = done
        self.owned.discard(queue)
        try:
            deadline = time.monotonic() + HANDOVER_COMMIT_S
            while core.queue_pending(queue) or not server.scheduler.idle:
                if time.monotonic() > deadline:
                    log.warning("spread: %s not handed over to %s: its writes did not "
                                "commit within %g s", queue, to, HANDOVER_COMMIT_S)
                    self.owned.add(queue)
                    core.freeze_queue(queue, False)
                    return
                server.engine.commit(force=True)
                await asyncio.sleep(0.01)
            forgotten = core.release_queue(queue, time.time())
            try:
                await asyncio.get_running_loop().run_in_executor(
                    server._writer_pool, server.storage.release_queue, queue)
            except StorageError as exc:  # the owner record runs out with this broker
                log.warning("spread: could not give %s up in Redis: %s", queue, exc)
            self.owners.pop(queue, None)
            self.handed += 1
            self._note("handed over", queue, to=to, forgotten=forgotten)
            log.info("spread: handed %s over to %s (%d deliveries in flight come again "
                     "from it)", queue, to, forgotten)
        finally:
            del self.leaving[queue]
            done.set_result(None)

    def _note(self, what: str, queue: str, **detail: Any) -> None:
        self.history.insert(0, {"at": round(time.time(), 3), "what": what, "queue": queue,
                                **detail})
        del self.history[HISTORY_KEPT:]

    # ------------------------------------------------------------- failures
    def lapsed(self, exc: StorageFenced) -> bool:
        """A commit refused only because this broker's own record had run out (its
        shared part; no queue's epoch moved: nobody claimed one): Redis was out of reach
        for it, or it was paused, and it has not renewed since. True: the batch is
        refused as STORAGE_UNAVAILABLE and tried again; the next renewal (a third of the
        lease at most) says whether another broker took its queues (then it stops).
        False: another broker claimed some of them."""
        return not exc.queues and not exc.holder and self.role == "spread"

    def fenced(self, exc: Exception) -> None:
        self.fenced_writes += 1
        self.stop_serving(f"a write was refused (fenced): {exc}")

    def stop_serving(self, why: str) -> None:
        server = self.server
        if self.role != "spread":
            return
        self.role = "lost"
        self.lost += 1
        log.error("%s: this broker was paused or cut off past owner_lease (%g s) and the "
                  "others took its queues or may; it writes nothing more and stops now "
                  "(exit status 1); its clients reconnect to the others", why, self.lease_s)
        server.exit_status = 1
        server.stop_reason = server.stop_reason or "lost its queues"
        server.request_stop()

    # ------------------------------------------------------------- stopping
    async def hand_over_all(self, by: str) -> None:
        """A soft stop: hand every queue to the broker that ranks next for it."""
        self.handing_over = True
        others = [m for m in self.alive if m != self.member]
        await asyncio.gather(*(self.hand_over(q, target) for q in sorted(self.held())
                               if (target := placement.owner(q, others)) is not None
                               and q not in self.leaving))

    async def release(self) -> None:
        """A clean stop: leave the alive set, so the others claim at once."""
        for front in [*self.http_fronts.values(), *self.fronts]:
            front.close()
        if self.role == "spread":
            self.role = "stopped"  # first: once it left, the others claim at once
        try:
            await self._call(self.lease.leave)
        except redis.RedisError as exc:
            log.warning("could not leave the alive set (%s): the others claim this "
                        "broker's queues when its record runs out", exc)
        with contextlib.suppress(Exception):
            await self._call(self.lease.close)
        self._pool.shutdown(wait=False)

    # --------------------------------------------------------------- views
    async def view(self) -> dict[str, Any]:
        """``minou cluster``: the brokers, the queues with their owners, epochs and
        where placement puts them, and the recent adoptions and hand-overs."""
        with contextlib.suppress(redis.RedisError):  # as Redis says now, not at the last look
            await self._call(self._look)
        members = await self._call(self.lease.members)
        for m in members:
            m["role"] = "spread" if m.get("alive") else "gone"
            m["self"] = m["id"] == self.member
            m["queues"] = sorted(q for q, o in self.owners.items() if o == m["id"])
        epochs = dict(self.server.storage.epochs)
        held = self.held()
        queues = []
        for q in sorted(self.queues | set(self.owners)):
            queues.append({"queue": q, "owner": self.owners.get(q),
                           "placed": placement.owner(q, self.alive),
                           "epoch": epochs.get(q) if q in held else None})
        return {"storage": self.server.storage.path, "owner_lease": self.lease_s,
                "placement": "spread", "primary": None, "brokers": members,
                "queues": queues, "events": list(self.history),
                "this_broker": self.status()}

    def status(self) -> dict[str, Any]:
        return {"member": self.member, "role": self.role, "placement": "spread",
                "owner_lease": self.lease_s, "handing_over": self.handing_over,
                "alive": len(self.alive), "queues_owned": len(self.held()),
                "adopted": self.adopted, "handed_over": self.handed, "lost": self.lost,
                "fenced_writes": self.fenced_writes,
                **{k: v for k, v in self.info.items() if k in ("native", "http")}}


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
