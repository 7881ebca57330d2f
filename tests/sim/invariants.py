"""The guarantees the simulator checks, each named once (``INVARIANTS``) and checked at
the event that could break it: a commit applied, a delivery made, a settlement or a
publish answered, and the end of the history (after every group was read dry).

A check raises ``Violation`` with its name; the runner prints the seed, shrinks it and
shows the history. The model a check compares with is ``ledger.Ledger``.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import NoReturn

from minou.core.broker import Broker
from minou.core.writes import WriteBatch
from minou.names import is_dead_letter, match_keys
from minou.protocol.frames import Outcome, Send

from .ledger import Ledger, Read, Sent, Stored
from .scenario import Scenario

Member = tuple[int, int, int, bool]  # connection serial, sid, prefetch, reading

INVARIANTS: dict[str, str] = {
    "confirmed_is_durable":
        "a publish (or a duplicate of one, or a transaction commit) is confirmed only "
        "once what it names is in storage",
    "confirmed_never_lost":
        "a confirmed message is, at the end, delivered to every group that reads its "
        "channel or settled there by an ack, a dead letter, its TTL or an overflow drop",
    "seq_never_reused": "a (channel, seq) is never stored for two different messages",
    "only_committed_delivered": "a delivery names a message storage holds (same id)",
    "ack_is_final":
        "no delivery of a message to a group after that group's ack of it was "
        "confirmed, nor after the group's stored state settled it",
    "tags_fenced":
        "a settlement succeeds only for a live delivery tag of the settling connection "
        "(not another client's, not a settled, expired or redelivered one)",
    "fenced_after_takeover":
        "once another broker took the store over, nothing the paused one still writes "
        "is stored (its epochs are stale)",
    "attempts_never_decrease":
        "a redelivery's attempt count is above the last one of this run; across a "
        "crash, above the count storage held and at least the highest any client saw",
    "requeue_limit":
        "a delivery returned with attempts above its channel's requeue_limit is never "
        "redelivered to its group and is dead-lettered (reason requeue_limit) when dead "
        "letters are kept; no other return is",
    "ttl_respected":
        "a message is never delivered at or past its TTL, and never expired before it",
    "max_items": "a channel never holds more than its max_items messages in storage",
    "single_consumer_order":
        "a group's first deliveries of plain messages (no priority, no publish delay) "
        "follow seq order on each channel, within a run",
    "dedup_window":
        "a send with a dedup key is not stored again within the window of the stored one",
    "fenced_at_most_once":
        "each message of a staged transaction is stored at most once, whatever the "
        "replays; a numbered (idempotent producer) send too",
    "round_robin":
        "a delivery goes to a member that is reading and has credit (unsettled below "
        "its prefetch); a message that came back from a member (nack, lease ran out) "
        "goes to another member with credit if there is one",
    "exclusive_one_reader":
        "an exclusive (!) channel and its dead letters are read by one client: its "
        "stored reservation's owner (never changed), and within a run by one client "
        "even before the reservation is stored",
    "delivery_budget":
        "the unread delivery bytes of all connections together stay within the delivery "
        "budget, plus one pump turn, plus per connection its share and one turn's "
        "deliveries to it",
    "in_flight_bytes":
        "the bytes unsettled deliveries hold are accounted exactly (each subscription's "
        "and their total are the weights of the live leases), and a delivery goes to a "
        "member the in-flight bounds do not stop (one holding nothing always may)",
    "pattern_count":
        "the count of patterns over every group (bounded by MAX_GROUP_PATTERNS) is what "
        "the groups read, after every step",
    "scheduled_count":
        "the count of messages with a priority or a delay held (bounded by "
        "MAX_SCHEDULED_MESSAGES) is what the channels hold, after every step",
    "reader_index":
        "the indexes that find a new channel's groups and a new pattern's channels "
        "answer what trying every group and every channel would, in the same order, "
        "after every step",
    "progress": "the broker finishes its work: no endless loop of commits, pumps or loads",
}


class Violation(AssertionError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def fail(name: str, detail: str) -> NoReturn:
    assert name in INVARIANTS, name
    raise Violation(name, detail)


# ------------------------------------------------------------------ commits
def on_apply(ledger: Ledger, batch: WriteBatch, now: float, scenario: Scenario) -> None:
    """``batch`` was applied to storage at ``now``: check and record it."""
    for m in batch.messages:
        key = (m.channel, m.seq)
        old = ledger.stored.get(key)
        if old is not None and old.id != m.id:
            fail("seq_never_reused", f"{key} stored as {old.id} and again as {m.id}")
        if old is not None:
            continue  # a failed commit's state carried into this one: the same message
        s = ledger.store(m)
        if is_dead_letter(m.channel):
            _check_dead_letter(ledger, s, now)
            continue
        sent = ledger.sent.get(s.pid)
        if sent is None:
            continue
        if sent.kind in ("txn", "numbered") and len(ledger.by_pid[s.pid]) > 1:
            fail("fenced_at_most_once", f"{sent.kind} send {s.pid} stored twice: "
                 f"{ledger.by_pid[s.pid]}")
        if sent.dedup is not None:
            _check_dedup(ledger, sent, s, scenario.dedup_window)
    for channel, owner in batch.reservations.items():
        before = ledger.reservations.get(channel)
        if before is not None and owner != before:
            fail("exclusive_one_reader", f"the stored reservation of {channel} went from "
                 f"{before} to {owner}")
        if owner is not None:
            ledger.reservations[channel] = owner
    ledger.apply_rest(batch)
    for channel, seqs in ledger.live.items():
        limit = scenario.channel_options(channel).max_items
        if limit is None or len(seqs) <= limit:
            continue
        fail("max_items", f"{channel} holds {len(seqs)} > max_items {limit}: "
             f"{sorted(seqs)}")


def _check_dead_letter(ledger: Ledger, s: Stored, now: float) -> None:
    h = s.headers or {}
    reason, group = h.get("x-dead-reason", ""), h.get("x-dead-group", "")
    original = (h.get("x-original-channel", ""), int(h.get("x-original-seq", "0")))
    if reason == "requeue_limit" and (group, *original) not in ledger.exceeded_ever:
        fail("requeue_limit", f"{original} dead-lettered for {group} but no delivery of "
             "it came back past the limit")
    if reason == "ttl":
        src = ledger.stored.get(original)
        if src is None or src.expires_at is None or src.expires_at > now:
            fail("ttl_respected", f"{original} dead-lettered for TTL at {now} but it "
                 f"expires at {src.expires_at if src else '?'}")


def _check_dedup(ledger: Ledger, sent: Sent, s: Stored, window: float) -> None:
    assert sent.dedup is not None
    key = (sent.target, sent.dedup)
    last = ledger.dedup_last.get(key)
    if last is not None and last[0] != s.pid and s.published_at < last[1] + window:
        fail("dedup_window", f"dedup key {key} stored for {last[0]} at {last[1]} and "
             f"again for {s.pid} at {s.published_at} (window {window} s)")
    if last is None or last[0] != s.pid:
        ledger.dedup_last[key] = (s.pid, s.published_at)


# --------------------------------------------------------------- deliveries
def on_delivery(ledger: Ledger, group: str, channel: str, seq: int, msg_id: str,
                tag: int, attempts: int, now: float) -> None:
    """Checked before the ledger records the delivery."""
    key = (channel, seq)
    s = ledger.stored.get(key)
    if s is None or s.id != msg_id:
        fail("only_committed_delivered", f"{key} ({msg_id}) delivered to {group} but "
             f"storage holds {s.id if s else 'nothing'}")
    read: Read = (group, channel, seq)
    if s.expires_at is not None and s.expires_at <= now:
        fail("ttl_respected", f"{key} delivered to {group} at {now}, expired at "
             f"{s.expires_at}")
    if read in ledger.acked:
        fail("ack_is_final", f"{key} delivered to {group} after its ack was confirmed")
    durable = ledger.durable.get((group, channel))
    if durable is not None and durable.settled(seq):
        fail("ack_is_final", f"{key} delivered to {group} though its stored state settled "
             f"it (floor {durable.floor}, acked {sorted(durable.acked)[:10]})")
    if ledger.exceeded.get(read) == ledger.run:
        fail("requeue_limit", f"{key} delivered to {group} again after coming back past "
             "its requeue limit")
    before = ledger.attempts.get(read, ledger.restored_attempts.get(read, 0))
    if attempts <= before:
        fail("attempts_never_decrease", f"{key} delivered to {group} with attempts "
             f"{attempts} after {before}")
    seen = ledger.seen_attempts.get(read, 0)
    if attempts < seen:
        fail("attempts_never_decrease", f"{key} delivered to {group} with attempts "
             f"{attempts} after a client saw {seen} before the crash")
    if attempts == 1 and not s.special:
        # Tags number deliveries in the order the pump made them (one pump turn hands
        # its deliveries over per subscription, so they do not arrive in that order).
        made = ledger.fresh.setdefault((group, channel), [])
        i = bisect.bisect(made, (tag, seq))
        before, after = made[i - 1] if i else None, made[i] if i < len(made) else None
        if (before is not None and before[1] >= seq) or (after is not None and after[1] <= seq):
            other = before if before is not None and before[1] >= seq else after
            fail("single_consumer_order", f"{group} got {channel} seq {seq} (tag {tag}) "
                 f"and seq {other[1]} (tag {other[0]}) out of order")  # type: ignore[index]
        made.insert(i, (tag, seq))


def _stopped(ledger: Ledger, conn: int, sid: int, bounds: tuple[int, int, int]) -> bool:
    """Whether the in-flight bounds (limit, share, per subscription) stop a member: at
    its own bound, or at its share while the pool is full (from reaching the limit
    until it drains under 7/8 of it)."""
    _, share, per_sub = bounds
    held = ledger.held(conn, sid)
    return held > 0 and (held >= per_sub or (held >= share and ledger.in_flight_full))


def on_member_delivery(ledger: Ledger, group: str, channel: str, seq: int, to: Member,
                       members: Sequence[Member], bounds: tuple[int, int, int]) -> None:
    """Checked in the order the pump made its deliveries (by tag), before the ledger
    records this one. ``members``: the group's subscriptions and whether each was
    reading when the pump turn began; ``bounds``: the in-flight ones."""
    conn, sid, prefetch, reading = to
    if _stopped(ledger, conn, sid, bounds):
        fail("in_flight_bytes", f"{(channel, seq)} delivered to {group} member {conn}/{sid} "
             f"holding {ledger.held(conn, sid)} bytes unsettled, of "
             f"{ledger.held_total()} in all (bounds: limit, share, per member {bounds})")
    if not reading:
        fail("round_robin", f"{(channel, seq)} delivered to {group} member {conn}/{sid}, "
             "which is not reading (paused)")
    if ledger.unsettled(conn, sid) >= prefetch:
        fail("round_robin", f"{(channel, seq)} delivered to {group} member {conn}/{sid} "
             f"beyond its prefetch {prefetch}")
    back_from = ledger.returned_from.pop((group, channel, seq), None)
    if back_from == (conn, sid):
        others = [m for m in members if (m[0], m[1]) != (conn, sid) and m[3]
                  and ledger.unsettled(m[0], m[1]) < m[2]
                  and not _stopped(ledger, m[0], m[1], bounds)]
        if others:
            fail("round_robin", f"{(channel, seq)} came back from {group} member "
                 f"{conn}/{sid} and went to it again while {others[0][:2]} had credit")


def on_exclusive_delivery(ledger: Ledger, channel: str, client: str) -> None:
    """``channel`` (or the channel whose dead letters it holds) is exclusive."""
    key = channel.removeprefix("_dead/")
    owner = ledger.reservations.get(key)
    if owner is not None and client != owner:
        fail("exclusive_one_reader", f"{channel} delivered to {client}; it is reserved by "
             f"{owner}")
    first = ledger.readers.setdefault(key, client)
    if first != client:
        fail("exclusive_one_reader", f"{channel} delivered to {client} and to {first} in "
             "one run")


def on_pump_turn(ledger: Ledger, limit: int, share: int, turn: Sequence[int],
                 unsent: Sequence[int]) -> None:
    """A pump turn wrote ``turn`` bytes of deliveries to each connection it served (a
    frame per subscription); ``unsent``: what each open connection holds unread now.
    Past the budget a connection over its share gets no more after the turn whose write
    saw that, so each can hold at most its share and one turn's deliveries, on top of
    the budget and the turn that crossed it."""
    ledger.max_turn = max(ledger.max_turn, sum(turn))
    ledger.max_conn_turn = max(ledger.max_conn_turn, *turn)
    bound = limit + ledger.max_turn + len(unsent) * (share + ledger.max_conn_turn)
    if sum(unsent) > bound:
        fail("delivery_budget", f"{len(unsent)} connections hold {sum(unsent)} unread "
             f"delivery bytes {sorted(unsent, reverse=True)}, over {bound} (budget "
             f"{limit}, share {share}, largest turn {ledger.max_turn}, to one "
             f"connection {ledger.max_conn_turn})")


def on_step_in_flight(core: Broker, ledger: Ledger) -> None:
    """After every step: the pool's counts are the weights of the live leases, and
    those are what the model holds live (a count given back twice or never would stop
    a consumer for good, or let one hold past its bound)."""
    held: dict[int, int] = {}
    for grp in core.groups.values():
        for gc in grp.gcs.values():
            for lease in gc.pending.values():
                if not lease.returning:
                    held[id(lease.sub)] = held.get(id(lease.sub), 0) + lease.weight
    for grp in core.groups.values():
        for sub in grp.members:
            if sub.held != held.get(id(sub), 0):
                fail("in_flight_bytes", f"member {sub.session.client_id}/{sub.sid} of "
                     f"{grp.key} counts {sub.held} bytes unsettled, its leases weigh "
                     f"{held.get(id(sub), 0)}")
    patterns = sum(len(grp.patterns) for grp in core.groups.values())
    if core.state.patterns.total != patterns:
        fail("pattern_count", f"{core.state.patterns.total} patterns counted, the "
             f"groups read {patterns}")
    specials = sum(len(log.special) for log in core.channels.values())
    if core.state.special_count.total != specials:
        fail("scheduled_count", f"{core.state.special_count.total} special messages "
             f"counted, the channels hold {specials}")
    total = core.in_flight.total
    if total != sum(held.values()) or total != ledger.held_total():
        fail("in_flight_bytes", f"{total} bytes unsettled counted, the leases weigh "
             f"{sum(held.values())}, the model's live deliveries {ledger.held_total()}")


def on_step_indexes(core: Broker) -> None:
    """After every step: ``BrokerState.patterns`` gives each channel the groups a scan
    of every group finds (in the groups' order), and ``channel_index`` each wildcard
    the channels a scan finds (in the channels' order); neither holds anything more."""
    state = core.state
    groups = list(state.groups.values())
    for name in state.channels:
        scan = [g for g in groups if any(p.matches(name) for p in g.patterns)]
        found = state.patterns.groups_of(match_keys(name))
        if found != scan:
            fail("reader_index", f"channel {name}: the index gives groups "
                 f"{[g.key for g in found]}, a scan {[g.key for g in scan]}")
    held = sum(len(bucket) for bucket in state.patterns.readers.values())
    if held != sum(len(g.prefixes) for g in groups):
        fail("reader_index", f"the index holds {held} (prefix, group) pairs, the groups "
             f"read {sum(len(g.prefixes) for g in groups)}")
    logs = list(state.channels.values())
    for prefix in {p.prefix for g in groups for p in g.patterns if not p.concrete}:
        index = [log.name for log in state.channel_index.matching(prefix)]
        scan = [log.name for log in logs if log.name.startswith(prefix)]
        if index != scan:
            fail("reader_index", f"wildcard {prefix}*: the index gives channels {index}, "
                 f"a scan {scan}")
    if len(state.channel_index) != len(logs):
        fail("reader_index", f"the channel index holds {len(state.channel_index)} "
             f"channels, the broker {len(logs)}")


# -------------------------------------------------------------- settlements
def on_settle(ledger: Ledger, conn: int, op: str, tags: Sequence[int],
              failed: list[tuple[int, int, str]], now: float, seconds: float = 0.0
              ) -> list[Read]:
    """The broker answered a settlement at once (the refused tags); the reads it took."""
    refused = {tag for tag, _, _ in failed}
    took: list[Read] = []
    for tag in tags:
        if tag in refused:
            continue
        t = ledger.tags.get(tag)
        if t is None or not t.live or t.conn != conn:
            why = ("unknown" if t is None else "another connection's" if t.conn != conn
                   else "no longer live")
            fail("tags_fenced", f"{op} of tag {tag} ({why}) succeeded")
        if op == "extend":
            t.expires = now + seconds
            continue
        took.append(t.read)
        if op == "ack":
            ledger.ack_issued.add(t.read)
            ledger.kill(t)
        else:
            ledger.returned(t, by_member=True)
    return took


def on_ack_durable(ledger: Ledger, reads: list[Read]) -> None:
    ledger.acked.update(reads)


# ----------------------------------------------------------------- publishes
def on_publish_reply(ledger: Ledger, sends: Sequence[Send], pids: Sequence[str],
                     outcomes: Sequence[Outcome]) -> None:
    """A publish was answered: what it confirms must be in storage now."""
    for send, pid, o in zip(sends, pids, outcomes, strict=True):
        if o.code:
            continue
        if send.channel.endswith("*") and not o.duplicate:
            found = ledger.by_pid.get(pid, [])
            if len(found) != o.fanout:
                fail("confirmed_is_durable", f"broadcast {pid} to {send.channel} confirmed "
                     f"with fanout {o.fanout}; storage holds {found}")
            ledger.confirmed.update(found)
            continue
        if o.duplicate and not o.id:
            # A producer's resend of a sequence stored before the run its state still
            # describes (its seq is no longer known: producers.py), or a repeat of a
            # dedup key whose first send was a broadcast that reached no channel.
            found = ledger.by_pid.get(pid, [])
            if not found and ledger.sent[pid].kind == "numbered" and not send.dedup:
                fail("confirmed_is_durable", f"{pid} to {send.channel} confirmed as a "
                     "duplicate (seq unknown) but storage holds no message of it")
            ledger.confirmed.update(found)
            continue
        key = ledger.by_id.get(o.id)
        if key is None or key[1] != o.seq:
            fail("confirmed_is_durable", f"{pid} to {send.channel} confirmed as seq {o.seq} "
                 f"({o.id}{', duplicate' if o.duplicate else ''}) but storage does not "
                 "hold it")
        if not o.duplicate and ledger.stored[key].pid != pid:
            fail("confirmed_is_durable", f"{pid} confirmed as {key}, which stores "
                 f"{ledger.stored[key].pid}")
        ledger.confirmed.add(key)


def on_txn_reply(ledger: Ledger, pids: Sequence[str], failed_channels: set[str],
                 discarded: int) -> None:
    """A transaction commit was answered: each of its messages is stored once."""
    for pid in pids:
        if ledger.sent[pid].target in failed_channels:
            continue
        found = ledger.by_pid.get(pid, [])
        if len(found) != 1:
            fail("confirmed_is_durable", f"transaction message {pid} committed; storage "
                 f"holds it {len(found)} times")
        ledger.confirmed.update(found)


# --------------------------------------------------------------------- end
def at_end(ledger: Ledger, scenario: Scenario, now: float) -> None:
    """After every group was read dry and everything committed."""
    for key in sorted(ledger.confirmed):
        channel, seq = key
        s = ledger.stored[key]
        expired = s.expires_at is not None and s.expires_at <= now
        groups = [g for g in scenario.groups if g.matches(channel)
                  and (not g.exclusive or g.key in ledger.groups_defined)]
        if not groups:
            if seq not in ledger.live.get(channel, ()) and key not in ledger.deleted:
                fail("confirmed_never_lost", f"{key} ({s.pid}) is not in storage and no "
                     "group read it")
            continue
        for g in groups:
            read = (g.key, channel, seq)
            if read in ledger.drained or expired or key in ledger.deleted or any(
                    grp in ("", g.key) for _, grp in ledger.dead.get(key, [])):
                continue
            durable = ledger.durable.get((g.key, channel))
            if durable is None or not durable.settled(seq):
                fail("confirmed_never_lost", f"{key} ({s.pid}) was never delivered to "
                     f"{g.key} at the end, nor settled there")
            if read not in ledger.ack_issued and read not in ledger.exceeded_ever:
                fail("confirmed_never_lost", f"{key} ({s.pid}) is settled for {g.key} "
                     "but no ack, dead letter, TTL or drop settled it")
    for read, run in sorted(ledger.exceeded.items()):
        group, channel, seq = read
        if run == ledger.run and scenario.channel_options(channel).dead_letter \
                and ("requeue_limit", group) not in ledger.dead.get((channel, seq), []):
            fail("requeue_limit", f"{(channel, seq)} came back to {group} past its limit "
                 "but was not dead-lettered")
