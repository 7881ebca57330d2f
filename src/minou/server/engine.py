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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..core.broker import Broker
from ..core.group import Subscription
from ..core.log import Msg
from ..core.writes import WriteBatch
from ..protocol.frames import Delivery

Kick = Literal["now", "timer", "none"]


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
        if self._timer:
            return "none"
        self._timer = True
        return "timer"

    def timer_fired(self) -> None:
        self._timer = False

    def take(self, backing_off: Callable[[], bool] = lambda: False) -> WriteBatch | None:
        """The batch to commit now, or None: the writer is busy, nothing to write, the
        storage failed, or ``backing_off()`` (asked only when there is something to
        write) says a full disk is waited out."""
        if self.writing is not None or self.stopped:
            return None
        if not (self.core.batch or self._force) or backing_off():
            return None
        self._force = False
        batch = self.core.take_writes()
        if not batch:
            return None
        self.writing = batch
        self.handoffs += 1
        return batch

    def committed(self, batch: WriteBatch, now: float, wall: float) -> Kick:
        """``batch`` is durable: answer what waited for it (the core's callbacks) and
        say when the next commit is due."""
        self.writing = None
        if batch.messages:
            self._last_publish_commit = now
        self.core.on_committed(batch, wall)
        if self.core.batch.messages:
            return "now"  # publishes waited for this commit: go on at once
        if self.core.batch:
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


def loaded(core: Broker, load: Load, msgs: list[Msg], page: int) -> None:
    """Hand a storage page to the core: a full page means more may follow it."""
    hi = msgs[-1].seq + 1 if len(msgs) == page else load.upto
    core.on_loaded(load.channel, load.from_seq, msgs, hi)
