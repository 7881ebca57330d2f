"""Consumers over plain HTTP: ``POST /v1/consume/...`` long-polls for one message.

HTTP has no connection to hang deliveries on, so each (client, group, pattern)
gets a broker session of its own, kept while it is used. Its credit is the
number of requests waiting: the broker hands a message out only when somebody
is there to take it, and a message that finds nobody (the request gave up or its
client left in the same instant) goes straight back to the queue, never kept for
a later request. A delivered message carries a receipt (``<consumer>.<tag>``)
for ``/v1/ack`` and ``/v1/nack``; it is leased like any delivery and comes back
if the lease runs out. An idle consumer with nothing unsettled is closed.

Queues spread over brokers (spread.py): the consumer subscribes on every other live
broker too, through a front of its own (front.py), whose credit follows the waiting
requests the same way (``link.credit``); a message from another broker that finds
nobody goes back there as never sent, and its receipt is settled there.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.broker import Session
from ..errors import BadRequest, UnknownDelivery, error_from_code
from ..limits import HTTP_CONSUMER_IDLE_S, MAX_SUBSCRIPTIONS, MIN_HTTP_WAIT_S
from ..protocol import frames as f
from ..protocol.frames import Delivery
from .front import REMOTE_TAGS, Front, Unpaced

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from ..core.group import Subscription
    from .ports import Server


SID = 1  # an HTTP consumer's one subscription


class HttpConsumer(Unpaced):
    def __init__(self, owner: HttpConsumers, key: tuple[str, str, str, float | None],
                 identity: Identity) -> None:
        self.owner = owner
        self.key = key
        self.identity = identity
        self.token = secrets.token_hex(8)
        self.waiters: deque[asyncio.Future[Delivery]] = deque()
        self.last_used = time.monotonic()
        self.session: Session | None = None
        self.sub: Subscription | None = None
        self.front: Front | None = None  # queues spread over brokers: the others' part
        self.closed = False

    # what a front needs of the door it serves (front.Door), flush and pauses aside
    @property
    def server(self) -> Server:
        return self.owner.server

    @property
    def engine(self) -> Any:
        return self.owner.server.engine

    # the broker's pump calls this like it calls a native connection
    def send_deliveries(self, sid: int, items: list[Delivery]) -> None:
        for item in items:
            self._hand(item)

    def _hand(self, item: Delivery) -> None:
        """To the first request still waiting; with none left, back to the queue."""
        while self.waiters and self.waiters[0].done():
            self.waiters.popleft()
        if self.waiters:
            self.waiters.popleft().set_result(item)
        else:
            self.give_back(item)

    def give_back(self, item: Delivery) -> None:
        """A delivery nobody is there to take (its request went away): back to the front
        of its queue at once, as if never sent. It is never kept for a later request: a
        consumer with no request waiting holds nothing and has no credit, so the other
        consumers of the group get the message now, not when a lease runs out."""
        server = self.owner.server
        if item.tag >= REMOTE_TAGS and self.front is not None:
            self._credit()
            self.front.give_back(SID, item.tag)
            return
        if self.session is not None:
            server.core.withdraw(self.session, [item.tag], time.time())
        self._credit()
        server.engine.changed()

    def send(self, frame: Any) -> None:
        """Errors the broker would push to a connection (an ended subscription); a
        front's replies are nothing to act on."""
        if isinstance(frame, f.Error):
            self.owner.close(self)

    def leases_expired(self) -> None:
        """The core took deliveries back: what they held of the credit is free again."""
        self._credit()

    def _credit(self) -> None:
        """Credit is the number of requests waiting, no more."""
        sub = self.sub
        if sub is None:
            return
        wanted = sum(not w.done() for w in self.waiters)
        sub.prefetch = sub.unsettled + wanted
        if self.front is not None:
            self.front.credit(SID, wanted)
        if wanted and self.session is not None:
            self.owner.server.wake_groups(self.session)

    def take(self, wait: float, done: Callable[[Delivery | None], None]
             ) -> Callable[[], object]:
        """Call ``done`` with the next delivery, or with None after ``wait`` seconds
        without one (``wait=0`` still gives the broker a moment to hand over a message
        that is ready). Returns a function that gives up waiting."""
        self.last_used = time.monotonic()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Delivery] = loop.create_future()
        self.waiters.append(fut)
        self._credit()

        def give_up() -> None:
            # The credit goes at once, not when the callback below runs: the pump may
            # run first, and must not hand this request a message it will not answer.
            if not fut.done():
                fut.cancel()
                self._credit()

        timer = loop.call_later(max(wait, MIN_HTTP_WAIT_S), give_up)

        def finished(fut: asyncio.Future[Delivery]) -> None:
            timer.cancel()
            if fut in self.waiters:
                self.waiters.remove(fut)
            self.last_used = time.monotonic()
            self._credit()
            done(None if fut.cancelled() else fut.result())

        fut.add_done_callback(finished)
        return give_up

    async def next(self, wait: float) -> Delivery | None:
        got: asyncio.Future[Delivery | None] = asyncio.get_running_loop().create_future()

        def done(item: Delivery | None) -> None:
            if not got.done():
                got.set_result(item)
            elif item is not None:
                self.give_back(item)  # the request was cancelled meanwhile

        give_up = self.take(wait, done)
        try:
            return await got
        except asyncio.CancelledError:
            give_up()
            raise


class HttpConsumers:
    def __init__(self, server: Server) -> None:
        self.server = server
        # (client, group, pattern, lease): a lease is a subscription's, so requests asking
        # for another one get a consumer of their own.
        self.by_key: dict[tuple[str, str, str, float | None], HttpConsumer] = {}
        self.by_token: dict[str, HttpConsumer] = {}

    def get(self, identity: Identity, pattern: str, group: str | None,
            lease: float | None) -> HttpConsumer:
        key = (identity.client_id, group or pattern, pattern, lease)
        consumer = self.by_key.get(key)
        if consumer is not None:
            return consumer
        server = self.server
        server.engine.check_accepting()  # before the client's consumer count is looked at
        mine = sum(k[0] == identity.client_id for k in self.by_key)
        if mine >= MAX_SUBSCRIPTIONS:
            raise BadRequest(f"client {identity.client_id!r} has {mine} HTTP consumers (one per "
                             f"group and pattern; the limit is {MAX_SUBSCRIPTIONS}): use "
                             "fewer patterns, or a pattern with * for many channels")
        consumer = HttpConsumer(self, key, identity)
        session = Session(identity.client_id, consumer, access=server.access_for(identity),
                          admin=identity.admin)
        sub = server.engine.subscribe(
            session, SID, kind="consume", patterns=[pattern], group=group, prefetch=1,
            lease=lease or 0.0)
        sub.prefetch = 0  # credit comes from waiting requests only
        sub.on_demand = True
        consumer.session, consumer.sub = session, sub
        if server.spread is not None:
            # prefetch 1 until the first credit: never the channel's default there
            consumer.front = server.spread.front_for(consumer)
            consumer.front.subscribe(f.Subscribe(0, SID, "consume", [pattern], group, "", 1,
                                                 lease or 0.0), f.Result(0, None))
        self.by_key[key] = consumer
        self.by_token[consumer.token] = consumer
        return consumer

    def _find(self, identity: Identity, receipt: str) -> tuple[HttpConsumer, int]:
        token, _, tag = receipt.partition(".")
        consumer = self.by_token.get(token)
        if consumer is None or consumer.identity.client_id != identity.client_id \
                or not (tag.isascii() and tag.isdigit()):
            raise UnknownDelivery(f"receipt {receipt!r} is unknown, already settled or "
                                  "expired", receipt=receipt)
        consumer.last_used = time.monotonic()
        return consumer, int(tag)

    def settle(self, identity: Identity, receipt: str, op: str, **kw: Any
               ) -> asyncio.Future[None] | None:
        """Settle a receipt here (None: done, durable with the next commit), or where it
        was delivered (queues spread over brokers): a future of that broker's answer."""
        consumer, tag = self._find(identity, receipt)
        assert consumer.session is not None
        if tag >= REMOTE_TAGS and consumer.front is not None:
            return self._settle_remote(consumer.front, receipt, op, tag, **kw)
        failed = self.server.engine.settle(consumer.session, op, [tag], None, **kw)
        if failed:
            raise UnknownDelivery(f"receipt {receipt!r}: {failed[0][2]}", receipt=receipt)
        consumer._credit()

    @staticmethod
    def _settle_remote(front: Front, receipt: str, op: str, tag: int, **kw: Any
                       ) -> asyncio.Future[None]:
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(failed: list[tuple[int, int, str]]) -> None:
            if answered.done():
                return
            if failed:
                _, code, text = failed[0]
                answered.set_exception(error_from_code(code, f"receipt {receipt!r}: {text}",
                                                       {"receipt": receipt}))
            else:
                answered.set_result(None)

        frame = f.Ack(0, [tag]) if op == "ack" else f.Nack(0, [tag], **kw)
        front.settle(frame, [tag], done)
        return answered

    def end_waits(self) -> None:
        """The broker is stopping: every long poll still waiting is answered now (no
        message: 204) rather than holding the stop up until its wait ends."""
        for consumer in list(self.by_key.values()):
            for fut in list(consumer.waiters):
                if not fut.done():
                    fut.cancel()

    def close(self, consumer: HttpConsumer) -> None:
        self.by_key.pop(consumer.key, None)
        self.by_token.pop(consumer.token, None)
        consumer.closed = True
        if consumer.front is not None:
            consumer.front.close()
        for fut in consumer.waiters:
            if not fut.done():
                fut.cancel()
        if consumer.session is not None:
            self.server.engine.close(consumer.session)
            consumer.session = None

    def sweep(self, now: float) -> None:
        """Close consumers nobody used for a while once nothing of theirs is unsettled."""
        mono = time.monotonic()
        for consumer in list(self.by_key.values()):
            sub = consumer.sub
            idle = mono - consumer.last_used > max(HTTP_CONSUMER_IDLE_S, sub.lease_s if sub else 0)
            if idle and not consumer.waiters and (sub is None or sub.unsettled == 0):
                self.close(consumer)

    def unsettled(self) -> int:
        return sum(c.sub.unsettled for c in self.by_key.values() if c.sub is not None)
