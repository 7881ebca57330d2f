"""The core tests' harness: the engine itself (``server/engine.py``) over a memory
storage, with explicit time and a writer that writes only when told.

The harness is the engine's ``Host`` in place of the asyncio server: ``publish``
and the settlements go through ``Engine``, whose commits wait until the test calls
``commit`` (one take, one ``apply`` to the storage, ``Engine.committed``); ``pump``
collects deliveries per subscription and answers the core's load requests from the
storage, as the server does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

from minou.auth.rules import ALLOW_ALL
from minou.core.broker import Broker, Session
from minou.core.group import Subscription
from minou.core.writes import WriteBatch
from minou.limits import STORAGE_READ_BYTES
from minou.protocol.frames import Delivery, Outcome, Send
from minou.server import engine
from minou.storage.base import Storage
from minou.storage.memory import MemoryStorage

_STORES = itertools.count()

T0 = 1_000.0
PAGE = 2_000


def js(value: Any) -> bytes:
    """``value`` as JSON bytes (a valid payload)."""
    return json.dumps(value).encode()


def send(channel: str, value: Any = None, **kw: Any) -> Send:
    """A Send of ``value`` (JSON) to ``channel``; ``kw`` are Send's other fields."""
    return Send(channel, js(value), **kw)


def seqs(items: list[Delivery]) -> list[int]:
    return [d.seq for d in items]


def payloads(items: list[Delivery]) -> list[Any]:
    return [json.loads(d.data) for d in items]


def tags(items: list[Delivery]) -> list[int]:
    return [d.tag for d in items]


class Harness:
    """One broker, its engine, a clock, and a storage every commit goes to (a fresh
    memory store unless one is given)."""

    def __init__(
        self, *, now: float = T0, storage: Storage | None = None, broker: Broker | None = None,
        **broker_kw: Any,
    ) -> None:
        self.broker = broker if broker is not None else Broker(**broker_kw)
        self.now = now
        if storage is None:
            storage = MemoryStorage(f"harness-{next(_STORES)}")
            MemoryStorage.forget(storage.name)
            storage = MemoryStorage(storage.name)
            storage.open(now)
        self.storage = storage
        self.loads: list[engine.Load] = []  # every load pump() answered
        self.read_bytes = STORAGE_READ_BYTES  # a page read back stops there, as the server's
        self._writing = False  # the writer takes a batch only inside commit()
        self._written: list[WriteBatch] = []
        self.replies: list[tuple[list[Outcome], Any]] = []  # what publishes were answered
        self.paused = False  # flow control paused this publisher (the disk is behind)

    @property
    def broker(self) -> Broker:
        return self.engine.core

    @broker.setter
    def broker(self, broker: Broker) -> None:
        """A test may swap the broker (a restart): the engine is built around it."""
        self.engine = engine.Engine(broker, self, settle_delay=0.01,
                                    pause_bytes=lambda: 1 << 40, resume_bytes=1 << 20,
                                    clock=lambda: self.now, monotonic=lambda: self.now)

    # ---------------------------------------------------- the engine's host
    def write(self, batch: WriteBatch) -> None:
        self._written.append(batch)

    def call_soon(self, callback: Callable[[], None]) -> None:
        pass  # pump() runs the engine's pump turn by turn

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        pass  # commits happen when the test says

    def load(self, load: engine.Load) -> None:
        raise AssertionError("pump() answers loads itself")

    def backing_off(self) -> bool:
        return not self._writing

    # ---------------------------------------------------------------- time
    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def tick(self, seconds: float = 0.0) -> None:
        """Move the clock on by ``seconds`` and run the broker's timers."""
        self.advance(seconds)
        self.store_attempts()
        self.broker.tick(self.now)

    def store_attempts(self) -> None:
        """What the server's writer does within milliseconds of a delivery: store its
        attempt count. Settling, ticking and disconnecting start with it here, because a
        message that comes back goes out again only once that count is stored."""
        if self.broker.has_dirty:
            self.commit()

    # ------------------------------------------------------------- publish
    def publish(self, *sends: Send, commit: bool = True, resp_door: bool = False
                ) -> list[Outcome]:
        """Publish through the engine; the outcomes as known now (``replies`` gets the
        final ones once their commit is durable). ``resp_door``: as the Redis door does."""
        outcomes = self.engine.publish(sends, ALLOW_ALL, self._replied, publisher=self,
                                       resp_door=resp_door)
        if commit:
            self.commit()
        return outcomes

    def _replied(self, outcomes: list[Outcome], failure: Any) -> None:
        self.replies.append((outcomes, failure))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def publish_values(self, channel: str, values: list[Any], **kw: Any) -> list[Outcome]:
        return self.publish(*(send(channel, v, **kw) for v in values))

    def commit(self) -> WriteBatch:
        """One group commit, as the server's writer does it: the engine hands over the
        batch, the storage applies it, the engine answers what waited for it."""
        self._writing = True
        try:
            self.engine.commit(force=True)
        finally:
            self._writing = False
        if not self._written:  # nothing staged: an empty commit, as before
            batch = self.broker.take_writes()
            self.broker.on_committed(batch, self.now)
            return batch
        batch = self._written.pop(0)
        self.storage.apply(batch)
        self.engine.committed(batch)
        return batch

    # ------------------------------------------------------------ readers
    def subscribe(
        self, session: Session, sid: int = 1, *, kind: str = "consume",
        patterns: list[str] | str, **kw: Any,
    ) -> Subscription:
        if isinstance(patterns, str):
            patterns = [patterns]
        return self.broker.subscribe(session, sid, kind=kind, patterns=patterns, now=self.now,
                                     **kw)

    def pump(self) -> dict[Subscription, list[Delivery]]:
        """Everything deliverable now, per subscription, loading from storage as needed:
        the engine's pump (server/engine.py), turn after turn, as the server runs it."""
        out: dict[Subscription, list[Delivery]] = {}
        for _ in range(100):
            turn = engine.pump(self.broker, self.now)
            for sub, items in turn.deliveries.items():
                out.setdefault(sub, []).extend(items)
            if not turn.loads:
                return out
            for load in turn.loads:
                self.loads.append(load)
                self.serve_load(load)
        raise AssertionError("pump kept asking for loads")

    def serve_load(self, load: engine.Load) -> None:
        """What the server's ``_load`` does: read a page (at most ``PAGE`` messages and
        ``read_bytes`` of them), hand it to the engine."""
        msgs = self.storage.read_range(load.channel, load.from_seq, load.upto, PAGE,
                                       self.read_bytes)
        self.engine.loaded(load, msgs, PAGE, self.read_bytes)

    def take(self, sub: Subscription) -> list[Delivery]:
        """Pump and return what ``sub`` got (other subscriptions' deliveries are dropped)."""
        return self.pump().get(sub, [])

    # ---------------------------------------------------------- settling
    def ack(self, session: Session, items: list[Delivery] | list[int]) -> list[Any]:
        return self.engine.settle(session, "ack", _tags(items), None)

    def nack(
        self, session: Session, items: list[Delivery] | list[int], *, delay: float = 0.0,
        front: bool = True,
    ) -> list[Any]:
        self.store_attempts()
        return self.engine.settle(session, "nack", _tags(items), None, delay=delay,
                                  front=front)

    def extend(self, session: Session, items: list[Delivery] | list[int], seconds: float
               ) -> list[Any]:
        return self.engine.settle(session, "extend", _tags(items), None, seconds=seconds)

    def disconnect(self, session: Session) -> None:
        self.store_attempts()
        self.engine.close(session)


def _tags(items: list[Delivery] | list[int]) -> list[int]:
    return [i if isinstance(i, int) else i.tag for i in items]


def consumer(channel: str, values: list[Any], **kw: Any
             ) -> tuple[Harness, Session, Subscription]:
    """A fresh harness whose consumer ``Session("c")`` reads ``channel`` in group "g"
    (``kw`` as ``Harness.subscribe`` takes them: prefetch, lease...), after ``values``
    were published to it."""
    h = Harness()
    s = Session("c")
    sub = h.subscribe(s, patterns=channel, group="g", **kw)
    h.publish_values(channel, values)
    return h, s, sub
