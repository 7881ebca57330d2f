"""Which other processes have a file open: for an error that names who holds a lock.

SQLite says only "database is locked". The operator needs to know which process: an
``sqlite3`` shell left in a transaction, a backup tool. Linux's ``/proc/<pid>/fd`` tells
which processes have the database open (the lock holder among them); elsewhere, or
for processes of other users, nothing is known and nothing is said.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_NAMED = 5  # enough to point at the culprit; a busy host has hundreds of processes


def other_holders(paths: list[str]) -> list[str]:
    """``"pid 1234 (sqlite3)"`` for each other process with one of ``paths`` open."""
    wanted = {os.path.realpath(p) for p in paths}
    me, found = os.getpid(), []
    try:
        procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        return []
    for proc in procs:
        if int(proc.name) == me:
            continue
        try:
            fds = list((proc / "fd").iterdir())
            if not any(os.readlink(fd) in wanted for fd in fds):
                continue
            name = (proc / "comm").read_text().strip()
        except OSError:  # gone meanwhile, or another user's
            continue
        found.append(f"pid {proc.name} ({name})")
        if len(found) >= MAX_NAMED:
            break
    return found
