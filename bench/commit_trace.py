"""Where a publish's time goes inside the broker at a low rate: a dev broker whose
commit path is timed step by step (patched from outside: nothing in src/ changes), for
issue 19's latency work. Start it, drive it with bench/latency_probe.py, and read the
report it writes ``--report-after`` seconds after its start:

    .venv/bin/python bench/commit_trace.py &        # a dev broker on :7794, /tmp/latd
    .venv/bin/python bench/latency_probe.py minou://127.0.0.1:7794 --rate 2000 -n 10000
    cat /tmp/trace_report.txt

Steps (ms: p50, p90, p99, mean): busy_at_recv (how long the commit in progress had
been running when a publish came: 0 when none ran), recv_to_handoff (the last publish
received -> its commit handed over: mostly waiting for the commit in progress), handoff
(``write()`` called -> SQLite starts: ``apply`` in the writer thread, or ``apply_now``
on the loop a turn later for a small batch), apply (SQLite), apply_to_sync and sync
(a small batch committed on the loop: -> the writer thread's ``fdatasync`` starts, and
its length), back (the last of those done -> the loop runs the done callback),
committed_to_deliver (-> the first delivery written to a socket).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from typing import Any

from minou.cli import main as minou_main
from minou.server import app as appmod
from minou.server import connection as connmod

STEPS: dict[str, list[float]] = {k: [] for k in (
    "busy_at_recv", "recv_to_handoff", "handoff", "apply", "apply_to_sync", "sync", "back",
    "committed_to_deliver")}
_last: dict[str, Any] = {"recv": None, "committed": None, "busy_since": None, "batch": None}


def _timed(storage: Any, name: str, start: str, end: str) -> None:
    """Wrap ``storage.<name>`` to stamp the batch being written with its start and end
    (one batch is written at a time: the engine's rule)."""
    inner = getattr(storage, name)

    def timed(*args: Any) -> Any:
        batch = args[0] if args else _last["batch"]
        setattr(batch, start, time.perf_counter())
        try:
            return inner(*args)
        finally:
            setattr(batch, end, time.perf_counter())

    setattr(storage, name, timed)


def patch() -> None:
    write, committed = appmod.BrokerServer.write, appmod.BrokerServer._committed
    on_publish = connmod.NativeConnection._on_publish
    send_deliveries = connmod.NativeConnection.send_deliveries

    def traced_on_publish(self: Any, frame: Any) -> None:
        now = _last["recv"] = time.perf_counter()
        busy = _last["busy_since"]
        STEPS["busy_at_recv"].append(0.0 if busy is None else now - busy)
        on_publish(self, frame)

    def traced_write(self: Any, batch: Any) -> None:
        now = time.perf_counter()
        _last["busy_since"], _last["batch"] = now, batch
        if batch.messages and _last["recv"] is not None:
            STEPS["recv_to_handoff"].append(now - _last["recv"])
        storage = self.storage
        if not getattr(storage, "_traced", False):
            # The writer thread's commit (apply), or the loop's (apply_now) followed by
            # the writer thread's fdatasync (sync): docs/reliability.md.
            _timed(storage, "apply", "_t_start", "_t_end")
            if hasattr(storage, "apply_now"):
                _timed(storage, "apply_now", "_t_start", "_t_end")
                _timed(storage, "sync", "_t_sync", "_t_synced")
            storage._traced = True
        batch._t_hand = now
        write(self, batch)

    def traced_committed(self: Any, fut: Any, batch: Any, started: float) -> None:
        now = time.perf_counter()
        _last["busy_since"] = None
        if hasattr(batch, "_t_end"):
            STEPS["handoff"].append(batch._t_start - batch._t_hand)
            STEPS["apply"].append(batch._t_end - batch._t_start)
            last = batch._t_end
            if batch.sync_within is None and hasattr(batch, "_t_synced"):
                STEPS["apply_to_sync"].append(batch._t_sync - batch._t_end)
                STEPS["sync"].append(batch._t_synced - batch._t_sync)
                last = batch._t_synced
            STEPS["back"].append(now - last)
        if batch.messages:
            _last["committed"] = now
        committed(self, fut, batch, started)

    def traced_send_deliveries(self: Any, sid: int, items: Any) -> None:
        if _last["committed"] is not None:
            STEPS["committed_to_deliver"].append(time.perf_counter() - _last["committed"])
            _last["committed"] = None
        send_deliveries(self, sid, items)

    appmod.BrokerServer.write = traced_write  # type: ignore[method-assign]
    appmod.BrokerServer._committed = traced_committed  # type: ignore[method-assign]
    connmod.NativeConnection._on_publish = traced_on_publish  # type: ignore[method-assign]
    connmod.NativeConnection.send_deliveries = traced_send_deliveries  # type: ignore[method-assign]


def report(path: str) -> None:
    with open(path, "w") as out:
        for step, values in STEPS.items():
            if not values:
                continue
            v = sorted(values)

            def ms(p: float, v: list[float] = v) -> float:
                return v[min(len(v) - 1, int(p * len(v)))] * 1e3

            out.write(f"{step:22s} n={len(v):6d} p50 {ms(0.5):.3f} ms p90 {ms(0.9):.3f} ms "
                      f"p99 {ms(0.99):.3f} ms mean {statistics.mean(v) * 1e3:.3f}\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/latd")
    ap.add_argument("--port", default="7794")
    ap.add_argument("--http-port", default="7795")
    ap.add_argument("--report", default="/tmp/trace_report.txt")
    ap.add_argument("--report-after", type=float, default=14.0)
    args = ap.parse_args()
    patch()
    threading.Timer(args.report_after, report, (args.report,)).start()
    sys.argv = ["minou", "start", "--dev", "--data", args.data, "--port", args.port,
                "--http-port", args.http_port]
    minou_main()
