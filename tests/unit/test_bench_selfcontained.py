"""`make bench` works from a clone alone: the peer drivers are bench/peers.py, and no
module the bench runs looks for them in a folder beside the repository."""

from __future__ import annotations

import ast
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# what `make bench` runs (profile_minou.py is a separate profiling tool)
BENCH_MODULES = ["minou_bench", "peers", "bench_clients", "bench_servers", "http_bench",
                 "spark_bench"]


def _clone(tmp_path: Path) -> Path:
    """bench/ copied to <tmp>/minou/bench: no ../shared beside it."""
    repo = tmp_path / "minou"
    shutil.copytree(BENCH, repo / "bench",
                    ignore=shutil.ignore_patterns("__pycache__", "results"))
    assert not (tmp_path / "shared").exists()
    return repo


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MINOU_PEERS_DIR")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def test_minou_bench_finds_its_peer_drivers_without_a_shared_folder(tmp_path: Path) -> None:
    repo = _clone(tmp_path)
    # an unknown peer is refused right after the peer drivers are imported, before
    # any server starts
    r = subprocess.run([sys.executable, str(repo / "bench" / "minou_bench.py"),
                        "--peers", "no-such-peer"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "unknown peer 'no-such-peer'" in r.stderr, r.stderr
    for name in ("redis-aof", "redis-mem", "nats-js", "rabbitmq"):
        assert name in r.stderr


def test_spawned_workers_import_the_in_repo_drivers(tmp_path: Path) -> None:
    pytest.importorskip("redis")
    repo = _clone(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = f"""
import sys
sys.path.insert(0, {str(repo / "bench")!r})
import bench_clients, peers
assert peers.__file__.startswith({str(repo)!r}), peers.__file__
job = dict(peer="redis-aof", ports={{"redis-aof": {port}}}, role="pub", n=1, size=100,
           window=1, limit_s=1.0)
try:
    bench_clients.run_jobs([job], timeout=60)
except RuntimeError as e:
    print("WORKER:", e)
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # the worker imported peers.py, built a Redis driver and tried the port: it did not
    # die on an import (which would show as a timeout with 0/1 workers)
    assert "WORKER: ConnectionError" in r.stdout, (r.stdout, r.stderr)
    assert str(port) in r.stdout


def _code_strings(path: Path) -> list[str]:
    """String constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


@pytest.mark.parametrize("module", BENCH_MODULES)
def test_no_bench_module_points_outside_the_repository(module: str) -> None:
    bad = [s for s in _code_strings(BENCH / f"{module}.py")
           if re.search(r"(^|/)shared($|/)", s) or "PEERS_DIR" in s]
    assert not bad, f"bench/{module}.py refers to a folder outside the repository: {bad}"
