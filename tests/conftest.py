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
    output: list[str] = field(default_factory=list)

    def start(self, timeout: float = 20.0) -> BrokerProcess:
        # Restarts reuse the ports of the first start, like a real restart would.
        cmd = [sys.executable, "-m", "minou", "start", "--data", str(self.data_dir),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--http-port", str(self.http_port), "--log-level", "warning", *self.extra]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = ADDRESS.match(line)
            if m and m.group(1) == "native":
                self.url = m.group(2)
                self.port = int(self.url.rsplit(":", 1)[1])
            elif m and m.group(1) == "http":
                self.http = m.group(2)
                self.http_port = int(self.http.rsplit(":", 1)[1])
            if line.startswith("  stop with"):
                return self
        self.kill()
        raise RuntimeError("broker did not start:\n" + "".join(self.output))

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
        if self.proc.stdout is not None:
            self.output.append(self.proc.stdout.read())
            self.proc.stdout.close()
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
        if b.proc is not None and b.proc.stdout is not None:
            b.proc.stdout.close()


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
