"""Chaos over a cluster of brokers on Redis (issue 18, item 4).

A Redis primary with one replica (AOF ``always``; the brokers' commits ``WAIT`` for
the replica: ``replicas = 1``), three brokers on it with ``owner_lease`` 1 s on fixed
ports (a restart keeps its URLs), four producers and four consumers, native and HTTP,
each given every broker with a different one first. Meanwhile faults drawn from one
``random.Random(seed)``: kill -9 of a random broker (restarted at once or once another
serves), SIGSTOP of the primary past its lease then SIGCONT (it must exit 1, or stay
up as a standby), SIGTERM of the primary (exit 0, a hand-over) and a start again.
Then the load stops, the consumers catch up, a fresh group reads every channel from
the oldest message, and the ledger is checked (``Counts``).

``--placement spread`` runs the brokers with ``[storage] placement = "spread"``: six
queues (``chaos/v1`` .. ``chaos/v6``, two channels each) spread over the three brokers,
each broker serving every client (it forwards to the owners). There is no primary
there: a kill -9 hits a random broker (its queues are adopted by the others within the
lease), a pause hits a broker owning queues (woken, it must exit 1), a clean stop is a
SIGTERM or a ``minou soft-stop`` of a broker owning queues (exit 0). HTTP consumers read
only their own broker's queues in that mode, so the second group is read by a native
consumer instead (the HTTP producer stays: HTTP publishes are forwarded).

``python -m tests.chaos --seconds 300 --seed 18`` (``make chaos``) prints the faults as
they happen and the counts as a table; ``--redis cluster`` runs the same on a Redis
Cluster of three primaries, each with a replica (``CHAOS_ARGS='--redis cluster'``);
``tests/system/test_cluster_chaos.py`` is a short run with assertions on the same counts.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.errors import MinouError

from .conftest import BrokerProcess, auth, client_key
from .redis_cluster import RedisCluster
from .redis_sentinel import NO_SYNC_DELAY
from .redis_server import RedisServer, free_port

QUEUE = "chaos/v1"
CHANNELS = [f"{QUEUE}/{i}" for i in range(4)]
PATTERN = f"{QUEUE}/*"
# placement = "spread": six queues (two channels each), so that every broker owns some.
SPREAD_QUEUES = [f"chaos/v{k}" for k in range(1, 7)]
SPREAD_CHANNELS = [f"{q}/{i}" for q in SPREAD_QUEUES for i in range(2)]
SPREAD_PATTERN = "chaos/*"
OWNER_LEASE = 1.0
PREFETCH = 8
# Longer than any pause a consumer thread takes between taking a message and acking
# it: a delivery's lease that ran out in the client's own buffer would be redelivered
# legitimately and still look, to the ledger, like a delivery after a confirmed ack.
DELIVERY_LEASE = 30.0
HEARTBEAT = 2.0  # a paused broker's connections are dropped after two intervals
NATIVE_GROUP = "native"
HTTP_GROUP = "http"
# What a broker paused past its lease logs when it wakes (primary.py, app.py).
FENCED_LOG = "a write was refused (fenced)"
LOST_LOG = "writes nothing more"
TOOK_OVER_LOG = "took over as the primary"
STALE_REFUSAL = "its writes are refused"  # the error its clients get for a fenced batch
# What a spread broker paused past its lease logs when it wakes (spread.py).
CLAIMED_LOG = "claimed by another broker"
# An exception logged with its traceback: its last line (type: message).
TRACEBACK = re.compile(r"^Traceback \(most recent call last\):\n(?:[ \t].*\n)*(.+)$", re.M)


# --------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    seconds: float = 300.0  # faults are spread over this long (a run lasts longer)
    seed: int = 18
    kills: int = 10
    pauses: int = 2
    graceful: int = 1
    rate: float = 10.0  # publishes per second, per producer
    redis: str = "single"  # "single": a primary and a replica; "cluster": a Redis Cluster
    placement: str = "primary"  # "primary": one primary, two standbys; "spread"

    @property
    def spread(self) -> bool:
        return self.placement == "spread"

    @property
    def queues(self) -> list[str]:
        return SPREAD_QUEUES if self.spread else [QUEUE]

    @property
    def channels(self) -> list[str]:
        return SPREAD_CHANNELS if self.spread else CHANNELS

    @property
    def pattern(self) -> str:
        return SPREAD_PATTERN if self.spread else PATTERN

    @property
    def groups(self) -> list[str]:
        """The native group, then the HTTP one."""
        return [NATIVE_GROUP, HTTP_GROUP]

    def faults(self) -> list[str]:
        kinds = ["kill"] * self.kills + ["pause"] * self.pauses + ["term"] * self.graceful
        random.Random(self.seed).shuffle(kinds)
        return kinds


# -------------------------------------------------------------------- the ledger
@dataclass
class Delivery:
    idx: int  # receive order over every consumer
    at: float  # time.monotonic() when the consumer got it
    group: str
    consumer: str
    segment: str  # one connection (native) or one broker session (HTTP receipt token)
    channel: str
    seq: int
    payload: tuple[str, int]
    attempts: int
    acked_at: float | None = None  # when its ack was confirmed durable
    ack_error: str = ""


class Ledger:
    """What the clients saw: confirmed publishes, deliveries, confirmed acks. Written by
    every client thread, read by the checks once they are stopped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.confirmed: dict[tuple[str, int], tuple[str, int]] = {}
        self.confirmed_twice: list[tuple[tuple[str, int], tuple[str, int], tuple[str, int]]] = []
        self._by_payload: dict[tuple[str, int], tuple[str, int]] = {}
        self.publish_errors: Counter[str] = Counter()
        self.consume_errors: Counter[str] = Counter()
        self.stale_refusals = 0  # client-seen refusals of a fenced (stale) broker's batch
        self.deliveries: list[Delivery] = []
        self.acked: dict[str, set[tuple[str, int]]] = defaultdict(set)
        self._order = itertools.count()

    def confirm(self, channel: str, seq: int, payload: tuple[str, int]) -> None:
        with self.lock:
            key = (channel, seq)
            earlier = self._by_payload.get(payload)
            if earlier is not None and earlier != key:
                self.confirmed_twice.append((payload, earlier, key))
            self._by_payload.setdefault(payload, key)
            self.confirmed[key] = payload

    def error(self, kind: str, exc: BaseException | str) -> None:
        text = str(exc)
        with self.lock:
            (self.publish_errors if kind == "publish" else self.consume_errors)[
                _error_kind(exc)] += 1
            if STALE_REFUSAL in text:
                self.stale_refusals += 1

    def delivered(self, group: str, consumer: str, segment: str, channel: str, seq: int,
                  payload: Any, attempts: int) -> Delivery:
        body = (str(payload.get("p")), int(payload.get("n", -1))) \
            if isinstance(payload, dict) else ("?", -1)
        with self.lock:
            d = Delivery(next(self._order), time.monotonic(), group, consumer, segment,
                         channel, seq, body, attempts)
            self.deliveries.append(d)
            return d

    def settled(self, d: Delivery, ok: bool, error: str = "") -> None:
        with self.lock:
            if ok:
                d.acked_at = time.monotonic()
                self.acked[d.group].add((d.channel, d.seq))
            else:
                d.ack_error = error or "not confirmed"

    def caught_up(self, groups: list[str]) -> bool:
        with self.lock:
            want = set(self.confirmed)
            return all(want <= self.acked[g] for g in groups)

    def progress(self) -> tuple[int, int]:
        with self.lock:
            return len(self.confirmed), sum(len(s) for s in self.acked.values())


def _error_kind(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    return type(exc).__name__


# ------------------------------------------------------------------- the clients
class Worker(threading.Thread):
    def __init__(self, name: str, ledger: Ledger) -> None:
        super().__init__(name=name, daemon=True)
        self.ledger = ledger
        self.stop = threading.Event()
        self.crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported by the run, never swallowed
            self.crashed = exc

    def work(self) -> None:
        raise NotImplementedError


class Pacer:
    """``rate`` per second, not more; a client that fell behind does not burst."""

    def __init__(self, rate: float) -> None:
        self.period = 1.0 / rate
        self.next = time.monotonic()

    def wait(self, stop: threading.Event) -> None:
        now = time.monotonic()
        self.next = max(self.next + self.period, now)
        stop.wait(self.next - now)


def native_client(urls: str, client_id: str) -> Any:
    # Short timeouts: a call on a paused broker gives up and the client moves on.
    return minou.connect_sync(urls, request_timeout=10, confirm_timeout=20,
                              heartbeat=HEARTBEAT, **auth(client_id))


class NativeProducer(Worker):
    """Numbered publishes through the Python client (idempotent producer), one at a time."""

    def __init__(self, name: str, ledger: Ledger, urls: str, rate: float, seed: int,
                 channels: list[str] = CHANNELS) -> None:
        super().__init__(name, ledger)
        self.urls, self.rate, self.rng = urls, rate, random.Random(seed)
        self.channels = channels
        self.sent = 0

    def work(self) -> None:
        pacer, client = Pacer(self.rate), None
        try:
            while not self.stop.is_set():
                if client is None:
                    try:
                        client = native_client(self.urls, self.name)
                    except MinouError as exc:
                        self.ledger.error("publish", exc)
                        self.stop.wait(0.5)
                        continue
                channel = self.rng.choice(self.channels)
                n = self.sent
                self.sent += 1
                try:
                    receipt = client.send(channel, {"p": self.name, "n": n})
                except MinouError as exc:  # not confirmed: maybe stored (sent again once)
                    self.ledger.error("publish", exc)
                else:
                    self.ledger.confirm(receipt.channel, receipt.seq, (self.name, n))
                pacer.wait(self.stop)
        finally:
            if client is not None:
                client.close()


def work_on(rng: random.Random, stop: threading.Event) -> None:
    """A consumer's work on one message, up to 30 ms: a fault often finds a delivery
    taken and not yet acked (what makes duplicates worth checking)."""
    stop.wait(rng.uniform(0.0, 0.03))


class NativeConsumer(Worker):
    """A member of a native group: takes, records, works on, acks every delivery."""

    def __init__(self, name: str, ledger: Ledger, urls: str, seed: int,
                 group: str = NATIVE_GROUP, pattern: str = PATTERN) -> None:
        super().__init__(name, ledger)
        self.urls, self.rng = urls, random.Random(seed)
        self.group, self.pattern = group, pattern

    def work(self) -> None:
        while not self.stop.is_set():
            try:
                client = native_client(self.urls, self.name)
            except MinouError as exc:
                self.ledger.error("consume", exc)
                self.stop.wait(0.5)
                continue
            try:
                self._consume(client)
            except MinouError as exc:  # the subscription itself failed: start again
                self.ledger.error("consume", exc)
                self.stop.wait(0.5)
            finally:
                client.close()

    def _consume(self, client: Any) -> None:
        sub = client.consume(self.pattern, group=self.group, prefetch=PREFETCH,
                             lease=DELIVERY_LEASE)
        while not self.stop.is_set():
            try:
                msg = sub.get(timeout=0.5)
            except minou.Timeout:
                continue
            # The connection a delivery came on: the client's own count of connections,
            # and the port of the broker it connected to (for the examples printed).
            aio = client._client
            port = aio.urls[aio._url_index][2]
            d = self.ledger.delivered(self.group, self.name,
                                      f"{self.name}#{msg._epoch}@{port}",
                                      msg.channel, msg.seq, msg.payload, msg.attempts)
            work_on(self.rng, self.stop)
            try:
                ok = msg.ack()
            except MinouError as exc:  # refused (a stale tag): not settled by this
                self.ledger.settled(d, False, str(exc))
                self.ledger.error("consume", exc)
            else:
                self.ledger.settled(d, ok)


class HttpCluster:
    """An HTTP client of every broker: redirects followed (a standby's 307 names the
    primary), the next broker tried when one does not answer or says it cannot serve.
    The token is set on every request, redirects included: httpx, like curl, drops an
    Authorization header when a redirect leaves the origin (another port)."""

    RETRY_STATUS = (502, 503, 504)  # a standby that knows no primary, stopping, fenced

    def __init__(self, bases: list[str], client_id: str) -> None:
        self.bases = bases
        self.client_id = client_id
        self.current = 0
        self._token, self._token_at = "", 0.0
        self.http = httpx.Client(follow_redirects=True, timeout=httpx.Timeout(5.0),
                                 event_hooks={"request": [self._sign]})

    def _sign(self, request: httpx.Request) -> None:
        # tokens live 20 min at most here (the first one whatever the clock: monotonic
        # time may be under 600 s on a machine just booted)
        if not self._token or time.monotonic() - self._token_at > 600:
            key = keyfiles.load_private(client_key(self.client_id))
            self._token = make_token(self.client_id, key, "minou", ttl=1200)
            self._token_at = time.monotonic()
        request.headers["Authorization"] = f"Bearer {self._token}"

    def request(self, method: str, path: str, *, deadline: float, ledger: Ledger,
                kind: str, **kw: Any) -> httpx.Response | None:
        """The first answer that is not a "try elsewhere", or None at ``deadline``."""
        while time.monotonic() < deadline:
            base = self.bases[self.current]
            try:
                r = self.http.request(method, base + path, **kw)
            except httpx.HTTPError as exc:
                ledger.error(kind, f"http {type(exc).__name__}")
                self.current = (self.current + 1) % len(self.bases)
                time.sleep(0.1)
                continue
            if r.status_code in self.RETRY_STATUS:
                ledger.error(kind, f"http {r.status_code} {_reason(r)}")
                if STALE_REFUSAL in r.text:
                    with ledger.lock:
                        ledger.stale_refusals += 1
                self.current = (self.current + 1) % len(self.bases)
                time.sleep(0.2)
                continue
            # Who answered (after redirects): ask there first next time.
            answered = f"{r.url.scheme}://{r.url.host}:{r.url.port}"
            if answered in self.bases:
                self.current = self.bases.index(answered)
            return r
        return None

    def close(self) -> None:
        self.http.close()


def _reason(r: httpx.Response) -> str:
    try:
        return str(r.json()["error"]["reason"])
    except (ValueError, KeyError, TypeError):
        return ""


class HttpProducer(Worker):
    """Numbered publishes over HTTP, each sent again (same dedup key) until confirmed."""

    def __init__(self, name: str, ledger: Ledger, bases: list[str], rate: float,
                 seed: int, channels: list[str] = CHANNELS) -> None:
        super().__init__(name, ledger)
        self.cluster = HttpCluster(bases, name)
        self.rate, self.rng = rate, random.Random(seed)
        self.channels = channels
        self.sent = 0

    def work(self) -> None:
        pacer = Pacer(self.rate)
        try:
            while not self.stop.is_set():
                channel, n = self.rng.choice(self.channels), self.sent
                self.sent += 1
                # The dedup key absorbs a resend of a publish stored but not answered.
                r = self.cluster.request(
                    "POST", f"/v1/messages/{channel}?dedup={self.name}-{n}",
                    json={"p": self.name, "n": n}, deadline=time.monotonic() + 30,
                    ledger=self.ledger, kind="publish")
                if r is not None and r.status_code == 201:
                    body = r.json()
                    self.ledger.confirm(body["channel"], body["seq"], (self.name, n))
                elif r is not None:
                    self.ledger.error("publish", f"http {r.status_code} {_reason(r)}")
                pacer.wait(self.stop)
        finally:
            self.cluster.close()


class HttpConsumer(Worker):
    """The HTTP group's consumer: long-polls one message, records, works on, acks it.
    Spread: a pattern per queue in turn (an HTTP pattern spans one queue at most), each
    read through whichever broker it is on."""

    def __init__(self, name: str, ledger: Ledger, bases: list[str], seed: int,
                 patterns: list[str] | None = None) -> None:
        super().__init__(name, ledger)
        self.cluster = HttpCluster(bases, name)
        self.rng = random.Random(seed)
        self.patterns = patterns or [PATTERN]

    def work(self) -> None:
        wait = 1 if len(self.patterns) == 1 else 0.3
        turn = 0
        try:
            while not self.stop.is_set():
                pattern = self.patterns[turn % len(self.patterns)]
                turn += 1
                path = (f"/v1/consume/{pattern}?group={HTTP_GROUP}&wait={wait:g}"
                        f"&lease={DELIVERY_LEASE:g}")
                r = self.cluster.request("POST", path, deadline=time.monotonic() + 10,
                                         ledger=self.ledger, kind="consume")
                if r is None or r.status_code == 204:
                    continue
                if r.status_code != 200:
                    self.ledger.error("consume", f"http {r.status_code} {_reason(r)}")
                    self.stop.wait(0.2)
                    continue
                m = r.json()
                # A receipt is "<the broker's session for this consumer>.<tag>".
                d = self.ledger.delivered(HTTP_GROUP, self.name, m["receipt"].split(".")[0],
                                          m["channel"], m["seq"], m["payload"], m["attempts"])
                work_on(self.rng, self.stop)
                a = self.cluster.request("POST", f"/v1/ack/{m['receipt']}",
                                         deadline=time.monotonic() + 10, ledger=self.ledger,
                                         kind="consume")
                ok = a is not None and a.status_code == 200
                self.ledger.settled(d, ok, "" if ok or a is None else
                                    f"http {a.status_code} {_reason(a)}")
        finally:
            self.cluster.close()


# ------------------------------------------------------------------- the cluster
def wait_for(predicate: Callable[[], object], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def health(b: BrokerProcess, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
    """(status, body) of ``/health``; (0, {}) when nothing answers in time."""
    try:
        r = httpx.get(b.http + "/health", timeout=timeout)
    except httpx.HTTPError:
        return 0, {}
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, {}


@dataclass
class FaultRecord:
    kind: str
    broker: int
    at: float  # seconds since the load started
    took: float | None = None  # until another broker served (None: it did not)
    outcome: str = ""
    primary: bool = True  # whether the broker was the primary (pauses and stops are)
    # spread: it owned queues (pauses and stops do); primary stays True for those


@dataclass
class Counts:
    placement: str = "primary"
    seconds: float = 0.0
    confirmed: int = 0
    publish_failures: int = 0
    confirmed_lost: int = 0
    confirmed_changed: int = 0  # found at its seq with another payload
    confirmed_twice: int = 0  # one publish confirmed at two seqs
    stored: int = 0  # messages the final drain read (confirmed or not)
    stored_twice: int = 0  # one publish stored at two seqs (a resend not recognised)
    deliveries: dict[str, int] = field(default_factory=dict)
    undelivered: dict[str, int] = field(default_factory=dict)  # confirmed, never delivered
    acks_confirmed: dict[str, int] = field(default_factory=dict)
    acks_unanswered: dict[str, int] = field(default_factory=dict)  # last ack not confirmed
    after_ack: int = 0
    duplicates: int = 0
    duplicates_explained: int = 0
    duplicates_unexplained: int = 0
    order_violations: int = 0
    fenced_logged: int = 0  # "a write was refused (fenced)" in a woken broker's log
    fenced_metric: int = 0  # minou_fenced_writes_total read from a woken broker in time
    stale_refusals_seen: int = 0  # a client told its batch was refused as stale
    pauses_exit_1: int = 0
    pauses_standby: int = 0
    takeovers: int = 0  # "took over as the primary" in the brokers' logs (primary)
    # spread: queues the faulted broker owned, then owned by another (seen by the driver)
    queues_moved: int = 0
    leases_lost_unpaused: int = 0  # brokers that lost their lease/queues, never paused
    tracebacks: int = 0  # in the brokers' logs (an exception no code path handled)
    faults: list[FaultRecord] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)  # what the driver itself saw go wrong
    examples: dict[str, list[str]] = field(default_factory=dict)

    def table(self) -> str:
        spread = self.placement == "spread"
        whose = "owning queues" if spread else "of the primary"
        rows: list[tuple[str, object, str]] = [
            ("placement", self.placement, "queues spread over the brokers" if spread
             else "one primary, two standbys"),
            ("run time (s)", f"{self.seconds:.0f}", ""),
            ("faults", len(self.faults), ", ".join(
                f"{k} {v}" + (f" ({sum(f.primary for f in self.faults if f.kind == k)} "
                              f"{whose})" if k == "kill" else "")
                for k, v in Counter(f.kind for f in self.faults).items())),
            ("confirmed messages", self.confirmed, f"{self.publish_failures} publish "
             "attempts failed (not confirmed)"),
            ("confirmed lost", self.confirmed_lost, "must be 0"),
            ("confirmed, other payload at its seq", self.confirmed_changed, "must be 0"),
            ("one publish confirmed at two seqs", self.confirmed_twice, "reported"),
            ("messages stored (final drain)", self.stored, "confirmed or not"),
            ("publishes stored at two seqs", self.stored_twice, "a resend stored again"),
        ]
        for g in sorted(self.deliveries):
            rows.append((f"deliveries, group {g}", self.deliveries[g],
                         f"{self.acks_confirmed.get(g, 0)} acks confirmed; "
                         f"{self.acks_unanswered.get(g, 0)} settled with the answer lost"))
            rows.append((f"confirmed never delivered, group {g}", self.undelivered.get(g, 0),
                         "must be 0"))
        rows += [
            ("deliveries after a confirmed ack", self.after_ack, "must be 0"),
            ("duplicates (deliveries beyond the first)", self.duplicates,
             f"{self.duplicates_explained} explained by an unsettled earlier delivery"),
            ("unexplained duplicates", self.duplicates_unexplained, "must be 0"),
            ("order violations (one consumer, one channel)", self.order_violations,
             "must be 0"),
            ("stale writes refused, logged (fenced)", self.fenced_logged,
             "by brokers woken after a pause"),
            ("stale writes refused, on /metrics", self.fenced_metric,
             "read before the woken broker exited (a lower bound)"),
            ("stale refusals seen by clients", self.stale_refusals_seen, ""),
            ("paused brokers: exited 1 / stayed standby" if spread else
             "paused primaries: exited 1 / stayed standby",
             f"{self.pauses_exit_1} / {self.pauses_standby}",
             "each must exit 1" if spread else ""),
            ("queues adopted off a faulted broker", self.queues_moved,
             "kills, pauses, stops (seen by the driver)") if spread else
            ("takeovers (brokers' logs)", self.takeovers, ""),
            ("brokers lost (exit 1) never paused" if spread else
             "leases lost by a primary never paused", self.leases_lost_unpaused, "must be 0"),
            ("tracebacks in the brokers' logs", self.tracebacks, "reported (see below)"),
            ("anomalies", len(self.anomalies), "must be 0"),
        ]
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(str(r[1])) for r in rows)
        lines = [f"{'count':<{w0}}  {'value':>{w1}}  note", "-" * (w0 + w1 + 30)]
        lines += [f"{a:<{w0}}  {b!s:>{w1}}  {c}" for a, b, c in rows]
        return "\n".join(lines)


class Chaos:
    """The whole run: start, load, faults, stop, drain, check. Stops only what it started."""

    def __init__(self, plan: Plan, workdir: Path, out: Callable[[str], None] = print) -> None:
        self.plan = plan
        self.dir = workdir
        self.out = out
        self.rng = random.Random(plan.seed)
        self.redis: list[RedisServer] = []
        self.brokers: list[BrokerProcess] = []
        self.ledger = Ledger()
        self.workers: list[Worker] = []
        self.t0 = time.monotonic()
        self.counts = Counts(placement=plan.placement)
        # A broker is ready once it prints its banner; a standby (primary placement)
        # prints "standby:" instead. Spread: every broker prints the banner.
        self.ready = "  stop with" if plan.spread else "standby:"
        self._fenced_seen = 0  # minou_fenced_writes_total of the broker woken last
        self._admin_token = ""
        self._admin_http: httpx.Client | None = None

    # ------------------------------------------------------------------ output
    def log(self, text: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:7.2f}s] {text}")

    # ------------------------------------------------------------------- setup
    def start_redis(self) -> str:
        if self.plan.redis == "cluster":  # three primaries, each with a replica
            cluster = RedisCluster(self.dir / "cluster", replicas=3).start()
            self.redis.extend(cluster.nodes)
            return cluster.url
        primary = RedisServer(self.dir / "redis0", *NO_SYNC_DELAY).start()
        self.redis.append(primary)
        replica = RedisServer(self.dir / "redis1", *NO_SYNC_DELAY, "--replicaof",
                              "127.0.0.1", str(primary.port)).start()
        self.redis.append(replica)
        client = primary.client()

        def linked() -> bool:
            info = client.info("replication")
            return any(k.startswith("slave") and isinstance(v, dict)
                       and v.get("state") == "online" for k, v in info.items())

        if not wait_for(linked, 30):
            raise RuntimeError("the Redis replica did not link to its primary")
        return primary.url

    def start_brokers(self, url: str) -> None:
        cfg = self.dir / "cluster.toml"
        spread = self.plan.spread
        # retention: a fresh group at the end still reads every message, acked or not;
        # requeue_limit: a message redelivered at every fault is never dead-lettered.
        cfg.write_text(
            f'[storage]\nurl = "{url}"\nowner_lease = {OWNER_LEASE}\nreplicas = 1\n'
            + ('placement = "spread"\n' if spread else "") + "\n"
            f'[channels."{"chaos/*" if spread else QUEUE}"]\nprefetch = {PREFETCH}\n'
            "retention = 86400\nrequeue_limit = 1000\n")
        for i in range(3):
            b = BrokerProcess(self.dir / f"broker{i}", config=cfg, storage=url)
            b.port, b.http_port = free_port(), free_port()
            b.url, b.http = f"minou://127.0.0.1:{b.port}", f"http://127.0.0.1:{b.http_port}"
            self.brokers.append(b)
        # The first is the primary (primary placement); it makes the admin key, which the
        # others read from the shared registry at their start.
        self.brokers[0].start(timeout=60, ready=self.ready)
        starters = [threading.Thread(target=b.start, kwargs={"timeout": 60,
                                                             "ready": self.ready})
                    for b in self.brokers[1:]]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        if not all(b.alive for b in self.brokers):
            raise RuntimeError("a broker did not start")

    def urls(self, first: int) -> str:
        order = [self.brokers[(first + k) % 3] for k in range(3)]
        return ",".join(b.url for b in order)

    def bases(self, first: int) -> list[str]:
        return [self.brokers[(first + k) % 3].http for k in range(3)]

    def start_load(self) -> None:
        plan = self.plan
        # HTTP clients must be known once (a native HELLO registers the key). Spread: on
        # every broker, each of which read the shared registry at its start (a restart
        # reads it again, with them).
        for cid in ("http-producer", "http-consumer"):
            for url in [b.url for b in self.brokers] if plan.spread else [self.urls(0)]:
                with native_client(url, cid):
                    pass
        seed, rate, ledger = plan.seed, plan.rate, self.ledger
        self.consumers: list[Worker] = [
            NativeConsumer(f"consumer-{i}", ledger, self.urls(i), seed * 10 + 4 + i,
                           pattern=plan.pattern)
            for i in range(3)]
        self.consumers.append(HttpConsumer(
            "http-consumer", ledger, self.bases(2), seed * 10 + 7,
            patterns=[f"{q}/*" for q in plan.queues] if plan.spread else None))
        self.producers: list[Worker] = [
            NativeProducer(f"producer-{i}", ledger, self.urls(i), rate, seed * 10 + i,
                           channels=plan.channels)
            for i in range(3)]
        self.producers.append(HttpProducer("http-producer", ledger, self.bases(1), rate,
                                           seed * 10 + 3, channels=plan.channels))
        self.workers = self.consumers + self.producers
        for w in self.workers:
            w.start()

    # ------------------------------------------------------------------ faults
    def admin_get(self, b: BrokerProcess, path: str, timeout: float = 1.0) -> Any:
        """GET ``path`` on ``b`` as the admin, redirects followed (a standby sends it to
        the primary, or relays it), as JSON; None when nothing useful answers."""
        if self._admin_http is None:
            def sign(request: httpx.Request) -> None:  # on every hop: see HttpCluster
                request.headers["Authorization"] = f"Bearer {self.admin_token()}"

            self._admin_http = httpx.Client(follow_redirects=True,
                                            event_hooks={"request": [sign]})
        try:
            r = self._admin_http.get(b.http + path, timeout=timeout)
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def cluster_primary(self, exclude: BrokerProcess | None = None) -> BrokerProcess | None:
        """The primary as the cluster says (``/v1/cluster``, asked of the brokers but
        ``exclude``): not what a standby's /health says, which a standby that relays
        clients might answer 200 to."""
        for b in self.brokers:
            if b is exclude or not b.alive:
                continue
            # Briefly: a standby redirects to the primary, which may be the paused one.
            view = self.admin_get(b, "/v1/cluster", timeout=0.5)
            if not isinstance(view, dict):
                continue
            urls = [m.get("native") for m in view.get("brokers", [])
                    if m.get("id") == view.get("primary")]
            for candidate in self.brokers:
                if candidate.url in urls:
                    return candidate
        return None

    def wait_serving(self, old: BrokerProcess | None, timeout: float = 60) -> float | None:
        """Seconds until a broker other than ``old`` (not asked: it may be paused) is the
        primary and answers /health 200; None if none did within ``timeout``."""
        start = time.monotonic()

        def serves() -> bool:
            p = self.cluster_primary(exclude=old)
            return p is not None and p is not old and health(p)[0] == 200

        if wait_for(serves, timeout, 0.05):
            return time.monotonic() - start
        return None

    def wait_progress(self, what: str, timeout: float = 90) -> None:
        """Until publishes and acks both moved on: the cluster serves clients again."""
        pubs, acks = self.ledger.progress()
        if not wait_for(lambda: all(now >= then + 10 for now, then in
                                    zip(self.ledger.progress(), (pubs, acks), strict=True)),
                        timeout):
            self.anomaly(f"no progress within {timeout:g} s after {what} "
                         f"(confirmed, acks) {self.ledger.progress()} from {(pubs, acks)}")

    def anomaly(self, text: str) -> None:
        self.counts.anomalies.append(text)
        self.log(f"ANOMALY: {text}")

    def restart(self, b: BrokerProcess) -> None:
        try:
            b.start(timeout=60, ready=self.ready)
        except RuntimeError as exc:
            self.anomaly(f"broker {self.brokers.index(b)} did not start again: {exc}")

    def admin_token(self) -> str:
        """A token of the admin the first broker made (its key is in its data directory;
        the registry that knows it is shared by every broker)."""
        if not self._admin_token:
            key = keyfiles.load_private(self.brokers[0].admin_key)
            self._admin_token = make_token("admin", key, "minou", ttl=3600)
        return self._admin_token

    def primary(self) -> BrokerProcess:
        found: list[BrokerProcess] = []

        def known() -> bool:
            p = self.cluster_primary()
            found[:] = [p] if p is not None and p.alive else []
            return bool(found)

        if not wait_for(known, 60):
            raise RuntimeError("no broker is the primary")
        return found[0]

    def fault(self, kind: str) -> None:
        if self.plan.spread:
            return self.spread_fault(kind)
        now = time.monotonic() - self.t0
        if kind == "kill":
            i = self.rng.randrange(3)
            at_once = self.rng.random() < 0.3
            b = self.brokers[i]
            was = self.cluster_primary() is b
            rec = FaultRecord(kind, i, now, primary=was)
            self.log(f"kill -9 broker {i} ({'primary' if was else 'standby'}); restart "
                     f"{'at once' if at_once else 'once another serves'}")
            b.kill()
            killed = time.monotonic()
            if at_once:
                self.restart(b)
            took = self.wait_serving(None if at_once else b)
            rec.took = None if took is None else time.monotonic() - killed
            if took is None:
                self.anomaly(f"nobody served within 60 s of kill -9 of broker {i}")
            if not at_once:
                self.restart(b)
            rec.outcome = f"{'primary' if was else 'standby'}, serving again after " \
                          f"{rec.took or 0:.1f} s"
        elif kind == "pause":
            b = self.primary()
            i = self.brokers.index(b)
            rec = FaultRecord(kind, i, now)
            assert b.proc is not None
            offset = len(b.output)
            self.log(f"SIGSTOP broker {i} (the primary)")
            b.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            rec.took = self.wait_serving(b)
            if rec.took is None:
                self.anomaly(f"nobody took over from paused broker {i} within 60 s")
            time.sleep(self.rng.uniform(0.0, 0.5))  # and a little more past the takeover
            b.proc.send_signal(signal.SIGCONT)
            self.log(f"SIGCONT broker {i} after {time.monotonic() - stopped:.1f} s")
            self._fenced_seen = 0
            rec.outcome = self.after_wake(b, i)
            fenced = b.output[offset:].count(FENCED_LOG)
            self.counts.fenced_logged += fenced
            self.counts.fenced_metric += self._fenced_seen
            rec.outcome += f"; fenced writes: {fenced} logged, {self._fenced_seen} on /metrics"
            if not b.alive:
                self.restart(b)
        else:  # term: a clean stop of the primary hands the lease over at once
            b = self.primary()
            i = self.brokers.index(b)
            rec = FaultRecord(kind, i, now)
            self.log(f"SIGTERM broker {i} (the primary)")
            stopped = time.monotonic()
            rc = b.stop()
            rec.took = self.wait_serving(b)
            if rc != 0:
                self.anomaly(f"broker {i} stopped with status {rc} on SIGTERM")
            if rec.took is None:
                self.anomaly(f"nobody served within 60 s of SIGTERM of broker {i}")
            rec.took = time.monotonic() - stopped
            rec.outcome = f"exit {rc}, another serving after {rec.took:.1f} s"
            self.restart(b)
        self.counts.faults.append(rec)
        self.log(f"  {kind} broker {rec.broker}: {rec.outcome}")
        self.wait_progress(f"{kind} of broker {rec.broker}")

    def after_wake(self, b: BrokerProcess, i: int) -> str:
        """A primary woken past its lease exits 1, or stays up as a standby."""
        assert b.proc is not None
        woken = time.monotonic()
        deadline = woken + 30
        while time.monotonic() < deadline:
            # Its own count of refused writes, if it answers before it is gone.
            fenced = metrics_line(b, self.admin_token(), "minou_fenced_writes_total",
                                  timeout=0.3)
            if fenced is not None:
                self._fenced_seen = max(self._fenced_seen, int(fenced))
            rc = b.proc.poll()
            if rc is not None:
                if rc == 1:
                    self.counts.pauses_exit_1 += 1
                    out = b.output
                    if "another broker took over" not in out or LOST_LOG not in out:
                        self.anomaly(f"broker {i} exited 1 without saying why")
                else:
                    self.anomaly(f"woken broker {i} exited with status {rc}")
                return f"exited {rc}"
            status, body = health(b, timeout=0.5)
            # A standby says so on /health (503 "standby"); one that relays clients may
            # not: still up well after waking, with another broker the primary, it is one.
            if (status == 503 and body.get("status") == "standby") or (
                    time.monotonic() - woken > 10 * OWNER_LEASE
                    and self.cluster_primary() not in (None, b)):
                self.counts.pauses_standby += 1
                return "running on as a standby"
            time.sleep(0.05)
        self.anomaly(f"woken broker {i} neither exited nor became a standby in 30 s")
        return "still up, not a standby"

    # ------------------------------------------------------- spread placement
    def spread_view(self, exclude: BrokerProcess | None = None) -> dict[str, Any] | None:
        """``/v1/cluster`` (``minou cluster --json``) of the first live broker but
        ``exclude`` (not asked: it may be paused) that answers with the spread view."""
        for b in self.brokers:
            if b is exclude or not b.alive:
                continue
            view = self.admin_get(b, "/v1/cluster", timeout=2.0)
            if isinstance(view, dict) and view.get("placement") == "spread":
                return view
        return None

    def broker_of(self, member: str | None) -> BrokerProcess | None:
        """The broker process a member id names (``host:port:pid:random``), if it is
        the one running (or last run) on that port."""
        for b in self.brokers:
            if member and b.proc is not None and member_key(b) in f":{member}:":
                return b
        return None

    def wait_spread(self, old: str | None, exclude: BrokerProcess | None,
                    timeout: float = 60) -> float | None:
        """Seconds until every queue is owned by a live broker other than the process
        ``old`` (a ``member_key``), each owner answering /health 200; None if not
        within ``timeout``. ``exclude`` is not asked (it may be paused)."""
        start = time.monotonic()

        def serves() -> bool:
            view = self.spread_view(exclude)
            if view is None:
                return False
            alive = {m.get("id") for m in view.get("brokers", []) if m.get("alive")}
            owners = spread_owners(view)
            held = [owners.get(q) for q in self.plan.queues]
            if any(o is None or o not in alive or (old and old in f":{o}:") for o in held):
                return False
            serving = [self.broker_of(o) for o in set(held)]
            return all(b is not None and b is not exclude and health(b)[0] == 200
                       for b in serving)

        if wait_for(serves, timeout, 0.05):
            return time.monotonic() - start
        return None

    def spread_fault(self, kind: str) -> None:
        """A fault with the queues spread: kill -9 of any broker; a pause past the lease,
        or a clean stop (SIGTERM or ``minou soft-stop``), of a broker owning queues."""
        now = time.monotonic() - self.t0
        owners = spread_owners(self.spread_view() or {})
        if kind == "kill":
            i = self.rng.randrange(3)
            at_once = self.rng.random() < 0.3
        else:
            holding = [k for k, b in enumerate(self.brokers)
                       if b.alive and any(self.broker_of(o) is b for o in owners.values())]
            i = self.rng.choice(holding or [0, 1, 2])
            at_once = False
        b = self.brokers[i]
        assert b.proc is not None
        old = member_key(b)
        mine = sorted(q for q, o in owners.items() if self.broker_of(o) is b)
        owning = f"owning {', '.join(mine) or 'no queue'}"
        rec = FaultRecord(kind, i, now, primary=bool(mine))
        offset = len(b.output)
        if kind == "kill":
            self.log(f"kill -9 broker {i} ({owning}); restart "
                     f"{'at once' if at_once else 'once its queues are served'}")
            b.kill()
            killed = time.monotonic()
            if at_once:
                self.restart(b)
            took = self.wait_spread(old, None if at_once else b)
            rec.took = None if took is None else time.monotonic() - killed
            if took is None:
                self.anomaly(f"the queues of broker {i} not served within 60 s of its "
                             "kill -9")
            if not at_once:
                self.restart(b)
            rec.outcome = f"{owning}; every queue served after {rec.took or 0:.1f} s"
        elif kind == "pause":
            self.log(f"SIGSTOP broker {i} ({owning})")
            b.proc.send_signal(signal.SIGSTOP)
            stopped = time.monotonic()
            rec.took = self.wait_spread(old, b)
            if rec.took is None:
                self.anomaly(f"the queues of paused broker {i} not adopted within 60 s")
            time.sleep(self.rng.uniform(0.0, 0.5))  # and a little more past the adoption
            b.proc.send_signal(signal.SIGCONT)
            self.log(f"SIGCONT broker {i} after {time.monotonic() - stopped:.1f} s")
            self._fenced_seen = 0
            rec.outcome = self.after_wake_spread(b, i, offset)
            fenced = b.output[offset:].count(FENCED_LOG)
            self.counts.fenced_logged += fenced
            self.counts.fenced_metric += self._fenced_seen
            rec.outcome += f"; fenced writes: {fenced} logged, {self._fenced_seen} on /metrics"
            if not b.alive:
                self.restart(b)
        else:  # a clean stop: SIGTERM (leaves the alive set) or a soft stop (hands over)
            soft = self.rng.random() < 0.5
            rec.kind = "soft-stop" if soft else "term"
            self.log(f"{'minou soft-stop' if soft else 'SIGTERM'} broker {i} ({owning})")
            stopped = time.monotonic()
            rc = self.soft_stop(b, i) if soft else b.stop()
            rec.took = self.wait_spread(old, b)
            if rc != 0:
                self.anomaly(f"broker {i} stopped with status {rc} on "
                             f"{'soft-stop' if soft else 'SIGTERM'}")
            if rec.took is None:
                self.anomaly(f"the queues of broker {i} not served within 60 s of its stop")
            rec.took = time.monotonic() - stopped
            rec.outcome = f"{owning}; exit {rc}, every queue served after {rec.took:.1f} s"
            self.restart(b)
        if rec.took is not None:
            self.counts.queues_moved += len(mine)
        self.counts.faults.append(rec)
        self.log(f"  {rec.kind} broker {rec.broker}: {rec.outcome}")
        self.wait_progress(f"{rec.kind} of broker {rec.broker}")

    def soft_stop(self, b: BrokerProcess, i: int) -> int:
        """``minou soft-stop`` of ``b`` as the admin; its exit status (-9: killed, it did
        not stop within 60 s)."""
        assert b.proc is not None
        env = {**self.brokers[0].cli_env(), "MINOU_URL": b.url}
        try:
            done = subprocess.run([sys.executable, "-m", "minou", "soft-stop", "--json"],
                                  env=env, capture_output=True, text=True, timeout=90)
        except subprocess.TimeoutExpired:
            self.anomaly(f"minou soft-stop of broker {i} did not return in 90 s")
        else:
            if done.returncode != 0:
                self.anomaly(f"minou soft-stop of broker {i} failed: "
                             f"{(done.stdout + done.stderr).strip()[-300:]}")
        try:
            return b.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.anomaly(f"broker {i} still up 60 s after minou soft-stop")
            b.kill()
            return -9

    def after_wake_spread(self, b: BrokerProcess, i: int, offset: int) -> str:
        """A spread broker woken past its lease finds its queues taken (or a write
        fenced), writes nothing more and exits 1."""
        assert b.proc is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fenced = metrics_line(b, self.admin_token(), "minou_fenced_writes_total",
                                  timeout=0.3)
            if fenced is not None:
                self._fenced_seen = max(self._fenced_seen, int(fenced))
            rc = b.proc.poll()
            if rc is not None:
                out = b.output[offset:]
                if rc == 1:
                    self.counts.pauses_exit_1 += 1
                    if (CLAIMED_LOG not in out and FENCED_LOG not in out) \
                            or LOST_LOG not in out:
                        self.anomaly(f"broker {i} exited 1 without saying why")
                else:
                    self.anomaly(f"woken broker {i} exited with status {rc}")
                why = "its queues claimed" if CLAIMED_LOG in out else \
                    "a write fenced" if FENCED_LOG in out else "?"
                return f"exited {rc} ({why})"
            time.sleep(0.05)
        self.anomaly(f"woken broker {i} did not exit within 30 s")
        return "still up"

    # -------------------------------------------------------------------- run
    def run(self) -> Counts:
        # The clients' own warnings ("reconnect failed: ...", dozens per fault) go to a
        # file beside the brokers' logs, not into the run's output.
        self.dir.mkdir(parents=True, exist_ok=True)
        client_log = logging.getLogger("minou")
        handler = logging.FileHandler(self.dir / "clients.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
        saved = client_log.propagate
        client_log.addHandler(handler)
        client_log.propagate = False
        try:
            plan = self.plan
            self.log(f"seed {plan.seed}: {plan.faults()} over "
                     f"{plan.seconds:g} s; work directory {self.dir}")
            second = ("1 HTTP consumer in group http (a queue's pattern in turn, through "
                      "one broker)") if plan.spread else "1 HTTP consumer in group http"
            self.log(f"placement {plan.placement}: {len(plan.queues)} queue(s), "
                     f"{len(plan.channels)} channels ({plan.pattern}); 3 native producers "
                     f"and 1 HTTP producer; 3 native consumers in group native, {second}")
            url = self.start_redis()
            self.start_brokers(url)
            self.log("3 brokers up: " + ", ".join(f"{i}: {b.url} {b.http}"
                                                 for i, b in enumerate(self.brokers)))
            self.start_load()
            self.t_load = time.monotonic()
            self.wait_progress("the start", 60)
            if plan.spread and self.wait_spread(None, None) is None:
                self.anomaly("the queues were not all served 60 s after the start")
            kinds = self.plan.faults()
            span = self.plan.seconds
            for k, kind in enumerate(kinds):
                due = self.t_load + span * (k + 1) / (len(kinds) + 1)
                time.sleep(max(0.0, due - time.monotonic()))
                self.fault(kind)
            time.sleep(max(0.0, self.t_load + span - time.monotonic()))
            self.finish()
            self.counts.seconds = time.monotonic() - self.t0
            return self.counts
        finally:
            self.shutdown()
            client_log.removeHandler(handler)
            client_log.propagate = saved
            handler.close()

    def finish(self) -> None:
        self.log("stopping the producers")
        for p in self.producers:
            p.stop.set()
        for p in self.producers:
            p.join(60)
        self.log(f"{len(self.ledger.confirmed)} confirmed; consumers catching up")
        groups = self.plan.groups
        # Done when every confirmed message has a confirmed ack in both groups, or when
        # the broker says neither group has anything waiting or in flight: an ack may be
        # durable though its answer was lost (the broker died first), and such a message
        # rightly never comes again. A delivery whose ack was lost comes back once its
        # lease (DELIVERY_LEASE) runs out.
        if not wait_for(lambda: self.ledger.caught_up(groups) or self.settled(groups),
                        DELIVERY_LEASE * 4, 0.5):
            self.anomaly(f"the groups still had messages waiting or in flight "
                         f"{DELIVERY_LEASE * 4:g} s after the load stopped")
        for c in self.consumers:
            c.stop.set()
        for c in self.consumers:
            c.join(60)
        for w in self.workers:
            if w.is_alive():
                self.anomaly(f"client {w.name} did not stop")
            if w.crashed is not None:
                self.anomaly(f"client {w.name} crashed: {w.crashed!r}")
        drained = self.drain()
        self.check(drained)

    def settled(self, groups: list[str]) -> bool:
        """Whether the primary says these groups have nothing waiting or in flight
        (spread: each queue's owner, for its queue)."""
        if self.plan.spread:
            view = self.spread_view()
            if view is None:
                return False
            owners = spread_owners(view)
            for q in self.plan.queues:
                b = self.broker_of(owners.get(q))
                if b is None or not self.groups_idle(b, q, groups):
                    return False
            return True
        b = self.cluster_primary()
        return b is not None and self.groups_idle(b, QUEUE, groups)

    def groups_idle(self, b: BrokerProcess, queue: str, groups: list[str]) -> bool:
        view = self.admin_get(b, f"/v1/queues/{queue}", timeout=5)
        try:
            state = {g["group"]: g for g in view["groups"]}  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return all(state.get(f"consume:{g}", {}).get("waiting") == 0
                   and state[f"consume:{g}"].get("in_flight") == 0 for g in groups)

    def drain(self) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """A fresh group from the oldest message: every message the brokers hold."""
        self.log("draining every channel with a fresh group")
        got: dict[tuple[str, int], list[tuple[str, int]]] = defaultdict(list)
        want = set(self.ledger.confirmed)
        with native_client(self.urls(0), "drain") as c:
            sub = c.consume(self.plan.pattern, group=f"final-{self.plan.seed}",
                            start="oldest", prefetch=256)
            while True:
                try:
                    msg = sub.get(timeout=3.0 if want <= got.keys() else 30.0)
                except minou.Timeout:
                    break
                p = msg.payload
                got[(msg.channel, msg.seq)].append(
                    (str(p.get("p")), int(p.get("n", -1))) if isinstance(p, dict) else ("?", -1))
                msg.ack()
        return got

    # ----------------------------------------------------------------- checks
    def _history(self, ds: list[Delivery]) -> str:
        """Each delivery of one message: when (s since the start), to whom, over which
        connection, attempt, and when its ack was confirmed (or why not)."""
        out = []
        for d in ds:
            ack = f"acked {d.acked_at - self.t0:.2f}s" if d.acked_at is not None \
                else (d.ack_error or "not settled")
            out.append(f"[{d.at - self.t0:.2f}s {d.consumer} {d.segment} attempt "
                       f"{d.attempts}, {ack}]")
        return " ".join(out)

    def check(self, drained: dict[tuple[str, int], list[tuple[str, int]]]) -> None:
        c, ledger = self.counts, self.ledger
        ex: dict[str, list[str]] = defaultdict(list)
        c.confirmed = len(ledger.confirmed)
        c.publish_failures = sum(ledger.publish_errors.values())
        c.stored = len(drained)
        c.confirmed_twice = len(ledger.confirmed_twice)
        by_payload = Counter(bodies[0] for bodies in drained.values())
        c.stored_twice = sum(n - 1 for n in by_payload.values() if n > 1)
        ex["stored twice"] += [str(p) for p, n in by_payload.items() if n > 1][:5]
        for key, payload in ledger.confirmed.items():
            if key not in drained:
                c.confirmed_lost += 1
                ex["lost"].append(f"{key} {payload}")
            elif drained[key][0] != payload:
                c.confirmed_changed += 1
                ex["changed"].append(f"{key} confirmed {payload}, found {drained[key][0]}")
        by_message: dict[tuple[str, str, int], list[Delivery]] = defaultdict(list)
        for d in sorted(ledger.deliveries, key=lambda d: d.idx):
            by_message[(d.group, d.channel, d.seq)].append(d)
            c.deliveries[d.group] = c.deliveries.get(d.group, 0) + 1
        for g in self.plan.groups:
            c.acks_confirmed[g] = len(ledger.acked[g])
            seen = {(ch, seq) for (grp, ch, seq) in by_message if grp == g}
            missing = set(ledger.confirmed) - seen
            c.undelivered[g] = len(missing)
            ex[f"undelivered {g}"] += [str(k) for k in sorted(missing)[:5]]
            # Acked for sure (nothing came again) though no ack was ever confirmed: the
            # last one's answer was lost.
            unanswered = [by_message[(g, *k)][-1] for k in ledger.confirmed
                          if k in seen and k not in ledger.acked[g]]
            c.acks_unanswered[g] = len(unanswered)
            ex[f"acks unanswered {g}"] += [f"{d.channel}#{d.seq}: {d.ack_error}"
                                            for d in unanswered[:5]]
        for (g, ch, seq), ds in by_message.items():
            acked = [d.acked_at for d in ds if d.acked_at is not None]
            first_ack = min(acked) if acked else None
            for k, d in enumerate(ds):
                if first_ack is not None and d.at > first_ack:
                    c.after_ack += 1
                    ex["after ack"].append(f"{g} {ch}#{seq} to {d.consumer} attempt "
                                           f"{d.attempts}; history: " + self._history(ds))
                if k == 0:
                    continue
                c.duplicates += 1
                # Explained: no earlier delivery of it was settled (ack confirmed).
                if any(e.acked_at is not None for e in ds[:k]):
                    c.duplicates_unexplained += 1
                    # the whole story (who, over which broker, when each ack was
                    # confirmed): an ack confirmed after this delivery, by the broker
                    # that had handed the message over again, is the case to look at
                    ex["unexplained duplicate"].append(f"{g} {ch}#{seq} {len(ds)} times; "
                                                       "history: " + self._history(ds))
                else:
                    c.duplicates_explained += 1
        # Order: within one connection (one broker session), a consumer's first
        # deliveries on a channel come in increasing seq. Redeliveries (attempts > 1, or
        # already delivered to this group) may come back out of order, by design.
        delivered_before: set[tuple[str, str, int]] = set()
        last: dict[tuple[str, str, str], int] = {}
        for d in sorted(ledger.deliveries, key=lambda d: d.idx):
            key = (d.group, d.channel, d.seq)
            again = key in delivered_before or d.attempts > 1
            delivered_before.add(key)
            if again:
                continue
            where = (d.group, d.segment, d.channel)
            if last.get(where, 0) > d.seq:
                c.order_violations += 1
                ex["order"].append(f"{d.consumer} {d.channel}: #{d.seq} after "
                                   f"#{last[where]}")
            last[where] = max(last.get(where, 0), d.seq)
        c.stale_refusals_seen = ledger.stale_refusals
        c.takeovers = sum(b.output.count(TOOK_OVER_LOG) for b in self.brokers)
        # Only a broker that was paused may lose the lease: any other loss is a primary
        # that a standby took over from while it was running (its renewals late). Spread:
        # a broker that found its queues taken (or a write fenced) without a pause.
        c.leases_lost_unpaused = sum(b.output.count(LOST_LOG) for b in self.brokers) \
            - c.pauses_exit_1 - c.pauses_standby
        for i, b in enumerate(self.brokers):
            for m in TRACEBACK.finditer(b.output):
                c.tracebacks += 1
                ex["traceback"].append(f"broker {i}: {m.group(1)[:200]}")
        c.examples = {k: v[:5] for k, v in ex.items() if v}
        errors = {"publish": dict(ledger.publish_errors), "consume": dict(ledger.consume_errors)}
        self.log(f"client errors (retried): {errors}")

    # --------------------------------------------------------------- teardown
    def shutdown(self) -> None:
        if self._admin_http is not None:
            self._admin_http.close()
        for w in self.workers:
            w.stop.set()
        for w in self.workers:
            w.join(30)
        for b in self.brokers:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.send_signal(signal.SIGCONT)  # a paused one would not stop
            b.kill()
        for r in self.redis:
            r.stop()


def spread_owners(view: dict[str, Any]) -> dict[str, str | None]:
    """{queue: the member Redis says owns it} of a spread ``/v1/cluster`` view."""
    return {q["queue"]: q.get("owner") for q in view.get("queues", []) if "queue" in q}


def member_key(b: BrokerProcess) -> str:
    """What a member id (``host:port:pid:random``) of ``b``'s current process holds."""
    return f":{b.port}:{b.proc.pid if b.proc is not None else 0}:"


def metrics_line(b: BrokerProcess, token: str, name: str, timeout: float = 2.0
                 ) -> float | None:
    """One counter from ``/metrics`` (an admin's route)."""
    try:
        r = httpx.get(b.http + "/metrics", timeout=timeout,
                      headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        return None
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", r.text, re.M)
    return float(m.group(1)) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="faults are spread over this")
    ap.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--pauses", type=int, default=2)
    ap.add_argument("--graceful", type=int, default=1)
    ap.add_argument("--rate", type=float, default=10.0, help="publishes/s per producer")
    ap.add_argument("--redis", choices=["single", "cluster"], default="single",
                    help="a Redis primary with a replica, or a Redis Cluster of three "
                         "primaries with a replica each")
    ap.add_argument("--placement", choices=["primary", "spread"], default="primary",
                    help='[storage] placement: "primary" (one primary, two standbys) or '
                         '"spread" (six queues spread over the three brokers)')
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    plan = Plan(seconds=args.seconds, seed=seed, kills=args.kills, pauses=args.pauses,
                graceful=args.graceful, rate=args.rate, redis=args.redis,
                placement=args.placement)
    workdir = Path(tempfile.mkdtemp(prefix="minou-chaos-"))
    counts = Chaos(plan, workdir, out=lambda s: print(s, flush=True)).run()
    print()
    print(counts.table())
    for what, items in counts.examples.items():
        print(f"  {what}: {'; '.join(items)}")
    for a in counts.anomalies:
        print(f"  anomaly: {a}")
    failed = failures(counts)
    if failed:
        print(f"\nFAILED (seed {seed}; logs kept in {workdir}): " + "; ".join(failed))
        return 1
    if args.keep:
        print(f"\nlogs in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nOK (seed {seed})")
    return 0


def failures(c: Counts) -> list[str]:
    """The counts that must be 0 (and the few others that are certain), as messages."""
    out = [f"{name} = {value}" for name, value in (
        ("confirmed lost", c.confirmed_lost), ("confirmed changed", c.confirmed_changed),
        ("deliveries after a confirmed ack", c.after_ack),
        ("unexplained duplicates", c.duplicates_unexplained),
        ("order violations", c.order_violations),
        ("leases lost by a primary never paused", c.leases_lost_unpaused),
        *((f"never delivered to group {g}", n) for g, n in c.undelivered.items()),
        ("anomalies", len(c.anomalies))) if value]
    if c.confirmed == 0:
        out.append("nothing was confirmed")
    pauses = sum(f.kind == "pause" for f in c.faults)
    if c.pauses_exit_1 + c.pauses_standby != pauses:
        out.append(f"{pauses} pauses, {c.pauses_exit_1} exited 1, {c.pauses_standby} standby")
    return out


if __name__ == "__main__":
    sys.exit(main())
