"""The broker core alone, no sockets and no storage: publish N messages of 100 B to one
channel in frames of 1,000 (as the client's window sends them), take each frame's
batch and mark it committed, and print the microseconds of this thread's CPU time per
message (median and best of --runs), for a numbered producer (the client's default:
idempotent, each send with its producer sequence) and an unnumbered one. Measures what
per-message work in ``core/publishing.py`` and ``core/commits.py`` costs.

Usage:  .venv/bin/python bench/core_publish.py [-n 200000] [--runs 5]
        (PYTHONPATH=<other checkout>/src to measure another version)
"""

from __future__ import annotations

from core_timing import cpu_us_per_message, parser, summary
from minou.core.broker import Broker, Session
from minou.protocol.frames import Send

FRAME = 1000


def run(n: int, numbered: bool) -> float:
    b = Broker()
    session = Session("c", producer_id="p" if numbered else "")
    body = b"x" * 100
    frames = [[Send("o/v1/1", body, True, pseq=i + 1 if numbered else 0)
               for i in range(start, start + FRAME)] for start in range(0, n, FRAME)]
    now = 1000.0

    def work() -> None:
        for sends in frames:
            b.publish(sends, now, session=session)
            b.on_committed(b.take_writes(), now)

    return cpu_us_per_message(work, n)


def main() -> None:
    args = parser(__doc__).parse_args()
    for numbered in (True, False):
        times = [run(args.n, numbered) for _ in range(args.runs)]
        print(f"{'numbered' if numbered else 'unnumbered':10s} producer: {summary(times)}")


if __name__ == "__main__":
    main()
