"""Simulated clients: each acts only through the engine's calls, as the native door does
(server/connection.py): publish, settle, subscribe, unsubscribe, stage and commit
transactions, close. A ``Connection`` is its session's ``conn``: the pump hands it
deliveries, flow control pauses and resumes it.

A client that stops reading lets deliveries pile up unread; past a water mark its
subscriptions are paused, as the server does when a socket's write buffer fills
(``NativeConnection.set_paused``), and reading again wakes its groups. All connections
share one budget of unread delivery bytes (the server's ``DeliveryBudget``, run as is):
a write that leaves the total over it pauses a connection holding more than its share,
and every tick recounts (``BrokerServer.watch_consumers``).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minou.core.session import Session
from minou.errors import ErrorCode, RequestError
from minou.protocol.frames import Delivery, Outcome, Send

from . import invariants as inv
from .ledger import Sent
from .scenario import GroupSpec

if TYPE_CHECKING:
    from .world import World

def frame_bytes(items: list[Delivery]) -> int:
    """What a Deliver frame of ``items`` adds to a connection's unsent bytes."""
    return sum(len(d.data) + 64 for d in items)


@dataclass
class SubInfo:
    group: str
    lease_s: float
    prefetch: int


class Connection:
    """One connection of a client to one broker run."""

    def __init__(self, world: World, client_id: str, producer_id: str) -> None:
        self.world = world
        self.serial = world.next_serial()
        self.session = Session(client_id, self,
                               access=world.scenario.rules.for_client(client_id))
        self.session.producer_id = producer_id
        self.closed = False
        self.drain = False  # an end-of-run reader: what it gets counts as read dry
        self.flow_paused = False  # flow control stopped reading this socket
        self.reading = True  # the peer reads what it is sent
        self.water_paused = False
        self.budget_paused = False  # the delivery budget's (DeliveryBudget.note/recount)
        self.unsent_noted = 0  # this connection's part of the budget's running total
        self.subs: dict[int, SubInfo] = {}
        self.inbox: list[Delivery] = []
        self.inbox_bytes = 0
        self.held: dict[int, Delivery] = {}  # read, not settled: tag -> delivery
        self.sid_of: dict[int, int] = {}  # tag -> the subscription it came on
        self._sids = 0
        self.paused_sids: set[int] = set()  # the subscriptions a pause caught
        world.conns[self.serial] = self

    def new_sid(self) -> int:
        self._sids += 1
        return self._sids

    # -- the engine's side
    def send_deliveries(self, sid: int, items: list[Delivery]) -> None:
        if self.closed:
            return
        self.world.delivered(self, sid, items)
        self.inbox.extend(items)
        for d in items:
            self.sid_of[d.tag] = sid
        size = frame_bytes(items)
        self.inbox_bytes += size
        w = self.world
        if w.budget.note(self, self.inbox_bytes, w.scenario.budget_bytes):
            self.set_budget_paused(True)  # as NativeConnection.send_deliveries
        if self.inbox_bytes > w.scenario.high_water and not self.water_paused:
            self.water_paused = True
            self._apply_pause()

    def set_budget_paused(self, paused: bool) -> None:
        if paused != self.budget_paused:
            self.budget_paused = paused
            self._apply_pause()

    def _apply_pause(self) -> None:
        """As NativeConnection._apply_pause (a subscription made while paused starts
        paused: ``subscribe``); resuming wakes their groups."""
        if self.water_paused or self.budget_paused:
            self.paused_sids = set(self.session.subs)
            for sub in self.session.subs.values():
                sub.paused = True
            return
        self.paused_sids.clear()
        for sub in self.session.subs.values():
            sub.paused = False
        self.world.wake(self.session)

    def pause_reading(self) -> None:
        if not self.closed:
            self.flow_paused = True

    def resume_reading(self) -> None:
        self.flow_paused = False

    # -- the client's side
    def read(self) -> None:
        for d in self.inbox:
            self.held[d.tag] = d
        self.inbox.clear()
        self.inbox_bytes = 0  # the budget sees it at the next recount, as the server's
        if self.water_paused:
            self.water_paused = False
            self._apply_pause()


@dataclass
class TxnWriter:
    """A Spark-style sink: batches of messages staged under transaction ids, committed
    under a writer id and batch id; a batch whose answer was lost is replayed whole
    (new transaction ids, the same batch id) and the fence must drop what was in."""

    writer_id: str
    batch_id: int = 1
    sends: list[Send] = field(default_factory=list)
    pids: list[str] = field(default_factory=list)
    txns: list[str] = field(default_factory=list)
    state: str = "idle"  # idle -> staged -> committing -> idle
    attempt: int = 0


class SimClient:
    def __init__(self, world: World, client_id: str, *, writer: bool) -> None:
        self.world = world
        self.id = client_id
        self.producer_id = f"prod-{client_id}"
        self.conn: Connection | None = None
        self.pseq: dict[str, int] = {}
        self.unconfirmed: dict[str, Send] = {}  # numbered sends not answered: pid -> send
        self.sent = 0
        self.stale: list[int] = []  # own tags of this run that must no longer settle
        self.writer = TxnWriter(f"w-{client_id}") if writer else None
        # Headers and keys (``budget``): their own generator, so that the other draws,
        # and the histories without the feature, stay what they were.
        self.extras = random.Random(f"extras-{world.scenario.seed}-{client_id}")

    # ------------------------------------------------------------ helpers
    @property
    def rng(self) -> random.Random:
        return self.world.rng

    def _pid(self) -> str:
        self.sent += 1
        return f"{self.id}-{self.sent}"

    def lost_run(self) -> None:
        """The broker crashed: the connection is gone with every tag of its run."""
        if self.conn is not None:
            self.conn.closed = True
        self.conn = None
        self.stale.clear()
        if self.writer is not None and self.writer.state != "idle":
            self.writer.state = "idle"  # replay the batch

    # ------------------------------------------------------------ actions
    def act(self) -> str:
        conn = self.conn
        if conn is None:
            return self.connect()
        if conn.flow_paused:
            return "paused by flow control"
        if conn.reading:
            conn.read()
        w = self.world
        f = w.scenario.features
        choices: list[tuple[str, float]] = [("publish", 30), ("subscribe", 4 if len(
            conn.subs) < 2 else 0.5), ("disconnect", 1.5)]
        if conn.held:
            choices += [("ack", 20), ("nack", 8 if "nack" in f else 0),
                        ("extend", 3 if "extend" in f else 0)]
        if conn.subs:
            choices.append(("unsubscribe", 1.5))
        if "slow" in f:
            choices.append(("stop_reading" if conn.reading else "resume_reading", 2))
        if "foreign" in f:
            choices.append(("foreign", 2))
        if self.writer is not None:
            choices.append(("txn", 8))
        action = w.choose(choices)
        return getattr(self, f"do_{action}")(conn)

    def connect(self) -> str:
        self.conn = conn = Connection(self.world, self.id, self.producer_id)
        text = f"connect (conn {conn.serial})"
        if self.unconfirmed:  # an idempotent producer resends what was not answered
            sends = sorted(self.unconfirmed.items(),
                           key=lambda kv: (kv[1].channel, kv[1].pseq))
            text += "; " + self._publish(conn, [s for _, s in sends], [p for p, _ in sends])
        return text

    def do_disconnect(self, conn: Connection) -> str:
        self.close(conn)
        return "disconnect"

    def close(self, conn: Connection) -> None:
        conn.closed = True
        self.world.conns.pop(conn.serial, None)
        self.conn = None
        self.stale.extend(conn.held)
        self.stale.extend(d.tag for d in conn.inbox)
        del self.stale[:-20]
        self.world.engine.close(conn.session)
        self.world.ledger.conn_closed(conn.serial)
        if self.writer is not None and self.writer.state == "committing":
            self.writer.state = "idle"  # its answer is lost with the connection

    def do_stop_reading(self, conn: Connection) -> str:
        conn.reading = False
        return "stops reading"

    def do_resume_reading(self, conn: Connection) -> str:
        conn.reading = True
        conn.read()
        return "reads again"

    # ------------------------------------------------------------ publish
    def do_publish(self, conn: Connection) -> str:
        rng, f = self.rng, self.world.scenario.features
        sends: list[Send] = []
        pids: list[str] = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            pid = self._pid()
            broadcast = "broadcast" in f and rng.random() < 0.12
            target = rng.choice(("a/v1/*", "b/v1/*")) if broadcast else \
                rng.choice(self.world.scenario.channels)
            priority = rng.randint(1, 9) if "priority" in f and rng.random() < 0.15 else 0
            delay = rng.choice((0.5, 3.0, 15.0)) if "delay" in f and rng.random() < 0.1 \
                else None
            ttl = rng.choice((0.5, 2.0, 10.0)) if "ttl" in f and rng.random() < 0.15 else None
            dedup = f"k{rng.randint(1, 4)}" if "dedup" in f and rng.random() < 0.2 else None
            pseq = 0
            if "numbered" in f and not broadcast and rng.random() < 0.3:
                pseq = self.pseq[target] = self.pseq.get(target, 0) + 1
            headers, key = self._extras(pid) if "budget" in f else (None, None)
            send = Send(target, json.dumps({"p": pid}).encode(), headers=headers,
                        priority=priority, ttl=ttl, delay=delay, dedup=dedup, key=key,
                        pseq=pseq)
            kind = "numbered" if pseq else "plain"
            self.world.ledger.sent[pid] = Sent(pid, target, dedup, kind)
            if pseq:
                self.unconfirmed[pid] = send
            sends.append(send)
            pids.append(pid)
        return self._publish(conn, sends, pids)

    def _extras(self, pid: str) -> tuple[dict[str, str] | None, str | None]:
        """A third of the messages carry a few headers, and half of those a key: what
        a delivery holds against the small in-flight bounds counts them (their memory
        weighs several times their text)."""
        rng = self.extras
        if rng.random() >= 0.33:
            return None, None
        headers = {f"h{i}": "v" * rng.randint(1, 3) for i in range(rng.randint(1, 6))}
        return headers, (pid if rng.random() < 0.5 else None)

    def _publish(self, conn: Connection, sends: list[Send], pids: list[str]) -> str:
        world = self.world

        def reply(outcomes: list[Outcome], failure: RequestError | None) -> None:
            inv.on_publish_reply(world.ledger, sends, pids, outcomes)
            if not conn.closed:  # a closed connection's answer never reaches its client
                for pid, o in zip(pids, outcomes, strict=True):
                    if o.code != ErrorCode.OUT_OF_SEQUENCE:
                        self.unconfirmed.pop(pid, None)
            world.note(f"{self.id} publish answered: " + ", ".join(
                _outcome(p, o) for p, o in zip(pids, outcomes, strict=True)))

        text = world.doing(f"{self.id} publish " + ", ".join(
            _send(p, s) for p, s in zip(pids, sends, strict=True)))
        world.engine.publish(sends, conn.session.access, reply, session=conn.session,
                             publisher=conn)
        return text.removeprefix(f"{self.id} ")

    # -------------------------------------------------------- subscriptions
    def do_subscribe(self, conn: Connection) -> str:
        groups = [g for g in self.world.scenario.groups
                  if g.kind == "consume" or g.owner == self.id]
        g = self.rng.choice(groups)
        prefetch = self.rng.choice((0, 1, 2, 5))
        lease = self.rng.choice((0.0, 0.0, 1.0, 4.0))
        return self.subscribe(conn, g, prefetch, lease)

    def subscribe(self, conn: Connection, g: GroupSpec, prefetch: int, lease: float) -> str:
        sid = conn.new_sid()
        world = self.world

        def reply() -> None:  # the door's Result, once the group and its cursors are stored
            world.note(f"{conn.session.client_id}/{conn.serial} subscribed sid {sid}")

        try:
            sub = self.world.engine.subscribe(
                conn.session, sid, reply, kind=g.kind, patterns=list(g.patterns),
                group=g.name if g.kind == "consume" else None,
                name=g.name if g.kind == "listen" else None, prefetch=prefetch, lease=lease)
        except RequestError as exc:
            return f"subscribe {g.key} refused: {exc.message}"
        assert sub.group.key == g.key, (sub.group.key, g.key)
        conn.subs[sid] = SubInfo(g.key, sub.lease_s, sub.prefetch)
        if conn.water_paused or conn.budget_paused:  # as NativeConnection._on_subscribe
            sub.paused = True
            conn.paused_sids.add(sid)
        return f"subscribe sid {sid} to {g.key} prefetch {sub.prefetch} lease {sub.lease_s:g}"

    def do_unsubscribe(self, conn: Connection) -> str:
        sid = self.rng.choice(sorted(conn.subs))
        del conn.subs[sid]
        gone = [tag for tag in conn.held if conn.sid_of.get(tag) == sid]
        self.world.engine.unsubscribe(conn.session, sid, lambda: self.world.note(
            f"{self.id}/{conn.serial} unsubscribed sid {sid}"))
        self.world.ledger.conn_closed(conn.serial, sid)
        self.stale.extend(gone)
        return f"unsubscribe sid {sid}"

    # --------------------------------------------------------- settlements
    def _pick(self, conn: Connection) -> list[int]:
        tags = sorted(conn.held)
        k = min(len(tags), self.rng.choice((1, 1, 2, 3)))
        return self.rng.sample(tags, k)

    def do_ack(self, conn: Connection) -> str:
        return self.settle(conn, "ack", self._pick(conn))

    def do_nack(self, conn: Connection) -> str:
        how = self.rng.choice(("front", "back", "delay"))
        delay = self.rng.choice((0.3, 2.0, 8.0)) if how == "delay" else 0.0
        return self.settle(conn, "nack", self._pick(conn), front=how == "front", delay=delay)

    def do_extend(self, conn: Connection) -> str:
        return self.settle(conn, "extend", self._pick(conn),
                           seconds=self.rng.choice((1.0, 10.0)))

    def do_foreign(self, conn: Connection) -> str:
        """Settle a tag that is not this connection's to settle: another client's live
        one, or one of its own that was settled, returned or taken back."""
        others = [tag for c in self.world.clients if c is not self and c.conn is not None
                  for tag in sorted(c.conn.held)]
        pool = others + self.stale
        if not pool:
            return "no foreign tag to try"
        tag = self.rng.choice(pool)
        return self.settle(conn, self.rng.choice(("ack", "nack", "extend")), [tag],
                           seconds=5.0, foreign=True)

    def settle(self, conn: Connection, op: str, tags: list[int], *, front: bool = True,
               delay: float = 0.0, seconds: float = 0.0, foreign: bool = False) -> str:
        world = self.world
        took: list[tuple[str, str, int]] = []
        returned: list[bool] = []  # settle() returned: ``took`` is known
        early: list[bool] = []  # answered inside settle(), before ``took`` was known

        def reply(failed: list[tuple[int, int, str]], exc: RequestError | None) -> None:
            if op == "ack" and exc is None:
                if returned:
                    inv.on_ack_durable(world.ledger, took)
                else:
                    early.append(True)

        world.doing(f"{self.id} {'foreign ' if foreign else ''}{op} {tags}")
        failed = world.engine.settle(conn.session, op, tags, reply, delay=delay, front=front,
                                     seconds=seconds)
        took += inv.on_settle(world.ledger, conn.serial, op, tags, failed, world.now, seconds)
        returned.append(True)
        if early:  # an answer given at once says the ack is durable already: hold it to that
            inv.on_ack_durable(world.ledger, took)
        refused = {t for t, _, _ in failed}
        if op != "extend" and not foreign:
            for tag in tags:
                conn.held.pop(tag, None)
                self.stale.append(tag)
            del self.stale[:-20]
        how = f" delay {delay:g}" if delay else "" if op != "nack" else \
            " front" if front else " back"
        return (f"{'foreign ' if foreign else ''}{op}{how} {tags}"
                + (f" refused {sorted(refused)}" if refused else ""))

    # -------------------------------------------------------- transactions
    def do_txn(self, conn: Connection) -> str:
        w = self.writer
        assert w is not None
        world, rng = self.world, self.rng
        if w.state == "committing":
            return "txn: waits for its commit"
        if w.state == "idle":
            if not w.sends or w.attempt == 0:
                w.pids = [f"{w.writer_id}-b{w.batch_id}-{i}" for i in range(rng.randint(1, 3))]
                w.sends = [Send(rng.choice(world.scenario.channels),
                                json.dumps({"p": pid}).encode()) for pid in w.pids]
                for pid, s in zip(w.pids, w.sends, strict=True):
                    world.ledger.sent[pid] = Sent(pid, s.channel, None, "txn")
            w.attempt += 1
            w.txns = [f"{w.writer_id}-b{w.batch_id}-a{w.attempt}-t{i}"
                      for i in range(1 if len(w.sends) == 1 else 2)]
            half = (len(w.sends) + 1) // 2
            parts = [w.sends] if len(w.txns) == 1 else [w.sends[:half], w.sends[half:]]
            try:
                for txn, part in zip(w.txns, parts, strict=True):
                    world.engine.core.stage(conn.session, txn, part, world.now)
                    # The door answers a STAGE once what it holds is stored.
                    world.engine.after_commit(lambda t=txn: world.note(f"{self.id} staged {t}"))
            except RequestError as exc:
                return f"txn stage batch {w.batch_id} refused: {exc.message}"
            w.state = "staged"
            return f"txn stage batch {w.batch_id} {w.pids} as {w.txns}"
        pids, batch_id = list(w.pids), w.batch_id

        def done(result: dict[str, Any]) -> None:
            failed = {f["channel"] for f in result.get("failed", [])}
            inv.on_txn_reply(world.ledger, pids, failed, int(result.get("discarded", 0)))
            if not conn.closed and w.batch_id == batch_id and w.state == "committing":
                w.batch_id += 1
                w.state, w.attempt, w.sends = "idle", 0, []
            world.note(f"{self.id} txn batch {batch_id} committed: {result}")

        def refused(exc: RequestError) -> None:
            if w.batch_id == batch_id and w.state == "committing":
                w.state = "idle"
            world.note(f"{self.id} txn batch {batch_id} failed: {exc.message}")

        w.state = "committing"
        try:  # as the native door does (connection.py _on_txn_commit)
            world.engine.commit_txns(conn.session, w.writer_id, w.batch_id, w.txns, done,
                                     refused)
        except RequestError as exc:
            w.state = "idle"
            return f"txn commit batch {w.batch_id} refused: {exc.message}"
        return f"txn commit batch {w.batch_id} {w.txns}"


def _send(pid: str, s: Send) -> str:
    extra = "".join(f" {k}={v}" for k, v in (("prio", s.priority), ("delay", s.delay),
                                              ("ttl", s.ttl), ("dedup", s.dedup),
                                              ("pseq", s.pseq)) if v)
    return f"{pid}->{s.channel}{extra}"


def _outcome(pid: str, o: Outcome) -> str:
    if o.code:
        return f"{pid} refused {o.code}"
    dup = " dup" if o.duplicate else ""
    fan = f" fanout {o.fanout}" if o.channel.endswith("*") else ""
    return f"{pid} seq {o.seq}{dup}{fan}"
