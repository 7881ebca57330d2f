"""Shared fixtures: real broker processes on loopback, free ports, temp data dirs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ADDRESS = re.compile(r"^\s+(native|http)\s+(\S+)")


@dataclass
class BrokerProcess:
    """A real ``minou start`` subprocess; its URLs are read from what it prints."""

    data_dir: Path
    config: Path | None = None
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    url: str = ""
    http: str = ""
    port: int = 0
    http_port: int = 0
    log_path: Path = Path("/dev/null")

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        # Restarts reuse the ports of the first start, like a real restart would.
        cmd = [sys.executable, "-m", "minou", "start", "--data", str(self.data_dir),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--http-port", str(self.http_port), "--log-level", "warning", *self.extra]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Output goes to a file, never a pipe nobody drains (a full pipe blocks the broker).
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "a") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True,
                                         env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log_path.read_text()[offset:]
            if "  stop with" in text:
                for line in text.splitlines():
                    m = ADDRESS.match(line)
                    if m and m.group(1) == "native":
                        self.url = m.group(2)
                        self.port = int(self.url.rsplit(":", 1)[1])
                    elif m and m.group(1) == "http":
                        self.http = m.group(2)
                        self.http_port = int(self.http.rsplit(":", 1)[1])
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.kill()
        raise RuntimeError("broker did not start:\n" + self.log_path.read_text()[offset:])

    @property
    def output(self) -> str:
        """Everything the broker printed, over all its starts."""
        return self.log_path.read_text() if self.log_path.exists() else ""

    def kill(self) -> None:
        """kill -9: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait: a clean shutdown."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise
        return self.proc.returncode

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[type]:
    started: list[BrokerProcess] = []

    class Factory:
        @staticmethod
        def make(data_dir: Path | None = None, **kw: object) -> BrokerProcess:
            b = BrokerProcess(data_dir or tmp_path / f"data{len(started)}", **kw)  # type: ignore[arg-type]
            started.append(b)
            return b

    yield Factory
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory: type) -> BrokerProcess:
    return broker_factory.make().start()


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "") -> None:
    """Poll ``predicate`` until true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
