"""Storage on Redis: a batch is one round trip, one atomic script per queue.

Theory of operation
-------------------
Every record of a queue (``endpoint/version``) lives under its hash tag (keys.py), so
one Lua script can write a queue's whole part of a batch atomically, and Redis
Cluster shards by queue. ``apply`` plans the batch (plan.py: everything is
checked and encoded first; what cannot be stored fails with nothing sent), then sends
in one pipeline::

    MULTI
    SADD <prefix>:{shared}:queues <new queues>     (only when the batch makes queues)
    EVALSHA queue-script  <queue A> <epoch A> ops   (queues receiving messages first)
    EVALSHA queue-script  <queue B> <epoch B> ops
    EVALSHA shared-script ops                       (clients, tokens, staged txns, ...)
    EXEC
    WAIT <replicas> <timeout>                       (only when replicas > 0)

Fencing: each queue script first compares the queue's ``epoch`` key with the epoch
this storage holds for it (``epochs``, set by ``claim``); on a mismatch it writes
nothing and answers ``fenced``. ``open`` claims every queue it finds (with
``claim=True``, the default) and a queue this storage has never seen is claimed at its
first write, so one broker on Redis just works; the ownership layer will call
``claim`` under a lease.

On a Redis Cluster (``redis+cluster://``) the same commands go in stages (the
registry, the queues receiving messages, the others, the shared state), each stage to
all its nodes at once, without MULTI (a cluster refuses one over several slots), and a
claim is two steps fenced by the lease's term (``_claim_in_cluster``).

A batch over several queues is not one transaction: MULTI/EXEC keeps other clients'
commands out from between the scripts but does not roll back. What can make only part
of a batch land, and what ``apply`` raises then:

- a queue fenced: its script wrote nothing, every other script ran. ``StorageFenced``
  (a StorageError) names the fenced queues; the rest of the batch *was* written.
- a script unknown to Redis (restarted, SCRIPT FLUSH): the scripts that ran wrote
  their part. A whole batch is idempotent (puts and removals in a fixed order), so
  the scripts are loaded again and the whole batch is sent again.
- the connection lost during EXEC: applied or not, not known: StorageUnavailable,
  and the core sends what it carries again (idempotent too).

The order bounds the damage of a partial apply to duplicates, never losses:
registration before any queue write (open must find every written queue), queues
receiving messages before the others (a dead letter or a forwarded message lands
before the ack that removes its original), and shared state last (a transaction's
answer is stored only after its messages).

Out of memory: Redis refuses EXEC as a whole when it is over ``maxmemory`` and the
transaction holds a ``#!lua`` write script, so a batch is then refused whole with
nothing written: ``StorageFull``. (Inside a script Redis checks memory only before
its first write, and inside EXEC only at EXEC: a batch that crosses the limit lands
whole and the next is refused.) Batches that only settle (acks, group states,
removals) run outside MULTI with ``allow-oom`` scripts, so consumers keep acking on a
full Redis. ``max_size`` is a quota on the bytes minou's records take (the scripts
count them per queue), checked before sending, with the reserve given back once as
SQLite does.

Durable means: the scripts returned, with Redis on ``appendfsync always`` (warned
about at ``open`` otherwise), and ``WAIT`` saw ``replicas`` replicas take it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ...core.log import READ_WEIGHT_BASE, Msg, read_weight
from ...core.seq_runs import SeqRuns
from ...core.snapshot import Snapshot
from ...core.writes import WriteBatch
from ...errors import StorageFenced, StorageFull, StorageUnavailable
from ...limits import STORAGE_RESERVE_BYTES, STORAGE_RESUME_BYTES
from .. import segments
from ..segments import decode_messages
from . import client, keys, reading, scripts
from .keys import queue_base, queue_of, shared_base, split_member
from .lease import PrimaryLease
from .plan import Plan, plan
from .url import parse

log = logging.getLogger("minou.storage")
# Replies after which a whole batch is sent again (it is idempotent): Redis lost the
# scripts (restarted, SCRIPT FLUSH), or a slot moved to another node of a cluster.
_AGAIN = (redis.exceptions.NoScriptError, redis.exceptions.MovedError,
          redis.exceptions.AskError, redis.exceptions.TryAgainError)
FULL_CAUSE = "max_size reached"
WAIT_TIMEOUT_MS = 5_000  # a replica slower than this fails the commit: not confirmed
SOCKET_TIMEOUT = 10.0  # a commit Redis never answers fails rather than hangs the writer
CONNECT_TIMEOUT = 5.0
SHARED_TABLES = ("groups", "clients", "credentials", "reservations", "writers", "meta")
MIN_VERSION = (7, 0)  # script flags (#!lua) are Redis 7's
# A start reads each queue in pages: about this many bytes of special segments (those
# holding priority or delayed messages), or this many segments, removed seqs or dedup
# entries, or this many channels' worth of them, a call. So what it holds at once, and
# how long one script keeps Redis busy for everyone, is a page, not the data.
OPEN_PAGE_BYTES = 1 << 20
OPEN_PAGE_ENTRIES = 2_000  # (under Lua's unpack limit: HMGET takes a page's segments)
OPEN_PAGE_CHANNELS = 500
OPEN_QUEUES_AT_ONCE = 16  # queues a round trip, each whole within its share of a page


class RedisStorage:
    backend = "redis"
    # A Redis that went away comes back (restarted, failed over): the broker waits for
    # it, refusing publishes, rather than stopping as it does on a disk's I/O error.
    recovers = True

    def __init__(self, url: str, *, max_size: int | None = None,
                 reserve: int = STORAGE_RESERVE_BYTES, replicas: int | None = None,
                 prefix: str | None = None, claim: bool = True,
                 wait_timeout_ms: int = WAIT_TIMEOUT_MS) -> None:
        """``url``: redis:// or rediss:// (url.py). ``replicas`` and ``prefix`` override
        the URL's. ``claim``: open() claims every queue it finds (a broker); False
        leaves them to the first write (tools, tests opening beside a broker)."""
        where = parse(url)
        self.path = where.shown
        self.data_dir = self.reserve_path = self.path  # named in full-storage log lines
        self.prefix = keys.check_prefix(prefix or where.prefix)
        self.replicas = where.replicas if replicas is None else replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.max_size = max_size
        self.reserve = reserve
        self.reserve_released = False
        self.claim_on_open = claim
        self.epochs: dict[str, int] = {}  # queue -> the epoch this storage writes under
        # The broker (cluster member id) that must hold the primary lease for a claim or
        # a write of shared state to go through; "" checks nothing (tools, one broker).
        self.member = ""
        self.spread = False  # spread_as(): claims and shared writes by membership
        kw: dict[str, Any] = {"password": where.password} if where.password else {}
        self._where, self._password = where, kw
        self._client = client.connect(
            where, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=CONNECT_TIMEOUT,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 1), **kw)
        self._cluster = client.is_cluster(self._client)
        self._pool: ThreadPoolExecutor | None = None
        self._shas: dict[str, str] = {}
        self._shared = shared_base(self.prefix)
        self._lock = threading.Lock()  # the writer's knowledge, read by the reader thread
        self._known: set[str] = set()  # channels that exist
        self._born: dict[str, int] = {}  # channel -> creation order
        self._next_order = 1
        self._queues: set[str] = set()  # in the registry
        self._used: dict[str | None, int] = {}  # queue (None: shared) -> bytes
        self._group_queues: dict[str, set[str]] = {}  # where a group may have states
        self._writer_queues: dict[str, set[str]] = {}  # where a writer may have fences
        self._expiry_done: set[tuple[str, bytes]] = set()
        # The last open's (or open_queue's) reads: calls, and the largest page of
        # special segments in bytes (what bounds the memory a start needs).
        self.open_pages = 0
        self.open_largest = 0

    # ------------------------------------------------------------ errors
    @contextmanager
    def _redis(self, doing: str) -> Iterator[None]:
        """Redis's exceptions as minou's, with the URL (never the password)."""
        try:
            yield
        except redis.AuthenticationError as exc:
            raise StorageUnavailable(f"Redis at {self.path} refused the credentials "
                                     f"({exc}): check the password") from exc
        except redis.BusyLoadingError as exc:
            raise StorageUnavailable(f"Redis at {self.path} is loading its data; "
                                     f"{doing} failed, retry") from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StorageUnavailable(f"cannot reach Redis at {self.path}: {exc} "
                                     f"({doing})") from exc
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            raise StorageUnavailable(f"Redis at {self.path}: {doing} failed: {exc}") from exc

    def _sha(self, name: str) -> str:
        if not self._shas:
            self._load_scripts()
        return self._shas[name]

    def _load_scripts(self) -> None:
        with self._redis("loading scripts"):
            for name, body in {**scripts.WRITE_SCRIPTS, **scripts.READ_SCRIPTS}.items():
                self._shas[name] = self._client.script_load(body)

    def _read(self, name: str, key: str, *args: Any) -> Any:
        """Run read script ``name`` (loading the scripts again if Redis lost them)."""
        with self._redis(f"reading ({name})"):
            try:
                return self._client.evalsha(self._sha(name), 1, key, *args)
            except redis.exceptions.NoScriptError:
                self._load_scripts()
                return self._client.evalsha(self._sha(name), 1, key, *args)

    # -------------------------------------------------------------- open
    def open(self, now: float) -> Snapshot:
        with self._redis("open"):
            self._check_server()
            found = sorted(reading.text(q) for q in
                           self._client.smembers(self._shared + "queues"))
            if self.claim_on_open:
                self._claim_all(found)
            snap, used = self._read_shared(now)
        self.open_pages = 0
        self.open_largest = 0
        states, points = self._read_queues(found, now)
        reading.merge(snap, states)
        for rows in points:
            snap.meta.update((reading.text(k), reading.text(v)) for k, v in rows.items())
        with self._lock:
            self._queues = set(found)
            self._used = {q: s.used for q, s in zip(found, states, strict=True)}
            self._used[None] = used
            self._known = {r.name for r in snap.channels}
            self._born = {rec.name: born for s in states for born, rec in s.channels}
            self._next_order = max(self._born.values(), default=0) + 1
            self._group_queues = {}
            self._writer_queues = {}
            for q, s in zip(found, states, strict=True):
                self._index(q, s)
        log.debug("read %d queue(s) from Redis in %d pages, the largest %d bytes",
                  len(found), self.open_pages, self.open_largest)
        return snap

    def _read_queues(self, queues: list[str], now: float
                     ) -> tuple[list[reading.QueueState], list[dict[Any, Any]]]:
        """Every queue in ``queues`` (claimed): its state, and the stream ids clients
        gave in it (core/stream_ids.py). A few queues a round trip, each whole if it is
        within its share of a page (``HEAD``), else read in pages on its own: what is
        held at once, and what any one script does, is about a page, not the data."""
        states, points = [], []
        for i in range(0, len(queues), OPEN_QUEUES_AT_ONCE):
            group = queues[i:i + OPEN_QUEUES_AT_ONCE]
            replies = self._heads(group)
            self.open_pages += 1
            self.open_largest = max(self.open_largest, sum(
                len(body) for head in replies[0::2] if head[7] is not None
                for body in head[7][1]))
            for q, head, ids in zip(group, replies[0::2], replies[1::2], strict=True):
                state = reading.queue_head(head)
                if not reading.whole(state, head, now):
                    self._read_in_pages(q, state, now)
                states.append(state)
                points.append(ids)
            del replies  # (before the next group's come)
        return states, points

    def _heads(self, group: list[str]) -> list[Any]:
        """``HEAD`` and the stream ids of each queue of ``group``, in one round trip;
        each queue whole within its share of a page."""
        most, entries = OPEN_PAGE_BYTES // len(group), OPEN_PAGE_ENTRIES // len(group)

        def send() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for q in group:
                base = queue_base(self.prefix, q)
                pipe.execute_command("EVALSHA", self._sha("head"), 1, base + "next", base,
                                     most, entries)
                pipe.hgetall(base + "ids")
            return list(pipe.execute())

        with self._redis("reading queues"):
            try:
                return send()
            except redis.exceptions.NoScriptError:  # Redis lost them (restarted): again
                self._load_scripts()
                return send()

    def _read_in_pages(self, queue: str, q: reading.QueueState, now: float) -> None:
        """The rest of ``queue`` after its head (``q``), page by page
        (``OPEN_PAGE_BYTES`` of special segments, or ``OPEN_PAGE_ENTRIES`` entries or
        segments, a call)."""
        base = queue_base(self.prefix, queue)
        key = base + "next"  # routes every read of the queue to its slot
        names = sorted(q.heads)
        spans: dict[str, list[tuple[int, int]]] = {name: [] for name in names}
        for name, starts, metas in self._pages(key, base, "s", names):
            spans[name].extend((int(s), int(m.split(b" ", 1)[0]))
                               for s, m in zip(starts, metas, strict=True) if m is not None)
        removed: dict[str, SeqRuns] = {name: SeqRuns() for name in names}
        for name, seqs, _ in self._pages(key, base, "r", names):
            add = removed[name].add  # pages come by seq: each add extends the last run
            for r in seqs:
                add(int(r))
        for name in names:
            reading.add_channel(q, name, spans.pop(name), removed.pop(name))
        cursor, left = "0", []
        while cursor != "-" or left:
            raw, bodies, left = self._read("specials", key, base, cursor, OPEN_PAGE_BYTES,
                                           OPEN_PAGE_ENTRIES, *left)
            cursor = reading.text(raw)
            self.open_pages += 1
            self.open_largest = max(self.open_largest, sum(map(len, bodies)))
            reading.add_specials(q, bodies)
            del bodies  # (the page's bodies go before the next one comes)
        with self._redis(f"reading {queue}"):
            scan = 0
            while True:
                scan, entries = self._client.hscan(base + "dedup", scan,
                                                   count=OPEN_PAGE_ENTRIES)
                reading.add_dedup(q, entries, now)
                if not scan:
                    break

    def _pages(self, key: str, base: str, kind: str, names: list[str]
               ) -> Iterator[tuple[str, list[bytes], list[bytes | None]]]:
        """The ``PAGE`` script's pages of sorted set ``kind`` over channels ``names``:
        (channel, entries, their metas) for each channel in each page."""
        i, start = 0, "-inf"
        while i < len(names):
            chunk = names[i:i + OPEN_PAGE_CHANNELS]
            reply = self._read("page", key, base, kind, OPEN_PAGE_ENTRIES, start, *chunk)
            self.open_pages += 1
            for name, (entries, metas) in zip(chunk, reply, strict=False):
                yield name, entries, metas
            if sum(len(entries) for entries, _ in reply) >= OPEN_PAGE_ENTRIES:
                # Full: it stopped in its last channel (on an entry), which goes on.
                i += len(reply) - 1
                start = "(" + reading.text(reply[-1][0][-1])
            else:
                i, start = i + len(chunk), "-inf"

    def _check_server(self) -> None:
        version = min((str(node.info("server").get("redis_version", "0"))
                       for node in client.data_nodes(self._client)),
                      key=lambda v: tuple(int(p) for p in v.split(".")[:2]))
        if tuple(int(p) for p in version.split(".")[:2]) < MIN_VERSION:
            raise StorageUnavailable(f"Redis at {self.path} is {version}: minou needs "
                                     f"Redis {'.'.join(map(str, MIN_VERSION))} or newer")
        self._warn_settings()
        self._load_scripts()

    def _read_shared(self, now: float) -> tuple[Snapshot, int]:
        """The shared tables as a snapshot, and the bytes they use."""
        pipe = self._client.pipeline(transaction=False)
        for table in SHARED_TABLES:
            pipe.hgetall(self._shared + table)
        pipe.zrangebyscore(self._shared + "tokens", f"({now!r}", "+inf", withscores=True)
        pipe.hgetall(self._shared + "dedup")
        pipe.smembers(self._shared + "txns")
        pipe.get(self._shared + "used")
        rest = pipe.execute()
        txns = sorted(rest[-2])
        parts = self._client.pipeline(transaction=False)
        for t in txns:
            parts.hgetall(self._shared.encode() + b"txn:" + t)
        staged = dict(zip(txns, parts.execute() if txns else [], strict=True))
        tables = dict(zip(SHARED_TABLES, rest, strict=False))
        snap = reading.shared_snapshot(tables, rest[len(SHARED_TABLES)], staged,
                                       rest[len(SHARED_TABLES) + 1], now)
        return snap, int(rest[-1] or 0)

    def _index(self, q: str, state: reading.QueueState) -> None:
        """Under the lock: where ``q`` holds group states and writer fences."""
        for g in state.groups:
            self._group_queues.setdefault(g, set()).add(q)
        for w in state.writers:
            self._writer_queues.setdefault(w, set()).add(q)

    # ----------------------------------------------- queues spread over brokers
    def spread_as(self, member: str) -> None:
        """From now on this storage belongs to broker ``member`` among brokers that
        spread the queues: it claims a queue only while no other live broker owns it,
        and writes shared state only while ``member`` is alive (its record in the alive
        set, kept by ``lease.PrimaryLease``'s records)."""
        self.member = member
        self.spread = True

    def open_shared(self, now: float) -> Snapshot:
        """The state no queue owns (clients, groups, reservations, staged
        transactions...), and no queue: each comes with ``open_queue``."""
        with self._redis("open"):
            self._check_server()
            found = {reading.text(q) for q in self._client.smembers(self._shared + "queues")}
            snap, used = self._read_shared(now)
        with self._lock:
            self._queues = found
            self._used = {None: used}
            self._known, self._born = set(), {}
            self._group_queues, self._writer_queues = {}, {}
        return snap

    def open_queue(self, queue: str, now: float) -> Snapshot:
        """Claim ``queue`` (its epoch goes up: its previous owner's writes are refused)
        and read it. StorageFenced naming the owner while another live broker owns it."""
        self._own([queue])
        self.open_pages = 0
        self.open_largest = 0
        [state], [points] = self._read_queues([queue], now)
        with self._redis(f"opening {queue}"):
            groups = self._client.hgetall(self._shared + "groups")
        snap = reading.shared_snapshot(
            {t: [] for t in SHARED_TABLES} | {"groups": groups, "meta": points},
            [], {}, [], now)
        reading.merge(snap, [state])
        with self._lock:
            self._queues.add(queue)
            self._used[queue] = state.used
            for born, rec in state.channels:
                self._known.add(rec.name)
                self._born[rec.name] = born
            self._next_order = max(self._next_order, max(self._born.values(), default=0) + 1)
            self._index(queue, state)
        return snap

    def release_queue(self, queue: str) -> bool:
        """Hand ``queue`` over: forget it here (a write that touches it again claims it
        again, if no other live broker owns it by then) and let the next live broker
        claim it at once. Whether it was still this broker's."""
        with self._redis(f"handing {queue} over"):
            mine = self._client.evalsha(self._sha("disown"), 1, self._shared + "owners",
                                        self.member, queue)
        with self._lock:
            self.epochs.pop(queue, None)
            self._used.pop(queue, None)
            gone = {name for name in self._known if queue_of(name) == queue}
            self._known -= gone
            for name in gone:
                self._born.pop(name, None)
            for index in (self._group_queues, self._writer_queues):
                for qs in index.values():
                    qs.discard(queue)
        return bool(mine)

    def bind_writer(self, writer_id: str, client_id: str) -> str:
        """Make Spark writer ``writer_id`` ``client_id``'s in Redis unless it is
        another's already (atomic: the first broker to ask wins); the client it is."""
        return reading.text(self._read("bind_writer", self._shared + "used", self._shared,
                                       writer_id, client_id))

    def claim_token(self, jti: str, expires: float) -> bool:
        """Record a HELLO token's id as used unless a broker did already (atomic: the
        first to ask wins); whether this call recorded it."""
        return int(self._read("claim_token", self._shared + "used", self._shared, jti,
                              repr(float(expires)))) == 1

    def owners(self) -> dict[str, str]:
        """Every owned queue and the broker owning it (live or not)."""
        with self._redis("reading the owners"):
            raw = self._client.hgetall(self._shared + "owners")
        return {reading.text(q): reading.text(m) for q, m in raw.items()}

    def _own(self, queues: list[str]) -> None:
        """Claim ``queues`` for this (spreading) broker: StorageFenced for those another
        live broker owns, or all of them if this broker's own record ran out."""
        if self._cluster:
            replies = self._own_in_cluster(queues)
        else:
            commands = []
            for q in queues:
                base = queue_base(self.prefix, q)
                commands.append((0, base + "epoch", (
                    "EVALSHA", self._sha("own"), 4, self._shared + "owners",
                    self._shared + "alive", self._shared + "queues", base + "epoch",
                    self.member, q)))
            replies = self._run(commands, atomic=False, doing="claiming queues",
                                what="claiming " + ", ".join(queues))
        refused: dict[str, int] = {}
        holder = ""
        for q, (status, value) in zip(queues, replies, strict=True):
            if status == b"ok":
                self.epochs[q] = int(value)
            else:
                refused[q] = 0
                holder = reading.text(value) if status == b"owned" else ""
        if refused:
            raise StorageFenced(
                f"Redis at {self.path}: {', '.join(sorted(refused))} "
                + (f"owned by {holder}, alive" if holder else
                   "not claimed: this broker's own record in the alive set ran out"),
                refused, holder)

    def _warn_settings(self) -> None:
        """What Redis must be set to for a confirmed publish to survive; CONFIG may be
        disabled (managed Redis): then say nothing."""
        for node in client.data_nodes(self._client):
            try:
                conf = node.config_get("append*") | node.config_get("maxmemory-policy")
            except redis.ResponseError:
                return
            if self._warn_about(conf):
                return  # once, not once per cluster node

    def _warn_about(self, conf: dict[str, Any]) -> bool:
        warned = False
        if conf.get("appendonly") != "yes":
            log.warning("Redis at %s has appendonly %s: confirmed messages are lost if "
                        "Redis stops; run it with --appendonly yes --appendfsync always",
                        self.path, conf.get("appendonly"))
            warned = True
        elif conf.get("appendfsync") != "always":
            log.warning("Redis at %s has appendfsync %s: a confirmed message may be lost "
                        "if the machine stops; set appendfsync always", self.path,
                        conf.get("appendfsync"))
            warned = True
        policy = conf.get("maxmemory-policy", "noeviction")
        if policy != "noeviction":
            log.warning("Redis at %s has maxmemory-policy %s: it may evict minou's data "
                        "when full; set maxmemory-policy noeviction", self.path, policy)
            warned = True
        return warned

    # ----------------------------------------------------------- claims
    def lease(self, member: str, lease_s: float) -> PrimaryLease:
        """The primary lease of this prefix, for broker ``member``; from now on this
        storage claims queues and writes shared state only while ``member`` holds it."""
        self.member = member
        # A client of its own with timeouts well under the lease: a renewal that Redis
        # never answers (a partition) fails in time for the broker to step down.
        timeout = max(0.25, lease_s / 2)
        own = client.connect(self._where, socket_timeout=timeout,
                             socket_connect_timeout=timeout,
                             retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 1),
                             **self._password)
        return PrimaryLease(own, self.prefix, member, lease_s)

    def claim(self, queue: str) -> int:
        """Take ``queue`` over: its epoch goes up, fencing every earlier writer, and this
        storage writes under the new one. Returns it."""
        if self._cluster:
            self._claim_all([queue], check_lease=False)
            return self.epochs[queue]
        pipe = self._client.pipeline(transaction=False)
        pipe.incr(queue_base(self.prefix, queue) + "epoch")
        self._wait_for_replicas(pipe)
        with self._redis(f"claiming {queue}"):
            replies = pipe.execute()
        self._replicated(replies, f"the claim of {queue}")
        epoch = int(replies[0])
        self.epochs[queue] = epoch
        return epoch

    # A claim is used only once the replicas a commit waits for have it too. Otherwise
    # a Redis failover could lose it and roll the epoch back: another broker claiming on
    # the promoted replica would get the same epoch number, and both would pass the
    # fence. Waited for, a claim survives any failover a confirmed commit survives. (The
    # lease needs no WAIT of its own: it only says who may claim and write shared state,
    # and a claim, waited for, carries the lease before it in the replication stream.)
    def _wait_for_replicas(self, pipe: Any) -> None:
        if self.replicas > 0:
            pipe.execute_command("WAIT", self.replicas, self.wait_timeout_ms)

    def _replicated(self, replies: list[Any], what: str) -> None:
        """StorageUnavailable unless the WAIT ending ``replies`` saw enough replicas."""
        if self.replicas <= 0:
            return
        acked = int(replies[-1]) if not isinstance(replies[-1], Exception) else 0
        if acked < self.replicas:
            raise StorageUnavailable(
                f"Redis at {self.path}{self._at()}: {what} reached {acked} of "
                f"{self.replicas} replica(s) within {self.wait_timeout_ms} ms: not "
                "confirmed")

    def _at(self) -> str:
        """`` (primary host:port)`` under Sentinel: which Redis answered."""
        address = client.primary_address(self._client)
        return f" (primary {address})" if address else ""

    def _own_in_cluster(self, queues: list[str]) -> list[Any]:
        """The two steps of a spreading broker's claim under Redis Cluster (scripts.OWN
        with the term counter): owner and term in the shared slot, then each epoch in
        its own."""
        shared = self._shared
        owned = self._run([(0, shared + "owners", (
            "EVALSHA", self._sha("own"), 4, shared + "owners", shared + "alive",
            shared + "queues", shared + "ownterm", self.member, q)) for q in queues],
            atomic=False, doing="claiming queues", what="claiming " + ", ".join(queues))
        commands = []
        for q, (status, term) in zip(queues, owned, strict=True):
            if status == b"ok":
                base = queue_base(self.prefix, q)
                commands.append((0, base + "epoch", ("EVALSHA", self._sha("claim_term"), 2,
                                                  base + "epoch", base + "term", term)))
        raised = iter(self._run(commands, atomic=False, doing="claiming queues",
                                what="claiming " + ", ".join(queues)) if commands else [])
        replies = []
        for status, value in owned:
            if status != b"ok":
                replies.append([status, value])
                continue
            reply = next(raised)
            # A later claim (another broker, this one's record ran out meanwhile) won.
            replies.append(reply if reply[0] == b"ok" else [b"owned", b""])
        return replies

    def _claim_all(self, queues: list[str], *, check_lease: bool = True) -> None:
        if not queues:
            return
        member = self.member if check_lease else ""
        if self._cluster:
            replies = self._claim_in_cluster(queues, member)
        else:
            commands = [(0, queue_base(self.prefix, q) + "epoch",
                         ("EVALSHA", self._sha("claim"), 3, queue_base(self.prefix, q) + "epoch",
                          self._shared + "primary", self._shared + "queues", member, q))
                        for q in queues]
            replies = self._run(commands, atomic=False, doing="claiming queues",
                                what="claiming " + ", ".join(queues))
        refused: dict[str, int] = {}
        holder = ""
        for q, (status, value) in zip(queues, replies, strict=True):
            if status == b"ok":
                self.epochs[q] = int(value)
            else:
                refused[q] = 0
                holder = value.decode() if isinstance(value, bytes) else str(value)
        if refused:
            raise StorageFenced(
                f"Redis at {self.path}: this broker no longer holds the primary lease "
                f"(held by {holder or 'nobody'}): it may not claim {', '.join(sorted(refused))}",
                refused, holder)

    def _claim_in_cluster(self, queues: list[str], member: str) -> list[Any]:
        """The two steps of a claim under Redis Cluster (scripts.ADMIT): the lease and
        the registry in the shared slot, then each queue's epoch in its own."""
        admit = self._run([(0, self._shared + "primary",
                            ("EVALSHA", self._sha("admit"), 3, self._shared + "primary",
                             self._shared + "queues", self._shared + "term", member, *queues))],
                          atomic=False, doing="claiming queues", what="entering queues")
        status, term = admit[0]
        if status != b"ok":
            return [admit[0]] * len(queues)
        commands = []
        for q in queues:
            base = queue_base(self.prefix, q)
            commands.append((0, base + "epoch", ("EVALSHA", self._sha("claim_term"), 2,
                                              base + "epoch", base + "term", term)))
        replies = self._run(commands, atomic=False, doing="claiming queues",
                            what="claiming " + ", ".join(queues))
        # A later term claimed it: this broker lost the lease meanwhile; say who holds it.
        return [r if r[0] == b"ok" else [b"fenced", self._holder()] for r in replies]

    def _holder(self) -> bytes:
        with self._redis("reading the primary lease"):
            return bytes(self._client.get(self._shared + "primary") or b"")

    def _run(self, commands: list[tuple[int, str, tuple[Any, ...]]], *, atomic: bool,
             doing: str, what: str) -> list[Any]:
        """Run ``commands`` (a stage, a key that routes it, its arguments) in order and
        return their replies. One Redis: one round trip, ``[MULTI] commands [EXEC]
        [WAIT]``. Redis Cluster: stage after stage (what must land first does), and in
        a stage one such round trip per node, all nodes at once; no MULTI (Redis Cluster
        refuses one over several slots, even on one node). Raises StorageFull on
        Redis's out-of-memory, StorageUnavailable when Redis cannot be reached, a
        command failed or a WAIT saw too few replicas. Loads the scripts again and runs
        everything again (idempotent) once if Redis lost them or a slot moved."""
        atomic = atomic and not self._cluster
        for attempt in (1, 2):
            stages: dict[int, dict[Any, list[int]]] = {}  # stage -> node -> command indexes
            for i, (stage, key, _) in enumerate(commands):
                node = client.node_client(self._client, key)
                stages.setdefault(0 if not self._cluster else stage, {}).setdefault(
                    node, []).append(i)
            results: list[Any] = [None] * len(commands)
            raws: list[list[Any]] = []
            for stage in sorted(stages):
                nodes = stages[stage]
                runs = [(node, [commands[i][2] for i in idx]) for node, idx in nodes.items()]
                if len(runs) == 1:
                    replies = [self._round_trip(*runs[0], atomic=atomic, doing=doing)]
                else:
                    replies = list(self._nodes_pool().map(
                        lambda run: self._round_trip(*run, atomic=atomic, doing=doing), runs))
                for idx, (raw, out) in zip(nodes.values(), replies, strict=True):
                    raws.append(raw)
                    if len(out) != len(idx):  # refused whole (MULTI): one error for all
                        out = [out[0]] * len(idx)
                    for i, r in zip(idx, out, strict=True):
                        results[i] = r
                if any(isinstance(r, Exception) for r in results):
                    break  # the later stages wait for the earlier ones to land
            if attempt == 1 and any(isinstance(r, _AGAIN) for r in results):
                if any(isinstance(r, redis.exceptions.NoScriptError) for r in results):
                    self._load_scripts()
                else:
                    client.relearn(self._client)
                continue
            break
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            partial = not atomic or len(raws) > 1  # (a cluster's nodes)
            raise StorageUnavailable(f"Redis at {self.path}: {what} failed: {errors[0]}"
                                     + (" (other queues' parts may be written)" if partial
                                        else "")) from errors[0]
        for raw in raws:
            self._replicated(raw, what)
        return results

    def _round_trip(self, node: Any, group: list[tuple[Any, ...]], *, atomic: bool,
                    doing: str) -> tuple[list[Any], list[Any]]:
        """``[MULTI] group [EXEC] [WAIT]`` on one Redis: (what it answered, the commands'
        own replies)."""
        pipe = node.pipeline(transaction=False)
        if atomic:
            pipe.execute_command("MULTI")
        for args in group:
            pipe.execute_command(*args)
        if atomic:
            pipe.execute_command("EXEC")
        if self.replicas > 0:
            pipe.execute_command("WAIT", self.replicas, self.wait_timeout_ms)
        with self._redis(doing):
            raw = pipe.execute(raise_on_error=False)
        return raw, self._results(raw, atomic)

    def _nodes_pool(self) -> ThreadPoolExecutor:
        """Threads that talk to a cluster's nodes at once (one each, at most 16)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(16, thread_name_prefix="minou-redis-node")
        return self._pool

    # ------------------------------------------------------------ apply
    def apply(self, batch: WriteBatch) -> None:
        """Make ``batch`` durable (see the module docstring for what a partial apply
        can be). Raises StorageFull (max_size or Redis maxmemory: nothing written),
        StorageFenced (those queues written nothing, the rest written),
        StorageUnavailable (Redis unreachable or a replica short)."""
        with self._lock:
            p = plan(batch, known=self._known, next_order=self._next_order,
                     group_queues=self._group_queues, writer_queues=self._writer_queues)
        self._check_quota(p.grow)
        new = [q for q in p.queues if q not in self.epochs]
        if new and self.spread:
            self._own(new)
        elif new:
            self._claim_all(new)
        # Registrations get through a full Redis as acks do (a client must be able to
        # connect to drain it); the registry is bounded (pending clients are capped).
        settles_only = not (batch.messages or batch.staged or batch.txn_done or batch.dedup
                            or p.created or set(p.queues) - self._queues)
        replies = self._send(p, atomic=not settles_only)
        self._learn(p, replies)

    def _check_quota(self, grow: int) -> None:
        if self.max_size is None or grow <= 0:
            return
        limit = self.max_size + (self.reserve if self.reserve_released else 0)
        if self.size_bytes() + grow > limit:
            raise self._full(FULL_CAUSE)

    def _send(self, p: Plan, *, atomic: bool) -> dict[str | None, Any]:
        """Replies by queue (None: shared); one round trip on one Redis (``_run``)."""
        order = sorted(p.queues, key=lambda q: (q not in p.inserting, q))
        unregistered = sorted(set(p.queues) - self._queues)
        suffix = "" if atomic else "_oom"
        # Stages (Redis Cluster sends one after the other): the registry, the queues
        # receiving messages, the other queues, the shared state.
        commands: list[tuple[int, str, tuple[Any, ...]]] = []
        if unregistered:
            commands.append((0, self._shared + "queues",
                             ("SADD", self._shared + "queues", *unregistered)))
        for q in order:
            base = queue_base(self.prefix, q)
            commands.append((1 if q in p.inserting else 2, base + "epoch",
                             ("EVALSHA", self._sha("queue" + suffix), 1, base + "epoch",
                              base, self.epochs[q], *p.queues[q])))
        if p.shared:
            check = (("A" if self.spread else "P"), self.member) if self.member else ()
            commands.append((3, self._shared + "used",
                             ("EVALSHA", self._sha("shared" + suffix), 1, self._shared + "used",
                              self._shared, *check, *p.shared)))
        results = self._run(commands, atomic=atomic, doing="commit", what="the commit")
        places: list[str | None] = [*order, *([None] if p.shared else [])]
        skip = 1 if unregistered else 0  # SADD's reply
        return dict(zip(places, results[skip:skip + len(places)], strict=True))

    def _results(self, raw: list[Any], atomic: bool) -> list[Any]:
        """The commands' own replies (inside EXEC's); OOM anywhere -> StorageFull."""
        if self.replicas > 0:
            raw = raw[:-1]
        if atomic:
            queued, executed = raw[1:-1], raw[-1]
            oom = [e for e in queued if isinstance(e, redis.exceptions.OutOfMemoryError)]
            if oom:
                raise self._full(f"Redis maxmemory reached: {oom[0]}", redis_oom=True)
            again = [e for e in queued if isinstance(e, _AGAIN)]
            if again:  # refused at MULTI time (a slot moved): EXEC ran nothing
                return again
            if isinstance(executed, Exception):
                raise StorageUnavailable(f"Redis at {self.path}: commit refused: "
                                         f"{executed}; nothing was written") from executed
            raw = executed
        for r in raw:
            if isinstance(r, redis.exceptions.OutOfMemoryError):
                raise self._full(f"Redis maxmemory reached: {r}", redis_oom=True)
        return list(raw)

    def _learn(self, p: Plan, replies: dict[str | None, Any]) -> None:
        """What a commit taught: channels made, bytes used, where states and fences are.
        Then StorageFenced if some queue refused."""
        fenced = {q: int(r[1]) for q, r in replies.items()
                  if q is not None and r[0] == b"fenced"}
        shared = replies.get(None)
        holder = ""
        if shared is not None and shared[0] == b"fenced":
            holder = shared[1].decode() if isinstance(shared[1], bytes) else str(shared[1])
        with self._lock:
            self._queues |= set(p.queues)
            for place, r in replies.items():
                if r[0] == b"ok":
                    self._used[place] = int(r[1])
            for name, order in p.created.items():
                if queue_of(name) not in fenced:
                    self._known.add(name)
                    self._born[name] = order
            for name in p.forgotten:
                if queue_of(name) not in fenced:
                    self._known.discard(name)
                    self._born.pop(name, None)
            self._next_order += len(p.created)
            for index, found in ((self._group_queues, p.group_queues),
                                 (self._writer_queues, p.writer_queues)):
                for key, qs in found.items():
                    index.setdefault(key, set()).update(qs)
        if shared is not None and shared[0] == b"fenced":
            raise StorageFenced(
                f"Redis at {self.path}: the primary lease is held by {holder or 'nobody'}, "
                "not this broker: its shared state was not written", fenced, holder)
        if fenced:
            raise StorageFenced(
                f"Redis at {self.path}: queue(s) {', '.join(sorted(fenced))} were claimed by "
                "another broker: nothing written for them (the rest of the batch was)",
                fenced)

    # ------------------------------------------------------------- space
    def _full(self, cause: str, *, redis_oom: bool = False) -> StorageFull:
        try:
            space = self.space()
        except StorageUnavailable:
            space = {"disk_free": 0, "used": self.size_bytes(), "free": 0,
                     "max_size": self.max_size}
        released = False
        if not redis_oom:  # the reserve is above max_size; Redis's own limit has none
            released = not self.reserve_released and self.reserve > 0
            self.reserve_released = True
        return StorageFull(self.full_message(space, cause), data_dir=self.path,
                           free_bytes=space["free"], disk_free_bytes=space["disk_free"],
                           cause=cause, reserve_released=released, max_size=self.max_size)

    def full_message(self, space: dict[str, Any], cause: str = FULL_CAUSE) -> str:
        return segments.full_text(cause, f"the Redis store {self.path} (prefix "
                                  f"{self.prefix})", space, "of Redis memory free")

    def _memory(self) -> tuple[int, int]:
        """Redis's (used_memory, limit): maxmemory, or the machine's memory if unset. Of
        a cluster, the node with the least room: the first to refuse its queues."""
        found = []
        with self._redis("reading INFO memory"):
            for node in client.data_nodes(self._client):
                info = node.info("memory")
                limit = int(info.get("maxmemory") or 0) or \
                    int(info.get("total_system_memory") or 0)
                found.append((int(info.get("used_memory", 0)), limit))
        return min(found, key=lambda used_limit: used_limit[1] - used_limit[0])

    def space(self) -> dict[str, Any]:
        used_memory, limit = self._memory()
        disk_free = max(0, limit - used_memory)
        used = self.size_bytes()
        out = {"disk_free": disk_free, "used": used, "free": disk_free,
               "max_size": self.max_size}
        if self.max_size is not None:
            out["free"] = min(disk_free, max(0, self.max_size - used))
        return out

    def probe(self) -> tuple[bool, dict[str, Any]]:
        """After StorageFull: room under max_size, and under Redis's maxmemory. After
        StorageUnavailable: raises it while Redis, or the replicas a commit waits for,
        cannot be reached."""
        if self._cluster:  # a node failed over meanwhile: ask the cluster which serves now
            with self._redis("reading the cluster's slots"):
                client.relearn(self._client)
        if self.replicas > 0:
            with self._redis("reading INFO replication"):
                linked = min(int(node.info("replication").get("connected_slaves", 0))
                             for node in client.data_nodes(self._client))
            if linked < self.replicas:
                raise StorageUnavailable(f"Redis at {self.path}{self._at()} has {linked} "
                                         f"replica(s) connected; commits wait for "
                                         f"{self.replicas}")
        space = self.space()
        need = STORAGE_RESUME_BYTES
        if self.max_size is not None:
            need = min(need, self.max_size // 4)
        used_memory, limit = self._memory()
        room = (self.max_size is None or self.max_size - space["used"] >= need) and \
            limit - used_memory >= min(STORAGE_RESUME_BYTES, limit // 4)
        if room:
            self.reserve_released = False
        return room, space

    def size_bytes(self) -> int:
        """Bytes minou's records take, as the scripts count them (not Redis's overhead)."""
        with self._lock:
            return sum(self._used.values())

    # ----------------------------------------------------------- reading
    def read_range(self, channel: str, from_seq: int, to_seq: int, limit: int,
                   max_bytes: int | None = None) -> list[Msg]:
        queue = queue_of(channel)
        if queue is None or limit <= 0:
            return []
        base = queue_base(self.prefix, queue)
        out: list[Msg] = []
        lo = from_seq
        size, most = 0, max_bytes if max_bytes is not None else 1 << 62
        while True:
            # The script stops fetching segments past the byte budget too (0: none).
            first, bodies, removed, more = self._read(
                "read", base + "next", base, channel, lo, to_seq, limit - len(out),
                max(most - size, 1) if max_bytes is not None else 0)
            start, gone, last = max(lo, int(first), 0), {int(r) for r in removed}, None
            for body in bodies:
                for m in decode_messages(body):
                    last = m.seq
                    if start <= m.seq < to_seq and m.seq not in gone:
                        out.append(m)
                        size += read_weight(m) if m.headers else len(m.data) + READ_WEIGHT_BASE
                        if len(out) >= limit or size >= most:
                            return out
            if not more or last is None:  # removed seqs left the page short: read on
                return out
            if last < lo:  # the script stops only after a segment in range
                raise StorageUnavailable(f"reading {channel!r} from seq {lo} made no "
                                         "progress (a damaged segment index?)")
            lo = last + 1

    def expired(self, now: float, limit: int) -> list[Msg]:
        with self._lock:
            queues = sorted(self._queues)
            born = dict(self._born)
        pipe = self._client.pipeline(transaction=False)
        for q in queues:
            pipe.zrangebyscore(queue_base(self.prefix, q) + "exp", "-inf", repr(now),
                               withscores=True)
        with self._redis("reading expiries"):
            due = pipe.execute() if queues else []
        found = []
        for q, members in zip(queues, due, strict=True):
            for raw, score in members:
                if (q, raw) not in self._expiry_done:
                    channel, first = split_member(raw)
                    found.append((score, born.get(channel, 1 << 62), channel, first, q, raw))
        found.sort()
        found = found[:max(limit, 0)]
        by_queue: dict[str, list[bytes]] = {}
        for *_, q, raw in found:
            by_queue.setdefault(q, []).append(raw)
        segs: dict[tuple[str, bytes], Any] = {}
        for q, raws in by_queue.items():
            base = queue_base(self.prefix, q)
            for raw, body, first, removed in self._read("segments", base + "next", base, *raws):
                segs[q, raw] = (body, int(first), {int(r) for r in removed})
        out: list[Msg] = []
        for *_, q, raw in found:
            if (q, raw) not in segs:
                continue
            body, first, removed = segs[q, raw]
            msgs = decode_messages(body)
            hits = [m for m in msgs if m.expires_at is not None and m.expires_at <= now
                    and m.seq >= first and m.seq not in removed]
            if not hits and all(m.expires_at is None or m.expires_at <= now for m in msgs):
                self._expiry_done.add((q, raw))  # nothing left to expire here
            out.extend(hits)
            if len(out) >= limit:
                break
        return out[:limit]

    def retained_until(self, channel: str, below: int, cutoff: float) -> int | None:
        queue = queue_of(channel)
        if queue is None:
            return None
        base = queue_base(self.prefix, queue)

        def first_at_or_after(seq: int) -> tuple[int, float] | None:
            found = self._read("first_at_or_after", base + "next", base, channel, seq, below)
            if not found:
                return None
            return int(found[0]), float(found[1].split(b" ", 1)[1])

        def body_of(seq: int) -> bytes:
            with self._redis("reading a segment"):
                return bytes(self._client.hget(base + "b:" + channel, str(seq)) or b"")

        return segments.retained_until(first_at_or_after, body_of, below, cutoff)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        client.close(self._client)

