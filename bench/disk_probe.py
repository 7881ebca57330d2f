"""The disk's own commit latency, the floor under a confirmed publish: appends of a
small block to a file in a directory, each followed by ``fdatasync``, timed one by one.

What SQLite in WAL mode does for a commit is much the same (a few pages appended to
the WAL, one fdatasync), so a broker's end-to-end latency at a low rate cannot go much
under this; issue 19 compares the two in the same run (``make bench``, test c).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any


def fdatasync_latency(directory: str | os.PathLike[str], n: int = 2000,
                      size: int = 4096, *, overwrite: bool = False) -> dict[str, Any]:
    """p50, p99 and max (ms) of ``n`` appends of ``size`` bytes, each made durable with
    fdatasync, in a temporary file in ``directory`` (removed after). ``overwrite``:
    writes over a file written out (and synced) first, as minou's SQLite storage writes
    its WAL (docs/reliability.md): the fdatasync has no new file size to make durable."""
    block = os.urandom(size)
    fd, name = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    times: list[int] = []
    try:
        if overwrite:
            for _ in range(n):
                os.write(fd, block)
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        for _ in range(n):
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fdatasync(fd)
            times.append(time.perf_counter_ns() - t0)
    finally:
        os.close(fd)
        Path(name).unlink(missing_ok=True)
    times.sort()

    def q(p: float) -> float:
        return round(times[min(len(times) - 1, int(p * len(times)))] / 1e6, 3)

    return {"disk_p50_ms": q(0.50), "disk_p99_ms": q(0.99),
            "disk_max_ms": round(times[-1] / 1e6, 3), "disk_n": n, "disk_block": size}


if __name__ == "__main__":
    import json
    import sys

    where = sys.argv[1] if len(sys.argv) > 1 else "."
    print(json.dumps({"append": fdatasync_latency(where),
                      "overwrite": fdatasync_latency(where, overwrite=True)}))
