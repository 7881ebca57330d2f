"""Config files: the example loads; every mistake names its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minou.config import Settings, load_settings, parse_settings
from minou.errors import ConfigError
from minou.schemas import Compatibility, SchemaViolation

ROOT = Path(__file__).resolve().parents[2]
IN_FLIGHT_RANGE = f"expected a number of bytes >= 1 and <= {2**63 - 1}"


def test_the_commented_example_loads():
    s = load_settings(ROOT / "examples" / "minou.toml")
    assert s.port == 7700 and s.http_port == 7701
    orders = s.channel_options("orders/v1")
    assert (orders.prefetch, orders.requeue_limit, orders.overflow) == (100, 5, "refuse")
    assert s.channel_options("audit/v3").retention == 604800
    assert s.channel_options("other/v1").prefetch == 1
    assert s.in_flight_bytes == 512 << 20
    assert (s.max_long_polls_per_client, s.max_offsets_at_per_client) == (100, 4)
    assert Path(s.data_dir).is_absolute()


def test_flags_override_the_file(tmp_path):
    cfg = tmp_path / "m.json"
    cfg.write_text('{"port": 1234, "data_dir": "d"}')
    s = load_settings(cfg, port=0, host=None)
    assert s.port == 0 and s.data_dir == str(tmp_path / "d")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prot = 1", "prot: unknown setting"),
        ('port = "x"', 'port: expected a port number 0..65535, got "x"'),
        ("port = 70000", "port: expected a port number"),
        ('[channels."orders/v1"]\nprefetch = 0', 'channels."orders/v1".prefetch: expected'),
        ('[channels."orders/v1"]\noverflow = "spill"', 'channels."orders/v1".overflow'),
        ('[channels."orders/v1"]\nprefech = 3', 'channels."orders/v1".prefech: unknown option'),
        ('[channels."orders"]\nttl = 3', 'channels."orders": channel options are keyed by'),
        # keys no channel can have: their options (a schema among them) applied to nothing
        ('[channels."../v1"]\nttl = 3', 'channels."../v1": endpoint \'..\' must be letters'),
        ('[channels."orders /v1"]\nttl = 3', "endpoint 'orders ' must be letters"),
        ('[channels."orders/v01"]\nttl = 3', "channels.\"orders/v01\": version 'v01' must"),
        ('[channels."orders/vX"]\nttl = 3', "version 'vX' must look like v1"),
        ('broker_id = ""', "broker_id is empty: give 1..200 printable characters"),
        ('data_dir = ""', "data_dir: the data directory is empty; give a directory of its own"),
        ('broker_id = "a\\u0000b"', "broker_id 'a\\x00b' holds U+0000"),
        ('broker_id = "a\\nb"', "broker_id 'a\\nb' holds U+000A"),
        ('[channels."orders/v1"]\nttl = true', 'channels."orders/v1".ttl: expected'),
        ("port = ", "not valid TOML"),
        ("websocket_heartbeat = 0", "websocket_heartbeat: expected a number of seconds > 0"),
        ('websocket_heartbeat = "5s"', "websocket_heartbeat: expected a number of seconds"),
        ("max_dedup_keys = 0", "max_dedup_keys: expected an integer >= 1"),
        ("in_flight_bytes = 0", f"in_flight_bytes: {IN_FLIGHT_RANGE}, got 0"),
        ('in_flight_bytes = "lots"', f'in_flight_bytes: {IN_FLIGHT_RANGE}, got "lots"'),
        ("in_flight_bytes = true", f"in_flight_bytes: {IN_FLIGHT_RANGE}, got true"),
        ('[channels."orders/v1"]\ndurability = "never"',
         "channels.\"orders/v1\".durability: expected 'fsync' or 'interval', got \"never\""),
        ('[channels."orders/v1"]\nsync_interval = 0',
         'channels."orders/v1".sync_interval: expected milliseconds, > 0 and <= 10000, got 0'),
        ('[channels."orders/v1"]\nsync_interval = 10001', "sync_interval: expected"),
        ('[channels."orders/v1"]\nsync_interval = "50ms"', "sync_interval: expected"),
        ('[channels."tmp/v1"]\nexpire_idle = 0',
         'channels."tmp/v1".expire_idle: expected a number of seconds > 0 and <= 315360000 '
         '(ten years), got 0'),
        ('[channels."tmp/v1"]\nexpire_idle = "1h"', 'channels."tmp/v1".expire_idle: expected'),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, message):
    cfg = tmp_path / "minou.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("minou.toml", b"port = 1\n\xff\xfe", "minou.toml: not UTF-8 (TOML and JSON files are): "
                                             "byte 0xff at offset 9"),
        ("minou.json", b'{"port": "\xe9"}', "minou.json: not UTF-8"),
        ("minou.json", b"[" * 100_000 + b"]" * 100_000, "nest too deep to read"),
        ("minou.toml", b"a = " + b"[" * 100_000 + b"]" * 100_000, "nest too deep to read"),
        ("minou.toml", b'[channels."orders/v1"]\nschema = "deep.json"\n',
         "nest too deep to read"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_an_error_not_a_traceback(tmp_path, name,
                                                                       content, message):
    """A file that is not UTF-8, or nests so deep that the readers' recursion gives out
    (its own arrays, or a schema file it names), was a traceback at start."""
    (tmp_path / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    cfg = tmp_path / name
    cfg.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert message in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.toml")


# --- [auth], [tls], [[rules]], schemas --------------------------------------------------------

SECRET = "s3cret-s3cret-s3cret"


def parse(raw: dict, base_dir: Path) -> Settings:
    return parse_settings(raw, base_dir=base_dir)


def config_error(raw: dict, base_dir: Path) -> str:
    with pytest.raises(ConfigError) as info:
        parse(raw, base_dir)
    return str(info.value)


@pytest.mark.parametrize(
    ("auth", "mode"),
    [({}, "keys"), ({"mode": "keys"}, "keys"), ({"mode": "off"}, "off"),
     ({"mode": "token", "broker_token": SECRET}, "token")],
)
def test_auth_modes(tmp_path, auth, mode):
    s = parse({"auth": auth}, tmp_path)
    assert s.auth_mode == mode and s.admins == frozenset({"admin"})
    assert s.broker_token == auth.get("broker_token")


@pytest.mark.parametrize(
    ("auth", "message"),
    [
        ({"mode": "none"}, 'auth.mode: expected one of keys, token, off, got "none"'),
        ({"mode": True}, "auth.mode: expected one of keys, token, off, got true"),
        ({"token": SECRET}, "auth.token: unknown setting (known: admins, broker_token"),
        ({"admins": "admin"}, "auth.admins: expected a list of client ids"),
        ({"admins": ["admin", 3]}, "auth.admins: expected a list of client ids"),
        ({"admins": [""]}, "auth.admins: expected a list of client ids"),
        ({"broker_token": "short"},
         "auth.broker_token: expected a string of at least 16 characters (got 5)"),
        ({"broker_token": "x" * 15},
         "auth.broker_token: expected a string of at least 16 characters (got 15)"),
        ({"broker_token": 12345678901234567}, "auth.broker_token: expected a string"),
        ({"broker_token": SECRET, "broker_token_file": "secret.txt"},
         "auth.broker_token: give broker_token or broker_token_file, not both"),
        ({"broker_token_file": "missing.txt"},
         "auth.broker_token_file: cannot read missing.txt"),
    ],
)
def test_bad_auth_names_the_key(tmp_path, auth, message):
    assert message in config_error({"auth": auth}, tmp_path)


def test_a_16_character_broker_token_is_enough(tmp_path):
    assert parse({"auth": {"broker_token": "x" * 16}}, tmp_path).broker_token == "x" * 16


def test_auth_admins_replace_the_default(tmp_path):
    assert parse({"auth": {"admins": ["ops", "root"]}}, tmp_path).admins == {"ops", "root"}


def test_broker_token_file_is_read_next_to_the_config_and_stripped(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "secret.txt").write_text(f"  {SECRET}\n\n")
    (conf / "minou.toml").write_text('[auth]\nmode = "token"\nbroker_token_file = "secret.txt"\n')
    # A decoy in the working directory: the path is relative to the config file, not the cwd.
    (tmp_path / "secret.txt").write_text("decoy-decoy-decoy-decoy")
    monkeypatch.chdir(tmp_path)
    s = load_settings(Path("conf") / "minou.toml")
    assert s.broker_token == SECRET and s.auth_mode == "token"
    (conf / "secret.txt").write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        load_settings(conf / "minou.toml")


def test_auth_consistency(tmp_path):
    message = config_error({"host": "0.0.0.0", "auth": {"mode": "off"}}, tmp_path)
    assert message.startswith("auth.mode:") and "loopback" in message and "'0.0.0.0'" in message
    assert parse({"host": "::1", "auth": {"mode": "off"}}, tmp_path).auth_mode == "off"
    assert "auth.mode: 'token' needs auth.broker_token" in config_error(
        {"auth": {"mode": "token"}}, tmp_path)


def test_overrides_are_checked_too(tmp_path):
    cfg = tmp_path / "minou.toml"
    cfg.write_text('port = 7800\n')
    with pytest.raises(ConfigError, match=r"loopback only; host is '0\.0\.0\.0'"):
        load_settings(cfg, auth_mode="off", host="0.0.0.0")
    with pytest.raises(ConfigError, match="loopback"):
        load_settings(None, auth_mode="off", host="0.0.0.0")
    s = load_settings(cfg, auth_mode="off", host=None)  # None = flag not given
    assert (s.auth_mode, s.host, s.port) == ("off", "127.0.0.1", 7800)


def test_a_host_override_can_make_a_dev_config_valid(tmp_path):
    """`minou start --config f.toml --host 127.0.0.1` with f.toml saying host = "0.0.0.0" and
    mode = "off": the final settings (loopback, off) are valid, yet loading fails on the file's
    intermediate value: consistency is checked after the overrides."""
    cfg = tmp_path / "minou.toml"
    cfg.write_text('host = "0.0.0.0"\n[auth]\nmode = "off"\n')
    assert load_settings(cfg, host="127.0.0.1").host == "127.0.0.1"


@pytest.mark.parametrize(
    ("tls", "message"),
    [
        ({"cert": "c.pem"}, "tls: give both cert and key"),
        ({"key": "k.pem"}, "tls: give both cert and key"),
        ({"cert": "c.pem", "key": "k.pem", "self_signed": True},
         "tls.self_signed: cannot be true when cert and key are given"),
        ({"self_signed": "yes"}, 'tls.self_signed: expected true or false, got "yes"'),
        ({"cert": 1, "key": "k.pem"}, "tls.cert: expected a PEM file path"),
        ({"ca": "x"}, "tls.ca: unknown setting"),
    ],
)
def test_bad_tls_names_the_key(tmp_path, tls, message):
    assert message in config_error({"tls": tls}, tmp_path)


def test_tls_paths_are_relative_to_the_config_file(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "minou.toml").write_text('[tls]\ncert = "tls/broker.pem"\nkey = "/abs/broker.key"\n')
    monkeypatch.chdir(tmp_path)
    s = load_settings(Path("conf") / "minou.toml")
    assert s.tls_cert == str(conf.resolve() / "tls" / "broker.pem")
    assert s.tls_key == "/abs/broker.key"
    assert s.tls_enabled is True


@pytest.mark.parametrize(
    ("raw", "enabled"),
    [
        ({}, False),  # loopback: plain text
        ({"host": "0.0.0.0"}, True),  # beyond loopback: self-signed by default
        ({"tls": {"self_signed": True}}, True),
        ({"host": "0.0.0.0", "tls": {"self_signed": False}}, False),
        ({"tls": {"cert": "c.pem", "key": "k.pem"}}, True),
        ({"tls": {"cert": "c.pem", "key": "k.pem", "self_signed": False}}, True),
    ],
)
def test_tls_enabled(tmp_path, raw, enabled):
    assert parse(raw, tmp_path).tls_enabled is enabled


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"client": "*"}, {"read": ["*"]}], "rules[1].client: missing"),
        ([{"client": "a", "read": "orders/*"}], "rules[0].read: expected a list"),
        ([{"client": "a", "write": ["!orders/*"]}], "rules[0].write[0]: '!orders/*'"),
        ([{"client": "a", "accept": "yes"}], "rules[0].accept: expected true or false"),
        ({"client": "a"}, "rules: expected a list of tables"),
    ],
)
def test_bad_rules_name_the_rule(tmp_path, rules, message):
    assert message in config_error({"rules": rules}, tmp_path)


def test_rules_are_parsed(tmp_path):
    s = parse({"rules": [{"client": "billing-*", "write": ["invoice/v1/*"]}]}, tmp_path)
    assert s.rules.accepts("billing-1") is True and s.rules.accepts("shop-1") is False
    assert s.rules.for_client("billing-1").may_write("invoice/v1/7")
    assert parse({}, tmp_path).rules.accepts("anyone") is None


@pytest.mark.parametrize("value", [1, "true", 0])
def test_strict_schemas_must_be_a_bool(tmp_path, value):
    assert "strict_schemas: expected true or false" in config_error(
        {"strict_schemas": value}, tmp_path)
    assert parse({"strict_schemas": True}, tmp_path).strict_schemas is True


ORDER_V1 = {"type": "object", "required": ["customer"],
            "properties": {"customer": {"type": "string"}}}
ORDER_V2 = {"type": "object", "required": ["customer", "total"],
            "properties": {"customer": {"type": "string"}, "total": {"type": "number"}}}


def test_inline_schema_compiles(tmp_path):
    s = parse({"channels": {"orders/v1": {"schema": ORDER_V1, "prefetch": 5}}}, tmp_path)
    compiled = s.schemas()["orders/v1"]
    assert compiled.key == "orders/v1" and compiled.source == ORDER_V1
    compiled.validate({"customer": "ada"})
    with pytest.raises(SchemaViolation, match=r"\$.customer: must be string"):
        compiled.validate({"customer": 7})
    assert s.channel_options("orders/v1").prefetch == 5
    assert s.schema_report == ()  # a single version has nothing to compare with


def test_schema_file_is_relative_to_the_config_file(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    (conf / "schemas").mkdir(parents=True)
    (conf / "schemas" / "orders-v1.json").write_text(json.dumps(ORDER_V1))
    (conf / "minou.toml").write_text(
        '[channels."orders/v1"]\nschema = "schemas/orders-v1.json"\n')
    monkeypatch.chdir(tmp_path)
    s = load_settings(Path("conf") / "minou.toml")
    assert s.schemas()["orders/v1"].source == ORDER_V1


def test_schema_report_compares_consecutive_versions(tmp_path):
    s = parse({"channels": {"orders/v1": {"schema": ORDER_V1},
                            "orders/v2": {"schema": ORDER_V2}}}, tmp_path)
    assert len(s.schema_report) == 1
    report = s.schema_report[0]
    assert isinstance(report, Compatibility)
    assert (report.old, report.new, report.compatible) == ("orders/v1", "orders/v2", False)
    assert any("total" in change for change in report.changes)
    same = parse({"channels": {"orders/v1": {"schema": ORDER_V1},
                               "orders/v2": {"schema": ORDER_V1}}}, tmp_path)
    assert same.schema_report == (Compatibility("orders/v1", "orders/v2", True, []),)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "nonsense"}, 'channels."orders/v1".schema: invalid JSON Schema'),
        ("missing.json", 'channels."orders/v1".schema: cannot read schema file'),
        (3, 'channels."orders/v1".schema: expected a JSON Schema object or a file path'),
    ],
)
def test_bad_schema_names_the_channel(tmp_path, schema, message):
    assert message in config_error({"channels": {"orders/v1": {"schema": schema}}}, tmp_path)


@pytest.mark.parametrize(
    ("storage", "max_size", "reserve"),
    [
        ({}, None, 4 << 20),
        ({"max_size": "40MB"}, 40_000_000, 4 << 20),
        ({"max_size": "1.5 GiB", "reserve": "512KiB"}, 3 << 29, 512 << 10),
        ({"max_size": 2_000_000, "reserve": 0}, 2_000_000, 0),
    ],
)
def test_storage_quota_and_reserve(tmp_path, storage, max_size, reserve):
    s = parse_settings({"storage": storage}, base_dir=tmp_path)
    assert (s.storage_max_size, s.storage_reserve) == (max_size, reserve)


def test_owner_lease_and_replicas(tmp_path):
    s = parse_settings({"storage": {}}, base_dir=tmp_path)
    assert (s.storage_owner_lease, s.storage_replicas) == (5.0, None)
    s = parse_settings({"storage": {"owner_lease": 2, "replicas": 1}}, base_dir=tmp_path)
    assert (s.storage_owner_lease, s.storage_replicas) == (2.0, 1)
    assert isinstance(s.storage_owner_lease, float)
    assert s.storage_standby == "relay"
    s = parse_settings({"storage": {"standby": "redirect"}}, base_dir=tmp_path)
    assert s.storage_standby == "redirect"


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ('max_size = "40 XB"', 'storage.max_size: expected a size: bytes, or a string such '
                               'as "40MB" or "2GiB", got "40 XB"'),
        ("max_size = 1000", "storage.max_size: expected at least 1 MiB"),
        ("reserve = -1", "storage.reserve: expected a size"),
        ("reserve = true", "storage.reserve: expected a size"),
        ("quota = 1", "storage.quota: unknown setting (known: url, max_size, reserve, "
                      "wal_checkpoint, owner_lease, replicas, standby, placement)"),
        ('standby = "proxy"', "storage.standby: expected \"relay\""),
        ('placement = "ring"', "storage.placement: expected \"primary\""),
        ('placement = "spread"', "storage.placement: \"spread\" shares the queues between "
                                 "brokers on Redis: it needs storage.url redis://"),
        ("owner_lease = 0.1", "storage.owner_lease: expected seconds, 0.5..300, got 0.1"),
        ('owner_lease = "5s"', "storage.owner_lease: expected seconds"),
        ("replicas = -1", "storage.replicas: expected 0..16"),
        ("replicas = true", "storage.replicas: expected 0..16"),
        ('url = "mongo://x"', "storage.url 'mongo://x': unknown backend 'mongo'; known: "
                              "sqlite:///path/to/minou.db, redis://host:6379/0"),
        ('url = "redis://x/zero"', "storage.url 'redis://x/zero': the path is the database "
                                   "number"),
        ('url = "redis://:secret@x/0?replicas=-1"',
         "storage.url 'redis://:***@x/0?replicas=-1': replicas must be a whole number"),
        ('url = "rediss://x/0?password_file=/nonexistent/pw"', "cannot read password_file"),
        ('url = "redis+sentinel://h1:26379,h2:26379"',
         "storage.url 'redis+sentinel://h1:26379,h2:26379': give the service name Sentinel "
         "monitors, e.g. redis+sentinel://h1:26379,h2:26379/mymaster/0"),
        ('url = "redis+sentinel://h1,h2//0"', "give the service name Sentinel monitors"),
        ('url = "redis+sentinel://:secret@h1:26379/mymaster/zero"',
         "storage.url 'redis+sentinel://:***@h1:26379/mymaster/zero': after the service "
         "name is the database number, not 'zero'"),
        ('url = "redis+sentinel:///mymaster/0"',
         "storage.url 'redis+sentinel:///mymaster/0': give the Sentinels as host:port,"
         "host:port"),
        ('url = "redis+sentinel://h1:26379,/mymaster/0"', "give the Sentinels as host:port"),
        ('url = "redis+sentinel://h1:99999/mymaster/0"',
         "Sentinel 'h1:99999' has a bad port"),
        ('url = "redis+sentinel://h1/m/0?sentinel_password_file=/nonexistent/pw"',
         "cannot read sentinel_password_file"),
        ('url = "redis://h1/0?sentinel_password_file=/etc/hostname"',
         "sentinel_password_file is for redis+sentinel:// URLs"),
        ('url = "sqlite://"', "storage.url 'sqlite://': give the database file"),
        ("url = 3", "storage.url: expected a URL string, got 3"),
    ],
)
def test_bad_storage_names_the_key(tmp_path, storage, message):
    cfg = tmp_path / "m.toml"
    cfg.write_text(f"[storage]\n{storage}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert message in str(info.value)


def test_a_sentinel_url_names_its_sentinels_service_and_database(tmp_path):
    from minou.storage.redis.url import parse as parse_url

    pw = tmp_path / "sentinel.password"
    pw.write_text("s3cret\n")
    where = parse_url(f"redis+sentinel://:data-pw@h1:26380,h2,[::1]:26381/mymaster/2"
                      f"?replicas=1&prefix=shop&socket_timeout=3&sentinel_password_file={pw}")
    assert where.sentinels == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert (where.service, where.replicas, where.prefix) == ("mymaster", 1, "shop")
    assert where.sentinel_password == "s3cret"
    # Each connection to the primary: the data nodes' password, database 2, redis-py's
    # own keys; minou's keys taken out.
    assert where.client_url == "redis://:data-pw@sentinel/2?socket_timeout=3"
    assert "data-pw" not in where.shown and ":***@h1:26380" in where.shown
    assert parse_url("redis+sentinel://h1/mymaster").client_url == "redis://sentinel/"


def test_a_cluster_url_names_its_nodes_and_only_database_0():
    from minou.storage.redis.url import parse as parse_url

    where = parse_url("redis+cluster://:pw@h1:7000,h2,[::1]:7002?prefix=shop&replicas=1"
                      "&socket_timeout=3")
    assert where.cluster_nodes == (("h1", 7000), ("h2", 6379), ("::1", 7002))
    assert (where.sentinels, where.replicas, where.prefix) == ((), 1, "shop")
    assert where.client_url == "redis://:pw@cluster/0?socket_timeout=3"
    assert "pw@" not in where.shown.replace(":***@", "")
    assert parse_url("redis+cluster://h1:7000/0").cluster_nodes == (("h1", 7000),)
    with pytest.raises(ConfigError, match="only database 0"):
        parse_url("redis+cluster://h1:7000/3")
    with pytest.raises(ConfigError, match="Redis Cluster node 'h1:x' has a bad port"):
        parse_url("redis+cluster://h1:x")


def test_interval_durability_is_per_channel_version_in_milliseconds(tmp_path):
    cfg = tmp_path / "minou.toml"
    cfg.write_text('[channels."metrics/v1"]\ndurability = "interval"\nsync_interval = 20\n'
                   '[channels."orders/v1"]\nprefetch = 5\n')
    settings = load_settings(cfg)
    metrics = settings.channel_options("metrics/v1")
    assert (metrics.durability, metrics.sync_interval) == ("interval", 0.02)
    assert settings.channel_options("orders/v1").durability == "fsync"  # the default
    assert settings.any_interval
    cfg.write_text('[channels."orders/v1"]\nprefetch = 5\n')
    assert not load_settings(cfg).any_interval


def test_idle_expiry_and_the_inbox_defaults(tmp_path):
    cfg = tmp_path / "minou.toml"
    cfg.write_text('[channels."tmp/v1"]\nexpire_idle = 90\n')
    settings = load_settings(cfg)
    assert settings.channel_options("tmp/v1").expire_idle == 90
    assert settings.channel_options("orders/v1").expire_idle is None  # never, by default
    inbox = settings.channel_options("_inbox/v1")
    assert (inbox.expire_idle, inbox.ttl, inbox.dead_letter, inbox.overflow) == (
        600.0, 300.0, False, "drop_oldest")
    cfg.write_text('[channels."_inbox/v1"]\nttl = 60\n')  # the operator's own, whole
    assert load_settings(cfg).channel_options("_inbox/v1").expire_idle is None


@pytest.mark.parametrize(("raw", "message"), [
    ({"kv": {"bad name": {}}}, 'kv."bad name": invalid bucket'),
    ({"kv": {"a": {"prefetch": 3}}}, 'kv."a".prefetch: unknown setting'),
    ({"kv": {"a": {"history": 0}}}, 'kv."a".history: expected an integer 1..64, got 0'),
    ({"kv": {"a": 5}}, 'kv."a": expected a table of bucket options'),
    ({"channels": {"a/v1": {"history": 2}}}, 'channels."a/v1".history: a bucket option'),
    ({"federation": {"name": "x"}}, "federation: expected a list of tables"),
    ({"federation": [{"name": "a b"}]}, "federation[0].name: expected 1 to 64 letters"),
    ({"federation": [{"name": "x", "remote": "http://h"}]}, 'federation "x".remote: expected'),
    ({"federation": [{"name": "x", "remote": "minou://h:1"}]},
     'federation "x": give push and/or pull'),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["bad"]}]},
     'federation "x".push: invalid pattern'),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["a/*"],
                      "prefix": "eu/"}]}, 'federation "x".prefix: up to 32 letters'),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["a/*"],
                      "key": "nope.key"}]}, 'federation "x".key: no file'),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["a/*"],
                      "broker_token": "short"}]}, 'federation "x".broker_token: expected'),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["a/*"], "port": 1}]},
     "federation[0].port: unknown setting"),
    ({"federation": [{"name": "x", "remote": "minou://h:1", "push": ["a/*"]},
                     {"name": "x", "remote": "minou://h:1", "pull": ["a/*"]}]},
     'federation "x": a second link of that name'),
])
def test_bad_kv_and_federation_settings_name_the_key(raw, message, tmp_path) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(raw, base_dir=tmp_path)
    assert message in str(info.value)


def test_a_federation_link_parsed_whole(tmp_path) -> None:
    key = tmp_path / "bridge.key"
    key.write_text("x")
    (link,) = parse_settings({"federation": [{
        "name": "eu-us", "remote": "wss://us:7701/v1/ws", "key": "bridge.key",
        "push": ["orders/v1/*"], "prefix": "eu-"}]}, base_dir=tmp_path).federation
    assert (link.client_id, link.key, link.push, link.pull, link.prefix) == (
        "bridge", str(key), ("orders/v1/*",), (), "eu-")
