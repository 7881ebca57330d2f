"""The broker domain: channels, groups, deliveries, settlement. No I/O, no awaits.

``Broker`` is what the adapters drive. It keeps no logic of its own: each call goes to
the part that does that job, and the parts share one ``BrokerState`` (``state.py``),
whose attributes are Broker's public ones (``channels``, ``batch``, ``rules``, ...):

    publishing      validate sends, assign seqs, stage them in the pending batch
    commits         the pending batch: handed over, committed, failed
    rights          read rules, and reservations of exclusive (!) channels
    subscriptions   groups, their patterns and start positions; offsets
    delivery        pump ready messages to subscriptions with credit; loads
    settlement      ack, nack, extend, withdraw; deliveries that come back
    dead_letters    TTL expiry and dead-lettering
    timers          tick: leases, delayed messages, ageing, the body cache
    txn_publishing  staged, fenced (transactional) publishes
    restore         rebuild memory from storage at start; adopt a queue while running
    ownership       release a queue to another broker

A part calls only parts listed before it in ``Broker.__init__``, and only their public
names, so no module of ``core/`` imports one that imports it back.

Theory of operation
-------------------
A message's life crosses the parts in order. ``publish`` validates it, gives it its
seq and stages it in the pending ``WriteBatch``; it becomes visible to readers only in
``on_committed``, after the adapter has made that batch durable (``commits`` says why
and what a failed commit does). ``pump`` hands ready messages to subscriptions with
credit; ``ack`` and ``nack`` settle or return them, and ``tick`` returns those whose
lease ran out and releases delayed ones. Whatever these change in memory is made
durable with the next batch.

Time is always passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from ..auth.rules import ALLOW_ALL, Access, Rules
from ..errors import NotAuthorized, RequestError
from ..limits import BODY_CACHE_BYTES, DEFAULT_DEDUP_WINDOW_S, DEFAULT_LEASE_S, MAX_MESSAGE_SIZE
from ..protocol.frames import Delivery, Outcome, Send
from . import ownership, stats
from .channel_index import ChannelIndex
from .commits import Commits
from .dead_letters import DeadLetters
from .dedup import DedupWindow
from .delivery import Dispatcher
from .expiry import Expiry
from .group import Group, NeedLoad, Subscription
from .in_flight import InFlightBytes
from .kv import Revision
from .log import ChannelLog, ChannelOptions, Msg
from .producers import Producers, ProducerState
from .publishing import Publishing
from .restore import LISTEN_KEYS_META, Restorer
from .rights import Rights
from .session import Session
from .settlement import Settlement
from .snapshot import Snapshot
from .state import BrokerState
from .stats import Counters
from .subscriptions import Subscriptions
from .timers import Timers
from .transactions import WRITER_LINEAGE_META, Transactions
from .txn_publishing import TxnPublishing
from .writes import WriteBatch

__all__ = ["LISTEN_KEYS_META", "WRITER_LINEAGE_META", "Broker", "Session"]

_T = TypeVar("_T")


class _Shared(Generic[_T]):
    """A ``Broker`` attribute that lives in its ``BrokerState``, read and set through it:
    the parts hold the state, so they see what the adapter sets (a reload's rules)."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    @overload
    def __get__(self, obj: None, owner: type) -> _Shared[_T]: ...
    @overload
    def __get__(self, obj: Broker, owner: type) -> _T: ...
    def __get__(self, obj: Broker | None, owner: type) -> _T | _Shared[_T]:
        return self if obj is None else getattr(obj.state, self.name)  # type: ignore[no-any-return]

    def __set__(self, obj: Broker, value: _T) -> None:
        setattr(obj.state, self.name, value)


class Broker:
    """The broker core: one per server. See the module docstring."""

    broker_id = _Shared[str]()
    cache_budget = _Shared[int]()
    max_message_size = _Shared[int]()
    max_channels = _Shared[int]()
    dedup_window = _Shared[float]()
    default_lease = _Shared[float]()
    options_for = _Shared[Callable[[str], ChannelOptions]]()
    rules = _Shared[Rules]()
    strict_schemas = _Shared[bool]()
    any_interval = _Shared[bool]()
    storage_refusal = _Shared["RequestError | None"]()
    channels = _Shared[dict[str, ChannelLog]]()
    channel_index = _Shared[ChannelIndex]()
    groups = _Shared[dict[str, Group]]()
    batch = _Shared[WriteBatch]()
    dedup = _Shared[DedupWindow]()
    in_flight = _Shared[InFlightBytes]()
    producers = _Shared[Producers]()
    transactions = _Shared[Transactions]()
    reservations = _Shared[dict[str, str]]()
    replays = _Shared[list[tuple[int, ProducerState, int]]]()
    early_duplicates = _Shared[list[tuple[int, "ProducerState | None", int]]]()
    counters = _Shared[Counters]()
    schema_refusals = _Shared[dict[str, int]]()
    read_refusals = _Shared[dict[str, list[Any]]]()
    delivery_latency = _Shared[Any]()
    ack_latency = _Shared[Any]()

    def __init__(
        self,
        *,
        broker_id: str = "minou",
        channel_options: Callable[[str], ChannelOptions] | None = None,
        max_message_size: int = MAX_MESSAGE_SIZE,
        dedup_window: float = DEFAULT_DEDUP_WINDOW_S,
        default_lease: float = DEFAULT_LEASE_S,
        cache_budget: int = BODY_CACHE_BYTES,
    ) -> None:
        self.state = BrokerState(
            broker_id=broker_id, options_for=channel_options,
            max_message_size=max_message_size, dedup_window=dedup_window,
            default_lease=default_lease, cache_budget=cache_budget)
        self.publishing = Publishing(self.state)
        self.dead_letters = DeadLetters(self.state)
        self.settlement = Settlement(self.state, self.dead_letters)
        self.timers = Timers(self.state, self.dead_letters, self.settlement)
        self.commits = Commits(self.state)
        self.rights = Rights(self.state)
        self.subscriptions = Subscriptions(self.state, self.rights, self.settlement)
        self.dispatcher = Dispatcher(self.state, self.dead_letters)
        self.txn_publishing = TxnPublishing(self.state, self.publishing)
        self.restorer = Restorer(self.state)
        self.expiry = Expiry(self.state, self.subscriptions)

    # ------------------------------------------------------------------ logs
    def options(self, channel: str) -> ChannelOptions:
        """The options of ``channel`` (a dead-letter channel has its channel's)."""
        return self.state.options(channel)

    def mark_ready(self, group: Group) -> None:
        """Let the next pump serve ``group``, if it has something ready and a member
        (a member's connection can take more again)."""
        self.state.mark_ready(group)

    def new_id(self, log: ChannelLog, seq: int) -> str:
        """A message id names its channel (a 64-bit hash) and seq, so a receipt lookup
        finds the message without an index: ``<16 hex digits><seq in hex>``."""
        return self.state.ids.new_id(log, seq)

    def find_message(self, message_id: str) -> tuple[ChannelLog, int] | None:
        """The channel and seq a message id names, if that channel is known.

        Raises UnknownDelivery when two known channels share the id's 64-bit hash (a
        collision someone made on purpose): the id then names no single message, and
        answering for either channel could hand one client's receipt to another.
        """
        return self.state.ids.find(message_id, self.state.channels)

    # --------------------------------------------------------------- publish
    def publish(self, sends: Iterable[Send], now: float, access: Access = ALLOW_ALL,
                session: Session | None = None, refuse: RequestError | None = None,
                resp_door: bool = False) -> tuple[list[Outcome], list[Msg]]:
        """Validate and stage ``sends``: one outcome each, and the staged messages
        (``Publishing.publish``; ``self.replays`` lists the answers it repeated)."""
        return self.publishing.publish(sends, now, access, session, refuse, resp_door)

    def settle_duplicates(self, outcomes: list[Outcome],
                          early: list[tuple[int, ProducerState | None, int]]) -> None:
        """Answer early duplicates once their commit came (``Publishing``)."""
        self.publishing.settle_duplicates(outcomes, early)

    # ---------------------------------------------------------------- commit
    @property
    def has_dirty(self) -> bool:
        """Group or producer states changed that no commit has carried yet."""
        return self.commits.has_dirty

    def take_writes(self) -> WriteBatch:
        """Hand the pending batch to the writer; start a new one."""
        return self.commits.take_writes()

    def on_committed(self, batch: WriteBatch, now: float) -> None:
        """The batch is durable: make its messages visible."""
        self.commits.on_committed(batch, now)

    def on_failed(self, batch: WriteBatch, error: RequestError) -> None:
        """The commit of ``batch`` failed and wrote nothing (a full disk): see
        ``Commits.on_failed``."""
        self.commits.on_failed(batch, error)

    def after_commit(self, callback: Callable[[], None],
                     failed: Callable[[RequestError], None] | None = None) -> None:
        """Call ``callback`` once what is staged now is durable; ``failed`` (with the
        error) if that commit fails. Without ``failed``, the callback waits for the
        commit that makes it durable."""
        self.commits.after_commit(callback, failed)

    def retention_candidates(self, now: float = 0.0, start: int = 0,
                             count: int | None = None) -> list[tuple[str, int]]:
        """Channels with a retention period and the seq below which all readers settled
        (those found all too young to go are left out until they can: see
        ``retention_looked``), of ``count`` channels from the ``start``-th if given."""
        return self.commits.retention_candidates(now, start, count)

    def retention_looked(self, channel: str, floor: int, first: int | None,
                         now: float) -> None:
        """Storage's answer for a retention candidate (``retained_until``): truncate
        below ``first`` (None: nothing), and when to look at the channel again."""
        self.commits.retention_looked(channel, floor, first, now)

    def truncate(self, channel: str, first_seq: int) -> None:
        """Retention passed for every seq below ``first_seq``: forget them."""
        self.commits.truncate(channel, first_seq)

    # ------------------------------------------------------------- subscribe
    def subscribe(
        self,
        session: Session,
        sid: int,
        *,
        kind: str,
        patterns: list[str],
        group: str | None = None,
        start: str = "",
        prefetch: int = 0,
        lease: float = 0.0,
        name: str | None = None,
        exclusive: bool = False,
        now: float,
    ) -> Subscription:
        return self.subscriptions.subscribe(
            session, sid, kind=kind, patterns=patterns, group=group, start=start,
            prefetch=prefetch, lease=lease, name=name, exclusive=exclusive, now=now)

    def add_pattern(self, session: Session, sid: int, pattern: str, now: float) -> None:
        self.subscriptions.add_pattern(session, sid, pattern, now)

    def remove_pattern(self, session: Session, sid: int, pattern: str, now: float) -> None:
        """Stop ``sid``'s group reading ``pattern`` (the time is not needed: the
        group's deliveries on the channels it leaves are forgotten, not returned)."""
        self.subscriptions.remove_pattern(session, sid, pattern)

    def unsubscribe(self, session: Session, sid: int, now: float) -> None:
        self.subscriptions.unsubscribe(session, sid, now)

    def disconnect(self, session: Session, now: float) -> None:
        """Return every unsettled delivery of ``session`` to the front of its queue."""
        self.subscriptions.disconnect(session, now)

    # ---------------------------------------------------------- access rules
    def check_read(self, session: Session, *patterns: str) -> None:
        """The one check every read makes, rules then reservations; the read claims the
        free exclusive channels it names (``Rights.check_read``)."""
        self.rights.check_read(session, *patterns)

    def may_read(self, session: Session, pattern: str) -> bool:
        """``check_read``'s answer, without raising, recording or claiming."""
        return self.rights.may_read(session, pattern)

    def read_refusal(self, session: Session, pattern: str) -> NotAuthorized | None:
        """Why ``session`` may not read ``pattern`` (the rules, then a reservation by
        another client), or None; ``check_read`` without raising, recording or claiming."""
        return self.rights.read_refusal(session, pattern)

    def release(self, channel: str) -> str | None:
        """Admin: free a reserved channel for the next reader to claim. Refused while a
        client still reads it (or its dead letters) live: it would go on reading beside
        the next owner."""
        return self.rights.release(channel)

    # ----------------------------------------------------------------- pump
    def pump(self, now: float) -> tuple[dict[Subscription, list[Delivery]], list[NeedLoad]]:
        """Hand ready messages to subscriptions with credit; return the deliveries per
        subscription and the loads to answer with ``on_loaded``."""
        return self.dispatcher.pump(now)

    @property
    def has_ready(self) -> bool:
        """Work is left that a further pump round can deliver (burst limits hit)."""
        return bool(self.state.ready_groups)

    def on_loaded(self, channel: str, from_seq: int, msgs: list[Msg], upto: int) -> None:
        """Storage returned the live messages of ``[from_seq, upto)``."""
        self.dispatcher.on_loaded(channel, from_seq, msgs, upto)

    # ------------------------------------------------------------ settlement
    def ack(self, session: Session, tags: Iterable[int],
            now: float | None = None) -> list[tuple[int, int, str]]:
        return self.settlement.ack(session, tags, now)

    def nack(
        self, session: Session, tags: Iterable[int], *, delay: float, front: bool, now: float
    ) -> list[tuple[int, int, str]]:
        return self.settlement.nack(session, tags, delay=delay, front=front, now=now)

    def extend(
        self, session: Session, tags: Iterable[int], seconds: float, now: float
    ) -> list[tuple[int, int, str]]:
        return self.settlement.extend(session, tags, seconds, now)

    def withdraw(self, session: Session, tags: Iterable[int], now: float) -> None:
        """Deliveries the adapter could hand to nobody (the request waiting for them went
        away): back to the front of their queue at once, as if never sent (the attempt
        does not count). Unknown tags are ignored."""
        self.settlement.withdraw(session, tags, now)

    # ----------------------------------------------------------------- time
    def tick(self, now: float) -> list[tuple[str, int]]:
        """Run the timers; return the channels idle expiry removed (name, messages)."""
        self.timers.tick(now)
        return self.expiry.tick(now)

    def apply_options(self, now: float) -> None:
        """After a reload changed ``options_for``: every channel takes its new options
        (idle expiry starts or stops watching it; its idle time starts again)."""
        state = self.state
        for name, log in state.channels.items():
            log.options = state.options(name)
            state.track_expiry(log, now)

    def trim_cache(self) -> int:
        """Keep message bodies in memory under the budget; return bytes freed."""
        return self.timers.trim_cache()

    def expire(self, items: Iterable[Msg | tuple[str, int]], now: float) -> int:
        """Storage found these messages past their TTL; dead-letter them.

        Items are the messages read back from storage (so their bodies can be
        dead-lettered), or ``(channel, seq)`` pairs when only memory knows them.
        """
        return self.timers.expire(items)

    # -------------------------------------------------------------- restore
    def restore(self, snap: Snapshot, now: float) -> None:
        """Rebuild memory from storage after a start."""
        self.restorer.restore(snap, now)

    def index_bucket(self, channel: str, msgs: Sequence[Revision | Msg]) -> None:
        """Index a bucket's stored revisions (``msgs``, in seq order; a page at a time
        is fine) after a start or an adoption; revisions past its history depth are
        deleted with the next commit."""
        log = self.state.channels.get(channel)
        if log is not None and log.kv is not None:
            self.commits.compact(log, log.kv.rebuild(msgs, log.options.history))

    # ------------------------------------------------ queues spread over brokers
    def adopt(self, snap: Snapshot, now: float) -> list[ChannelLog]:
        """Take a queue over while running: add its stored part (``ownership``)."""
        return self.restorer.adopt(snap, now)

    def release_queue(self, queue: str, now: float) -> int:
        """Hand ``queue`` on: forget it (``ownership.release``); the deliveries forgotten."""
        return ownership.release(self.state, queue, now)

    def freeze_queue(self, queue: str, frozen: bool = True) -> int:
        """Stop (or resume) delivering ``queue``; its deliveries still out
        (``ownership.freeze``)."""
        return ownership.freeze(self.state, queue, frozen)

    def queue_pending(self, queue: str) -> bool:
        """Whether the next commit would write something of ``queue``."""
        return ownership.pending_for(self.state, queue)

    def held_queues(self) -> set[str]:
        return ownership.held_queues(self.state)

    def migrate_listen_keys(self, registered: Iterable[str]) -> dict[str, str]:
        """Once, on the first start after an upgrade: give the listeners older versions
        stored their unambiguous keys (``names.migrate_listen_key``), deciding by the
        ``registered`` client ids. Returns ``{old key: new key}`` for the renamed ones."""
        return self.restorer.migrate_listen_keys(registered)

    # --------------------------------------------------- staged, fenced publishes
    def stage(self, session: Session, txn: str, sends: list[Send], now: float) -> int:
        """Validate and hold ``sends`` under ``txn`` (refused messages refuse the frame)."""
        return self.txn_publishing.stage(session, txn, sends, now)

    def abort_txns(self, session: Session, txns: list[str]) -> int:
        return self.txn_publishing.abort(session, txns)

    def expire_txns(self, now: float) -> int:
        return self.txn_publishing.expire(now)

    def commit_txns(self, session: Session, writer_id: str, batch_id: int, txns: list[str],
                    now: float, lineage: str = "", after: int = -1) -> dict[str, Any]:
        """Publish the transactions in the pending batch, fenced per (writer, channel):
        all of it or, if anything would be refused, nothing (the transactions stay
        staged and the fences where they were, so the writer may abort and replay)."""
        return self.txn_publishing.commit(session, writer_id, batch_id, txns, now, lineage,
                                          after)

    def txns_present(self, session: Session, txns: list[str]) -> list[str]:
        """Those of ``txns`` this client staged here (or committed here lately)."""
        return self.transactions.present(session.client_id, txns)

    def txn_replay_holds(self, writer_id: str, batch_id: int, channels: list[str]) -> bool:
        """Whether a replay's "discarded" still holds (``TxnPublishing.replay_holds``)."""
        return self.txn_publishing.replay_holds(writer_id, batch_id, channels)

    def release_writer(self, writer_id: str, *, drop_fences: bool = False) -> str | None:
        """Admin: free a writer id for the next client that commits under it (its
        fences stay, so a job moved to another client id stays exactly-once, unless
        ``drop_fences``: after a squatter's commit). Returns the owner it had."""
        return self.txn_publishing.release_writer(writer_id, drop_fences=drop_fences)

    # ----------------------------------------------------------- positions
    def offsets(self, session: Session, patterns: list[str]) -> dict[str, list[int]]:
        """``{channel: [first_seq, next_seq]}`` for every channel the patterns match."""
        return self.subscriptions.offsets(session, patterns)

    def match_offsets(self, session: Session, patterns: list[str], out: dict[str, list[int]],
                      step: int = 0) -> Iterator[None]:
        """``offsets`` in steps: see ``Subscriptions.match_offsets``."""
        return self.subscriptions.match_offsets(session, patterns, out, step)

    def set_position(self, session: Session, group: str, positions: dict[str, int],
                     now: float) -> dict[str, int]:
        """Everything below ``positions[channel]`` is settled for consumer ``group``."""
        return self.subscriptions.set_position(session, group, positions, now)

    # ---------------------------------------------------------------- stats
    def channel_stats(self, log: ChannelLog, now: float) -> dict[str, Any]:
        return stats.channel_stats(log)

    def group_stats(self, grp: Group, now: float) -> dict[str, Any]:
        return stats.group_stats(grp)
