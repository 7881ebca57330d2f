"""The minou side of the benchmark, shaped like the peer classes of
bench/peers.py (same methods, same return values), so that every
system runs through peers.py's own worker code (``peers._worker``: spawn, uvloop,
barrier start, CLOCK_MONOTONIC) and is measured the same way.

This module is imported in every worker process (multiprocessing spawn).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import queue as queue_mod
import time
from typing import Any

# The same bodies as the peers' (monotonic ns at publish time, then padding).
from peers import TS, make_body, now_ns, pace

CHANNEL = "bench/v1/q"
GROUP = "bench_g"
# minou brokers: on SQLite, on Redis, on SQLite with the bench channel's durability
# "interval" (issue 19)
MINOU_SYSTEMS = ("minou", "minou-redis", "minou-interval")


_KEY: Any = None


def _process_key() -> Any:
    """One key per process: a client id is bound to the first key it registered."""
    global _KEY
    if _KEY is None:
        from minou.auth import keys

        _KEY = keys.generate()
    return _KEY


class MinouPeer:
    """minou's asyncio client; payloads are bytes, so they travel raw (no JSON).

    With ``json=True`` (peer name ``minou-json``, the pre-fill of the HTTP test e) the
    payload is a JSON string encoding to ``size`` bytes, as an HTTP client would send.

    ``channels`` (the cluster test g: several queues per process): a producer sends
    message i to ``channels[i % len]``, a consumer reads them all in ``group``;
    default: the one channel ``CHANNEL`` and the group ``GROUP`` of tests a-c.
    """

    def __init__(self, url: str, json: bool = False, admin_key: str | None = None,
                 channels: list[str] | None = None, group: str | None = None) -> None:
        self.url = url
        self.json = json
        self.admin_key = admin_key  # None: $MINOU_BENCH_ADMIN_KEY (the last broker started)
        self.channels = list(channels or [CHANNEL])
        self.group = group or GROUP

    async def connect(self) -> None:
        import os

        import minou
        # Each worker process is its own client with its own key pair (auto-accepted by
        # the bench broker's rule), as a deployed client would be.
        self.c = await minou.connect(self.url, client_id=f"bench-{os.getpid()}",
                                     key=_process_key(), reconnect=False)

    async def close(self) -> None:
        await self.c.close()

    async def reset(self) -> None:  # the orchestrator restarts the broker on a fresh dir
        return None

    async def _listing(self, channel: str) -> list[dict[str, Any]]:
        """The admin ``list`` of the channels under ``channel`` ("" = all)."""
        import os

        import minou

        admin = await minou.connect(self.url, client_id="admin", reconnect=False,
                                    key=self.admin_key or os.environ["MINOU_BENCH_ADMIN_KEY"])
        try:
            data = await admin.admin("list", channel=channel)
        finally:
            await admin.close()
        return data["channels"]

    async def depth(self) -> int:
        if self.channels == [CHANNEL]:  # tests a-c: the one channel, listed by name
            listing = await self._listing(CHANNEL)
            return sum(ch["depth"] for ch in listing if ch["channel"] == CHANNEL)
        return sum((await self.depths()).values())

    async def depths(self) -> dict[str, int]:
        """Depth of each of ``channels`` (test g sizes each consumer's target by it)."""
        found = {ch["channel"]: ch["depth"] for ch in await self._listing("")}
        return {name: found.get(name, 0) for name in self.channels}

    async def publish(self, n: int, size: int, window: int, deadline: float) -> tuple[int, int]:
        """``client.send`` futures, at most ``window`` unconfirmed (sliding window).

        A confirm means the message is in a committed (fsync'd) SQLite transaction, or
        (minou-redis) in Redis's AOF, fsync'd (``appendfsync always``).
        """
        body: Any = "x" * (size - 2) if self.json else make_body(size)
        sem = asyncio.Semaphore(window)
        release = sem.release
        errors = 0
        ok = 0
        finished = False
        all_done = asyncio.Event()

        def done(fut: asyncio.Future[Any]) -> None:
            nonlocal errors, ok
            release()
            if fut.cancelled() or fut.exception() is not None:
                errors += 1
            else:
                ok += 1
            if finished and ok + errors >= sent:
                all_done.set()

        send = self.c.send
        acquire = sem.acquire
        channels = self.channels
        spread = len(channels)
        sent = 0
        if spread == 1:  # tests a-c: the loop as it always was, no per-message choice
            channel = channels[0]
            while sent < n and time.monotonic() < deadline:
                await acquire()
                send(channel, body).add_done_callback(done)
                sent += 1
        while sent < n and time.monotonic() < deadline:  # test g: round-robin
            await acquire()
            send(channels[sent % spread], body).add_done_callback(done)
            sent += 1
        finished = True
        if ok + errors < sent:
            await asyncio.wait_for(all_done.wait(), 60)
        return ok, sent - ok

    async def publish_paced(self, rate: float, duration: float, size: int) -> int:
        total = int(rate * duration)
        futs = []
        send = self.c.send
        t0 = time.monotonic()
        sent = 0
        while sent < total:
            due = min(total, int((time.monotonic() - t0) * rate) + 1)
            while sent < due:
                futs.append(send(CHANNEL, make_body(size, now_ns())))
                sent += 1
            await pace(t0, sent, rate)
        await asyncio.wait_for(asyncio.gather(*futs), 30)
        return sent

    async def consume(self, target: int, batch: int, deadline: float, idle_s: float,
                      name: str, lat: list[int] | None = None) -> tuple[int, float]:
        """Competing consumer in one group, prefetch ``batch``, one ack per message
        (acks are coalesced by the client); the last ack is awaited (durable)."""
        from minou import Timeout

        sub = await self.c.consume(self.channels if len(self.channels) > 1 else self.channels[0],
                                   group=self.group, prefetch=batch)
        get_nowait = sub.get_nowait
        unpack = TS.unpack_from
        count = 0
        last = time.monotonic()
        got = False  # a message was handled since `last` was taken
        settlement = None
        while count < target:
            msg = get_nowait()
            if msg is None:
                t = time.monotonic()
                if got:
                    last, got = t, False
                if t >= deadline or t - last > idle_s:
                    break
                try:
                    msg = await sub.get(0.2)
                except Timeout:
                    continue
            if lat is not None:
                lat.append(now_ns() - unpack(msg.data)[0])
            settlement = msg.ack()
            count += 1
            got = True
            if not count % 1000 and time.monotonic() >= deadline:
                break
        if got:
            last = time.monotonic()
        if settlement is not None:
            await asyncio.wait_for(settlement, 30)
            if count >= target:  # include making the last acks durable
                last = time.monotonic()
        return count, last


_MINOU_URL: str | None = None
_JOB: dict[str, Any] = {}  # this worker process's job (one job per process)


def _make_peer_factory(original):
    def make_peer(name: str):
        # minou-redis: the same client, on the broker that keeps its storage in Redis
        if name in ("minou", "minou-json", "minou-redis", "minou-interval"):
            assert _MINOU_URL is not None
            return MinouPeer(_MINOU_URL, json=name == "minou-json",
                             channels=_JOB.get("channels"), group=_JOB.get("group"))
        if name == "minou-resp":  # the Redis protocol door (bench/resp_bench.py)
            import resp_bench

            return resp_bench.RespPeer(_JOB)
        if name == "minou-http":  # test e: the HTTP API (bench/http_bench.py)
            import http_bench

            return http_bench.HttpPeer(_JOB)
        return original(name)

    return make_peer


def worker_entry(job: dict[str, Any], barrier: Any, outq: Any) -> None:
    """Spawned process: point peers.py at this run's ports / broker, then run
    peers.py's own worker (uvloop, barrier, monotonic clock, CPU accounting)."""
    global _MINOU_URL, _JOB
    import peers

    for name, port in job.get("ports", {}).items():
        peers.PEERS[name]["port"] = port
    _MINOU_URL = job.get("url")
    _JOB = job
    if not getattr(peers.make_peer, "_minou", False):
        peers.make_peer = _make_peer_factory(peers.make_peer)
        peers.make_peer._minou = True  # type: ignore[attr-defined]
    peers.worker_entry(job, barrier, outq)


def run_jobs(jobs: list[dict[str, Any]], timeout: float = 180.0) -> list[dict[str, Any]]:
    """peers.run_jobs with our entry point, and no hang: on timeout the workers
    (ours) are terminated and a RuntimeError says what was missing."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(jobs))
    outq = ctx.Queue()
    procs = [ctx.Process(target=worker_entry, args=(j, barrier, outq)) for j in jobs]
    for p in procs:
        p.start()
    results = []
    t_end = time.monotonic() + timeout
    try:
        for _ in jobs:
            left = t_end - time.monotonic()
            try:
                results.append(outq.get(timeout=max(0.1, left)))
            except queue_mod.Empty:
                raise RuntimeError(
                    f"timeout: {len(results)}/{len(jobs)} workers reported within {timeout:g} s"
                    f" ({jobs[0].get('peer')} {jobs[0].get('role')})"
                ) from None
    finally:
        for p in procs:
            p.join(10 if results and len(results) == len(jobs) else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(5)
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("; ".join(errs))
    return results


def admin(system: str, what: str, url: str | None = None, ports: dict[str, int] | None = None,
          admin_key: str | None = None, channels: list[str] | None = None):
    """reset / depth in this process (like peers.admin, for any system); ``url`` and
    ``admin_key`` are the minou broker's (SQLite or Redis); ``depths`` (minou only):
    the depth of each of ``channels``."""
    import uvloop

    import peers

    for name, port in (ports or {}).items():
        peers.PEERS[name]["port"] = port

    async def go():
        peer = MinouPeer(url, admin_key=admin_key, channels=channels) \
            if system in MINOU_SYSTEMS else peers.make_peer(system)
        await peer.connect()
        try:
            if what == "reset":
                await peer.reset()
                return None
            if what == "depths":
                return await peer.depths()
            return await peer.depth()
        finally:
            await peer.close()

    uvloop.install()
    return asyncio.run(go())
