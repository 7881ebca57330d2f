"""A native connection's front when the queues are spread over brokers (spread.py):
what is for a queue owned elsewhere goes there, over a link of this connection's own.

* A PUBLISH is split by the owner of each message's queue: the local part goes to this
  broker's engine, each other part to its owner; the CONFIRM goes back once every part
  is answered, its outcomes in the frame's order.
* A SUBSCRIBE (and UNSUBSCRIBE, SUB_ADD, SUB_REMOVE) is made here and on every other
  live broker: each serves the queues it owns, so a pattern over queues owned by
  several brokers reads them all, and a queue that moves is read from its new owner
  without a word from the client. The reply comes once all have answered.
* Deliveries from another broker reach the client under tags of this connection's own
  (from ``REMOTE_TAGS`` up; the engine's are below); an ACK, NACK or EXTEND is split
  back by tag, and the SETTLED reply merges the parts.
* A READ goes to the channel's owner.

Links follow the live brokers (``sync``): a broker that joins gets this connection's
subscriptions; one that dies takes its deliveries' tags with it (they settle nothing,
and its queues' messages come again from their new owner).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgspec

from ..core.snapshot import queue_of
from ..errors import ErrorCode, RequestError
from ..limits import MAX_LISTED_NAMES
from ..names import kv_channel
from ..protocol import frames as f
from .kv import KV_OPS
from .upstream import Upstream
from .wire import native_error

log = logging.getLogger("minou.cluster")

ADOPT = "\0adopt"  # a route (SpreadRole.route): here, once this broker has claimed it
REMOTE_TAGS = 1 << 52  # tags of deliveries from other brokers start here
# An ADMIN op only links send: the credit of an HTTP consumer's subscription on another
# broker (what its waiting requests want), and deliveries to give back as never sent.
LINK_CREDIT = "link.credit"
# Admin operations on one queue: answered by its owner
OWNER_OPS = frozenset({"queue", "browse", "purge", "dead.requeue", "dead.purge", *KV_OPS})
MAX_REMOTE_TAGS = 100_000  # unsettled remote deliveries remembered per connection
FORWARD_PAUSE_BYTES = 8 << 20  # publishes forwarded and not confirmed: stop reading
# A queue that moves while a publish is on its way (handed over, being adopted): the
# publish is routed again every step until this long has passed, then refused.
MOVING_RETRY_S = 10.0
MOVING_RETRY_STEP_S = 0.05
# What an owner answers for a queue it does not serve (any more, or yet).
MOVED_CODES = frozenset({int(ErrorCode.STANDBY), int(ErrorCode.STORAGE_UNAVAILABLE)})


class _Confirming:
    """A publish split over brokers: its outcomes as the parts answer, ``done`` once
    every message has one (in the publish's order)."""

    def __init__(self, msgs: list[f.Send], done: Callable[[list[f.Outcome]], None]) -> None:
        self.msgs = msgs
        self.done = done
        self.outcomes: list[f.Outcome | None] = [None] * len(msgs)
        self.left = len(msgs)

    def fill(self, idx: list[int], got: list[f.Outcome]) -> None:
        for i, o in zip(idx, got, strict=False):
            if self.outcomes[i] is None:
                self.left -= 1
            self.outcomes[i] = o
        if self.left == 0:
            self.left = -1  # answered once
            self.done([o if o is not None else f.Outcome(
                channel=self.msgs[i].channel, code=int(ErrorCode.INTERNAL),
                error="no answer") for i, o in enumerate(self.outcomes)])


class _Gathered:
    """Answers of ``n`` brokers to one request: ``done(values, first error)`` once all
    came (a Result's value each; an Error frame as the error)."""

    def __init__(self, n: int, done: Callable[[list[Any], f.Error | None], None]) -> None:
        self.left = n
        self.values: list[Any] = []
        self.error: f.Error | None = None
        self.done = done

    def frame(self, ev: f.Frame) -> None:
        if isinstance(ev, f.Result):
            self.part(ev.value or {})
        elif isinstance(ev, f.Error):
            self.part(error=ev)
        else:
            self.part(error=f.Error(0, int(ErrorCode.INTERNAL), "unexpected answer"))

    def part(self, value: Any = None, error: f.Error | None = None) -> None:
        if error is not None:
            self.error = self.error or error
        else:
            self.values.append(value)
        self.left -= 1
        if self.left == 0:
            self.done(self.values, self.error)


class Unpaced:
    """What a front calls on a door that has no socket of its own to flush or pause (an
    HTTP client, an HTTP consumer): nothing to do."""

    def flush(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Door(Unpaced):
    """A client's door that is not a native connection (an HTTP client): what its
    front needs of it. Its links present the client's id; its publishes are not
    paused (an HTTP request is refused instead) and carry no producer sequence."""

    def __init__(self, server: Any, identity: Any) -> None:
        self.server = server
        self.engine = server.engine
        self.session = SimpleNamespace(client_id=identity.client_id, producer_id="",
                                       access=server.access_for(identity))
        self.closed = False


class Front:
    def __init__(self, conn: Any, spread: Any) -> None:
        # conn: the client's connection.NativeConnection (or a Door); spread: the
        # spread.SpreadRole (neither imported: both make fronts)
        self.conn = conn
        self.spread = spread
        self.ups: dict[str, Upstream] = {}
        self.links_paused = False  # the client's deliveries are paused: read no more
        self.subs: dict[int, f.Subscribe] = {}  # this connection's, to make on new links
        self.extra: dict[int, list[str]] = {}  # sid -> patterns added since (SUB_ADD)
        self.tags: dict[int, tuple[Upstream, int]] = {}
        self._next_tag = REMOTE_TAGS
        self.forwarding = 0  # bytes of publishes forwarded, not yet confirmed
        self.wanted: dict[int, int] = {}  # sid -> credit wanted (HTTP consumers: credit)
        self._position_parts: dict[str, dict[str, int]] = {}

    # -------------------------------------------------------------- links
    def owner_link(self, channel: str) -> Upstream | None:
        """The link to the broker owning ``channel``'s queue; None if that is this
        broker (or nobody yet: it answers here)."""
        q = queue_of(channel)
        member = None if q is None else self.spread.route(q)
        if member is None or member == ADOPT:
            return None
        up = self._up(member)
        if up is None:
            raise RequestError(f"broker {member}, the owner of {q}, cannot be reached")
        return up

    def _up(self, member: str) -> Upstream | None:
        up = self.ups.get(member)
        if up is not None and not up.closed:
            return up
        record = self.spread.address(member)
        if record is None or not record.get("native"):
            return None
        up = self.ups[member] = Upstream(self, member, record)
        return up

    def _others(self) -> list[str]:
        return self.spread.link_members()

    def sync(self) -> None:
        """The live brokers changed: subscribe on the new ones, drop the dead ones."""
        if self.conn.closed:
            return
        alive = set(self._others())
        for member in [m for m in self.ups if m not in alive]:
            # Dead to the cluster (its record ran out): what it owes is answered now
            # (publishes are routed again to the queues' new owners), not never.
            self.ups.pop(member).fail(f"broker {member} left the cluster")
        if not self.subs:
            return
        for member in alive - set(self.ups):
            up = self._up(member)
            if up is None:
                continue
            for sid, frame in self.subs.items():
                up.request(frame, None)
                for pattern in self.extra.get(sid, []):
                    up.request(f.SubAdd(0, sid, pattern), None)
                if sid in self.wanted:
                    up.request(self._credit_frame(sid, []), None)

    def lost(self, up: Upstream) -> None:
        """A link failed: its deliveries' tags settle nothing any more."""
        if self.ups.get(up.member) is up:
            del self.ups[up.member]
        self.tags = {t: v for t, v in self.tags.items() if v[0] is not up}
        if not self.conn.closed and self.subs:
            # The broker may still be alive (a restart of the link): try again soon.
            asyncio.get_running_loop().call_later(1.0, self._resync)

    def _resync(self) -> None:
        if not self.conn.closed:
            self.sync()

    def close(self) -> None:
        for up in self.ups.values():
            up.close()
        self.ups.clear()
        self.tags.clear()

    # ------------------------------------------------------------ publish
    def publish(self, frame: f.Publish, *, waited: bool = False) -> bool:
        """Route ``frame``: False if it is all this broker's (the caller publishes it
        as ever), True if this front took it. A queue this broker must take over first
        holds the frame (and what came behind it) until it has; ``waited``: it tried."""
        conn, sp = self.conn, self.spread
        routes = self._refused_here(frame.msgs, [sp.route_channel(s.channel)
                                                 for s in frame.msgs], conn.session)
        if not waited and ADOPT in routes:
            adopt = sorted({q for s, r in zip(frame.msgs, routes, strict=True)
                            if r == ADOPT and (q := queue_of(s.channel)) is not None})
            conn.hold(asyncio.gather(*(sp.adoption(q) for q in adopt)),
                      lambda: self._publish_again(frame))
            return True
        return self.publish_sends(frame.msgs, lambda outs: conn.send(f.Confirm(frame.req, outs)),
                                  session=conn.session, publisher=conn, routes=routes)

    def publish_sends(self, sends: list[f.Send], done: Callable[[list[f.Outcome]], None], *,
                      session: Any = None, publisher: Any = None,
                      routes: list[str | None] | None = None) -> bool:
        """Route ``sends``: False if all are this broker's now; else True and
        ``done(outcomes)`` once each is answered, here or by its queue's owner."""
        if routes is None:
            routes = self._refused_here(sends, [self.spread.route_channel(s.channel)
                                                for s in sends], session or self.conn.session)
        if all(r is None for r in routes):
            return False
        deadline = asyncio.get_running_loop().time() + MOVING_RETRY_S
        self._dispatch(_Confirming(sends, done), list(range(len(sends))), routes, deadline,
                       session, publisher)
        return True

    def _refused_here(self, sends: list[f.Send], routes: list[str | None],
                      session: Any) -> list[str | None]:
        """``routes``, with here (None) for each message ``SpreadRole.claimable`` keeps
        from its queue's owner: refused by this broker's engine as by the owner's,
        without the queue being claimed."""
        access = getattr(session, "access", None)
        for i, send in enumerate(sends):
            if routes[i] is not None and not self.spread.claimable(send, access):
                routes[i] = None
        return routes

    def _publish_again(self, frame: f.Publish) -> None:
        if not self.publish(frame, waited=True):
            self.conn.publish_here(frame)

    def _dispatch(self, pending: _Confirming, idx: list[int], routes: list[str | None],
                  deadline: float, session: Any, publisher: Any) -> None:
        """Send messages ``idx`` where ``routes`` says (by message)."""
        parts: dict[str | None, list[int]] = {}
        for i in idx:
            parts.setdefault(routes[i], []).append(i)
        msgs, conn = pending.msgs, self.conn
        local = parts.pop(None, None)
        if local is not None:
            try:
                conn.engine.publish([msgs[i] for i in local], conn.session.access,
                                    lambda got, _exc: pending.fill(local, got),
                                    session=session, publisher=publisher, routed=True)
            except RequestError as exc:  # refused whole (stopping): its part says why
                pending.fill(local, [f.Outcome(channel=msgs[i].channel, code=int(exc.code),
                                               error=exc.message) for i in local])
        again = (session, publisher)
        for member, part in parts.items():
            if member == ADOPT:
                self._moving(pending, part, deadline, again, "this broker could not take "
                             "the queue over yet")
                continue
            self._forward(pending, member, part, deadline, again)

    def _moving(self, pending: _Confirming, idx: list[int], deadline: float,
                again: tuple[Any, Any], why: str) -> None:
        """Messages whose queue is moving (handed over, being adopted): routed again
        shortly, until ``deadline``; then refused with ``why``."""
        loop = asyncio.get_running_loop()
        if loop.time() >= deadline or self.conn.closed:
            pending.fill(idx, [f.Outcome(channel=pending.msgs[i].channel,
                                         code=int(ErrorCode.STORAGE_UNAVAILABLE),
                                         error=f"{why}: send again") for i in idx])
            return

        def route_again() -> None:
            sp, msgs = self.spread, pending.msgs
            routes: list[str | None] = [None] * len(msgs)
            waits = []
            for i in idx:
                routes[i] = sp.route_channel(msgs[i].channel)
                if routes[i] == ADOPT:
                    waits.append(sp.adoption(queue_of(msgs[i].channel)))  # type: ignore[arg-type]
            if waits and loop.time() < deadline:
                asyncio.gather(*waits).add_done_callback(
                    lambda _: self._dispatch(pending, idx, [
                        sp.route_channel(m.channel) for m in msgs], deadline, *again))
                return
            self._dispatch(pending, idx, routes, deadline, *again)

        loop.call_later(MOVING_RETRY_STEP_S, route_again)

    def _forward(self, pending: _Confirming, member: str, idx: list[int],
                 deadline: float, again: tuple[Any, Any]) -> None:
        sends = [pending.msgs[i] for i in idx]
        size = sum(len(s.data) for s in sends)
        up = self._up(member)

        def answer(ev: f.Frame) -> None:
            self.forwarding -= size
            if self.forwarding < FORWARD_PAUSE_BYTES // 4:
                self.conn.resume_reading()
            if isinstance(ev, f.Confirm):
                # The owner handed the queue over meanwhile: route those again.
                moved = [i for i, o in zip(idx, ev.outcomes, strict=False)
                         if o.code in MOVED_CODES]
                if moved:
                    pending.fill([i for i in idx if i not in moved],
                                 [o for o in ev.outcomes if o.code not in MOVED_CODES])
                    self._moving(pending, moved, deadline, again, "the queue is moving")
                    return
                pending.fill(idx, ev.outcomes)
                return
            if isinstance(ev, f.Error) and ev.code in MOVED_CODES:
                self._moving(pending, idx, deadline, again, ev.message)
                return
            code = ev.code if isinstance(ev, f.Error) else int(ErrorCode.INTERNAL)
            text = ev.message if isinstance(ev, f.Error) else "unexpected answer"
            pending.fill(idx, [f.Outcome(channel=s.channel, code=code, error=text)
                               for s in sends])

        self.forwarding += size
        if self.forwarding > FORWARD_PAUSE_BYTES:
            self.conn.pause_reading()
        if up is None:
            answer(f.Error(0, int(ErrorCode.STORAGE_UNAVAILABLE),
                           f"broker {member}, the owner of this queue, cannot be reached"))
            return
        up.request(f.Publish(0, sends), answer)

    # ---------------------------------------------------------- subscribe
    def subscribe(self, frame: f.Subscribe, reply: f.Frame) -> None:
        """The subscription was made here: make it on every other live broker, then
        answer ``reply``."""
        self.subs[frame.sid] = frame
        self._everywhere(frame, reply)

    def unsubscribe(self, frame: f.Unsubscribe) -> None:
        self.subs.pop(frame.sid, None)
        self.extra.pop(frame.sid, None)
        for up in list(self.ups.values()):
            up.request(frame, None)

    def sub_add(self, frame: f.SubAdd) -> None:
        if frame.sid in self.subs:
            self.extra.setdefault(frame.sid, []).append(frame.pattern)
        for up in list(self.ups.values()):
            up.request(frame, None)

    def sub_remove(self, frame: f.SubRemove) -> None:
        patterns = self.extra.get(frame.sid)
        if patterns and frame.pattern in patterns:
            patterns.remove(frame.pattern)
        for up in list(self.ups.values()):
            up.request(frame, None)

    # ------------------------------------------------------------- credit
    def credit(self, sid: int, wanted: int) -> None:
        """A door whose credit is its waiting requests (an HTTP consumer): each other
        broker may deliver ``wanted`` more on ``sid`` than is unsettled there."""
        if self.wanted.get(sid) == wanted:
            return
        self.wanted[sid] = wanted
        for up in list(self.ups.values()):
            up.request(self._credit_frame(sid, []), None)

    def give_back(self, sid: int, tag: int) -> None:
        """A delivery from another broker that nobody was there to take: back to the
        front of its queue there, as if never sent."""
        found = self.tags.pop(tag, None)
        if found is not None and not found[0].closed:
            found[0].request(self._credit_frame(sid, [found[1]]), None)

    def _credit_frame(self, sid: int, withdraw: list[int]) -> f.Admin:
        return f.Admin(0, LINK_CREDIT, {"sid": sid, "wanted": self.wanted.get(sid, 0),
                                        "withdraw": withdraw})

    def _everywhere(self, frame: f.Frame, reply: f.Frame) -> None:
        ups = [up for m in self._others() if (up := self._up(m)) is not None]
        left = [len(ups) + 1]

        def one(ev: f.Frame | None = None) -> None:
            if isinstance(ev, f.Error):
                log.warning("front: %s refused on another broker: %s",
                            type(frame).__name__, ev.message)
            left[0] -= 1
            if left[0] == 0:
                self.conn.send(reply)

        for up in ups:
            up.request(frame, one)
        one()

    def delivered(self, up: Upstream, ev: f.Deliver) -> None:
        """Deliveries from another broker: to the client under tags of this front's."""
        if self.conn.closed:
            return
        items = []
        for d in ev.items:
            tag = self._next_tag
            self._next_tag += 1
            self.tags[tag] = (up, d.tag)
            items.append(msgspec.structs.replace(d, tag=tag))
        while len(self.tags) > MAX_REMOTE_TAGS:  # the oldest settle nothing any more
            del self.tags[next(iter(self.tags))]
        self.conn.send_deliveries(ev.sid, items)

    def pause_links(self, paused: bool) -> None:
        """The client's connection stopped taking deliveries (its write buffer over the
        water mark, or its share of the broker's delivery budget) or takes them again:
        the links stop (or go on) reading, so that the other brokers' deliveries wait
        on their side. Read on, they were buffered here unsent, past this broker's
        ``delivery_buffer_bytes``, up to the others' ``in_flight_bytes`` each."""
        if paused != self.links_paused:
            self.links_paused = paused
            for up in self.ups.values():
                up.pause(paused)

    # ------------------------------------------------------------- settle
    def split(self, tags: list[int]) -> tuple[list[int], list[int]]:
        """(this broker's tags, the others')."""
        local = [t for t in tags if t < REMOTE_TAGS]
        return local, [t for t in tags if t >= REMOTE_TAGS]

    def settle(self, frame: f.Ack | f.Nack | f.Extend, tags: list[int],
               done: Any) -> int:
        """Forward the settlement of remote ``tags``; ``done(failed)`` once each link
        answered (per link). Returns how many answers to wait for."""
        by_up: dict[Upstream, list[tuple[int, int]]] = {}
        failed: list[tuple[int, int, str]] = []
        for tag in tags:
            found = self.tags.get(tag)
            if found is None or found[0].closed:
                failed.append((tag, int(ErrorCode.UNKNOWN_DELIVERY),
                               f"unknown delivery tag {tag} (its broker is gone, or it was "
                               "settled already)"))
                continue
            by_up.setdefault(found[0], []).append((tag, found[1]))
            if not isinstance(frame, f.Extend):
                del self.tags[tag]
        if failed:
            done(failed)
        for up, pairs in by_up.items():
            back = {theirs: mine for mine, theirs in pairs}

            def answer(ev: f.Frame, back: dict[int, int] = back) -> None:
                if isinstance(ev, f.Settled):
                    done([(back.get(t, t), c, m) for t, c, m in ev.failed])
                else:
                    text = ev.message if isinstance(ev, f.Error) else "unexpected answer"
                    code = ev.code if isinstance(ev, f.Error) else int(ErrorCode.INTERNAL)
                    done([(mine, code, text) for mine in back.values()])

            up.request(msgspec.structs.replace(frame, tags=[t for _, t in pairs]), answer)
        return len(by_up) + (1 if failed else 0)

    # ------------------------------------------------- offsets and positions
    def offsets(self, frame: f.Offsets, local: Any, limit: int) -> None:
        """OFFSETS of every broker (each answers for the queues it owns), merged; one
        that cannot answer makes it an error (a partial list would hide channels).
        ``local``: this broker's answer, or an awaitable of it."""
        ups = [up for m in self._others() if (up := self._up(m)) is not None]
        found: dict[str, Any] = {}
        errors: list[str] = []
        left = [len(ups) + 1]
        conn = self.conn

        def part(value: Any = None, error: str = "") -> None:
            if error:
                errors.append(error)
            elif value:
                found.update(value)
            left[0] -= 1
            if left[0]:
                return
            if errors:
                exc = RequestError(f"offsets not complete: {errors[0]}")
                exc.code = ErrorCode.STORAGE_UNAVAILABLE
                conn.send(f.Error(frame.req, int(exc.code), exc.message))
            elif len(found) > limit:
                conn.send(f.Error(frame.req, int(ErrorCode.BAD_REQUEST),
                                  f"the patterns match {len(found)} channels; one OFFSETS "
                                  f"answer lists at most {limit}: narrow the patterns"))
            else:
                conn.send(f.Result(frame.req, found))
            conn.flush()

        def remote(ev: f.Frame) -> None:
            if isinstance(ev, f.Result):
                part(ev.value)
            else:
                part(error=ev.message if isinstance(ev, f.Error) else "unexpected answer")

        for up in ups:
            up.request(frame, remote)
        if asyncio.isfuture(local) or asyncio.iscoroutine(local):
            task = asyncio.ensure_future(local)
            task.add_done_callback(lambda t: None if t.cancelled()  # the connection went
                                   else part(error=str(t.exception())) if t.exception()
                                   else part(t.result()))
        else:
            part(local)

    def positions(self, frame: f.Position) -> dict[str, int] | None:
        """Split a POSITION by the owner of each channel's queue: the others' parts go
        there (their lags merged into the answer by ``merge_lags``); returns this
        broker's part, or None if all of it is this broker's."""
        parts = self._by_owner(list(frame.positions), "position it")
        mine = {ch: frame.positions[ch] for ch in parts.pop(None, [])}
        if not parts:
            return None
        self._position_parts = {member: {ch: frame.positions[ch] for ch in channels}
                                for member, channels in parts.items()}
        return mine

    def _by_owner(self, channels: list[str], doing: str) -> dict[str | None, list[str]]:
        """``channels`` by the broker owning each one's queue (None: this one); refused
        (retry soon) if one is moving here."""
        out: dict[str | None, list[str]] = {}
        for channel in channels:
            where = self.spread.route_channel(channel)
            if where == ADOPT:
                exc = RequestError(f"queue {queue_of(channel)} is moving to this broker: "
                                   f"{doing} again in a moment")
                exc.code = ErrorCode.STORAGE_UNAVAILABLE
                raise exc
            out.setdefault(where, []).append(channel)
        return out

    def merge_lags(self, frame: f.Position, local: dict[str, int] | None,
                   local_done: Any) -> None:
        """Send the other brokers' parts of ``frame`` (``positions`` split them); answer
        {"lag": ...} with every part's lags once all answered (``local_done`` calls
        back with this broker's, once durable)."""
        theirs, self._position_parts = self._position_parts, {}
        lags: dict[str, int] = {}
        errors: list[f.Error] = []
        left = [len(theirs) + 1]
        conn = self.conn

        def part(value: Any = None, error: f.Error | None = None) -> None:
            if error is not None:
                errors.append(error)
            elif value:
                lags.update(value.get("lag") or {})
            left[0] -= 1
            if left[0] == 0:
                conn.send(msgspec.structs.replace(errors[0], req=frame.req) if errors
                          else f.Result(frame.req, {"lag": lags}))
                conn.flush()

        def remote(ev: f.Frame) -> None:
            if isinstance(ev, f.Result):
                part(ev.value)
            else:
                part(error=ev if isinstance(ev, f.Error) else f.Error(
                    0, int(ErrorCode.INTERNAL), "unexpected answer"))

        for member, positions in theirs.items():
            up = self._up(member)
            if up is None:
                part(error=f.Error(0, int(ErrorCode.STORAGE_UNAVAILABLE),
                                   f"broker {member} cannot be reached"))
                continue
            up.request(f.Position(0, frame.group, positions), remote)
        if local is None:
            part({})
        else:
            local_done(lambda value: part(value))

    # ------------------------------------------------ transactions (Spark)
    def stage(self, frame: f.Stage) -> bool:
        """Split a STAGE by the owner of each message's queue: each owner holds its
        part under the same transaction id. False: all of it is this broker's."""
        parts = self._by_owner([send.channel for send in frame.msgs], "stage it")
        if set(parts) <= {None}:
            return False
        by_channel: dict[str, list[f.Send]] = {}
        for send in frame.msgs:
            by_channel.setdefault(send.channel, []).append(send)
        mine = [send for ch in dict.fromkeys(parts.pop(None, [])) for send in by_channel[ch]]
        theirs = {member: [send for ch in dict.fromkeys(channels) for send in by_channel[ch]]
                  for member, channels in parts.items()}
        conn = self.conn
        if mine:
            conn.engine.check_accepting()
            held = conn.core.stage(conn.session, frame.txn, mine, time.time())
        answers = _Gathered(len(theirs) + (1 if mine else 0), lambda values, error: conn.send(
            msgspec.structs.replace(error, req=frame.req) if error is not None else
            f.Result(frame.req, {"txn": frame.txn, "staged": sum(  # held by these owners
                v.get("staged", 0) for v in values)})))
        for member, sends in theirs.items():
            self._ask(member, f.Stage(0, frame.txn, sends), answers)
        if mine:
            conn.engine.after_commit(lambda: answers.part({"staged": held}))
        return True

    def commit_txns(self, frame: f.TxnCommit) -> None:
        """TXN_COMMIT on every broker: each commits the parts staged there, fenced per
        (writer, channel) as ever, so a commit cut short and sent again publishes each
        part once. The answers merged; a transaction no broker has is refused."""
        conn = self.conn
        others = self._others()

        def merged(values: list[Any], error: f.Error | None) -> None:
            if error is not None:
                conn.send(msgspec.structs.replace(error, req=frame.req))
                return
            nowhere = set(frame.txns)
            for v in values:
                nowhere &= set(v.get("absent") or [])
            if nowhere:
                missing = sorted(nowhere)[:5]
                conn.send(f.Error(frame.req, int(ErrorCode.NOT_FOUND),
                                  f"unknown transaction(s) {missing}: never staged (by this "
                                  "client), already committed or aborted, or expired (an "
                                  "hour after the last STAGE)", {"txns": ", ".join(missing)}))
                return
            conn.send(f.Result(frame.req, {
                "published": sum(v.get("published", 0) for v in values),
                "discarded": sum(v.get("discarded", 0) for v in values),
                "replayed_channels": [c for v in values for c in v.get("replayed_channels")
                                      or []],
                "failed": [x for v in values for x in v.get("failed") or []][:20]}))

        answers = _Gathered(len(others) + 1, merged)
        try:  # first here: a refusal (rules, writer, lineage) stops it before the others
            conn.commit_present(frame, lambda ev: answers.frame(ev))
        except RequestError as exc:
            answers.left = 1
            answers.frame(native_error(frame.req, exc))
            return
        for member in others:
            self._ask(member, frame, answers)

    def abort_txns(self, frame: f.TxnAbort, dropped: int) -> None:
        """TXN_ABORT on the other brokers too (their parts)."""
        conn = self.conn
        others = self._others()
        answers = _Gathered(len(others) + 1, lambda values, error: conn.send(
            msgspec.structs.replace(error, req=frame.req) if error is not None else
            # a transaction's parts are on several brokers: the most one of them dropped
            f.Result(frame.req, {"aborted": max(v.get("aborted", 0) for v in values)})))
        for member in others:
            self._ask(member, frame, answers)
        conn.engine.after_commit(lambda: answers.part({"aborted": dropped}))

    # -------------------------------------------------------------- admin
    def adopting(self, frame: f.Admin) -> asyncio.Future[None] | None:
        """For a KV read of a queue this broker is to own but has not claimed yet: its
        adoption, to wait for before answering (answered at once, it would read an
        empty bucket); None otherwise."""
        name = self._op_channel(frame)
        return self.adoption_for(name) if name is not None else None

    def adoption_for(self, channel: str) -> asyncio.Future[None] | None:
        """The adoption of ``channel``'s queue if this broker is to own it and has not
        claimed it yet (to wait for before acting on it here); else None."""
        q = queue_of(channel)
        if q is None or self.spread.route(q) != ADOPT:
            return None
        return self.spread.adoption(q)

    @staticmethod
    def _op_channel(frame: f.Admin) -> str | None:
        """The channel an ``OWNER_OPS`` operation is about (its queue's owner answers)."""
        args = frame.args
        if frame.op in KV_OPS:
            bucket = "_" if frame.op == "kv.buckets" else args.get("bucket")
            return kv_channel(bucket) if isinstance(bucket, str) else None
        if frame.op == "browse":
            channel = args.get("channel")
            return channel if isinstance(channel, str) else None
        return f"{args['queue']}/x" if isinstance(args.get("queue"), str) else None

    def ask_owner(self, frame: f.Admin) -> asyncio.Future[f.Frame] | None:
        """An admin operation on one queue (``OWNER_OPS``) sent to the queue's owner: a
        future of its answer, or None if that is this broker (or nobody yet)."""
        name = self._op_channel(frame)
        up = self.owner_link(name) if name is not None else None
        if up is None:
            return None
        answer: asyncio.Future[f.Frame] = asyncio.get_running_loop().create_future()
        up.request(frame, lambda ev: answer.done() or answer.set_result(ev))
        return answer

    def ask_everywhere(self, frame: f.Admin, local: dict[str, Any],
                       merge: Callable[[list[dict[str, Any]]], dict[str, Any]]
                       ) -> asyncio.Future[dict[str, Any]]:
        """An admin view every broker answers for its own queues (``list``, ``queues``),
        merged; a broker that cannot answer is counted in ``missing`` (with why)
        rather than hiding the others."""
        others = self._others()
        ask = f.Admin(0, frame.op, {**frame.args, "here": True})
        merged: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

        def done(values: list[Any], error: f.Error | None) -> None:
            out = merge([local, *values])
            if error is not None:
                out["missing"] = len(others) - len(values)
                out["missing_why"] = error.message
            if not merged.done():
                merged.set_result(out)

        answers = _Gathered(len(others), done)
        if not others:
            done([], None)
        for member in others:
            self._ask(member, ask, answers)
        return merged

    def _ask(self, member: str, frame: f.Frame, answers: _Gathered) -> None:
        up = self._up(member)
        if up is None:
            answers.frame(f.Error(0, int(ErrorCode.STORAGE_UNAVAILABLE),
                                  f"broker {member} cannot be reached"))
            return
        up.request(frame, answers.frame)

    # --------------------------------------------------------------- read
    def read(self, frame: f.Read) -> bool:
        up = self.owner_link(frame.channel)
        if up is None:
            return False

        def answer(ev: f.Frame) -> None:
            self.conn.send(msgspec.structs.replace(ev, req=frame.req))

        up.request(frame, answer)
        return True

    def status(self) -> dict[str, Any]:
        return {"links": [up.status() for up in self.ups.values()],
                "remote_tags": len(self.tags), "forwarding_bytes": self.forwarding}


# Group figures that add up over brokers (each counts the channels it owns); members
# do not (a client subscribed through one broker is a member on every broker).
_SUMMED = ("channels", "unsettled", "waiting", "in_flight", "lag", "delivered", "acked")


def merge_groups(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A group as several brokers see it, as one: figures summed, patterns joined."""
    groups: dict[str, dict[str, Any]] = {}
    for part in parts:
        for g in part:
            seen = groups.get(g["group"])
            if seen is None:
                groups[g["group"]] = dict(g, patterns=list(g.get("patterns", [])))
                continue
            for k in _SUMMED:
                if k in g:
                    seen[k] = seen.get(k, 0) + g[k]
            seen["members"] = max(seen.get("members", 0), g.get("members", 0))
            seen["patterns"] += [p for p in g.get("patterns", []) if p not in seen["patterns"]]
            # (every broker holds the group's whole definition: its count is theirs)
            seen["patterns"] = seen["patterns"][:MAX_LISTED_NAMES]
            seen["patterns_total"] = max(seen.get("patterns_total", 0),
                                         g.get("patterns_total", 0))
    return [groups[k] for k in sorted(groups)]


def _side_by_side(parts: list[dict[str, Any]], what: str, key: str) -> list[Any]:
    """Items each owned by one broker (channels, queues): all of them, by name."""
    found: dict[str, Any] = {}
    for part in parts:
        for item in part.get(what, []):
            found.setdefault(item[key], item)
    return [found[k] for k in sorted(found)]


def merge_lists(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``list`` answers of several brokers as one."""
    return {"channels": _side_by_side(parts, "channels", "channel"),
            "groups": merge_groups([p.get("groups", []) for p in parts])}


def merge_queues(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``queues`` answers of several brokers as one."""
    return {"queues": _side_by_side(parts, "queues", "queue"),
            "groups": merge_groups([p.get("groups", []) for p in parts])}


def merge_fences(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """``txn.fences`` of several brokers (queues spread over them) as one."""
    fences: dict[str, int] = {}
    for part in parts:
        for ch, batch in part.get("fences", {}).items():
            fences[ch] = max(batch, fences.get(ch, batch))
    return {"writer_id": parts[0].get("writer_id") if parts else "", "fences": fences}


# Admin views each broker answers for the queues it owns: asked of all, merged
MERGED_OPS: dict[str, Callable[[list[dict[str, Any]]], dict[str, Any]]] = {
    "list": merge_lists, "queues": merge_queues, "txn.fences": merge_fences}
