#!/usr/bin/env python3
"""Where minou's time goes: py-spy samples the broker process and one client
process during a publish or a consume+ack workload (the same client code as
bench/minou_bench.py), and prints function-level hotspots per process and thread.

  .venv/bin/pip install py-spy
  .venv/bin/python bench/profile_minou.py [--scenario pub,pub1k,pub1m,con,con4] [--seconds 8]
  .venv/bin/python bench/profile_minou.py --storage redis   (a broker on Redis)

With ``--storage redis`` the broker runs on a redis-server started here (AOF
``always``, as minou_bench.py's minou-redis), and Redis's own view of the workload
is printed too: INFO commandstats over the measured seconds (calls and usec per call
of EVALSHA, MULTI, EXEC, ...; commits = EXEC calls, plus settle-only batches, which
run their scripts outside MULTI), messages per commit, Redis's CPU, and SLOWLOG.

Collapsed stacks (flamegraph.pl / speedscope input) go to bench/results/profile/.
py-spy runs without --idle, so a sample is taken only while a thread is on the CPU
(or at least not blocked): a function's percentage is its share of that thread's
busy samples. How busy each thread was (CPU seconds / wall seconds, from
/proc/PID/task/TID/stat) is printed beside it. C code (uvloop, sqlite3, msgspec)
is charged to the Python function that called it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


# ----------------------------------------------------------------- the client
async def _client(role: str, url: str, seconds: float, size: int) -> None:
    import bench_clients as bc

    peer = bc.MinouPeer(url)
    await peer.connect()
    await asyncio.sleep(1.0)  # let py-spy attach
    t0 = time.monotonic()
    if role == "pub":
        # the windows of test a's rows: 1000, 64 for 64 KiB, 8 for 1 MiB
        window = 8 if size >= 1 << 20 else 64 if size >= 1 << 16 else 1000
        count, _ = await peer.publish(10**9, size, window, t0 + seconds)
        dt = time.monotonic() - t0
    else:
        count, last = await peer.consume(10**9, 1000, t0 + seconds, 2.0, "c0")
        dt = last - t0
    print(f"{role}: {count:,} msgs in {dt:.2f} s = {count / dt:,.0f} msg/s", flush=True)
    await peer.close()


def client_main(args: argparse.Namespace) -> None:
    import uvloop

    uvloop.install()
    asyncio.run(_client(args.client, args.url, args.seconds, args.size))


# --------------------------------------------------------------- the analysis
FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def short(frame: str) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    path = m.group("file")
    for marker in ("site-packages/", "src/", "lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({path})"


def summarize(raw: Path, top: int, cpu: dict[str, float] | None = None) -> str:
    """Self and inclusive time per function, per thread, from py-spy's raw output."""
    threads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    incl: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    totals: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        thread = "?"
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            thread, frames = frames[0], frames[1:]
        count = int(n)
        fr = [short(f) for f in frames]
        totals[thread] += count
        if fr:
            threads[thread][fr[-1]] += count
            for f in set(fr):
                incl[thread][f] += count
    out = []
    for thread, total in totals.most_common():
        name = thread
        if any("_worker (concurrent" in f for f in incl[thread]):
            name += "  [executor thread: SQLite writer/reader]"
        m = re.search(r"\((\d+)\)", thread)
        pct = (cpu or {}).get(m.group(1)) if m else None
        on_cpu = f", on CPU {pct:.0f}% of the time" if pct is not None else ""
        out.append(f"  {name}: {total} busy samples{on_cpu}")
        out.append(f"    {'self %':>7s}  {'incl %':>7s}  function")
        seen = set()
        for f, c in threads[thread].most_common(top):
            seen.add(f)
            out.append(f"    {100 * c / total:7.1f}  {100 * incl[thread][f] / total:7.1f}  {f}")
        out.append("    -- inclusive (top, not shown above):")
        shown = 0
        for f, c in incl[thread].most_common():
            if f in seen or 100 * c / total < 3:
                continue
            out.append(f"    {'':7s}  {100 * c / total:7.1f}  {f}")
            shown += 1
            if shown >= top:
                break
    return "\n".join(out)


def proc_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of a whole process."""
    if pid is None:
        return None
    return sum(thread_cpu(pid).values()) or None


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread id."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def busy(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float]:
    """Percent of one core per thread id over ``wall`` seconds."""
    return {tid: 100 * (after[tid] - before.get(tid, 0.0)) / wall for tid in after}


# ------------------------------------------------------------- orchestration
def pyspy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    return exe


def record(pid: int, out: Path, fmt: str, rate: int) -> subprocess.Popen:
    return subprocess.Popen(
        [pyspy(), "record", "--pid", str(pid), "--rate", str(rate), "--threads",
         "--nonblocking", "--format", fmt, "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def redis_view(url: str) -> Any:
    """A client on the broker's redis-server (the bench's own, no password)."""
    import redis

    return redis.Redis.from_url(url)


def redis_report(r: Any, count: int, wall: float, cpu_pct: float | None) -> str:
    """What Redis did over the measured seconds: commands (calls, usec per call, share of
    the wall), commits, messages per commit, Redis's CPU, the slowest commands."""
    stats = r.info("commandstats")
    rows = sorted(((k.removeprefix("cmdstat_"), v) for k, v in stats.items()),
                  key=lambda kv: -kv[1]["usec"])
    execs = stats.get("cmdstat_exec", {}).get("calls", 0)
    out = [f" redis-server: {sum(v['calls'] for _, v in rows):,} commands over {wall:.1f} s"
           + (f"; its CPU {cpu_pct:.0f}% of one core" if cpu_pct is not None else "")]
    out.append(f"    {'command':12s} {'calls':>9s} {'usec/call':>10s} {'usec total':>11s}"
               f" {'% of wall':>9s}")
    for name, v in rows:
        out.append(f"    {name:12s} {v['calls']:9,} {v['usec_per_call']:10.1f} {v['usec']:11,}"
                   f" {100 * v['usec'] / 1e6 / wall:9.1f}")
    if execs:
        out.append(f"    atomic commits (EXEC): {execs:,} = {execs / wall:,.0f}/s, "
                   f"{count / execs:,.0f} messages per commit, {1e3 * wall / execs:.2f} ms "
                   "of wall per commit")
    for entry in r.slowlog_get(5):
        cmd = entry["command"]
        cmd = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
        out.append(f"    slowlog: {entry['duration']:,} usec  {cmd[:60]}")
    return "\n".join(out)


def scenario(name: str, args: argparse.Namespace, outdir: Path, workdir: Path) -> str:
    import bench_clients as bc
    import bench_servers as bs

    broker = bs.MinouBroker(workdir, python=sys.executable, storage=args.storage,
                            name="minou" if args.storage == "sqlite" else "minou-redis")
    report = []
    try:
        url = broker.start()
        role, size = {"pub": ("pub", 100), "pub1k": ("pub", 1024), "pub1m": ("pub", 1 << 20),
                      "con": ("con", 100), "con4": ("con", 100)}[name]
        # con4: four competing consumer processes (test b's second row); the first
        # is sampled as "the client"
        extra_clients = 3 if name == "con4" else 0
        if role == "con":
            n = args.prefill
            jobs = [dict(peer="minou", url=url, role="pub", n=n // 2, size=100, window=1000,
                         limit_s=300) for _ in range(2)]
            bc.run_jobs(jobs, timeout=400)
            time.sleep(1)
        r = None
        if broker.redis is not None:  # count from here: the measured workload alone
            r = redis_view(broker.redis.url)
            r.config_set("slowlog-log-slower-than", 1000)
            r.slowlog_reset()
            r.config_resetstat()
        command = [sys.executable, __file__, "--client", role, "--url", url,
                   "--seconds", str(args.seconds), "--size", str(size)]
        client = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        others = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
                  for _ in range(extra_clients)]
        time.sleep(0.5)
        cpu0 = {"broker": thread_cpu(broker.pid), "client": thread_cpu(client.pid)}
        redis_pid = broker.redis.pid if broker.redis is not None else None
        redis_cpu = [proc_cpu(redis_pid), None]  # over the broker's window below
        t_cpu0 = time.monotonic()
        spies = []
        for who, pid in (("broker", broker.pid), ("client", client.pid)):
            path = outdir / f"{name}-{who}.txt"
            spies.append((who, "raw", path, record(pid, path, "raw", args.rate)))
        cpu1: dict[str, dict[str, float]] = {"broker": {}, "client": {}}
        while client.poll() is None:  # the last reading before the client exits
            cpu1 = {"broker": thread_cpu(broker.pid), "client": thread_cpu(client.pid)
                    or cpu1["client"]}
            redis_cpu[1] = proc_cpu(redis_pid)
            t_cpu1 = time.monotonic()
            time.sleep(0.2)
        out, _ = client.communicate(timeout=args.seconds + 60)
        for other in others:
            out += " | " + other.communicate(timeout=60)[0].strip()
        redis_text = ""
        if r is not None:
            m = re.search(r"([\d,]+) msgs in ([\d.]+) s", out)
            count, dt = (int(m.group(1).replace(",", "")), float(m.group(2))) if m else (0, 0)
            # commands per second over the client's measured seconds (the few before
            # it, its connect and py-spy's wait, are idle); CPU over the broker's window
            wall = t_cpu1 - t_cpu0
            cpu_pct = None if None in redis_cpu or not wall else \
                100 * (redis_cpu[1] - redis_cpu[0]) / wall
            redis_text = redis_report(r, count, dt or wall, cpu_pct)
            r.close()
        for who, _fmt, _path, proc in spies:
            if who == "broker":
                proc.send_signal(signal.SIGINT)
        for _who, _fmt, _path, proc in spies:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        report.append(f"== {name} ({args.storage}): {out.strip()}")
        if redis_text:
            report.append(redis_text)
        for who in ("broker", "client"):
            raw = outdir / f"{name}-{who}.txt"
            if raw.exists():
                wall = t_cpu1 - t_cpu0
                pcts = busy(cpu0[who], cpu1[who], wall)
                report.append(f" {who} ({raw.name}: collapsed stacks); whole process "
                              f"{sum(pcts.values()):.0f}% of one core over {wall:.1f} s")
                report.append(summarize(raw, args.top, pcts))
            else:
                report.append(f" {who}: no samples (py-spy failed?)")
    finally:
        broker.close()
    return "\n".join(report)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="pub,pub1k,con")
    ap.add_argument("--storage", choices=["sqlite", "redis"], default="sqlite",
                    help="the broker's storage (redis: a redis-server started here)")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--prefill", type=int, default=600_000, help="messages before 'con'")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--out", default=str(HERE / "results" / "profile"))
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        client_main(args)
        return 0
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="minou-profile-"))
    reports = []
    try:
        for name in args.scenario.split(","):
            rep = scenario(name.strip(), args, outdir, workdir)
            print(rep, flush=True)
            reports.append(rep)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rev = subprocess.run(["git", "-C", str(HERE.parent), "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    where = subprocess.run([sys.executable, "-c", "import minou; print(minou.__file__)"],
                           capture_output=True, text=True).stdout.strip()
    head = (f"minou from {where} (work tree {rev}), storage {args.storage}, py-spy at "
            f"{args.rate} Hz, {args.seconds:g} s per scenario")
    (outdir / "summary.txt").write_text(head + "\n\n" + "\n\n".join(reports) + "\n")
    print(f"wrote {outdir}/summary.txt", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
