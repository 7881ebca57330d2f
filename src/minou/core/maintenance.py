"""Operator actions on the broker's state: purge, delete a group, requeue dead letters,
queue statistics. No I/O: storage reads happen in the adapter, which passes the
messages in; every change goes to storage with the broker's next batch.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import BadRequest, NotFound, QueueFull
from ..names import DEAD_PREFIX, schema_key
from ..protocol.frames import Send
from .broker import Broker
from .group import GroupChannel, Subscription
from .log import ChannelLog, Msg
from .publishing import check_room
from .stats import channel_stats, group_stats

_DEAD_HEADERS = ("x-dead-reason", "x-dead-detail", "x-dead-group", "x-original-channel",
                 "x-original-seq", "x-original-id")


def queue_of(channel: str) -> str:
    """``orders/v1/42`` -> ``orders/v1``; ``_dead/orders/v1/42`` -> ``_dead/orders/v1``."""
    key = schema_key(channel)
    return DEAD_PREFIX + key if channel.startswith(DEAD_PREFIX) else key


def channels_of(core: Broker, queue: str, channel_id: str | None = None) -> list[ChannelLog]:
    """The channels of ``queue`` (``endpoint/version``), or its one channel ``channel_id``."""
    if channel_id:
        log = core.channels.get(f"{queue}/{channel_id}")
        return [log] if log is not None else []
    return [log for name, log in sorted(core.channels.items()) if queue_of(name) == queue]


def advance(core: Broker, gc: GroupChannel, upto: int) -> None:
    """Settle everything of ``gc`` below ``upto`` for its group (a reader that keeps its
    own offsets reports progress); its deliveries below are forgotten."""
    gc.advance(upto)
    core.state.mark(gc)


def purge(core: Broker, log: ChannelLog) -> int:
    """Remove every committed message of ``log``; readers go on from its end."""
    upto = log.end
    for gc in list(log.states):
        advance(core, gc, upto)
    removed = log.truncate_below(upto)
    core.batch.truncates[log.name] = log.first_seq
    core.batch.channels[log.name] = log.next_seq
    return removed


def delete_messages(core: Broker, log: ChannelLog, seqs: list[int]) -> list[int]:
    """Delete messages of ``log`` by seq (``XDEL``, an operator removing one message);
    return the seqs that were there. A reader holding one now is not told: its ack
    settles nothing and a requeue finds the message gone, as for an expired one."""
    deleted = []
    for seq in dict.fromkeys(seqs):
        if log.delete_one(seq):
            core.batch.deletes.append((log.name, seq))
            deleted.append(seq)
    if deleted:
        core.batch.channels[log.name] = log.next_seq
        for gc in log.states:  # their waiting counts and floors moved
            core.state.mark(gc)
    return deleted


def delete_group(core: Broker, key: str, now: float, *, force: bool = False) -> dict[str, Any]:
    """Forget a reader group (a durable listener that will not come back, a consumer
    group that is retired), so retention stops waiting for it."""
    grp = core.groups.get(key)
    if grp is None:
        raise NotFound(f"no group {key!r} (see minou list)")
    if grp.members and not force:
        raise BadRequest(f"group {key!r} has {len(grp.members)} connected member(s); "
                         "they must unsubscribe first (or force it)")
    for sub in list(grp.members):
        core.unsubscribe(sub.session, sub.sid, now)
        # The member's connection is told by the adapter.
    logs = [gc.log for gc in grp.gcs.values()]
    for gc in list(grp.gcs.values()):
        core.subscriptions.detach(gc)
    core.state.drop_group(grp)
    core.state.ready_groups.pop(grp, None)
    core.batch.group_defs[key] = None
    for log in logs:  # the other readers' floors may now let storage truncate
        for other in log.states:
            core.state.dirty[other] = None
    return {"group": key, "channels": len(logs)}


def requeue_dead(core: Broker, dead: ChannelLog, msgs: list[Msg], now: float) -> int:
    """Move dead letters back to their channel (new seqs, attempts start again);
    those a reader of the dead-letter channel holds right now stay."""
    if not dead.name.startswith(DEAD_PREFIX):
        raise BadRequest(f"{dead.name!r} is not a dead-letter channel")
    target = core.state.log(dead.name[len(DEAD_PREFIX):], now)
    held = {seq for gc in dead.states for seq in gc.pending}
    moved = 0
    for m in msgs:
        if m.seq in held:
            continue
        try:
            check_room(target)  # before the dead copy goes: a full channel keeps it
        except QueueFull:
            break
        if not dead.delete_one(m.seq):
            continue
        headers = {k: v for k, v in (m.headers or {}).items() if k not in _DEAD_HEADERS}
        send = Send(target.name, m.data, m.raw, headers or None, m.priority, None, None, None,
                    m.key)
        staged = core.publishing.stage(target, send, now)
        core.batch.requeued.add((target.name, staged.seq))
        core.batch.deletes.append((dead.name, m.seq))
        moved += 1
    for gc in dead.states:
        core.state.mark(gc)
    return moved


def _readers(log: ChannelLog, group: str | None) -> list[GroupChannel]:
    return [gc for gc in log.states if group is None or gc.group.key == group]


def oldest_waiting(core: Broker, log: ChannelLog, group: str | None = None) -> int | None:
    """The lowest seq of ``log`` still waiting (stored, neither delivered nor settled) for
    ``group``, or for any reader; with no reader, the oldest live message."""
    gcs = _readers(log, group)
    if not gcs:
        return None if group is not None else log.oldest_live()
    seqs = [seq for seq in (gc.waiting()[1] for gc in gcs) if seq is not None]
    return min(seqs) if seqs else None


def waiting_and_in_flight(logs: list[ChannelLog], group: str | None,
                          now: float) -> dict[str, Any]:
    """Messages *waiting* (stored, not yet delivered) and *in flight* (delivered, not
    yet settled), for ``group`` or for every reader. A channel's waiting count is its
    furthest-behind reader's (a message waiting for two groups counts once); with no
    reader, every stored message waits. The in-flight age is its oldest message's,
    since publish."""
    waiting = in_flight = 0
    published: list[float] = []
    for log in logs:
        gcs = _readers(log, group)
        if gcs:
            waiting += max(gc.waiting()[0] for gc in gcs)
        elif group is None:
            waiting += log.count
        for gc in gcs:
            in_flight += len(gc.pending)
            published.extend(lease.msg.published_at for lease in gc.pending.values())
    return {"waiting": waiting, "in_flight": in_flight,
            "oldest_in_flight_age_s": round(now - min(published), 3) if published else None}


def queue_stats(core: Broker, queue: str, channel_id: str | None = None,
                oldest: dict[str, float | None] | None = None,
                now: float = 0.0, *, group: str | None = None,
                oldest_waiting: dict[str, float | None] | None = None) -> dict[str, Any]:
    """Depth, waiting, in flight, consumers and listeners of a queue (``endpoint/version``).

    ``oldest`` and ``oldest_waiting`` are, per channel, when its oldest message not yet
    settled (waiting or in flight) and its oldest waiting message were published (the
    adapter reads them; see oldest_unsettled and oldest_waiting). ``group`` narrows
    those and waiting / in_flight to one reader group."""
    logs = channels_of(core, queue, channel_id)
    names = {log.name for log in logs}
    groups = [g for g in core.groups.values() if any(n in g.gcs for n in names)]
    ages = [now - t for t in (oldest or {}).values() if t is not None]
    waiting_ages = [now - t for t in (oldest_waiting or {}).values() if t is not None]
    return {
        "queue": queue,
        "channels": [channel_stats(log) for log in logs],
        "depth": sum(log.count for log in logs),
        # "unsettled" is the old name of in_flight (for every group): kept for scripts.
        "unsettled": sum(len(gc.pending) for log in logs for gc in log.states),
        **waiting_and_in_flight(logs, group, now),
        "oldest_waiting_age_s": round(max(waiting_ages), 3) if waiting_ages else None,
        "published": sum(log.published for log in logs),
        "requeued": sum(log.requeued for log in logs),
        "delivered": sum(gc.delivered for log in logs for gc in log.states),
        "acked": sum(gc.acks for log in logs for gc in log.states),
        "dropped": sum(log.dropped for log in logs),
        "expired": sum(log.expired for log in logs),
        "oldest_age_s": round(max(ages), 3) if ages else None,
        "consumers": sum(len(g.members) for g in groups if g.kind == "consume"),
        "listeners": sum(len(g.members) for g in groups if g.kind == "listen"),
        "groups": [group_stats(g) for g in groups],
        "options": _options(core, queue),
    }


def _options(core: Broker, queue: str) -> dict[str, Any]:
    """The options of ``queue``'s channels (a reload gives its channels the new ones;
    dead letters have their channel's)."""
    dead = queue.startswith(DEAD_PREFIX)
    opts = core.options_for(queue[len(DEAD_PREFIX):] if dead else queue)
    return {"prefetch": opts.prefetch, "ttl": opts.ttl, "max_items": opts.max_items,
            "overflow": opts.overflow, "requeue_limit": opts.requeue_limit,
            # a dead letter of a dead letter is dropped (core/dead_letters.py)
            "dead_letter": opts.dead_letter and not dead, "retention": opts.retention,
            "schema": opts.schema.key if opts.schema is not None else None,
            "durability": opts.durability,
            "sync_interval_ms": round(opts.sync_interval * 1000, 3)
            if opts.durability == "interval" else None,
            "expire_idle": opts.expire_idle}


def oldest_unsettled(core: Broker, log: ChannelLog, group: str | None = None) -> int | None:
    """The lowest seq of ``log`` not yet settled (by ``group``, or by any reader);
    None when everything is settled. With no reader, the oldest live message."""
    gcs = [gc for gc in log.states if group is None or gc.group.key == group]
    if group is not None and not gcs:
        return None
    floors = [gc.compute_floor() for gc in gcs] if gcs else [log.first_seq]
    seq = max(min(floors), log.first_seq)
    while seq < log.end:
        past = log.gone.skip(seq)  # a deleted run at once, not seq by seq
        if past != seq:
            seq = past
        elif any(gc.is_acked(seq) for gc in gcs):
            # A long run of acks is passed in one step
            seq = max(max(gc.acked_runs.skip(seq), seq + 1) for gc in gcs if gc.is_acked(seq))
        else:
            break
    return seq if seq < log.end and seq >= log.first_seq else None


def receipt(core: Broker, log: ChannelLog, seq: int) -> dict[str, Any]:
    """What happened to message ``seq`` of ``log``, as far as memory knows: per reader
    group waiting, delivered (with attempts) or acked; ``removed`` once gone (the
    adapter then looks for a dead-letter copy)."""
    found = log.lookup(seq)  # not a message from the log's end on
    groups = []
    for gc in log.states:
        if seq < gc.floor or gc.is_acked(seq):
            state = "acked"
        elif seq in gc.pending:
            state = "delivered"
        else:
            state = "requeued" if gc.attempts.get(seq) else "waiting"
        groups.append({"group": gc.group.key, "state": state,
                       "attempts": gc.attempts.get(seq, 0)})
    if seq >= log.end:
        overall = "unknown"
    elif seq < log.first_seq or seq in log.gone:
        overall = "removed"
    elif groups and all(g["state"] == "acked" for g in groups):
        overall = "acked"
    elif any(g["state"] == "delivered" for g in groups):
        overall = "delivered"
    else:
        overall = "stored"
    out: dict[str, Any] = {"channel": log.name, "seq": seq, "state": overall,
                           "groups": groups if overall not in ("removed", "unknown") else []}
    if isinstance(found, Msg):
        out["published_at"] = found.published_at
    return out


def _touches(pattern: str, queue: str) -> bool:
    """Whether a subscription pattern reads (part of) ``queue``."""
    if pattern.endswith("/*"):
        prefix = pattern[:-1]
        return queue.startswith(prefix) or prefix.startswith(queue + "/")
    return pattern.startswith(queue + "/")


def rate_text(per_second: float) -> tuple[str, str]:
    """A positive rate as (number, unit), never rounded down to 0: ("12", "second"),
    ("3.0", "second"), ("0.25", "second"), ("1.2", "minute"), ("0.36", "hour")."""
    r = per_second
    if r >= 10:
        return f"{r:.0f}", "second"
    if r >= 1:
        return f"{r:.1f}", "second"
    if r >= 0.1:
        return f"{r:.2f}", "second"
    if r * 60 >= 1:
        return f"{r * 60:.1f}", "minute"
    if r * 60 >= 0.1:
        return f"{r * 60:.2f}", "minute"
    return f"{r * 3600:.2g}", "hour"


def _no_room(members: list[Subscription], waiting: int, in_flight: int) -> str:
    """Why no member can take a message now."""
    polls = [m for m in members if m.on_demand]
    if len(polls) == len(members):
        text = (f"Nobody is asking for messages: {len(polls)} HTTP consumer(s) are connected "
                "but no consume request is waiting (an HTTP consumer takes messages only while "
                "a POST /v1/consume request waits)")
        if waiting:
            text += f"; {waiting} message(s) wait"
        if in_flight:
            text += f"; they hold {in_flight} message(s) in flight (delivered, not yet acked)"
        return text + "."
    heavy = [m for m in members if m.pool.stops(m.held)]
    if heavy:
        pool = heavy[0].pool
        why = (f"each holds {pool.per_subscription >> 20} MiB or more"
               if all(m.held >= pool.per_subscription for m in heavy) else
               f"the broker's consumers hold {pool.total >> 20} MiB of unsettled messages "
               f"together (in_flight_bytes is {pool.limit >> 20} MiB)")
        return (f"{len(heavy)} of {len(members)} consumer(s) hold as many bytes of "
                f"unsettled messages as they may ({why}): they hold {in_flight} message(s) "
                "in flight and get more as they ack.")
    limits = sorted({m.prefetch for m in members if not m.on_demand})  # polls: 0
    each = (f"each takes at most {limits[0]}" if len(limits) == 1 else
            f"they take at most {', '.join(map(str, limits[:-1]))} and {limits[-1]}")
    # The prefetch a consumer subscribed with, not the queue's option: say so.
    text = (f"All {len(members)} consumer(s) are at their prefetch limit ({each} at a "
            f"time, as they subscribed): they hold {in_flight} message(s) in flight and "
            "are not acking.")
    if polls:
        text += f" {len(polls)} of them are HTTP consumer(s) with no request waiting."
    return text


def _dead_diagnosis(queue: str, stats: dict[str, Any]) -> str:
    """A dead-letter queue is read by people, not consumers: no reader is normal."""
    base = queue[len(DEAD_PREFIX):]
    depth = stats["depth"]
    if depth == 0:
        return f"No dead letters: nothing of {base} waits here."
    return (f"{depth} dead letter(s) of {base}: messages that expired or were given up "
            "after too many deliveries. Each one says why; requeue them once the cause is "
            "fixed, or delete them.")


def diagnose(core: Broker, queue: str, stats: dict[str, Any], now: float, *,
             draining: bool = False, schema_recent: float = 0.0,
             deliver_rate: float = 0.0, rate_window: float = 60.0) -> str:
    """One sentence: why messages of ``queue`` are (not) flowing, from what the broker
    can see. ``stats`` is queue_stats output; rates come from the adapter, averaged over
    the last ``rate_window`` seconds. A queue whose oldest waiting message is older than
    that window is never called flowing, whatever was delivered meanwhile."""
    if draining:
        return "The broker is stopping (soft stop): nothing new is delivered."
    refused = [(p, n, who) for p, (n, who) in core.read_refusals.items() if _touches(p, queue)]
    if schema_recent > 0:
        return (f"Publishes are being refused by the schema of {queue} "
                f"({schema_recent:.1f}/s over the last minute): producers send the wrong format.")
    if queue.startswith(DEAD_PREFIX):
        return _dead_diagnosis(queue, stats)
    if stats["depth"] == 0:
        if stats["published"] == 0:
            return f"Nothing has been published to {queue} yet."
        return "The queue is empty: everything published has been settled."
    groups = stats["groups"]
    if not groups:
        if refused:
            p, n, who = max(refused, key=lambda r: r[1])
            return (f"No reader: client {who!r} was refused reading {p!r} by the rules "
                    f"({n} time(s)); messages wait.")
        return (f"No consumer or listener has ever subscribed to {queue}: messages wait "
                "until one does.")
    members = [m for g in core.groups.values() if g.key in {x["group"] for x in groups}
               for m in g.members]
    if not members:
        names = ", ".join(g["group"] for g in groups[:3])
        extra = ""
        if refused:
            p, n, who = max(refused, key=lambda r: r[1])
            extra = f" Client {who!r} was refused reading {p!r} by the rules ({n} time(s))."
        return f"No consumer is connected (group(s) {names} have no members).{extra}"
    if all(m.paused for m in members):
        return "Every consumer is paused: their connections are not reading fast enough."
    in_flight, waiting = stats["in_flight"], stats["waiting"]
    logs = channels_of(core, queue)
    unread = [log.name for log in logs if log.count and not log.states]
    hint = (f" {len(unread)} of its channels ({unread[0]}{', …' if len(unread) > 1 else ''}) "
            "have no reader at all: their messages wait for one." if unread else "")
    asking = [m for m in members if m.active and not m.paused and m.prefetch > m.unsettled
              and not m.pool.stops(m.held)]
    if not asking and (waiting or in_flight):
        return _no_room(members, waiting, in_flight) + hint
    flowing = ("Messages are flowing: {} delivered per {}.".format(*rate_text(deliver_rate))
               if deliver_rate > 0 else None)
    if not waiting:
        if flowing:
            return flowing
        if in_flight:
            return (f"Nothing waits: {in_flight} message(s) are in flight (delivered, not "
                    "yet acked).")
        return (f"Nothing waits and nothing is in flight: the {stats['depth']} stored "
                "message(s) are settled (kept for replay by retention, or removed soon).")
    due = [t for log in logs for gc in log.states for t in
           ([gc.delayed[0][0]] if gc.delayed else []) + ([gc.sched[0][0]] if gc.sched else [])]
    ready = any(gc in gc.group.ready for log in logs for gc in log.states)
    if due and not ready:
        when = min(due)
        return (f"Messages are delayed (publish delay or nack delay) until "
                f"{time.strftime('%H:%M:%S', time.localtime(when))}, in {when - now:.0f} s.")
    age = stats.get("oldest_waiting_age_s")
    if age is None or age <= rate_window:
        if flowing:
            return flowing
        return (f"{waiting} message(s) wait and {len(members)} reader(s) are connected; "
                f"deliveries should follow.{hint}")
    if flowing:
        number, unit = rate_text(deliver_rate)
        return (f"Deliveries do not keep up: {number} delivered per {unit}, but the oldest "
                f"of {waiting} waiting message(s) has waited {age:.0f} s (longer than the "
                f"last {rate_window:.0f} s).{hint}")
    return (f"{waiting} message(s) wait, the oldest for {age:.0f} s, and nothing was "
            f"delivered in the last {rate_window:.0f} s although {len(asking)} reader(s) "
            f"could take more.{hint}")
