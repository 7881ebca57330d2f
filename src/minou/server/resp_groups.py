"""Redis Streams consumer groups over minou's groups (docs/redis-protocol.md).

A Redis group ``g`` on stream key ``k`` is the minou consumer group ``g@<channel>``
(Redis groups belong to one stream; minou's are named broker-wide). Deliveries come
from a detached consumer per (client, group) — the HTTP door's kind
(``http_consumers.HttpConsumer``): its credit is the reads waiting, so a message is
handed out only to an XREADGROUP that is there to take it — leased for
``RESP_LEASE_S`` (Redis keeps a pending entry until it is acknowledged or claimed;
minou gives it back to the group once that long has passed without an XACK).

The **pending entries list** (``Pending``) is kept here, per group: which Redis
consumer name holds each delivered message, since when, how many deliveries. XACK
settles the lease, XCLAIM / XAUTOCLAIM move an entry to another consumer name (the
lease stays with the detached consumer that holds it, so the acknowledgement goes
there, whoever sent it). A lease that ran out is gone from the list.

The **consumer names** a group has seen (XGROUP CREATECONSUMER, XREADGROUP, XCLAIM) are
kept as Redis keeps them, but bounded: ``MAX_CONSUMER_NAME`` bytes each,
``MAX_CONSUMERS_PER_GROUP`` per group, ``MAX_CONSUMER_NAMES`` in all, of which
``MAX_CONSUMER_NAMES_PER_CLIENT`` made by one client; past a bound a new name is refused.
A name is counted for the client that made it known to its group (its **maker**), for as
long as the group keeps it: another client using the same name uses it without a slot
of its own, and the maker gets its slot back when the name goes (forgotten idle, XGROUP
DELCONSUMER, the group destroyed or deleted through another door). A name not used for
``IDLE_S`` that holds no pending entry is forgotten (workers named per process start
would otherwise fill a group in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.broker import Session
from ..errors import BadRequest, QueueFull
from ..limits import (
    MAX_CONSUMER_NAME,
    MAX_CONSUMER_NAMES,
    MAX_CONSUMER_NAMES_PER_CLIENT,
    MAX_CONSUMERS_PER_GROUP,
    MAX_SUBSCRIPTIONS,
    MIN_HTTP_WAIT_S,
)
from ..protocol import frames as f
from ..protocol.frames import Delivery
from . import oplog
from .front import Unpaced

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server

RESP_LEASE_S = 600.0  # how long a pending entry is held without XACK or XCLAIM
DEFAULT_COUNT = 100  # XREADGROUP without COUNT: a bounded batch chosen here
MAX_COUNT = 10_000
MAX_PENDING = 100_000  # a group's pending entries on one broker: then XREADGROUP refuses
IDLE_S = 300.0  # a consumer (or a consumer name) unused this long, holding nothing, goes
# Idle names are looked for this often: a group whose idle names hold entries would
# otherwise have its pending list scanned at every sweep.
NAMES_SWEEP_S = 30.0
SID = 1  # a consumer's one subscription


def group_name(group: bytes, channel: str) -> str:
    return f"{group.decode(errors='replace')}@{channel}"


class _Read:
    """One XREADGROUP waiting on a consumer: up to ``want`` messages."""

    __slots__ = ("done", "items", "timer", "want")

    def __init__(self, want: int, done: Callable[[list[Delivery]], None]) -> None:
        self.want = want
        self.items: list[Delivery] = []
        self.done: Callable[[list[Delivery]], None] | None = done
        self.timer: asyncio.TimerHandle | None = None


class RespConsumer(Unpaced):
    """A detached session reading one channel in one group for one client, whose
    credit is what the XREADGROUPs waiting on it want, no more: a batch is handed to
    the first read in one go (the engine's one delivery call), and the read answers
    once the broker's pump is done with it. What finds no read goes back at once."""

    def __init__(self, owner: RespGroups, key: tuple[str, str], identity: Identity) -> None:
        self.owner = owner
        self.key = key
        self.identity = identity
        self.token = secrets.token_hex(8)
        self.reads: deque[_Read] = deque()
        self.session: Session | None = None
        self.sub: Any = None
        self.last_used = time.monotonic()
        self.closed = False

    @property
    def server(self) -> Server:
        return self.owner.server

    @property
    def engine(self) -> Any:
        return self.owner.server.engine

    def send_deliveries(self, sid: int, items: list[Delivery]) -> None:
        """``items`` in order to the waiting reads, each up to what it wants; what
        none wants goes back."""
        loop = asyncio.get_running_loop()
        given = 0
        for read in self.reads:
            if given >= len(items):
                break
            room = read.want - len(read.items)
            if read.done is None or room <= 0:
                continue
            if not read.items:
                loop.call_soon(self._finish, read)  # once this hand-over is complete
            read.items += items[given:given + room]
            given += room
        for item in items[given:]:
            self.give_back(item)

    def give_back(self, item: Delivery) -> None:
        if self.session is not None:
            self.server.core.withdraw(self.session, [item.tag], time.time())
        self._credit()
        self.server.engine.changed()

    def send(self, frame: Any) -> None:
        if isinstance(frame, f.Error):  # its subscription was ended (a group deleted)
            self.owner.close(self)

    def leases_expired(self) -> None:
        self._credit()

    def _credit(self) -> None:
        sub = self.sub
        if sub is None:
            return
        wanted = sum(r.want - len(r.items) for r in self.reads if r.done)
        sub.prefetch = sub.unsettled + wanted
        if wanted and self.session is not None:
            self.server.wake_groups(self.session)

    def take(self, want: int, wait: float, done: Callable[[list[Delivery]], None]
             ) -> Callable[[], None]:
        """``done(items)`` with up to ``want`` messages as soon as some came, or with
        none after ``wait`` seconds (0: the broker's moment to hand over what is
        ready). Returns a function that ends the read now (its items are answered)."""
        self.last_used = time.monotonic()
        read = _Read(want, done)
        self.reads.append(read)
        read.timer = asyncio.get_running_loop().call_later(
            max(wait, MIN_HTTP_WAIT_S), self._finish, read)
        self._credit()
        return lambda: self._finish(read)

    def _finish(self, read: _Read) -> None:
        done, read.done = read.done, None
        if done is None:
            return
        if read.timer is not None:
            read.timer.cancel()
        with contextlib.suppress(ValueError):
            self.reads.remove(read)
        self.last_used = time.monotonic()
        self._credit()
        done(read.items)


@dataclass(slots=True)
class Pending:
    consumer: bytes  # the Redis consumer name that holds it
    holder: RespConsumer  # whose lease it is (acks go there)
    item: Delivery
    since: float  # monotonic: its last delivery or claim
    count: int  # deliveries (claims count too, as in Redis)

    @property
    def live(self) -> bool:
        session = self.holder.session
        return session is not None and self.item.tag in session.leases


class RespGroups:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.consumers: dict[tuple[str, str], RespConsumer] = {}  # (client, group) ->
        self.pel: dict[str, dict[int, Pending]] = {}  # group -> seq -> entry
        # group -> consumer name -> last used (monotonic), least recently used first
        self.names: dict[str, dict[bytes, float]] = {}
        self.name_count = 0  # over every group (MAX_CONSUMER_NAMES)
        # group -> consumer name -> its maker, the client it is counted for, and each
        # maker's count over every group (MAX_CONSUMER_NAMES_PER_CLIENT)
        self.makers: dict[str, dict[bytes, str]] = {}
        self.made: Counter[str] = Counter()
        self.share_logged: set[str] = set()  # refused at their share, not below it since
        self.names_swept = time.monotonic()
        # miniqueue's dackCount: (channel, seq) -> DACKs so far, until the message is
        # acknowledged; oldest first out past MAX_PENDING (a count, not a message)
        self.dacks: dict[tuple[str, int], int] = {}

    def dacked(self, channel: str, seq: int) -> int:
        """One more DACK of message ``seq`` of ``channel``: its count now."""
        key = (channel, seq)
        count = self.dacks.pop(key, 0) + 1
        self.dacks[key] = count
        if len(self.dacks) > MAX_PENDING:
            del self.dacks[next(iter(self.dacks))]
        return count

    # ------------------------------------------------------------ groups
    def exists(self, gname: str) -> bool:
        return f"consume:{gname}" in self.server.core.state.groups

    def create(self, identity: Identity, channel: str, gname: str, start: str) -> None:
        """Create the minou group at ``start`` ('new', 'oldest' or 'seq:<n>'): a
        subscription of a session made for it, closed at once (the group stays)."""
        server = self.server
        session = Session(identity.client_id, None, access=server.access_for(identity),
                          admin=identity.admin)
        server.engine.subscribe(session, 1, kind="consume", patterns=[channel],
                                group=gname, start=start, prefetch=1, lease=0.0)
        server.engine.close(session)
        self.drop_names(gname)  # those of a group of that name deleted through another door
        self.names[gname] = {}

    def destroy(self, gname: str) -> bool:
        from ..names import consume_group_key

        grp = self.server.core.state.groups.get(consume_group_key(gname))
        if grp is None:
            return False
        for entry in list(self.pel.pop(gname, {}).values()):
            self._settle(entry, "nack")
        for consumer in [c for k, c in self.consumers.items() if k[1] == gname]:
            self.close(consumer)
        self.drop_names(gname)
        self.server.admin("group.delete", {"group": consume_group_key(gname), "force": True})
        return True

    def set_position(self, identity: Identity, channel: str, gname: str, seq: int) -> None:
        """XGROUP SETID: the group reads ``channel`` from ``seq`` on. Its readers here
        give back what they hold first (Redis keeps a moved group's pending entries;
        here they return to the group, read again from the new position if after it)."""
        for entry in list(self.pel.pop(gname, {}).values()):
            self._settle(entry, "nack")
        for consumer in [c for k, c in self.consumers.items() if k[1] == gname]:
            self.close(consumer)
        server = self.server
        session = Session(identity.client_id, None, access=server.access_for(identity),
                          admin=identity.admin)
        server.engine.subscribe(session, 1, kind="consume", patterns=[channel],
                                group=gname, start=f"seq:{max(1, seq)}", prefetch=1,
                                lease=0.0)
        server.engine.close(session)

    def consumer(self, identity: Identity, channel: str, gname: str) -> RespConsumer:
        key = (identity.client_id, gname)
        consumer = self.consumers.get(key)
        if consumer is not None:
            return consumer
        server = self.server
        server.engine.check_accepting()
        mine = sum(k[0] == identity.client_id for k in self.consumers)
        if mine >= MAX_SUBSCRIPTIONS:
            raise BadRequest(f"client {identity.client_id!r} reads {mine} groups over the "
                             f"Redis protocol (the limit is {MAX_SUBSCRIPTIONS})")
        consumer = RespConsumer(self, key, identity)
        session = Session(identity.client_id, consumer, access=server.access_for(identity),
                          admin=identity.admin)
        sub = server.engine.subscribe(session, SID, kind="consume", patterns=[channel],
                                      group=gname, prefetch=1, lease=RESP_LEASE_S)
        sub.prefetch = 0  # credit comes from waiting reads only
        sub.on_demand = True
        consumer.session, consumer.sub = session, sub
        self.consumers[key] = consumer
        return consumer

    def close(self, consumer: RespConsumer) -> None:
        self.consumers.pop(consumer.key, None)
        consumer.closed = True
        for read in list(consumer.reads):
            consumer._finish(read)
        if consumer.session is not None:
            self.server.engine.close(consumer.session)
            consumer.session = None

    def sweep(self, now: float) -> None:
        """Close consumers nobody read with for a while once they hold nothing; now and
        then, forget the consumer names likewise."""
        mono = time.monotonic()
        for consumer in list(self.consumers.values()):
            sub = consumer.sub
            if mono - consumer.last_used > IDLE_S and not consumer.reads and \
                    (sub is None or sub.unsettled == 0):
                self.close(consumer)
        if mono - self.names_swept >= NAMES_SWEEP_S:
            self.names_swept = mono
            self.forget_idle(mono)

    # ------------------------------------------------------------ consumer names
    def admit(self, gname: str, name: bytes, who: Identity, *, more: int = 0) -> bool:
        """Raise unless ``name`` is, or may become, one of the group's consumer names
        (made by ``who`` after ``more`` other new names the same command makes); return
        whether it is new."""
        if len(name) > MAX_CONSUMER_NAME:
            raise BadRequest(f"consumer name is {len(name)} bytes, the limit is "
                             f"{MAX_CONSUMER_NAME}", limit=MAX_CONSUMER_NAME)
        names = self.names.get(gname, {})
        if name in names:
            return False
        forgotten = f"(one unused for {IDLE_S:.0f} s that holds no pending entry is forgotten)"
        if len(names) >= MAX_CONSUMERS_PER_GROUP:
            raise QueueFull(f"group {gname!r} has {len(names)} consumer names (the limit is "
                            f"{MAX_CONSUMERS_PER_GROUP}); reuse a name, or XGROUP DELCONSUMER "
                            f"those no longer used {forgotten}",
                            limit=MAX_CONSUMERS_PER_GROUP)
        if not who.admin:
            self._check_share(who.client_id, self.made[who.client_id] + more, forgotten)
        if self.name_count + more >= MAX_CONSUMER_NAMES:
            raise QueueFull(f"the broker keeps {self.name_count} consumer names over every "
                            f"group (the limit is {MAX_CONSUMER_NAMES}); reuse a name, or "
                            f"XGROUP DELCONSUMER those no longer used {forgotten}",
                            limit=MAX_CONSUMER_NAMES)
        return True

    def _check_share(self, client_id: str, made: int, forgotten: str) -> None:
        if made < MAX_CONSUMER_NAMES_PER_CLIENT:
            return
        if client_id not in self.share_logged:  # once until it goes below its share
            self.share_logged.add(client_id)
            oplog.share_used(client_id, f"{made} Redis consumer names",
                             MAX_CONSUMER_NAMES_PER_CLIENT)
        raise QueueFull(f"client {client_id!r} made {made} of the consumer names this broker "
                        f"keeps over every group (a client may make "
                        f"{MAX_CONSUMER_NAMES_PER_CLIENT} of the {MAX_CONSUMER_NAMES}, so that "
                        f"no one uses them all); reuse a name, or XGROUP DELCONSUMER those no "
                        f"longer used {forgotten}",
                        client=client_id, limit=MAX_CONSUMER_NAMES_PER_CLIENT)

    def seen(self, gname: str, name: bytes, who: Identity) -> None:
        """``name`` used with the group by ``who`` now (raises as ``admit`` does)."""
        self.admit(gname, name, who)
        self._touch(self.names.setdefault(gname, {}), gname, name, who.client_id)

    def _touch(self, names: dict[bytes, float], gname: str, name: bytes,
               client_id: str) -> None:
        if names.pop(name, None) is None:  # new: counted for its maker
            self.name_count += 1
            self.makers.setdefault(gname, {})[name] = client_id
            self.made[client_id] += 1
        names[name] = time.monotonic()  # at the end: the least recently used stay first

    def forget(self, gname: str, name: bytes) -> None:
        """The group no longer keeps ``name``: its slot goes back to its maker."""
        names = self.names.get(gname)
        if names is None or names.pop(name, None) is None:
            return
        self.name_count -= 1
        self._unmade(self.makers[gname].pop(name))

    def _unmade(self, client_id: str, count: int = 1) -> None:
        left = self.made[client_id] - count
        if left > 0:
            self.made[client_id] = left
        else:  # a client id seen once is not kept for ever
            del self.made[client_id]
        if left < MAX_CONSUMER_NAMES_PER_CLIENT:
            self.share_logged.discard(client_id)

    def drop_names(self, gname: str) -> None:
        """Forget every name of the group (destroyed, deleted, or made anew)."""
        self.name_count -= len(self.names.pop(gname, {}))
        for client_id, count in Counter(self.makers.pop(gname, {}).values()).items():
            self._unmade(client_id, count)

    def group_deleted(self, key: str) -> None:
        """The minou group ``key`` was deleted (by an admin, through any door)."""
        if key.startswith("consume:"):
            self.drop_names(key.removeprefix("consume:"))

    def forget_idle(self, mono: float) -> None:
        """Forget the names not used for ``IDLE_S`` that hold no pending entry (a group
        whose first, least recently used, name is recent has none: passed over)."""
        for gname, names in list(self.names.items()):
            if not self.exists(gname):  # deleted by another door (idle expiry of its stream)
                self.drop_names(gname)
                continue
            if not names or mono - next(iter(names.values())) <= IDLE_S:
                continue
            held = {e.consumer for e in self.entries(gname).values()}
            for name, seen in list(names.items()):
                if mono - seen <= IDLE_S:
                    break
                if name not in held:
                    self.forget(gname, name)

    def consumer_pending(self, gname: str) -> Counter[bytes]:
        """Pending entries per consumer name, in one pass over the group's list."""
        return Counter(e.consumer for e in self.entries(gname).values())

    # ------------------------------------------------------------ pending
    def entries(self, gname: str) -> dict[int, Pending]:
        """The group's live pending entries (leases that ran out are dropped)."""
        pel = self.pel.get(gname)
        if not pel:
            return {}
        for seq in [s for s, e in pel.items() if not e.live]:
            del pel[seq]
        return pel

    def _delivered_to(self, gname: str, name: bytes, holder: RespConsumer) -> None:
        """A read's name is used again when it is answered (it was admitted when the
        read began; a long block may have outlived its idle time and it was forgotten:
        back, past the bounds by as many reads as waited so, made by the reader)."""
        names = self.names.get(gname)
        if names is not None:  # (none: the group was destroyed meanwhile)
            self._touch(names, gname, name, holder.identity.client_id)

    def delivered(self, gname: str, name: bytes, holder: RespConsumer, item: Delivery,
                  noack: bool) -> None:
        self._delivered_to(gname, name, holder)
        if noack:
            self._settle(Pending(name, holder, item, 0.0, 1), "ack")
            return
        self.pel.setdefault(gname, {})[item.seq] = Pending(
            name, holder, item, time.monotonic(), item.attempts)

    def pending(self, gname: str) -> int:
        """How many entries the group has pending (``len(entries(gname))``, without
        looking at each while far from the limit)."""
        pel = self.pel.get(gname)
        if not pel:
            return 0
        return len(pel) if len(pel) < MAX_PENDING else len(self.entries(gname))

    def delivered_all(self, gname: str, name: bytes, holder: RespConsumer,
                      items: list[Delivery], noack: bool) -> None:
        """``delivered`` for each of ``items``, handed over together."""
        self._delivered_to(gname, name, holder)
        if noack:
            for item in items:
                self.delivered(gname, name, holder, item, True)
            return
        pel = self.pel.setdefault(gname, {})
        now = time.monotonic()
        for item in items:
            pel[item.seq] = Pending(name, holder, item, now, item.attempts)

    def ack(self, gname: str, seqs: list[int]) -> int:
        """XACK: settle the pending ones among ``seqs`` (one settle per holder)."""
        pel = self.pel.get(gname)
        if not pel:
            return 0
        by_holder: dict[RespConsumer, list[Pending]] = {}
        for seq in seqs:
            entry = pel.pop(seq, None)
            if entry is not None and entry.live:  # only these: a scan of all is O(pending)
                by_holder.setdefault(entry.holder, []).append(entry)
        return sum(self._settle_all(holder, entries, "ack")
                   for holder, entries in by_holder.items())

    def _settle(self, entry: Pending, op: str) -> bool:
        return self._settle_all(entry.holder, [entry], op) == 1

    def _settle_all(self, holder: RespConsumer, entries: list[Pending], op: str) -> int:
        if holder.session is None:
            return 0
        tags = [e.item.tag for e in entries]
        failed = self.server.engine.settle(holder.session, op, tags, None)
        holder._credit()
        return len(tags) - len(failed or [])

    def claim(self, gname: str, name: bytes, who: Identity, min_idle_ms: int,
              seqs: list[int], *, bump: bool = True) -> list[Pending]:
        self.seen(gname, name, who)  # first: a name refused claims nothing
        pel = self.entries(gname)
        now = time.monotonic()
        out = []
        for seq in seqs:
            entry = pel.get(seq)
            if entry is None or (now - entry.since) * 1000 < min_idle_ms:
                continue
            entry.consumer, entry.since = name, now
            if bump:
                entry.count += 1
            out.append(entry)
        return out

    def unsettled(self) -> int:
        return sum(c.sub.unsettled for c in self.consumers.values() if c.sub is not None)
