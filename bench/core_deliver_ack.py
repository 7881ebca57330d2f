"""The broker core alone, no sockets and no storage: deliver and ack N messages of 100 B
to a consumer group of 1 and of 4 members (prefetch 1,000), and print the microseconds
of this thread's CPU time per message (median and best of --runs; CPU time, not wall
time: other work on a shared machine moves it less), with the latency histograms a
running broker keeps (``--no-histograms``: without them). Measures what per-message work in
``core/delivery.py`` and ``core/settlement.py`` costs, without the noise of the rest.

Usage:  .venv/bin/python bench/core_deliver_ack.py [-n 200000] [--runs 5]
        (PYTHONPATH=<other checkout>/src to measure another version)
"""

from __future__ import annotations

from core_timing import cpu_us_per_message, parser, summary
from minou.core.broker import Broker, Session
from minou.protocol.frames import Send
from minou.server.metrics import ACK_LATENCY_BUCKETS, DELIVERY_LATENCY_BUCKETS, Histogram


def run(members: int, n: int, histograms: bool = True) -> float:
    b = Broker()
    if histograms:  # as a running broker has them (server/app.py)
        b.delivery_latency = Histogram(DELIVERY_LATENCY_BUCKETS)
        b.ack_latency = Histogram(ACK_LATENCY_BUCKETS)
    now = 1000.0
    for i in range(members):
        b.subscribe(Session(f"c{i}"), 1, kind="consume", patterns=["o/v1/1"], group="g",
                    prefetch=1000, now=now)
    body = b'"' + b"x" * 98 + b'"'
    for _ in range(0, n, 1000):
        b.publish([Send("o/v1/1", body) for _ in range(1000)], now)
        b.on_committed(b.take_writes(), now)

    def work() -> None:
        done = 0
        while done < n:
            out, loads = b.pump(now)
            assert not loads
            for sub, items in out.items():
                b.ack(sub.session, [d.tag for d in items], now)
                done += len(items)
            b.take_writes()

    return cpu_us_per_message(work, n)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--no-histograms", action="store_true",
                    help="without the delivery/ack latency histograms a broker keeps")
    args = ap.parse_args()
    for members in (1, 4):
        times = [run(members, args.n, not args.no_histograms) for _ in range(args.runs)]
        print(f"members {members}: {summary(times)}")


if __name__ == "__main__":
    main()
