"""Shared fixtures: real broker processes on loopback, free ports, temp data dirs."""

from __future__ import annotations

import functools
import gc
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.protocol import frames as f
from minou.protocol.reader import FrameReader
from tests.ports import restartable_port
from tests.redis_cluster import RedisCluster
from tests.redis_sentinel import SentinelSet
from tests.redis_server import REDIS_SERVER, RedisServer

ADDRESS = re.compile(r"^\s+(native|http|tls|redis)\s+(\S+)")
# Brokers in tests run the default, authenticated mode. Unless a test brings its own
# rules, this one auto-accepts every client and lets it read and write everything.
OPEN_RULES = '\n[[rules]]\nclient = "*"\nread = ["*"]\nwrite = ["*"]\n'
_KEY_DIR = Path(tempfile.mkdtemp(prefix="minou-test-keys-"))
_KEYS: dict[str, Path] = {}
_anonymous = itertools.count(1)
# MINOU_TEST_STORAGE=redis: brokers started by the fixtures keep their state in the
# session's redis-server (a key prefix each) instead of SQLite in their data dir.
TEST_STORAGE = os.environ.get("MINOU_TEST_STORAGE", "")


def auth(client_id: str | None = None) -> dict[str, Any]:
    """connect() keyword arguments: ``client_id`` and its own key pair."""
    client_id = client_id or f"test-client-{next(_anonymous)}"
    return {"client_id": client_id, "key": str(client_key(client_id))}


def signed_hello(client_id: str, *, audience: str = "minou", **kw: Any) -> f.Hello:
    """The HELLO a real client sends: a fresh token signed with its key, and the key."""
    key = keyfiles.load_private(client_key(client_id))
    return f.Hello(client_id, 1, make_token(client_id, key, audience), None,
                   keyfiles.public_pem(key).decode(), **kw)


class RawPeer:
    """A hand-driven native connection: write any bytes, read frames back."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("minou://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.reader = FrameReader()

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def hello(self, client_id: str = "raw") -> f.Welcome:
        self.write(f.encode(signed_hello(client_id)))
        frame = self.read()
        assert isinstance(frame, f.Welcome), frame
        return frame

    def read(self) -> f.Frame:
        while True:
            ev = self.reader.next_event()
            if ev is not None:
                assert not hasattr(ev, "error"), ev
                return ev  # type: ignore[return-value]
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by broker")
            self.reader.receive_data(data)

    def closed_by_peer(self) -> bool:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.reader.receive_data(data)
        except (ConnectionResetError, TimeoutError):
            return True

    def close(self) -> None:
        self.sock.close()


def client_key(client_id: str) -> Path:
    """A private key file for ``client_id`` (made once per test session)."""
    path = _KEYS.get(client_id)
    if path is None:
        path, _ = keyfiles.save(keyfiles.generate(), _KEY_DIR, client_id)
        _KEYS[client_id] = path
    return path


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
    tls_fingerprint: str | None = None
    open_rules: bool = True  # add OPEN_RULES unless the config declares rules
    storage: str = ""  # --storage URL ("" : the default, SQLite in the data dir)
    resp_port: int | None = None  # the Redis protocol door: None = off, 0 = any free port

    # ------------------------------------------------------------- identities
    @property
    def admin_key(self) -> Path:
        return self.data_dir / "admin.key"

    def auth(self, client_id: str | None = None, **kw: Any) -> dict[str, Any]:
        """connect() keyword arguments for ``client_id`` (its own key pair)."""
        out = auth(client_id)
        if self.tls_fingerprint:
            out["tls_fingerprint"] = self.tls_fingerprint
        return {**out, **kw}

    def admin_auth(self, **kw: Any) -> dict[str, Any]:
        return {"client_id": "admin", "key": str(self.admin_key), **kw}

    async def connect(self, client_id: str | None = None, *, url: str | None = None,
                      **kw: Any) -> minou.Client:
        return await minou.connect(url or self.url, **self.auth(client_id), **kw)

    def connect_sync(self, client_id: str | None = None, **kw: Any) -> Any:
        return minou.connect_sync(self.url, **self.auth(client_id), **kw)

    def cli_env(self) -> dict[str, str]:
        """Environment for ``minou`` CLI calls as the broker's admin."""
        env = {**os.environ, "MINOU_URL": self.url, "MINOU_KEY": str(self.admin_key),
               "MINOU_CLIENT_ID": "admin"}
        if self.tls_fingerprint:
            env["MINOU_TLS_FINGERPRINT"] = self.tls_fingerprint
        return env

    def _config_file(self) -> Path | None:
        if not self.open_rules:
            return self.config
        text = self.config.read_text() if self.config is not None else ""
        if self.config is not None and self.config.suffix != ".toml":
            return self.config
        if "[[rules]]" in text or "mode =" in text:
            return self.config
        path = self.data_dir.parent / f"{self.data_dir.name}-config.toml"
        path.write_text(text + OPEN_RULES)
        return path

    def start(self, timeout: float = 20.0, ready: str = "  stop with") -> BrokerProcess:
        """Start and wait for ``ready`` in the output (a standby says "standby:" and
        prints no addresses: give it fixed ``port``/``http_port``)."""
        # Restarts reuse the ports of the first start, like a real restart would.
        self.port = self.port or restartable_port()
        self.http_port = self.http_port or restartable_port()
        cmd = [sys.executable, "-m", "minou", "start", "--data", str(self.data_dir),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--http-port", str(self.http_port), "--log-level", "warning", *self.extra]
        if self.storage and "--storage" not in self.extra:
            cmd += ["--storage", self.storage]
        if self.resp_port is not None:
            cmd += ["--resp-port", str(self.resp_port)]
        config = self._config_file()
        if config is not None:
            cmd += ["--config", str(config)]
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
            if ready != "  stop with" and ready in text:
                self.url = self.url or f"minou://127.0.0.1:{self.port}"
                self.http = self.http or f"http://127.0.0.1:{self.http_port}"
                return self
            if "  stop with" in text:
                for line in text.splitlines():
                    m = ADDRESS.match(line)
                    if m and m.group(1) == "native":
                        self.url = m.group(2)
                        self.port = int(self.url.rsplit(":", 1)[1])
                    elif m and m.group(1) == "http":
                        self.http = m.group(2)
                        self.http_port = int(self.http.rsplit(":", 1)[1])
                    elif m and m.group(1) == "redis":
                        self.resp_port = int(m.group(2).rsplit(":", 1)[1])
                    elif m and m.group(1) == "tls":
                        self.tls_fingerprint = m.group(2)
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


# Under mutation testing (make mutate) the tests most likely to kill a mutant go first:
# mutmut runs a mutant's tests with -x, so the first failure ends the run. First the
# tests that killed this function's mutants in the last whole run (mutation_killers.json,
# written by `make mutate`: most kills first), then the test files named after the mutated
# module (test_dedup.py for core/dedup.py), then the fast directories before the simulator.
_MUTATION_ORDER = ("tests/core/", "tests/unit/", "tests/protocol/", "tests/server/",
                   "tests/sim/")
_KILLERS_FILE = Path(__file__).with_name("mutation_killers.json")


@functools.cache
def _known_killers() -> dict[str, list[str]]:
    try:
        return dict(json.loads(_KILLERS_FILE.read_text()))
    except (OSError, ValueError):
        return {}


if "MUTANT_UNDER_TEST" in os.environ:
    _known_killers()  # read once in mutmut's process, before it forks a child per mutant


def _mutation_rank(item: pytest.Item, mutant: str) -> tuple[int, int, int]:
    # "minou.core.dedup.xǁDedupWindowǁput__mutmut_3" -> "dedup", "...ǁput"
    module = mutant.split(".x")[0].rsplit(".", 1)[-1] if ".x" in mutant else ""
    killers = _known_killers().get(mutant.rsplit("__mutmut_", 1)[0], [])
    path = item.nodeid
    known = killers.index(path) if path in killers else len(killers)
    own = 0 if module and f"test_{module}" in path.split("::")[0] else 1
    return known, own, next((i for i, p in enumerate(_MUTATION_ORDER) if path.startswith(p)),
                            len(_MUTATION_ORDER))


# Property tests have no per-example deadline: speed is measured in bench/, never asserted
# in a test (hypothesis's default 200 ms failed an example that took 301 ms on a loaded
# machine). Under `make mutate` (which sets MINOU_MUTATION_KILLERS for mutmut and every
# child), a property test fails a mutant at its first failing example: shrinking that
# example took 5-24 s here, which mutmut's wall-clock limit took for a timeout. Loaded at
# import, before the test modules, so that their own @settings inherit it.
from hypothesis import Phase  # noqa: E402
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("minou", deadline=None)
_hypothesis_settings.register_profile(
    "mutation", deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
_hypothesis_settings.load_profile("mutation" if os.environ.get("MINOU_MUTATION_KILLERS")
                                  else "minou")


def _under_mutation() -> str:
    """The mutant this process tests, or "" (not under mutmut, or its stats/fail runs)."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    return "" if mutant in ("", "fail", "stats") else mutant


def pytest_configure(config: pytest.Config) -> None:
    """Under mutmut each mutant's tests run in a child forked from a process holding the
    whole suite: freezing what it inherited keeps the child's garbage collections (and
    their copy-on-write of every inherited page) to what its own tests allocate."""
    if _under_mutation():
        gc.freeze()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under `make mutate`, note which test killed each mutant (MINOU_MUTATION_KILLERS):
    the next run tries those tests first."""
    log = os.environ.get("MINOU_MUTATION_KILLERS")
    mutant = _under_mutation()
    if log and mutant and report.failed:
        with open(log, "a", encoding="utf-8") as out:  # one short line: appends stay whole
            out.write(f"{mutant}\t{report.nodeid}\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Likely killers first under mutmut; with MINOU_TEST_STORAGE=redis, the tests of the
    SQLite file itself do not apply."""
    mutant = _under_mutation()
    if mutant:
        items.sort(key=lambda item: _mutation_rank(item, mutant))  # stable within ranks
    if TEST_STORAGE != "redis":
        return
    skip = pytest.mark.skip(reason="reads or writes the SQLite file itself")
    for item in items:
        if item.get_closest_marker("sqlite_only"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (AOF always); tests keep apart by key
    prefix (``redis_url``)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis with a key prefix of this test's own."""
    return f"{redis_server.url}?prefix=t{next(_anonymous)}-{os.getpid()}"


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    """One Redis primary with a replica under three Sentinels, for the session (tests
    that fail it over start their own: tests/redis_sentinel.py)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    sentinels = SentinelSet(tmp_path_factory.mktemp("sentinel")).start()
    yield sentinels
    sentinels.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of three primaries for the session (tests/redis_cluster.py)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (make test installs it)")
    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    """The session's Redis Cluster with a key prefix of this test's own."""
    return f"{redis_cluster.url}?prefix=t{next(_anonymous)}-{os.getpid()}"


@pytest.fixture
def sentinel_url(redis_sentinel: SentinelSet) -> str:
    """The session's Sentinel-watched Redis, commits waiting for its replica, with a key
    prefix of this test's own."""
    return redis_sentinel.url(f"replicas=1&prefix=t{next(_anonymous)}-{os.getpid()}")


@pytest.fixture
def broker_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[type]:
    started: list[BrokerProcess] = []
    server = request.getfixturevalue("redis_server") if TEST_STORAGE == "redis" else None

    class Factory:
        @staticmethod
        def make(data_dir: Path | None = None, **kw: object) -> BrokerProcess:
            if server is not None:  # restarts of this broker find its prefix again
                kw.setdefault("storage", f"{server.url}?prefix=b{next(_anonymous)}-"
                                         f"{os.getpid()}")
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
