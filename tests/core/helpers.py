"""A stand-in adapter for core tests: drives ``Broker`` with explicit time, no I/O.

It plays the server's part: ``publish`` stages, ``commit`` takes the pending
batch (optionally applying it to a real storage) and calls ``on_committed``,
``pump`` collects deliveries per subscription and, when a storage is attached,
answers the core's load requests the way ``server/app.py`` does.
"""

from __future__ import annotations

import json
from typing import Any

from minou.core.broker import Broker, Session
from minou.core.group import Subscription
from minou.core.writes import WriteBatch
from minou.protocol.frames import Delivery, Outcome, Send
from minou.server import engine
from minou.storage.base import Storage

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
    """One broker, a clock, and optionally a storage that every commit goes to."""

    def __init__(
        self, *, now: float = T0, storage: Storage | None = None, broker: Broker | None = None,
        **broker_kw: Any,
    ) -> None:
        self.broker = broker if broker is not None else Broker(**broker_kw)
        self.now = now
        self.storage = storage
        self.loads: list[engine.Load] = []  # every load pump() answered

    # ---------------------------------------------------------------- time
    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now

    def tick(self, seconds: float = 0.0) -> None:
        """Move the clock on by ``seconds`` and run the broker's timers."""
        self.advance(seconds)
        self.broker.tick(self.now)

    # ------------------------------------------------------------- publish
    def publish(self, *sends: Send, commit: bool = True) -> list[Outcome]:
        outcomes, _ = self.broker.publish(sends, self.now)
        if commit:
            self.commit()
        return outcomes

    def publish_values(self, channel: str, values: list[Any], **kw: Any) -> list[Outcome]:
        return self.publish(*(send(channel, v, **kw) for v in values))

    def commit(self) -> WriteBatch:
        """Simulate one group commit: take the batch, make it durable, confirm it."""
        batch = self.broker.take_writes()
        if self.storage is not None:
            self.storage.apply(batch)
        self.broker.on_committed(batch, self.now)
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
            assert self.storage is not None, f"loads without storage: {turn.loads}"
            for load in turn.loads:
                self.loads.append(load)
                self.serve_load(load)
        raise AssertionError("pump kept asking for loads")

    def serve_load(self, load: engine.Load) -> None:
        """What the server's ``_load`` does: read a page, hand it to the engine."""
        assert self.storage is not None
        msgs = self.storage.read_range(load.channel, load.from_seq, load.upto, PAGE)
        engine.loaded(self.broker, load, msgs, PAGE)

    def take(self, sub: Subscription) -> list[Delivery]:
        """Pump and return what ``sub`` got (other subscriptions' deliveries are dropped)."""
        return self.pump().get(sub, [])

    # ---------------------------------------------------------- settling
    def ack(self, session: Session, items: list[Delivery] | list[int]) -> list[Any]:
        return self.broker.ack(session, _tags(items))

    def nack(
        self, session: Session, items: list[Delivery] | list[int], *, delay: float = 0.0,
        front: bool = True,
    ) -> list[Any]:
        return self.broker.nack(session, _tags(items), delay=delay, front=front, now=self.now)

    def extend(self, session: Session, items: list[Delivery] | list[int], seconds: float
               ) -> list[Any]:
        return self.broker.extend(session, _tags(items), seconds, self.now)

    def disconnect(self, session: Session) -> None:
        self.broker.disconnect(session, self.now)


def _tags(items: list[Delivery] | list[int]) -> list[int]:
    return [i if isinstance(i, int) else i.tag for i in items]
