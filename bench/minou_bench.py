#!/usr/bin/env python3
"""minou benchmark, side by side with Redis Streams, NATS JetStream and RabbitMQ in
the same run. The peer drivers and the worker code every row runs through are in
bench/peers.py: every producer / consumer is its own OS process (multiprocessing
spawn, uvloop), the processes of a test start on a barrier and time with
CLOCK_MONOTONIC, throughput = messages / (first start .. last finish).

Tests (--only takes the letters or the row keys):
  a  pub_100B, pub_1KiB, pub4_100B, pub4_1KiB: confirmed publish, window 1000,
     1 and 4 producers, N = 100,000 in total or 10 s; pub_64KiB, pub_1MiB: large
     messages, 1 producer, in MB/s: 64 KiB x 10,000 (window 64) and 1 MiB x 1,000
     (window 8), or 10 s (the SQLite broker and the peers; not minou-redis)
  b  con_p1000, con4_p1000: consume+ack a channel pre-filled with N x 100 B,
     prefetch (batch) 1000, 1 consumer and 4 competing consumers of one group
  c  lat: end-to-end latency p50 / p99, 2,000 msg/s for 5 s, 100 B,
     1 producer + 1 consumer (prefetch 100) concurrently; disk: the disk's own commit
     latency in the same run, 2,000 appends of 4 KiB each made durable with fdatasync
     in minou's data directory (bench/disk_probe.py), p50 / p99, and minou's latency
     against it (issue 19: p99 <= 2 x the disk's p99, p50 <= the disk's p50 + 0.5 ms)
  d  mem: server RSS (VmRSS) with 1,000,000 x 100 B stored, and the data dir size;
     recovery (minou only, first run only): 3,000,000 x 100 B over 30 channels stored,
     then a restart: seconds from the start to the first confirmed publish, and RSS then
  e  http_pub, http_pubb, http_con: minou's HTTP API (minou only: no peer has one in
     this harness), --http-procs processes x --http-conns keep-alive connections, one
     request in flight per connection, each process a client with its own key and
     JWT (bearer), 100 B JSON string payloads: publish (201 once fsync'd), N in
     total or 10 s; batch publish (POST /v1/messages, --http-batch messages per
     request, 10 x N in total or 10 s); consume (long poll, wait=1) + ack (200 once durable) of a
     channel pre-filled with N messages (bench/http_bench.py)
  f  spark_read, spark_stream, spark_batch_latency: the PySpark connector (minou only,
     about 1 min a run, `--only f` alone; skipped when pyspark/pyarrow are missing): one
     SparkSession (local[2]) in a subprocess (bench/spark_bench.py), one client key
     registered here; batch read of N x 100 B JSON (count + sum(length(payload))),
     availableNow drain of them (maxRecordsPerBatch 50,000) to the transactional minou
     sink, and the median micro-batch duration at --spark-rate msg/s (processingTime=0)
  g  cl_pub1..3, cl_con1..3, cl_fwd_direct, cl_fwd_relay: a minou cluster (minou only,
     not in the default set: about 1 min a run, `--only g`): 1, 2 and 3 brokers over
     one redis-server of their own (AOF always), the first primary, the others
     standbys relaying their clients to it (docs/cluster.md); 8 queues q0/v1/1 ..
     q7/v1/1, --procs processes with 8/procs queues each, spread round-robin over the
     brokers' URLs: publish 100 B (window 1000, --cluster-n = 300,000 in total or
     10 s), and consume+ack of the 8 queues pre-filled with as many x 100 B (prefetch
     --batch, each consumer alone on its queues); and the relay's cost: 2 brokers,
     every producer on the primary, then every producer on the standby. A fresh Redis
     and fresh brokers for each row; the CPU of each broker and of redis-server.

Before each test the bench waits (up to --quiet-wait, 20 s) for the 1-minute load
average to drop under --quiet-load (0.5); a test that starts above it anyway has its
rows marked * ("noisy") in the table, with the load averages under it and in the JSON.

The minou broker is started here (python -m minou start --port 0, fresh temp data
dir; a fresh broker before every test, as peers.py deletes and recreates its queue).
With the "peer" minou-interval (default) the SQLite broker runs tests a-c and HTTP publish
again with the bench channel's durability "interval" (confirmed once written to the OS,
fsync'd within 50 ms; issue 19: its e2e p99 <= Redis AOF everysec's, printed under the
table).
With the "peer" minou-redis (default when redis-server is installed) a second minou
broker runs tests a-c with --storage redis://... on a redis-server of its own
(appendonly yes, appendfsync always; a fresh one before every test), and the table
gives its ratio to the SQLite broker (issue 17's target: >= 0.5 on a and b).
The peers are started here too, on 127.0.0.1 and free ports, and stopped by pid.

Usage:  .venv/bin/python bench/minou_bench.py [--runs 3] [--only a,b] [--peers redis-aof,nats-js]
        .venv/bin/python bench/minou_bench.py --only e --peers none   (the HTTP rows alone)
        .venv/bin/python bench/minou_bench.py --only f --peers none   (the Spark rows)
        .venv/bin/python bench/minou_bench.py --only g --peers none   (the cluster rows)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

GROUPS = {
    "a": ["pub_100B", "pub_1KiB", "pub4_100B", "pub4_1KiB", "pub_64KiB", "pub_1MiB"],
    "b": ["con_p1000", "con4_p1000"],
    "c": ["lat", "disk"],
    "d": ["mem", "recovery"],
    "e": ["http_pub", "http_pubb", "http_con"],
    "f": ["spark"],
    "g": ["cluster"],
}
HTTP_TESTS = GROUPS["e"]  # minou only
# A minou broker on Redis (issue 17) runs the message tests; memory (d: the data is in
# another process), HTTP (e) and Spark (f) are measured on the SQLite broker only.
REDIS = "minou-redis"
# Large messages (issue 19): n and window of their own, and in MB/s
LARGE = {"pub_64KiB": (64 << 10, 10_000, 64), "pub_1MiB": (1 << 20, 1_000, 8)}
REDIS_TESTS = [t for t in GROUPS["a"] if t not in LARGE] + GROUPS["b"] + GROUPS["c"]
REDIS_TARGET = 0.5  # minou-redis / minou on throughput (issue 17: >= 50 % of SQLite's)
# The SQLite broker again with the bench channel's durability "interval" (confirmed once
# written to the OS, fsync'd within 50 ms): a column of its own, like a peer. Issue 19's
# target: its e2e p99 <= 1.0 x Redis AOF everysec's in the same run.
INTERVAL = "minou-interval"
INTERVAL_TESTS = GROUPS["a"] + GROUPS["b"] + ["lat", "http_pub"]
INTERVAL_P99_TARGET = 1.0
ALL_TESTS = [t for g in GROUPS.values() for t in g]
# The cluster test (g) starts 8 clusters a run and asks another question (scale over
# several brokers): only when asked for, so `make bench` keeps its length.
DEFAULT_TESTS = [t for t in ALL_TESTS if t not in GROUPS["g"]]
# no peer runs these: none is started for them
MINOU_ONLY = [*HTTP_TESTS, "spark", "cluster", "disk", "recovery"]
CLUSTER_CHANNELS = [f"q{i}/v1/1" for i in range(8)]  # 8 queues (endpoint/version)
CLUSTER_SIZES = (1, 2, 3)
SPARK_ROWS = ["spark_read", "spark_stream", "spark_noop", "spark_rate_noop", "spark_vs_rate",
              "spark_batch_latency"]  # test "spark"

# key, description, unit direction ("hi" = higher is better), minou target
ROWS: list[tuple[str, str, str, tuple[str, float] | None]] = [
    ("pub_100B", "publish 100 B, 1 producer (msg/s)", "hi", (">=", 100_000)),
    ("pub_1KiB", "publish 1 KiB, 1 producer (msg/s)", "hi", None),
    ("pub4_100B", "publish 100 B, 4 producers (msg/s)", "hi", (">=", 100_000)),
    ("pub4_1KiB", "publish 1 KiB, 4 producers (msg/s)", "hi", None),
    ("pub_64KiB_mbs", "publish 64 KiB, 1 producer, window 64 (MB/s)", "hi", None),
    ("pub_1MiB_mbs", "publish 1 MiB, 1 producer, window 8 (MB/s)", "hi", None),
    ("con_p1000", "consume+ack, 1 consumer, prefetch 1000 (msg/s)", "hi", (">=", 100_000)),
    ("con4_p1000", "consume+ack, 4 consumers, prefetch 1000 (msg/s)", "hi", (">=", 100_000)),
    ("lat_p50_ms", "e2e latency p50 @ RATE/s (ms)", "lo", None),
    ("lat_p99_ms", "e2e latency p99 @ RATE/s (ms)", "lo", ("<=", 2.0)),
    ("disk_p50_ms", "the disk: fdatasync of a 4 KiB append in the data dir, p50 (ms)", "lo",
     None),
    ("disk_p99_ms", "the disk: fdatasync of a 4 KiB append in the data dir, p99 (ms)", "lo",
     None),
    ("disk_ow_p50_ms", "the disk: fdatasync of a 4 KiB write over written blocks, p50 (ms)",
     "lo", None),
    ("disk_ow_p99_ms", "the disk: fdatasync of a 4 KiB write over written blocks, p99 (ms)",
     "lo", None),
    ("lat_disk_p99", "e2e latency p99 / the disk's p99, per run (ratio)", "lo", ("<=", 2.0)),
    ("lat_disk_p50_ms", "e2e latency p50 - the disk's p50, per run (ms)", "lo", ("<=", 0.5)),
    ("mem_rss_mib", "server RSS, MEMN x 100 B stored (MiB)", "lo", ("<", 150)),
    ("mem_hwm_mib", "server peak RSS while storing them (MiB)", "lo", None),
    ("mem_disk_mib", "data dir size, MEMN x 100 B stored (MiB)", "lo", None),
    ("mem_restart_mib", "server RSS after a restart with them stored (MiB)", "lo", None),
    ("rec_first_publish_s", "restart with RECN x 100 B over 30 channels stored: start -> "
     "first confirmed publish (s, minou only)", "lo", ("<=", 1.0)),
    ("rec_rss_mib", "... server RSS then (MiB, minou only)", "lo", ("<=", 100)),
    # targets: the small reference queues over HTTP (6-core laptop), see docs/benchmarks.md
    ("http_pub", "HTTP publish 100 B, HTTPC keep-alive (msg/s, minou and minou-interval "
     "only)", "hi", (">=", 14_000)),
    ("http_pubb", "HTTP batch publish 100 B x HTTPB per request, HTTPC keep-alive "
     "(msg/s, minou only)", "hi", None),
    ("http_con", "HTTP consume+ack, HTTPC keep-alive (msg/s, minou only)", "hi",
     (">=", 4_300)),
    # targets: a prototype of the connector on this machine (2 cores, local[2]), see
    # /work/shared/research/spark-connector.md section 4 and docs/benchmarks.md "Spark"
    ("spark_read", "Spark batch read, N x 100 B JSON, arrow (rows/s, minou only)", "hi",
     (">=", 50_000)),
    ("spark_stream", "Spark drain availableNow -> transactional sink (rows/s wall, minou only)",
     "hi", (">=", 20_000)),
    ("spark_noop", "Spark drain availableNow -> noop (rows/s wall, minou only)", "hi", None),
    ("spark_rate_noop", "Spark's own rate source -> noop, same session (rows/s)", "hi", None),
    ("spark_vs_rate", "minou -> noop / Spark's rate -> noop (ratio)", "hi", None),
    ("spark_batch_latency", "Spark median micro-batch @ SPARKRATE/s, processingTime=0 (s)",
     "lo", ("<=", 0.5)),
    # test g: no target; issue 18 asks for the curve, and docs/cluster.md reads it
    *[(f"cl_pub{k}", f"cluster of {k}: publish 100 B over 8 queues, PROCS producers "
       f"round-robin over the brokers (msg/s)", "hi", None) for k in CLUSTER_SIZES],
    *[(f"cl_con{k}", f"cluster of {k}: consume+ack 8 queues pre-filled with CLN x 100 B, "
       f"PROCS consumers round-robin over the brokers (msg/s)", "hi", None)
      for k in CLUSTER_SIZES],
    ("cl_fwd_direct", "cluster of 2: publish, every producer on the primary (msg/s)", "hi", None),
    ("cl_fwd_relay", "cluster of 2: publish, every producer on the standby, relayed (msg/s)",
     "hi", None),
    ("cl_fwd_ratio", "cluster of 2: relayed / direct publish, per run (ratio)", "hi", None),
]
CLUSTER_ROWS = [key for key, *_ in ROWS if key.startswith("cl_")]


def log(msg: str) -> None:
    print(msg, flush=True)


def host_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


class Bench:
    def __init__(self, args: argparse.Namespace, peers_mod: Any, clients: Any,
                 servers: Any, workdir: Path) -> None:
        self.args = args
        self.peers = peers_mod
        self.clients = clients
        self.servers = servers
        self.workdir = workdir
        self.minou = servers.MinouBroker(workdir, python=sys.executable)
        # the minou brokers by system name: "minou" (SQLite) and, if asked, REDIS
        self.brokers: dict[str, Any] = {"minou": self.minou}
        self.peer_servers: dict[str, Any] = {}
        # test g: brokers over one redis-server, started afresh for each of its rows
        self.cluster = servers.MinouCluster(workdir, python=sys.executable,
                                            placement=args.cluster_placement)
        self.cluster_turns = 0  # runs of test g so far: its row order turns with them

    # --------------------------------------------------------------- servers
    def start_peers(self, names: list[str]) -> list[str]:
        started = []
        for name in names:
            if name == REDIS:  # started (with its redis-server) fresh before each test
                if not shutil.which("redis-server"):
                    log(f"  ! {name}: no redis-server installed; left out")
                    continue
                self.brokers[name] = self.servers.MinouBroker(
                    self.workdir, python=sys.executable, storage="redis", name=name)
                started.append(name)
                continue
            if name == INTERVAL:  # started fresh before each test, as the others
                self.brokers[name] = self.servers.MinouBroker(
                    self.workdir, python=sys.executable, name=name, durability="interval")
                started.append(name)
                continue
            srv = self.servers.PeerServer(name, self.workdir)
            try:
                srv.start()
            except Exception as exc:
                log(f"  ! {name}: cannot start ({exc}); left out")
                srv.stop()
                continue
            self.peer_servers[name] = srv
            started.append(name)
            log(f"  started {name} on 127.0.0.1:{srv.port} (pid {srv.pid})")
        return started

    def stop_all(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.close()
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                broker.close()
        for srv in self.peer_servers.values():
            with contextlib.suppress(Exception):
                srv.stop()

    @property
    def ports(self) -> dict[str, int]:
        return {n: s.port for n, s in self.peer_servers.items()}

    @staticmethod
    def cpu_pct(result: dict[str, Any]) -> float | None:
        """One worker process's CPU over its own run, in % of one core."""
        wall = result["t1"] - result["t0"]
        used = result["cli_cpu1"] - result["cli_cpu0"]
        return round(100 * used / wall, 1) if wall > 0 else None

    def pid(self, system: str) -> int | None:
        if system in self.brokers:
            return self.brokers[system].pid
        return self.peer_servers[system].pid

    def aux_pid(self, system: str) -> int | None:
        """A second server process of the system: minou-redis's redis-server."""
        broker = self.brokers.get(system)
        return broker.redis.pid if broker is not None and broker.redis is not None else None

    def data_dir(self, system: str) -> Path | None:
        if system in self.brokers:
            return self.brokers[system].storage_dir
        return None if system == "redis-mem" else self.peer_servers[system].data_dir

    def admin(self, system: str, what: str) -> Any:
        broker = self.brokers.get(system, self.minou)
        return self.clients.admin(system, what, url=broker.url, ports=self.ports,
                                  admin_key=broker.admin_key)

    def reset(self, system: str, fresh_server: bool = False) -> None:
        if system in self.brokers:
            self.brokers[system].start(fresh=True)
            self.peers.settle(self.aux_pid(system))
        elif fresh_server:
            srv = self.peer_servers[system]
            srv.stop()
            srv.port = self.servers.free_port()
            srv.start()
            self.admin(system, "reset")
        else:
            self.admin(system, "reset")
        self.peers.settle(self.pid(system))

    def base(self, system: str) -> dict[str, Any]:
        url = self.brokers[system].url if system in self.brokers else self.minou.url
        return dict(peer=system, window=self.args.window, limit_s=self.args.limit_s,
                    srv_pid=self.pid(system), aux_pid=self.aux_pid(system), ports=self.ports,
                    url=url)

    def prefill(self, system: str, n: int, size: int, procs: int, limit_s: float,
                peer: str | None = None) -> int:
        per = -(-n // procs)
        jobs = [dict(self.base(system), role="pub", n=min(per, n - i * per), size=size,
                     limit_s=limit_s, **({"peer": peer} if peer else {}))
                for i in range(procs)]
        self.clients.run_jobs(jobs, timeout=limit_s + 120)
        self.peers.settle(self.pid(system))
        self.peers.settle(self.aux_pid(system))
        return self.admin(system, "depth")

    # ----------------------------------------------------------------- tests
    def run_test(self, test: str, system: str, res: dict[str, Any], cpu: dict[str, Any]) -> None:
        a = self.args

        def timed(key: str, jobs: list[dict[str, Any]]) -> None:
            h0 = host_cpu()
            out = self.clients.run_jobs(jobs, timeout=a.limit_s + 120)
            h1 = host_cpu()
            count, rate, wall = self.peers.throughput(out, cpu, key)
            if h1[1] > h0[1] and key in cpu:  # whole machine, incl. process start-up
                cpu[key]["host_busy_cores"] = round((os.cpu_count() or 1) * (h1[0] - h0[0])
                                                    / (h1[1] - h0[1]), 2)
            res[key] = round(rate)
            res[f"{key}_count"] = count
            errors = sum(r.get("errors", 0) or 0 for r in out)
            if errors:
                res[f"{key}_errors"] = errors
            c = cpu.get(key, {})
            aux = f" + redis-server {c['aux']}" if "aux" in c else ""
            log(f"  {system:11s} {key:11s} {self.peers.fmt(res[key]):>10s} msg/s  "
                f"({count:,} msgs in {wall:.2f} s; CPU% server {c.get('server')}{aux}, "
                f"clients {c.get('clients')}; host busy {c.get('host_busy_cores')} cores"
                f"{f'; {errors} errors' if errors else ''})")

        if system == REDIS and test not in REDIS_TESTS:
            return
        if system == INTERVAL and test not in INTERVAL_TESTS:
            return
        if test == "cluster":
            if system == "minou":  # its own brokers and Redis; no peer has a cluster here
                self.run_cluster(res, cpu)
            return
        if test == "spark":
            if system == "minou":  # no peer has a Spark connector here
                self.run_spark(res, cpu)
            return
        if test in HTTP_TESTS:
            if system != "minou" and not (system == INTERVAL and test in INTERVAL_TESTS):
                return  # no peer has an HTTP API in this harness
            self.reset(system)
            broker = self.brokers[system]
            if not broker.http_url:
                raise RuntimeError(f"the {system} broker printed no HTTP URL")
            http = dict(self.base(system), peer="minou-http", http_url=broker.http_url,
                        conns=a.http_conns, http_client=a.http_client)
            procs = a.http_procs
            if test in ("http_pub", "http_pubb"):
                batch = a.http_batch if test == "http_pubb" else 1
                # 10 x N for the batch row: N alone would be over in half a second
                per = a.n * (10 if batch > 1 else 1) // procs
                timed(test, [dict(http, role="pub", n=per, size=100, http_batch=batch)
                             for _ in range(procs)])
            else:  # pre-filled with the native client, JSON payloads as HTTP would send
                depth = self.prefill(system, a.n, 100, 1, a.prefill_limit_s, peer="minou-json")
                res[f"{test}_depth"] = depth
                timed(test, [dict(http, role="con", n=depth, batch=a.http_conns, idle_s=2.0,
                                  name=f"h{i}") for i in range(procs)])
        elif test in LARGE:
            size, n, window = LARGE[test]
            self.reset(system)
            timed(test, [dict(self.base(system), role="pub", n=n, size=size, window=window)])
            res[f"{test}_mbs"] = round(res[test] * size / 1e6, 1)
        elif test.startswith("pub"):
            procs = a.procs if test.startswith("pub4") else 1
            size = 100 if test.endswith("100B") else 1024
            self.reset(system)
            per = a.n // procs
            timed(test, [dict(self.base(system), role="pub", n=per, size=size)
                         for _ in range(procs)])
        elif test.startswith("con"):
            procs = a.procs if test.startswith("con4") else 1
            self.reset(system)
            depth = self.prefill(system, a.n, 100, 1, a.prefill_limit_s)
            res[f"{test}_depth"] = depth
            timed(test, [dict(self.base(system), role="con", n=depth, batch=a.batch,
                              idle_s=2.0 if procs == 1 else 1.0, name=f"c{i}")
                         for i in range(procs)])
        elif test == "lat":
            self.reset(system)
            total = int(a.rate * a.duration)
            out = self.clients.run_jobs([
                dict(self.base(system), role="paced", rate=a.rate, duration=a.duration, size=100),
                dict(self.base(system), role="con", n=total, batch=a.lat_batch, idle_s=5.0,
                     name="c0", latency=True, limit_s=a.duration + 15),
            ], timeout=a.duration + 120)
            prod = next(r for r in out if "lat_ns" not in r)
            cons = next(r for r in out if "lat_ns" in r)
            lat = sorted(cons["lat_ns"])
            # Three processes on the machine's cores: what each burns decides how often
            # one waits for a CPU, which is most of the tail here (docs/benchmarks.md).
            self.peers.throughput(out, cpu, test)
            c = cpu.get(test, {})
            if c:
                c["producer"] = self.cpu_pct(prod)
                c["consumer"] = self.cpu_pct(cons)
            aux = f" + redis-server {c['aux']}" if "aux" in c else ""
            if lat:
                def q(p: float) -> float:
                    return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6

                res.update(lat_p50_ms=round(q(0.50), 3), lat_p99_ms=round(q(0.99), 3),
                           lat_max_ms=round(lat[-1] / 1e6, 3), lat_received=len(lat),
                           lat_rate=round(prod["count"] / (prod["t1"] - prod["t0"])))
            log(f"  {system:11s} latency     p50 {res.get('lat_p50_ms')} ms  p99 "
                f"{res.get('lat_p99_ms')} ms  max {res.get('lat_max_ms')} ms "
                f"({res.get('lat_received')}/{total} msgs, achieved {res.get('lat_rate')} msg/s; "
                f"CPU% server {c.get('server')}{aux}, producer {c.get('producer')}, "
                f"consumer {c.get('consumer')})")
        elif test == "disk":
            if system != "minou":
                return  # the machine's, measured once: where minou keeps its data
            import disk_probe  # bench/, on sys.path

            where = self.data_dir(system) or self.workdir
            res.update(disk_probe.fdatasync_latency(where))
            # What minou's commits are (its WAL is written out ahead: docs/reliability.md)
            over = disk_probe.fdatasync_latency(where, overwrite=True)
            res.update(disk_ow_p50_ms=over["disk_p50_ms"], disk_ow_p99_ms=over["disk_p99_ms"])
            log(f"  disk        fdatasync of 4 KiB appends in {where}: p50 "
                f"{res['disk_p50_ms']} ms  p99 {res['disk_p99_ms']} ms  max "
                f"{res['disk_max_ms']} ms; written over: p50 {res['disk_ow_p50_ms']} ms  "
                f"p99 {res['disk_ow_p99_ms']} ms")
            if res.get("lat_p99_ms") and res["disk_p99_ms"]:
                res["lat_disk_p99"] = round(res["lat_p99_ms"] / res["disk_p99_ms"], 2)
                res["lat_disk_p50_ms"] = round(res["lat_p50_ms"] - res["disk_p50_ms"], 3)
        elif test == "recovery":
            if system != "minou":
                return
            self.run_recovery(res)
        elif test == "mem":
            self.reset(system, fresh_server=True)
            pid = self.pid(system)
            res["mem_idle_mib"] = self.peers.proc_rss_mib(pid)
            t0 = time.monotonic()
            depth = self.prefill(system, a.mem_n, 100, a.mem_procs, a.mem_limit_s)
            took = time.monotonic() - t0
            time.sleep(1.0)
            res["mem_depth"] = depth
            res["mem_rss_mib"] = self.peers.proc_rss_mib(pid)
            res["mem_hwm_mib"] = self.peers.proc_rss_mib(pid, "VmHWM")
            disk = self.servers.dir_bytes(self.data_dir(system))
            res["mem_disk_mib"] = round(disk / 2**20, 1) if disk is not None else None
            if system == "minou":
                t1 = time.monotonic()
                self.minou.start(fresh=False)
                res["mem_restart_s"] = round(time.monotonic() - t1, 2)
                self.peers.settle(self.minou.pid)
                res["mem_restart_depth"] = self.admin(system, "depth")
                res["mem_restart_mib"] = self.peers.proc_rss_mib(self.minou.pid)
            log(f"  {system:11s} memory      RSS {res['mem_rss_mib']} MiB with {depth:,} stored "
                f"(idle {res['mem_idle_mib']}, peak {res['mem_hwm_mib']}, data "
                f"{res['mem_disk_mib']} MiB, filled in {took:.1f} s"
                + (f"; after restart {res.get('mem_restart_mib')} MiB, "
                   f"depth {res.get('mem_restart_depth'):,}, start {res.get('mem_restart_s')} s)"
                   if system == "minou" else ")"))
            if system == "minou":
                self.minou.start(fresh=True)  # drop the 1M-message data dir now
            else:
                self.admin(system, "reset")
        else:
            raise ValueError(test)

    # ------------------------------------------------------------ recovery
    def run_recovery(self, res: dict[str, Any]) -> None:
        """Issue 19 item 6: store ``--rec-n`` x 100 B over 30 channels, restart the
        broker, and time its start up to the first publish it confirms."""
        import minou

        a = self.args
        self.reset("minou", fresh_server=True)
        channels = [f"rec/v1/{i}" for i in range(30)]
        per = -(-a.rec_n // a.mem_procs)
        t0 = time.monotonic()
        self.clients.run_jobs([dict(self.base("minou"), role="pub", n=per, size=100,
                                    channels=channels, limit_s=a.rec_limit_s)
                               for _ in range(a.mem_procs)], timeout=a.rec_limit_s + 120)
        filled = time.monotonic() - t0
        self.peers.settle(self.minou.pid)
        res["rec_stored"] = sum(self.clients.admin(
            "minou", "depths", url=self.minou.url, ports=self.ports,
            admin_key=self.minou.admin_key, channels=channels).values())
        t1 = time.monotonic()
        self.minou.stop()  # not timed: the old broker's shutdown is not the new one's start
        res["rec_stop_s"] = round(time.monotonic() - t1, 2)
        t1 = time.monotonic()
        self.minou.start(fresh=False)
        res["rec_banner_s"] = round(time.monotonic() - t1, 2)
        with minou.connect_sync(self.minou.url, client_id="admin",
                                key=self.minou.admin_key) as c:
            c.send("rec/v1/0", {"after": "restart"})
        res["rec_first_publish_s"] = round(time.monotonic() - t1, 2)
        res["rec_rss_mib"] = self.peers.proc_rss_mib(self.minou.pid)
        log(f"  minou       recovery    {res['rec_stored']:,} stored over 30 channels (filled "
            f"in {filled:.1f} s); restart -> first confirmed publish "
            f"{res['rec_first_publish_s']} s (its banner at {res['rec_banner_s']} s; the old "
            f"broker's stop took {res['rec_stop_s']} s, not counted), RSS then "
            f"{res['rec_rss_mib']} MiB")
        self.minou.start(fresh=True)  # drop the big data dir now

    # ------------------------------------------------------------- test g
    def cluster_jobs(self, role: str, urls: list[str], **kw: Any) -> list[dict[str, Any]]:
        """One job per process (--procs), process i on the queues CLUSTER_CHANNELS[i::procs]
        and on the broker urls[i % len(urls)]: with 2 or 3 URLs some processes go through
        a standby's relay. The CPU of every broker and of redis-server is read in the
        workers at the barrier and at the end (peers.pids_cpu_pct)."""
        a, cl = self.args, self.cluster
        base = dict(peer="minou", window=a.window, limit_s=a.limit_s, ports={},
                    srv_pid=cl.primary.pid, aux_pid=cl.redis.pid, cpu_pids=cl.pids, role=role)
        return [{**base, "url": urls[i % len(urls)], "channels": CLUSTER_CHANNELS[i::a.procs],
                 **kw} for i in range(a.procs)]

    def cluster_settle(self) -> None:
        for pid in [*self.cluster.pids, self.cluster.redis.pid]:
            self.peers.settle(pid)

    def cluster_depths(self) -> dict[str, int]:
        """Each channel's depth. Spread over brokers, each lists the queues it owns: the
        sum over them (the first broker's admin key is valid on every one)."""
        primary = self.cluster.primary
        brokers = self.cluster.brokers if self.cluster.placement == "spread" else [primary]
        total: dict[str, int] = {}
        for b in brokers:
            found = self.clients.admin("minou", "depths", url=b.url,
                                       admin_key=primary.admin_key, channels=CLUSTER_CHANNELS)
            for ch, n in found.items():
                total[ch] = total.get(ch, 0) + n
        return total

    def cluster_row(self, key: str, size: int, res: dict[str, Any], cpu: dict[str, Any]) -> None:
        """One row of test g on a fresh cluster of ``size`` brokers."""
        a, cl = self.args, self.cluster
        cl.start(size)
        try:
            self.cluster_settle()
            urls = cl.urls
            if key.startswith("cl_fwd"):  # every producer on one broker: the pair's only change
                urls = [urls[0] if key == "cl_fwd_direct" else urls[1]]
            if key.startswith("cl_con"):  # pre-filled through the primary, outside the row
                fill = self.cluster_jobs("pub", urls[:1], n=-(-a.cluster_n // a.procs), size=100,
                                         limit_s=a.prefill_limit_s)
                self.clients.run_jobs(fill, timeout=a.prefill_limit_s + 120)
                self.cluster_settle()
                depths = self.cluster_depths()
                res[f"{key}_depth"] = sum(depths.values())
                jobs = self.cluster_jobs("con", urls, batch=a.batch, idle_s=2.0)
                for i, job in enumerate(jobs):  # each consumer alone on its queues, own group
                    job.update(n=sum(depths[c] for c in job["channels"]), name=f"c{i}",
                               group=f"cl{i}")
            else:
                jobs = self.cluster_jobs("pub", urls, n=a.cluster_n // a.procs, size=100)
            h0 = host_cpu()
            out = self.clients.run_jobs(jobs, timeout=a.limit_s + 120)
            h1 = host_cpu()
            count, rate, wall = self.peers.throughput(out, cpu, key)
            per_broker = self.peers.pids_cpu_pct(out)
            c = cpu.setdefault(key, {})
            c.pop("server", None)  # the primary's: it is b1 below
            c["redis"] = c.pop("aux", None)
            for i, pct in enumerate(per_broker):
                c[f"b{i + 1}"] = pct
            brokers = sum(x for x in per_broker if x is not None)
            c["brokers"] = round(brokers, 1)
            # CPU per message, what a projection to more machines is made of: rate x
            # ns/msg = the share of a core that process needs at that rate (in ns, as the
            # medians keep one decimal: µs would lose the redis-server's)
            if rate > 0:
                c["brokers_ns_msg"] = round(brokers * 1e7 / rate)
                if c["redis"] is not None:
                    c["redis_ns_msg"] = round(c["redis"] * 1e7 / rate)
            if h1[1] > h0[1]:
                c["host_busy_cores"] = round((os.cpu_count() or 1) * (h1[0] - h0[0])
                                             / (h1[1] - h0[1]), 2)
            res[key] = round(rate)
            res[f"{key}_count"] = count
            errors = sum(r.get("errors", 0) or 0 for r in out)
            if errors:
                res[f"{key}_errors"] = errors
            if not key.startswith("cl_con"):  # every confirmed publish is there
                res[f"{key}_depth"] = sum(self.cluster_depths().values())
            log(f"  minou      {key:13s} {fmt(res[key]):>8s} msg/s  ({count:,} msgs in "
                f"{wall:.2f} s; CPU% brokers {' + '.join(str(x) for x in per_broker)}, "
                f"redis-server {c['redis']}, clients {c.get('clients')}; host busy "
                f"{c.get('host_busy_cores')} cores{f'; {errors} errors' if errors else ''})")
        finally:
            cl.close()

    def run_cluster(self, res: dict[str, Any], cpu: dict[str, Any]) -> None:
        """Test g, every row; a row that fails is reported and the others still run."""
        turn = self.cluster_turns
        self.cluster_turns += 1
        # The order of the sizes turns from run to run, and the relay pair swaps, so a
        # slow minute of this shared machine does not always land on the same row.
        sizes = [CLUSTER_SIZES[(turn + i) % len(CLUSTER_SIZES)] for i in range(len(CLUSTER_SIZES))]
        fwd = ["cl_fwd_direct", "cl_fwd_relay"]
        rows = [*[(f"cl_pub{k}", k) for k in sizes], *[(f"cl_con{k}", k) for k in sizes],
                *[(key, 2) for key in (fwd if turn % 2 == 0 else fwd[::-1])]]
        failed: list[str] = []
        for key, size in rows:
            try:
                self.cluster_row(key, size, res, cpu)
            except Exception as exc:
                log(f"  ! cluster {key}: {type(exc).__name__}: {exc}")
                if os.environ.get("MINOU_BENCH_DEBUG"):
                    traceback.print_exc()
                failed.append(f"{key}: {type(exc).__name__}: {exc}")
        # ratios of rows of this run (paired: minutes apart, not runs apart)
        for k in CLUSTER_SIZES[1:]:
            for kind in ("pub", "con"):
                one, more = res.get(f"cl_{kind}1"), res.get(f"cl_{kind}{k}")
                if one and more:
                    res[f"cl_{kind}{k}_vs_1"] = round(more / one, 3)
        direct, relay = res.get("cl_fwd_direct"), res.get("cl_fwd_relay")
        if direct and relay:
            res["cl_fwd_ratio"] = round(relay / direct, 3)
        if failed:
            raise RuntimeError("; ".join(failed))

    def run_spark(self, res: dict[str, Any], cpu: dict[str, Any]) -> None:
        """Test f: bench/spark_bench.py in a subprocess (its own SparkSession, JVM and
        Python workers), against a fresh broker pre-filled with N x 100 B JSON."""
        import importlib.util

        missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
        if missing:
            log(f"  minou      spark       skipped: {' and '.join(missing)} not installed in "
                f"{sys.executable} (pip install pyspark pyarrow)")
            return
        a = self.args
        self.reset("minou")
        depth = self.prefill("minou", a.n, 100, 1, a.prefill_limit_s, peer="minou-json")
        res["spark_depth"] = depth
        # One client as deployed: its own key pair, registered by one native connection
        # (the bench broker's rule accepts bench-*), then handed to Spark as a key file.
        import minou
        from minou.auth import keys as keyfiles

        client_id = f"bench-spark-{os.getpid()}-{self.minou.starts}"
        key_file, _ = keyfiles.save(self.clients._process_key(), self.workdir / "keys",
                                    client_id)
        minou.connect_sync(self.minou.url, client_id=client_id, key=str(key_file),
                           reconnect=False).close()
        work = Path(tempfile.mkdtemp(prefix="spark-", dir=self.workdir))
        cmd = [sys.executable, str(HERE / "spark_bench.py"), "--url", self.minou.url,
               "--client-id", client_id, "--key-file", str(key_file), "--workdir", str(work),
               "--broker-pid", str(self.minou.pid), "--rate", str(a.spark_rate),
               "--duration", str(a.spark_duration)]
        t0 = time.monotonic()
        with open(self.workdir / "spark.log", "ab") as err:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True,
                                  timeout=900, stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"spark_bench.py exited with {proc.returncode} "
                               f"(see {self.workdir}/spark.log)")
        out = json.loads(lines[-1][len("RESULT "):])
        cpu.update(out.pop("cpu_pct", {}))
        res.update(out)
        res["spark_total_s"] = round(took, 1)
        for key in SPARK_ROWS:
            c = cpu.get(key)
            if c is None:  # a ratio of two rows
                log(f"  minou      {key:19s} {fmt(res.get(key)):>8s}")
                continue
            unit = {"spark_batch_latency": "s", "spark_vs_rate": "x"}.get(key, "rows/s")
            log(f"  minou      {key:19s} {fmt(res.get(key)):>8s} {unit}  (CPU% "
                f"server {c.get('server')}, Spark driver+JVM+workers {c.get('clients')}; "
                f"host busy {c.get('host_busy_cores')} cores)")
        log(f"  minou      spark: read {res.get('spark_read_count'):,} rows in "
            f"{res.get('spark_read_s')} s; drain {res.get('spark_stream_rows'):,} -> "
            f"{res.get('spark_stream_out'):,} in {res.get('spark_stream_s')} s, "
            f"{res.get('spark_stream_batches')} batches, median "
            f"{res.get('spark_stream_median_batch_ms')} ms; live {res.get('spark_lat_batches')}"
            f" batches of ~{res.get('spark_lat_rows_per_batch')} rows at "
            f"{res.get('spark_lat_rate')} msg/s, p90 {res.get('spark_lat_p90_ms')} ms, phases "
            f"{res.get('spark_lat_phases_ms')}; session start {res.get('spark_session_s')} s, "
            f"warm-up {res.get('spark_warmup_s')} s, {took:.0f} s in all")


# ------------------------------------------------------------------- report
def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v < 1000:
        return f"{v:.2f}" if v < 100 else f"{v:.1f}"
    return f"{int(v):,}"


def ratio(a: Any, b: Any) -> str:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return "-"
    return f"{a / b:.2f}x"


def verdict(v: Any, target: tuple[str, float] | None) -> str:
    if target is None:
        return ""
    op, x = target
    label = f"{op} {fmt(x) if x >= 1000 else f'{x:g}'}"
    if not isinstance(v, int | float):
        return label
    ok = {">=": v >= x, "<=": v <= x, "<": v < x}[op]
    return f"{label} {'✓' if ok else '✗'}"


def wait_quiet(threshold: float, patience: float) -> float:
    """Wait up to ``patience`` s for the 1-minute load average to drop under
    ``threshold`` (this machine is shared and the tests before leave load behind);
    returns the load average the test starts at."""
    deadline = time.monotonic() + patience
    while (load := os.getloadavg()[0]) > threshold and time.monotonic() < deadline:
        time.sleep(1.0)
    return load


def noisy_rows(noisy: dict[str, list[float]]) -> set[str]:
    """The row keys of the tests that started noisy (a test's rows share its key's
    prefix: lat -> lat_p50_ms, disk -> disk_p99_ms, pub_64KiB -> pub_64KiB_mbs)."""
    return {key for key, *_ in ROWS for t in noisy if key == t or key.startswith(t + "_")
            or (t == "cluster" and key.startswith("cl_"))
            or (t == "spark" and key.startswith("spark_"))
            or (t == "mem" and key.startswith("mem_"))}


def table(med: dict[str, dict[str, Any]], systems: list[str], args: Any,
          spread: dict[str, dict[str, tuple[Any, Any]]] | None = None,
          noisy: set[str] | None = None) -> str:
    peers = [s for s in systems if s not in ("minou", REDIS)]
    # minou on Redis is compared with minou on SQLite (its own target), not the peers
    on_redis = [REDIS] if REDIS in systems else []
    redis_head = [REDIS, f"{REDIS}/minou", f"target ({REDIS}/minou)"] if on_redis else []
    head = ["test", "minou", "target (minou)", *redis_head, *peers,
            *[f"minou/{p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (len(head) - 1)]
    for key, desc, _better, target in ROWS:
        if not any(med.get(s, {}).get(key) is not None for s in systems):
            continue
        desc = desc.replace("SPARKRATE", f"{int(args.spark_rate):,}")
        desc = desc.replace("RATE", f"{int(args.rate):,}").replace("MEMN", f"{args.mem_n:,}")
        desc = desc.replace("HTTPB", f"{args.http_batch}").replace("PROCS", f"{args.procs}")
        desc = desc.replace("CLN", f"{args.cluster_n:,}").replace("RECN", f"{args.rec_n:,}")
        desc = desc.replace("HTTPC", f"{args.http_procs} x {args.http_conns} "
                            f"{'conn' if args.http_conns == 1 else 'conns'}"
                            f"{'' if args.http_client == 'raw' else f', {args.http_client}'}")

        def cell(s: str, key: str = key) -> str:
            v = med.get(s, {}).get(key)
            text = fmt(v)
            if spread and v is not None and key in spread.get(s, {}):
                lo, hi = spread[s][key]
                if lo != hi:
                    text += f" ({fmt(lo)} - {fmt(hi)})"
            return text

        mv = med.get("minou", {}).get(key)
        redis_cells = []
        if on_redis:
            rv = med.get(REDIS, {}).get(key)
            share = rv / mv if isinstance(rv, int | float) and isinstance(mv, int | float) \
                and mv else None
            goal = (">=", REDIS_TARGET) if key in GROUPS["a"] + GROUPS["b"] else None
            redis_cells = [cell(REDIS), ratio(rv, mv), verdict(share, goal)]
        if noisy and key in noisy:
            desc += " *"
        cells = [desc, cell("minou"), verdict(mv, target), *redis_cells,
                 *[cell(p) for p in peers],
                 *[ratio(mv, med.get(p, {}).get(key)) for p in peers]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def interval_line(med: dict[str, dict[str, Any]]) -> str | None:
    """Issue 19 item 2's target, across two columns: minou-interval's e2e p99 against
    Redis AOF everysec's in the same run."""
    iv = med.get(INTERVAL, {}).get("lat_p99_ms")
    redis = med.get("redis-aof", {}).get("lat_p99_ms")
    if iv is None or not redis:
        return None
    share = iv / redis
    return (f"{INTERVAL} e2e p99 / redis-aof e2e p99 = {share:.2f} (target "
            f"{verdict(share, ('<=', INTERVAL_P99_TARGET))})")


def medians(runs: list[dict[str, dict[str, Any]]], systems: list[str]):
    med: dict[str, dict[str, Any]] = {}
    spread: dict[str, dict[str, tuple[Any, Any]]] = {}
    for s in systems:
        med[s], spread[s] = {}, {}
        keys = {k for r in runs for k in r.get(s, {})}
        for key in sorted(keys):
            vals = [r[s][key] for r in runs if isinstance(r.get(s, {}).get(key), int | float)
                    and not isinstance(r[s][key], bool)]
            if vals:
                m = statistics.median(vals)
                med[s][key] = round(m, 3) if isinstance(m, float) and m < 1000 else round(m)
                spread[s][key] = (min(vals), max(vals))
        cpu: dict[str, dict[str, Any]] = {}
        for r in runs:
            for test, sides in r.get(s, {}).get("cpu_pct", {}).items():
                for side, v in sides.items():
                    if v is not None:
                        cpu.setdefault(test, {}).setdefault(side, []).append(v)
        med[s]["cpu_pct"] = {t: {side: round(statistics.median(v), 1) for side, v in d.items()}
                             for t, d in cpu.items()}
    return med, spread


def cpu_table(med: dict[str, dict[str, Any]], systems: list[str]) -> str:
    tests = [t for t in [*ALL_TESTS, *SPARK_ROWS]
             if any(t in med[s].get("cpu_pct", {}) for s in systems)]
    lines = ["| test | " + " | ".join(systems) + " |", "|---|" + "---:|" * len(systems)]
    for t in tests:
        cells = []
        for s in systems:
            c = med[s].get("cpu_pct", {}).get(t)
            # minou-redis's server is two processes: "broker + redis-server"
            srv = f"{c.get('server')} + {c['aux']}" if c and "aux" in c else \
                (c.get("server") if c else None)
            cells.append(f"{srv} / {c.get('clients')} / {c.get('host_busy_cores')}"
                         if c else "-")
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cluster_table(med: dict[str, dict[str, Any]], args: Any,
                  spread: dict[str, dict[str, tuple[Any, Any]]] | None = None) -> str:
    """Test g: msg/s, its ratio to the row's reference (1 broker; the relay pair: to the
    producers on the primary), both medians, the ratio of each run's pair; then CPU %
    of one core of each broker (b1 = the primary) and of redis-server over the row, and
    CPU per message: what it takes to project more machines (docs/cluster.md)."""
    m = med.get("minou", {})
    cpu = m.get("cpu_pct", {})
    head = ["row", "brokers", "clients on", "msg/s", "ratio", "CPU% broker 1 (primary)",
            "broker 2", "broker 3", "redis-server", "clients", "host busy cores",
            "brokers ns/msg", "redis ns/msg"]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---|" + "---:|" * (len(head) - 3)]
    rows = [*[(f"cl_pub{k}", f"publish 100 B, 8 queues, {args.procs} producers", k,
               "round-robin", f"cl_pub{k}_vs_1" if k > 1 else None) for k in CLUSTER_SIZES],
            *[(f"cl_con{k}", f"consume+ack, 8 queues, {args.procs} consumers", k,
               "round-robin", f"cl_con{k}_vs_1" if k > 1 else None) for k in CLUSTER_SIZES],
            ("cl_fwd_direct", f"publish 100 B, 8 queues, {args.procs} producers", 2,
             "the primary", None),
            ("cl_fwd_relay", f"publish 100 B, 8 queues, {args.procs} producers", 2,
             "the standby (relayed)", "cl_fwd_ratio")]
    for key, what, size, where, ratio_key in rows:
        if m.get(key) is None:
            continue
        rate = fmt(m[key])
        if spread and key in spread.get("minou", {}):
            lo, hi = spread["minou"][key]
            if lo != hi:
                rate += f" ({fmt(lo)} - {fmt(hi)})"
        c = cpu.get(key, {})

        def pct(v: Any) -> str:  # CPU % with the one decimal the medians keep
            return "-" if v is None else f"{v:.1f}"

        def ns(v: Any) -> str:
            return "-" if v is None else f"{round(v):,}"

        cells = [what, str(size), where, rate,
                 f"{m[ratio_key]:.2f}x" if ratio_key and m.get(ratio_key) is not None else "",
                 *[pct(c.get(f"b{i}")) if i <= size else "" for i in (1, 2, 3)],
                 pct(c.get("redis")), pct(c.get("clients")), fmt(c.get("host_busy_cores")),
                 ns(c.get("brokers_ns_msg")), ns(c.get("redis_ns_msg"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def versions(peers_mod: Any) -> dict[str, Any]:
    v = peers_mod.versions()
    try:
        v["minou"] = metadata.version("minou")
    except Exception:
        v["minou"] = None
    with contextlib.suppress(Exception):
        v["minou_git"] = subprocess.run(
            ["git", "-C", str(REPO), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10).stdout.strip() or None
    with contextlib.suppress(Exception):
        v["sqlite"] = __import__("sqlite3").sqlite_version
    return v


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "kernel": platform.release(),
                            "python": platform.python_version()}
    with contextlib.suppress(Exception):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(Exception):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_gib"] = round(int(line.split()[1]) / 2**20, 1)
    with contextlib.suppress(Exception):
        info["os"] = platform.freedesktop_os_release().get("PRETTY_NAME")
    return info


def git_head() -> str | None:
    """The commit the measured source comes from, "+dirty" when src/ differs from it
    (None outside a git checkout): docs/benchmarks.md quotes it beside each table."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "src"],
                               capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def dated_heading(command: str, head: str | None) -> str:
    """What goes above a run's table in docs/benchmarks.md ("one table per date")."""
    return (f"### {time.strftime('%Y-%m-%d')}, HEAD {head or 'unknown'}\n\n"
            f"`{command}`")


def snapshot_src(workdir: Path) -> dict[str, Any]:
    """Copy src/minou into the work dir and put it first on the import path of the
    broker and of every worker, so one run measures one version of the code even
    when the work tree changes meanwhile."""
    src = REPO / "src" / "minou"
    dest = workdir / "src"
    shutil.copytree(src, dest / "minou", ignore=shutil.ignore_patterns("__pycache__"))
    digest = hashlib.sha256()
    for f in sorted((dest / "minou").rglob("*")):
        if f.is_file():
            digest.update(str(f.relative_to(dest)).encode() + b"\0" + f.read_bytes())
    info = {"snapshot": str(dest), "sha256": digest.hexdigest()[:16], "head": git_head()}
    spark_src = REPO / "src" / "pyspark_minou"  # the connector test f runs (the Spark workers)
    if spark_src.is_dir():
        shutil.copytree(spark_src, dest / "pyspark_minou",
                        ignore=shutil.ignore_patterns("__pycache__"))
        sdigest = hashlib.sha256()
        for f in sorted((dest / "pyspark_minou").rglob("*")):
            if f.is_file():
                sdigest.update(str(f.relative_to(dest)).encode() + b"\0" + f.read_bytes())
        info["pyspark_minou_sha256"] = sdigest.hexdigest()[:16]
    sys.path.insert(0, str(dest))  # spawned workers inherit sys.path
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(dest), *filter(None, [os.environ.get("PYTHONPATH")])])  # the broker, Spark
    return info


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(DEFAULT_TESTS)
    out: list[str] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item in GROUPS:
            out += GROUPS[item]
        elif item in ALL_TESTS:
            out.append(item)
        else:
            raise SystemExit(f"--only: unknown test {item!r} (known: a, b, c, d, e, f, g, "
                             f"{', '.join(ALL_TESTS)})")
    return [t for t in ALL_TESTS if t in out]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs; the table shows medians")
    ap.add_argument("--quiet-load", type=float, default=0.5,
                    help="before each test, wait for the 1-minute load average to drop "
                         "under this; a test that starts above it is marked noisy (*)")
    ap.add_argument("--quiet-wait", type=float, default=20.0,
                    help="how long to wait for --quiet-load before each test, s")
    ap.add_argument("-n", type=int, default=100_000, help="messages per throughput test")
    ap.add_argument("--only", help="tests: a,b,c,d,e,f,g or row keys (pub_100B, con4_p1000, "
                                   "lat, disk, mem, recovery, http_pub, http_con, spark, "
                                   "cluster); default: "
                                   "all but g")
    ap.add_argument("--peers", default=None,
                    help="comma separated: minou-redis (a minou broker on Redis, tests a-c), "
                         "minou-interval (the SQLite broker, its channel's durability "
                         "'interval', tests a-c and http_pub), "
                         "redis-aof,redis-mem,nats-js,rabbitmq; 'none' for the SQLite "
                         "broker alone (default: each whose server binary is installed)")
    ap.add_argument("--limit-s", type=float, default=10.0, help="time cap per throughput test")
    ap.add_argument("--prefill-limit-s", type=float, default=120.0)
    ap.add_argument("--window", type=int, default=1000, help="unconfirmed publishes in flight")
    ap.add_argument("--batch", type=int, default=1000, help="consumer prefetch / batch (test b)")
    ap.add_argument("--procs", type=int, default=4,
                    help="producers / consumers in the 4x rows and in test g")
    ap.add_argument("--cluster-placement", choices=["primary", "spread"], default="primary",
                    help="test g: one primary serving every queue (standbys relay), or the "
                         "queues spread over the brokers (docs/cluster.md)")
    ap.add_argument("--cluster-n", type=int, default=300_000,
                    help="messages per row of test g (or 10 s): N = 100,000 is over in about "
                         "a second there, too short for the CPU of a standby's relay to show "
                         "above /proc's 10 ms ticks")
    ap.add_argument("--rate", type=float, default=2000.0, help="latency test rate, msg/s")
    ap.add_argument("--duration", type=float, default=5.0, help="latency test duration, s")
    ap.add_argument("--lat-batch", type=int, default=100, help="latency consumer prefetch")
    ap.add_argument("--mem-n", type=int, default=1_000_000, help="messages stored in test d")
    ap.add_argument("--mem-procs", type=int, default=2, help="producers filling test d")
    ap.add_argument("--mem-limit-s", type=float, default=300.0, help="time cap to fill test d")
    ap.add_argument("--mem-runs", type=int, default=1,
                    help="runs that include test d (it is slow and steady)")
    ap.add_argument("--rec-n", type=int, default=3_000_000,
                    help="messages stored before the recovery row's restart")
    ap.add_argument("--rec-limit-s", type=float, default=180.0,
                    help="how long the recovery row may take to store them, s")
    ap.add_argument("--http-procs", type=int, default=4,
                    help="client processes in the HTTP rows (test e)")
    ap.add_argument("--http-conns", type=int, default=16,
                    help="keep-alive connections per process in test e, one request in "
                         "flight on each")
    ap.add_argument("--http-batch", type=int, default=100,
                    help="messages per request in test e's batch publish row")
    ap.add_argument("--http-client", choices=["raw", "httpx"], default="raw",
                    help="test e's client: raw (asyncio + httptools parser, cheap) or "
                         "httpx.AsyncClient (see bench/http_bench.py)")
    ap.add_argument("--spark-rate", type=float, default=1000.0,
                    help="producer rate while test f measures micro-batch durations, msg/s")
    ap.add_argument("--spark-duration", type=float, default=10.0,
                    help="how long test f's producer publishes, s")
    ap.add_argument("--live-src", action="store_true",
                    help="run src/ as it is at each moment (default: a copy taken at the start)")
    ap.add_argument("--out", default=str(HERE / "results" / "latest.json"))
    args = ap.parse_args()

    # bench/ first on the path: peers.py (the peer drivers), bench_clients.py and
    # bench_servers.py live here; spawned workers inherit sys.path and import them too
    sys.path.insert(0, str(HERE))
    import bench_clients as clients
    import bench_servers as servers
    import peers as peers_mod

    tests = parse_only(args.only)
    if args.peers is None:
        # tests no peer runs (HTTP, Spark, cluster) alone: no peer server to start for them
        wanted = [] if all(t in MINOU_ONLY for t in tests) else servers.installed_peers()
    elif args.peers.strip().lower() in ("", "none"):
        wanted = []
    else:
        wanted = [p.strip() for p in args.peers.split(",") if p.strip()]
    for p in wanted:
        if p not in peers_mod.PEERS and p not in (REDIS, INTERVAL):
            print(f"unknown peer {p!r} (known: {REDIS}, {INTERVAL}, "
                  f"{', '.join(peers_mod.PEERS)})",
                  file=sys.stderr)
            return 2

    def on_term(signum: int, frame: Any) -> None:  # make `finally` stop our servers
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    workdir = Path(tempfile.mkdtemp(prefix="minou-bench-"))
    src_info = snapshot_src(workdir) if not args.live_src else {"snapshot": None,
                                                                   "head": git_head()}
    versions_at_start = versions(peers_mod)  # git describe of the tree that was copied
    bench = Bench(args, peers_mod, clients, servers, workdir)
    log(f"minou bench: tests {', '.join(tests)}; {args.runs} run(s); work dir {workdir}; "
        f"minou source {src_info.get('snapshot') or 'live src/'} {src_info.get('sha256', '')}")
    runs: list[dict[str, dict[str, Any]]] = []
    run_loads: list[tuple[float, float, float]] = []
    noisy: dict[str, list[float]] = {}  # test -> the load averages it started at, if high
    errors: list[str] = []
    started = time.monotonic()
    try:
        peers_on = bench.start_peers(wanted)
        # the broker on Redis right after the one on SQLite: its ratio to it is taken
        # from two measurements as close in time as the interleaving allows
        systems = ["minou", *sorted(peers_on, key=lambda s: s != REDIS)]
        for i in range(args.runs):
            log(f"=== run {i + 1}/{args.runs}")
            run: dict[str, dict[str, Any]] = {s: {"cpu_pct": {}} for s in systems}
            log(f"  load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            run_loads.append(os.getloadavg())
            for test in tests:
                if test in ("mem", "recovery") and i >= args.mem_runs:
                    continue
                load = wait_quiet(args.quiet_load, args.quiet_wait)
                if load > args.quiet_load:
                    log(f"  {test}: load average {load:.2f} after {args.quiet_wait:g} s of "
                        f"waiting (> {args.quiet_load:g}): marked noisy")
                    noisy.setdefault(test, []).append(round(load, 2))
                for system in systems:  # interleaved: every system runs a test in turn
                    try:
                        bench.run_test(test, system, run[system], run[system]["cpu_pct"])
                    except Exception as exc:
                        msg = f"run {i + 1} {system} {test}: {type(exc).__name__}: {exc}"
                        log(f"  ! {msg}")
                        if os.environ.get("MINOU_BENCH_DEBUG"):
                            traceback.print_exc()
                        errors.append(msg)
                        run[system].setdefault("errors", []).append(msg)
            runs.append(run)
    except KeyboardInterrupt:
        log("interrupted; stopping the servers started here")
        bench.stop_all()
        return 130
    finally:
        rss_after = {s: peers_mod.proc_rss_mib(bench.pid(s))
                     for s in [*bench.brokers, *bench.peer_servers]}
        bench.stop_all()
        if not errors:  # keep the logs when something went wrong
            shutil.rmtree(workdir, ignore_errors=True)

    med, spread = medians(runs, systems)
    elapsed = time.monotonic() - started
    log("")
    log(f"medians of {args.runs} run(s) (min - max); N={args.n:,} or {args.limit_s:g} s "
        f"per test, window {args.window}, prefetch {args.batch}, {args.procs} processes in the 4x "
        f"rows, latency at {args.rate:g}/s for {args.duration:g} s; ratio = minou / peer "
        f"(throughput: > 1 is minou faster; latency, memory: < 1 is minou better)"
        + (f"; {REDIS} = a minou broker on Redis (AOF always), {REDIS}/minou its ratio to "
           f"the SQLite broker" if REDIS in systems else "")
        + (f"; {INTERVAL} = the SQLite broker with the bench channel's durability "
           f"'interval' (fsync within 50 ms)" if INTERVAL in systems else ""))
    command = " ".join([Path(sys.executable).name, *sys.argv])
    log("")
    log(dated_heading(command, src_info.get("head")))
    log("")
    log(table(med, systems, args, spread if args.runs > 1 else None, noisy_rows(noisy)))
    line = interval_line(med)
    if line:
        log(line)
    if noisy:
        log("* started at a load average over --quiet-load "
            f"({args.quiet_load:g}) in some run: " + "; ".join(
                f"{t} {', '.join(f'{x:.2f}' for x in v)}" for t, v in noisy.items()))
    cpu_text = cpu_table(med, systems)
    if cpu_text.count("\n") > 1:  # test g alone has its CPU in the cluster table below
        log("")
        log("server CPU % / clients CPU % (of one core) / whole machine busy cores (of "
            f"{os.cpu_count()}), medians" + (f"; {REDIS}'s server: broker + redis-server"
                                             if REDIS in systems else "") + ":")
        log(cpu_text)
    if any(med["minou"].get(k) is not None for k in CLUSTER_ROWS):
        log("")
        log(f"cluster on one Redis (test g), {args.cluster_n:,} x 100 B per row (or "
            f"{args.limit_s:g} s), {args.procs} processes, medians of {args.runs} run(s) "
            "(min - max); ratio: "
            "to 1 broker, the relayed pair: standby / primary (median of each run's ratio); "
            "CPU % of one core of each process over the row; ns/msg: CPU per message of "
            "all brokers together, of redis-server:")
        log(cluster_table(med, args, spread if args.runs > 1 else None))
    if errors:
        log("")
        log("errors (logs kept in " + str(workdir) + "):")
        for e in errors:
            log("  " + e)
    doc = {
        "meta": {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": command,
            "machine": machine(),
            "versions": versions_at_start,
            "minou_src": src_info,
            "params": {k: getattr(args, k) for k in (
                "runs", "n", "limit_s", "window", "batch", "procs", "rate", "duration",
                "lat_batch", "mem_n", "mem_procs", "mem_runs", "http_procs", "http_conns",
                "http_batch", "http_client", "spark_rate", "spark_duration", "cluster_n")},
            "tests": tests,
            "systems": systems,
            "elapsed_s": round(elapsed, 1),
            "load_average_at_run_start": run_loads,
            "noisy_tests": noisy,  # started over --quiet-load after --quiet-wait s
            "units": "throughput keys msg/s; lat_* ms; mem_* MiB; cpu_pct % of one core; "
                     "spark_read/spark_stream rows/s, spark_batch_latency s",
        },
        "median": med,
        "spread": {s: {k: list(v) for k, v in d.items()} for s, d in spread.items()},
        "runs": runs,
        "errors": errors,
        "server_rss_mib_at_end": rss_after,
        "table_markdown": table(med, systems, args, spread if args.runs > 1 else None,
                                noisy_rows(noisy)),
    }
    if any(med["minou"].get(k) is not None for k in CLUSTER_ROWS):
        doc["cluster_table_markdown"] = cluster_table(med, args,
                                                      spread if args.runs > 1 else None)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"wrote {out} ({elapsed / 60:.1f} min)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
