"""Config files: the example loads; every mistake names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from minou.config import load_settings
from minou.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_commented_example_loads():
    s = load_settings(ROOT / "examples" / "minou.toml")
    assert s.port == 7700 and s.http_port == 7701
    orders = s.channel_options("orders/v1")
    assert (orders.prefetch, orders.requeue_limit, orders.overflow) == (100, 5, "refuse")
    assert s.channel_options("audit/v3").retention == 604800
    assert s.channel_options("other/v1").prefetch == 1
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
        ('[channels."orders/v1"]\nttl = true', 'channels."orders/v1".ttl: expected'),
        ("port = ", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, message):
    cfg = tmp_path / "minou.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert message in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.toml")
