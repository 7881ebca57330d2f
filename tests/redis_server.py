"""A real ``redis-server`` for tests: on a free loopback port, AOF ``always``, its own
directory; stopped (only it) when done. Restartable on the same port and directory,
as a crashed Redis restarting from its AOF."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from .ports import restartable_port

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    return restartable_port()  # not from the ephemeral range: ports.py says why


class RedisServer:
    def __init__(self, directory: Path, *extra: str) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Any:
        """A redis-py client of this server (imported here: redis-py is an extra)."""
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)

    def start(self, timeout: float = 10.0) -> RedisServer:
        assert REDIS_SERVER is not None
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir),
             "--save", "", "--daemonize", "no", *self.extra],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited:\n" +
                                   (self.dir / "redis.log").read_text()[-2000:])
            if self._ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not answer in time")

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def kill(self) -> None:
        """kill -9: what the AOF holds is what survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
