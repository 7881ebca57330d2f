"""What every part of the broker shares: channels, groups, the pending write batch, and
the sets that say which group channels need a pump, a save or a timer.

One ``BrokerState`` is handed to each part (publishing, subscriptions, delivery,
settlement, timers, ...); ``Broker``'s public attributes are this object's. The parts
keep the state, never the batch or a table taken from it past one call:
``take_writes`` replaces the batch, ``migrate_listen_keys`` the groups table, and the
adapter the settings on a reload.

The three work sets, each a dict used as an ordered set:

- ``ready_groups``: groups with a member and something ready; ``pump`` serves them.
- ``dirty``: group channels whose durable state the next batch must carry.
- ``timed``: group channels with delayed or scheduled messages; ``tick`` releases them.
"""

from __future__ import annotations

import heapq
import itertools
import secrets
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ..auth.rules import Rules
from ..errors import QueueFull, RequestError
from ..limits import (
    DEFAULT_MAX_CHANNELS,
    INBOXES_SHARE,
    MAX_PRODUCER_STATES,
    MAX_SCHEDULED_MESSAGES,
    PRODUCER_IDLE_S,
)
from ..names import INBOX_PREFIX, inbox_owner, is_dead_letter, is_kv, match_keys, schema_key
from .channel_index import ChannelIndex
from .dedup import DedupWindow
from .group import Group, GroupChannel, Lease, PatternIndex
from .ids import MessageIds
from .in_flight import InFlightBytes
from .kv import KvCount
from .log import CachedBytes, ChannelLog, ChannelOptions, SpecialCount
from .producers import Producers, ProducerState
from .stats import Counters
from .transactions import Transactions
from .writes import WriteBatch

# Stale entries allowed in the idle-expiry heap past twice the watched channels.
EXPIRY_HEAP_SLACK = 1024


class BrokerState:
    def __init__(
        self, *, broker_id: str, options_for: Callable[[str], ChannelOptions] | None,
        max_message_size: int, dedup_window: float, default_lease: float, cache_budget: int,
    ) -> None:
        # Settings; the adapter sets these again on a reload.
        self.broker_id = broker_id
        self.options_for: Callable[[str], ChannelOptions] = (
            options_for or (lambda key: ChannelOptions()))
        self.max_message_size = max_message_size
        self.max_channels = DEFAULT_MAX_CHANNELS  # the adapter sets the config's
        self.inboxes: Counter[str] = Counter()  # client -> its inbox channels held
        self.dedup_window = dedup_window
        self.default_lease = default_lease
        self.cache_budget = cache_budget
        self.rules = Rules.parse(None)
        self.strict_schemas = False  # pragma: no mutate  (falsy either way)
        # Some channel's durability is "interval" (the adapter sets it from the config):
        # only then are a batch's channels looked at for how soon it must be fsync'd.
        self.any_interval = False
        # Set by the adapter while storage is full: every publish is refused with it.
        self.storage_refusal: RequestError | None = None
        # Queues spread over brokers: whether this broker serves a channel's queue (a
        # reader naming a channel of another broker's queue makes no channel of it
        # here); None: every queue.
        self.hosts: Callable[[str], bool] | None = None

        # Channels and groups change only through add_channel / drop_channel and
        # add_group / drop_group, which keep their indexes: ``channel_index`` (the
        # channels a wildcard matches) and ``patterns`` (the groups reading a channel).
        self.channels: dict[str, ChannelLog] = {}
        self.channel_index = ChannelIndex()
        self.groups: dict[str, Group] = {}
        # Who made each group since this broker started (not stored): a client's share
        # of MAX_GROUPS is counted from it (Subscriptions._may_make_group).
        self.group_makers: dict[str, str] = {}
        # Idle expiry (core/expiry.py): the channels whose options set expire_idle, and
        # the next seq of each channel removed so far (a channel made again goes on there)
        # Each watched channel with the time its entry in ``expiry_heap`` is due, when
        # Expiry looks at it again: a scan of every watched channel each second held the
        # loop ~50 ms at 100,000 (inboxes expire by default). Entries whose due is not
        # the channel's here are stale (dropped, or watched again since) and skipped.
        self.expiring: dict[ChannelLog, float] = {}
        self.expiry_heap: list[tuple[float, int, ChannelLog]] = []
        self._expiry_pushes = itertools.count()
        self.patterns = PatternIndex()  # patterns over every group (core/group.py)
        self.special_count = SpecialCount()  # priority or delayed messages held (core/log.py)
        self.cached_bytes = CachedBytes()  # message bodies cached over every channel
        self.kv_count = KvCount()  # revisions indexed over every bucket (core/kv.py)
        self.retired: dict[str, int] = {}
        # Retired names whose tombstone goes with a batch not yet committed (forgets)
        self.forgetting: set[str] = set()
        # Signs the reply tokens of request deliveries (core/replies.py); brokers that
        # spread the queues share one (the server sets it), one alone has its own.
        self.reply_secret = secrets.token_bytes(32)
        self.batch = WriteBatch()
        # Batches handed to the writer so far, and the highest one durable: a delivery
        # taken after batch ``taken`` has its attempt count stored with the next one.
        self.taken = 0  # pragma: no mutate  (only differences to durable matter)
        self.durable = 0
        self.ready_groups: dict[Group, None] = {}
        self.in_flight = InFlightBytes(self.mark_ready, self.ready_first)
        self.dirty: dict[GroupChannel, None] = {}
        self.timed: dict[GroupChannel, None] = {}
        # Leases extended past their subscription's expiry order: (expires, tag, the
        # lease's extends then, lease). Only an entry whose number is the lease's own is
        # live; ``lease_heap_kept``: how many were live at the last compaction.
        self.lease_heap: list[tuple[float, int, int, Lease]] = []
        self.lease_heap_kept = 0
        self.ids = MessageIds()
        self.dedup = DedupWindow()  # (channel, dedup key) -> seq, id; its max_keys is set
        self.producers = Producers(MAX_PRODUCER_STATES, PRODUCER_IDLE_S)
        # Set by publish(): outcomes answered from a producer's state, (index, state,
        # sequence), to be answered again once the commit they follow is durable.
        self.replays: list[tuple[int, ProducerState, int]] = []  # pragma: no mutate
        # Set by publish(): (index, producer state, sequence) of outcomes answered as
        # duplicates of a message not yet durable (its batch pending or being written);
        # they are answered after the next commit, and only if that message was stored.
        self.early_duplicates: list[tuple[int, ProducerState | None, int]] = []  # pragma: no mutate
        # message id -> the early duplicates waiting on it (the producer state and
        # sequence of a numbered one); ``lost``: those a failed commit dropped
        # (Commits.on_failed), with its error, which their duplicates get.
        self.awaited: dict[str, list[tuple[ProducerState | None, int]]] = {}
        self.lost: dict[str, RequestError] = {}
        self.transactions = Transactions()
        self.reservations: dict[str, str] = {}  # exclusive (!) channel -> owning client

        self.counters = Counters()
        self.schema_refusals: dict[str, int] = {}  # "orders/v1" -> payloads refused
        self.read_refusals: dict[str, list[Any]] = {}  # pattern -> [refusals, last client]
        # Histograms the adapter may plug in (anything with observe(seconds) and
        # observe_since(now, list of times): observe(now - t) for each).
        self.delivery_latency: Any = None  # published -> first delivered
        self.ack_latency: Any = None  # delivered -> acked

    def options(self, channel: str) -> ChannelOptions:
        """The options of ``channel`` (a dead-letter channel has its channel's: its
        schema key is that channel's; a bucket has its own)."""
        return self.options_for(channel if is_kv(channel) else schema_key(channel))

    def check_new_channels(self, count: int) -> None:
        """Raise unless ``count`` more channels may be made (dead letters are made
        whatever the count: a message that failed must never be lost)."""
        held = len(self.channels)
        if count and held + count > self.max_channels:
            raise QueueFull(
                f"the broker holds {held} channels and the limit is {self.max_channels} "
                "(max_channels): write to channels that exist, let unused ones go "
                "(channel option expire_idle), or raise max_channels",
                limit=self.max_channels)

    def check_new_inboxes(self, names: Iterable[str]) -> None:
        """Raise unless the inboxes among ``names`` (channels to be made) leave each
        owner within its share of ``max_channels`` (``INBOXES_SHARE``): no rule bounds
        them, and one client's could otherwise take every channel."""
        new = Counter(inbox_owner(name) or "" for name in names
                      if name.startswith(INBOX_PREFIX))
        limit = max(1, self.max_channels // INBOXES_SHARE)
        for owner, count in new.items():
            held = self.inboxes.get(owner, 0)
            if held + count > limit:
                raise QueueFull(
                    f"client {owner!r} holds {held} inboxes and may hold {limit} (a "
                    f"tenth of max_channels, {self.max_channels}): use one inbox per "
                    "client object (the client library does), let unused ones go "
                    "(they expire once idle), or raise max_channels",
                    limit=limit, client=owner)

    def add_group(self, grp: Group) -> Group:
        """Keep ``grp`` (its patterns counted and indexed in ``patterns``), last in the
        order of groups."""
        old = self.groups.get(grp.key)
        if old is not None:  # a group replaced: its place in the order goes too
            self.drop_group(old)
        self.groups[grp.key] = grp
        grp.adopt(self.patterns)
        return grp

    def drop_group(self, grp: Group) -> None:
        del self.groups[grp.key]
        grp.adopt(PatternIndex())

    def add_channel(self, log: ChannelLog) -> None:
        """Keep ``log`` (a channel memory did not hold), last in the order of channels."""
        self.channels[log.name] = log
        self.channel_index.add(log)
        if log.name.startswith(INBOX_PREFIX):
            self.inboxes[inbox_owner(log.name) or ""] += 1

    def drop_channel(self, log: ChannelLog) -> None:
        del self.channels[log.name]
        # What it still caches is no longer the broker's (it keeps counting its own).
        self.cached_bytes.total -= log.cache_bytes
        log.cached = CachedBytes()
        log.cached.total = log.cache_bytes
        self.channel_index.remove(log)
        if log.name.startswith(INBOX_PREFIX):
            owner = inbox_owner(log.name) or ""
            self.inboxes[owner] -= 1
            if self.inboxes[owner] <= 0:  # gone: a client seen once is not kept for ever
                del self.inboxes[owner]

    def check_scheduled_room(self, count: int) -> None:
        """Raise unless ``count`` more messages with a priority or a delay may wait
        (those of the pending batch count; a batch being written may pass it a little)."""
        held = self.special_count.total + self.batch.specials
        if count and held + count > MAX_SCHEDULED_MESSAGES:
            raise QueueFull(
                f"{held} messages with a priority or a delay wait already, over every "
                f"channel (the limit is {MAX_SCHEDULED_MESSAGES}: each is held in memory); "
                "publish it without one, or once consumers have taken some",
                limit=MAX_SCHEDULED_MESSAGES)

    def log(self, name: str, now: float) -> ChannelLog:
        """Channel ``name``, created (and attached to the groups that match it) if new."""
        log = self.channels.get(name)
        if log is None:
            log = ChannelLog(name, self.options(name))
            log.special_count = self.special_count
            log.cached = self.cached_bytes
            if log.kv is not None:
                log.kv.count = self.kv_count
            seq = self.retired.pop(name, None)
            if seq is not None:  # it expired: no seq (nor id) is given twice
                log.first_seq = log.end = log.next_seq = log.cache_lo = seq
                if name in self.forgetting:  # made again before its record went
                    self.forgetting.discard(name)
                    if name in self.batch.forgets:  # still pending: it keeps its record
                        self.batch.forgets.remove(name)
            self.add_channel(log)
            self.track_expiry(log, now)
            self.batch.channels[name] = log.next_seq
            for group in self.patterns.groups_of(match_keys(name)):
                # A new channel has no delayed messages to load at ``now``.
                self.attach(group, log, log.first_seq, now)  # pragma: no mutate
        return log

    def track_expiry(self, log: ChannelLog, now: float) -> None:
        """Watch ``log`` for idle expiry if its options say so (dead letters never
        expire: they are the operator's to look at); its idle time starts ``now``."""
        log.touched = now
        idle = log.options.expire_idle
        if idle is not None and not is_dead_letter(log.name):
            self.watch_expiry(log, now + idle)
        else:
            self.expiring.pop(log, None)

    def watch_expiry(self, log: ChannelLog, due: float) -> None:
        """Look at ``log`` for idle expiry again at ``due``."""
        self.expiring[log] = due
        heap = self.expiry_heap
        heapq.heappush(heap, (due, next(self._expiry_pushes), log))
        if len(heap) > 2 * len(self.expiring) + EXPIRY_HEAP_SLACK:
            # Stale entries (channels dropped, or watched again by a reload) would hold
            # their logs until due, for up to expire_idle: one rebuild, now and then.
            heap[:] = [(d, next(self._expiry_pushes), lg) for lg, d in self.expiring.items()]
            heapq.heapify(heap)

    def attach(self, group: Group, log: ChannelLog, cursor: int, now: float) -> GroupChannel:
        """Start ``group`` reading ``log`` at ``cursor``."""
        gc = GroupChannel(group, log, cursor)
        group.gcs[log.name] = gc
        log.states.append(gc)
        gc.load_specials(now)
        if gc.sched:
            self.timed[gc] = None  # pragma: no mutate  (ordered sets: values unused)
        self.mark(gc)
        return gc

    def mark(self, gc: GroupChannel) -> None:
        """Note that ``gc`` changed (persist it) and may have something to deliver."""
        self.dirty[gc] = None  # pragma: no mutate  (ordered sets: values unused)
        gc.group.ready[gc] = None  # pragma: no mutate
        if gc.group.members:
            self.ready_groups[gc.group] = None  # pragma: no mutate

    def mark_ready(self, group: Group) -> None:
        """Let the next pump serve ``group``, if it has something ready and a member."""
        if group.ready and group.members:
            self.ready_groups[group] = None  # pragma: no mutate

    def ready_first(self, groups: Iterable[Group]) -> None:
        """``mark_ready`` each of ``groups``, in that order, ahead of the groups ready
        already (``InFlightBytes``: readers the full pool stopped go before those whose
        settlements made the room)."""
        rest = list(self.ready_groups)
        self.ready_groups.clear()
        for group in groups:
            self.mark_ready(group)
        for group in rest:
            self.ready_groups[group] = None
