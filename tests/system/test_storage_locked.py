"""Another process holding SQLite's write lock is not a crash.

An operator's ``sqlite3`` shell left inside a transaction, a ``VACUUM`` run by hand, a
backup tool that writes: SQLite's busy handler waits 5 s, then the commit fails with
SQLITE_BUSY, having written nothing. Before, the broker took that as a storage failure
and stopped (exit 1): its clients lost their broker because someone opened its
database. Now it is an episode like Redis out of reach: publishes are refused with
STORAGE_UNAVAILABLE saying who holds the lock, ``/health`` says 503 and why, the broker
logs it once, tries again every few seconds and resumes by itself once the lock is
released; everything confirmed stays, nothing refused is stored.

A real broker process; the lock is held by another real process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import minou
from minou.errors import StorageUnavailable

from ..conftest import BrokerProcess, wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.sqlite_only]

CH = "locked/v1/a"

# Holds the write lock until its stdin closes or says anything.
HOLD_LOCK = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


def storage_path(broker: BrokerProcess) -> str:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as admin:
        return str(admin.admin("status")["storage"]["path"])


@pytest.fixture
def lock_holder() -> Iterator[Any]:
    held: list[subprocess.Popen[str]] = []

    def hold(path: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, path], text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        held.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        return proc

    yield hold
    for proc in held:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):  # else a ResourceWarning in a later test
            if pipe is not None:
                pipe.close()


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(10) == 0


def test_a_write_lock_held_by_another_process_pauses_publishes_and_the_broker_stays_up(
        broker_factory: Any, lock_holder: Any) -> None:
    broker = broker_factory.make().start()
    with broker.connect_sync("locked-producer", confirm_timeout=30) as producer:
        confirmed = [producer.send(CH, {"n": 0}).seq]
        holder = lock_holder(storage_path(broker))

        # SQLite's busy handler waits its 5 s, then the publish is refused, precisely.
        with pytest.raises(StorageUnavailable) as refused:
            producer.send(CH, {"n": 1})
        message = refused.value.message
        assert "locked by another process" in message, message
        assert f"pid {holder.pid}" in message, message  # who holds it, for the operator
        assert broker.alive, broker.output[-2000:]

        health = httpx.get(broker.http + "/health", timeout=10)
        assert health.status_code == 503, health.text
        assert health.json()["storage"] == "unavailable"
        assert "locked by another process" in health.json()["reason"]
        # Refused at the door meanwhile, at once: no 5 s wait per publish.
        with pytest.raises(StorageUnavailable):
            producer.send(CH, {"n": 2})

        release(holder)
        # The broker tries again by itself; publishing resumes.
        wait_until(lambda: httpx.get(broker.http + "/health", timeout=10).status_code
                   == 200, 20, what="the broker to find the lock released")
        confirmed.append(producer.send(CH, {"n": 3}).seq)
    assert broker.alive
    assert broker.output.count("locked by another process") == 1, broker.output[-3000:]

    # Everything confirmed, in order; nothing refused was stored.
    with broker.connect_sync("locked-reader") as reader:
        sub = reader.consume(CH, group="g", start="oldest")
        got = []
        for _ in confirmed:
            msg = sub.get(timeout=10)
            got.append((msg.seq, msg.payload["n"]))
            msg.ack()
        with pytest.raises(minou.Timeout):
            sub.get(timeout=1)
    assert got == [(confirmed[0], 0), (confirmed[1], 3)]
