"""The peer drivers of ``bench/minou_bench.py``: Redis Streams, NATS JetStream and
RabbitMQ driven by Python asyncio clients on uvloop, plus the worker and measurement
helpers every row of the bench (minou's too) goes through.

The method is the one the earlier peer figures in docs/benchmarks.md were measured
with, unchanged, so new runs stay comparable with them:

* Redis Streams: one stream (``bench_q``) with one consumer group (``bench_g``);
  publish = ``XADD`` pipelined ``window`` per round trip (no MULTI); consume =
  ``XREADGROUP COUNT batch BLOCK 100`` then one ``XACK`` for the whole batch.
* RabbitMQ: a durable classic queue on the default exchange; publish = persistent
  messages on a channel with publisher confirms, at most ``window`` unconfirmed
  (a semaphore, one task per publish); consume = ``basic_consume`` with prefetch
  ``batch``, one manual ack per message.
* NATS JetStream: a file-storage stream with work-queue retention and one durable
  pull consumer (explicit ack, ack wait 60 s, max_ack_pending 50,000); publish =
  ``publish_async`` (one PubAck per message), at most 1000 pending; consume =
  ``fetch(batch, timeout=0.2)``, one ack per message.
* Latency: the producer puts ``time.monotonic_ns()`` in the first 8 bytes of the
  payload just before the publish call; the consumer subtracts it from the clock when
  it has the message in hand (before acking). CLOCK_MONOTONIC is shared by all
  processes of the machine.

Every producer / consumer is its own process (multiprocessing spawn, see
``bench_clients.run_jobs``) running ``worker_entry``: uvloop, one connection,
then all processes of a test start on one barrier. ``throughput`` counts messages
over [earliest start, latest finish]; ``settle`` waits for the server to be idle
between steps.

The peer *servers* are started by ``bench_servers.PeerServer`` on free ports; the
orchestrator writes those ports into ``PEERS`` in each worker. ``bench_clients``
wraps ``make_peer`` to add minou's own client (``minou``, ``minou-json``,
``minou-http``), which is why ``_worker`` looks ``make_peer`` up at call time.
This module is imported by name (``peers``) in every spawned worker, from ``bench/``
on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import struct
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

QUEUE = "bench_q"  # RabbitMQ queue, Redis stream key
GROUP = "bench_g"  # Redis consumer group
NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.q"
NATS_CONSUMER = "work"
NATS_MAX_PENDING = 1000  # publish_async PubAcks outstanding at most

# peer name -> client kind and port (the orchestrator overwrites the ports)
PEERS: dict[str, dict[str, Any]] = {
    "redis-aof": {"kind": "redis", "port": 6379},   # AOF, appendfsync everysec
    "redis-mem": {"kind": "redis", "port": 6380},   # no persistence
    "rabbitmq": {"kind": "rabbitmq", "port": 5672},
    "nats-js": {"kind": "nats", "port": 4222},      # JetStream, file storage
}

TS = struct.Struct("<q")  # monotonic ns at publish time, then padding to the size


def now_ns() -> int:
    return time.monotonic_ns()


def make_body(size: int, ts: int | None = None) -> bytes:
    """``size`` bytes; with ``ts`` its first 8 bytes carry that timestamp."""
    if ts is None:
        return b"x" * size
    return TS.pack(ts) + b"x" * (size - TS.size)


def _due(t0: float, rate: float, total: int) -> int:
    """Messages a paced producer should have sent by now (one ahead, as a tick)."""
    return min(total, int((time.monotonic() - t0) * rate) + 1)


# uvloop (libuv) keeps its timers in whole milliseconds and rounds a shorter sleep down to
# none: a producer that awaited the 0.5 ms to its next message at 2,000 msg/s spun its
# loop at 100 % of a core, a core of this 2-core machine taken from the broker under test
# and its consumer (docs/benchmarks.md, "The paced producer spun a core"). So a wait
# shorter than a timer tick is slept in the kernel, after a few loop turns have written
# what the client queued (minou's client writes on the next turn, nats-py's flusher
# task a turn or two later).
PACE_TIMER_S = 0.0015
PACE_TURNS = 3


async def pace(t0: float, sent: int, rate: float) -> None:
    """Wait until the message after ``sent`` is due at ``rate`` from ``t0``, sending
    nothing meanwhile and without spinning."""
    wait = t0 + sent / rate - time.monotonic()
    if wait >= PACE_TIMER_S:
        await asyncio.sleep(wait)
        return
    for _ in range(PACE_TURNS):
        await asyncio.sleep(0)
    wait = t0 + sent / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)  # below the loop's timer resolution, see above





# ------------------------------------------------------------------- drivers
class _Peer:
    """A peer broker's driver: connect, publish, consume, close (on 127.0.0.1:port)."""

    def __init__(self, port: int) -> None:
        self.port = port


class RedisPeer(_Peer):
    """Redis Streams through redis-py's asyncio client (hiredis parser if installed)."""

    async def connect(self) -> None:
        import redis.asyncio as aioredis

        self.r = aioredis.Redis(host="127.0.0.1", port=self.port)
        await self.r.ping()

    async def close(self) -> None:
        await self.r.aclose()

    async def reset(self) -> None:
        await self.r.delete(QUEUE)
        await self.r.xgroup_create(QUEUE, GROUP, id="0", mkstream=True)

    async def depth(self) -> int:
        return await self.r.xlen(QUEUE)

    async def _xadd_many(self, bodies: list[bytes]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd(QUEUE, {b"d": body})
        await pipe.execute()

    async def publish(self, n: int, size: int, window: int,
                      deadline: float) -> tuple[int, int]:
        """``XADD`` pipelined, ``window`` commands per round trip."""
        body = make_body(size)
        sent = 0
        while sent < n and time.monotonic() < deadline:
            k = min(window, n - sent)
            await self._xadd_many([body] * k)
            sent += k
        return sent, 0

    async def publish_paced(self, rate: float, duration: float, size: int) -> int:
        """The messages due at ``rate`` are sent as one pipeline per tick."""
        total = int(rate * duration)
        t0 = time.monotonic()
        sent = 0
        while sent < total:
            due = _due(t0, rate, total)
            if due > sent:
                await self._xadd_many([make_body(size, now_ns()) for _ in range(due - sent)])
                sent = due
            await pace(t0, sent, rate)
        return sent

    async def consume(self, target: int, batch: int, deadline: float, idle_s: float,
                      name: str, lat: list[int] | None = None) -> tuple[int, float]:
        """``XREADGROUP COUNT batch`` (blocking 100 ms), one ``XACK`` per batch."""
        r = self.r
        count = 0
        last = time.monotonic()
        while count < target:
            t = time.monotonic()
            if t >= deadline or t - last > idle_s:
                break
            resp = await r.xreadgroup(GROUP, name, {QUEUE: ">"}, count=batch, block=100)
            if not resp:
                continue
            entries = resp[0][1]
            if lat is not None:
                tn = now_ns()
                lat.extend(tn - TS.unpack_from(fields[b"d"])[0] for _id, fields in entries)
            await r.xack(QUEUE, GROUP, *[entry_id for entry_id, _fields in entries])
            count += len(entries)
            last = time.monotonic()
        return count, last


class RabbitPeer(_Peer):
    """RabbitMQ through aio-pika: durable classic queue, persistent messages,
    publisher confirms."""

    async def connect(self) -> None:
        import aio_pika

        self.aio_pika = aio_pika
        self.conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.port}/")
        self.ch = await self.conn.channel(publisher_confirms=True)

    async def close(self) -> None:
        await self.conn.close()

    async def reset(self) -> None:
        await self.ch.queue_delete(QUEUE)
        await self.ch.declare_queue(QUEUE, durable=True)

    async def depth(self) -> int:
        q = await self.ch.declare_queue(QUEUE, durable=True, passive=True)
        return q.declaration_result.message_count

    def _message(self, body: bytes) -> Any:
        return self.aio_pika.Message(body, delivery_mode=self.aio_pika.DeliveryMode.PERSISTENT)

    async def publish(self, n: int, size: int, window: int,
                      deadline: float) -> tuple[int, int]:
        """One task per publish (it returns on the confirm), ``window`` unconfirmed
        at most (sliding window)."""
        exchange = self.ch.default_exchange
        body = make_body(size)
        slots = asyncio.Semaphore(window)
        pending: set[asyncio.Task[Any]] = set()
        errors = 0

        async def one() -> None:
            nonlocal errors
            try:
                await exchange.publish(self._message(body), routing_key=QUEUE)
            except Exception:
                errors += 1
            finally:
                slots.release()

        loop = asyncio.get_running_loop()
        sent = 0
        while sent < n and time.monotonic() < deadline:
            await slots.acquire()
            task = loop.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            sent += 1
        if pending:
            await asyncio.gather(*pending)
        return sent - errors, errors

    async def publish_paced(self, rate: float, duration: float, size: int) -> int:
        exchange = self.ch.default_exchange
        total = int(rate * duration)
        pending: set[asyncio.Task[Any]] = set()
        loop = asyncio.get_running_loop()
        t0 = time.monotonic()
        sent = 0
        while sent < total:
            due = _due(t0, rate, total)
            while sent < due:
                task = loop.create_task(exchange.publish(
                    self._message(make_body(size, now_ns())), routing_key=QUEUE))
                pending.add(task)
                task.add_done_callback(pending.discard)
                sent += 1
            await pace(t0, sent, rate)
        if pending:
            await asyncio.gather(*pending)
        return sent

    async def consume(self, target: int, batch: int, deadline: float, idle_s: float,
                      name: str, lat: list[int] | None = None) -> tuple[int, float]:
        """``basic_consume`` with prefetch ``batch``, one ack per message."""
        await self.ch.set_qos(prefetch_count=batch)
        q = await self.ch.declare_queue(QUEUE, durable=True)
        count = 0
        last = time.monotonic()
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            nonlocal count, last
            if lat is not None:
                lat.append(now_ns() - TS.unpack_from(message.body)[0])
            await message.ack()
            count += 1
            last = time.monotonic()
            if count >= target:
                done.set()

        tag = await q.consume(on_message, no_ack=False)
        while not done.is_set():
            t = time.monotonic()
            if t >= deadline or t - last > idle_s:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)
        await q.cancel(tag)
        return count, last


class NatsPeer(_Peer):
    """NATS JetStream through nats-py: file storage, work-queue stream, one durable
    pull consumer."""

    async def connect(self) -> None:
        import nats

        self.nc = await nats.connect(f"nats://127.0.0.1:{self.port}", max_reconnect_attempts=1)
        self.js = self.nc.jetstream(publish_async_max_pending=NATS_MAX_PENDING)

    async def close(self) -> None:
        await self.nc.close()

    async def reset(self) -> None:
        from nats.js.api import (
            AckPolicy,
            ConsumerConfig,
            RetentionPolicy,
            StorageType,
            StreamConfig,
        )

        with contextlib.suppress(Exception):  # absent on the first reset
            await self.js.delete_stream(NATS_STREAM)
        await self.js.add_stream(StreamConfig(
            name=NATS_STREAM, subjects=[NATS_SUBJECT],
            retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE))
        await self.js.add_consumer(NATS_STREAM, ConsumerConfig(
            durable_name=NATS_CONSUMER, ack_policy=AckPolicy.EXPLICIT,
            ack_wait=60, max_ack_pending=50_000, max_waiting=512))

    async def depth(self) -> int:
        info = await self.js.stream_info(NATS_STREAM)
        return info.state.messages

    async def publish(self, n: int, size: int, window: int,
                      deadline: float) -> tuple[int, int]:
        """``publish_async``: one PubAck per message, ``NATS_MAX_PENDING`` pending at
        most (the client blocks the next publish when that many are outstanding)."""
        body = make_body(size)
        errors = 0

        def on_ack(fut: asyncio.Future[Any]) -> None:
            nonlocal errors
            if fut.cancelled() or fut.exception() is not None:
                errors += 1

        publish_async = self.js.publish_async
        sent = 0
        while sent < n and time.monotonic() < deadline:
            fut = await publish_async(NATS_SUBJECT, body)
            fut.add_done_callback(on_ack)
            sent += 1
        await asyncio.wait_for(self.js.publish_async_completed(), 30)
        return sent - errors, errors

    async def publish_paced(self, rate: float, duration: float, size: int) -> int:
        total = int(rate * duration)
        t0 = time.monotonic()
        sent = 0
        while sent < total:
            due = _due(t0, rate, total)
            while sent < due:
                await self.js.publish_async(NATS_SUBJECT, make_body(size, now_ns()))
                sent += 1
            await pace(t0, sent, rate)
        await asyncio.wait_for(self.js.publish_async_completed(), 30)
        return sent

    async def consume(self, target: int, batch: int, deadline: float, idle_s: float,
                      name: str, lat: list[int] | None = None) -> tuple[int, float]:
        """``fetch(batch)`` from the durable pull consumer, one ack per message."""
        import nats.errors

        psub = await self.js.pull_subscribe_bind(NATS_CONSUMER, stream=NATS_STREAM)
        count = 0
        last = time.monotonic()
        while count < target:
            t = time.monotonic()
            if t >= deadline or t - last > idle_s:
                break
            try:
                msgs = await psub.fetch(batch, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            if not msgs:
                continue
            if lat is not None:
                tn = now_ns()
                lat.extend(tn - TS.unpack_from(m.data)[0] for m in msgs)
            for m in msgs:
                await m.ack()
            count += len(msgs)
            last = time.monotonic()
        await self.nc.flush()
        return count, last


DRIVERS: dict[str, type] = {"redis": RedisPeer, "rabbitmq": RabbitPeer, "nats": NatsPeer}


def make_peer(name: str) -> Any:
    spec = PEERS[name]
    return DRIVERS[spec["kind"]](spec["port"])


# ----------------------------------------------------------- worker processes
async def _worker(job: dict[str, Any], barrier: Any) -> dict[str, Any]:
    """One producer or consumer: connect, wait on the barrier with the others,
    run the role, report counts, CLOCK_MONOTONIC times and CPU seconds."""
    peer = make_peer(job["peer"])  # module global: bench_clients may have wrapped it
    await peer.connect()
    try:
        barrier.wait(timeout=60)
        t0 = time.monotonic()
        # aux_pid: a second server process the system needs (minou-redis: its
        # redis-server), accounted apart from the server's
        out: dict[str, Any] = {"t0": t0, "srv_cpu0": proc_cpu_s(job.get("srv_pid")),
                               "aux_cpu0": proc_cpu_s(job.get("aux_pid")),
                               "cli_cpu0": time.process_time()}
        if "cpu_pids" in job:  # several server processes (minou's cluster test g)
            out["pids_cpu0"] = [proc_cpu_s(pid) for pid in job["cpu_pids"]]
        role = job["role"]
        if role == "pub":
            ok, err = await peer.publish(job["n"], job["size"], job["window"],
                                         t0 + job["limit_s"])
            out.update(count=ok, errors=err, t1=time.monotonic())
        elif role == "con":
            lat: list[int] | None = [] if job.get("latency") else None
            count, last = await peer.consume(job["n"], job["batch"], t0 + job["limit_s"],
                                             job["idle_s"], job["name"], lat)
            out.update(count=count, t1=last)
            if lat is not None:
                out["lat_ns"] = lat
        elif role == "paced":
            sent = await peer.publish_paced(job["rate"], job["duration"], job["size"])
            out.update(count=sent, t1=time.monotonic())
        else:
            raise ValueError(f"unknown role {role!r}")
        out["srv_cpu1"] = proc_cpu_s(job.get("srv_pid"))
        out["aux_cpu1"] = proc_cpu_s(job.get("aux_pid"))
        out["cli_cpu1"] = time.process_time()
        if "cpu_pids" in job:
            out["pids_cpu1"] = [proc_cpu_s(pid) for pid in job["cpu_pids"]]
        return out
    finally:
        await peer.close()


def worker_entry(job: dict[str, Any], barrier: Any, outq: Any) -> None:
    """Target of a spawned process: the result (or the error) goes to ``outq``, so
    the orchestrator never waits for a worker that died."""
    try:
        import uvloop

        uvloop.install()
        outq.put(asyncio.run(_worker(job, barrier)))
    except Exception as e:
        outq.put({"error": f"{type(e).__name__}: {e}"})


# ------------------------------------------------------------- measurement
def proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process, from /proc/<pid>/stat."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:
        return None


def proc_rss_mib(pid: int | None, field: str = "VmRSS") -> float | None:
    """``VmRSS`` (or ``VmHWM``, ...) of a process in MiB, one decimal."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except Exception:
        return None
    return None


def throughput(results: list[dict[str, Any]], cpu: dict[str, Any] | None = None,
               key: str | None = None) -> tuple[int, float, float]:
    """(messages, msg/s, wall s) over [earliest start, latest finish] of the workers.
    With ``cpu``, ``cpu[key]`` gets the server's and the clients' CPU over that
    window, in % of one core (and ``aux``, the second server process's, if any)."""
    count = sum(r["count"] for r in results)
    first = min(results, key=lambda r: r["t0"])
    last = max(results, key=lambda r: r["t1"])
    wall = last["t1"] - first["t0"]
    if cpu is not None and wall > 0:
        s0, s1 = first.get("srv_cpu0"), last.get("srv_cpu1")
        server = round(100 * (s1 - s0) / wall, 1) if s0 is not None and s1 is not None else None
        clients = round(100 * sum(r["cli_cpu1"] - r["cli_cpu0"] for r in results) / wall, 1)
        cpu[key] = {"server": server, "clients": clients}
        a0, a1 = first.get("aux_cpu0"), last.get("aux_cpu1")
        if a0 is not None and a1 is not None:
            cpu[key]["aux"] = round(100 * (a1 - a0) / wall, 1)
    return count, (count / wall if wall > 0 else 0.0), wall


def pids_cpu_pct(results: list[dict[str, Any]]) -> list[float | None]:
    """CPU of each of the jobs' ``cpu_pids`` over the window ``throughput`` measures
    (the first worker's start .. the last worker's finish), in % of one core."""
    first = min(results, key=lambda r: r["t0"])
    last = max(results, key=lambda r: r["t1"])
    wall = last["t1"] - first["t0"]
    out: list[float | None] = []
    for c0, c1 in zip(first.get("pids_cpu0", []), last.get("pids_cpu1", []), strict=False):
        out.append(round(100 * (c1 - c0) / wall, 1)
                   if c0 is not None and c1 is not None and wall > 0 else None)
    return out


def settle(pid: int | None, max_s: float = 30.0, idle_pct: float = 5.0) -> float:
    """Wait (at most ``max_s``) until the server process uses less than ``idle_pct``
    of a core over half a second, so the background work of one step (fsync, AOF
    rewrite, GC, compaction) does not bleed into the next. Returns seconds waited."""
    t0 = time.monotonic()
    if pid is None:
        return 0.0
    while time.monotonic() - t0 < max_s:
        c0 = proc_cpu_s(pid)
        time.sleep(0.5)
        c1 = proc_cpu_s(pid)
        if c0 is None or c1 is None or 100 * (c1 - c0) / 0.5 < idle_pct:
            break
    return round(time.monotonic() - t0, 1)


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v < 1000:
        return f"{v:.2f}"
    return f"{int(v):,}"


def versions() -> dict[str, Any]:
    """Python, the client libraries and the Debian packages of the servers."""
    v: dict[str, Any] = {"python": platform.python_version()}
    for pkg in ("redis", "hiredis", "aio-pika", "aiormq", "nats-py", "uvloop", "msgspec"):
        with contextlib.suppress(Exception):
            v[pkg] = metadata.version(pkg)
    for deb in ("redis-server", "rabbitmq-server", "nats-server", "erlang-base"):
        with contextlib.suppress(Exception):
            v[deb] = subprocess.run(["dpkg-query", "-W", "-f=${Version}", deb],
                                    capture_output=True, text=True, timeout=10).stdout or None
    return v
