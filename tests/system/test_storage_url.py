"""``--storage`` / ``[storage] url``: the broker runs on the storage it is given."""

from __future__ import annotations

import subprocess
import sys

import pytest

import minou

from ..conftest import auth

pytestmark = pytest.mark.sqlite_only


def test_a_database_elsewhere_holds_everything_and_survives_a_kill(broker_factory, tmp_path):
    db = tmp_path / "elsewhere" / "queue.db"
    broker = broker_factory.make(extra=["--storage", f"sqlite://{db}"]).start()
    with minou.connect_sync(broker.url, **auth("storage-1")) as c:
        c.send_many([("orders/v1/1", {"n": i}) for i in range(20)])
    broker.kill()
    assert db.exists() and not (broker.data_dir / "minou.db").exists()
    broker.start()
    with minou.connect_sync(broker.url, **auth("storage-1")) as c:
        msgs, _ = c.read("orders/v1/1")
        assert [m.payload["n"] for m in msgs] == list(range(20))
        assert c.admin("whoami")["client_id"] == "storage-1"
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        storage = a.admin("status")["storage"]
    assert storage["backend"] == "sqlite" and storage["path"] == str(db)


def test_two_brokers_on_one_database_collide_whatever_their_data_dirs(broker_factory,
                                                                       tmp_path):
    url = f"sqlite://{tmp_path / 'shared' / 'minou.db'}"
    first = broker_factory.make(extra=["--storage", url]).start()
    second = subprocess.run(
        [sys.executable, "-m", "minou", "start", "--data", str(tmp_path / "other"),
         "--port", "0", "--http-port", "0", "--storage", url],
        capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f"data directory {tmp_path / 'shared'} is in use by another minou broker" \
        in second.stderr, second.stderr
    assert first.alive


def test_an_unknown_backend_is_refused_before_anything_starts(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "minou", "start", "--data", str(tmp_path / "d"), "--port", "0",
         "--storage", "postgres://db/minou"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "unknown backend 'postgres'; known: sqlite:///path/to/minou.db" in run.stderr
    assert not (tmp_path / "d").exists()


def test_a_memory_broker_serves_and_says_so(broker_factory):
    broker = broker_factory.make(extra=["--storage", "memory://system-test"]).start()
    with minou.connect_sync(broker.url, **auth("storage-2")) as c:
        c.send("orders/v1/1", {"n": 1})
        assert c.read("orders/v1/1")[0][0].payload == {"n": 1}
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        assert a.admin("status")["storage"]["backend"] == "memory"
    assert not (broker.data_dir / "minou.db").exists()
