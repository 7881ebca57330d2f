"""Start and stop the servers the benchmark needs: a minou broker on a fresh data
directory (on SQLite, or on Redis: then with a redis-server of its own, AOF
``always``), a cluster of minou brokers over one redis-server (test g), and the peers
(redis-server with AOF everysec and without persistence, nats-server with JetStream,
optionally rabbitmq-server), all on 127.0.0.1 and on free ports. Every process
started here is remembered by pid and stopped by pid; nothing else is touched.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def start_dev_broker(prefix: str) -> tuple[subprocess.Popen, str, Path]:
    """A ``minou start --dev`` broker (this Python) on a fresh data directory and free
    ports: its process, its native URL (read from its banner) and its work directory
    (``broker.log`` there). The caller terminates it."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    log = open(work / "broker.log", "w")  # noqa: SIM115 (the broker writes it until the end)
    proc = subprocess.Popen([sys.executable, "-m", "minou", "start", "--dev", "--data",
                             str(work / "data"), "--port", "0", "--http-port", "0"],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()  # the child keeps its own descriptor
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the broker exited: {(work / 'broker.log').read_text()}")
        for line in (work / "broker.log").read_text().splitlines():
            if line.strip().startswith("native"):
                return proc, line.split()[1], work
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before listening")
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s")


def dir_bytes(path: str | os.PathLike[str] | None) -> int | None:
    """Apparent size of every file under ``path``."""
    if path is None or not Path(path).exists():
        return None
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def stop_process(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM, wait, then SIGKILL: only this one process (we started it)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(5)


class MinouBroker:
    """``python -m minou start --data DIR --port 0 --http-port 0`` as a subprocess."""

    def __init__(self, workdir: Path, python: str = sys.executable,
                 storage: str = "sqlite", name: str = "minou", port: int = 0,
                 http_port: int = 0, placement: str = "primary",
                 durability: str = "fsync", extra_config: str = "",
                 log_level: str = "warning") -> None:
        """``durability``: the bench channel's (bench/v1: "fsync", the default, or
        "interval", issue 19). ``storage``: "sqlite" (the default: minou.db in the data
        dir), "redis" (a
        redis-server started here for this broker, see MinouRedis), or a redis:// URL:
        a Redis shared with other brokers (a cluster, see MinouCluster), which this
        broker neither starts nor stops. ``port`` / ``http_port``: 0 = any free one."""
        self.workdir = workdir
        self.python = python
        self.name = name
        self.redis = MinouRedis(workdir, name) if storage == "redis" else None
        self.shared_storage = storage if storage.startswith("redis://") else None
        self.port = port
        self.http_port = http_port
        self.standby = False  # the last start waited for the standby line, not the banner
        self.placement = placement  # [storage] placement on a shared Redis (docs/cluster.md)
        self.durability = durability
        self.extra_config = extra_config  # top-level keys first: put before the rest
        self.log_level = log_level  # of the broker's log (workdir/<name>-broker.log)
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.http_url: str | None = None  # the HTTP API (test e), e.g. http://127.0.0.1:PORT
        self.data_dir: Path | None = None
        self.resp_port: int | None = None  # the Redis protocol door, when configured
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def admin_key(self) -> str | None:
        return str(self.data_dir / "admin.key") if self.data_dir is not None else None

    @property
    def storage_dir(self) -> Path | None:
        """Where the durable state is: the data dir, or the redis-server's (its AOF)."""
        return self.redis.dir if self.redis is not None else self.data_dir

    def start(self, fresh: bool = True, timeout: float = 30.0, standby: bool = False) -> str:
        """Start the broker and wait until it serves; the native URL. ``standby``: it
        is expected to find another broker primary on its shared Redis: a standby
        prints no banner (it binds its ports, then waits for the lease), so what is
        waited for is its "standby: ..." log line, and its URLs are the fixed ports it
        was given (give it some: with port 0 nobody would know where it listens)."""
        if standby and not (self.port and self.http_port and self.shared_storage):
            raise ValueError("a standby needs fixed ports and a shared redis:// storage")
        if self.proc is not None:
            self.stop()
        if fresh or self.data_dir is None:
            if self.data_dir is not None:
                shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = Path(tempfile.mkdtemp(prefix="minou-data-", dir=self.workdir))
        storage: list[str] = []
        if self.redis is not None:
            # fresh: a new redis-server on an empty dir, as the SQLite broker gets an
            # empty data dir; otherwise the same one (a broker restart on its data)
            if fresh or self.redis.pid is None:
                self.redis.start()
            storage = ["--storage", self.redis.url]
        elif self.shared_storage is not None:
            storage = ["--storage", self.shared_storage]
        self.starts += 1
        self.standby = standby
        log = open(self.workdir / f"{self.name}-broker.log", "ab")  # noqa: SIM115 (Popen's)
        # Measured as deployed: authenticated clients (key pairs) under a rule, so the
        # per-message rule check is part of every number.
        spread = '[storage]\nplacement = "spread"\n' if self.placement == "spread" else ""
        channel = (f'[channels."bench/v1"]\ndurability = "{self.durability}"\n'
                   if self.durability != "fsync" else "")
        config = self.workdir / f"minou-bench-{self.name}-{self.placement}.toml"
        config.write_text(self.extra_config + spread + channel +
                          '[[rules]]\nclient = "bench-*"\nread = ["*"]\nwrite = ["*"]\n')
        self.proc = subprocess.Popen(
            [self.python, "-m", "minou", "start", "--data", str(self.data_dir),
             "--config", str(config),
             "--port", str(self.port), "--http-port", str(self.http_port),
             "--log-level", self.log_level, *storage],
            # a standby's only sign of life is a log line (stderr): read it with stdout
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if standby else log,
            stdin=subprocess.DEVNULL, text=True,
        )
        if not standby:
            log.close()
        lines: queue.Queue[str | None] = queue.Queue()

        def pump(stream) -> None:  # keep draining stdout so the broker never blocks on it
            for line in stream:
                lines.put(line)
                if standby:  # its stderr comes this way: keep it in the log as well
                    log.write(line.encode())
                    log.flush()
            if standby:
                log.close()
            lines.put(None)

        threading.Thread(target=pump, args=(self.proc.stdout,), daemon=True).start()
        url = http_url = None
        t0 = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - t0)
            try:
                line = lines.get(timeout=max(0.01, left))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(
                    f"minou broker did not start (see {self.workdir}/{self.name}-broker.log)")
            if standby:
                if "standby:" in line:
                    url = f"minou://127.0.0.1:{self.port}"
                    http_url = f"http://127.0.0.1:{self.http_port}"
                    break
                if re.match(r"minou \S+ broker .* ready$", line.strip()):
                    self.stop()
                    raise RuntimeError(f"{self.name} became primary, not a standby")
                continue
            m = re.search(r"native\s+(minou://\S+)", line)
            if m:
                url = m.group(1)
            m = re.search(r"http\s+(https?://\S+)", line)
            if m:
                http_url = m.group(1)
            m = re.search(r"redis\s+rediss?://\S+:(\d+)", line)
            if m:  # the Redis protocol door (extra_config "resp_port = 0")
                self.resp_port = int(m.group(1))
            if "stop with" in line and url:
                break
        self.url = url
        self.http_url = http_url
        # A standby, or a later broker spreading the queues, makes no admin key: the
        # first broker's is the one to use (the registry is shared).
        if not standby and (self.data_dir / "admin.key").exists():
            os.environ["MINOU_BENCH_ADMIN_KEY"] = str(self.data_dir / "admin.key")
        return url

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def close(self) -> None:
        self.stop()
        if self.redis is not None:
            self.redis.close()
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None


class MinouRedis:
    """The redis-server under a minou broker on Redis: loopback, a free port, a temp
    dir of its own, and the settings minou requires for a confirm to mean durable
    (``appendonly yes``, ``appendfsync always``; no RDB snapshots). ``start`` always
    begins on an empty dir: a fresh store for each test."""

    def __init__(self, workdir: Path, name: str) -> None:
        self.workdir = workdir
        self.name = name
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.close()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-redis-", dir=self.workdir))
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
             "--protected-mode", "yes", "--save", "", "--appendonly", "yes",
             "--appendfsync", "always", "--dir", str(self.dir), "--daemonize", "no",
             "--logfile", str(self.workdir / f"{self.name}-redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, 20, self.proc)

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class MinouCluster:
    """Test g: ``size`` minou brokers over one redis-server of their own (MinouRedis:
    loopback, AOF ``always``), each broker on its own fresh data dir and free ports.
    The first is started alone and waited for until it is ready, so it holds the
    lease: it is the primary, and every later one a standby relaying its clients to it.
    ``start`` always begins on an empty Redis: a fresh cluster for each row."""

    def __init__(self, workdir: Path, python: str = sys.executable,
                 name: str = "minou-cluster", placement: str = "primary") -> None:
        self.workdir = workdir
        self.python = python
        self.name = name
        # "spread": every broker owns a share of the queues and prints its banner (no
        # standby); started one after the other, so that the first makes the admin key
        self.placement = placement
        self.redis = MinouRedis(workdir, name)
        self.brokers: list[MinouBroker] = []

    def start(self, size: int) -> None:
        self.close()
        self.redis.start()
        try:
            for i in range(size):
                # a standby binds the ports it is given before waiting for the lease, and
                # says nothing of them: fixed free ports, so that its URL is known
                spread = self.placement == "spread"
                broker = MinouBroker(self.workdir, python=self.python,
                                     storage=self.redis.url, name=f"{self.name}-{i + 1}",
                                     port=free_port() if i else 0,
                                     http_port=free_port() if i else 0,
                                     placement=self.placement)
                self.brokers.append(broker)
                broker.start(fresh=True, standby=i > 0 and not spread)
        except BaseException:
            self.close()
            raise

    @property
    def primary(self) -> MinouBroker:
        return self.brokers[0]

    @property
    def urls(self) -> list[str]:
        """Native URLs, the primary's first."""
        return [b.url for b in self.brokers if b.url]

    @property
    def pids(self) -> list[int | None]:
        return [b.pid for b in self.brokers]

    def close(self) -> None:
        # standbys first: a primary stopped cleanly hands its lease over, and a standby
        # would take over (claiming every queue) on the way out
        for broker in reversed(self.brokers):
            with contextlib.suppress(Exception):
                broker.close()
        self.brokers = []
        self.redis.close()


class PeerServer:
    """One peer server process. ``name`` is a peers.py peer name."""

    def __init__(self, name: str, workdir: Path) -> None:
        self.name = name
        self.workdir = workdir
        self.port = free_port()
        self.data_dir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self._pid: int | None = None
        self._stop_cmd: list[str] | None = None
        self._epmd_pid: int | None = None

    @property
    def pid(self) -> int | None:
        if self.proc is not None:
            return self.proc.pid if self.proc.poll() is None else None
        return self._pid

    def start(self) -> None:
        kind = self.name.split("-")[0]
        getattr(self, f"_start_{kind}")()

    def _log(self, suffix: str = "log") -> str:
        return str(self.workdir / f"{self.name}.{suffix}")

    def _start_redis(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.workdir))
        persist = ["--appendonly", "yes", "--appendfsync", "everysec"] \
            if self.name == "redis-aof" else ["--appendonly", "no"]
        self.proc = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
             "--protected-mode", "yes", "--save", "", *persist, "--dir", str(self.data_dir),
             "--daemonize", "no", "--logfile", self._log()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, 20, self.proc)

    def _start_nats(self) -> None:
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.workdir))
        self.proc = subprocess.Popen(
            ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
             "-sd", str(self.data_dir), "-l", self._log()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, 20, self.proc)
        time.sleep(0.5)  # JetStream finishes initialising just after the port opens

    def _start_rabbitmq(self) -> None:
        """Like /work/shared/bench/servers.sh, but on a private node name, free ports
        and a temporary data directory; the Debian wrapper runs it as user rabbitmq."""
        base = Path(tempfile.mkdtemp(prefix="rabbitmq-", dir=self.workdir))
        base.chmod(0o755)
        self.workdir.chmod(0o755)
        with contextlib.suppress(Exception):
            shutil.chown(base, "rabbitmq", "rabbitmq")
        self.data_dir = base / "mnesia"
        node = f"minoubench{os.getpid()}@localhost"
        pidfile = base / "rabbitmq.pid"
        env = dict(
            os.environ,
            RABBITMQ_NODENAME=node, RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port), RABBITMQ_DIST_PORT=str(free_port()),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"), RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_PID_FILE=str(pidfile),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        )
        (base / "enabled_plugins").write_text("[].\n")
        with contextlib.suppress(Exception):
            shutil.chown(base / "enabled_plugins", "rabbitmq", "rabbitmq")
        epmd_before = set(_pgrep_exact("epmd"))
        subprocess.run(["rabbitmq-server", "-detached"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._stop_cmd = ["rabbitmqctl", "-q", "-n", node, "stop", str(pidfile)]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            r = subprocess.run(["rabbitmqctl", "-q", "-n", node, "await_startup",
                                "--timeout", "5"], env=env, capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(1)
        else:
            raise RuntimeError("rabbitmq did not start in 120 s")
        self._pid = int(pidfile.read_text().strip())
        new_epmd = [p for p in _pgrep_exact("epmd") if p not in epmd_before]
        self._epmd_pid = new_epmd[0] if new_epmd else None
        wait_port(self.port, 30)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        if self._stop_cmd is not None:
            r = subprocess.run(self._stop_cmd, capture_output=True, timeout=120)
            if r.returncode != 0 and self._pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._pid, signal.SIGTERM)
            self._stop_cmd = None
            self._pid = None
        if self._epmd_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._epmd_pid, signal.SIGTERM)
            self._epmd_pid = None


def _pgrep_exact(name: str) -> list[int]:
    r = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True)
    return [int(x) for x in r.stdout.split()]


def installed_peers() -> list[str]:
    """The systems besides the SQLite broker to measure by default: a minou broker on
    Redis and the peers, each whose server binary is installed."""
    out = ["minou-interval"]  # the SQLite broker again, its channel "interval"
    if shutil.which("redis-server"):
        out += ["minou-redis", "redis-aof", "redis-mem"]
    if shutil.which("nats-server"):
        out.append("nats-js")
    if shutil.which("rabbitmq-server"):
        out.append("rabbitmq")
    return out
