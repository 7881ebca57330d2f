"""Where a commit's time goes under test e's HTTP publish load (issue 19, target 4): a
dev broker (this tree's ``minou``, from ``PYTHONPATH``) driven by
``http_floor.client`` (4 processes x 16 keep-alive connections, one publish in flight
on each). Printed per run: requests/s, commits, publishes per commit; the writer's
median ``apply`` and its median idle gap between two applies (ms), split into
``to_handoff`` (one apply's end -> the loop hands the next batch over) and
``handoff`` (-> the next apply starts in the writer thread); and, per commit, the
writer's and the loop thread's voluntary switches, preemptions, CPU µs and µs waited
on the run queue (``/proc/<pid>/task/<tid>/{schedstat,status}`` before and after).

    PYTHONPATH=src .venv/bin/python bench/commit_switches.py --runs 3

Alternate two trees' ``src`` (``PYTHONPATH``) run by run on a shared machine: only
ratios of neighbouring runs mean anything there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _task(tid: int) -> dict[str, int]:
    base = Path(f"/proc/self/task/{tid}")
    run_ns, wait_ns, _ = (int(x) for x in (base / "schedstat").read_text().split())
    status = dict(line.split(":", 1) for line in (base / "status").read_text().splitlines())
    return {"run_ns": run_ns, "wait_ns": wait_ns,
            "switches": int(status["voluntary_ctxt_switches"]),
            "preempted": int(status["nonvoluntary_ctxt_switches"])}


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3 if values else 0.0


def serve(data: str, ready: Any, control: Any) -> None:
    """The broker, in this process's main thread; a side thread answers ``control``:
    "mark" (read the counters) and "report" (counters since the mark)."""
    from minou.cli import main as minou_main
    from minou.server import app as appmod

    seen: dict[str, Any] = {"writer": None, "server": None}
    # (handed over by the loop, apply starts, apply ends) of each commit
    spans: list[tuple[float, float, float]] = []
    apply_orig = None
    start_orig = appmod.BrokerServer.start
    write_orig = appmod.BrokerServer.write
    handed: dict[int, float] = {}  # batch number -> when the loop handed it over

    def traced_write(self: Any, batch: Any) -> None:
        handed[batch.number] = time.perf_counter()
        write_orig(self, batch)

    async def traced_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal apply_orig
        seen["server"] = self
        result = await start_orig(self, *args, **kwargs)
        storage = self.storage
        apply_orig = storage.apply

        def apply(batch: Any) -> Any:
            if seen["writer"] is None:
                seen["writer"] = threading.get_native_id()
            start = time.perf_counter()
            try:
                return apply_orig(batch)
            finally:
                spans.append((handed.pop(batch.number, start), start, time.perf_counter()))

        storage.apply = apply
        ready.put(self.http_address[1])
        return result

    appmod.BrokerServer.start = traced_start  # type: ignore[method-assign]
    appmod.BrokerServer.write = traced_write  # type: ignore[method-assign]
    loop_tid = threading.get_native_id()

    def answer() -> None:
        marks: dict[str, Any] = {}
        while True:
            what = control.get()
            server = seen["server"]
            now = {"loop": _task(loop_tid), "commits": server.commits,
                   "messages": server.messages_committed, "t": time.monotonic()}
            if seen["writer"] is not None:
                now["writer"] = _task(seen["writer"])
            if what == "mark":
                del spans[:]
                marks = now
                control.put("ok")
            else:
                out = {k: (now[k] if not isinstance(now[k], dict) else
                           {f: now[k][f] - marks[k][f] for f in now[k]})
                       for k in now if k in marks}
                for k in ("commits", "messages", "t"):
                    out[k] = now[k] - marks[k]
                done = list(spans)
                pairs = list(pairwise(done))
                out["apply_ms"] = _median_ms([e - s for _, s, e in done])
                # from one apply's end to the next one's start (the writer idle), in two:
                # until the loop hands the next batch over, then until apply starts
                out["gap_ms"] = _median_ms([b[1] - a[2] for a, b in pairs])
                out["to_handoff_ms"] = _median_ms([b[0] - a[2] for a, b in pairs])
                out["handoff_ms"] = _median_ms([s - h for h, s, _ in done])
                control.put(json.dumps(out))

    threading.Thread(target=answer, daemon=True).start()
    sys.argv = ["minou", "start", "--dev", "--data", data, "--port", "0", "--http-port", "0"]
    minou_main()


def one_run(procs: int, conns: int, seconds: float) -> dict[str, Any]:
    from http_floor import start_clients

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="minou-switches-") as data:
        ready, control, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
        server = ctx.Process(target=serve, args=(data, ready, control))
        server.start()
        try:
            port = ready.get(timeout=60)
            clients = start_clients(ctx, port, procs, conns, seconds, out)
            time.sleep(0.5)  # the writer's first apply has been seen
            control.put("mark")
            control.get(timeout=30)
            results = [out.get(timeout=seconds + 60) for _ in clients]
            control.put("report")
            counters = json.loads(control.get(timeout=30))
            for c in clients:
                c.join()
        finally:
            server.kill()
            server.join()
    total = sum(r[0] for r in results)
    span = max(r[2] for r in results) - min(r[1] for r in results)
    commits = max(1, counters["commits"])
    row = {"req_s": total / span, "commits": counters["commits"],
           "per_commit": counters["messages"] / commits, "apply_ms": counters["apply_ms"],
           "gap_ms": counters["gap_ms"], "to_handoff_ms": counters["to_handoff_ms"],
           "handoff_ms": counters["handoff_ms"]}
    for name in ("writer", "loop"):
        c = counters.get(name)
        if c:
            row[f"{name}_switches"] = c["switches"] / commits
            row[f"{name}_preempted"] = c["preempted"] / commits
            row[f"{name}_cpu_us"] = c["run_ns"] / commits / 1e3
            row[f"{name}_wait_us"] = c["wait_ns"] / commits / 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.procs} x {args.conns} connections, "
          f"{args.seconds:g} s a run")
    cols = ("req_s", "commits", "per_commit", "apply_ms", "gap_ms", "to_handoff_ms",
            "handoff_ms", "writer_switches", "writer_preempted", "writer_cpu_us",
            "writer_wait_us", "loop_switches", "loop_preempted", "loop_cpu_us", "loop_wait_us")
    print("| " + " | ".join(cols) + " |\n|" + "---:|" * len(cols))
    rows = []
    for _ in range(args.runs):
        row = one_run(args.procs, args.conns, args.seconds)
        rows.append(row)
        print("| " + " | ".join(f"{row.get(c, 0):,.2f}" for c in cols) + " |", flush=True)
    if len(rows) > 1:
        print("| " + " | ".join(f"{statistics.median(r.get(c, 0) for r in rows):,.2f}"
                                for c in cols) + " | (medians)")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
