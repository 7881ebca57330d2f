"""What a new user hit on a fresh clone (issue 11): one broker per data directory, a
busy port, start-up hints that work when pasted, the CLI's rough edges, errors that
say what happened, and logs an operator can use. Real broker processes throughout."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import minou
from minou.auth import keys as keyfiles

from ..conftest import auth, client_key, wait_until

FINGERPRINT = re.compile(r"SHA256:(?:[0-9A-F]{2}:){31}[0-9A-F]{2}")


def cli(*args: str, env: dict[str, str] | None = None, input: str | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minou", *args], capture_output=True,
                          text=True, timeout=timeout, env=env, input=input)


def start_cmd(data: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "minou", "start", "--data", str(data), "--host",
            "127.0.0.1", "--port", "0", "--http-port", "0", *extra]


def tls_config(tmp_path: Path) -> Path:
    cfg = tmp_path / "tls.toml"
    cfg.write_text('[tls]\nself_signed = true\n\n[[rules]]\nclient = "*"\nread = ["*"]\n'
                   'write = ["*"]\n')
    return cfg


# ------------------------------------------------------------ one broker per directory
def test_a_second_broker_on_the_same_data_dir_is_refused(broker_factory):
    first = broker_factory.make().start()
    with first.connect_sync("a") as c:
        c.send("dup/v1/1", {"from": "A"})
    second = subprocess.run(start_cmd(first.data_dir), capture_output=True, text=True,
                            timeout=30)
    assert second.returncode != 0
    assert str(first.data_dir.resolve()) in second.stderr
    assert f"pid {first.proc.pid}" in second.stderr
    assert "one broker per data directory" in second.stderr
    # The first broker is untouched, and kill -9 leaves no lock that blocks the restart.
    with first.connect_sync("a") as c:
        assert c.send("dup/v1/1", {"from": "A"}).seq == 2
    first.kill()
    first.start()
    with first.connect_sync("a") as c:
        got = [c.consume("dup/v1/*", group="g").get(timeout=5) for _ in range(1)]
        assert got[0].payload == {"from": "A"} and got[0].seq == 1


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` read-only for every process, root too (a chmod binds no root): a
    read-only bind mount over it; skipped where mounting is not permitted."""
    def mount(*args: str) -> None:
        try:
            done = subprocess.run(["mount", *args], capture_output=True, text=True,
                                  timeout=20)
        except (OSError, subprocess.SubprocessError) as exc:
            pytest.skip(f"cannot mount here ({exc})")
        if done.returncode != 0:
            pytest.skip(f"mounting is not permitted here ({done.stderr.strip()})")

    mount("--bind", str(path), str(path))
    try:
        mount("-o", "remount,bind,ro", str(path))
        yield
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, timeout=20)


def test_a_read_only_database_is_refused_at_start_not_at_the_first_publish(broker_factory):
    """SQLite opens a file it may not write read-only, silently: the broker printed its
    banner and served, then stopped at the first publish ("attempt to write a readonly
    database"). It now refuses to start, naming the file."""
    first = broker_factory.make().start()
    with first.connect_sync("a") as c:
        c.send("ro/v1/1", {"n": 1})
    first.stop()
    with read_only(first.data_dir / "minou.db"):
        try:
            out = subprocess.run(start_cmd(first.data_dir), capture_output=True, text=True,
                                 timeout=20)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"the broker started on a read-only database: "
                                 f"{exc.stdout!r}") from None
    assert out.returncode == 1
    assert "minou.db: the file is read-only (its permissions, or a read-only mount)" \
        in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    first.start()  # writable again: nothing was lost
    with first.connect_sync("a") as c:
        assert c.consume("ro/v1/*", group="g").get(timeout=5).payload == {"n": 1}


def test_a_busy_port_is_named_and_leaves_no_database_behind(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        data = tmp_path / "fresh"
        out = subprocess.run([sys.executable, "-m", "minou", "start", "--dev", "--data",
                              str(data), "--port", str(port), "--http-port", "0"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        assert f"port {port}" in out.stderr and "already in use" in out.stderr
        assert "--port" in out.stderr and "--http-port" in out.stderr and "0" in out.stderr
        assert not (data / "minou.db").exists() and not data.exists()
        # The HTTP port too, with the data directory already there.
        data.mkdir()
        out = subprocess.run([sys.executable, "-m", "minou", "start", "--dev", "--data",
                              str(data), "--port", "0", "--http-port", str(port)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 1 and f"port {port}" in out.stderr and "HTTP" in out.stderr
        assert not (data / "minou.db").exists()
    finally:
        taken.close()


# ------------------------------------------------------------ hints that work when pasted
def _banner_commands(output: str) -> dict[str, str]:
    admin = re.search(r"^\s+admin\s+.*e\.g\. (.*)\)$", output, re.M)
    token = re.search(r"sign in with the token of: (.*)\)$", output, re.M)
    assert admin and token, output
    return {"admin": admin.group(1), "token": token.group(1)}


@pytest.mark.parametrize("with_tls", [False, True], ids=["plain", "tls"])
def test_the_printed_hints_work_when_pasted(broker_factory, tmp_path, with_tls):
    b = broker_factory.make(config=tls_config(tmp_path) if with_tls else None).start()
    hints = _banner_commands(b.output)
    cwd = b.data_dir.parent  # the data dir is printed as given: paste from where it started
    listed = subprocess.run(hints["admin"], shell=True, capture_output=True, text=True,
                            timeout=60, cwd=cwd)
    assert listed.returncode == 0, (hints["admin"], listed.stderr)
    assert "admin" in listed.stdout
    made = subprocess.run(hints["token"], shell=True, capture_output=True, text=True,
                          timeout=60, cwd=cwd)
    assert made.returncode == 0, (hints["token"], made.stderr)
    token = made.stdout.strip()
    request = urllib.request.Request(b.http + "/v1/queues",
                                     headers={"Authorization": f"Bearer {token}"})
    context = None
    if with_tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        assert answer.status == 200 and "queues" in json.loads(answer.read())


# ------------------------------------------------------------ the CLI
def test_clients_rotate_gives_a_client_a_new_key(broker, tmp_path):
    with broker.connect_sync("rotated-1") as c:
        c.send("r/v1/1", 1)
    helped = cli("clients", "rotate", "--help")
    assert helped.returncode == 0 and "Warning" not in helped.stderr, helped.stderr
    assert "CLIENT_ID PUBFILE" in helped.stdout
    fresh = keyfiles.generate()
    _, pub = keyfiles.save(fresh, tmp_path, "rotated-1")
    out = cli("clients", "rotate", "rotated-1", str(pub), env=broker.cli_env())
    assert out.returncode == 0, out.stderr
    assert f"rotated rotated-1: now {keyfiles.fingerprint(fresh)}" in out.stdout
    with minou.connect_sync(broker.url, client_id="rotated-1", key=fresh) as c:
        assert c.send("r/v1/1", 2).seq == 2


def test_fingerprints_are_printed_verbatim_in_one_format(broker, tmp_path):
    with broker.connect_sync("fp-1"):
        pass
    other = keyfiles.generate()
    keyfiles.save(other, tmp_path, "fp-1")
    out = cli("whoami", "--url", broker.url, "--key", str(tmp_path / "fp-1.key"))
    assert out.returncode == 4
    registered = keyfiles.fingerprint(keyfiles.load_private(client_key("fp-1")))
    assert FINGERPRINT.fullmatch(registered)
    assert registered in out.stderr and keyfiles.fingerprint(other) in out.stderr
    assert not re.search(r"[\U0001F000-\U0001FFFF]", out.stderr)  # no emoji
    listed = cli("clients", "list", env=broker.cli_env(), timeout=60)
    assert f"{registered}  fp-1" in listed.stdout.splitlines()


def test_consume_stops_by_itself_when_fewer_messages_exist(broker):
    with broker.connect_sync("few") as c:
        c.send("few/v1/1", {"n": 1})
        c.send("few/v1/1", {"n": 2})
    started = time.monotonic()
    out = cli("consume", "few/v1/*", "--group", "billing", "--count", "10", "--json",
              env=broker.cli_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["payload"] for line in out.stdout.splitlines()] == [
        {"n": 1}, {"n": 2}]
    assert "stopped after 2 of 10" in out.stderr
    assert time.monotonic() - started < 40


def test_publish_reads_the_payload_from_stdin_or_a_file(broker, tmp_path):
    big = {"blob": "x" * 200_000}  # beyond one shell argument (128 KiB)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    env = broker.cli_env()
    from_file = cli("publish", "big/v1/1", f"@{path}", "--json", env=env)
    assert from_file.returncode == 0, from_file.stderr
    from_stdin = cli("publish", "big/v1/1", "-", "--json", env=env, input=json.dumps({"n": 2}))
    assert from_stdin.returncode == 0, from_stdin.stderr
    missing = cli("publish", "big/v1/1", f"@{tmp_path / 'nope.json'}", env=env)
    assert missing.returncode == 2 and "cannot read the payload file" in missing.stderr
    with broker.connect_sync("big-reader") as c:
        sub = c.consume("big/v1/*", group="g")
        first = sub.get(timeout=5)
        assert first.payload == big
        first.ack()  # prefetch 1 per channel: the next comes after this one is settled
        assert sub.get(timeout=5).payload == {"n": 2}


def test_deleting_an_unknown_queue_says_so(broker):
    out = cli("delete", "-q", "nope/v9", "-y", env=broker.cli_env())
    assert out.returncode != 0
    assert "no queue 'nope/v9'" in out.stderr and "removed" not in out.stdout
    with broker.connect_sync("known") as c:
        c.send("known/v1/1", 1)
    out = cli("delete", "-q", "known/v1", "--channel", "2", "-y", env=broker.cli_env())
    assert out.returncode != 0 and "no channel '2'" in out.stderr
    out = cli("delete", "-q", "known/v1", "-y", env=broker.cli_env())
    assert out.returncode == 0 and "removed 1 message(s)" in out.stdout


# ------------------------------------------------------------ errors that say what happened
def test_a_missing_key_file_is_a_local_error(broker, tmp_path):
    out = cli("whoami", "--url", broker.url, "--key", str(tmp_path / "nope.key"))
    assert out.returncode == 2
    assert "cannot read key file" in out.stderr and "no broker answered" not in out.stderr


def test_tls_mistakes_are_explained(broker_factory, tmp_path):
    b = broker_factory.make(config=tls_config(tmp_path)).start()
    key = ["--key", str(b.admin_key)]
    unpinned = cli("whoami", "--url", b.url, *key)
    assert unpinned.returncode == 3
    assert "not trusted" in unpinned.stderr and "--tls-fingerprint" in unpinned.stderr
    assert unpinned.stderr.count("no broker answered") == 0
    plain = b.url.replace("minous://", "minou://")
    code = (f"import minou\ntry:\n    minou.connect_sync({plain!r}, client_id='x')\n"
            "except minou.ConnectionClosed as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert "the broker speaks TLS" in out.stdout and "minous://" in out.stdout, out
    assert b.tls_fingerprint in out.stdout
    assert "Task was destroyed" not in out.stderr and "Traceback" not in out.stderr


def test_an_empty_channel_id_is_called_empty(broker):
    with broker.connect_sync("empty") as c, pytest.raises(minou.InvalidChannel) as info:
        c.send("orders/v1/", 1)
    assert "is empty" in str(info.value) and "URL-encoded" not in str(info.value)


def test_a_get_timeout_is_a_timeout_error(broker):
    with broker.connect_sync("waiter") as c:
        sub = c.consume("quiet/v1/*", group="g")
        with pytest.raises(TimeoutError):
            sub.get(timeout=0.2)


# ------------------------------------------------------------ logs an operator can use
def test_the_log_names_refusals_pending_clients_tls_failures_and_the_stop(broker_factory,
                                                                           tmp_path):
    cfg = tmp_path / "strict.toml"
    cfg.write_text('[tls]\nself_signed = true\n\n[[rules]]\nclient = "ok-*"\nread = ["*"]\n'
                   'write = ["*"]\n')
    b = broker_factory.make(config=cfg, extra=["--log-level", "info"]).start()
    fp = {"tls_fingerprint": b.tls_fingerprint}
    with minou.connect_sync(b.url, **auth("ok-1"), **fp) as c:
        c.send("log/v1/1", 1)
    # A stranger: registered but pending (no rule accepts it).
    with pytest.raises(minou.PendingApproval):
        minou.connect_sync(b.url, **auth("stranger-1"), **fp)
    # ok-1 presenting another key: refused.
    other = tmp_path / "other"
    keyfiles.save(keyfiles.generate(), other, "ok-1")
    with pytest.raises(minou.NotAuthenticated):
        minou.connect_sync(b.url, client_id="ok-1", key=str(other / "ok-1.key"), **fp)
    # Plain text to the TLS port.
    with socket.create_connection(("127.0.0.1", b.port), timeout=5) as raw:
        raw.sendall(b"HELLO plain text\r\n\r\n")
        with pytest.raises((ConnectionError, TimeoutError)):
            while raw.recv(100):
                pass
            raise ConnectionError
    wait_until(lambda: "TLS handshake failed on the native listener" in b.output,
               what="TLS failure logged")
    log = b.output
    assert re.search(r"client 'stranger-1' from 127\.0\.0\.1:\d+ \(native\) waits for "
                     r"approval", log)
    assert re.search(r"authentication failed for 'ok-1' from 127\.0\.0\.1:\d+ \(native\)", log)
    assert "plain text" in log
    assert "eyJ" not in log and "PRIVATE KEY" not in log and "PUBLIC KEY" not in log
    b.proc.send_signal(signal.SIGTERM)
    b.proc.wait(30)
    assert b.proc.returncode == 0
    log = b.output
    assert "SIGTERM received" in log
    assert re.search(r"stopped on SIGTERM: \d+ connection\(s\) closed; flushed \d+ message",
                     log)


def test_http_refusals_are_logged_with_the_peer(broker_factory):
    b = broker_factory.make(extra=["--log-level", "info"]).start()
    bad = urllib.request.Request(b.http + "/v1/queues",
                                 headers={"Authorization": "Bearer not-a-token"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(bad, timeout=10)
    assert info.value.code == 401
    info.value.close()
    wait_until(lambda: "(HTTP)" in b.output, what="HTTP refusal logged")
    assert re.search(r"authentication failed for .* from 127\.0\.0\.1:\d+ \(HTTP\)", b.output)
    assert "not-a-token" not in b.output


def test_readme_cli_lines_are_runnable(broker, tmp_path):
    """Every `minou ...` line of the README's command-line block parses (its --help
    works with the same words), so none names an option that does not exist."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"## Command line\n\n```sh\n(.*?)```", readme, re.S)
    assert block
    for line in block.group(1).splitlines():
        words = shlex.split(line.split("#")[0])
        if not words or words[0] != "minou":
            continue
        sub = [w for w in words[1:] if not w.startswith("-") and "|" not in w][:1]
        if not sub:
            continue
        out = cli(*sub, "--help")
        assert out.returncode == 0, (line, out.stderr)
        for option in (w.split("=")[0].strip("[]") for w in words if w.startswith(("-", "[-"))):
            option = option.strip("[]")
            assert option in out.stdout, (line, option)


# ------------------------------------------------------------ the two commands
def test_make_run_installs_the_broker_alone_and_make_test_its_extras(tmp_path):
    root = Path(__file__).resolve().parents[2]

    def planned(target: str) -> list[str]:
        out = subprocess.run(["make", "-n", "-C", str(root), target,
                              f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return [line for line in out.stdout.splitlines() if "pip install" in line]

    run = planned("run")
    assert any(line.rstrip().endswith("install -q -e .") for line in run), run
    assert not any("[" in line for line in run), run  # no test, Spark or browser stack
    assert any("[test,spark,bench,redis,resp]" in line for line in planned("test"))
    assert any("[spark]" in line for line in planned("spark-demo"))


def test_the_http_url_or_a_negative_count_is_a_precise_error_not_a_traceback():
    out = cli("publish", "x/v1/a", "1", "--url", "http://127.0.0.1:1")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "http:// is the broker's HTTP API, the client speaks its native port" in out.stderr
    # A count below zero used to consume nothing, say nothing, exit 0, and make the group.
    out = cli("consume", "x/v1/*", "--count", "-1", "--url", "minou://127.0.0.1:1")
    assert out.returncode == 2 and "'--count' / '-n': -1 is not in the range x>=0" in out.stderr
