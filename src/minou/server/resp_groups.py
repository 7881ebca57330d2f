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
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.broker import Session
from ..errors import RequestError
from ..protocol.frames import Delivery
from .http_consumers import HttpConsumer, HttpConsumers

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server

RESP_LEASE_S = 600.0  # how long a pending entry is held without XACK or XCLAIM
DEFAULT_COUNT = 100  # XREADGROUP without COUNT: a bounded batch chosen here
MAX_COUNT = 10_000


def group_name(group: bytes, channel: str) -> str:
    return f"{group.decode(errors='replace')}@{channel}"


@dataclass
class Pending:
    consumer: bytes  # the Redis consumer name that holds it
    holder: HttpConsumer  # whose lease it is (acks go there)
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
        self.consumers = HttpConsumers(server)
        self.pel: dict[str, dict[int, Pending]] = {}  # group -> seq -> entry
        self.names: dict[str, dict[bytes, float]] = {}  # group -> consumer -> last seen

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
        self.names.setdefault(gname, {})

    def destroy(self, gname: str) -> bool:
        from ..names import consume_group_key

        grp = self.server.core.state.groups.get(consume_group_key(gname))
        if grp is None:
            return False
        for entry in list(self.pel.pop(gname, {}).values()):
            self._settle(entry, "nack")
        for consumer in [c for k, c in self.consumers.by_key.items() if k[1] == gname]:
            self.consumers.close(consumer)
        self.names.pop(gname, None)
        self.server.admin("group.delete", {"group": consume_group_key(gname), "force": True})
        return True

    def consumer(self, identity: Identity, channel: str, gname: str) -> HttpConsumer:
        return self.consumers.get(identity, channel, gname, RESP_LEASE_S)

    def seen(self, gname: str, name: bytes) -> None:
        self.names.setdefault(gname, {})[name] = time.monotonic()

    # ------------------------------------------------------------ pending
    def entries(self, gname: str) -> dict[int, Pending]:
        """The group's live pending entries (leases that ran out are dropped)."""
        pel = self.pel.get(gname)
        if not pel:
            return {}
        for seq in [s for s, e in pel.items() if not e.live]:
            del pel[seq]
        return pel

    def delivered(self, gname: str, name: bytes, holder: HttpConsumer, item: Delivery,
                  noack: bool) -> None:
        if noack:
            self._settle(Pending(name, holder, item, 0.0, 1), "ack")
            return
        self.pel.setdefault(gname, {})[item.seq] = Pending(
            name, holder, item, time.monotonic(), item.attempts)

    def ack(self, gname: str, seqs: list[int]) -> int:
        pel = self.entries(gname)
        done = 0
        for seq in seqs:
            entry = pel.pop(seq, None)
            if entry is not None and self._settle(entry, "ack"):
                done += 1
        return done

    def _settle(self, entry: Pending, op: str) -> bool:
        holder = entry.holder
        try:
            result = self.consumers.settle(holder.identity, f"{holder.token}.{entry.item.tag}",
                                           op)
        except RequestError:
            return False
        if isinstance(result, asyncio.Future):  # on another broker: answered there
            result.add_done_callback(lambda f: f.cancelled() or f.exception())
        return True

    def claim(self, gname: str, name: bytes, min_idle_ms: int, seqs: list[int],
              *, bump: bool = True) -> list[Pending]:
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
        self.seen(gname, name)
        return out

    def unsettled(self) -> int:
        return self.consumers.unsettled()
