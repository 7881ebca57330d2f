"""The broker domain: channels, groups, deliveries, settlement. No I/O, no awaits.

Theory of operation
-------------------
``publish`` validates and assigns seqs, and adds the messages to the pending
``WriteBatch``; they become visible to readers only in ``on_committed``, after
the adapter has made that batch durable, so nothing a consumer sees can be
lost or have its seq reused after a crash. Acks, nacks and subscriptions
change memory at once and are made durable with the next batch; their replies
wait for that commit too (``WriteBatch.on_commit``). A commit that fails (a full
disk) wrote nothing: ``on_failed`` drops its publishes (their seqs become gaps,
their publishers are told) and carries the rest, which memory already holds,
into the next batch; while ``storage_refusal`` is set, publishes are refused.

``pump`` hands ready messages to subscriptions with credit (round-robin inside
a group, rotating over the group's channels) and returns the deliveries per
subscription. When a message body is only in storage, the group channel waits
and ``pump`` returns a load request; the adapter reads a page and calls
``on_loaded``. ``tick`` expires leases and releases delayed messages.

Time is always passed in.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..auth.rules import ALLOW_ALL, Access, Rules
from ..errors import (
    BadRequest,
    ErrorCode,
    MessageTooLarge,
    NotAuthorized,
    QueueFull,
    RequestError,
    SchemaMismatch,
    UnknownDelivery,
    UnknownSubscription,
)
from ..limits import (
    BODY_CACHE_BYTES,
    DEFAULT_DEDUP_WINDOW_S,
    DEFAULT_LEASE_S,
    MAX_BROADCAST_BYTES,
    MAX_BROADCAST_FANOUT,
    MAX_DELAY_S,
    MAX_HEADER_SIZE,
    MAX_HEADERS,
    MAX_KEY_LENGTH,
    MAX_LEASE_S,
    MAX_MESSAGE_SIZE,
    MAX_PREFETCH,
    MAX_PRIORITY,
    MAX_PRODUCER_STATES,
    MAX_SESSION_PRODUCER_STATES,
    MAX_SUBSCRIPTIONS,
    MIN_PRIORITY,
    PRODUCER_IDLE_S,
    RETURNED_FROM_LIMIT,
)
from ..names import (
    broadcast_prefix,
    consume_group_key,
    dead_letter_channel,
    is_dead_letter,
    listen_group_key,
    migrate_listen_key,
    parse_pattern,
    reservation_key,
    schema_key,
    validate_channel,
)
from ..payloads import check_json, decode_json
from ..protocol.frames import Delivery, Outcome, Send
from ..schemas import SchemaViolation
from .dedup import DedupWindow
from .group import Group, GroupChannel, Lease, NeedLoad, Subscription
from .log import ChannelLog, ChannelOptions, Msg
from .producers import Producers, ProducerState
from .snapshot import Snapshot
from .stats import Counters
from .transactions import Transactions
from .writes import WriteBatch

_MESSAGE_ID = re.compile(r"[0-9a-f]{16}[1-9a-f][0-9a-f]{0,14}")  # what new_id makes
LISTEN_KEYS_META = "listen_keys"  # storage meta: "escaped" once older listener keys migrated
WRITER_LINEAGE_META = "writer_lineage:"  # + writer id: the run its fences belong to ("": none)


@dataclass(eq=False)
class Session:
    """One connected client as the core sees it. ``conn`` belongs to the adapter."""

    client_id: str
    conn: Any = None
    subs: dict[int, Subscription] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    access: Access = ALLOW_ALL  # what the rules let this client read and write
    admin: bool = False
    producer_id: str = ""  # numbers this connection's idempotent publishes
    # channel -> its producer state: the publish path looks up the session's own few
    producer_states: dict[str, ProducerState] = field(default_factory=dict)


class Broker:
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
        self.cache_budget = cache_budget
        self.broker_id = broker_id
        self._options_for = channel_options or (lambda key: ChannelOptions())
        self.max_message_size = max_message_size
        self.dedup_window = dedup_window
        self.default_lease = default_lease
        self.channels: dict[str, ChannelLog] = {}
        self.groups: dict[str, Group] = {}
        self.counters = Counters()
        self.batch = WriteBatch()
        self._ready_groups: dict[Group, None] = {}
        self._dirty: dict[GroupChannel, None] = {}
        self._timed: dict[GroupChannel, None] = {}
        self._lease_heap: list[tuple[float, int, Lease]] = []
        self._tags = itertools.count(1)
        self.dedup = DedupWindow()  # (channel, dedup key) -> seq, id; its max_keys is set
        self._by_hash: dict[int, list[str]] = {}
        self._hashed_all = False  # channels restored from storage get hashed on first lookup
        self.rules = Rules.parse(None)
        self.transactions = Transactions()
        self.producers = Producers(MAX_PRODUCER_STATES, PRODUCER_IDLE_S)
        # Set by publish(): outcomes answered from a producer's state, (index, state,
        # sequence), to be answered again once the commit they follow is durable.
        self.replays: list[tuple[int, ProducerState, int]] = []
        self._producers_expired_at = 0.0
        self.strict_schemas = False
        self.reservations: dict[str, str] = {}  # exclusive (!) channel -> owning client
        self._listen_keys_escaped = False  # restore() reads the storage's marker
        self.schema_refusals: dict[str, int] = {}  # "orders/v1" -> payloads refused
        # Set by the adapter while storage is full: every publish is refused with it.
        self.storage_refusal: RequestError | None = None
        self.read_refusals: dict[str, list[Any]] = {}  # pattern -> [refusals, last client]
        # Histograms the adapter may plug in (anything with observe(seconds)).
        self.delivery_latency: Any = None  # published -> first delivered
        self.ack_latency: Any = None  # delivered -> acked

    # ------------------------------------------------------------------ logs
    def options(self, channel: str) -> ChannelOptions:
        base = channel[len("_dead/"):] if is_dead_letter(channel) else channel
        return self._options_for(schema_key(base))

    def _log(self, name: str, now: float) -> ChannelLog:
        log = self.channels.get(name)
        if log is None:
            log = ChannelLog(name, self.options(name))
            self.channels[name] = log
            self.batch.channels[name] = log.next_seq
            for group in self.groups.values():
                if group.matches(name):
                    self._attach(group, log, log.first_seq, now)
        return log

    def _attach(self, group: Group, log: ChannelLog, cursor: int, now: float) -> GroupChannel:
        gc = GroupChannel(group, log, cursor)
        group.gcs[log.name] = gc
        log.states.append(gc)
        gc.load_specials(now)
        if gc.sched:
            self._timed[gc] = None
        self._mark(gc)
        return gc

    def _mark(self, gc: GroupChannel) -> None:
        """Note that ``gc`` changed (persist it) and may have something to deliver."""
        self._dirty[gc] = None
        gc.group.ready[gc] = None
        if gc.group.members:
            self._ready_groups[gc.group] = None

    # --------------------------------------------------------------- publish
    def new_id(self, log: ChannelLog, seq: int) -> str:
        """A message id names its channel (a 64-bit hash) and seq, so a receipt lookup
        finds the message without an index: ``<16 hex digits><seq in hex>``."""
        return f"{self.channel_hash(log):016x}{seq:x}"

    def channel_hash(self, log: ChannelLog) -> int:
        h = log.id_hash
        if not h:
            h = log.id_hash = int.from_bytes(
                hashlib.blake2b(log.name.encode(), digest_size=8).digest(), "big") or 1
            self._by_hash.setdefault(h, []).append(log.name)
        return h

    def find_message(self, message_id: str) -> tuple[ChannelLog, int] | None:
        """The channel and seq a message id names, if that channel is known.

        Raises UnknownDelivery when two known channels share the id's 64-bit hash (a
        collision someone made on purpose): the id then names no single message, and
        answering for either channel could hand one client's receipt to another.
        """
        if not _MESSAGE_ID.fullmatch(message_id):
            return None
        h, seq = int(message_id[:16], 16), int(message_id[16:], 16)
        if not self._hashed_all:  # ids of channels created before this run: hash them once
            for log in self.channels.values():
                self.channel_hash(log)
            self._hashed_all = True
        logs = {name: log for name in self._by_hash.get(h, ())
                if (log := self.channels.get(name)) is not None and log.id_hash == h}
        if len(logs) > 1:
            raise UnknownDelivery(f"message id {message_id!r} is ambiguous: more than one "
                                  "channel shares its hash, so it names no single message",
                                  id=message_id)
        for log in logs.values():
            return log, seq
        return None

    def publish(self, sends: Iterable[Send], now: float, access: Access = ALLOW_ALL,
                session: Session | None = None, refuse: RequestError | None = None,
                ) -> tuple[list[Outcome], list[Msg]]:
        """Validate and stage ``sends``; return one outcome each and the staged messages.

        A send with a producer sequence (``pseq``) from a ``session`` with a producer id
        is checked against that producer's state first: a sequence handled before is
        answered as it was (``self.replays`` lists those), not stored again. ``refuse``
        refuses every send with it (the broker is stopping), remembered like any refusal.
        """
        outcomes: list[Outcome] = []
        staged: list[Msg] = []
        full = refuse or self.storage_refusal
        self.replays = []
        numbered = session is not None and bool(session.producer_id)
        for send in sends:
            if numbered and send.pseq:
                self._publish_numbered(send, now, staged, access, session, outcomes, full)  # type: ignore[arg-type]
                continue
            try:
                if full is not None:
                    raise type(full)(full.message, **full.detail)
                outcomes.append(self._publish_one(send, now, staged, access))
            except RequestError as exc:
                outcomes.append(self._refusal(send, exc))
        self.batch.publishes += staged
        return outcomes, staged

    def _refusal(self, send: Send, exc: RequestError) -> Outcome:
        self.counters.refuse(exc.reason)
        return Outcome(channel=str(send.channel)[:255], code=int(exc.code), error=exc.message)

    def _publish_numbered(self, send: Send, now: float, staged: list[Msg], access: Access,
                          session: Session, outcomes: list[Outcome],
                          full: RequestError | None) -> None:
        """A publish with its producer's sequence: answered from the producer's state if
        that sequence was handled before (even while publishes are refused: it was
        stored then), else published and the state moved on."""
        state = session.producer_states.get(send.channel)
        if state is None or state.evicted:
            state = self._producer_state(session, send.channel, now)
        else:
            state.used = now
        pseq = send.pseq
        try:
            if pseq != state.last + 1:  # not the usual case
                replay = self.producers.check(state, pseq, send.channel)
                if replay is not None:
                    if replay.duplicate:
                        self.counters.duplicates += 1
                    self.replays.append((len(outcomes), state, pseq))
                    outcomes.append(replay)
                    return
            if full is not None:
                raise type(full)(full.message, **full.detail)
            outcome = self._publish_one(send, now, staged, access)
        except RequestError as exc:
            outcomes.append(self._refusal(send, exc))
            if exc.code != ErrorCode.OUT_OF_SEQUENCE:
                state.refuse(pseq, pseq, int(exc.code), exc.message)
                self.producers.mark(state)
            return
        outcomes.append(outcome)
        state.stored(pseq, outcome.seq, outcome.id)
        self.producers.dirty[state] = None
        self.batch.sequenced.append((state, pseq))

    def _producer_state(self, session: Session, channel: str, now: float) -> ProducerState:
        known = session.producer_states.get(channel)
        if len(session.producer_states) >= MAX_SESSION_PRODUCER_STATES:
            session.producer_states.clear()  # a cache: the states stay in self.producers
        state = self.producers.state((session.client_id, session.producer_id, channel), now,
                                     known)
        session.producer_states[channel] = state
        return state

    def _check(self, send: Send, target: str) -> None:
        size = len(send.data)
        if size > self.max_message_size:
            raise MessageTooLarge(
                f"message of {size} bytes is over the {self.max_message_size} byte limit",
                limit=self.max_message_size, size=size,
            )
        log = self.channels.get(target)
        schema = (log.options if log is not None else self.options(target)).schema
        if schema is not None:
            self._check_schema(send, schema)
        elif self.strict_schemas and not is_dead_letter(target):
            key = schema_key(target)
            self.schema_refusals[key] = self.schema_refusals.get(key, 0) + 1
            raise SchemaMismatch(f"{key} declares no schema and strict_schemas is on: "
                                 "declare channels.\"" + key + "\".schema", schema=key)
        elif not send.raw:
            check_json(send.data)
        if send.headers:
            if len(send.headers) > MAX_HEADERS:
                raise BadRequest(f"{len(send.headers)} headers, the limit is {MAX_HEADERS}")
            if sum(len(k) + len(v) for k, v in send.headers.items()) > MAX_HEADER_SIZE:
                raise BadRequest(f"headers are over the {MAX_HEADER_SIZE} byte limit")
        for label, text in (("dedup key", send.dedup), ("message key", send.key)):
            if text is not None and len(text) > MAX_KEY_LENGTH:
                raise BadRequest(f"{label} is {len(text)} characters, the limit is "
                                 f"{MAX_KEY_LENGTH}", limit=MAX_KEY_LENGTH)
        if send.priority and not MIN_PRIORITY <= send.priority <= MAX_PRIORITY:
            raise BadRequest(
                f"priority {send.priority} is outside {MIN_PRIORITY}..{MAX_PRIORITY}"
            )
        if send.ttl is not None or send.delay is not None:
            for label, value in (("ttl", send.ttl), ("delay", send.delay)):
                if value is not None and not 0 <= value <= MAX_DELAY_S:
                    raise BadRequest(f"{label} must be 0..{MAX_DELAY_S:g} seconds, got {value}")

    def _check_schema(self, send: Send, schema: Any) -> None:
        if send.raw:
            self.schema_refusals[schema.key] = self.schema_refusals.get(schema.key, 0) + 1
            raise SchemaMismatch(f"{schema.key} has a JSON schema; raw payloads are refused",
                                 schema=schema.key)
        value = decode_json(send.data)
        try:
            schema.validate(value)
        except SchemaViolation as exc:
            self.schema_refusals[schema.key] = self.schema_refusals.get(schema.key, 0) + 1
            raise SchemaMismatch(
                f"payload does not match the schema of {schema.key}: {exc.path}: {exc.reason}",
                schema=schema.key, path=exc.path, why=exc.reason,
            ) from None

    def validate(self, send: Send, access: Access) -> str | None:
        """Everything a publish checks before storing (name, rules, size, JSON, schema);
        return the broadcast prefix, or None for a concrete channel."""
        target = send.channel
        prefix = broadcast_prefix(target) if target.endswith("*") else None
        if prefix is None:
            validate_channel(target)
        if not access.unrestricted:
            access.check_write(target)
        self._check(send, target)
        return prefix

    def _publish_one(self, send: Send, now: float, staged: list[Msg], access: Access) -> Outcome:
        target = send.channel
        prefix = self.validate(send, access)
        if send.dedup:
            seen = self.dedup.get(target, send.dedup, now)
            if seen is not None:
                self.counters.duplicates += 1
                return Outcome(seq=seen[0], id=seen[1], channel=target, duplicate=True)
        if prefix is None:
            msg = self._stage(self._log(target, now), send, now)
            staged.append(msg)
            outcome = Outcome(seq=msg.seq, id=msg.id, channel=target)
        else:
            targets = [log for name, log in self.channels.items()
                       if name.startswith(prefix) and log.states]
            if len(targets) > MAX_BROADCAST_FANOUT or \
                    len(targets) * len(send.data) > MAX_BROADCAST_BYTES:
                raise BadRequest(
                    f"broadcast to {target!r} would store {len(targets)} copies of "
                    f"{len(send.data)} bytes; the limits are {MAX_BROADCAST_FANOUT} channels "
                    f"and {MAX_BROADCAST_BYTES >> 20} MiB per broadcast: send to fewer ids",
                    fanout=len(targets), limit=MAX_BROADCAST_FANOUT)
            for log in targets:  # a broadcast is stored everywhere or nowhere
                self._check_room(log)
            first: Msg | None = None
            for log in targets:
                msg = self._stage(log, send, now)
                staged.append(msg)
                first = first or msg
            outcome = Outcome(seq=first.seq if first else 0, id=first.id if first else "",
                              channel=target, fanout=len(targets))
        if send.dedup:
            expires = now + self.dedup_window
            self.dedup.put(target, send.dedup, expires, outcome.seq, outcome.id)
            self.batch.dedup.append((target, send.dedup, expires, outcome.seq, outcome.id))
        return outcome

    @staticmethod
    def _check_room(log: ChannelLog) -> None:
        opts = log.options
        if (opts.max_items is not None and opts.overflow != "drop_oldest"
                and log.count + log.inflight >= opts.max_items):
            raise QueueFull(
                f"channel {log.name!r} holds {opts.max_items} messages (max_items)",
                channel=log.name, limit=opts.max_items,
            )

    def _stage(self, log: ChannelLog, send: Send, now: float) -> Msg:
        opts = log.options
        self._check_room(log)
        if opts.max_items is not None and log.count + log.inflight >= opts.max_items:
            oldest = log.oldest_live()
            if oldest is not None:
                log.delete_one(oldest)
            else:  # everything is still on its way to disk: drop the oldest of those
                oldest = log.drop_inflight()
            log.dropped += 1
            self.counters.dropped += 1
            self.batch.deletes.append((log.name, oldest))
        ttl = send.ttl if send.ttl is not None else opts.ttl
        msg = Msg(
            log.name, log.next_seq, self.new_id(log, log.next_seq), send.data, send.raw,
            send.headers,
            send.priority, now, now + ttl if ttl else None,
            now + send.delay if send.delay else None, send.key,
        )
        log.next_seq += 1
        log.inflight += 1
        self.batch.channels[log.name] = log.next_seq
        self.batch.messages.append(msg)
        self.batch.bytes += len(send.data)
        return msg

    # ---------------------------------------------------------------- commit
    def take_writes(self) -> WriteBatch:
        """Hand the pending batch to the writer; start a new one."""
        batch = self.batch
        touched: dict[ChannelLog, None] = {}
        for gc in self._dirty:
            if gc.group.gcs.get(gc.log.name) is not gc:
                continue  # detached meanwhile
            batch.group_states[(gc.group.key, gc.log.name)] = gc.durable_state()
            gc.dirty = False
            touched[gc.log] = None
        self._dirty = {}
        if self.producers.dirty or self.producers.gone:
            batch.producers.update(self.producers.take())
        for log in touched:
            if not log.states or log.options.retention is not None:
                continue
            floor = min(gc.floor for gc in log.states)
            if floor > log.first_seq:
                log.truncate_below(floor)
                batch.truncates[log.name] = log.first_seq
                batch.channels[log.name] = log.next_seq  # stored with the removal
        self.batch = WriteBatch()
        return batch

    def on_committed(self, batch: WriteBatch, now: float) -> None:
        """The batch is durable: make its messages visible."""
        for msg in batch.messages:
            log = self.channels.get(msg.channel)
            if log is None:
                continue
            if msg.seq < log.first_seq or msg.seq in log.gone:
                continue  # dropped (overflow) before it was committed
            log.inflight -= 1
            log.append_committed(msg)
            log.count += 1
            log.published += 1
            self.counters.published += 1
            for gc in log.states:
                if msg.special:
                    gc.add_special(msg.seq, msg.priority, msg.deliver_at, now)
                    if msg.deliver_at is not None:
                        self._timed[gc] = None
                gc.group.ready[gc] = None
                if gc.group.members:
                    self._ready_groups[gc.group] = None
        for callback in batch.on_commit:
            callback()

    def on_failed(self, batch: WriteBatch, error: RequestError) -> None:
        """The commit of ``batch`` failed and wrote nothing (a full disk).

        Its publishes are dropped: their seqs become gaps (never visible, never
        confirmed to anyone), their dedup keys and transaction fences are undone, and their
        publishers get ``error``. Everything else (acks, group states, deletes, dead
        letters, registrations) is what memory already holds: it is carried into the
        pending batch and written with it, first. A callback with a failure handler
        gets ``error`` (e.g. an ack's "not durable"); one without waits for that
        commit. Nothing is confirmed that was not written.
        """
        dropped = {id(m) for m in batch.publishes}
        keep: list[Msg] = []
        for msg in batch.messages:
            if id(msg) not in dropped:
                keep.append(msg)
                continue
            log = self.channels.get(msg.channel)
            if log is None or msg.seq < log.first_seq or msg.seq in log.gone:
                continue  # dropped (overflow) before the commit: already a gap
            log.gone.add(msg.seq)
            log.inflight -= 1
        for channel, key, _, seq, msg_id in batch.dedup:
            self.dedup.forget(channel, key, seq, msg_id)
        for owner, txn, _, _ in batch.txn_done:  # not published: never "answered" as if
            self.transactions.done.pop((owner, txn), None)
        for state, pseq in batch.sequenced:  # a resend gets this error, not "stored"
            state.refuse(pseq, pseq, int(error.code), error.message)
            self.producers.mark(state)
        fences, pending = self.transactions.fences, self.batch
        for key, value in batch.fences.items():
            before = batch.fence_undo.get(key)
            if fences.get(key) == value:
                if before is None:
                    fences.pop(key, None)
                else:
                    fences[key] = before
            elif key in pending.fence_undo and pending.fence_undo[key] == value:
                pending.fence_undo[key] = before  # a later commit moved it on meanwhile
        pending.carry(batch, keep)
        waiting = [(ok, fail) for ok, fail in
                   itertools.zip_longest(batch.on_commit, batch.on_fail) if ok is not None]
        pending.on_commit[:0] = [ok for ok, fail in waiting if fail is None]
        pending.on_fail[:0] = [None for ok, fail in waiting if fail is None]
        first: Exception | None = None
        for _, fail in waiting:
            if fail is not None:
                try:
                    fail(error)
                except Exception as exc:  # one handler's bug must not silence the others
                    first = first or exc
        if first is not None:
            raise first

    def after_commit(self, callback: Callable[[], None],
                     failed: Callable[[RequestError], None] | None = None) -> None:
        """Call ``callback`` once what is staged now is durable; ``failed`` (with the
        error) if that commit fails. Without ``failed``, the callback waits for the
        commit that makes it durable."""
        self.batch.on_commit.append(callback)
        self.batch.on_fail.append(failed)

    def retention_candidates(self) -> list[tuple[str, int]]:
        """Channels with a retention period and the seq below which all readers settled."""
        out = []
        for log in self.channels.values():
            if log.options.retention is not None and log.states:
                floor = min(gc.compute_floor() for gc in log.states)
                if floor > log.first_seq:
                    out.append((log.name, floor))
        return out

    def truncate(self, channel: str, first_seq: int) -> None:
        """Retention passed for every seq below ``first_seq``: forget them."""
        log = self.channels.get(channel)
        if log is not None and first_seq > log.first_seq:
            log.truncate_below(first_seq)
            self.batch.truncates[channel] = log.first_seq
            self.batch.channels[channel] = log.next_seq

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
        now: float,
    ) -> Subscription:
        if kind not in ("listen", "consume"):
            raise BadRequest(f"kind must be 'listen' or 'consume', not {kind!r}")
        if not patterns:
            raise BadRequest("subscribe needs at least one pattern")
        parsed = [parse_pattern(p) for p in patterns]
        if sid in session.subs:
            raise BadRequest(f"subscription id {sid} is already in use on this connection")
        if len(session.subs) >= MAX_SUBSCRIPTIONS:
            raise BadRequest(f"{len(session.subs)} subscriptions on one connection already "
                             f"(the limit is {MAX_SUBSCRIPTIONS}); use patterns to cover more "
                             "channels with one")
        texts = [p.text for p in parsed]
        self.check_read(session, *texts, claim=False)
        if kind == "consume":
            key = consume_group_key(group or patterns[0])
        else:
            key = listen_group_key(session.client_id, name or patterns[0])
        start_cursor = self._parse_start(start, kind)
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise BadRequest(f"prefetch must be 0..{MAX_PREFETCH}, got {prefetch}")
        if not 0 <= lease <= MAX_LEASE_S:
            raise BadRequest(f"lease must be 0..{MAX_LEASE_S} seconds, got {lease}")
        grp = self.groups.get(key)
        if grp is not None:
            self._check_group_rights(session, grp, texts)
        # Checked: now this read claims what it reads (the group's channels too).
        self.check_read(session, *texts, *(p.text for p in grp.patterns) if grp else ())
        if grp is None:
            grp = Group(key, kind, [], start or ("new" if kind == "listen" else "oldest"))
            self.groups[key] = grp
        elif start.startswith("seq:") and not grp.members:
            self._reset(grp, start_cursor, now)
        for pattern in parsed:
            self._add_pattern(grp, pattern.text, start_cursor, now)
        if not prefetch:
            first = next(iter(grp.gcs.values()), None)
            prefetch = first.log.options.prefetch if first else self.options_prefetch(patterns[0])
        sub = Subscription(session, sid, grp, prefetch, lease or self.default_lease)
        grp.members.append(sub)
        session.subs[sid] = sub
        if grp.ready:
            self._ready_groups[grp] = None
        return sub

    def _check_group_rights(self, session: Session, grp: Group, patterns: list[str]) -> None:
        """A group hands its members messages of every pattern it reads, so a member
        must be allowed all of them: the joiner the group's patterns (also a durable
        listener's, which rules or reservations may have changed under), and the members
        the joiner's new ones (a group name is no way around the rules)."""
        if grp.kind == "listen":
            name = grp.key[len(listen_group_key(session.client_id, "")):]
            what, instead = f"listener {name!r}", "listen under another name"
        else:
            name = grp.key.removeprefix("consume:")
            what, instead = f"group {name!r}", "consume under a group of your own"
        have = {p.text for p in grp.patterns}
        for text in have:
            try:
                self.check_read(session, text, claim=False)
            except NotAuthorized as exc:
                raise NotAuthorized(
                    f"{what} also reads {text!r}, which client {session.client_id!r} "
                    f"may not ({exc.message}); {instead}",
                    group=name, pattern=text) from None
        for member in grp.members:
            if member.session is session or member.session.admin:
                continue
            for text in patterns:
                # Reserved for the joiner once it reads: another client may not share it.
                if text not in have and self.read_refusal(
                        member.session, text, owner_to_be=session.client_id) is not None:
                    raise NotAuthorized(
                        f"group {name!r} has a member, client {member.session.client_id!r}, "
                        f"that may not read {text!r}; consume it under another group",
                        group=name, pattern=text)

    def options_prefetch(self, pattern: str) -> int:
        body = pattern[len("_dead/"):] if is_dead_letter(pattern) else pattern
        parts = body.split("/")
        if len(parts) >= 2 and parts[1] != "*":
            return self._options_for(f"{parts[0]}/{parts[1]}").prefetch
        return ChannelOptions().prefetch

    @staticmethod
    def _parse_start(start: str, kind: str) -> int | str:
        if start in ("", "new", "oldest"):
            return start or ("new" if kind == "listen" else "oldest")
        if start.startswith("seq:") and start[4:].isascii() and start[4:].isdigit():
            return int(start[4:])
        raise BadRequest(f"start must be 'new', 'oldest' or 'seq:<n>', not {start!r}")

    def _cursor_for(self, log: ChannelLog, start: int | str) -> int:
        if start == "new":
            return log.end
        if start == "oldest":
            return log.first_seq
        return max(int(start), log.first_seq)

    def _add_pattern(self, grp: Group, text: str, start: int | str, now: float) -> None:
        if any(p.text == text for p in grp.patterns):
            return
        pattern = parse_pattern(text)
        grp.patterns.append(pattern)
        self.batch.group_defs[grp.key] = grp.definition()
        if pattern.concrete:
            self._log(text, now)  # a named channel exists from its first reader on
        for name, log in self.channels.items():
            if name not in grp.gcs and pattern.matches(name):
                self._attach(grp, log, self._cursor_for(log, start), now)

    def _reset(self, grp: Group, start: int | str, now: float) -> None:
        for name, gc in list(grp.gcs.items()):
            log = gc.log
            log.states.remove(gc)
            fresh = GroupChannel(grp, log, self._cursor_for(log, start))
            grp.gcs[name] = fresh
            log.states.append(fresh)
            fresh.load_specials(now)
            if fresh.sched:
                self._timed[fresh] = None
            grp.ready.pop(gc, None)
            self._dirty.pop(gc, None)
            self._mark(fresh)

    # ---------------------------------------------------------- access rules
    def check_read(self, session: Session, *patterns: str, claim: bool = True) -> None:
        """The one check every read makes: listen, consume, add_id, range reads, OFFSETS,
        POSITION, HTTP consume, ``/v1/stream``, receipts, dead letters.

        The rules first, then the reservations: an exclusive (!) channel and its dead
        letters belong to the first client that reads either. With ``claim`` this read
        reserves the exclusive channels it names that are still free (after checking
        every pattern, so a refused read claims nothing). Admins are not restricted
        and reserve nothing. Raises NotAuthorized (or InvalidChannel).
        """
        if session.admin:
            return
        for pattern in patterns:
            refusal = self.read_refusal(session, pattern)
            if refusal is not None:
                # Kept for "why is nothing flowing?": a consumer the rules keep out.
                seen = self.read_refusals.setdefault(pattern, [0, ""])
                seen[0] += 1
                seen[1] = session.client_id
                raise refusal
        if claim:
            for pattern in patterns:
                key = reservation_key(pattern)
                if key not in self.reservations and self._exclusive(key):
                    self.reservations[key] = session.client_id
                    self.batch.reservations[key] = session.client_id

    def may_read(self, session: Session, pattern: str) -> bool:
        """``check_read``'s answer, without raising, recording or claiming."""
        return self.read_refusal(session, pattern) is None

    def _exclusive(self, key: str) -> bool:
        return "*" not in key and self.rules.is_exclusive(key)

    def read_refusal(self, session: Session, pattern: str,
                     owner_to_be: str | None = None) -> NotAuthorized | None:
        """Why ``session`` may not read ``pattern``, or None. ``owner_to_be`` counts a
        free exclusive channel as reserved by that client (about to claim it)."""
        if session.admin:
            return None
        try:
            session.access.check_read(pattern)
        except NotAuthorized as exc:
            return exc
        owner = self._owner(pattern, owner_to_be)
        if owner is None or owner == session.client_id:
            return None
        key = reservation_key(pattern)
        what = repr(pattern) if key == pattern else f"{pattern!r} (the dead letters of {key!r})"
        return NotAuthorized(f"channel {what} is reserved by client {owner!r}",
                             channel=pattern, owner=owner)

    def _owner(self, channel: str, owner_to_be: str | None = None) -> str | None:
        key = reservation_key(channel)
        owner = self.reservations.get(key)
        if owner is None and owner_to_be is not None and self._exclusive(key):
            return owner_to_be
        return owner

    def release(self, channel: str) -> str | None:
        """Admin: free a reserved channel for the next reader to claim. Refused while a
        client still reads it (or its dead letters) live: it would go on reading beside
        the next owner."""
        logs = [log for name in (channel, dead_letter_channel(channel))
                if (log := self.channels.get(name)) is not None]
        readers = sorted({sub.session.client_id for log in logs for gc in log.states
                          for sub in gc.group.members if not sub.session.admin})
        if readers and channel in self.reservations:
            raise BadRequest(
                f"channel {channel!r} is still read by client {readers[0]!r} (a live "
                "subscription): end it, or revoke the client, then release the channel",
                channel=channel, client=readers[0])
        owner = self.reservations.pop(channel, None)
        if owner is not None:
            self.batch.reservations[channel] = None
        return owner

    def add_pattern(self, session: Session, sid: int, pattern: str, now: float) -> None:
        sub = self._sub(session, sid)
        text = parse_pattern(pattern).text
        self.check_read(session, text, claim=False)
        self._check_group_rights(session, sub.group, [text])
        self.check_read(session, text)
        grp = sub.group
        self._add_pattern(grp, pattern, "new" if grp.kind == "listen" else "oldest", now)
        if grp.ready and grp.members:
            self._ready_groups[grp] = None

    def remove_pattern(self, session: Session, sid: int, pattern: str, now: float) -> None:
        sub = self._sub(session, sid)
        grp = sub.group
        kept = [p for p in grp.patterns if p.text != pattern]
        if len(kept) == len(grp.patterns):
            raise BadRequest(f"subscription {sid} has no pattern {pattern!r}")
        if not kept:
            raise BadRequest("cannot remove the last pattern; unsubscribe instead")
        grp.patterns = kept
        self.batch.group_defs[grp.key] = grp.definition()
        for name, gc in list(grp.gcs.items()):
            if not grp.matches(name):
                self._detach(gc, now)
        if grp.ready and grp.members:  # credit freed by the detach may serve the rest
            self._ready_groups[grp] = None

    def _detach(self, gc: GroupChannel, now: float) -> None:
        grp = gc.group
        for lease in list(gc.pending.values()):
            lease.sub.unsettled -= 1
            lease.sub.session.leases.pop(lease.tag, None)
            lease.sub.leases.pop(lease.tag, None)
        gc.pending.clear()
        del grp.gcs[gc.log.name]
        gc.log.states.remove(gc)
        grp.ready.pop(gc, None)
        self._dirty.pop(gc, None)
        self._timed.pop(gc, None)
        self.batch.group_states[(grp.key, gc.log.name)] = None

    def _sub(self, session: Session, sid: int) -> Subscription:
        sub = session.subs.get(sid)
        if sub is None:
            raise UnknownSubscription(f"no subscription {sid} on this connection", sid=sid)
        return sub

    def unsubscribe(self, session: Session, sid: int, now: float) -> None:
        sub = self._sub(session, sid)
        self._drop_sub(sub, now)
        del session.subs[sid]

    def _drop_sub(self, sub: Subscription, now: float) -> None:
        sub.active = False
        for lease in [ls for ls in sub.session.leases.values() if ls.sub is sub]:
            self._return(lease, now, front=True, delay=0.0)
            del sub.session.leases[lease.tag]
        sub.leases.clear()
        if sub in sub.group.members:
            sub.group.members.remove(sub)

    def disconnect(self, session: Session, now: float) -> None:
        """Return every unsettled delivery of ``session`` to the front of its queue."""
        for sub in list(session.subs.values()):
            self._drop_sub(sub, now)
        session.subs.clear()
        session.leases.clear()

    # ----------------------------------------------------------------- pump
    def pump(self, now: float) -> tuple[dict[Subscription, list[Delivery]], list[NeedLoad]]:
        out: dict[Subscription, list[Delivery]] = {}
        loads: list[NeedLoad] = []
        for grp in list(self._ready_groups):
            if not self._pump_group(grp, now, out, loads):
                del self._ready_groups[grp]
        for sub in out:
            sub.burst = 0
        return out, loads

    @property
    def has_dirty(self) -> bool:
        """Group or producer states changed that no commit has carried yet."""
        return bool(self._dirty or self.producers.dirty or self.producers.gone)

    @property
    def has_ready(self) -> bool:
        """Work is left that a further pump round can deliver (burst limits hit)."""
        return bool(self._ready_groups)

    def _pump_group(
        self, grp: Group, now: float, out: dict[Subscription, list[Delivery]],
        loads: list[NeedLoad],
    ) -> bool:
        """Deliver what ``grp`` can; True while it still has both ready work and credit."""
        ready = grp.ready
        while ready:
            if grp.member_for() is None:
                # Members that only hit their burst limit get more in the next round.
                return any(m.burst and m.active and not m.paused
                           and m.prefetch > m.unsettled for m in grp.members)
            gc = next(iter(ready))
            try:
                msg = gc.next_ready(now)
            except NeedLoad as need:
                del ready[gc]
                if not need.log.loading:
                    need.log.loading = True
                    loads.append(need)
                need.log.waiters[gc] = None
                continue
            if msg is None:
                del ready[gc]
                continue
            if msg.expires_at is not None and msg.expires_at <= now:
                self._expire(msg.channel, msg.seq, msg)
                continue
            del ready[gc]
            ready[gc] = None  # rotate: the group's channels take turns
            # A message that came back from a member goes to another one with credit.
            found = grp.member_for(gc.returned_from.pop(msg.seq, 0) if gc.returned_from
                                   else 0)
            assert found is not None  # checked above; nothing since took credit away
            sub, idx = found
            grp.took(idx)
            out.setdefault(sub, []).append(self._deliver(sub, gc, msg, now))
            sub.burst += len(msg.data) + 64
        return False

    def _deliver(self, sub: Subscription, gc: GroupChannel, msg: Msg, now: float) -> Delivery:
        tag = next(self._tags)
        lease = Lease(tag, gc, msg, sub, now + sub.lease_s)
        gc.pending[msg.seq] = lease
        attempts = gc.attempts.get(msg.seq, 0) + 1
        gc.attempts[msg.seq] = attempts
        gc.delivered += 1
        self._dirty[gc] = None  # attempts survive a crash
        sub.unsettled += 1
        sub.session.leases[tag] = lease
        sub.leases[tag] = lease
        self.counters.delivered += 1
        if attempts > 1:
            self.counters.redelivered += 1
        elif self.delivery_latency is not None:
            self.delivery_latency.observe(now - msg.published_at)
        return Delivery(tag, msg.channel, msg.seq, msg.id, msg.data, msg.raw, msg.headers,
                        attempts, msg.published_at, msg.priority, msg.key)

    def on_loaded(self, channel: str, from_seq: int, msgs: list[Msg], upto: int) -> None:
        """Storage returned the live messages of ``[from_seq, upto)``."""
        log = self.channels.get(channel)
        if log is None:
            return
        log.loading = False
        log.readback = {m.seq: m for m in msgs}
        log.rb_lo, log.rb_hi = from_seq, upto
        for gc in log.waiters:
            if gc.group.gcs.get(channel) is gc:
                gc.group.ready[gc] = None
                if gc.group.members:
                    self._ready_groups[gc.group] = None
        log.waiters = {}

    # ------------------------------------------------------------ settlement
    def _lease(self, session: Session, tag: int) -> Lease:
        lease = session.leases.pop(tag, None)
        if lease is not None:
            lease.sub.leases.pop(tag, None)
        if lease is None or lease.gc.pending.get(lease.seq) is not lease:
            raise UnknownDelivery(
                f"delivery tag {tag} is unknown, already settled, expired, or not yours",
                tag=tag,
            )
        return lease

    def _settling(
        self, session: Session, tags: Iterable[int], failed: list[tuple[int, int, str]]
    ) -> Iterator[Lease]:
        """The leases ``tags`` name; refused tags go to ``failed`` (tag, code, text)."""
        for tag in tags:
            try:
                yield self._lease(session, tag)
            except UnknownDelivery as exc:
                self.counters.refuse(exc.reason)
                failed.append((tag, int(exc.code), exc.message))

    def ack(self, session: Session, tags: Iterable[int],
            now: float | None = None) -> list[tuple[int, int, str]]:
        failed: list[tuple[int, int, str]] = []
        latency = self.ack_latency if now is not None else None
        for lease in self._settling(session, tags, failed):
            gc = lease.gc
            gc.settle(lease.seq)
            lease.sub.unsettled -= 1
            self.counters.acked += 1
            self._mark(gc)
            if latency is not None:
                latency.observe(now - (lease.expires - lease.sub.lease_s))  # type: ignore[operator]
        return failed

    def nack(
        self, session: Session, tags: Iterable[int], *, delay: float, front: bool, now: float
    ) -> list[tuple[int, int, str]]:
        failed: list[tuple[int, int, str]] = []
        if not 0 <= delay <= MAX_DELAY_S:  # also refuses NaN
            raise BadRequest(f"delay must be 0..{MAX_DELAY_S:g} seconds, got {delay}")
        for lease in self._settling(session, tags, failed):
            self.counters.nacked += 1
            self._return(lease, now, front=front, delay=delay)
        return failed

    def extend(
        self, session: Session, tags: Iterable[int], seconds: float, now: float
    ) -> list[tuple[int, int, str]]:
        if not 0 < seconds <= MAX_LEASE_S:
            raise BadRequest(f"seconds must be in (0, {MAX_LEASE_S}], got {seconds}")
        failed: list[tuple[int, int, str]] = []
        for tag in tags:
            lease = session.leases.get(tag)
            if lease is None or lease.gc.pending.get(lease.seq) is not lease:
                exc = UnknownDelivery(f"delivery tag {tag} is unknown or expired", tag=tag)
                self.counters.refuse(exc.reason)
                failed.append((tag, int(exc.code), exc.message))
                continue
            lease.expires = now + seconds
            # An extended lease leaves its subscription's expiry order for the heap.
            lease.sub.leases.pop(tag, None)
            heapq.heappush(self._lease_heap, (lease.expires, tag, lease))
        return failed

    def withdraw(self, session: Session, tags: Iterable[int], now: float) -> None:
        """Deliveries the adapter could hand to nobody (the request waiting for them went
        away): back to the front of their queue at once, as if never sent (the attempt
        does not count). Unknown tags are ignored."""
        for tag in tags:
            lease = session.leases.get(tag)
            if lease is None or lease.gc.pending.get(lease.seq) is not lease:
                continue
            self._lease(session, tag)
            attempts = lease.gc.attempts
            if attempts.get(lease.seq, 0) > 1:
                attempts[lease.seq] -= 1
            else:
                attempts.pop(lease.seq, None)
            self._return(lease, now, front=True, delay=0.0)

    def _return(self, lease: Lease, now: float, *, front: bool, delay: float) -> None:
        """A delivery came back unsettled: requeue it, or dead-letter past the limit."""
        gc, sub = lease.gc, lease.sub
        if gc.pending.get(lease.seq) is not lease:
            return
        sub.unsettled -= 1
        limit = gc.log.options.requeue_limit
        if gc.attempts.get(lease.seq, 0) > limit:
            gc.settle(lease.seq)
            gc.acks -= 1
            self._dead_letter(lease.msg, "requeue_limit", gc.group.key,
                              f"requeued more than {limit} times")
        else:
            gc.requeue(lease.seq, front=front, delay=delay, now=now)
            if delay > 0:
                self._timed[gc] = None
            if sub.active:
                if len(gc.returned_from) >= RETURNED_FROM_LIMIT:
                    gc.returned_from.clear()  # stale ones (purged, expired): start afresh
                gc.returned_from[lease.seq] = id(sub)
        self._mark(gc)

    # ----------------------------------------------------------------- time
    def tick(self, now: float) -> None:
        expired: list[Lease] = []
        for grp in self.groups.values():
            for sub in grp.members:
                for lease in sub.leases.values():
                    if lease.expires > now:
                        break
                    expired.append(lease)
        heap = self._lease_heap
        while heap and heap[0][0] <= now:
            expires, _tag, lease = heapq.heappop(heap)
            if lease.expires == expires and lease.gc.pending.get(lease.seq) is lease:
                expired.append(lease)
        for lease in expired:
            lease.sub.leases.pop(lease.tag, None)
            lease.sub.session.leases.pop(lease.tag, None)
            self.counters.lease_expired += 1
            self._return(lease, now, front=True, delay=0.0)
        # Adapters whose credit is not a fixed prefetch (HTTP long polls) recount it.
        for conn in {id(lease.sub.session.conn): lease.sub.session.conn
                     for lease in expired}.values():
            hook = getattr(conn, "leases_expired", None)
            if hook is not None:
                hook()
        for gc in list(self._timed):
            if gc.release_due(now):
                self._mark(gc)
            if not gc.delayed and not gc.sched:
                del self._timed[gc]
        self.dedup.expire(now)
        if now - self._producers_expired_at >= 60.0:
            self._producers_expired_at = now
            self.producers.expire(now)
        self.trim_cache()

    def trim_cache(self) -> int:
        """Keep message bodies in memory under the budget; return bytes freed."""
        logs = self.channels.values()
        total = sum(log.cache_bytes for log in logs)
        if total <= self.cache_budget:
            return 0
        need = total - self.cache_budget * 3 // 4
        freed = 0
        for log in sorted(logs, key=lambda lg: lg.cache_bytes, reverse=True):
            if freed >= need:
                break
            freed += log.evict_bytes(min(log.cache_bytes, need - freed))
        return freed

    def expire(self, items: Iterable[Msg | tuple[str, int]], now: float) -> int:
        """Storage found these messages past their TTL; dead-letter them.

        Items are the messages read back from storage (so their bodies can be
        dead-lettered), or ``(channel, seq)`` pairs when only memory knows them.
        """
        n = 0
        for item in items:
            channel, seq = (item.channel, item.seq) if isinstance(item, Msg) else item
            log = self.channels.get(channel)
            if log is None:
                continue
            found = item if isinstance(item, Msg) else log.lookup(seq)
            if self._expire(channel, seq, found if isinstance(found, Msg) else None):
                n += 1
        return n

    def _expire(self, channel: str, seq: int, msg: Msg | None) -> bool:
        log = self.channels[channel]
        if not log.delete_one(seq):
            return False
        log.expired += 1
        self.counters.expired += 1
        self.batch.deletes.append((channel, seq))
        self.batch.channels[channel] = log.next_seq
        if msg is not None:
            self._dead_letter(msg, "ttl", "", "message TTL expired")
        return True

    def _dead_letter(self, msg: Msg, reason: str, group: str, text: str) -> None:
        self.counters.dead_lettered += 1
        src = self.channels.get(msg.channel)
        if src is None or not src.options.dead_letter or is_dead_letter(msg.channel):
            return
        log = self._log(dead_letter_channel(msg.channel), msg.published_at)
        headers = dict(msg.headers or {})
        headers.update({
            "x-dead-reason": reason, "x-dead-detail": text,
            "x-original-channel": msg.channel, "x-original-seq": str(msg.seq),
            "x-original-id": msg.id,
        })
        if group:
            headers["x-dead-group"] = group
        dead = Msg(log.name, log.next_seq, self.new_id(log, log.next_seq), msg.data, msg.raw,
                   headers,
                   0, msg.published_at, None, None, msg.key)
        log.next_seq += 1
        log.inflight += 1
        self.batch.channels[log.name] = log.next_seq
        self.batch.messages.append(dead)

    # -------------------------------------------------------------- restore
    def restore(self, snap: Snapshot, now: float) -> None:
        """Rebuild memory from storage after a start."""
        for rec in snap.channels:
            log = ChannelLog(rec.name, self.options(rec.name))
            log.next_seq = log.end = rec.next_seq
            log.first_seq = min(rec.first_seq, rec.next_seq)
            log.cache_lo = rec.next_seq
            log.count = rec.count
            log.gone = set(rec.gone)
            self.channels[rec.name] = log
        for channel, seq, priority, deliver_at in snap.specials:
            if channel in self.channels:
                self.channels[channel].special[seq] = (priority, deliver_at)
        tail_by_channel: dict[str, list[Msg]] = {}
        for msg in snap.tail:
            tail_by_channel.setdefault(msg.channel, []).append(msg)
        for name, msgs in tail_by_channel.items():
            log = self.channels[name]
            log.cache_lo = msgs[0].seq
            for m in msgs:
                log.cache[m.seq] = m
                log.cache_bytes += m.size()
        for gdef in snap.groups:
            self.groups[gdef.key] = Group(
                gdef.key, gdef.kind, [parse_pattern(p) for p in gdef.patterns], gdef.start
            )
        for key, channel, floor, blob in snap.group_states:
            grp, log = self.groups.get(key), self.channels.get(channel)
            if grp is None or log is None:
                continue
            gc = GroupChannel(grp, log, floor)
            gc.restore(floor, blob, now)
            grp.gcs[channel] = gc
            log.states.append(gc)
            gc.load_specials(now)
            if gc.delayed or gc.sched:
                self._timed[gc] = None
            grp.ready[gc] = None
        for grp in self.groups.values():  # channels created after the group's last save
            for name, log in self.channels.items():
                if name not in grp.gcs and grp.matches(name):
                    self._attach(grp, log, log.first_seq, now)
        self.dedup.load(snap.dedup, now)  # built into memory over the next ticks
        self.producers.load(snap.producers, now)
        self.reservations = dict(snap.reservations)
        self.transactions.fences = {(w, c): b for w, c, b in snap.fences}
        self.transactions.writers = dict(snap.writers)
        self.transactions.load(snap.staged)
        self.transactions.lineages = {
            key[len(WRITER_LINEAGE_META):]: value for key, value in snap.meta.items()
            if key.startswith(WRITER_LINEAGE_META) and value}
        self._listen_keys_escaped = snap.meta.get(LISTEN_KEYS_META) == "escaped"

    def migrate_listen_keys(self, registered: Iterable[str]) -> dict[str, str]:
        """Once, on the first start after an upgrade: give the listeners older versions
        stored their unambiguous keys (``names.migrate_listen_key``), deciding by the
        ``registered`` client ids. Returns ``{old key: new key}`` for the renamed ones."""
        if self._listen_keys_escaped:
            return {}
        ids = set(registered)
        with_colon = [c for c in ids if ":" in c]
        renames = {key: new for key, grp in self.groups.items() if grp.kind == "listen"
                   and (new := migrate_listen_key(key, ids, with_colon)) != key}
        # Distinct old keys give distinct new ones, so rebuilding the table loses none.
        self.groups = {renames.get(key, key): grp for key, grp in self.groups.items()}
        for old, new in renames.items():
            grp = self.groups[new]
            grp.key = new
            self.batch.group_defs[old] = None  # with its states
            self.batch.group_defs[new] = grp.definition()
            for name, gc in grp.gcs.items():
                self.batch.group_states[(new, name)] = gc.durable_state()
        self.batch.meta[LISTEN_KEYS_META] = "escaped"
        self._listen_keys_escaped = True
        return renames

    def release_writer(self, writer_id: str, *, drop_fences: bool = False) -> str | None:
        """Admin: free a writer id for the next client that commits under it (its
        fences stay, so a job moved to another client id stays exactly-once, unless
        ``drop_fences``: after a squatter's commit). Returns the owner it had."""
        owner = self.transactions.writers.pop(writer_id, None)
        if owner is not None:
            self.batch.writers[writer_id] = None
        if drop_fences:  # a new run may take the writer over: its lineage goes too
            if self.transactions.lineages.pop(writer_id, None) is not None:
                self.batch.meta[WRITER_LINEAGE_META + writer_id] = ""
            self.transactions.fences = {k: b for k, b in self.transactions.fences.items()
                                        if k[0] != writer_id}
            self.batch.fences = {k: b for k, b in self.batch.fences.items()
                                 if k[0] != writer_id}
            self.batch.dropped_fences.append(writer_id)
        return owner

    # --------------------------------------------------- staged, fenced publishes
    def stage(self, session: Session, txn: str, sends: list[Send], now: float) -> int:
        """Validate and hold ``sends`` under ``txn`` (refused messages refuse the frame)."""
        for send in sends:
            if send.channel.endswith("*"):
                raise BadRequest("a transaction publishes to channels, not broadcasts")
            self.validate(send, session.access)
        held = self.transactions.stage(session.client_id, txn, sends, now)
        part = self.transactions.staged[(session.client_id, txn)].parts
        self.batch.staged.append((session.client_id, txn, part, list(sends), now))
        return held

    def abort_txns(self, session: Session, txns: list[str]) -> int:
        dropped = self.transactions.abort(session.client_id, txns)
        self.batch.unstaged += [(session.client_id, t) for t in txns]
        return dropped

    def expire_txns(self, now: float) -> int:
        gone = self.transactions.expire(now)
        self.batch.unstaged += gone
        return len(gone)

    def commit_txns(self, session: Session, writer_id: str, batch_id: int, txns: list[str],
                    now: float, lineage: str = "") -> dict[str, Any]:
        """Publish the transactions in the pending batch, fenced per (writer, channel):
        all of it or, if anything would be refused, nothing (the transactions stay
        staged and the fences where they were, so the writer may abort and replay)."""
        self.transactions.check_writer(session.client_id, writer_id)
        self.transactions.check_lineage(writer_id, lineage)
        again = self.transactions.answered(session.client_id, txns)
        if again is not None:  # sent again after its answer was lost: the same answer
            return again
        sends = self.transactions.peek(session.client_id, txns)
        keep, skipped, fences = self.transactions.fence(writer_id, batch_id, sends)
        full = self.storage_refusal
        if full is not None:
            raise type(full)(full.message, **full.detail)
        self._check_commit(keep, session.access)
        self.transactions.take(session.client_id, txns)
        self.batch.unstaged += [(session.client_id, t) for t in txns]
        self.transactions.discarded += len(sends) - len(keep)
        outcomes, staged = self.publish(keep, now, session.access)
        failed = [{"channel": o.channel, "code": o.code, "error": o.error}
                  for o in outcomes if o.code]
        # Not expected after the check; if it happens, the replay must not be fenced.
        refused = {f["channel"] for f in failed}
        fences = {k: b for k, b in fences.items() if k[1] not in refused}
        for key in fences:  # to undo if the commit fails
            self.batch.fence_undo.setdefault(key, self.transactions.fences.get(key))
        self.transactions.fences.update(fences)
        self.batch.fences.update(fences)
        if writer_id not in self.transactions.writers:  # the first commit binds the id
            self.transactions.writers[writer_id] = session.client_id
            self.batch.writers[writer_id] = session.client_id
        if lineage and self.transactions.lineages.get(writer_id) != lineage:
            self.transactions.lineages[writer_id] = lineage
            self.batch.meta[WRITER_LINEAGE_META + writer_id] = lineage
        result = {"published": len(staged), "discarded": len(sends) - len(keep),
                  "replayed_channels": skipped, "failed": failed[:20]}
        for t in txns:
            self.transactions.done[(session.client_id, t)] = (now, result)
        self.batch.txn_done += [(session.client_id, t, result, now) for t in txns]
        return result

    def _check_commit(self, sends: list[Send], access: Access) -> None:
        """Raise what publishing ``sends`` would refuse: rules and schemas (either may
        have changed since STAGE) and room in channels that refuse when full."""
        for send in sends:
            self.validate(send, access)
        for name, n in Counter(s.channel for s in sends).items():
            log = self.channels.get(name)
            opts = log.options if log is not None else self.options(name)
            if opts.max_items is None or opts.overflow == "drop_oldest":
                continue
            held = log.count + log.inflight if log is not None else 0
            if held + n > opts.max_items:
                raise QueueFull(
                    f"the commit would put {n} messages into {name!r}, which has room for "
                    f"{max(0, opts.max_items - held)} (max_items {opts.max_items}); nothing "
                    "was published", channel=name, limit=opts.max_items)

    # ----------------------------------------------------------- positions
    def offsets(self, session: Session, patterns: list[str]) -> dict[str, list[int]]:
        """``{channel: [first_seq, next_seq]}`` for every channel the patterns match."""
        out: dict[str, list[int]] = {}
        parsed = [parse_pattern(text) for text in patterns]
        self.check_read(session, *(p.text for p in parsed))  # claims a concrete ! channel
        for pattern in parsed:
            if pattern.concrete:
                log = self.channels.get(pattern.text)
                if log is not None:
                    out[log.name] = [log.first_seq, log.end]
                continue
            for name, log in self.channels.items():
                # A wildcard the rules allowed reaches no exclusive channel but its
                # reserver's (and none still free).
                if pattern.matches(name) and (session.admin or self._owner(
                        name, owner_to_be="") in (None, session.client_id)):
                    out[name] = [log.first_seq, log.end]
        return out

    def set_position(self, session: Session, group: str, positions: dict[str, int],
                     now: float) -> dict[str, int]:
        """Everything below ``positions[channel]`` is settled for consumer ``group``."""
        if not group:
            raise BadRequest("give the group name")
        key = consume_group_key(group)
        grp = self.groups.get(key)
        for channel, next_seq in positions.items():
            validate_channel(channel)
            self.check_read(session, channel, claim=False)
            if next_seq < 1:
                raise BadRequest(f"position of {channel!r} must be >= 1")
        if grp is not None:  # moving a group: the rules of every member still hold
            self._check_group_rights(session, grp, list(positions))
        # Positioning a group on a channel reads it, as subscribing would: it claims.
        self.check_read(session, *positions)
        if grp is None:
            grp = Group(key, "consume", [], "oldest")
            self.groups[key] = grp
        lags: dict[str, int] = {}
        for channel, next_seq in positions.items():
            self._add_pattern(grp, channel, "oldest", now)
            gc = grp.gcs[channel]
            upto = min(next_seq, gc.log.end)
            if upto > gc.floor:
                from .maintenance import advance

                advance(self, gc, upto)
            lags[channel] = max(0, gc.log.end - gc.cursor)
        return lags

    # ---------------------------------------------------------------- stats
    def channel_stats(self, log: ChannelLog, now: float) -> dict[str, Any]:
        unsettled = sum(len(gc.pending) for gc in log.states)
        return {
            "channel": log.name, "depth": log.count, "first_seq": log.first_seq,
            "next_seq": log.end, "unsettled": unsettled, "published": log.published,
            "dropped": log.dropped, "expired": log.expired,
            "readers": [gc.group.key for gc in log.states],
        }

    def group_stats(self, grp: Group, now: float) -> dict[str, Any]:
        lag = sum(max(0, gc.log.end - gc.cursor) for gc in grp.gcs.values())
        in_flight = sum(len(gc.pending) for gc in grp.gcs.values())
        return {
            "group": grp.key, "kind": grp.kind, "patterns": [p.text for p in grp.patterns],
            "members": len(grp.members), "channels": len(grp.gcs),
            "unsettled": in_flight,  # the old name of in_flight
            "waiting": sum(gc.waiting()[0] for gc in grp.gcs.values()),
            "in_flight": in_flight,
            "lag": lag,
            "delivered": sum(gc.delivered for gc in grp.gcs.values()),
            "acked": sum(gc.acks for gc in grp.gcs.values()),
        }
