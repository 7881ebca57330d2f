"""When the writer commits, who may publish meanwhile, what goes out: no I/O, time
passed in.

The first parts of the engine every door shares (issue 15): the group-commit
schedule, the flow-control accounting and the pump, taken out of ``BrokerServer`` so
they can be tested and simulated without a loop, a thread or a disk. The server runs
what they decide: it hands ``take()``'s batch to the writer thread, reports
``committed``/``failed``, arms a timer when told to, pauses or resumes the publishers
it names, sends ``pump()``'s deliveries and reads its ``Load`` ranges.

The rules (measured in docs/benchmarks.md, "Where minou's time goes"):

* One commit at a time. What arrives while the writer is busy forms the next batch
  (group commit); publishes that waited for a commit go at once when it ends.
* Publishes commit now: their latency is the product. Settlements and subscriptions
  commit now too when no publishes flow; while they flow, they ride along with the
  publishes' commits (which come within ``settle_delay``) rather than queue an fsync
  in front of them.
* Flow control: past ``pause_bytes`` of publishes staged or being written, a socket
  publisher is paused (its reads stop) and an HTTP publish is refused; they resume
  below a quarter of it (at most ``resume_bytes``). The count is read from the
  batches themselves, so every door counts and a failed commit leaks nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ..core.broker import Broker, Session
from ..core.group import Subscription
from ..core.log import Msg, page_end
from ..core.writes import WriteBatch
from ..errors import ErrorCode, PublishBacklog, RequestError, ShuttingDown
from ..names import CORRELATION_ID, INBOX_PREFIX
from ..protocol.frames import Delivery, Outcome, Send
from .long_polls import LongPolls, PatternWaiters

Kick = Literal["now", "timer", "none"]
# A publish's answer: the outcomes (final: after the commit they waited for), and the
# commit's error when it failed (its stored outcomes then carry that error).
PublishReply = Callable[[list[Outcome], RequestError | None], None]
# A settlement's answer: the refused tags (tag, code, text), and the commit's error.
SettleReply = Callable[[list[tuple[int, int, str]], RequestError | None], None]

DELIVERY_RECHECK_S = 0.05  # deliveries held (may_deliver): look again this soon
# A timer that rings this much before its time is on time (asyncio runs timers up to its
# clock's resolution early; rearming for a few microseconds would be a wasted turn).
TIMER_SLACK_S = 0.0002


class CommitScheduler:
    def __init__(self, core: Broker, *, settle_delay: float, pause_bytes: Callable[[], int],
                 resume_bytes: int) -> None:
        self.core = core
        self.settle_delay = settle_delay
        self.pause_bytes = pause_bytes  # read live: a reload may change it
        self.resume_bytes = resume_bytes
        self.writing: WriteBatch | None = None  # the batch the writer holds
        self.stopped = False  # a storage failure: nothing is written any more
        self.handoffs = 0  # batches handed to the writer
        self.paused: set[Any] = set()  # publishers whose reads stop until the disk catches up
        self.flow_pauses = 0
        self._force = False
        self._timer = False
        # When the oldest state staged to ride along (not yet taken) was asked to commit:
        # the timer commits it settle_delay after that, not after the timer was armed (a
        # timer armed for state a publish commit took since would commit the next ack
        # alone: ~1 commit in 5 at 2,000 msg/s, each an fsync publishes queued behind).
        self._riding_since: float | None = None
        self._last_publish_commit = float("-inf")

    # ------------------------------------------------------------ scheduling
    def request(self, now: float, *, urgent: bool = True, force: bool = False) -> Kick:
        """A commit is wanted (``now``: a monotonic clock). ``"now"``: try ``take`` at
        once; ``"timer"``: call ``timer_fired`` and try after ``settle_delay``;
        ``"none"``: a timer is already armed. ``force`` commits group states that
        deliveries alone changed."""
        self._force = self._force or force
        publishing = now - self._last_publish_commit < self.settle_delay * 2
        if urgent or force or not publishing:
            return "now"
        if self._riding_since is None:
            self._riding_since = now
        elif now - self._riding_since >= self.settle_delay:
            return "now"  # it waited its settle_delay (a commit in progress held it)
        if self._timer:
            return "none"
        self._timer = True
        return "timer"

    def timer_fired(self, now: float) -> float | None:
        """The timer rang: None to try ``take`` now, or how long the state staged since
        (younger than ``settle_delay``) may still wait for a publish commit to take it;
        the timer is then armed again for that long."""
        if self._riding_since is not None:
            left = self._riding_since + self.settle_delay - now
            if left > TIMER_SLACK_S:
                return left
        self._timer = False
        return None

    def take(self, backing_off: Callable[[], bool] = lambda: False) -> WriteBatch | None:
        """The batch to commit now, or None: the writer is busy, nothing to write, the
        storage failed, or ``backing_off()`` (asked only when there is something to
        write) says a full disk is waited out. A batch with nothing to write but
        answers waiting on it comes back too (empty): the writer is idle, so what the
        answers wait for is durable already, and the engine answers without a write."""
        if self.writing is not None or self.stopped:
            return None
        if not (self.core.batch or self._force) or backing_off():
            return None
        self._force = False
        batch = self.core.take_writes()
        if not batch:
            return None
        self._riding_since = None  # whatever waited to ride along goes with this batch
        self.writing = batch
        if batch.writes:
            self.handoffs += 1
        return batch

    def committed(self, batch: WriteBatch, now: float, wall: float) -> Kick:
        """``batch`` is durable: answer what waited for it (the core's callbacks) and
        say when the next commit is due."""
        self.writing = None
        if batch.messages:
            self._last_publish_commit = now
        self.core.on_committed(batch, wall)
        pending = self.core.batch
        # Answers alone waited for this commit: they go at once, without a write. Acks'
        # answers are not alone: the acked group states (dirty, taken into the batch
        # only by ``take``) are what they wait for, and those ride along.
        if pending.messages or (pending and not pending.writes and not self.core.has_dirty):
            return "now"  # publishes, or answers alone, waited for this commit
        if pending:
            return self.request(now, urgent=False)
        return "none"

    def failed(self) -> None:
        """The writer's batch was not written (the caller tells the core how)."""
        self.writing = None

    def stop(self) -> None:
        self.stopped = True

    @property
    def idle(self) -> bool:
        return self.writing is None

    # ---------------------------------------------------------- flow control
    @property
    def uncommitted_bytes(self) -> int:
        """Publish bytes staged or being written, not yet durable."""
        return self.core.batch.bytes + (self.writing.bytes if self.writing else 0)

    def staged(self, publisher: Any) -> bool:
        """``publisher`` staged publishes: whether it must stop reading (the disk is
        behind); it is then remembered until ``resumable`` lets it go."""
        if self.uncommitted_bytes <= self.pause_bytes():
            return False
        if publisher not in self.paused:
            self.flow_pauses += 1
            self.paused.add(publisher)
        return True

    def backlog(self) -> tuple[int, int] | None:
        """(bytes waiting, the limit) while a publish that cannot be paused (HTTP) must
        be refused: past the limit, or while socket publishers wait (so that HTTP
        cannot keep them paused); else None."""
        pending, limit = self.uncommitted_bytes, self.pause_bytes()
        if pending <= limit and not self.paused:
            return None
        return pending, limit

    def resumable(self) -> list[Any]:
        """The paused publishers to resume now (the disk caught up), forgotten here."""
        if not self.paused:
            return []
        if self.uncommitted_bytes > min(self.resume_bytes, self.pause_bytes() // 4):
            return []
        out = list(self.paused)
        self.paused.clear()
        return out

    def forget(self, publisher: Any) -> None:
        self.paused.discard(publisher)


# ------------------------------------------------------------------ the pump
@dataclass
class Pumped:
    """What one turn of the pump decided: deliveries to send (per subscription), body
    ranges to read from storage, whether more is ready once these are written, and
    whether it staged state a commit should carry (soon, not urgently)."""

    deliveries: dict[Subscription, list[Delivery]] = field(default_factory=dict)
    loads: list[Load] = field(default_factory=list)
    again: bool = False
    commit: bool = False


@dataclass(frozen=True)
class Load:
    """Read ``channel``'s stored messages ``from_seq <= seq < upto`` (one page)."""

    channel: str
    from_seq: int
    upto: int


def pump(core: Broker, now: float, *, draining: bool = False) -> Pumped:
    """One turn: what goes out now. A soft stop (``draining``) sends nothing new."""
    if draining:
        return Pumped()
    out, needs = core.pump(now)
    return Pumped(out, [Load(n.log.name, n.seq, n.log.cache_lo) for n in needs],
                  again=core.has_ready, commit=bool(core.batch))


def loaded(core: Broker, load: Load, msgs: list[Msg], page: int,
           max_bytes: int | None = None) -> None:
    """Hand a storage page to the core: a full page means more may follow it."""
    core.on_loaded(load.channel, load.from_seq, msgs,
                   page_end(msgs, page, max_bytes, load.upto))


# ---------------------------------------------------------------- the engine
class Host(Protocol):
    """What the engine asks of whoever runs it (the asyncio server, a test, the
    simulator): the only I/O there is."""

    def write(self, batch: WriteBatch) -> None:
        """Make ``batch`` durable, then call ``Engine.committed`` (or
        ``Engine.not_written`` when it could not)."""

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...

    def load(self, load: Load) -> None:
        """Read ``load``'s page from storage, then call ``Engine.loaded``."""

    def backing_off(self) -> bool:
        """Whether commits wait (a full disk is being waited out)."""


class Publisher(Protocol):
    """A door whose publishes can be paused (a socket stops being read)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Engine:
    """The one path every door takes: a session's command becomes staged writes, its
    answer waits for their commit, deliveries go out, publishers are paused while the
    disk is behind. Doors (connection.py, http_api.py, http_fast.py, http_stream.py,
    http_consumers.py) only turn bytes into these calls and the answers into bytes."""

    def __init__(self, core: Broker, host: Host, *, settle_delay: float,
                 pause_bytes: Callable[[], int], resume_bytes: int,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.host = host
        self.clock = clock
        self.monotonic = monotonic
        self.scheduler = CommitScheduler(core, settle_delay=settle_delay,
                                         pause_bytes=pause_bytes, resume_bytes=resume_bytes)
        self.accepting = True  # false once stopping: no new publishes or subscriptions
        self.stopped_by: RequestError | None = None  # why storage stopped for good
        self.draining = False  # a soft stop: nothing new is delivered either
        self.publish_latency: Any = None  # a histogram (observe(seconds)), if plugged in
        # Whether deliveries may go out now (a cluster primary: while its lease surely
        # holds; a primary paused past it must not deliver what another broker serves).
        self.may_deliver: Callable[[], bool] = lambda: True
        # Queues spread over brokers (spread.py): the refusal of a publish holding a
        # message for a queue this broker does not serve, or None.
        self.route: Callable[[Sequence[Send], Any], RequestError | None] | None = None
        # Requests the broker itself waits on (HTTP's POST /v1/request): (inbox,
        # correlation id) -> called with the reply once it is committed.
        self.reply_waiters: dict[tuple[str, str], Callable[[Msg], None]] = {}
        # Long polls waiting for a channel's next commit (a KV watch): channel -> the
        # callbacks to call once, when a commit makes a message of it visible (a dict
        # used as an ordered set: 10,000 watches of one key that time out each leave
        # in O(1), not by a search of the list).
        self.channel_waiters: dict[str, dict[Callable[[], None], None]] = {}
        # Long polls waiting for a commit to any channel some patterns match (a
        # federation link's source, XREAD BLOCK): called once when one commits.
        self.pattern_waiters = PatternWaiters()
        self.long_polls = LongPolls()  # how many of both wait, in all and per client
        self._pump_scheduled = False

    # ------------------------------------------------------------- commits
    def commit(self, *, urgent: bool = True, force: bool = False) -> None:
        """Ask for a commit of what is staged (the scheduler decides when)."""
        if urgent and not force and self.scheduler.writing is not None:
            return  # the writer's answer kicks the next one (the request would say "now")
        self._follow(self.scheduler.request(self.monotonic(), urgent=urgent, force=force))

    def _follow(self, kick: Kick) -> None:
        if kick == "now":
            self.kick()
        elif kick == "timer":
            self.host.call_later(self.scheduler.settle_delay, self._timer_fired)

    def _timer_fired(self) -> None:
        again = self.scheduler.timer_fired(self.monotonic())
        if again is not None:
            self.host.call_later(again, self._timer_fired)
            return
        self.kick()

    def kick(self) -> None:
        """Hand the next batch to the writer if it is idle. Called synchronously, even
        between two frames of one read, so the writer fsyncs one batch while the loop
        parses the next (group commit)."""
        batch = self.scheduler.take(self.host.backing_off)
        if batch is None:
            return
        if batch.writes:
            self.host.write(batch)
        else:  # only answers waited: the writer is idle, what they wait for is durable
            self.committed(batch)

    def committed(self, batch: WriteBatch) -> None:
        """``batch`` is durable: answer what waited for it, resume publishers, deliver."""
        kick = self.scheduler.committed(batch, self.monotonic(), self.clock())
        if self.reply_waiters and batch.messages:
            self._answer_waiters(batch.messages)
        if self.channel_waiters and batch.messages:
            self._wake_channel_waiters(batch.messages)
        if self.pattern_waiters and batch.messages:
            self.pattern_waiters.wake({msg.channel for msg in batch.messages})
        self.resume_publishers()
        self.request_pump()
        self._follow(kick)

    def _wake_channel_waiters(self, messages: list[Msg]) -> None:
        waiters = self.channel_waiters
        for name in {msg.channel for msg in messages if msg.channel in waiters}:
            for wake in waiters.pop(name):
                wake()

    def _answer_waiters(self, messages: list[Msg]) -> None:
        waiters = self.reply_waiters
        for msg in messages:
            headers = msg.headers
            if headers and msg.channel.startswith(INBOX_PREFIX):
                waiter = waiters.pop((msg.channel, headers.get(CORRELATION_ID, "")), None)
                if waiter is not None:
                    waiter(msg)

    def not_written(self, batch: WriteBatch, error: RequestError, *, stop: bool) -> None:
        """``batch`` was not written: its publishers get ``error``, the rest is carried
        into the next commit; ``stop``: storage failed for good, nothing is written any
        more."""
        self.scheduler.failed()
        if stop:
            self.scheduler.stop()
            # Nothing is written any more: refuse new work at once, and answer what would
            # wait for a commit with this error (after_commit), not leave it waiting for
            # one that never comes (an HTTP request would hang until the server gives up).
            self.stopped_by = error
            self.accepting = False
        try:
            self.core.on_failed(batch, error)
        finally:
            self.resume_publishers()  # their next publishes are refused at once
            if not stop and self.core.batch:
                self.commit(urgent=False)

    def resume_publishers(self) -> None:
        for publisher in self.scheduler.resumable():
            publisher.resume_reading()

    @property
    def committing(self) -> bool:
        """Whether anything is staged or being written (tests and stop wait on it)."""
        return not self.scheduler.idle or bool(self.core.batch) or self.core.has_dirty

    # ------------------------------------------------------------- answers
    def after_commit(self, reply: Callable[[], None],
                     failed: Callable[[RequestError], None] | None = None, *,
                     urgent: bool = False) -> None:
        """Answer with ``reply`` once what is staged now is durable (``failed`` if that
        commit fails: a full disk; at once if storage stopped for good)."""
        if self.stopped_by is not None:
            if failed is not None:
                failed(self.stopped_by)
            return
        self.core.after_commit(reply, failed)
        self.commit(urgent=urgent)

    def when_durable(self, reply: Callable[[], None],
                     failed: Callable[[RequestError], None] | None = None) -> None:
        """``reply`` now if nothing waits to be written, else after the commit."""
        if self.core.batch or self.core.has_dirty:
            self.after_commit(reply, failed)
        else:
            reply()

    # ------------------------------------------------------------- publish
    def check_accepting(self) -> None:
        if not self.accepting:
            raise ShuttingDown("the broker is stopping and accepts no new work")

    def check_room(self) -> None:
        """Refuse a publish that cannot be paused (HTTP) while storage is full (507) or
        the disk is behind (503 with Retry-After): holding it would only hold its body
        in memory, and HTTP must not keep paused sockets waiting."""
        full = self.core.storage_refusal
        if full is not None:
            raise type(full)(full.message, **full.detail)
        behind = self.scheduler.backlog()
        if behind is not None:
            pending, limit = behind
            raise PublishBacklog(
                f"the disk is behind: {pending} bytes of publishes wait to be written "
                f"(publish_pause_bytes {limit}); nothing was stored, retry in a moment",
                uncommitted_bytes=pending, limit=limit, retry_after=1)

    def publish(self, sends: Sequence[Send], access: Any, reply: PublishReply, *,
                session: Session | None = None, publisher: Publisher | None = None,
                routed: bool = False, resp_door: bool = False) -> list[Outcome]:
        """Validate and stage ``sends``; ``reply`` once they are durable (at once when
        nothing was staged); the outcomes as known now are returned (the reply has the
        final ones). A door that cannot be paused (``publisher`` None) is
        refused whole, raising, while stopping, full or behind; a pausable one is
        refused send by send (a numbered publish's refusal is remembered) and paused
        while the disk is behind."""
        # ``routed``: a front (spread.py) found every send this broker's just now
        if self.route is not None and not routed and (refusal := self.route(sends, access)):
            raise refusal
        stopping: RequestError | None = None
        if publisher is None:
            self.check_accepting()
            self.check_room()
        elif not self.accepting:
            stopping = ShuttingDown("the broker is stopping and accepts no new work")
        received = time.perf_counter()
        core = self.core
        outcomes, staged = core.publish(sends, self.clock(), access, session, stopping,
                                        resp_door)
        early = core.early_duplicates
        if not staged and not core.replays and not early:
            down = core.storage_refusal is not None and \
                core.storage_refusal.code == ErrorCode.STORAGE_UNAVAILABLE
            if core.producers.dirty and not down:
                # Refusals of numbered publishes: answered once the producer state that
                # remembers them is durable (else a resend after a crash is a gap), or
                # when that commit fails. While storage is out of reach nothing can be
                # made durable: answered at once (the client copes with the gap: it
                # starts a new producer).
                self.after_commit(lambda: reply(outcomes, None),
                                  lambda exc: reply(outcomes, None))
            else:
                reply(outcomes, None)
            return outcomes
        # Outcomes answered from a producer's state say what it holds once the commit
        # they follow is durable (a failed commit turns "stored" into its error); so do
        # duplicates of a message still being written (``early``): commits are in order,
        # so the next one comes after it.
        replays = core.replays
        latency = self.publish_latency

        def confirmed() -> None:
            for i, state, pseq in replays:
                outcomes[i] = state.replay(pseq, outcomes[i].channel)
            if early:  # duplicates of messages a failed commit dropped get its error
                core.settle_duplicates(outcomes, early)
            reply(outcomes, None)
            if latency is not None:
                latency.observe(time.perf_counter() - received)

        def not_stored(exc: RequestError) -> None:
            if early:
                core.settle_duplicates(outcomes, early)
            for _ in staged:
                core.counters.refuse(exc.reason)
            again = {i: state.replay(pseq, outcomes[i].channel) for i, state, pseq in replays}
            reply([again[i] if i in again else o if o.code else
                   Outcome(channel=o.channel, code=int(exc.code), error=exc.message)
                   for i, o in enumerate(outcomes)], exc)

        if self.stopped_by is not None:  # resends answered from a producer's state
            not_stored(self.stopped_by)
            return outcomes
        core.after_commit(confirmed, not_stored)
        if staged and publisher is not None and self.scheduler.staged(publisher):
            publisher.pause_reading()
        self.commit()
        return outcomes

    # -------------------------------------------------------------- settle
    def settle(self, session: Session, op: str, tags: Iterable[int], reply: SettleReply | None,
               *, delay: float = 0.0, front: bool = True, seconds: float = 0.0
               ) -> list[tuple[int, int, str]]:
        """Ack, nack or extend ``tags``; the refused ones are returned. ``reply`` (if
        given) answers once the settlement is durable; an extend is answered at once (a
        lease lives in memory only)."""
        tags = list(tags)
        now = self.clock()
        if op == "ack":
            failed = self.core.ack(session, tags, now)
        elif op == "nack":
            failed = self.core.nack(session, tags, delay=delay, front=front, now=now)
        elif op == "extend":
            failed = self.core.extend(session, tags, seconds, now)
            if reply is not None:
                reply(failed, None)
            return failed
        else:
            raise ValueError(f"unknown settlement {op!r}")
        if reply is not None:
            def not_durable(exc: RequestError) -> None:
                reply(failed, exc)

            self.after_commit(lambda: reply(failed, None), not_durable)
        return failed

    # --------------------------------------------------------- transactions
    def commit_txns(self, session: Session, writer_id: str, batch_id: int, txns: list[str],
                    reply: Callable[[dict[str, Any]], None],
                    failed: Callable[[RequestError], None], lineage: str = "",
                    after: int = -1) -> None:
        """Publish staged transactions under the writer's fences; ``reply`` with the
        result once durable, ``failed`` if that commit fails (nothing was published).
        A replay ("discarded": its fences were moved already) is answered only if the
        commit that moved them was stored: one still being written may fail, and its
        fences go back (found by the simulator, seed 1198)."""
        self.check_accepting()
        result = self.core.commit_txns(session, writer_id, batch_id, txns, self.clock(),
                                       lineage, after)
        replayed = list(result.get("replayed_channels") or [])

        def answer() -> None:
            if replayed and not self.core.txn_replay_holds(writer_id, batch_id, replayed):
                lost = RequestError(
                    f"batch {batch_id} of writer {writer_id!r} was not stored: the commit "
                    f"this one repeats failed ({', '.join(replayed[:5])})")
                lost.code = ErrorCode.STORAGE_UNAVAILABLE
                failed(lost)
                return
            reply(result)

        self.after_commit(answer, failed, urgent=True)

    # -------------------------------------------------------- subscriptions
    def subscribe(self, session: Session, sid: int, reply: Callable[[], None] | None = None,
                  **kw: Any) -> Subscription:
        """Subscribe (``kw``: ``Broker.subscribe``'s); ``reply`` once the group and its
        cursors are durable (a door that must name the sid at once passes None)."""
        self.check_accepting()
        sub = self.core.subscribe(session, sid, now=self.clock(), **kw)
        self._changed(reply)
        return sub

    def unsubscribe(self, session: Session, sid: int,
                    reply: Callable[[], None] | None = None) -> None:
        self.core.unsubscribe(session, sid, self.clock())
        self._changed(reply)

    def _changed(self, reply: Callable[[], None] | None) -> None:
        if reply is not None:
            self.after_commit(reply)
        else:
            self.commit(urgent=False)

    # ------------------------------------------------------------- sessions
    def close(self, session: Session) -> None:
        """A session ended: what it held goes back to its groups."""
        self.core.disconnect(session, self.clock())
        self.scheduler.forget(session.conn)
        self.commit(urgent=False)
        self.request_pump()

    def after_input(self) -> None:
        """A read was handled: commit what it staged, deliver what it freed."""
        if self.core.batch:
            self.commit(urgent=False)
        self.request_pump()

    def changed(self) -> None:
        """State changed outside a session's command (an admin action, a reload)."""
        self.commit(urgent=False)
        self.request_pump()

    # ----------------------------------------------------------------- pump
    def request_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            self.host.call_soon(self.pump)

    @property
    def pump_pending(self) -> bool:
        return self._pump_scheduled

    def pump(self) -> None:
        """One turn: deliveries to their sessions, loads to the host, more turns while
        more is ready."""
        self._pump_scheduled = False
        if not self.may_deliver():
            self.host.call_later(DELIVERY_RECHECK_S, self.request_pump)
            return
        turn = pump(self.core, self.clock(), draining=self.draining)
        for sub, items in turn.deliveries.items():
            sub.session.conn.send_deliveries(sub.sid, items)
        if turn.again:
            self.request_pump()  # after this turn's writes, which may pause slow readers
        for load in turn.loads:
            self.host.load(load)
        if turn.commit:
            self.commit(urgent=False)

    def loaded(self, load: Load, msgs: list[Msg], page: int,
               max_bytes: int | None = None) -> None:
        loaded(self.core, load, msgs, page, max_bytes)
        self.request_pump()
