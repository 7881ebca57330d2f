"""Large segment bodies in append-only files beside the SQLite database.

A 1 MiB body stored in SQLite is 256 overflow pages written to the WAL, then copied
again into the database file by the checkpoint: the writer and the checkpointer spent
70 % of a core on that page-by-page handling while the disk was far from busy (issue 19,
item 5). A body written here is one ``write`` into a file, synced before the commit that
refers to it, and never copied again.

Files are numbered (``bodies/00000001.bin``, ...) and only the newest one is appended
to; a new one starts past ``file_limit`` bytes and at every open, so that bytes a failed
or interrupted commit left behind are never mixed with later ones. A file is deleted
once no segment refers to it (``collect``). All writes (``append``, ``undo``, ``sync``,
``collect``) come from the storage's writer thread; ``sync`` may also come from the
interval syncer, ``read`` from any thread.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path

SUFFIX = ".bin"
PREALLOCATE_ROOM = 8  # files are preallocated only while the disk has room for this many


class BodyFileMissing(OSError):
    """A referenced body file is gone: deleted after the segment referring to it was
    (a reader on an older snapshot). Read again: the segment is gone too."""


class BodyFileError(OSError):
    """A referenced body is shorter than its reference says: the file was damaged."""


class BodyFiles:
    def __init__(self, directory: str | os.PathLike[str], file_limit: int = 64 << 20) -> None:
        self.directory = Path(directory)
        self.file_limit = file_limit
        self.current = 0  # the number of the file appended to (0: none yet)
        self._fd: int | None = None
        self._size = 0  # bytes in the current file
        self._dropped_to = 0  # the current file's bytes before this are synced and uncached
        self._dirty: set[int] = set()  # written since the last sync: the current fd only
        self._lock = threading.Lock()  # sync (syncer thread) against rotation (writer)
        self._sizes: dict[int, int] = {}  # every file's size, for the quota and metrics
        # Allocate each file's blocks when it starts (off under a quota, which must not
        # count blocks no body uses yet).
        self.preallocate = True

    # ------------------------------------------------------------------ set-up
    def open(self, referenced: set[int]) -> None:
        """Delete files no segment refers to (left by commits that never happened) and
        start a new file past the highest number seen."""
        self.directory.mkdir(parents=True, exist_ok=True)
        highest = 0
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                number = int(path.stem)
            except ValueError:
                continue
            highest = max(highest, number)
            if number not in referenced:
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            with contextlib.suppress(OSError):
                self._sizes[number] = path.stat().st_size
        self.current = highest  # the next append starts file highest + 1

    def path_of(self, number: int) -> Path:
        return self.directory / f"{number:08d}{SUFFIX}"

    # ------------------------------------------------------------------ writes
    def append(self, data: bytes) -> tuple[int, int]:
        """Write ``data`` at the end of the current file: (file number, offset). Not
        durable until ``sync``. Raises OSError (ENOSPC: the disk is full)."""
        if self._fd is None or self._size >= self.file_limit:
            self._rotate()
        assert self._fd is not None
        offset = self._size
        view = memoryview(data)
        try:
            while view:
                written = os.pwrite(self._fd, view, offset + len(data) - len(view))
                view = view[written:]
        except OSError:
            self.undo(self.current, offset)
            raise
        self._size = offset + len(data)
        self._sizes[self.current] = self._size
        self._dirty.add(self.current)
        return self.current, offset

    def mark(self) -> tuple[int, int]:
        """Where the next append goes, to ``undo`` back to after a failed commit."""
        return self.current, self._size

    def undo(self, number: int, size: int) -> None:
        """Cut the current file back to ``size`` if it is still file ``number`` (the
        commit that wrote past it failed); a file started since is cut to nothing."""
        if self._fd is None:
            return
        if number != self.current:
            size = 0
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)
            self._size = size
            self._sizes[self.current] = size
            self._dropped_to = min(self._dropped_to, size)

    def _rotate(self) -> None:
        with self._lock:
            if self._fd is not None:
                # The file is done: sync it now, so that the syncer never holds a
                # descriptor the writer closes.
                if self.current in self._dirty:
                    os.fdatasync(self._fd)
                    self._dirty.discard(self.current)
                    self._uncache()
                os.close(self._fd)
                self._fd = None
            number = self.current + 1
            path = self.path_of(number)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                if self.preallocate:
                    self._preallocate(fd)
                # The directory entry must survive a power cut before a commit refers
                # to it.
                dir_fd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
            except OSError:
                # Not started: the next append tries the same number again.
                os.close(fd)
                with contextlib.suppress(OSError):
                    path.unlink()
                raise
            self._fd, self.current, self._size, self._dropped_to = fd, number, 0, 0
            self._sizes[number] = 0

    def _preallocate(self, fd: int) -> None:
        """Allocate the whole file at once: appends into blocks the file system already
        gave out were 2-4 x faster (1 MiB bodies: 1.0-1.4 GB/s against 350-520 MB/s,
        writes and syncs together, on this VM), the allocation no longer in each sync.
        On a disk without the room the file grows as it is written, as before."""
        if not hasattr(os, "posix_fallocate"):
            return
        try:
            # Not on a disk getting full: the blocks held ahead would be missed by the
            # database (full sooner), and the current file is never collected.
            st = os.statvfs(self.directory)
            if st.f_bavail * st.f_frsize < PREALLOCATE_ROOM * self.file_limit:
                return
            os.posix_fallocate(fd, 0, self.file_limit)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def sync(self) -> None:
        """Make every append so far durable on the disk."""
        with self._lock:
            if self._fd is not None and self._dirty:
                self._dirty.clear()
                try:
                    os.fdatasync(self._fd)
                except OSError:
                    self._dirty.add(self.current)
                    raise
                self._uncache()

    def _uncache(self) -> None:
        """Drop the synced bytes from the OS page cache. Recent bodies are in the
        broker's own cache for delivery; kept in the page cache too, they doubled the
        memory and made every new page cost more than the write itself: 1 MiB bodies
        were written at 0.2 ms/MiB this way and 1.2-2.5 ms/MiB without, on this VM.
        Old bodies read back for a reader far behind come from the disk."""
        assert self._fd is not None
        end = self._size
        if end > self._dropped_to and hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(self._fd, self._dropped_to, end - self._dropped_to,
                                 os.POSIX_FADV_DONTNEED)
            self._dropped_to = end

    def collect(self, referenced: set[int]) -> int:
        """Delete the files no segment refers to any more (never the current one).
        Returns how many."""
        gone = 0
        for number in [n for n in self._sizes if n != self.current and n not in referenced]:
            with contextlib.suppress(FileNotFoundError):
                self.path_of(number).unlink()
            del self._sizes[number]
            gone += 1
        return gone

    def size_bytes(self) -> int:
        return sum(list(self._sizes.values()))  # a copy: the writer may add one meanwhile

    def files(self) -> int:
        return len(self._sizes)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)  # give back what was allocated ahead
                    os.fdatasync(self._fd)
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None
                self._dirty.clear()

    # ------------------------------------------------------------------ reads
    def read(self, number: int, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self.path_of(number), os.O_RDONLY)
        except FileNotFoundError as exc:
            raise BodyFileMissing(errno.ENOENT, "body file gone",
                                  str(self.path_of(number))) from exc
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(data) != length:
            raise BodyFileError(errno.EIO, f"body file too short: {length} bytes wanted "
                                f"at {offset}, {len(data)} there", str(self.path_of(number)))
        return data
