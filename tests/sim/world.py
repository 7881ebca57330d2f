"""One simulated world: the real ``Engine`` and ``Broker`` over a ``MemoryStorage``, a
simulated clock, and simulated clients, every choice drawn from ``random.Random(seed)``.

The world is the engine's ``Host`` (``SimHost``, one per broker run): a batch handed
to ``write`` stays in flight until a step finishes it (``storage.apply`` then
``Engine.committed``), fails it (``StorageFull``: ``Engine.not_written``) or a crash
loses it; ``load`` waits for a step that reads the page; ``call_soon`` callbacks wait
in a queue, ``call_later`` ones on a timer heap of the simulated clock, where the
server's ticker (``BrokerServer._ticker``) runs too.

A crash drops the engine, the core, every session and whatever was in flight (or
applies the in-flight batch first: durable, never answered), and restarts from the
same store, as a process killed with -9 would.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable

from minou.core.broker import Broker, Session
from minou.core.log import READ_WEIGHT_BASE, Msg
from minou.core.writes import WriteBatch
from minou.errors import StorageFenced, StorageFull
from minou.limits import (
    PUBLISH_RESUME_BYTES,
    SETTLE_COMMIT_DELAY_S,
    STORAGE_PROBE_S,
    STORAGE_RETRY_S,
    SWEEP_INTERVAL_S,
)
from minou.protocol.frames import Delivery
from minou.server.delivery_budget import DeliveryBudget
from minou.server.engine import Engine, Load
from minou.storage.memory import MemoryStorage

from . import invariants as inv
from .clients import Connection, SimClient, SubInfo, frame_bytes
from .known import KNOWN_BUGS, SimStorage
from .ledger import Ledger
from .scenario import FEATURES, T0, Scenario

_STORES = itertools.count(1)
QUIESCE_STEPS = 200_000  # more engine work than this with nothing new coming in: a loop


def _held_weight(d: Delivery) -> int:
    """What the model counts a delivery holding against the in-flight bounds: its
    message's memory (``Msg.size``: headers and key included) and never less than its
    read weight (payload, headers' text and READ_WEIGHT_BASE)."""
    wire = len(d.data) + READ_WEIGHT_BASE + sum(
        len(k) + len(v) + 8 for k, v in (d.headers or {}).items())
    memory = Msg(d.channel, d.seq, d.id, d.data, d.raw, d.headers, key=d.key).size()
    return max(wire, memory)


class SimHost:
    """The engine's host for one broker run; a crash makes it dead, and nothing it
    queued runs after that."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.dead = False
        self.soon: deque[Callable[[], None]] = deque()
        self.writing: WriteBatch | None = None
        self.loads: deque[Load] = deque()
        self.retry_at = 0.0  # while storage is full, no commit before this
        self._retry_armed = False
        self._last_scan = float("-inf")

    # -- engine.Host
    def write(self, batch: WriteBatch) -> None:
        assert self.writing is None, "the engine handed over two batches at once"
        self.writing = batch

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.world.at(self.world.now + delay, self, callback)

    def load(self, load: Load) -> None:
        self.loads.append(load)

    def backing_off(self) -> bool:
        """As BrokerServer.backing_off: after StorageFull, commits wait a while."""
        wait = self.retry_at - self.world.now
        if wait <= 0:
            return False
        if not self._retry_armed:
            self._retry_armed = True

            def retry() -> None:
                self._retry_armed = False
                self.world.engine.kick()

            self.call_later(wait, retry)
        return True

    # -- what the server's ticker does every SWEEP_INTERVAL_S
    def tick(self) -> None:
        w = self.world
        engine, now = w.engine, w.now
        core = engine.core
        core.tick(now)
        # BrokerServer.watch_consumers: the budget sees what was read since the last tick
        w.budget.recount([(c, c.inbox_bytes) for c in w.conns.values() if not c.closed],
                         w.scenario.budget_bytes)
        expired = w.ledger.expire_leases(now)
        if now - self._last_scan >= 1.0:
            self._last_scan = now
            core.expire_txns(now)
            due = w.storage.expired(now, 1000)
            if due:
                core.expire(due, now)
            # BrokerServer._apply_retention: settled messages kept for replay go when
            # their retention passed.
            for channel, floor in core.retention_candidates(now):
                keep = core.channels[channel].options.retention or 0.0
                first = w.storage.retained_until(channel, floor, now - keep)
                core.retention_looked(channel, floor, first, now)
        if core.batch or core.has_dirty:
            engine.commit(force=True)
        engine.request_pump()
        if expired:
            w.note(f"tick: leases {[t.tag for t in expired]} ran out")
        self.call_later(SWEEP_INTERVAL_S, self.tick)

    def probe(self) -> None:
        """Storage has room again (BrokerServer._probed): publishes are accepted."""
        self.world.engine.core.storage_refusal = None
        self.retry_at = 0.0
        self.world.engine.commit()


class World:
    def __init__(self, seed: int, *, clients: int = 3, steps: int = 400,
                 features: frozenset[str] | None = None,
                 tolerate: frozenset[str] = frozenset(KNOWN_BUGS)) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        # Takeovers are drawn from their own generator: the histories of runs without
        # them (and the seeds pinned before they existed) stay what they were.
        self.takeover_rng = random.Random(f"takeover-{seed}")
        self.now = T0
        self.steps = steps
        self.scenario = Scenario.draw(seed, self.rng, clients,
                                      features if features is not None else frozenset(FEATURES))
        self.ledger = Ledger(self.scenario, tolerated=tolerate)
        self.history: list[str] = []
        self._notes: list[str] = []
        self._doing = ""
        self.step_no = 0
        self._timers: list[tuple[float, int, SimHost, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        self._serials = itertools.count(1)
        self.conns: dict[int, Connection] = {}  # the open connections, by serial
        # The deliveries of the pump turn being run: checked once it ends, in the order
        # the pump made them (by tag), not per subscription as they are handed over.
        self._turn: list[tuple[Connection, int, Delivery]] | None = None
        self.store = f"sim-{seed}-{next(_STORES)}"
        MemoryStorage.forget(self.store)
        self.clients = [SimClient(self, cid, writer=cid in self.scenario.writers)
                        for cid in self.scenario.clients]
        self.start()
        self.setup_groups()

    # ------------------------------------------------------------ plumbing
    def next_serial(self) -> int:
        return next(self._serials)

    def choose(self, choices: list[tuple[str, float]]) -> str:
        total = sum(w for _, w in choices)
        r = self.rng.random() * total
        for name, weight in choices:
            r -= weight
            if r < 0 and weight > 0:
                return name
        return next(name for name, weight in reversed(choices) if weight > 0)

    def at(self, when: float, host: SimHost, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._timer_seq), host, callback))

    def note(self, text: str) -> None:
        """Something the step caused (an answer, a delivery): shown under the step."""
        self._notes.append(f"      {text}")

    def log(self, text: str) -> None:
        self.history.append(f"{self.step_no:5d} t+{self.now - T0:8.3f} {text}")
        self.history.extend(self._notes)
        self._notes.clear()

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.history).encode()).hexdigest()

    def wake(self, session: Session) -> None:
        """A connection reads again (BrokerServer.wake_groups)."""
        for sub in session.subs.values():
            self.engine.core.mark_ready(sub.group)
        self.engine.request_pump()

    # ----------------------------------------------------- the broker's life
    def start(self) -> None:
        """Open the store and restore the broker from it, as BrokerServer.open/start."""
        sc = self.scenario
        self.storage = SimStorage(self.store, self.ledger)
        snap = self.storage.open(self.now)
        core = Broker(channel_options=sc.options_for, dedup_window=sc.dedup_window,
                      default_lease=sc.default_lease, cache_budget=sc.cache_budget)
        core.rules = sc.rules
        core.in_flight.configure(sc.in_flight_bytes, sc.in_flight_share, sc.in_flight_per_sub)
        core.restore(snap, self.now)
        core.migrate_listen_keys(sc.clients)
        self.host = SimHost(self)
        self.budget = DeliveryBudget(share=sc.budget_share)  # the new server's
        self.engine = Engine(core, self.host, settle_delay=SETTLE_COMMIT_DELAY_S,
                             pause_bytes=lambda: sc.pause_bytes,
                             resume_bytes=PUBLISH_RESUME_BYTES,
                             clock=lambda: self.now, monotonic=lambda: self.now)
        self.engine.commit()
        self.engine.request_pump()
        self.host.call_later(SWEEP_INTERVAL_S, self.host.tick)

    def crash(self) -> str:
        host = self.host
        torn = host.writing is not None and self.rng.random() < 0.5
        if torn:  # written and fsync'd, the process died before answering anyone
            assert host.writing is not None
            self._apply(host.writing)
        host.dead = True
        for c in self.clients:
            c.lost_run()
        for conn in self.conns.values():
            conn.closed = True
        self.conns.clear()
        self.ledger.crashed()
        self.now += self.rng.choice((0.1, 1.0, 4.0))
        self.start()
        return "CRASH" + (" after the in-flight batch was written" if torn else
                          " (the in-flight batch is lost)" if host.writing else "")

    def takeover(self) -> str:
        """Another broker takes the store over while this one is paused (SIGSTOP past
        its lease), then this one wakes up: its writer goes on with the batch it was
        writing, and whatever it staged since. The store must refuse all of it (the
        epochs moved on): what the new broker read stays what it serves."""
        old_host, old_engine, old_storage = self.host, self.engine, self.storage
        late = [old_host.writing] if old_host.writing is not None else []
        old_host.dead = True
        for c in self.clients:
            c.lost_run()
        for conn in self.conns.values():
            conn.closed = True
        self.conns.clear()
        self.ledger.crashed()
        self.now += self.rng.choice((0.1, 1.0, 4.0))
        self.start()  # the new broker: its open claims every queue
        staged = old_engine.core.take_writes()
        if staged.writes:
            late.append(staged)
        for batch in late:
            try:
                old_storage.apply(batch)
            except StorageFenced:
                continue
            inv.fail("fenced_after_takeover",
                     f"a commit of the paused broker ({len(batch.messages)} messages, "
                     f"{len(batch.group_states)} group states) was written after another "
                     "broker took the store over")
        return f"TAKEOVER by another broker; the paused one's {len(late)} late commit(s) refused"

    def setup_groups(self) -> None:
        """Make every group of the scenario durable before anything is published."""
        for g in self.scenario.groups:
            if g.exclusive:
                continue  # its first reader makes it
            conn = Connection(self, g.owner or "setup", "")
            self.clients[0].subscribe(conn, g, 1, 0.0)
            self.engine.close(conn.session)
            conn.closed = True
            del self.conns[conn.serial]
        self.quiesce()
        self.log("setup: groups " + ", ".join(
            f"{g.key}={list(g.patterns)}" for g in self.scenario.groups if not g.exclusive))

    # ---------------------------------------------------------- the engine's I/O
    def _apply(self, batch: WriteBatch) -> None:
        self.storage.apply(batch)
        inv.on_apply(self.ledger, batch, self.now, self.scenario)

    def finish_write(self) -> str:
        batch = self.host.writing
        assert batch is not None
        self.host.writing = None
        text = (f"commit: {len(batch.messages)} msgs, {len(batch.deletes)} deletes, "
                f"{len(batch.group_states)} group states")
        self._apply(batch)
        self.engine.committed(batch)
        return text

    def fail_write(self) -> str:
        batch = self.host.writing
        assert batch is not None
        self.host.writing = None
        exc = StorageFull("simulated: the disk is full", cause="simulated")
        self.engine.core.storage_refusal = exc
        self.host.retry_at = self.now + STORAGE_RETRY_S
        self.host.call_later(STORAGE_PROBE_S, self.host.probe)
        self.engine.not_written(batch, exc, stop=False)
        return f"commit FAILED (storage full): {len(batch.messages)} msgs dropped or carried"

    def serve_load(self) -> str:
        load = self.host.loads.popleft()
        page = self.scenario.page
        msgs = self.storage.read_range(load.channel, load.from_seq, load.upto, page)
        self.engine.loaded(load, msgs, page)
        return f"load {load.channel} [{load.from_seq}, {load.upto}): {len(msgs)} msgs"

    def run_soon(self) -> str:
        reading = {(c.serial, sid): sid not in c.paused_sids
                   for c in self.conns.values() for sid in c.subs}
        self._turn = []
        try:
            self.host.soon.popleft()()
        finally:
            turn, self._turn = self._turn, None
        for conn, sid, d in sorted(turn, key=lambda t: t[2].tag):
            self._check_delivery(conn, sid, d, reading)
        if turn:
            per_conn: dict[int, int] = {}
            for conn, _, d in turn:
                per_conn[conn.serial] = per_conn.get(conn.serial, 0) + frame_bytes([d])
            sc = self.scenario
            inv.on_pump_turn(self.ledger, sc.budget_bytes, sc.budget_share,
                             list(per_conn.values()),
                             [c.inbox_bytes for c in self.conns.values() if not c.closed])
        by_sub: dict[tuple[int, int], list[Delivery]] = {}
        for conn, sid, d in turn:
            by_sub.setdefault((conn.serial, sid), []).append(d)
        for (serial, sid), items in by_sub.items():
            self.note(f"deliver to {serial}/{sid}: " + ", ".join(
                f"{d.channel}#{d.seq} tag {d.tag} att {d.attempts}" for d in items))
        return "pump"

    def delivered(self, conn: Connection, sid: int, items: list[Delivery]) -> None:
        """The pump handed ``items`` to ``conn`` (pumps run only from ``run_soon``)."""
        assert self._turn is not None, "a pump outside run_soon"
        self._turn.extend((conn, sid, d) for d in items)

    def _check_delivery(self, conn: Connection, sid: int, d: Delivery,
                        reading: dict[tuple[int, int], bool]) -> None:
        info: SubInfo = conn.subs[sid]
        ledger = self.ledger
        members = [(c.serial, s, i.prefetch, reading.get((c.serial, s), True))
                   for c in self.conns.values() for s, i in c.subs.items()
                   if i.group == info.group]
        sc = self.scenario
        inv.on_member_delivery(ledger, info.group, d.channel, d.seq,
                               (conn.serial, sid, info.prefetch,
                                reading.get((conn.serial, sid), True)), members,
                               (sc.in_flight_bytes, sc.in_flight_share, sc.in_flight_per_sub))
        inv.on_delivery(ledger, info.group, d.channel, d.seq, d.id, d.tag, d.attempts,
                        self.now)
        if self.scenario.rules.is_exclusive(d.channel.removeprefix("_dead/")):
            inv.on_exclusive_delivery(ledger, d.channel, conn.session.client_id)
        ledger.deliver(conn.serial, sid, info.group, info.lease_s, d.channel, d.seq,
                       d.tag, d.attempts, self.now, _held_weight(d))
        if conn.drain:
            ledger.drained.add((info.group, d.channel, d.seq))

    # ---------------------------------------------------------------- time
    def advance(self, seconds: float) -> None:
        """Move the clock on; every timer now due fires (as a stalled loop would)."""
        self.now += seconds
        while self._timers and self._timers[0][0] <= self.now:
            _, _, host, callback = heapq.heappop(self._timers)
            if not host.dead:
                callback()

    # ---------------------------------------------------------------- steps
    def step(self) -> None:
        host = self.host
        f = self.scenario.features
        if "takeover" in f and self.takeover_rng.random() < 0.002:
            self._doing = "takeover"
            self.log(self.takeover())
            return
        event = self.choose([
            ("soon", 30 if host.soon else 0), ("write", 12 if host.writing else 0),
            ("load", 10 if host.loads else 0), ("client", 25), ("time", 8),
            ("crash", 0.3 if "crash" in f else 0)])
        self._doing = event
        try:
            text = self._do(event)
            inv.on_step_in_flight(self.engine.core, self.ledger)
            inv.on_step_indexes(self.engine.core)
        except inv.Violation as v:
            self.log(f"{self._doing}: VIOLATION {v}")
            raise
        self.log(text)

    def doing(self, text: str) -> str:
        """What a step is doing, said before the engine is called: if an invariant
        breaks inside the call, the history shows what broke it."""
        self._doing = text
        return text

    def _do(self, event: str) -> str:
        if event == "soon":
            return self.run_soon()
        if event == "write":
            full = "full" in self.scenario.features and self.rng.random() < 0.08
            return self.fail_write() if full else self.finish_write()
        if event == "load":
            return self.serve_load()
        if event == "client":
            client = self.rng.choice(self.clients)
            self._doing = f"{client.id} acts"
            text = f"{client.id} {client.act()}"
            self.engine.after_input()
            return text
        if event == "time":
            dt = self.rng.choice((0.001, 0.01, 0.1, 0.3, 0.3, 1.0, 3.0, 30.0))
            self.advance(dt)
            return f"time +{dt:g}"
        return self.crash()

    def run(self) -> None:
        """The whole history: the steps, then the end (every group read dry)."""
        try:
            for n in range(1, self.steps + 1):
                self.step_no = n
                self.step()
            self.step_no = self.steps + 1
            self._doing = "end"
            try:
                self.finish()
            except inv.Violation as v:
                self.log(f"{self._doing}: VIOLATION {v}")
                raise
        finally:
            MemoryStorage.forget(self.store)

    # ------------------------------------------------------------- the end
    def quiesce(self) -> None:
        """Let the engine finish what it has (no faults): pumps, commits, loads."""
        host = self.host
        for _ in range(QUIESCE_STEPS):
            if host.soon:
                self.run_soon()
            elif host.writing is not None:
                self.finish_write()
            elif host.loads:
                self.serve_load()
            elif self.engine.committing:
                self.engine.commit(force=True)
                if host.writing is None and not host.soon:
                    self.advance(0.5)  # a full disk's retry or probe is due later
            else:
                return
        inv.fail("progress", f"the engine still had work after {QUIESCE_STEPS} steps")

    def finish(self) -> None:
        """Disconnect every client, then read every group dry with a fresh reader that
        acks everything, letting time pass for delays and retries; check the end."""
        self.quiesce()
        for c in self.clients:
            if c.conn is not None:
                c.close(c.conn)
        self.quiesce()
        readers: list[Connection] = []
        for g in self.scenario.groups:
            owner = g.owner
            if g.exclusive:
                if g.key not in self.ledger.groups_defined:
                    continue  # nobody ever read it
                owner = self.ledger.reservations.get(g.patterns[0], "")
            conn = Connection(self, owner or "drain", "")
            conn.drain = True
            self.clients[0].subscribe(conn, g, 50, 3600.0)
            readers.append(conn)
        self.log("end: every group read dry")
        idle_for = 0.0
        for _ in range(500):
            self.quiesce()
            got = 0
            for conn in readers:
                conn.read()
                if conn.held:
                    tags = sorted(conn.held)
                    got += len(tags)
                    conn.held.clear()
                    failed = self.engine.settle(conn.session, "ack", tags, None)
                    inv.on_settle(self.ledger, conn.serial, "ack", tags, failed, self.now)
            self.engine.after_input()
            if got:
                idle_for = 0.0
                continue
            if idle_for >= 60.0:
                break
            self.advance(5.0)
            idle_for += 5.0
        else:
            inv.fail("progress", "the end readers kept getting deliveries")
        self.quiesce()
        inv.at_end(self.ledger, self.scenario, self.now)
