"""Configuration at run time: `minou reload` and SIGHUP apply rules, schemas, limits and
channel options without dropping a connection; a bad file changes nothing. Also the
schema compatibility report and the admin CLI for client keys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import minou
from minou.errors import NotAuthorized, SchemaMismatch

from ..conftest import auth, wait_until

RULES_V1 = """
[[rules]]
client = "app-*"
read = ["orders/*"]
write = ["orders/*"]
"""
RULES_V2 = """
max_message_size = 2048

[[rules]]
client = "app-*"
read = ["audit/*"]
write = ["orders/*"]

[channels."orders/v1".schema]
type = "object"
required = ["id"]
"""


def minou_cli(broker, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minou", *args], capture_output=True,
                          text=True, timeout=60, env=env or broker.cli_env())


@pytest.fixture
def reloadable(broker_factory, tmp_path):
    cfg = tmp_path / "live.toml"
    cfg.write_text(RULES_V1)
    return broker_factory.make(config=cfg).start(), cfg


def test_reload_applies_rules_schemas_and_limits_without_dropping_connections(reloadable):
    broker, cfg = reloadable
    with minou.connect_sync(broker.url, **auth("app-1")) as app:
        sub = app.listen("orders/v1/*")
        app.send("orders/v1/1", {"free": "form"})
        assert sub.get(timeout=5).payload == {"free": "form"}
        cfg.write_text(RULES_V2)
        out = minou_cli(broker, "reload", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert {"rules", "channels", "max_message_size"} <= set(result["changed"])
        assert result["subscriptions_closed"][0]["client_id"] == "app-1"
        # The same connection goes on, under the new rules and schema.
        with pytest.raises(SchemaMismatch, match=r"\$: must contain \['id'\]"):
            app.send("orders/v1/2", {"free": "form"})
        assert app.send("orders/v1/2", {"id": 2}).seq == 1  # nothing refused was stored
        with pytest.raises(minou.errors.MessageTooLarge):
            app.send("orders/v1/3", {"id": 3, "pad": "x" * 4000})
        with pytest.raises(NotAuthorized, match="may not read 'orders/v1/\\*'"):
            app.listen("orders/v1/*")
        app.listen("audit/v1/*")
        wait_until(lambda: app._client.last_error is not None, 5, what="the ended subscription")
        assert "ended by a reload" in str(app._client.last_error)
        assert app._client.connected
        # The application that reads the ended subscription is told, not left waiting.
        with pytest.raises(NotAuthorized, match="subscription 1 ended by a reload"):
            sub.get(timeout=5)


def test_a_bad_config_on_reload_changes_nothing_and_says_why(reloadable):
    broker, cfg = reloadable
    cfg.write_text('[[rules]]\nclient = "app-*"\nread = ["orders/v1/x*"]\n')
    out = minou_cli(broker, "reload")
    assert out.returncode == 1
    assert "reload refused, nothing changed" in out.stderr and "rules[0].read[0]" in out.stderr
    with minou.connect_sync(broker.url, **auth("app-2")) as app:
        app.listen("orders/v1/*")  # the old rules still hold
        assert app.send("orders/v1/9", {"any": 1}).seq >= 1


def test_sighup_reloads_and_says_so_once(broker_factory, tmp_path):
    cfg = tmp_path / "live.toml"
    cfg.write_text(RULES_V1)
    broker = broker_factory.make(config=cfg, extra=["--log-level", "info"]).start()
    cfg.write_text(RULES_V2)
    os.kill(broker.proc.pid, signal.SIGHUP)
    wait_until(lambda: "configuration reloaded (SIGHUP): changed" in broker.output, 10,
               what="the SIGHUP reload")
    with minou.connect_sync(broker.url, **auth("app-3")) as app, \
            pytest.raises(NotAuthorized):
        app.listen("orders/v1/*")
    cfg.write_text("max_message_size = -1\n")
    os.kill(broker.proc.pid, signal.SIGHUP)
    wait_until(lambda: "reload on SIGHUP failed" in broker.output, 10,
               what="the failed reload")
    assert broker.alive
    broker.stop()  # every line is out
    lines = broker.output.splitlines()
    assert len([line for line in lines if "reloaded" in line]) == 1, lines
    assert len([line for line in lines if "failed" in line]) == 1, lines
    # What changed, by name and value, for the operator reading the log.
    reloaded = next(line for line in lines if "reloaded" in line)
    assert "max_message_size 1048576 -> 2048" in reloaded and "channels (orders/v1)" in reloaded


UNCHANGED = """
max_message_size = 4096

[[rules]]
client = "app-*"
read = ["orders/*"]
write = ["orders/*"]

[channels."orders/v1"]
prefetch = 4
requeue_limit = 2

[channels."orders/v1".schema]
type = "object"
required = ["id"]
"""


def test_reloading_an_unchanged_file_changes_nothing(broker_factory, tmp_path):
    cfg = tmp_path / "same.toml"
    cfg.write_text(UNCHANGED)
    broker = broker_factory.make(config=cfg).start()
    out = minou_cli(broker, "reload", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["changed"] == [] and result["needs_restart"] == [], result
    out = minou_cli(broker, "reload")
    assert out.returncode == 0 and "changed nothing" in out.stdout, out.stdout
    # A real change is still seen, and only that one.
    cfg.write_text(UNCHANGED.replace("prefetch = 4", "prefetch = 5"))
    result = json.loads(minou_cli(broker, "reload", "--json").stdout)
    assert result["changed"] == ["channels"], result


SCHEMA_V1 = {"type": "object", "required": ["id"],
             "properties": {"id": {"type": "integer"}, "qty": {"type": "integer"}}}


def _schema_config(tmp_path, v2: dict, strict: bool = False) -> str:
    (tmp_path / "orders-v1.json").write_text(json.dumps(SCHEMA_V1))
    (tmp_path / "orders-v2.json").write_text(json.dumps(v2))
    return (f"strict_schemas = {'true' if strict else 'false'}\n"
            '[channels."orders/v1"]\nschema = "orders-v1.json"\n'
            '[channels."orders/v2"]\nschema = "orders-v2.json"\n')


def test_schema_evolution_is_reported_at_start(broker_factory, tmp_path):
    compatible = {**SCHEMA_V1, "properties": {**SCHEMA_V1["properties"],
                                              "note": {"type": "string"}}}
    cfg = tmp_path / "ok.toml"
    cfg.write_text(_schema_config(tmp_path, compatible))
    broker = broker_factory.make(config=cfg).start()
    assert "orders/v1 -> orders/v2: compatible (added optional field $.note)" in broker.output
    broker.stop()
    breaking = {"type": "object", "required": ["id", "email"],
                "properties": {"id": {"type": "integer"}, "email": {"type": "string"}}}
    cfg.write_text(_schema_config(tmp_path, breaking, strict=True))
    broker2 = broker_factory.make(config=cfg).start()
    assert "orders/v1 -> orders/v2: BREAKING" in broker2.output
    assert "removed field $.qty" in broker2.output
    with minou.connect_sync(broker2.url, **broker2.admin_auth()) as c:
        report = c.admin("status")["schemas"]["compatibility"]
        assert report[0]["compatible"] is False
        # strict_schemas: a version without a schema takes nothing.
        with pytest.raises(SchemaMismatch, match="orders/v3 declares no schema"):
            c.send("orders/v3/1", {"id": 1})
        assert c.send("orders/v2/1", {"id": 1, "email": "a@b"}).seq == 1


def test_admin_cli_approves_lists_and_revokes(broker_factory, tmp_path):
    cfg = tmp_path / "pending.toml"
    cfg.write_text('[[rules]]\nclient = "ops-*"\nread = ["*"]\nwrite = ["*"]\naccept = false\n')
    broker = broker_factory.make(config=cfg).start()
    assert f"admin   {broker.admin_key}" in broker.output
    # A CLI user without a key: one is made on first use, then it waits for approval.
    user_env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "home"), "MINOU_URL": broker.url,
                "MINOU_CLIENT_ID": "ops-eve"}
    first = minou_cli(broker, "publish", "ops/v1/1", "1", env=user_env)
    assert first.returncode == 4, first.stderr
    assert "made a key for ops-eve" in first.stderr and "pending" in first.stderr
    assert (tmp_path / "home" / "minou" / "keys" / "ops-eve.key").exists()
    listed = json.loads(minou_cli(broker, "clients", "list", "--json").stdout)
    by_id = {c["client_id"]: c for c in listed["clients"]}
    assert by_id["ops-eve"]["status"] == "pending" and by_id["admin"]["admin"] is True
    human = minou_cli(broker, "clients", "list")
    assert "ops-eve" in human.stdout and "pending" in human.stdout
    approved = minou_cli(broker, "clients", "approve", "ops-eve")
    assert approved.returncode == 0 and "approved ops-eve" in approved.stdout
    again = minou_cli(broker, "publish", "ops/v1/1", "1", "--json", env=user_env)
    assert again.returncode == 0, again.stderr
    me = json.loads(minou_cli(broker, "whoami", "--json", env=user_env).stdout)
    assert me["client_id"] == "ops-eve" and me["admin"] is False
    not_admin = minou_cli(broker, "clients", "list", env=user_env)
    assert not_admin.returncode == 1 and "needs an admin identity" in not_admin.stderr
    revoked = minou_cli(broker, "clients", "revoke", "ops-eve")
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    after = minou_cli(broker, "publish", "ops/v1/1", "1", env=user_env)
    assert after.returncode == 4 and "revoked" in after.stderr
    unknown = minou_cli(broker, "clients", "approve", "nobody")
    assert unknown.returncode == 1 and "no client 'nobody'" in unknown.stderr
