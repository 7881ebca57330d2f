"""A full disk is not a crash (issue 13, item 1): a real broker process, filled up.

``[storage] max_size`` makes SQLite fail with SQLITE_FULL exactly as a full disk does
(``PRAGMA max_page_count``), so these tests need no privileges and always run. When
this machine lets the test mount a small tmpfs, one more test fills a real file
system; it is skipped, saying why, where mounting is not permitted.

In every case: publishes past the space get STORAGE_FULL (native: the precise error,
the connection goes on; HTTP: 507 with the JSON error), what is stored keeps being
delivered and acked, ``/health`` says 503 and why, the broker logs the cause once
and stays up, publishing resumes by itself once there is room, and after kill -9
every confirmed message is there exactly as confirmed and the database is intact.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.errors import StorageFull

from ..conftest import BrokerProcess, auth, client_key, wait_until

pytestmark = [pytest.mark.timeout(180), pytest.mark.sqlite_only]

CH = "fill/v1/1"
PAD = "x" * 30_000  # each message: about 30 KB


# --------------------------------------------------------------------------- helpers
def fill(client: Any, pad: str = PAD) -> tuple[dict[int, int], StorageFull]:
    """Publish until the broker refuses: {seq: n} of the confirmed ones, and the error."""
    confirmed: dict[int, int] = {}
    for n in range(20_000):
        try:
            receipt = client.send(CH, {"n": n, "pad": pad})
        except StorageFull as exc:
            return confirmed, exc
        confirmed[receipt.seq] = n
    raise AssertionError("the storage never filled up")


def bearer(broker: BrokerProcess, client_id: str) -> dict[str, str]:
    with minou.connect_sync(broker.url, **auth(client_id)):
        pass  # registers the key (a native HELLO)
    key = keyfiles.load_private(client_key(client_id))
    return {"Authorization": f"Bearer {make_token(client_id, key, 'minou', ttl=600)}"}


def health(broker: BrokerProcess) -> httpx.Response:
    return httpx.get(broker.http + "/health", timeout=10)


def drain(broker: BrokerProcess, client_id: str, expect: int, *, timeout: float = 2.0,
          prefetch: int = 64) -> tuple[dict[int, int], set[int]]:
    """Consume and ack group ``g`` until ``expect`` came and then nothing more for
    ``timeout`` s: ({seq: n} received, seqs whose ack was made durable)."""
    got: dict[int, int] = {}
    durable: set[int] = set()
    with broker.connect_sync(client_id) as c:
        sub = c.consume("fill/v1/*", group="g", prefetch=prefetch)
        while True:
            try:
                msg = sub.get(timeout=20 if len(got) < expect else timeout)
            except (TimeoutError, minou.Timeout):
                break
            assert msg.seq not in got, f"seq {msg.seq} delivered twice"
            got[msg.seq] = msg.payload["n"]
            if msg.ack():
                durable.add(msg.seq)
    return got, durable


def integrity(path: Path) -> str:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("PRAGMA integrity_check").fetchone()[0]


def check_refusals(broker: BrokerProcess, pub: Any, exc: StorageFull, where: str,
                   http_auth: dict[str, str]) -> None:
    """While full: the precise refusal everywhere, and the broker up."""
    assert "storage full" in exc.message and where in exc.message, exc.message
    assert "free" in exc.message
    # The same connection goes on: refused again at once, and it still answers.
    with pytest.raises(StorageFull):
        pub.send(CH, {"n": -1})
    assert CH in pub.offsets("fill/v1/*")
    r = httpx.post(broker.http + "/v1/messages/" + CH, json={"n": -2}, headers=http_auth,
                   timeout=10)
    assert r.status_code == 507, r.text
    error = r.json()["error"]
    assert (error["code"], error["reason"]) == (304, "storage_full")
    assert where in error["message"] and error["detail"]["data_dir"] == where
    assert isinstance(error["detail"]["free_bytes"], int)
    r = httpx.post(broker.http + "/v1/messages", json=[{"channel": CH, "payload": 1}],
                   headers=http_auth, timeout=10)
    assert r.status_code == 507 and r.json()["error"]["reason"] == "storage_full"
    r = health(broker)
    assert r.status_code == 503
    body = r.json()
    assert (body["status"], body["storage"]) == ("storage_full", "full")
    assert where in body["reason"] and body["data_dir"] == where
    assert broker.alive


def check_after_kill(broker: BrokerProcess, before: dict[int, int], after: dict[int, int],
                     durable: set[int], db: Path) -> None:
    """kill -9, restart: every confirmed message not durably acked is there exactly
    as confirmed, nothing else is; the database is intact."""
    broker.kill()
    broker.start()
    got, _ = drain(broker, "recount", len(after))
    must = {seq: n for seq, n in {**before, **after}.items() if seq not in durable}
    assert set(after) <= set(got), "a message confirmed after the resume is missing"
    assert set(got) <= set(must), f"unconfirmed or acked messages came back: " \
                                  f"{sorted(set(got) - set(must))[:10]}"
    assert all(got[seq] == must[seq] for seq in got)  # exactly as confirmed
    assert broker.stop() == 0
    assert integrity(db) == "ok"


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("durability", ["fsync", "interval"])
def test_a_full_quota_refuses_publishes_serves_the_rest_and_resumes(broker_factory, tmp_path,
                                                                    durability):
    """Both modes: a commit this small is made on the broker's loop, not the writer
    thread, and its SQLITE_FULL must be told and survived the same way."""
    cfg = tmp_path / "quota.toml"
    cfg.write_text(f'[channels."{CH.rsplit("/", 1)[0]}"]\ndurability = "{durability}"\n'
                   '[storage]\nmax_size = "4MB"\n')
    b = broker_factory.make(config=cfg).start()
    where = str(b.data_dir.resolve())
    http_auth = bearer(b, "http-pub")
    with b.connect_sync("pub") as pub:
        before, exc = fill(pub)
        assert len(before) > 50
        check_refusals(b, pub, exc, where, http_auth)
        assert "max_size" in exc.message
        with minou.connect_sync(b.url, **b.admin_auth()) as admin:
            storage = admin.admin("status")["storage"]
        assert storage["commits_on_loop"] > 0, storage

        # What is stored is delivered and acked, all of it, once; nothing else.
        got, durable = drain(b, "worker", len(before))
        assert got == before
        assert durable, "no ack could be made durable while full (the reserve is for them)"

        # The acks settled the channel, SQLite reuses its pages: publishing resumes alone.
        wait_until(lambda: health(b).status_code == 200, timeout=20,
                   what="publishing to resume once the acks freed the pages")
        after = {pub.send(CH, {"n": n, "pad": PAD}).seq: n for n in range(100_000, 100_010)}
    assert b.alive
    log = b.output
    assert log.count("storage full") == 1, log  # the cause, once: not a line per publish
    assert "database or disk is full" in log and "Traceback" not in log
    assert "storage has room again" in log
    check_after_kill(b, before, after, durable, b.data_dir / "minou.db")


def test_restarted_while_full_it_refuses_instead_of_dying_and_a_reload_makes_room(
        broker_factory, tmp_path):
    cfg = tmp_path / "quota.toml"
    cfg.write_text('[storage]\nmax_size = "2MB"\n')
    b = broker_factory.make(config=cfg).start()
    with b.connect_sync("pub") as pub:
        before, _ = fill(pub)
    b.kill()
    b.start()  # still full
    with b.connect_sync("pub") as pub:
        with pytest.raises(StorageFull):  # the first publish: refused, not a crash
            pub.send(CH, {"n": -1, "pad": PAD})
        assert b.alive and health(b).status_code == 503
        # Raise the quota in the running broker's config: a reload applies it.
        live = b.data_dir.parent / f"{b.data_dir.name}-config.toml"
        live.write_text(live.read_text().replace('max_size = "2MB"', 'max_size = "16MB"'))
        assert b.proc is not None
        b.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: health(b).status_code == 200, timeout=20,
                   what="publishing to resume after the reload raised max_size")
        after = {pub.send(CH, {"n": n, "pad": PAD}).seq: n for n in range(100_000, 100_005)}
    assert "storage has room again" in b.output
    check_after_kill(b, before, after, set(), b.data_dir / "minou.db")


def _mount_tmpfs(where: Path, size: str) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("a real full disk needs a Linux tmpfs; the max_size tests cover "
                    "the same SQLITE_FULL path")
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                               str(where)], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}); the max_size tests cover the "
                    "same SQLITE_FULL path")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here ({done.stderr.strip()}); the "
                    "max_size tests cover the same SQLITE_FULL path")


@contextlib.contextmanager
def broker_on_tmpfs(broker_factory: Any, tmp_path: Path, size: str, ballast: int = 0
                    ) -> Iterator[tuple[BrokerProcess, Path]]:
    """A broker whose data directory is on a tmpfs of ``size`` (its log and config stay
    off it), with ``ballast`` bytes in a file beside it; yields (broker, ballast path).
    The broker is killed before the unmount: nothing may hold the mount open."""
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt, size)
    b: BrokerProcess | None = None
    try:
        (mnt / "data").mkdir()
        data = tmp_path / "data"
        data.symlink_to(mnt / "data")
        with open(mnt / "ballast", "wb") as out:
            out.write(b"\0" * ballast)
        b = broker_factory.make(data_dir=data).start()
        yield b, mnt / "ballast"
    finally:
        if b is not None:
            b.kill()
        done = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_real_full_tmpfs(broker_factory, tmp_path):
    with broker_on_tmpfs(broker_factory, tmp_path, "32m", ballast=10 << 20) as (b, ballast):
        where = str(b.data_dir.resolve())
        http_auth = bearer(b, "http-pub")
        with b.connect_sync("pub") as pub:
            before, exc = fill(pub, "x" * 400_000)  # big: few acks to make durable
            check_refusals(b, pub, exc, where, http_auth)
            assert "free on its disk" in exc.message
            # Acks go on in the reserve the broker gave back (once it is used up too, an
            # ack is answered "not durable", False: that message may come again).
            got, durable = drain(b, "worker", len(before), prefetch=4)
            assert got == before and durable
            time.sleep(1.5)  # probes have seen the disk still full
            assert health(b).status_code == 503
            ballast.unlink()  # the operator frees space
            wait_until(lambda: health(b).status_code == 200, timeout=20,
                       what="publishing to resume once the disk has room")
            after = {pub.send(CH, {"n": n, "pad": PAD}).seq: n
                     for n in range(100_000, 100_005)}
        assert b.output.count("storage full") == 1 and "Traceback" not in b.output
        check_after_kill(b, before, after, durable, b.data_dir.resolve() / "minou.db")


@pytest.mark.parametrize("where", ["writer", "loop"])
def test_any_other_storage_failure_stops_the_broker_with_a_non_zero_status(tmp_path, where):
    """Not a full disk (here an fsync error, whose outcome is unknown): the waiting
    publisher gets STORAGE_UNAVAILABLE, never a confirm, and the broker stops with a
    non-zero exit status and the reason (it used to exit 0). Both ways a commit is
    made: whole by the writer thread (a batch too big for the loop), or written by the
    loop and fsync'd by the writer thread."""
    import asyncio
    import errno

    from minou.config import Settings
    from minou.errors import ErrorCode, RequestError, StorageUnavailable
    from minou.limits import COMMIT_HERE_MAX_MESSAGES
    from minou.server.app import BrokerServer

    async def scenario() -> BrokerServer:
        server = BrokerServer(Settings(data_dir=str(tmp_path / "d"), port=0, http_port=None,
                                       auth_mode="off"))
        await server.start()
        assert server.native_address is not None
        client = await minou.connect(f"minou://127.0.0.1:{server.native_address[1]}",
                                     client_id="pub", reconnect=False)
        try:
            await client.send(CH, {"n": 1})

            def broken(batch: Any) -> None:
                raise StorageUnavailable("commit failed: disk I/O error (SQLITE_IOERR_FSYNC)")

            def broken_sync() -> None:
                raise OSError(errno.EIO, "Input/output error")

            with pytest.raises(RequestError) as info:
                if where == "writer":
                    server.storage.apply = broken  # type: ignore[method-assign]
                    await client.send_many([(CH, {"n": n})
                                            for n in range(COMMIT_HERE_MAX_MESSAGES + 1)])
                else:
                    server.storage.sync = broken_sync  # type: ignore[method-assign]
                    await client.send(CH, {"n": 2})
            assert info.value.code == ErrorCode.STORAGE_UNAVAILABLE
            cause = "SQLITE_IOERR_FSYNC" if where == "writer" else \
                "fsync of the write-ahead log failed (Input/output error)"
            assert cause in info.value.message
            await asyncio.wait_for(server.serve_forever(), 10)  # it asked to stop
        finally:
            await client.close()
        await server.stop()
        return server

    server = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert server.exit_status == 1
    assert ("SQLITE_IOERR_FSYNC" if where == "writer" else "Input/output error") in \
        server.stop_reason


@pytest.mark.parametrize("how", ["removed", "replaced"])
def test_a_database_removed_under_the_broker_stops_it_before_another_confirm(
        broker_factory, tmp_path, how):
    """SQLite goes on writing to a removed file: every confirm from then on would be lost
    at the next start. The next commit notices, answers STORAGE_UNAVAILABLE instead of a
    confirm, and the broker stops with a non-zero status saying why."""
    from minou.errors import ErrorCode, RequestError

    b = broker_factory.make().start()
    db = b.data_dir / "minou.db"
    with b.connect_sync("pub") as pub:
        pub.send(CH, {"n": 1})
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        if how == "replaced":  # a restore copied over it, say
            sqlite3.connect(db).close()
        with pytest.raises(RequestError) as info:
            pub.send(CH, {"n": 2})
    assert info.value.code == ErrorCode.STORAGE_UNAVAILABLE
    assert "removed or replaced" in info.value.message
    assert b.proc is not None and b.proc.wait(20) != 0
    assert "removed or replaced while the broker ran" in b.output
    if how == "removed":
        assert not db.exists()  # no empty database made where the old one was


def read_back(broker: BrokerProcess, channel: str, count: int) -> list[int]:
    """The seqs of the first ``count`` messages of ``channel``, from the oldest, read by
    a new group (after a restart: what was kept)."""
    with broker.connect_sync("reader") as r:
        sub = r.consume(channel, group="g", start="oldest")
        got = []
        for _ in range(count):
            msg = sub.get(timeout=10)
            got.append(msg.seq)
            msg.ack()
    return got


def test_a_write_ahead_log_removed_under_the_broker_loses_nothing_confirmed(
        broker_factory, tmp_path):
    """``rm data/minou.db-wal`` (taken for a temporary file): SQLite goes on writing to the
    removed file, so every commit since the last checkpoint, and every one after, was
    only there and gone at the next start: 10 confirmed messages, 0 after kill -9 and a
    restart. Now the broker notices by itself within a tick (no commit needed), copies
    what the removed log holds into the database file, and stops saying why; a commit
    that notices it first is answered STORAGE_UNAVAILABLE, not confirmed."""
    b = broker_factory.make().start()
    with b.connect_sync("pub") as pub:
        confirmed = [pub.send(CH, {"n": n}).seq for n in range(5)]
    (b.data_dir / "minou.db-wal").unlink()
    with contextlib.suppress(subprocess.TimeoutExpired):  # before: it ran on, at risk
        assert b.proc is not None and b.proc.wait(20) != 0  # by itself, without a commit
    assert "write-ahead log" in b.output and "was removed or replaced" in b.output
    assert "copied into the database file" in b.output
    b.kill()
    assert read_back(b.start(), CH, len(confirmed)) == confirmed


@pytest.mark.parametrize("where", ["writer", "loop"])
def test_a_write_ahead_log_removed_is_noticed_by_the_next_commit(broker_factory, tmp_path,
                                                                 where):
    """A commit that finds the log gone (before a tick does) is not confirmed: the
    publisher gets STORAGE_UNAVAILABLE saying why, and what was committed is kept."""
    from minou.errors import ErrorCode, RequestError

    cfg = tmp_path / "wal.toml"
    cfg.write_text('[channels."wal/v1"]\ndurability = "interval"\n' if where == "loop"
                   else "")
    b = broker_factory.make(config=cfg).start()
    ch = "wal/v1/1"
    with b.connect_sync("pub") as pub:
        confirmed = [pub.send(ch, {"n": n}).seq for n in range(5)]
        (b.data_dir / "minou.db-wal").unlink()
        with pytest.raises(RequestError) as info:
            pub.send(ch, {"n": 5})
    assert info.value.code == ErrorCode.STORAGE_UNAVAILABLE, info.value
    assert "write-ahead log" in info.value.message
    assert b.proc is not None and b.proc.wait(20) != 0
    assert read_back(b.start(), ch, len(confirmed)) == confirmed


def test_a_disk_filled_fast_with_small_messages_keeps_acks_durable_and_resumes_alone(
        broker_factory, tmp_path):
    """A fast publisher filled the disk with a WAL the database file could not grow to
    take in: no checkpoint could run, every ack appended to the WAL, and once the reserve
    was used up acks were not durable and nothing could free space until an operator
    did. Now publishes stop while the disk can still take the WAL in: every ack is
    durable, and the pages the acks free let publishing resume by itself."""
    import asyncio

    async def scenario(b: BrokerProcess) -> tuple[int, int, int]:
        pub = await minou.connect(b.url, **auth("pub"))
        confirmed = 0
        while True:  # 50 at a time: faster than checkpoints on a small disk
            res = await asyncio.gather(*[pub.send(f"fill/v1/{i % 4}", {"pad": PAD[:8000]})
                                         for i in range(50)], return_exceptions=True)
            confirmed += sum(not isinstance(r, BaseException) for r in res)
            if any(isinstance(r, StorageFull) for r in res):
                break
            assert not any(isinstance(r, BaseException) for r in res), res
        sub = await pub.consume("fill/v1/*", group="g", prefetch=100)
        durable = not_durable = 0
        while durable + not_durable < confirmed:
            msg = await sub.get(timeout=20)
            if await msg.ack():
                durable += 1
            else:
                not_durable += 1
        await pub.close()
        return confirmed, durable, not_durable

    with broker_on_tmpfs(broker_factory, tmp_path, "40m") as (b, _):
        confirmed, durable, not_durable = asyncio.run(scenario(b))
        assert confirmed > 1000 and (durable, not_durable) == (confirmed, 0)
        wait_until(lambda: health(b).status_code == 200, timeout=20,
                   what="publishing to resume in the pages the acks freed")
        with b.connect_sync("pub") as pub:
            assert pub.send(CH, {"n": 1}).seq > 0
        assert b.output.count("storage full") == 1 and "Traceback" not in b.output
        assert "keeps room to take the write-ahead log" in b.output
