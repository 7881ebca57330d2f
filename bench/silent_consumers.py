"""Broker memory when consumers stop reading: N raw connections subscribe (each in its
own group, prefetch P) and never read their sockets, while a producer publishes 4 KB
messages at --rate msg/s. Prints the broker's RSS over time, its unsent delivery bytes
and how many consumers it cut.

Usage:  .venv/bin/python bench/silent_consumers.py [--consumers 200] [--rate 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from pathlib import Path

import minou
from bench_servers import start_dev_broker
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def silent(host: str, port: int, i: int, prefetch: int) -> socket.socket:
    sock = socket.create_connection((host, port))
    sock.sendall(f.encode(f.Hello(f"silent-{i}", 1)))
    reader = FrameReader()
    while (ev := reader.next_event()) is None:
        reader.receive_data(sock.recv(65536))
    assert isinstance(ev, f.Welcome), ev
    sock.sendall(f.encode(f.Subscribe(1, 1, "consume", ["mem/v1/*"], group=f"g{i}",
                                      prefetch=prefetch)))
    return sock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumers", type=int, default=200)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    proc, url, _ = start_dev_broker("minou-silent-")
    socks: list[socket.socket] = []
    try:
        host, port = url.removeprefix("minou://").rsplit(":", 1)
        socks = [silent(host, int(port), i, args.prefetch) for i in range(args.consumers)]
        print(f"{args.consumers} silent consumers, prefetch {args.prefetch}; "
              f"{args.rate} msg/s of 4 KB for {args.seconds:.0f} s")
        print("  t(s)  RSS MiB  unsent MiB  cut")
        body = "x" * 4000
        with minou.connect_sync(url, client_id="producer") as p:
            start = time.monotonic()
            sent, peak, next_report = 0, 0.0, start
            while (now := time.monotonic()) - start < args.seconds:
                due = int((now - start) * args.rate)
                if due > sent:
                    p.send_many([(f"mem/v1/{(sent + i) % 16}", body)
                                 for i in range(min(due - sent, 200))])
                    sent += min(due - sent, 200)
                rss = rss_mib(proc.pid)
                peak = max(peak, rss)
                if now >= next_report:
                    flow = p.admin("status")["flow"]
                    unsent = flow["unsent_delivery_bytes"] / 2**20
                    print(f"  {now - start:4.0f}  {rss:7.0f}  {unsent:10.1f}"
                          f"  {flow['slow_consumers_cut']:3d}", flush=True)
                    next_report += 5
                time.sleep(0.002)
        print(f"peak RSS {peak:.0f} MiB; {sent} messages ({sent * 4000 / 1e6:.0f} MB) published")
        return 0
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
