"""Publishing: validate sends, assign seqs, stage the messages in the pending batch.

Staged messages are not visible yet: they become readable in ``on_committed``, once
the adapter has made their batch durable (see ``commits``). The checks run in one
place (``validate``), which transactional commits reuse.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import msgspec

from ..auth.rules import ALLOW_ALL, Access
from ..errors import (
    BadRequest,
    ErrorCode,
    InvalidPayload,
    MessageTooLarge,
    QueueFull,
    RequestError,
    SchemaMismatch,
)
from ..limits import (
    MAX_BROADCAST_BYTES,
    MAX_BROADCAST_FANOUT,
    MAX_DELAY_S,
    MAX_HEADER_SIZE,
    MAX_HEADERS,
    MAX_KEY_LENGTH,
    MAX_PRIORITY,
    MAX_SESSION_PRODUCER_STATES,
    MIN_PRIORITY,
)
from ..names import (
    INBOX_ENDPOINT,
    KV_PREFIX,
    REPLY_TO,
    broadcast_prefix,
    is_dead_letter,
    is_inbox,
    is_kv,
    kv_bucket,
    schema_key,
    validate_channel,
)
from ..payloads import check_json, decode_json, repeated_key
from ..protocol.frames import Outcome, Send
from ..schemas import SchemaViolation
from .kv import KvIndex, checked_put, is_tombstone
from .log import ChannelLog, Msg
from .producers import ProducerState
from .replies import check_reply, check_request
from .session import Session
from .state import BrokerState
from .stream_ids import (
    ID_HEADER,
    StreamIds,
    id_text,
    parse_explicit,
    point_key,
    prune_points,
)

MAX_PSEQ = (1 << 63) - 1  # stored as SQLite's (and Redis's) signed 64-bit INTEGER


def check_room(log: ChannelLog) -> None:
    """Raise QueueFull if ``log`` refuses another message (max_items, overflow "refuse")."""
    opts = log.options
    if (opts.max_items is not None and opts.overflow != "drop_oldest"
            and log.count + log.inflight >= opts.max_items):
        # No detail fields: a publish answers with its outcome's code and text only,
        # and requeue_dead catches this.
        raise QueueFull(f"channel {log.name!r} holds {opts.max_items} messages (max_items)")


def make_room(state: BrokerState, log: ChannelLog) -> None:
    """Drop the oldest message of ``log`` if it holds max_items (counted as dropped)."""
    limit = log.options.max_items
    if limit is None or log.count + log.inflight < limit:
        return
    oldest = log.oldest_live()
    if oldest is not None:
        log.delete_one(oldest)
    else:  # everything is still on its way to disk: drop the oldest of those
        oldest = log.drop_inflight()
    log.dropped += 1
    state.counters.dropped += 1
    state.batch.deletes.append((log.name, oldest))


def _plain(send: Send) -> bool:
    """Whether ``send`` is a plain publish: nothing but a channel and a payload (and a
    producer sequence), the shape nearly every publish has."""
    return (send.headers is None and send.dedup is None and send.delay is None
            and send.ttl is None and not send.priority and send.key is None)


class Publishing:
    def __init__(self, state: BrokerState) -> None:
        self.state = state
        self._new_id = state.ids.new_id
        # False: every send takes the one-by-one path (tests compare the two paths).
        self.bulk = True  # pragma: no mutate  (either way the outcomes are the same)

    def publish(self, sends: Iterable[Send], now: float, access: Access = ALLOW_ALL,
                session: Session | None = None, refuse: RequestError | None = None,
                resp_door: bool = False) -> tuple[list[Outcome], list[Msg]]:
        """Validate and stage ``sends``; return one outcome each and the staged messages.

        A send with a producer sequence (``pseq``) from a ``session`` with a producer id
        is checked against that producer's state first: a sequence handled before is
        answered as it was (``state.replays`` lists those), not stored again. ``refuse``
        refuses every send with it (the broker is stopping), remembered like any refusal.
        ``resp_door``: published through the Redis protocol door, which made or checked
        each JSON payload itself (its entries), within the depth limit (a schema still
        reads it), and whose ``XADD`` names a stream id in the header ``x-resp-id``
        (anywhere else that header is an ordinary one: a copied message keeps it).
        """
        state = self.state
        outcomes: list[Outcome] = []
        staged: list[Msg] = []
        full = refuse or state.storage_refusal
        state.replays = []
        state.early_duplicates = []
        numbered = session is not None and bool(session.producer_id)
        sends = sends if isinstance(sends, list) else list(sends)
        i, count = 0, len(sends)
        no_run: str | None = None
        while i < count:
            send = sends[i]
            i += 1
            if (full is None and i < count and sends[i].channel == send.channel
                    and send.channel != no_run and self.bulk and _plain(send)):
                taken = self._publish_run(sends, i - 1, now, staged, access, session,
                                          outcomes, resp_door)
                if taken:
                    i += taken - 1
                    continue
                no_run = send.channel  # not tried again for every send of the frame
            if numbered and send.pseq:
                self._publish_numbered(send, now, staged, access, session, outcomes, full,  # type: ignore[arg-type]
                                       resp_door)
            else:
                try:
                    if full is not None:
                        raise type(full)(full.message)
                    outcomes.append(self._publish_one(send, now, staged, access, session,
                                                      resp_door))
                except RequestError as exc:
                    outcomes.append(self._refusal(send, exc))
            last = outcomes[-1]
            if last.duplicate and not last.code and self._in_flight(last) and not (
                    state.replays and state.replays[-1][0] == len(outcomes) - 1):
                pstate = session.producer_states.get(send.channel) \
                    if numbered and send.pseq else None  # type: ignore[union-attr]
                state.early_duplicates.append((len(outcomes) - 1, pstate, send.pseq))
                state.awaited.setdefault(last.id, []).append((pstate, send.pseq))
        state.batch.publishes += staged
        return outcomes, staged

    def _publish_run(self, sends: list[Send], start: int, now: float, staged: list[Msg],
                     access: Access, session: Session | None, outcomes: list[Outcome],
                     resp_door: bool) -> int:
        """Stage the run of plain sends to one existing channel that starts at
        ``start``, with what ``_publish_one`` checks and does per message done once for
        the run where it is the same for all (name, rules, schema, room, producer state);
        return how many were staged (0: none, the caller takes the one-by-one path).

        The run ends before the first send that is not plain, names another channel,
        breaks the producer's sequence, is too large or is not JSON: the one-by-one path
        answers that one, with its precise error. So the outcomes, the staged messages
        and the states are those ``_publish_one`` gives, send by send."""
        state = self.state
        first = sends[start]
        target = first.channel
        log = state.channels.get(target)
        if (log is None or log.kv is not None or log.stream_ids is not None
                or type(target) is not str or target.endswith("*")
                or target.startswith((INBOX_ENDPOINT, KV_PREFIX))
                or log.options.schema is not None or state.strict_schemas):
            return 0
        # A numbered producer's sends carry consecutive sequences from its last + 1, or
        # (unnumbered) none at all; any other session's sequences are not read.
        numbered = session is not None and bool(session.producer_id)
        pseq = first.pseq if numbered else 0
        pstate: ProducerState | None = None
        if pseq:
            pstate = session.producer_states.get(target)  # type: ignore[union-attr]
            if pstate is None or pstate.evicted or pseq != pstate.last + 1:
                return 0
        try:
            validate_channel(target)
            if not access.unrestricted:
                access.check_write(target)
        except RequestError:
            return 0  # refused send by send, each with its error
        limit, check = state.max_message_size, not resp_door
        end = start
        for send in itertools.islice(sends, start, None):
            if (send.channel != target or not _plain(send) or len(send.data) > limit
                    or (numbered and send.pseq != (pseq + end - start if pseq else 0))
                    or pseq + end - start > MAX_PSEQ):
                break
            if check and not send.raw:
                try:
                    check_json(send.data)
                except RequestError:
                    break
            end += 1
        room = log.options.max_items
        if room is not None:
            end = min(end, start + room - log.count - log.inflight)
        taken = end - start
        if taken <= 0:
            return 0
        seq = log.next_seq
        name = log.name
        prefix = f"{state.ids.channel_hash(log):016x}"
        ttl = log.options.ttl
        expires = now + ttl if ttl else None
        msgs = [Msg(name, seq + n, f"{prefix}{seq + n:x}", send.data, send.raw, None, 0,
                    now, expires)
                for n, send in enumerate(itertools.islice(sends, start, end))]
        log.next_seq = seq + taken
        log.inflight += taken
        log.touched = now
        batch = state.batch
        batch.channels[name] = log.next_seq
        batch.messages += msgs
        batch.bytes += sum(len(m.data) for m in msgs)
        staged += msgs
        outcomes += [Outcome(seq=m.seq, id=m.id, channel=target) for m in msgs]
        if pstate is not None:
            pstate.used = now
            # What ``stored`` does send by send: the first may start a run, the rest
            # extend it (consecutive sequences and seqs of one channel).
            pstate.stored(pseq, seq, msgs[0].id)
            pstate.last = pstate.run_last = pseq + taken - 1
            state.producers.mark(pstate)
            batch.sequenced += [(pstate, p) for p in range(pseq, pseq + taken)]
        return taken

    def _in_flight(self, outcome: Outcome) -> bool:
        """Whether the message a duplicate names is staged or being written, not yet
        committed: the duplicate's answer must wait for that commit (and fail with it)."""
        try:
            found = self.state.ids.find(outcome.id, self.state.channels)
        except RequestError:
            return False
        return found is not None and found[1] >= found[0].end

    def settle_duplicates(self, outcomes: list[Outcome],
                          early: list[tuple[int, ProducerState | None, int]]) -> None:
        """After the commit early duplicates waited for: those whose message a failed
        commit dropped get that commit's error (a resend then stores it; a numbered
        one's producer state was set to the error then, by ``Commits.on_failed``); the
        rest stand."""
        state = self.state
        for i, _, _ in early:
            msg_id = outcomes[i].id
            error = state.lost.get(msg_id)
            waiting = state.awaited[msg_id]  # each early duplicate waits there once
            waiting.pop()
            if not waiting:
                del state.awaited[msg_id]
                state.lost.pop(msg_id, None)
            if error is not None:
                state.counters.refuse(error.reason)
                outcomes[i] = Outcome(channel=outcomes[i].channel, code=int(error.code),
                                      error=error.message)

    def _refusal(self, send: Send, exc: RequestError) -> Outcome:
        self.state.counters.refuse(exc.reason)
        return Outcome(channel=str(send.channel)[:255], code=int(exc.code), error=exc.message)

    def _publish_numbered(self, send: Send, now: float, staged: list[Msg], access: Access,
                          session: Session, outcomes: list[Outcome],
                          full: RequestError | None, resp_door: bool = False) -> None:
        """A publish with its producer's sequence: answered from the producer's state if
        that sequence was handled before (even while publishes are refused: it was
        stored then), else published and the state moved on."""
        if send.pseq > MAX_PSEQ:  # stored as a 64-bit integer: a bigger one
            # broke the commit, and the broker stopped
            outcomes.append(self._refusal(send, BadRequest(
                f"a producer sequence (pseq) is 1..{MAX_PSEQ}, got {send.pseq}")))
            return
        producers = self.state.producers
        pstate = session.producer_states.get(send.channel)
        if pstate is None or pstate.evicted:
            pstate = self._producer_state(session, send.channel, now)
        else:
            pstate.used = now
        pseq = send.pseq
        try:
            if pseq != pstate.last + 1:  # not the usual case
                replay = producers.check(pstate, pseq, send.channel)
                if replay is not None:
                    if replay.duplicate:
                        self.state.counters.duplicates += 1
                    self.state.replays.append((len(outcomes), pstate, pseq))
                    outcomes.append(replay)
                    return
            if full is not None:
                raise type(full)(full.message)
            outcome = self._publish_one(send, now, staged, access, session, resp_door)
        except RequestError as exc:
            outcomes.append(self._refusal(send, exc))
            if exc.code != ErrorCode.OUT_OF_SEQUENCE:
                pstate.refuse(pseq, pseq, int(exc.code), exc.message)
                if pstate.written:
                    producers.mark(pstate)
                # else kept in memory only, and written with the state's first stored
                # message (its row holds the refusals): a state stored for a channel
                # nothing was ever stored to would be a row (on Redis, a queue claimed)
                # per name a client makes up, invalid or not its to write. Lost with
                # the process, a refusal nothing followed is checked afresh if sent
                # again, and refused alike (or stored: it never was).
            return
        outcomes.append(outcome)
        pstate.stored(pseq, outcome.seq, outcome.id)
        producers.mark(pstate)
        self.state.batch.sequenced.append((pstate, pseq))

    def _producer_state(self, session: Session, channel: str, now: float) -> ProducerState:
        known = session.producer_states.get(channel)
        if len(session.producer_states) >= MAX_SESSION_PRODUCER_STATES:
            session.producer_states.clear()  # a cache: the states stay in state.producers
        pstate = self.state.producers.state(
            (session.client_id, session.producer_id, channel), now, known)
        session.producer_states[channel] = pstate
        return pstate

    def validate(self, send: Send, access: Access, *, direct: bool = False,
                 reply: bool = False, resp_door: bool = False) -> str | None:
        """Everything a publish checks before storing (name, rules, size, JSON, schema);
        return the broadcast prefix, or None for a concrete channel. ``direct``: a
        publish, whose requests and inbox writes ``_request_or_reply`` checked (a
        transaction cannot carry them); ``reply``: it let this one into an inbox,
        which answering a request the connection holds allows, whatever the rules say."""
        target = send.channel
        prefix = broadcast_prefix(target) if target.endswith("*") else None
        if prefix is None:
            validate_channel(target)
        if not direct and (is_inbox(target) or (send.headers and REPLY_TO in send.headers)):
            raise BadRequest(f"requests and replies ({target!r}) are published one by "
                             "one, not staged in a transaction", channel=target)
        if not direct and is_kv(target):
            raise BadRequest(f"bucket {kv_bucket(target)!r} is written with puts, not "
                             "staged in a transaction", channel=target)
        if not access.unrestricted and not reply:
            access.check_write(target)
        self._check(send, target, resp_door)
        return prefix

    def _check(self, send: Send, target: str, resp_door: bool = False) -> None:
        state = self.state
        size, limit = len(send.data), state.max_message_size
        if size > limit:
            raise MessageTooLarge(f"message of {size} bytes is over the {limit} byte limit",
                                  limit=limit, size=size)
        log = state.channels.get(target)
        schema = (log.options if log is not None else state.options(target)).schema
        if schema is not None:
            if not (is_tombstone(send.headers) and is_kv(target)):  # a delete has no value
                self._check_schema(send, schema)
        elif state.strict_schemas and not is_dead_letter(target):
            key = schema_key(target)
            state.schema_refusals[key] = state.schema_refusals.get(key, 0) + 1
            raise SchemaMismatch(f"{key} declares no schema and strict_schemas is on: "
                                 "declare channels.\"" + key + "\".schema", schema=key)
        elif not send.raw and not resp_door:
            check_json(send.data)
        if send.headers:
            if len(send.headers) > MAX_HEADERS:
                raise BadRequest(f"{len(send.headers)} headers, the limit is {MAX_HEADERS}")
            if sum(map(len, send.headers)) + sum(map(len, send.headers.values())) > \
                    MAX_HEADER_SIZE:
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
        refusals = self.state.schema_refusals
        if send.raw:
            refusals[schema.key] = refusals.get(schema.key, 0) + 1
            raise SchemaMismatch(f"{schema.key} has a JSON schema; raw payloads are refused",
                                 schema=schema.key)
        value = decode_json(send.data)
        repeated = repeated_key(send.data, value)
        if repeated is not None:  # the schema saw one of its values; a reader may see the other
            refusals[schema.key] = refusals.get(schema.key, 0) + 1
            raise InvalidPayload(
                f"payload repeats key {repeated[:64]!r} in one object; on a channel with a "
                f"schema ({schema.key}) every key appears once, so that every reader sees "
                "the value the schema checked", schema=schema.key, key=repeated[:64])
        try:
            schema.validate(value)
        except SchemaViolation as exc:
            refusals[schema.key] = refusals.get(schema.key, 0) + 1
            raise SchemaMismatch(
                f"payload does not match the schema of {schema.key}: {exc.path}: {exc.reason}",
                schema=schema.key, path=exc.path, why=exc.reason,
            ) from None

    def _publish_one(self, send: Send, now: float, staged: list[Msg], access: Access,
                     session: Session | None = None, resp_door: bool = False) -> Outcome:
        state = self.state
        reply = False
        if send.headers or send.channel.startswith(INBOX_ENDPOINT):
            send, reply = self._request_or_reply(send, access, session)
        target = send.channel
        prefix = self.validate(send, access, direct=True, reply=reply,
                               resp_door=resp_door)
        if target.startswith(KV_PREFIX):
            if prefix is not None:
                raise BadRequest(f"{target!r}: a bucket is written key by key, not broadcast")
            known = state.channels.get(target)
            index = known.kv if known is not None else None
            if index is None:  # a new bucket: nothing to compare with, the same limits
                index = KvIndex()
                index.count = state.kv_count
            send = checked_put(send, index, now)
        if send.dedup:
            seen = state.dedup.get(target, send.dedup, now)
            if seen is not None:
                state.counters.duplicates += 1
                return Outcome(seq=seen[0], id=seen[1], channel=target, duplicate=True)
        if prefix is None:
            if send.delay or send.priority > 0:  # held in memory until taken
                state.check_scheduled_room(1)
            log = state.channels.get(target)
            if log is None:
                state.check_new_channels(1)
                state.check_new_inboxes((target,))
                log = state.log(target, now)
            if resp_door and send.headers and ID_HEADER in send.headers:
                msg = self._stage_with_id(log, send, now)
            else:
                if log.stream_ids is not None:  # its ids used up: refused through any door
                    log.stream_ids.check_next(log.next_seq)
                msg = self.stage(log, send, now)
            staged.append(msg)
            outcome = Outcome(seq=msg.seq, id=msg.id, channel=target)
        else:
            if resp_door and send.headers and ID_HEADER in send.headers:
                raise BadRequest(f"{ID_HEADER!r} names one message's stream id: publish it "
                                 "to one channel, not a broadcast")
            targets = [log for name, log in state.channels.items()
                       if name.startswith(prefix) and log.states]
            if len(targets) > MAX_BROADCAST_FANOUT or \
                    len(targets) * len(send.data) > MAX_BROADCAST_BYTES:
                raise BadRequest(
                    f"broadcast to {target!r} would store {len(targets)} copies of "
                    f"{len(send.data)} bytes; the limits are {MAX_BROADCAST_FANOUT} channels "
                    f"and {MAX_BROADCAST_BYTES >> 20} MiB per broadcast: send to fewer ids")
            for log in targets:  # a broadcast is stored everywhere or nowhere
                check_room(log)
            if send.delay or send.priority > 0:
                state.check_scheduled_room(len(targets))
            first: Msg | None = None
            for log in targets:
                msg = self.stage(log, send, now)
                staged.append(msg)
                first = first or msg
            outcome = Outcome(seq=first.seq if first else 0, id=first.id if first else "",
                              channel=target, fanout=len(targets))
        if send.dedup:
            expires = now + state.dedup_window
            state.dedup.put(target, send.dedup, expires, outcome.seq, outcome.id)
            state.batch.dedup.append((target, send.dedup, expires, outcome.seq, outcome.id))
        return outcome

    def _request_or_reply(self, send: Send, access: Access, session: Session | None
                          ) -> tuple[Send, bool]:
        """A request is checked (its inbox, its responders) and then published like any
        message; a write to an inbox becomes the reply to store, or is refused.
        Returns the send to store and whether it is a checked reply."""
        if send.headers and REPLY_TO in send.headers:
            check_request(self.state, send, session.client_id if session is not None
                          else access.client_id)
            return send, False
        if is_inbox(send.channel):
            return check_reply(self.state, send, session.client_id if session is not None
                               else access.client_id), True
        return send, False

    def _stage_with_id(self, log: ChannelLog, send: Send, now: float) -> Msg:
        """Stage a message that names its Redis stream id (``XADD key <id> ...``):
        refused unless above the stream's top; its header then holds the id it got,
        and a point records it (stored as meta in the same batch)."""
        assert send.headers is not None
        ms, n = parse_explicit(send.headers[ID_HEADER])
        meta = self.state.batch.meta
        # Room first; not past a reader's floor: a pending entry deleted under it (XDEL)
        # is still shown to its group by its id.
        floor = min((gc.floor for gc in log.states), default=log.first_seq)
        prune_points(log.name, log.stream_ids, min(log.first_seq, floor), meta)
        ids = log.stream_ids if log.stream_ids is not None else StreamIds()
        seq = log.next_seq
        value, point = ids.resolve(seq, ms, n)
        send = msgspec.structs.replace(send, headers={**send.headers,
                                                      ID_HEADER: id_text(value)})
        msg = self.stage(log, send, now)
        assert msg.seq == seq
        if point:
            log.stream_ids = ids
            ids.add(seq, value)
            meta[point_key(log.name, seq)] = id_text(value)
        return msg

    def stage(self, log: ChannelLog, send: Send, now: float) -> Msg:
        """Give ``send`` the next seq of ``log`` and add it to the pending batch (making
        room first in a channel that drops its oldest when full). Checked already."""
        batch = self.state.batch
        opts = log.options
        check_room(log)
        make_room(self.state, log)
        ttl = send.ttl if send.ttl is not None else opts.ttl
        msg = Msg(
            log.name, log.next_seq, self._new_id(log, log.next_seq), send.data, send.raw,
            send.headers,
            send.priority, now, now + ttl if ttl else None,
            now + send.delay if send.delay else None, send.key,
        )
        log.next_seq += 1
        log.inflight += 1
        log.touched = now
        batch.channels[log.name] = log.next_seq
        batch.messages.append(msg)
        batch.bytes += len(send.data)
        if msg.deliver_at is not None or msg.priority > 0:  # Msg.special, inlined
            batch.specials += 1
        if log.kv is not None:
            log.kv.stage(msg)
        return msg
