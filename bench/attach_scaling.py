#!/usr/bin/env python3
"""The broker core alone (no sockets, no storage): what one new channel costs with many
reader groups held, and what one new group costs with many channels held: the stall
every other client of the event loop sees. Printed: medians (and best) of ``--runs``.

``channel``  ``--groups`` groups held (MAX_GROUPS is 20,000), half listeners of one
             channel by name (``l{i}/v1/1``), half consumers of a wildcard
             (``w{i}/v1/*``); the groups are added as a restart adds them, not one
             SUBSCRIBE each. Timed: one publish to a new channel no group reads, and
             to a new channel one wildcard group reads.
``group``    ``--channels`` channels held (DEFAULT_MAX_CHANNELS is 100,000) over 1,000
             queues. Timed: a SUBSCRIBE that makes a new consumer group of one wildcard
             matching 100 channels, of ``e/*`` matching no channel, of a channel by
             name that exists, and one of 100 wildcards matching none (one SUBSCRIBE
             may name that many).
``rss``      VmRSS of a process holding ``--channels`` channels and no group, minus
             that of the same process before (the channels' memory, index included).

Usage:  .venv/bin/python bench/attach_scaling.py [--cases channel,group,rss]
        PYTHONPATH=<other checkout>/src .venv/bin/python bench/attach_scaling.py
            (measures another version: compare two)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
from pathlib import Path

from minou.core.broker import Broker, Session
from minou.core.group import Group
from minou.names import parse_pattern
from minou.protocol.frames import Send

NOW = 1000.0
BODY = b"1"


def held_groups(n: int) -> Broker:
    b = Broker()
    b.state.max_channels = 10 ** 7
    for i in range(n):
        pattern = f"l{i}/v1/1" if i % 2 else f"w{i}/v1/*"
        b.state.add_group(Group(f"consume:g{i}", "consume", [parse_pattern(pattern)]))
    return b


def held_channels(n: int) -> Broker:
    b = Broker()
    b.state.max_channels = 10 ** 7
    for start in range(0, n, 1000):
        b.publish([Send(f"q{i % 1000}/v1/c{i}", BODY) for i in range(start, start + 1000)],
                  NOW)
        b.on_committed(b.take_writes(), NOW)
    return b


def timed(fn: object, runs: int) -> list[float]:
    out = []
    gc.disable()
    try:
        for i in range(runs):
            t0 = time.perf_counter()
            fn(i)  # type: ignore[operator]
            out.append((time.perf_counter() - t0) * 1e3)
    finally:
        gc.enable()
    return out


def show(label: str, times: list[float]) -> None:
    print(f"  {label:<34} median {statistics.median(times):9.3f} ms  "
          f"(best {min(times):.3f})", flush=True)


def case_channel(groups: int, runs: int) -> None:
    print(f"new channel, {groups} groups held:")
    b = held_groups(groups)
    show("publish to a channel nobody reads",
         timed(lambda i: b.publish([Send(f"cold/v1/c{i}", BODY)], NOW), runs))
    show("publish to a channel 1 group reads",
         timed(lambda i: b.publish([Send(f"w0/v1/c{i}", BODY)], NOW), runs))


def case_group(channels: int, runs: int) -> None:
    print(f"new group, {channels} channels held:")
    b = held_channels(channels)
    s = Session("bench")
    sid = iter(range(1, 10 ** 6))

    def sub(pattern: str, i: int) -> None:
        b.subscribe(s, next(sid), kind="consume", patterns=[pattern], group=f"g{next(sid)}",
                    now=NOW)

    # q{k}/v1/* holds channels k, k+1000, ...: channels // 1000 of them
    show(f"wildcard over {channels // 1000} channels",
         timed(lambda i: sub(f"q{i}/v1/*", i), runs))
    show("wildcard over no channel", timed(lambda i: sub(f"e{i}/*", i), runs))
    show("a channel by name", timed(lambda i: sub(f"q{i}/v1/c{i}", i), runs))

    def subs(i: int) -> None:
        b.subscribe(s, next(sid), kind="consume", group=f"m{i}", now=NOW,
                    patterns=[f"m{i}x{k}/*" for k in range(100)])

    show("100 wildcards over no channel", timed(subs, max(3, runs // 10)))


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def case_rss(channels: int) -> None:
    # A child process each time: RSS of this one holds what earlier cases left.
    code = (f"import sys; sys.argv = ['x']; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import attach_scaling as a, gc\n"
            "b0 = a.Broker(); gc.collect(); before = a.rss_kib()\n"
            f"b = a.held_channels({channels}); gc.collect()\n"
            "print(a.rss_kib() - before)\n")
    runs = [int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                               text=True).stdout) for _ in range(3)]
    print(f"memory of {channels} channels: median {statistics.median(runs) / 1024:.1f} MiB "
          f"RSS ({', '.join(f'{r / 1024:.1f}' for r in runs)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="channel,group,rss")
    ap.add_argument("--groups", type=int, default=20_000)
    ap.add_argument("--channels", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    cases = args.cases.split(",")
    if "channel" in cases:
        case_channel(args.groups, args.runs)
    if "group" in cases:
        case_group(args.channels, args.runs)
    if "rss" in cases:
        case_rss(args.channels)


if __name__ == "__main__":
    main()
