"""Subscriptions: the groups readers join (``listen``, ``consume``), the patterns they
read, where they start, and where a consumer group stands (``offsets``,
``set_position``). Rights are checked in ``rights``; ending a subscription hands its
unsettled deliveries back through ``settlement``."""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import BadRequest, InvalidChannel, NotAuthorized, QueueFull, UnknownSubscription
from ..limits import (
    MAX_GROUP_NAME,
    MAX_GROUP_PATTERNS,
    MAX_GROUP_PATTERNS_PER_CLIENT,
    MAX_GROUPS,
    MAX_GROUPS_PER_CLIENT,
    MAX_LEASE_S,
    MAX_PATTERNS_PER_GROUP,
    MAX_PREFETCH,
    MAX_SUBSCRIPTIONS,
)
from ..names import (
    Pattern,
    check_label,
    consume_group_key,
    is_dead_letter,
    listen_group_key,
    parse_pattern,
    validate_channel,
)
from .group import Group, GroupChannel, Subscription
from .log import ChannelLog, ChannelOptions
from .rights import Rights
from .session import Session
from .settlement import Settlement
from .state import BrokerState


class Subscriptions:
    def __init__(self, state: BrokerState, rights: Rights, settlement: Settlement) -> None:
        self.state = state
        self.rights = rights
        self.settlement = settlement

    def subscribe(
        self,
        session: Session,
        sid: int,
        *,
        kind: str,
        patterns: list[str],
        group: str | None,
        start: str,
        prefetch: int,
        lease: float,
        name: str | None,
        now: float,
        exclusive: bool = False,
    ) -> Subscription:
        """``Broker.subscribe``, which gives every argument."""
        if kind not in ("listen", "consume"):
            raise BadRequest(f"kind must be 'listen' or 'consume', not {kind!r}")
        if not patterns:
            raise BadRequest("subscribe needs at least one pattern")
        if len(patterns) > MAX_PATTERNS_PER_GROUP:
            raise BadRequest(f"{len(patterns)} patterns in one subscribe; the limit is "
                             f"{MAX_PATTERNS_PER_GROUP}: read channels with a wildcard "
                             "(orders/v1/*)", limit=MAX_PATTERNS_PER_GROUP)
        parsed = [parse_pattern(p) for p in patterns]
        if sid in session.subs:
            raise BadRequest(f"subscription id {sid} is already in use on this connection")
        if len(session.subs) >= MAX_SUBSCRIPTIONS:
            raise BadRequest(f"{len(session.subs)} subscriptions on one connection already "
                             f"(the limit is {MAX_SUBSCRIPTIONS}); use patterns to cover more "
                             "channels with one")
        texts = [p.text for p in parsed]
        self.rights.check_read(session, *texts, claim=False)
        if kind == "consume":
            key = consume_group_key(group or patterns[0])
        else:
            key = listen_group_key(session.client_id, name or patterns[0])
        start_cursor = self._parse_start(start, kind)
        if not 0 <= prefetch <= MAX_PREFETCH:
            raise BadRequest(f"prefetch must be 0..{MAX_PREFETCH}, got {prefetch}")
        if not 0 <= lease <= MAX_LEASE_S:
            raise BadRequest(f"lease must be 0..{MAX_LEASE_S} seconds, got {lease}")
        grp = self.state.groups.get(key)
        if grp is None:  # checked before anything is claimed; a group that exists is joined
            self._may_make_group(session, "group name" if kind == "consume" else "listener name",
                                 group if kind == "consume" else name)
        if exclusive:
            self._check_exclusive(session, kind, parsed, grp)
        self._check_pattern_room(session, grp, texts)
        if grp is not None:
            self.rights.check_group_rights(session, grp, texts)
        # Checked: now this read claims what it reads (the group's channels too).
        self.rights.check_read(session, *texts, *(p.text for p in grp.patterns) if grp else ())
        if grp is None:
            grp = self._new_group(key, kind, session)
        elif start.startswith("seq:") and not grp.members:
            self._reset(grp, start_cursor, now)
        self._add_patterns(grp, texts, start_cursor, now)
        if not prefetch:
            first = next(iter(grp.gcs.values()), None)
            prefetch = first.log.options.prefetch if first else self.options_prefetch(patterns[0])
        if exclusive:
            self.rights.reserve(session, texts[0])
        sub = Subscription(session, sid, grp, prefetch, lease or self.state.default_lease,
                           self.state.in_flight)
        grp.members.append(sub)
        session.subs[sid] = sub
        self.state.mark_ready(grp)
        return sub

    def _may_make_group(self, session: Session, kind: str, name: str | None) -> None:
        """Raise unless a new group may be made: the broker keeps each for good (its
        definition and state are stored), so their number is bounded, and so is the
        name a client gives one (a default, a pattern, is valid already). Groups made
        before these bounds are joined whatever their names."""
        if name:
            check_label(kind, name, MAX_GROUP_NAME, space=True)
            if kind == "group name":
                self._may_take_default_name(session, name)
        if len(self.state.groups) >= MAX_GROUPS:
            raise QueueFull(f"the broker keeps {len(self.state.groups)} consumer groups and "
                            f"listeners (the limit is {MAX_GROUPS}); join an existing group, or "
                            "have an admin delete unused ones (DELETE /v1/groups/{group})",
                            limit=MAX_GROUPS)
        if not session.admin:
            made = self._made_by(session.client_id)
            if made >= MAX_GROUPS_PER_CLIENT:
                raise QueueFull(
                    f"client {session.client_id!r} made {made} of the consumer groups and "
                    f"listeners this broker keeps (a client may make {MAX_GROUPS_PER_CLIENT} "
                    f"of the {MAX_GROUPS}, so that no one uses them all); join an existing "
                    "group, or have an admin delete unused ones (DELETE /v1/groups/{group})",
                    limit=MAX_GROUPS_PER_CLIENT)

    def _made_by(self, client_id: str) -> int:
        """How many of the groups that exist ``client_id`` made since the start (groups
        restored from storage have no maker: they count towards MAX_GROUPS only)."""
        makers, groups = self.state.group_makers, self.state.groups
        if len(makers) > 2 * MAX_GROUPS:  # groups made and deleted since: forget those
            for key in [k for k in makers if k not in groups]:
                del makers[key]
        return sum(1 for key, maker in makers.items() if maker == client_id and key in groups)

    def _may_take_default_name(self, session: Session, name: str) -> None:
        """A group named like a pattern is the group of whoever consumes that pattern
        without naming one: only a client that may read the pattern may make it. Else a
        client allowed one channel could make ``orders/v1/*`` on that channel, and every
        consumer of ``orders/v1/*`` would be refused for sharing a group with it."""
        try:
            pattern = parse_pattern(name)
        except InvalidChannel:
            return
        # Not recorded as a refused read: nobody was kept from reading the pattern.
        refusal = self.rights.read_refusal(session, pattern.text)
        if refusal is not None:
            raise NotAuthorized(
                f"group name {name!r} is the group of the consumers of pattern {name!r} that "
                f"name none, and client {session.client_id!r} may not read it "
                f"({refusal.message}); name the group otherwise", group=name)

    def _new_group(self, key: str, kind: str, session: Session) -> Group:
        grp = self.state.add_group(Group(key, kind, []))
        self.state.group_makers[key] = session.client_id
        return grp

    def _check_exclusive(self, session: Session, kind: str, parsed: list[Pattern],
                         grp: Group | None) -> None:
        """An exclusive subscription (a peer channel's role) reads one channel by name in
        a consumer group that one connection at a time holds; the channel's reservation
        is checked with the other read rights."""
        if kind != "consume" or len(parsed) != 1 or not parsed[0].concrete:
            raise BadRequest("an exclusive subscription consumes one channel, by name")
        if grp is not None and any(m.session is not session for m in grp.members):
            holder = grp.members[0].session.client_id
            raise NotAuthorized(
                f"group {grp.key.removeprefix('consume:')!r} is exclusive and held by another "
                f"connection (client {holder!r}); it is free once that one is gone",
                group=grp.key, client=holder)

    def options_prefetch(self, pattern: str) -> int:
        """The prefetch of the queue a (parsed, so valid) ``pattern`` reads: a pattern
        over several queues (``endpoint/*``) has the default."""
        body = pattern[len("_dead/"):] if is_dead_letter(pattern) else pattern
        endpoint, version = body.split("/")[:2]  # endpoint/* or endpoint/version/...
        if version != "*":
            return self.state.options_for(f"{endpoint}/{version}").prefetch
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

    def _add_patterns(self, grp: Group, texts: list[str], start: int | str,
                      now: float) -> None:
        """Have ``grp`` read ``texts`` too (checked), from ``start`` in channels it did
        not read; its definition is stored once."""
        added = False
        for text in texts:
            added = self._add_pattern(grp, text, start, now) or added
        if added:
            self.state.batch.group_defs[grp.key] = grp.definition()

    def _add_pattern(self, grp: Group, text: str, start: int | str, now: float) -> bool:
        pattern = parse_pattern(text)
        if not grp.add_pattern(pattern):
            return False
        state = self.state
        if pattern.concrete:
            hosts = state.hosts
            if hosts is None or hosts(text):
                state.log(text, now)  # a named channel exists from its first reader on
            log = state.channels.get(text)
            if log is not None and text not in grp.gcs:
                state.attach(grp, log, self._cursor_for(log, start), now)
            return True
        for log in state.channel_index.matching(pattern.prefix):
            if log.name not in grp.gcs:
                state.attach(grp, log, self._cursor_for(log, start), now)
        return True

    def _check_pattern_room(self, session: Session, grp: Group | None,
                            texts: list[str]) -> None:
        """Raise unless ``grp`` (None: a group to be made) may read ``texts`` too, and
        the channels they name and that do not exist yet may be made."""
        have = grp.texts if grp is not None else set()
        fresh = {t for t in texts if t not in have}
        state, hosts = self.state, self.state.hosts
        made = [t for t in fresh if t not in state.channels and parse_pattern(t).concrete
                and (hosts is None or hosts(t))]
        state.check_new_channels(len(made))
        state.check_new_inboxes(made)
        new = len(fresh)
        if len(have) + new > MAX_PATTERNS_PER_GROUP:
            what = "group" if grp is None or grp.kind == "consume" else "listener"
            raise QueueFull(
                f"the {what} would read {len(have) + new} patterns (channels by name count "
                f"one each); the limit is {MAX_PATTERNS_PER_GROUP}: read channels with a "
                "wildcard (orders/v1/*), or split them over several groups",
                limit=MAX_PATTERNS_PER_GROUP)
        if not fresh:
            return
        held = state.patterns.total
        if held + new > MAX_GROUP_PATTERNS:
            raise QueueFull(
                f"the broker's groups read {held} patterns (the limit is "
                f"{MAX_GROUP_PATTERNS}: each is held for good); read channels with "
                "wildcards, or have an admin delete unused groups (DELETE "
                "/v1/groups/{group})", limit=MAX_GROUP_PATTERNS)
        if session.admin:
            return
        groups = state.groups
        mine = sum(len(g.patterns) for key, maker in state.group_makers.items()
                   if maker == session.client_id and (g := groups.get(key)) is not None)
        if mine + new > MAX_GROUP_PATTERNS_PER_CLIENT:
            raise QueueFull(
                f"the groups client {session.client_id!r} made read {mine} patterns and "
                f"this adds {new} (a client's groups may read {MAX_GROUP_PATTERNS_PER_CLIENT} "
                f"of the broker's {MAX_GROUP_PATTERNS}); read channels with wildcards, or "
                "have an admin delete unused groups", client=session.client_id,
                limit=MAX_GROUP_PATTERNS_PER_CLIENT)

    def _reset(self, grp: Group, start: int | str, now: float) -> None:
        for name, gc in list(grp.gcs.items()):
            log = gc.log
            log.states.remove(gc)
            fresh = GroupChannel(grp, log, self._cursor_for(log, start))
            grp.gcs[name] = fresh
            log.states.append(fresh)
            fresh.load_specials(now)
            if fresh.sched:
                self.state.timed[fresh] = None
            grp.ready.pop(gc, None)
            self.state.dirty.pop(gc, None)
            self.state.timed.pop(gc, None)  # its timers would wake the old state
            self.state.mark(fresh)

    def add_pattern(self, session: Session, sid: int, pattern: str, now: float) -> None:
        sub = self._sub(session, sid)
        text = parse_pattern(pattern).text
        self.rights.check_read(session, text, claim=False)
        self.rights.check_group_rights(session, sub.group, [text], joining=False)
        self.rights.check_read(session, text)
        grp = sub.group
        self._check_pattern_room(session, grp, [text])
        self._add_patterns(grp, [text], "new" if grp.kind == "listen" else "oldest", now)
        self.state.mark_ready(grp)

    def remove_pattern(self, session: Session, sid: int, pattern: str) -> None:
        sub = self._sub(session, sid)
        grp = sub.group
        kept = [p for p in grp.patterns if p.text != pattern]
        if len(kept) == len(grp.patterns):
            raise BadRequest(f"subscription {sid} has no pattern {pattern!r}")
        if not kept:
            raise BadRequest("cannot remove the last pattern; unsubscribe instead")
        grp.set_patterns(kept)
        self.state.batch.group_defs[grp.key] = grp.definition()
        for name, gc in list(grp.gcs.items()):
            if not grp.matches(name):
                self.detach(gc)
        self.state.mark_ready(grp)  # credit freed by the detach may serve the rest

    def detach(self, gc: GroupChannel) -> None:
        """Stop ``gc``'s group reading its channel; its deliveries there are forgotten."""
        grp = gc.group
        gc.drop_leases()
        del grp.gcs[gc.log.name]
        gc.log.states.remove(gc)
        grp.ready.pop(gc, None)
        self.state.dirty.pop(gc, None)
        self.state.timed.pop(gc, None)
        self.state.batch.group_states[(grp.key, gc.log.name)] = None

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
            self.settlement.return_lease(lease, now, front=True, delay=0.0)
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

    def offsets(self, session: Session, patterns: list[str]) -> dict[str, list[int]]:
        """``{channel: [first_seq, next_seq]}`` for every channel the patterns match."""
        out: dict[str, list[int]] = {}
        for _ in self.match_offsets(session, patterns, out):
            pass
        return out

    def match_offsets(self, session: Session, patterns: list[str], out: dict[str, list[int]],
                      step: int = 0) -> Iterator[None]:
        """Fill ``out`` as ``offsets`` answers. Read rules are checked now (refused here,
        not later); the channels are then tried as the result is iterated, ``step`` at
        a time with a yield between (0: all at once), so that a caller on the event
        loop lets others go between the steps of a match over 100,000 channels."""
        parsed = [parse_pattern(text) for text in patterns]
        self.rights.check_read(session, *(p.text for p in parsed))  # claims a concrete ! channel
        for pattern in parsed:
            if pattern.concrete:
                log = self.state.channels.get(pattern.text)
                if log is not None:
                    out[log.name] = [log.first_seq, log.end]
        wildcards = tuple(dict.fromkeys(p.prefix for p in parsed if not p.concrete))
        return self._match_wildcards(session, wildcards, out, step)

    def _match_wildcards(self, session: Session, prefixes: tuple[str, ...],
                         out: dict[str, list[int]], step: int) -> Iterator[None]:
        """Each channel tried once against all the wildcards (``str.startswith`` of
        their prefixes), not once per wildcard."""
        if not prefixes:
            return
        channels = self.state.channels
        names = list(channels)  # as of now: one made or removed between steps is no matter
        step = step or max(len(names), 1)
        owner, admin, me = self.rights.owner, session.admin, session.client_id
        for start in range(0, len(names), step):
            if start:
                yield
            for name in names[start:start + step]:
                log = channels.get(name)
                # A wildcard the rules allowed reaches no exclusive channel but its
                # reserver's (and none still free).
                if log is not None and name.startswith(prefixes) and (
                        admin or owner(name, owner_to_be="") in (None, me)):
                    out[name] = [log.first_seq, log.end]

    def set_position(self, session: Session, group: str, positions: dict[str, int],
                     now: float) -> dict[str, int]:
        """Everything below ``positions[channel]`` is settled for consumer ``group``."""
        if not group:
            raise BadRequest("give the group name")
        key = consume_group_key(group)
        grp = self.state.groups.get(key)
        if grp is None:
            self._may_make_group(session, "group name", group)
        for channel, next_seq in positions.items():
            validate_channel(channel)
            self.rights.check_read(session, channel, claim=False)
            if next_seq < 1:
                raise BadRequest(f"position of {channel!r} must be >= 1")
        self._check_pattern_room(session, grp, list(positions))
        if grp is not None:  # moving a group: the rules of every member still hold
            self.rights.check_group_rights(session, grp, list(positions))
        # Positioning a group on a channel reads it, as subscribing would: it claims.
        self.rights.check_read(session, *positions)
        if grp is None:
            grp = self._new_group(key, "consume", session)
        lags: dict[str, int] = {}
        self._add_patterns(grp, list(positions), "oldest", now)
        for channel, next_seq in positions.items():
            gc = grp.gcs.get(channel)
            if gc is None:  # another broker's queue (spread): its owner positions it
                continue
            upto = min(next_seq, gc.log.end)
            if upto > gc.floor:
                gc.advance(upto)
                self.state.mark(gc)
            lags[channel] = max(0, gc.log.end - gc.cursor)
        return lags
