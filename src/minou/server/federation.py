"""Federation (docs/federation.md): chosen channels shared with a broker in another
place, over one outbound connection per link, each message exactly once.

A ``[[federation]]`` link has up to two pipes: ``push`` (this broker's channels into
the remote) and ``pull`` (the remote's into this broker). A pipe is a client of both
brokers: of the remote with the link's own identity (its rules apply there), of this
broker over loopback with a secret only this process knows (``LocalDoor``). It

* reads each source channel under its patterns **in seq order** (``READ``, like the
  Spark source: priority and delay do not reorder it), a page at a time;
* commits each page into the destination channel (``prefix`` + the same name) as a
  transaction fenced on (``fed:<link>:<direction>``, channel) by the page's last source
  seq: a page committed twice is discarded the second time (the Spark sink's fences);
* resumes, after any failure on either side, from the destination's fences
  (``txn.fences``): what a commit made durable is never sent again, what it did not
  is; nothing is kept on the link's side;
* reports its progress to the source as a consumer group's position
  (``federation:<link>:<direction>``), so the source keeps every message until it
  crossed (and may then drop it by its own rules);
* never sends a message to a broker it was on: ``x-federated-from`` names the
  broker a message was first published on, ``x-federated-path`` (from its second hop)
  every broker it passed, and a pipe skips those whose path holds its destination.

Memory is bounded by one page per pipe; a slow destination slows the pipe. Failures
(refused key, unreachable remote, a rule, a full disk) are the pipe's ``last_error``,
retried with backoff and jitter; a message the destination refuses for itself (a
schema, a rule for that channel) is dead-lettered on the source with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from ..core.log import Msg
from ..errors import BadRequest, ErrorCode, MinouError, RequestError
from ..limits import (
    FEDERATION_LOG_LINES,
    FEDERATION_LOG_WINDOW_S,
    FEDERATION_ORPHANS_KEPT,
    MAX_HEADER_SIZE,
    MAX_HEADERS,
)
from ..names import (
    FEDERATED_FROM,
    FEDERATED_PATH,
    FEDERATED_SEQ,
    consume_group_key,
    dead_letter_channel,
    parse_pattern,
)
from ..protocol import frames as f
from . import oplog
from .front import ADOPT
from .kv import woken

if TYPE_CHECKING:
    from ..config import FederationLink
    from .ports import Server

log = logging.getLogger("minou.federation")

LOCAL_CREDENTIAL = "mlf1."  # a pipe's credential on its own broker (then the secret)
PAGE = 500  # messages read and committed at once per channel (bounds a pipe's memory)
# An idle pipe looks for new messages after POLL_MIN_S, then ever less often up to
# POLL_MAX_S: a busy link adds milliseconds, an idle one costs little.
POLL_MIN_S, POLL_MAX_S = 0.002, 0.1
WAIT_S = 1.0  # a pipe's long poll (channels.wait) on an idle source
# Queues spread over brokers: the broker owning this queue runs the links; the others
# look again this often.
LINKS_QUEUE = "_federation/v1"
ELSEWHERE_S = 2.0
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 30.0
# A link up this long before it fails starts its backoff again (it doubled for ever: a
# link that had failed six times in its life waited 15-30 s at every later cut, and
# took 50 s to catch up after a minute's outage).
BACKOFF_RESET_S = 30.0


class Backoff:
    """The wait before a pipe's next try: doubling from BACKOFF_MIN_S up to BACKOFF_MAX_S
    while tries fail, from the start again once the link had stayed up BACKOFF_RESET_S
    (the caller adds jitter)."""

    def __init__(self) -> None:
        self.next = BACKOFF_MIN_S

    def failed(self, up_for: float) -> float:
        """A try failed after the link was up ``up_for`` seconds (0: never up)."""
        if up_for >= BACKOFF_RESET_S:
            self.next = BACKOFF_MIN_S
        wait, self.next = self.next, min(self.next * 2, BACKOFF_MAX_S)
        return wait

    def ended(self) -> None:
        """A session ended without failing."""
        self.next = BACKOFF_MIN_S
REQUEST_TIMEOUT_S = 30.0
RATE_WINDOW_S = 10.0  # the window of a direction's rate
# A direction up this long since its last error, no channel of it refused, shows none:
# the error is history by then (the log keeps it), and a dashboard shows what is wrong.
ERROR_KEPT_S = 300.0
CLOSE_S = 2.0  # a pipe's connections get this long to close (the broker is stopping)
# A channel name as long as MAX_CHANNEL_LENGTH made a transaction id past MAX_TXN_ID (200):
# longer names go into it as a digest.
TXN_CHANNEL_CHARS = 80


@dataclass
class PipeStatus:
    link: str
    direction: str  # "push" | "pull"
    patterns: tuple[str, ...]
    state: str = "starting"  # "connecting", "up", "retrying", "stopped"
    since: float = field(default_factory=time.time)
    last_error: str = ""
    last_error_at: float | None = None
    forwarded: int = 0
    skipped_loops: int = 0
    dead_lettered: int = 0
    refused_channels: int = 0  # channels waiting now on a refusal of the destination
    # Channels the source named that the direction's patterns do not match (a remote
    # that lies, or has a bug): never carried.
    foreign_channels: int = 0
    orphans_dropped: int = 0  # pages left staged there by a lost connection, aborted later
    lag_messages: int = 0
    lag_seconds: float = 0.0
    # When lag_messages was last counted on the source (None: never), and whether it is
    # only the last figure known (a pull direction whose remote is out of reach).
    lag_counted_at: float | None = None
    lag_last_known: bool = False
    channels: int = 0
    remote_broker: str = ""
    rate: float = 0.0  # messages carried per second over the last RATE_WINDOW_S
    _samples: deque[tuple[float, int]] = field(default_factory=deque, repr=False)

    def sample(self, now: float) -> None:
        """Note ``forwarded`` now; ``rate`` is its growth over the last window."""
        samples = self._samples
        samples.append((now, self.forwarded))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        t0, n0 = samples[0]
        self.rate = (self.forwarded - n0) / (now - t0) if now > t0 else 0.0

    def healthy(self, now: float) -> None:
        """Everything goes through: forget an error older than ``ERROR_KEPT_S``."""
        if self.state == "up" and self.last_error_at is not None and \
                now - self.last_error_at > ERROR_KEPT_S:
            self.last_error, self.last_error_at = "", None

    def view(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()
                if not k.startswith("_")}


def _refusal_budget(pipe: str) -> oplog.LineBudget:
    """A pipe's lines about refusals: at most FEDERATION_LOG_LINES per
    FEDERATION_LOG_WINDOW_S, then one line counting the rest (a destination refusing
    every message must not write a line per message)."""
    def summary(suppressed: int, seconds: float) -> None:
        log.warning("federation %s: %d more refusal(s) by the destination in the last "
                    "%.0f s, not logged one by one (minou federation counts them: "
                    "dead_lettered, refused_channels)", pipe, suppressed, seconds)
    return oplog.LineBudget(FEDERATION_LOG_LINES, FEDERATION_LOG_WINDOW_S, summary)


class Pipe:
    """One direction of a link (see the module docstring)."""

    def __init__(self, server: Server, link: FederationLink, direction: str,
                 patterns: tuple[str, ...]) -> None:
        self.server = server
        self.link = link
        self.direction = direction
        self.status = PipeStatus(link.name, direction, patterns)
        self.writer = f"fed:{link.name}:{direction}"
        self.group = f"federation:{link.name}:{direction}"
        self._task: asyncio.Task[None] | None = None
        self._long_poll = True  # the source answers channels.wait (else: poll)
        # Transactions staged on the destination whose connection was lost before they
        # were committed or aborted: aborted on the next connection.
        self._orphans: deque[str] = deque(maxlen=FEDERATION_ORPHANS_KEPT)
        self._log_budget = _refusal_budget(f"{link.name} ({direction})")
        self._up_since = 0.0  # monotonic time the pipe last went up
        # Until when (the source's time) this broker knew the destination held everything:
        # the last turn that found nothing behind, or the last message carried while
        # behind. A pull direction that is down ages its lag from there. Until the first
        # contact, from the start: it has known nothing newer since then at least.
        self._fresh_at = time.time()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"minou-{self.writer}")

    def cancel(self) -> None:
        """Stop it (its connections close as its task ends)."""
        if self._task is not None:
            self._task.cancel()
        self._set("stopped")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._set("stopped")

    def _set(self, state: str) -> None:
        if self.status.state != state:
            self.status.state, self.status.since = state, time.time()
            if state == "up":
                self._up_since = time.monotonic()

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure is the pipe's to report and retry
                text = exc.message if isinstance(exc, RequestError) else str(exc) or \
                    type(exc).__name__
                if text != self.status.last_error or self.status.state == "up":
                    log.warning("federation %s (%s): %s; retrying", self.link.name,
                                self.direction, text)
                self.status.last_error, self.status.last_error_at = text, time.time()
                up_for = time.monotonic() - self._up_since if self.status.state == "up" \
                    else 0.0
                self._set("retrying")
                await asyncio.sleep(backoff.failed(up_for) * random.uniform(0.5, 1.0))
                continue
            backoff.ended()

    async def _session(self) -> None:
        while not await self._runs_here():
            self._set("elsewhere")
            await asyncio.sleep(ELSEWHERE_S)
        if self.status.state != "retrying":  # a link down stays down since it went
            self._set("connecting")
        federation = self.server.federation
        local = await federation.local_client(self.link.name)
        try:
            remote = await federation.remote(self.link.name).get()
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(local.close(), CLOSE_S)
            raise
        source, dest = (local, remote) if self.direction == "push" else (remote, local)
        try:
            self.status.remote_broker = remote.broker_id or ""
            await self._forward(source, dest)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(local.close(), CLOSE_S)
            await federation.remote(self.link.name).drop_if_dead(remote)

    async def _forward(self, source: Any, dest: Any) -> None:
        origin, avoid = source.broker_id or "", dest.broker_id or ""
        if origin == avoid:
            raise RequestError(f"both brokers are called {origin!r}: give each its own "
                               "broker_id (x-federated-from tells where a message began)")
        patterns = list(self.status.patterns)
        fences = (await dest.admin("txn.fences", writer_id=self.writer))["fences"]
        await self._drop_orphans(dest)
        positions: dict[str, int] = {}  # source channel -> next seq to send
        blocked: dict[str, tuple[float, float]] = {}  # refused there: (retry at, wait)
        refusals: dict[str, str] = {}  # channel refused there -> the refusal last logged
        self._set("up")
        idle = POLL_MIN_S
        json_patterns = msgspec.json.encode(patterns).decode()
        while True:
            if not await self._runs_here():
                return  # another broker of the cluster runs the links now
            offsets = self._ours(await source.offsets(patterns))
            new = {ch: max(first, fences.get(self._dest(ch), 0) + 1)
                   for ch, (first, _) in offsets.items() if ch not in positions}
            if new:  # the source keeps them from now on until they crossed
                await source.set_position(self.group, new)
                positions.update(new)
            self._lag(offsets, positions)  # what is behind, even if the pages then fail
            moved = False
            now = time.monotonic()
            for ch, (_, nxt) in offsets.items():
                if blocked.get(ch, (0.0, 0.0))[0] > now:
                    continue
                try:
                    while positions[ch] < nxt and await self._page(source, dest, ch,
                                                                   positions, origin, avoid):
                        moved = True
                    blocked.pop(ch, None)
                    refusals.pop(ch, None)
                except RequestError as exc:
                    if _overtaken(exc):
                        # Another runner of this link (one that lost its turn, or took it
                        # while this one was paused) committed part of the page: go on
                        # after what it committed, never over it.
                        fence = int(exc.detail.get("fence", positions[ch] - 1))
                        log.info("federation %s (%s): %s is at %d already (another runner)"
                                 "; going on from there", self.link.name, self.direction,
                                 self._dest(ch), fence)
                        positions[ch] = max(positions[ch], fence + 1)
                        moved = True
                        continue
                    if not _refused_here(exc):
                        raise
                    # This channel alone is refused at the destination (a rule): the
                    # others go on; it is tried again later, nothing of it skipped.
                    wait = min(blocked.get(ch, (0.0, BACKOFF_MIN_S))[1] * 2, BACKOFF_MAX_S)
                    blocked[ch] = (now + wait, wait)
                    self.status.last_error = f"{self._dest(ch)}: {exc.message}"
                    self.status.last_error_at = time.time()
                    # Once per channel and refusal, not at every retry: a rule refusing
                    # 10,000 channels wrote 10,000 lines every 30 s.
                    if refusals.get(ch) != exc.message and \
                            self._log_budget.allow(time.monotonic()):
                        log.warning("federation %s (%s): %s; this channel waits and is "
                                    "tried again, the others go on", self.link.name,
                                    self.direction, self.status.last_error)
                    refusals[ch] = exc.message
            self.status.refused_channels = len(blocked)
            self._lag(offsets, positions)
            if not blocked and not self.status.foreign_channels:
                self.status.healthy(time.time())
            if moved:
                idle = POLL_MIN_S
            elif self._long_poll:
                # Until the source commits to one of these channels (or a new one): the
                # answer is the moment to look again. A broker that spreads its queues
                # wakes it for its own commits only: hence the short wait.
                try:
                    await source.admin("channels.wait", patterns=json_patterns,
                                       after=msgspec.json.encode(
                                           {ch: nxt for ch, (_, nxt) in offsets.items()}
                                       ).decode(), wait=WAIT_S)
                except RequestError as exc:
                    if int(exc.code) not in (int(ErrorCode.BAD_REQUEST),
                                             int(ErrorCode.NOT_AUTHORIZED)):
                        raise
                    self._long_poll = False  # an older broker (no such operation): poll
            else:
                await asyncio.sleep(idle)
                idle = min(idle * 1.5, POLL_MAX_S)

    def _ours(self, offsets: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        """The channels of the source's OFFSETS answer that the direction's patterns
        match. A pull writes here with this broker's authority, into the channels its
        remote names: one that named others (compromised, or a bug) wrote anything
        here, an admin's channels and dead letters included. The others are said (the
        direction's ``last_error``, ``foreign_channels``) and logged when their count
        changes, not at each turn."""
        matchers = [parse_pattern(p) for p in self.status.patterns]
        ours = {ch: v for ch, v in offsets.items() if any(p.matches(ch) for p in matchers)}
        foreign = len(offsets) - len(ours)
        if foreign and foreign != self.status.foreign_channels:
            names = sorted(ch for ch in offsets if ch not in ours)
            shown = ", ".join(repr(ch[:100]) for ch in names[:3])
            self.status.last_error = (
                f"the {'remote' if self.direction == 'pull' else 'source'} named "
                f"{foreign} channel(s) the patterns {list(self.status.patterns)} do not "
                f"match ({shown}{', ...' if foreign > 3 else ''}): not carried")
            self.status.last_error_at = time.time()
            if self._log_budget.allow(time.monotonic()):
                log.warning("federation %s (%s): %s", self.link.name, self.direction,
                            self.status.last_error)
        self.status.foreign_channels = foreign
        return ours

    async def _runs_here(self) -> bool:
        """Whether this broker runs the links. Alone or as a cluster's primary: yes.
        With the queues spread over brokers, the one owning queue ``LINKS_QUEUE`` does
        (claimed like any queue, so one broker at a time): two brokers carrying one link
        at once could commit pages of different bounds, which the fences cannot tell
        apart."""
        spread = self.server.spread
        if spread is None:
            return True
        route = spread.route(LINKS_QUEUE)
        if route is None:
            return True
        if route == ADOPT:
            await spread.adoption(LINKS_QUEUE)
            return spread.route(LINKS_QUEUE) is None
        return False

    def _dest(self, channel: str) -> str:
        return self.link.prefix + channel

    async def _page(self, source: Any, dest: Any, ch: str, positions: dict[str, int],
                    origin: str, avoid: str) -> bool:
        page = await source.read_page(ch, positions[ch], limit=PAGE)
        msgs = page.messages
        if not msgs:
            positions[ch] = max(positions[ch], page.next_seq)
            return False
        sends: list[f.Send] = []
        for i, m in enumerate(msgs):
            headers = dict(m.headers or {})
            path = _path(headers, origin)
            if avoid in path:  # it was there already (began there, or passed through)
                self.status.skipped_loops += 1
                continue
            headers.setdefault(FEDERATED_FROM, origin)
            if len(path) > 1:  # a single broker is x-federated-from: no header needed
                headers[FEDERATED_PATH] = msgspec.json.encode(path).decode()
            headers[FEDERATED_SEQ] = f"{m.channel}:{m.seq}"
            over = _headers_over(headers)
            if over:
                if i:  # the page ends before it: its turn comes in order, alone
                    msgs = msgs[:i]
                    break
                # Legal here, refused there for ever (BAD_REQUEST stopped the whole
                # direction): dead-lettered here, as a refused payload is.
                await self._dead_letter(self._local(source, dest), m, BadRequest(over))
                positions[ch] = m.seq + 1
                await source.set_position(self.group, {ch: m.seq + 1})
                return True
            sends.append(f.Send(self._dest(ch), m.data, m.raw, headers, m.priority, None,
                                None, None, m.key))
        last = msgs[-1].seq
        dead = self.status.dead_lettered
        if sends:
            await self._commit(source, dest, ch, sends, last, msgs, positions[ch] - 1)
        positions[ch] = last + 1
        self.status.forwarded += len(sends) - (self.status.dead_lettered - dead)
        self.status.lag_seconds = max(0.0, time.time() - msgs[-1].published_at)
        self._fresh_at = max(self._fresh_at, msgs[-1].published_at)
        await source.set_position(self.group, {ch: last + 1})
        return True

    async def _commit(self, source: Any, dest: Any, ch: str, sends: list[f.Send],
                      batch_id: int, msgs: list[Any], after: int) -> None:
        """Commit one page, fenced on its last seq and on where it starts (``after``):
        another runner that committed part of it makes this OUT_OF_SEQUENCE."""
        try:
            await self._commit_once(dest, ch, sends, batch_id, after)
        except RequestError as exc:
            if not _theirs(exc):
                raise
            # Refused for what a message is (a schema, a rule for its channel): one at a
            # time, the refused ones dead-lettered on the source with the reason.
            await self._one_by_one(source, dest, ch, sends, msgs, after)

    async def _commit_once(self, dest: Any, ch: str, sends: list[f.Send], batch_id: int,
                           after: int) -> None:
        # A new id each try: what an earlier try left staged (a cut before its commit)
        # is never committed with it.
        txn = f"{self.writer}:{_txn_channel(ch)}:{batch_id}:{secrets.token_hex(4)}"
        try:
            await dest.stage_sends(txn, sends)
            await dest.commit_transactions(self.writer, batch_id, [txn], lineage=self.writer,
                                           after=after)
        except RequestError:
            # Drop what it staged: left there, failed tries (a full disk for an hour)
            # would hold the destination's staging room until they expire.
            try:
                await asyncio.wait_for(dest.abort_transactions([txn]), CLOSE_S)
            except (MinouError, OSError, TimeoutError):
                self._orphans.append(txn)
            raise
        except BaseException:
            # The connection was lost (or the pipe stopped) between STAGE and the commit's
            # answer: the page may be staged there, held for an hour. The next connection
            # aborts it (a commit that did land is not undone: nothing is staged then).
            self._orphans.append(txn)
            raise

    async def _drop_orphans(self, dest: Any) -> None:
        """Abort what earlier connections left staged on the destination."""
        if not self._orphans:
            return
        txns = list(self._orphans)
        try:
            dropped = await dest.abort_transactions(txns)
        except RequestError as exc:  # refused: they expire on their own (STAGED_TTL_S)
            log.warning("federation %s (%s): could not abort %d page(s) left staged on the "
                        "destination (they expire there in an hour): %s", self.link.name,
                        self.direction, len(txns), exc.message)
            dropped = 0
        self._orphans.clear()
        self.status.orphans_dropped += dropped
        if dropped:
            log.info("federation %s (%s): aborted %d page(s) a lost connection left staged "
                     "on the destination", self.link.name, self.direction, dropped)

    def _local(self, source: Any, dest: Any) -> Any:
        return source if self.direction == "push" else dest

    async def _one_by_one(self, source: Any, dest: Any, ch: str, sends: list[f.Send],
                          msgs: list[Any], after: int) -> None:
        local = self._local(source, dest)
        by_seq = {f"{m.channel}:{m.seq}": m for m in msgs}
        for send in sends:
            key = (send.headers or {})[FEDERATED_SEQ]
            seq = int(key.rsplit(":", 1)[1])
            try:
                await self._commit_once(dest, ch, [send], seq, after)
            except RequestError as exc:
                if not _theirs(exc):
                    raise
                await self._dead_letter(local, by_seq[key], exc)
            after = seq

    async def _dead_letter(self, local: Any, msg: Any, exc: RequestError) -> None:
        """Keep a message the destination refuses for what it is on this broker, in the
        dead letters of its channel here (the source's for a push, the destination
        channel's for a pull), with the reason: an operator requeues it once fixed."""
        import base64

        channel = msg.channel if self.direction == "push" else self._dest(msg.channel)
        kept = await local.admin("federation.dead_letter", channel=channel,
                          data=base64.b64encode(msg.data).decode(), raw=msg.raw,
                          key=msg.key or "", reason=exc.message[:500],
                          headers=msgspec.json.encode(msg.headers or {}).decode(),
                          source=f"{msg.channel}:{msg.seq}", link=self.link.name,
                          writer=self.writer, seq=msg.seq)
        if (kept or {}).get("already"):
            return  # kept before this pipe read the page again
        self.status.dead_lettered += 1
        if self._log_budget.allow(time.monotonic()):
            log.warning("federation %s (%s): %s seq %d refused by the destination, "
                        "dead-lettered here: %s", self.link.name, self.direction,
                        msg.channel, msg.seq, exc.message)

    def lag_while_down(self) -> None:
        """A direction that is not carrying: its figures brought up to date for the
        status and metrics, which froze at the last connected ones through an outage.

        * the rate falls to 0 as its window passes (it showed the last rate carried);
        * a push direction counts its lag from this broker's own group (what the link
          has positioned, against what its channels hold now); channels first made
          during the outage count once the link is back (the group names only those it
          has positioned);
        * a pull direction cannot ask its source, the remote: ``lag_messages`` stays the
          last figure counted there (``lag_last_known``, counted at ``lag_counted_at``)
          and ``lag_seconds`` grows from the last moment this broker knew it held
          everything the remote had (the last contact that found nothing behind, or
          the last message carried while behind)."""
        if self.status.state in ("up", "elsewhere", "stopped"):
            return
        self.status.sample(time.monotonic())
        now = time.time()
        if self.direction == "pull":
            self.status.lag_last_known = True
            self.status.lag_seconds = max(self.status.lag_seconds, now - self._fresh_at)
            return
        group = self.server.core.state.groups.get(consume_group_key(self.group))
        if group is None:
            return
        behind, oldest = 0, None
        for gc in group.gcs.values():
            log_ = gc.log
            waiting = log_.end - max(gc.floor, log_.first_seq)
            if waiting > 0:
                behind += waiting
                first = log_.lookup(max(gc.floor, log_.first_seq))
                if isinstance(first, Msg) and (oldest is None or first.published_at < oldest):
                    oldest = first.published_at
        self.status.lag_messages = behind
        self.status.lag_counted_at = now
        if oldest is not None:
            self.status.lag_seconds = max(self.status.lag_seconds, now - oldest)

    def _lag(self, offsets: dict[str, tuple[int, int]], positions: dict[str, int]) -> None:
        self.status.sample(time.monotonic())
        behind = sum(max(0, nxt - positions.get(ch, nxt)) for ch, (_, nxt) in offsets.items())
        self.status.lag_messages = behind
        self.status.lag_counted_at, self.status.lag_last_known = time.time(), False
        self.status.channels = len(offsets)
        if not behind:
            self.status.lag_seconds = 0.0
            self._fresh_at = self.status.lag_counted_at


def _theirs(exc: RequestError) -> bool:
    """A refusal about the messages themselves (their payload): the others may go
    through one at a time, and these are dead-lettered."""
    return int(exc.code) in (int(ErrorCode.SCHEMA_MISMATCH), int(ErrorCode.INVALID_PAYLOAD),
                             int(ErrorCode.MESSAGE_TOO_LARGE))


def _path(headers: dict[str, str], here: str) -> list[str]:
    """Every broker a message was on, its origin first and ``here`` (its source now)
    last: ``x-federated-path`` plus ``here``, or, before its second hop (or from a
    broker that does not write the path), its origin (``x-federated-from``) and
    ``here``. A path that does not parse counts from its origin again: each hop still
    adds its own broker, so a made-up path cannot make a message loop."""
    path: list[str] = []
    text = headers.get(FEDERATED_PATH)
    if text is not None:
        with contextlib.suppress(msgspec.DecodeError):
            path = msgspec.json.decode(text, type=list[str])
    if not path and FEDERATED_FROM in headers:
        path = [headers[FEDERATED_FROM]]
    if not path or path[-1] != here:
        path.append(here)
    return path


def _headers_over(headers: dict[str, str]) -> str:
    """Why the destination would refuse these headers (the two the link adds may take a
    message past MAX_HEADERS or MAX_HEADER_SIZE), or ""."""
    if len(headers) > MAX_HEADERS:
        return (f"{len(headers)} headers with the link's {FEDERATED_FROM}, "
                f"{FEDERATED_SEQ} (and {FEDERATED_PATH}), the limit is {MAX_HEADERS}")
    size = sum(map(len, headers)) + sum(map(len, headers.values()))
    if size > MAX_HEADER_SIZE:
        return (f"headers of {size} bytes with the link's {FEDERATED_FROM}, "
                f"{FEDERATED_SEQ} (and {FEDERATED_PATH}), over the {MAX_HEADER_SIZE} "
                "byte limit")
    return ""


def _txn_channel(channel: str) -> str:
    """``channel`` in a transaction id: as it is, or a digest when it is long."""
    if len(channel) <= TXN_CHANNEL_CHARS:
        return channel
    return "~" + hashlib.blake2s(channel.encode(), digest_size=8).hexdigest()


def _overtaken(exc: RequestError) -> bool:
    """Another runner of the link committed part of the page (``detail.fence``)."""
    return int(exc.code) == int(ErrorCode.OUT_OF_SEQUENCE)


def _refused_here(exc: RequestError) -> bool:
    """A refusal about one channel at the destination (a rule, a reservation, a full
    queue, a request it cannot take for that channel): that channel waits, the others go
    on. (A BAD_REQUEST stopped the whole direction: every channel waited on one.)"""
    return int(exc.code) in (int(ErrorCode.NOT_AUTHORIZED), int(ErrorCode.QUEUE_FULL),
                             int(ErrorCode.INVALID_CHANNEL), int(ErrorCode.BAD_REQUEST))


class Remote:
    """A link's one connection to its remote broker, shared by its two directions (one
    outbound socket per link); made again once lost."""

    def __init__(self, federation: Federation, link: FederationLink) -> None:
        self.federation = federation
        self.link = link
        self.client: Any = None
        self._lock = asyncio.Lock()

    async def get(self) -> Any:
        async with self._lock:
            if self.client is None or not self.client.connected:
                await self.close()
                self.client = await self.federation.remote_client(self.link)
            return self.client

    async def drop_if_dead(self, client: Any) -> None:
        """After a direction's failure: the connection goes if it is lost (the other
        direction then fails too and both make one new one)."""
        if client is self.client and not client.connected:
            await self.close()

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), CLOSE_S)


class Federation:
    """Every configured link's pipes on this broker: started once the broker listens,
    changed by a reload, stopped with it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.secret = secrets.token_urlsafe(32)
        self.pipes: dict[str, list[Pipe]] = {}  # link name -> its pipes
        self.links: dict[str, FederationLink] = {}
        self.remotes: dict[str, Remote] = {}  # link name -> its connection to the remote
        self._closing: set[asyncio.Future[None]] = set()  # remotes of links a reload ended

    def remote(self, name: str) -> Remote:
        return self.remotes[name]

    def credential_ok(self, credential: str) -> bool:
        import hmac

        return hmac.compare_digest(credential.encode(),
                                   (LOCAL_CREDENTIAL + self.secret).encode())

    def apply(self, links: tuple[FederationLink, ...]) -> list[str]:
        """Start, restart or stop pipes so that they match ``links``; return the names
        of the links changed."""
        wanted = {link.name: link for link in links}
        changed = []
        for name in list(self.links):
            if wanted.get(name) != self.links[name]:
                for pipe in self.pipes.pop(name, []):
                    pipe.cancel()
                remote = self.remotes.pop(name, None)
                if remote is not None and remote.client is not None:
                    closing = asyncio.ensure_future(remote.close())
                    self._closing.add(closing)
                    closing.add_done_callback(self._closing.discard)
                del self.links[name]
                changed.append(name)
        for name, link in wanted.items():
            if name in self.links:
                continue
            self.links[name] = link
            self.remotes[name] = Remote(self, link)
            pipes = [Pipe(self.server, link, d, p) for d, p in
                     (("push", link.push), ("pull", link.pull)) if p]
            for pipe in pipes:
                pipe.start()
            self.pipes[name] = pipes
            if name not in changed:
                changed.append(name)
        return changed

    async def stop(self) -> None:
        pipes = [p for ps in self.pipes.values() for p in ps]
        if pipes:
            await asyncio.wait([asyncio.ensure_future(p.stop()) for p in pipes],
                               timeout=CLOSE_S * 2)
        for remote in self.remotes.values():
            await remote.close()
        self.pipes.clear()
        self.links.clear()
        self.remotes.clear()

    def pipe_views(self) -> list[dict[str, Any]]:
        """Every direction's status (metrics), lag brought up to date while down."""
        out = []
        for pipes in self.pipes.values():
            for pipe in pipes:
                pipe.lag_while_down()
                out.append(pipe.status.view())
        return out

    def view(self) -> dict[str, Any]:
        out = []
        for name, link in self.links.items():
            pipes = self.pipes.get(name, [])
            for pipe in pipes:
                pipe.lag_while_down()
            out.append({"name": name, "remote": link.remote, "prefix": link.prefix,
                        "pipes": [p.status.view() for p in pipes]})
        return {"links": out}

    async def local_client(self, name: str) -> Any:
        from ..client.aio import connect

        server = self.server
        url = server.local_url()
        return await connect(url, client_id=f"federation:{name}",
                             credential=LOCAL_CREDENTIAL + self.secret, reconnect=False,
                             request_timeout=REQUEST_TIMEOUT_S,
                             tls_fingerprint=server.tls.fingerprint if server.tls else None)

    async def remote_client(self, link: FederationLink) -> Any:
        from ..client.aio import connect

        return await connect(link.remote, client_id=link.client_id, key=link.key,
                             broker_token=link.broker_token,
                             tls_fingerprint=link.tls_fingerprint, cafile=link.cafile,
                             reconnect=False, request_timeout=REQUEST_TIMEOUT_S)


__all__ = ["Federation", "MinouError", "Pipe"]


# ------------------------------------------------------------ broker operations
def federation_op(server: Server, args: dict[str, Any], caller: Any) -> Any:
    """``federation``: every link's pipes, their state, last error, counts and lag."""
    return server.federation.view()


def fences_op(server: Server, args: dict[str, Any], caller: Any) -> Any:
    """``txn.fences``: the fences of writer ``writer_id`` (channel -> the last batch id
    it committed there), for the writer's owner (or an admin): where a federation pipe,
    or any fenced writer, goes on from."""
    from ..errors import BadRequest, NotAuthorized

    writer = args.get("writer_id")
    if not isinstance(writer, str) or not writer:
        raise BadRequest("give writer_id")
    tx = server.core.transactions
    owner = tx.writers.get(writer)
    if owner is not None and caller is not None and not caller.admin and \
            owner != caller.client_id:
        raise NotAuthorized(f"writer id {writer!r} is client {owner!r}'s", owner=owner)
    return {"writer_id": writer, "fences": {ch: batch for (w, ch), batch in tx.fences.items()
                                            if w == writer}}


async def dead_letter_op(server: Server, args: dict[str, Any], caller: Any) -> Any:
    """``federation.dead_letter``: a link of this process keeps a message its
    destination refused in the dead letters here (refused to anyone else), once: the
    dead letter channel is fenced on (``writer``, its name) by the source seq, stored
    with the message, so a pipe that reads the page again after a restart (nothing
    moved the destination's fence) does not keep a second copy. Answered once durable."""
    import base64

    from ..errors import BadRequest, NotAuthorized
    from ..names import validate_channel

    if caller is None or caller.method != "federation":
        raise NotAuthorized("'federation.dead_letter' is for this broker's own links",
                            op="federation.dead_letter")
    channel = args.get("channel")
    if not isinstance(channel, str):
        raise BadRequest("give channel")
    validate_channel(channel)
    try:
        data = base64.b64decode(str(args.get("data", "")), validate=True)
        headers = msgspec.json.decode(str(args.get("headers", "{}")), type=dict[str, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise BadRequest(f"federation.dead_letter: {exc}") from None
    headers.update({"x-dead-reason": "federation",
                    "x-dead-detail": str(args.get("reason", ""))[:500],
                    "x-original-channel": channel,
                    "x-federation-link": str(args.get("link", "")),
                    FEDERATED_SEQ: str(args.get("source", ""))})
    writer, seq = str(args.get("writer") or ""), int(args.get("seq") or 0)
    fences, batch = server.core.state.transactions.fences, server.core.state.batch
    key = (writer, dead_letter_channel(channel))
    if writer and seq > 0 and fences.get(key, 0) >= seq:
        return {"channel": key[1], "seq": None, "already": True}
    msg = server.core.dead_letters.keep(channel, data, bool(args.get("raw")), headers,
                                        str(args.get("key") or "") or None, time.time())
    if writer and seq > 0:
        batch.fence_undo.setdefault(key, fences.get(key))  # back if the commit fails
        fences[key] = batch.fences[key] = seq
    durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    server.engine.after_commit(lambda: durable.done() or durable.set_result(None),
                               lambda exc: durable.done() or durable.set_exception(exc))
    await durable
    return {"channel": msg.channel, "seq": msg.seq}


async def wait_op(server: Server, args: dict[str, Any], caller: Any) -> Any:
    """``channels.wait``: answer once a channel the ``patterns`` (a JSON list) match has
    a message past ``after`` (a JSON map channel -> next seq known), or a new such
    channel has one, or ``wait`` seconds passed: a federation pipe's long poll instead
    of polling. ``{"ready": bool}``. (With queues spread over brokers only this broker's
    commits wake it: the caller keeps ``wait`` short.)"""
    from ..errors import BadRequest
    from ..limits import MAX_KV_WAIT_S, MAX_PATTERNS_PER_REQUEST
    from ..names import match_keys, parse_pattern

    try:
        texts = msgspec.json.decode(str(args.get("patterns", "")), type=list[str])
        after = msgspec.json.decode(str(args.get("after", "{}")), type=dict[str, int])
        wait = float(args.get("wait", 0))
    except (msgspec.DecodeError, ValueError, TypeError) as exc:
        raise BadRequest(f"channels.wait: patterns (JSON list), after (JSON map), wait: "
                         f"{exc}") from None
    if not texts or len(texts) > MAX_PATTERNS_PER_REQUEST or not 0 <= wait <= MAX_KV_WAIT_S:
        raise BadRequest(f"channels.wait: 1..{MAX_PATTERNS_PER_REQUEST} patterns, wait "
                         f"0..{MAX_KV_WAIT_S:g} s")
    patterns = [parse_pattern(t) for t in texts]
    if caller is not None:
        access = server.access_for(caller)
        for text in texts:
            access.check_read(text)
    keys = {p.prefix for p in patterns}  # a channel's few keys looked up, not 256 tried

    def ready() -> bool:
        return any(log.end > after.get(name, 1) for name, log in server.core.channels.items()
                   if not keys.isdisjoint(match_keys(name)))

    if ready() or not wait:
        return {"ready": ready()}
    waiters = server.engine.pattern_waiters
    with server.engine.long_polls.slot("channels.wait long polls", caller):
        await woken(lambda wake: waiters.add(patterns, wake), waiters.remove, wait)
    return {"ready": ready()}


OPERATIONS = {"federation": federation_op, "txn.fences": fences_op,
              "federation.dead_letter": dead_letter_op, "channels.wait": wait_op}
# Self-service: each checks its caller itself.
SELF_SERVICE = frozenset({"txn.fences", "federation.dead_letter", "channels.wait"})
