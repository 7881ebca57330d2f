"""What a delegated credential costs and saves: issuing one (what a Spark driver does
once per query) and opening a connection with it (what every Spark task does) against
opening one with the client's key (a fresh JWT per connection, signed and verified,
its id stored against replay).

A broker in keys mode (the bench rule accepts ``bench-*``) on a temp dir; --n of each,
one at a time; medians and p90 in milliseconds.

Usage:  .venv/bin/python bench/credentials_bench.py [--n 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minou
from bench_servers import MinouBroker
from minou.auth import keys as keyfiles


def timed(n: int, call: Callable[[], object]) -> tuple[float, float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        took.append(time.perf_counter() - t0)
    took.sort()
    return statistics.median(took) * 1e3, took[int(len(took) * 0.9)] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    n = ap.parse_args().n
    with tempfile.TemporaryDirectory(prefix="minou-cred-bench-") as tmp:
        workdir = Path(tmp)
        key, _ = keyfiles.save(keyfiles.generate(), workdir, "bench-credentials")
        broker = MinouBroker(workdir)
        url = broker.start()
        try:
            keyed = {"client_id": "bench-credentials", "key": str(key), "reconnect": False}
            with minou.connect_sync(url, **keyed) as client:
                issue = timed(n, lambda: client.issue_credential(ttl=600))
                secret = client.issue_credential(ttl=600)["credential"]
            with_key = timed(n, lambda: minou.connect_sync(url, **keyed).close())
            delegated = {"client_id": "bench-credentials", "credential": secret,
                         "reconnect": False}
            with_credential = timed(n, lambda: minou.connect_sync(url, **delegated).close())
        finally:
            broker.close()
    print(f"\n{'operation':<48}{'median ms':>10}{'p90 ms':>10}")
    for name, (median, p90) in (
            ("issue a credential (stored, then answered)", issue),
            ("connect + close with the key (JWT)", with_key),
            ("connect + close with a credential", with_credential)):
        print(f"{name:<48}{median:>10.2f}{p90:>10.2f}")
    print(f"\ncredential / key connect: {with_credential[0] / with_key[0]:.2f}")


if __name__ == "__main__":
    main()
