"""One broker per data directory: an OS lock held for the broker's lifetime.

Two brokers on one ``minou.db`` hand out the same sequence numbers and overwrite
each other's confirmed messages. ``flock`` is released by the kernel when the
process dies, even by ``kill -9``, so a crash never blocks the restart; a stale
lock file (left by a dead broker) is simply locked again.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ..errors import StartupError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (documented: minou runs on Linux and macOS)
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = "minou.lock"


class DataDirLock:
    """``acquire()`` or a StartupError naming the directory and the pid that holds it."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(data_dir).resolve()
        self.path = self.dir / LOCK_NAME
        self.created_dir = False
        self._fd: int | None = None

    def acquire(self) -> None:
        if not self.dir.exists():
            self.dir.mkdir(parents=True)
            self.created_dir = True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise StartupError(
                    f"data directory {self.dir} is in use by another minou broker{holder}: "
                    "one broker per data directory. Stop that broker, or give this one "
                    "another directory with --data DIR") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {time.time():.0f}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Unlock (the file stays: deleting it would race with a starting broker)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove_if_fresh(self) -> None:
        """After a failed first start: leave nothing behind in a directory we made."""
        self.release()
        if self.created_dir:
            with contextlib.suppress(OSError):
                self.path.unlink()
                self.dir.rmdir()


def _read_holder(fd: int) -> str:
    try:
        words = os.pread(fd, 64, 0).split()
        pid = int(words[0])
    except (OSError, ValueError, IndexError):
        return ""
    return f" (pid {pid})"


class DataDirLocks:
    """The data directory's lock and, when the database lives elsewhere
    (``[storage] url = "sqlite:///..."``), its directory's too: two brokers on one
    database must collide whichever data directories they were given."""

    def __init__(self, *dirs: str | os.PathLike[str]) -> None:
        unique = dict.fromkeys(Path(d).resolve() for d in dirs)
        self.locks = [DataDirLock(d) for d in unique]

    def acquire(self) -> None:
        taken: list[DataDirLock] = []
        try:
            for lock in self.locks:
                lock.acquire()
                taken.append(lock)
        except BaseException:
            for lock in taken:
                lock.remove_if_fresh()
            raise

    def release(self) -> None:
        for lock in self.locks:
            lock.release()

    def remove_if_fresh(self) -> None:
        for lock in self.locks:
            lock.remove_if_fresh()
