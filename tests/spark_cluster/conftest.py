"""A real Spark standalone cluster on loopback, whose executors cannot see the driver's keys.

One master and two workers (1 core, 1 GB each) per test session. Each worker runs in a
private mount namespace (``unshare -m``) where the directory ``driver_keys`` is covered
by an empty tmpfs: the driver (a subprocess on the host) sees the job's key there, the
executors, their Python workers and everything they start see an empty directory. A
test that passes on this cluster shows that the executors never read the driver's
files: whatever they need must reach them through Spark (``addFile``) or the broker.

The driver never runs in the pytest process: a process has one SparkContext, and
tests/spark/ keeps a ``local[2]`` one in it. ``run_driver`` starts ``driver.py`` with a
scenario name and JSON arguments and returns the JSON it prints last.

Needs root (mount namespaces) and ``unshare``; otherwise the package is skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from minou.auth import keys as keyfiles

from ..conftest import BrokerProcess
from ..ports import restartable_port
from ..spark.conftest import rules_broker

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "driver.py"
SPARK_HOME = Path(__import__("pyspark").__file__).resolve().parent
# The job's identity: its key lives only in the masked directory. The tests' own
# client (publishing, checking) has another id and another key, outside it.
JOB_CLIENT_ID = "spark-cluster-job"
# A broker name the driver resolves to the broker (127.0.0.1) and the executors to an
# address where nothing listens (127.0.0.2): a broker unreachable from executors only.
SPLIT_NAME = "minou-broker.test"
TEST_CLIENT_ID = "spark-cluster-tests"


def _why_skip() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the Spark cluster tests need root: workers run in a private mount namespace"
    if shutil.which("unshare") is None:
        return "the Spark cluster tests need unshare (util-linux) for the workers' namespace"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Same filters as tests/spark/conftest.py (py4j/pyspark warnings are not ours), and
    # the whole package skipped where the workers cannot be given a namespace.
    reason = _why_skip()
    for item in items:
        if "tests/spark_cluster/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::DeprecationWarning"))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


# ---------------------------------------------------------------- processes
def free_port() -> int:
    """A free loopback port not handed out before in this run (a JVM binds its port
    seconds after it was picked, so two daemons picked in a row could otherwise get the
    same one: a worker's web UI then answered the master's /json/ with its HTML page),
    and outside the ephemeral range (``tests/ports.py``)."""
    return restartable_port()


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            out.append(child)
            frontier.append(child)
    return out


def spark_env(**more: str) -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            **more}


@dataclass
class Daemon:
    """A Spark master or worker JVM started in its own process group (our own child)."""

    name: str
    log_path: Path
    make_cmd: Callable[[Daemon], list[str]]
    env: dict[str, str]
    webui_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Daemon:
        self.webui_port = free_port()  # a new one each start: no clash with the dead one
        with open(self.log_path, "ab") as out:
            out.write(f"\n==== start {self.starts + 1}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.make_cmd(self), env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.starts += 1
        return self

    def kill(self) -> None:
        """kill -9 of the process group (the JVM and the executors it launched) and of any
        descendant that left it (PySpark's daemon makes its own group): a lost machine."""
        if self.proc is None or self.proc.poll() is not None:
            return
        stray = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(20)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class SparkCluster:
    """The running cluster: ``master_url`` for drivers, ``workers`` (``.pid``, ``.kill()``;
    ``restart_worker(i)``), ``worker_dirs`` (executors run in ``<dir>/<app id>/<exec id>``),
    ``driver_keys`` (the directory executors see empty) and ``job_key`` in it."""

    master_url: str
    master: Daemon
    workers: list[Daemon]
    worker_dirs: list[Path]
    driver_keys: Path
    job_key: Path
    root: Path
    driver_hosts: Path  # /etc/hosts of a driver run with split_dns (SPLIT_NAME -> broker)

    @property
    def master_json_url(self) -> str:
        return f"http://127.0.0.1:{self.master.webui_port}/json/"

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.master_json_url, timeout=5) as resp:
            return json.loads(resp.read())

    def alive_worker_ports(self) -> set[int]:
        """Web UI ports of the workers the master holds ALIVE."""
        try:
            workers = self.state().get("workers", [])
        except (OSError, ValueError):  # not up yet, or not the JSON of a master yet
            return set()
        return {int(w["webuiaddress"].rsplit(":", 1)[1]) for w in workers
                if w.get("state") == "ALIVE"}

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until every running worker handle is registered ALIVE with the master."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for d in (self.master, *self.workers):
                if not d.alive:
                    raise RuntimeError(f"{d.name} exited while starting:\n{d.log_tail()}")
            want = {w.webui_port for w in self.workers}
            if want <= self.alive_worker_ports():
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Spark cluster was not ready in {timeout:g} s; master "
                           f"log:\n{self.master.log_tail()}\nworker logs:\n"
                           + "\n".join(w.log_tail(15) for w in self.workers))

    def kill_worker(self, index: int) -> None:
        self.workers[index].kill()

    def restart_worker(self, index: int, timeout: float = 90.0) -> None:
        """Start worker ``index`` again (killing it first if it still runs), in a fresh
        namespace with the mask, and wait until the master has it ALIVE."""
        self.workers[index].kill()
        self.workers[index].start()
        self.wait_ready(timeout)

    def worker_of(self, path: str) -> int | None:
        """Which worker's directory ``path`` (an executor's cwd) lies in."""
        for i, d in enumerate(self.worker_dirs):
            if Path(path).is_relative_to(d):
                return i
        return None

    def stop(self) -> None:
        for d in (*self.workers, self.master):
            with contextlib.suppress(Exception):
                d.kill()


def _hosts_file(path: Path, address: str) -> Path:
    """/etc/hosts as it is, plus SPLIT_NAME at ``address``."""
    path.write_text(Path("/etc/hosts").read_text() + f"\n{address} {SPLIT_NAME}\n")
    return path


def _worker_cmd(master_url: str, keys: Path, hosts: Path) -> Callable[[Daemon], list[str]]:
    def cmd(d: Daemon) -> list[str]:
        spark_class = SPARK_HOME / "bin" / "spark-class"
        inner = (f"mount -t tmpfs -o size=1m,mode=0700 tmpfs {shlex.quote(str(keys))} && "
                 f"mount --bind {shlex.quote(str(hosts))} /etc/hosts && "
                 f"exec {shlex.quote(str(spark_class))} "
                 "org.apache.spark.deploy.worker.Worker --host 127.0.0.1 --cores 1 "
                 f"--memory 1g --webui-port {d.webui_port} {master_url}")
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", inner]
    return cmd


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    reason = _why_skip()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("spark-cluster")
    # The mask's mount point exists before any worker starts; so does the job's key.
    driver_keys = tmp_path_factory.mktemp("driver-keys")
    job_key, _ = keyfiles.save(keyfiles.generate(), driver_keys, JOB_CLIENT_ID)
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master = Daemon("master", root / "master.log", lambda d: [
        str(SPARK_HOME / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
        "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(d.webui_port)],
        spark_env(SPARK_DAEMON_MEMORY="512m"))
    worker_hosts = _hosts_file(root / "hosts-workers", "127.0.0.2")
    driver_hosts = _hosts_file(root / "hosts-driver", "127.0.0.1")
    worker_dirs = [root / f"worker{i}" for i in range(2)]
    workers = []
    for i, wdir in enumerate(worker_dirs):
        wdir.mkdir()
        workers.append(Daemon(f"worker{i}", root / f"worker{i}.log",
                              _worker_cmd(master_url, driver_keys, worker_hosts),
                              spark_env(SPARK_WORKER_DIR=str(wdir),
                                        SPARK_DAEMON_MEMORY="512m")))
    cluster = SparkCluster(master_url, master, workers, worker_dirs, driver_keys, job_key,
                           root, driver_hosts)
    try:
        master.start()
        for w in workers:
            w.start()
        cluster.wait_ready()
        yield cluster
    finally:
        cluster.stop()


# ---------------------------------------------------------------- the broker
@pytest.fixture(scope="session")
def cluster_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker in keys mode (tests/spark's rules: spark-* reads and writes all)."""
    with rules_broker(tmp_path_factory, "spark-cluster-broker") as broker:
        yield broker


@pytest.fixture(scope="session")
def tls_cluster_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """The same with a self-signed TLS certificate (minous://)."""
    with rules_broker(tmp_path_factory, "spark-cluster-tls-broker",
                      "\n[tls]\nself_signed = true\n") as broker:
        yield broker


@pytest.fixture(scope="session")
def cluster_client(cluster_broker: BrokerProcess) -> Iterator[Any]:
    """The tests' own client (not the job's identity): publishes inputs, checks outputs."""
    c = cluster_broker.connect_sync(TEST_CLIENT_ID)
    try:
        yield c
    finally:
        c.close()


def make_job_args(spark_cluster: SparkCluster, broker: BrokerProcess,
                  workdir: Path) -> dict[str, Any]:
    """What every driver scenario gets: the broker, the job's identity as the driver
    holds it, the masked directory and a work directory (checkpoints)."""
    return {"brokers": broker.url, "client_id": JOB_CLIENT_ID,
            "key_file": str(spark_cluster.job_key),
            "tls_fingerprint": broker.tls_fingerprint,
            "driver_keys": str(spark_cluster.driver_keys), "workdir": str(workdir)}


@pytest.fixture
def job_args(spark_cluster: SparkCluster, cluster_broker: BrokerProcess,
             tmp_path: Path) -> dict[str, Any]:
    return make_job_args(spark_cluster, cluster_broker, tmp_path)


# ---------------------------------------------------------------- drivers
class DriverFailed(AssertionError):
    pass


@pytest.fixture
def run_driver(spark_cluster: SparkCluster, tmp_path: Path) -> Callable[..., dict[str, Any]]:
    return driver_runner(spark_cluster, tmp_path)


def driver_runner(spark_cluster: SparkCluster,
                  tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """``run(scenario, args, timeout) -> dict``: driver.py in a subprocess, as a client
    of the cluster; returns the JSON of its last stdout line, or raises with the tail of
    its stderr. ``scenario`` may name several, ``a+b``: one application runs them in
    turn (a Spark application takes ~15 s to start here), ``args`` then holds each
    one's arguments under its name and the result each one's result."""
    runs = iter(range(1, 1000))

    def run(scenario: str, args: dict[str, Any], timeout: float = 120.0, *,
            split_dns: bool = False) -> dict[str, Any]:
        """``split_dns``: the driver runs in its own mount namespace whose /etc/hosts
        resolves SPLIT_NAME to the broker (the executors' resolves it to nowhere)."""
        n = next(runs)
        spark_cluster.wait_ready(60)  # both workers, whatever an earlier test did
        err_path = tmp_path / f"driver-{scenario}-{n}.stderr"
        env = spark_env(MINOU_SPARK_MASTER=spark_cluster.master_url, PYTHONUNBUFFERED="1",
                        XDG_CACHE_HOME=str(tmp_path / "xdg-cache"))
        cmd = [sys.executable, str(DRIVER), scenario, json.dumps(args)]
        if split_dns:
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f"mount --bind {shlex.quote(str(spark_cluster.driver_hosts))} /etc/hosts "
                   "&& exec " + " ".join(shlex.quote(c) for c in cmd)]
        with open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            timed_out = False
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                # The driver's JVM (and anything else left in its group) goes with it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if timed_out:
                out, _ = proc.communicate(timeout=20)
        tail = "\n".join(err_path.read_text(errors="replace").splitlines()[-60:])
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        if timed_out or proc.returncode != 0 or not lines:
            what = "timed out" if timed_out else f"exited with {proc.returncode}"
            raise DriverFailed(f"driver scenario {scenario!r} {what} (limit {timeout:g} s); "
                               f"stderr tail ({err_path}):\n{tail}")
        try:
            result = json.loads(lines[-1])
        except json.JSONDecodeError:
            raise DriverFailed(f"driver scenario {scenario!r} printed no JSON last: "
                               f"{lines[-1][:500]!r}; stderr tail:\n{tail}") from None
        err_path.with_suffix(".json").write_text(json.dumps(result, indent=1))
        return result

    return run
