"""The README's examples and the CLI work as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from ..conftest import client_key

ROOT = Path(__file__).resolve().parents[2]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_readme_python_examples_run_as_pasted(broker):
    blocks = python_blocks()
    assert len(blocks) >= 2
    for code in blocks:
        code = code.replace("minou://127.0.0.1:7700", broker.url)
        code = code.replace('key="keys/app-1.key"', f'key="{client_key("app-1")}"')
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert any(seen in out.stdout for seen in ("total", "stored as seq", "'max': 20"))


def minou(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minou", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_kv_doc_example_runs_as_pasted(broker):
    (code, *_) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "kv.md").read_text(),
                            re.S)
    code = code.replace("minou://127.0.0.1:7700", broker.url)
    code = code.replace('key="keys/app-1.key"', f'key="{client_key("app-1")}"')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("{'max': 10} ")
    assert lines[1] == "limit put {'max': 20}"  # the watch starts with the current value


def test_federation_walkthrough_works_as_written(tmp_path):
    """docs/federation.md's two configs, on free ports: a message published on one side
    is on the other, with its origin."""
    from ..conftest import BrokerProcess

    text = (ROOT / "docs" / "federation.md").read_text()
    us_toml, eu_toml = re.findall(r"```toml\n(broker_id = .*?)```", text, re.S)[:2]
    (tmp_path / "us.toml").write_text(us_toml)
    us = BrokerProcess(tmp_path / "us-data", config=tmp_path / "us.toml",
                       open_rules=False).start()  # on free ports: the test's flags win
    (tmp_path / "eu.toml").write_text(eu_toml.replace("127.0.0.1:7710", f"127.0.0.1:{us.port}"))
    eu = BrokerProcess(tmp_path / "eu-data", config=tmp_path / "eu.toml",
                       open_rules=False).start()
    try:
        assert minou("publish", "orders/v1/42", '{"total": 12.5}', "--url", eu.url
                     ).returncode == 0
        import time

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            listed = minou("list", "-m", "--json", "--url", us.url)
            if "x-federated-from" in listed.stdout:
                break
            time.sleep(0.2)
        assert '"x-federated-from": "eu"' in listed.stdout, listed.stdout
        fed = minou("federation", "--url", eu.url)
        assert "push orders/v1/*: up" in fed.stdout and "1 carried" in fed.stdout
    finally:
        eu.stop()
        us.stop()


def test_cli_publish_consume_list_status(broker):
    url = ["--url", broker.url, "--key", str(broker.admin_key)]
    out = minou("publish", *url, "orders/v1/7", '{"total": 3}', "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["seq"] == 1
    bad = minou("publish", *url, "orders/v1/7", "{not json")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr
    refused = minou("publish", *url, "orders/x/7", "1")
    assert refused.returncode == 1 and "version" in refused.stderr
    listed = json.loads(minou("list", *url, "--json").stdout)
    assert [c["depth"] for c in listed["channels"] if c["channel"] == "orders/v1/7"] == [1]
    got = minou("consume", *url, "orders/v1/*", "--count", "1", "--json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["payload"] == {"total": 3}
    status = json.loads(minou("status", *url, "--json").stdout)
    assert status["counters"]["acked"] == 1 and status["counters"]["published"] == 1
    human = minou("list", *url)
    assert "orders/v1/7" in human.stdout


def test_cli_says_when_no_broker_answers():
    out = minou("status", "--url", "minou://127.0.0.1:1")
    assert out.returncode == 3 and "no broker answered" in out.stderr


def test_every_command_has_help():
    for cmd in ("start", "publish", "consume", "list", "status", "keygen", "reload", "whoami",
                "clients", "clients list", "clients approve", "clients revoke", "clients rotate",
                "clients forget", "clients release", "delete", "soft-stop", "token",
                "writers", "writers release"):
        out = minou(*cmd.split(), "--help")
        assert out.returncode == 0 and "Usage:" in out.stdout, (cmd, out.stderr)


def test_bad_config_refuses_to_start(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[channels."orders/v1"]\nprefetch = "lots"\n')
    out = minou("start", "--config", str(cfg), "--data", str(tmp_path / "d"))
    assert out.returncode == 2
    assert 'channels."orders/v1".prefetch' in out.stderr


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path):
    out = minou("keygen", "billing-1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "fingerprint  SHA256:" in out.stdout
    assert oct((tmp_path / "billing-1.key").stat().st_mode & 0o777) == "0o600"
    again = minou("keygen", "billing-1", "--out", str(tmp_path))
    assert again.returncode == 1 and "already exists" in again.stderr


def test_example_config_starts_a_broker_that_enforces_it(broker_factory):
    import minou

    from ..conftest import auth

    broker = broker_factory.make(config=ROOT / "examples" / "minou.toml",
                                 open_rules=False).start()
    with minou.connect_sync(broker.url, **auth("billing-7")) as billing:
        assert billing.send("invoice/v1/7", {"amount": 3}).seq == 1
        assert billing.admin("whoami")["access"]["write"] == ["invoice/v1/*"]


def test_redis_protocol_doc_examples_work_as_written(tmp_path):
    """docs/redis-protocol.md: the redis-cli session (against a --dev broker, as the
    page starts it) prints what the page shows (as on a terminal: --no-raw), and the
    redis-py worker runs."""
    import shutil

    from ..conftest import BrokerProcess

    text = (ROOT / "docs" / "redis-protocol.md").read_text()
    b = BrokerProcess(tmp_path / "data", extra=["--dev"], resp_port=0, open_rules=False)
    b.start()
    try:
        port = str(b.resp_port)
        (session,) = re.findall(r"```console\n(.*?)```", text, re.S)
        cli = shutil.which("redis-cli")
        if cli is not None:
            steps = re.findall(r"^\$ redis-cli -p 6379 (.*)\n((?:[^$].*\n)*)", session, re.M)
            assert len(steps) == 4
            for command, shown in steps:
                out = subprocess.run(f"{cli} --no-raw -p {port} {command}", shell=True,
                                     capture_output=True, text=True, timeout=30)
                assert out.returncode == 0, out.stderr
                assert out.stdout.split() == shown.split(), command
        (worker,) = re.findall(r"```python\n(.*?)```", text, re.S)
        out = subprocess.run([sys.executable, "-c", worker.replace("6379", port)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "b'resize'" in out.stdout
    finally:
        b.stop()


def doc_pages() -> list[Path]:
    """README.md and every page of docs/ a reader pastes from (benchmarks.md quotes runs)."""
    return [ROOT / "README.md",
            *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md")]


# `minou ...` where a reader runs it: at the start of a shell line (after `$ `, a path,
# `$(`, or the command it follows), or at the start of an inline code span.
_RUN = r"(?:^\s*(?:\$ )?|\$\(|&& |; |\| )(?:[\w./~-]*/)?minou ([a-z][^#`)\n]*)"


def minou_invocations(text: str) -> list[tuple[str, list[str]]]:
    found = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("sh", "console", "bash", ""):
            for line in block.splitlines():
                found += [(line.strip(), m.split()) for m in re.findall(_RUN, line)]
    prose = re.sub(r"```\w*\n.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`\n]+)`", prose):
        found += [(span, m.split()) for m in re.findall(_RUN, span)]
    return found


def _resolve(words: list[str]) -> tuple[object, int, str]:
    """The CLI command ``words`` run, how many words name it, and what is unknown."""
    from minou.cli import main

    cmd, used = main, 0
    for word in words:
        if not hasattr(cmd, "get_command") or word.startswith("-"):
            break
        subs = [cmd.get_command(None, w) for w in word.split("|")]  # type: ignore[arg-type]
        if None in subs:
            return cmd, used, " ".join(words[:used + 1])
        cmd, used = subs[0], used + 1
    return cmd, used, ""


def test_every_command_and_option_the_docs_run_exists():
    """Each `minou <command> [--option]` the README and docs/ show is one the CLI has
    (kv.md named a `minou purge` there is not)."""
    wrong, seen = [], 0
    for page in doc_pages():
        for line, words in minou_invocations(page.read_text()):
            seen += 1
            cmd, used, unknown = _resolve(words)
            if unknown:
                wrong.append(f"{page.name}: no command 'minou {unknown}' ({line})")
                continue
            options = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}  # type: ignore[attr-defined]
            for word in words[used:]:
                flag = word.split("=")[0]
                if re.fullmatch(r"--?[a-zA-Z][\w-]*", flag) and flag not in options | {
                        "--help", "-h"}:
                    wrong.append(f"{page.name}: 'minou {' '.join(words[:used])}' has no "
                                 f"{flag} ({line})")
    assert seen > 100
    assert not wrong, "\n".join(wrong)


def run_doc_python(page: str, broker) -> list[str]:  # type: ignore[no-untyped-def]
    """The first python block of docs/<page> against ``broker``, each keys/<id>.key
    replaced by that client's key: its output lines."""
    (code, *_) = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / page).read_text(), re.S)
    code = code.replace("minou://127.0.0.1:7700", broker.url)
    code = re.sub(r'key="keys/([\w-]+)\.key"', lambda m: f'key="{client_key(m[1])}"', code)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_request_reply_doc_example_runs_as_pasted(broker):
    assert run_doc_python("requests.md", broker) == ["{'item': 'tea', 'price': 8.4}"]


def test_peer_channel_doc_example_runs_as_pasted(broker):
    assert run_doc_python("peers.md", broker) == ["{'text': 'got hello'}"]
