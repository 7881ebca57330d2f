"""What the dedup window costs: broker memory and restart time with a dedup key on every
publish, against the same load without keys.

For each mode (``keys``: a unique dedup key on every message; ``none``: no key) it starts
a development broker on a temp dir, publishes 100 B messages at a steady --rate for
--seconds (by default the window plus 15 s, so the window is full at the end), reads the
broker's RSS (/proc/<pid>/status VmRSS) and the keys it holds (minou_dedup_keys, when the
broker has that metric), then kills it with SIGKILL, starts it again on the same data
and times how long until it answers a HELLO (restart time), and reads its RSS then and
--settle seconds later. In the keys mode, the last key is then published again: the
restarted broker must answer "duplicate".

A shorter --window (dedup_window) keeps the run short: the keys held are rate x window,
so the table says which window it ran with.

Usage:  .venv/bin/python bench/dedup_soak.py [--rate 6000] [--window 120] [--seconds W+15]
        .venv/bin/python bench/dedup_soak.py --micro 1000000   (the window alone)
To measure another version of minou, put its src first: PYTHONPATH=<checkout>/src.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import minou
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader

BODY = "x" * 98  # 100 B of JSON


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One broker process on fixed ports (so a restart is reachable at the same ones)."""

    def __init__(self, work: Path, window: float) -> None:
        self.work, self.data = work, work / "data"
        self.port, self.http_port = free_port(), free_port()
        self.config = work / "minou.toml"
        self.config.write_text(f"dedup_window = {window}\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> float:
        """Start it; return the seconds until it answered a HELLO."""
        self.starts += 1
        log = open(self.work / f"broker-{self.starts}.log", "w")  # noqa: SIM115 (its stdout)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minou", "start", "--dev", "--data", str(self.data),
             "--config", str(self.config), "--port", str(self.port),
             "--http-port", str(self.http_port)],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        while not self._hello():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the broker exited: see {self.work}")
            if time.monotonic() - t0 > 120:
                raise RuntimeError("no HELLO answered within 120 s")
            time.sleep(0.01)
        return time.monotonic() - t0

    def _hello(self) -> bool:
        """The listener is bound before storage is read: only a WELCOME says it is up."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
                sock.sendall(f.encode(f.Hello("dedup-soak-probe", 1)))
                reader = FrameReader()
                while (ev := reader.next_event()) is None:
                    data = sock.recv(65536)
                    if not data:
                        return False
                    reader.receive_data(data)
                return isinstance(ev, f.Welcome)
        except OSError:
            return False

    @property
    def url(self) -> str:
        return f"minou://127.0.0.1:{self.port}"

    def rss(self) -> float:
        assert self.proc is not None
        return rss_mib(self.proc.pid)

    def dedup_keys(self) -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/metrics",
                                        timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("minou_dedup_keys "):
                return int(float(line.split()[1]))
        return None  # a version without the metric

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


async def publish(url: str, rate: int, seconds: float, keyed: bool, rss: Any) -> int:
    """Publish at ``rate`` msg/s for ``seconds``, confirms pipelined; return how many."""
    client = await minou.connect(url, client_id="dedup-soak")
    loop = asyncio.get_running_loop()
    inflight: set[asyncio.Future[Any]] = set()
    sent, start = 0, loop.time()
    next_report = start + 15
    try:
        while (now := loop.time()) - start < seconds:
            due = int((now - start) * rate)
            if due > sent:
                n = min(due - sent, 1000)
                items: list[dict[str, Any]] = [
                    {"channel": f"dedup/v1/{(sent + i) % 16}", "payload": BODY,
                     **({"dedup": f"key-{sent + i}"} if keyed else {})} for i in range(n)]
                task = asyncio.ensure_future(client.send_many(items))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                sent += n
                if len(inflight) > 64:  # the broker is behind: wait for it
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            if now >= next_report:
                print(f"    {now - start:5.0f} s  {sent:9,d} sent  RSS {rss():6.0f} MiB",
                      flush=True)
                next_report += 15
            await asyncio.sleep(0.002)
        await asyncio.gather(*inflight)
    finally:
        await client.close()
    return sent


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"minou-dedup-{mode}-"))
    broker = Broker(work, args.window)
    try:
        first = broker.start()
        rss0 = broker.rss()
        print(f"  {mode}: started in {first:.2f} s, RSS {rss0:.0f} MiB", flush=True)
        t0 = time.monotonic()
        sent = asyncio.run(publish(broker.url, args.rate, args.seconds, mode == "keys",
                                   broker.rss))
        took = time.monotonic() - t0
        time.sleep(0.5)  # a tick or two: what expired is let go
        rss1, keys = broker.rss(), broker.dedup_keys()
        broker.kill()
        t1 = time.monotonic()
        restart = broker.start()
        rss2 = broker.rss()
        duplicate = None
        if mode == "keys":
            with minou.connect_sync(broker.url, client_id="dedup-soak") as p:
                last = sent - 1  # dedup keys are per channel: the same one
                duplicate = p.send(f"dedup/v1/{last % 16}", BODY,
                                   dedup=f"key-{last}").duplicate
        time.sleep(max(0.0, args.settle - (time.monotonic() - t1)))
        rss3 = broker.rss()
        return {"mode": mode, "sent": sent, "rate": sent / took, "rss0": rss0, "rss1": rss1,
                "keys": keys, "restart": restart, "rss2": rss2, "rss3": rss3,
                "duplicate": duplicate}
    finally:
        broker.stop()
        if os.environ.get("KEEP") is None:
            shutil.rmtree(work, ignore_errors=True)


def micro(n: int) -> None:
    """The window alone (no broker): bytes per key and the cost of its operations."""
    import random
    import tracemalloc

    from minou.core.dedup import DedupWindow

    ch, now = "orders/v1/1", 1_000_000.0
    keys = [f"order-{i}-{random.getrandbits(40):x}" for i in range(n)]
    ids = [f"{0x1234_5678_9ABC_DEF0:016x}{i + 1:x}" for i in range(n)]
    w = DedupWindow(max_keys=2 * n)
    worst, t0 = 0.0, time.perf_counter()
    for i, k in enumerate(keys):  # what a keyed publish does: a lookup, then the insert
        t = time.perf_counter()
        if w.get(ch, k, now) is None:
            w.put(ch, k, now + 120 + i / 6000, i + 1, ids[i])
        worst = max(worst, time.perf_counter() - t)
    publish = (time.perf_counter() - t0) / n
    probes = [f"new-{i}" for i in range(100_000)]
    t0 = time.perf_counter()
    for k in probes:
        w.get(ch, k, now)
    miss = (time.perf_counter() - t0) / len(probes)
    sample = random.sample(keys, 100_000)
    t0 = time.perf_counter()
    for k in sample:
        w.get(ch, k, now)
    hit = (time.perf_counter() - t0) / len(sample)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    w2 = DedupWindow(max_keys=2 * n)
    for i, k in enumerate(keys):
        w2.put(ch, k, now + 120 + i / 6000, i + 1, ids[i])
    per_key = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    print(f"DedupWindow, {n:,d} keys ({len(w._sealed)} sealed generations): "
          f"{per_key:.1f} bytes a key (tracemalloc)")
    print(f"  keyed publish (lookup + insert) {publish * 1e6:.2f} us, worst "
          f"{worst * 1e3:.0f} ms (a generation sealed); lookup miss {miss * 1e6:.2f} us, "
          f"hit {hit * 1e6:.2f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=int, default=6000, help="messages per second")
    ap.add_argument("--window", type=float, default=120.0,
                    help="the broker's dedup_window in seconds (its default: 120)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="how long to publish (default: the window + 15 s)")
    ap.add_argument("--modes", default="keys,none", help="keys, none or both")
    ap.add_argument("--micro", type=int, metavar="N",
                    help="only time the window itself with N keys (no broker)")
    ap.add_argument("--settle", type=float, default=30.0,
                    help="RSS is read again this long after the restart")
    args = ap.parse_args()
    if args.micro:
        micro(args.micro)
        return 0
    if args.seconds is None:
        args.seconds = args.window + 15
    print(f"minou {minou.__version__} from {Path(minou.__file__).parent}")
    print(f"{args.rate:,d} msg/s of 100 B for {args.seconds:g} s, dedup_window = "
          f"{args.window:g} s" + (" (the default)" if args.window == 120 else
                                  " (shortened from the default 120 s: fewer keys held)"))
    results = [run(mode, args) for mode in args.modes.split(",")]
    print()
    print("| dedup keys | sent (msg/s) | keys held | RSS start | RSS end | restart | "
          f"RSS restarted | {args.settle:g} s later | resend after restart |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        keys = "n/a" if r["keys"] is None else f"{r['keys']:,d}"
        dup = {None: "", True: "duplicate", False: "STORED AGAIN"}[r["duplicate"]]
        print(f"| {'one per message' if r['mode'] == 'keys' else 'none'} "
              f"| {r['sent']:,d} ({r['rate']:,.0f}) | {keys} | {r['rss0']:.0f} MiB "
              f"| {r['rss1']:.0f} MiB | {r['restart']:.2f} s | {r['rss2']:.0f} MiB "
              f"| {r['rss3']:.0f} MiB | {dup} |")
    return 1 if any(r["duplicate"] is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
