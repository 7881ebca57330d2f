"""The broker holds at most ``max_channels`` channels: a client with write rights
cannot make millions of them (each is kept, ~2 KB). Past it a new channel is refused
precisely through every door while the channels that exist go on; a reload moves the
bound. Real broker process, native client, HTTP, the admin CLI."""

from __future__ import annotations

import httpx
import pytest

import minou

from ..conftest import OPEN_RULES
from .test_http_api import bearer
from .test_reload import minou_cli


def test_new_channels_past_max_channels_are_refused_and_a_reload_moves_the_bound(
        broker_factory, tmp_path):
    cfg = tmp_path / "bound.toml"
    cfg.write_text("max_channels = 3\n" + OPEN_RULES)
    broker = broker_factory.make(config=cfg).start()
    with broker.connect_sync("app") as app:
        for i in range(3):
            app.send(f"many/v1/{i}", {"n": i})
        with pytest.raises(minou.errors.QueueFull,
                           match=r"holds 3 channels and the limit is 3 \(max_channels\)"):
            app.send("many/v1/3", {"n": 3})
        with pytest.raises(minou.errors.QueueFull):  # a reader naming one makes it too
            app.consume("many/v1/4", group="g")
        assert app.send("many/v1/0", {"n": 0}).seq == 2  # those that exist go on
        r = httpx.post(f"{broker.http}/v1/messages/many/v1/5", json={"n": 5},
                       headers=bearer(broker, "web"), timeout=10)
        assert r.status_code == 429 and "max_channels" in r.text, r.text
        cfg.write_text("max_channels = 10\n" + OPEN_RULES)
        out = minou_cli(broker, "reload", "--json")
        assert out.returncode == 0 and "max_channels" in out.stdout, out.stderr
        assert app.send("many/v1/3", {"n": 3}).seq == 1
