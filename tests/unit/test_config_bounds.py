"""Config values a broker cannot run with are refused at load (and so at reload, which
loads the file again): numbers past their maximum, NaN and infinity, a data directory
at the filesystem root or in a kernel pseudo-filesystem, a JSON key given twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minou.config import (
    MAX_MESSAGE_SIZE_SETTING,
    MAX_SETTING_INT,
    MAX_SETTING_SECONDS,
    load_settings,
)
from minou.errors import ConfigError
from minou.limits import (
    MAX_FRAME_SIZE,
    MAX_HEARTBEAT_S,
    MAX_LEASE_S,
    MAX_OFFSETS_AT_PER_CLIENT_SETTING,
    MAX_PREFETCH,
)

HUGE = 99999999999999999999  # past 2**64: msgpack cannot carry it in a WELCOME


def refusal(tmp_path, text: str, name: str = "minou.toml") -> str:
    cfg = tmp_path / name
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"max_message_size = {HUGE}",
         f"max_message_size: expected a number of bytes >= 1 and <= {MAX_MESSAGE_SIZE_SETTING} "
         f"(a message fits one 16 MiB frame), got {HUGE}"),
        (f"max_message_size = {MAX_FRAME_SIZE}", f"got {MAX_FRAME_SIZE}"),
        (f"max_connections = {HUGE}",
         f"max_connections: expected an integer >= 1 and <= {MAX_SETTING_INT}, got {HUGE}"),
        (f"max_dedup_keys = {MAX_SETTING_INT + 1}", "max_dedup_keys: expected an integer >= 1"),
        ("max_channels = 0", f"max_channels: expected an integer >= 1 and <= {MAX_SETTING_INT}, "
                             "got 0"),
        ('max_channels = "many"', "max_channels: expected an integer >= 1"),
        ("max_clients = -5", "max_clients: expected an integer >= 1"),
        ("max_long_polls_per_client = 0",
         "max_long_polls_per_client: expected an integer >= 1 and <= 10000, got 0"),
        ("max_long_polls_per_client = 10001", "max_long_polls_per_client: expected an integer"),
        ("max_offsets_at_per_client = 0",
         "max_offsets_at_per_client: expected an integer >= 1 and <= 1000, got 0"),
        ("max_offsets_at_per_client = 1001",
         "max_offsets_at_per_client: expected an integer >= 1 and <= 1000, got 1001"),
        ("max_offsets_at_per_client = 2.5",
         "max_offsets_at_per_client: expected an integer >= 1 and <= 1000, got 2.5"),
        ("max_offsets_at_per_client = true",
         "max_offsets_at_per_client: expected an integer >= 1 and <= 1000, got true"),
        ("metrics_max_queues = -1",
         f"metrics_max_queues: expected an integer >= 0 and <= {MAX_SETTING_INT}, got -1"),
        ('metrics_max_queues = "all"', "metrics_max_queues: expected an integer >= 0"),
        (f"in_flight_bytes = {HUGE}",
         f"in_flight_bytes: expected a number of bytes >= 1 and <= {MAX_SETTING_INT}, got"),
        (f"publish_pause_bytes = {HUGE}", "publish_pause_bytes: expected a number of bytes"),
        (f"slow_consumer_bytes = {HUGE}", "slow_consumer_bytes: expected a number of bytes"),
        (f"delivery_buffer_bytes = {HUGE}", "delivery_buffer_bytes: expected a number of"),
        ("port = 99999999999999999999", "port: expected a port number 0..65535, got"),
        ("default_lease = nan",
         f"default_lease: expected a number of seconds > 0 and <= {MAX_LEASE_S:g}, got nan"),
        ("default_lease = inf", "default_lease: expected a number of seconds > 0 and <= 43200, "
                                "got inf"),
        ("default_lease = -inf", "default_lease: expected a number of seconds > 0"),
        ("default_lease = 0", "default_lease: expected a number of seconds > 0"),
        (f"default_lease = {MAX_LEASE_S + 1}", "default_lease: expected"),
        ("dedup_window = nan", "dedup_window: expected a number of seconds >= 0 and <= "
                               "315360000 (ten years), got nan"),
        ("dedup_window = -1", "dedup_window: expected a number of seconds >= 0"),
        ("hello_timeout = nan", "hello_timeout: expected a number of seconds > 0 and <= "
                                "315360000 (ten years), got nan"),
        ("http_header_timeout = inf", "http_header_timeout: expected a number of seconds > 0"),
        ("http_idle_timeout = nan", "http_idle_timeout: expected a number of seconds > 0"),
        ("slow_consumer_seconds = inf", "slow_consumer_seconds: expected a number of seconds"),
        ("websocket_heartbeat = nan", "websocket_heartbeat: expected a number of seconds > 0"),
        (f"websocket_heartbeat = {MAX_HEARTBEAT_S + 1}",
         f"websocket_heartbeat: expected a number of seconds > 0 and <= {MAX_HEARTBEAT_S:g}"),
        ('[channels."a/v1"]\nttl = nan',
         'channels."a/v1".ttl: expected a number of seconds > 0 and <= 315360000 (ten years), '
         "got nan"),
        ('[channels."a/v1"]\nretention = inf', 'channels."a/v1".retention: expected'),
        ('[channels."a/v1"]\nexpire_idle = nan', 'channels."a/v1".expire_idle: expected'),
        ('[channels."a/v1"]\nsync_interval = nan', 'channels."a/v1".sync_interval: expected'),
        (f'[channels."a/v1"]\nprefetch = {MAX_PREFETCH + 1}',
         f'channels."a/v1".prefetch: expected an integer >= 1 and <= {MAX_PREFETCH}, got'),
        (f'[channels."a/v1"]\nmax_items = {HUGE}', 'channels."a/v1".max_items: expected an'),
        (f'[channels."a/v1"]\nrequeue_limit = {HUGE}', 'channels."a/v1".requeue_limit: expec'),
        ('[kv."a"]\nttl = inf', 'kv."a".ttl: expected a number of seconds > 0'),
        (f"[storage]\nmax_size = {HUGE}",
         f"storage.max_size: expected a size of at most {MAX_SETTING_INT} bytes, got {HUGE}"),
        ('[storage]\nreserve = "' + "9" * 400 + ' TiB"',
         f'storage.reserve: expected a size of at most {MAX_SETTING_INT} bytes, got "999'),
        ("[storage]\nowner_lease = nan", "storage.owner_lease: expected seconds"),
    ],
)
def test_a_number_past_its_bounds_is_refused_naming_key_value_and_range(tmp_path, text,
                                                                       message):
    assert message in refusal(tmp_path, text)


def test_the_bounds_themselves_load(tmp_path):
    cfg = tmp_path / "minou.toml"
    cfg.write_text(f"max_message_size = {MAX_MESSAGE_SIZE_SETTING}\n"
                   f"max_connections = {MAX_SETTING_INT}\n"
                   f"default_lease = {MAX_LEASE_S}\n"
                   f"dedup_window = {MAX_SETTING_SECONDS}\n"
                   f"websocket_heartbeat = {MAX_HEARTBEAT_S}\n"
                   f"max_offsets_at_per_client = {MAX_OFFSETS_AT_PER_CLIENT_SETTING}\n"
                   "metrics_max_queues = 0\n"
                   f'[channels."a/v1"]\nprefetch = {MAX_PREFETCH}\nttl = {MAX_SETTING_SECONDS}\n')
    s = load_settings(cfg)
    assert (s.max_message_size, s.default_lease) == (MAX_MESSAGE_SIZE_SETTING, MAX_LEASE_S)
    assert s.channel_options("a/v1").prefetch == MAX_PREFETCH
    assert s.max_offsets_at_per_client == MAX_OFFSETS_AT_PER_CLIENT_SETTING
    assert s.metrics_max_queues == 0  # no queue's own series: the totals alone


def test_json_nan_and_infinity_are_refused_too(tmp_path):
    assert "default_lease: expected a number of seconds > 0 and <= 43200, got nan" in refusal(
        tmp_path, '{"default_lease": NaN}', "minou.json")
    assert "hello_timeout: expected" in refusal(
        tmp_path, '{"hello_timeout": Infinity}', "minou.json")


# --- data_dir ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data_dir", "message"),
    [
        ("/", 'data_dir: "/" is the filesystem root; give a directory of its own, e.g. ./data'),
        ("/tmp/..", 'data_dir: "/tmp/.." (resolves to /) is the filesystem root; give a '
                    "directory of its own, e.g. ./data"),
        ("/proc/self", 'data_dir: "/proc/self" (resolves to /proc/'),
        ("/sys/minou", 'data_dir: "/sys/minou" is inside /sys, a kernel pseudo-filesystem; '
                       "give a directory of its own, e.g. ./data"),
        ("/dev/minou", 'data_dir: "/dev/minou" is inside /dev, a kernel pseudo-filesystem'),
    ],
)
def test_a_data_dir_at_the_root_or_in_a_pseudo_filesystem_is_refused(tmp_path, data_dir,
                                                                     message):
    assert message in refusal(tmp_path, f"data_dir = {json.dumps(data_dir)}\n")


def test_data_on_the_command_line_is_checked_and_named_so(tmp_path):
    with pytest.raises(ConfigError, match=r'^--data: "/" is the filesystem root'):
        load_settings(None, data_dir="/")
    cfg = tmp_path / "minou.toml"
    cfg.write_text('data_dir = "data"\n')
    with pytest.raises(ConfigError, match=r'^--data: "/proc/self" \(resolves to /proc/'):
        load_settings(cfg, data_dir="/proc/self")
    # The flag replaces the file's value: a bad file value is not reached by a good flag.
    cfg.write_text('data_dir = "/"\n')
    with pytest.raises(ConfigError, match=r'^data_dir: "/"'):
        load_settings(cfg)
    assert load_settings(cfg, data_dir=str(tmp_path / "d")).data_dir == str(tmp_path / "d")


def test_a_sqlite_url_at_the_root_or_in_a_pseudo_filesystem_is_refused_too(tmp_path):
    # storage.url puts the database (and its WAL) outside data_dir: the same rule holds.
    assert ('storage.url\'s directory: "//" (resolves to /) is the filesystem root' in refusal(
        tmp_path, '[storage]\nurl = "sqlite:////minou.db"\n'))
    assert ('storage.url\'s directory: "/proc/x" is inside /proc' in refusal(
        tmp_path, '[storage]\nurl = "sqlite:///proc/x/minou.db"\n'))
    assert ('storage.url\'s directory: "/proc/x" is inside /proc' in refusal(
        tmp_path, '[storage]\nurl = "SQLITE:///proc/x/minou.db"\n'))  # schemes are caseless
    ok = tmp_path / "cfg.toml"
    ok.write_text(f'[storage]\nurl = "sqlite://{tmp_path}/db/minou.db"\n')
    assert load_settings(ok).storage.endswith("/db/minou.db")


@pytest.mark.parametrize("key", ["port", "http_port", "resp_port"])
def test_a_port_on_the_command_line_is_checked_too(key):
    # 70000 used to be taken, and the broker listened on 70000 - 65536 = 4464.
    flag = "--" + key.replace("_", "-")
    with pytest.raises(ConfigError, match=f"^{flag}: expected a port number 0..65535, got 70000$"):
        load_settings(None, **{key: 70000})
    assert getattr(load_settings(None, **{key: 0}), key) == 0


def test_a_data_dir_that_is_a_file_is_named_so(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match=f'^--data: "{afile}" is a file, not a directory'):
        load_settings(None, data_dir=str(afile))


def test_dev_shm_is_an_ordinary_directory(tmp_path):
    assert load_settings(None, data_dir="/dev/shm/minou").data_dir == "/dev/shm/minou"


def test_minou_start_exits_2_on_a_data_dir_or_number_it_refuses(tmp_path):
    cfg = tmp_path / "minou.toml"
    cfg.write_text(f"max_message_size = {HUGE}\n")
    # Not "/" here: a broker that took it would write its files there.
    for args in (["--data", "/proc/self"], ["--config", str(cfg)]):
        done = subprocess.run([sys.executable, "-m", "minou", "start", "--dev", *args],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "invalid configuration:" in done.stderr
    assert "max_message_size: expected a number of bytes >= 1 and <=" in done.stderr


# --- JSON config files -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"broker_id": "a", "broker_id": "b"}', "broker_id"),
        ('{"channels": {"a/v1": {"prefetch": 1, "prefetch": 2}}}', 'channels."a/v1".prefetch'),
        ('{"rules": [{"client": "x", "read": ["*"], "client": "y"}]}', "rules[0].client"),
        ('{"channels": {"a/v1": {}, "a/v1": {}}}', 'channels."a/v1"'),
    ],
)
def test_a_json_key_given_twice_is_refused_naming_it(tmp_path, text, where):
    message = refusal(tmp_path, text, "minou.json")
    assert message == (f"{tmp_path / 'minou.json'}: {where}: given twice in one object (JSON "
                       "would keep the last value silently); give each key once")


def test_a_json_config_with_unique_keys_loads_whole(tmp_path):
    cfg = tmp_path / "minou.json"
    cfg.write_text(json.dumps({"broker_id": "b", "data_dir": "d",
                               "channels": {"a/v1": {"prefetch": 3, "schema": {
                                   "type": "object", "properties": {"a": {"type": "array"}}}}},
                               "rules": [{"client": "x", "read": ["*"]}]}))
    s = load_settings(cfg)
    assert (s.broker_id, s.channel_options("a/v1").prefetch) == ("b", 3)
    assert s.schemas()["a/v1"].source["properties"] == {"a": {"type": "array"}}
