"""The HTTP protocol (server/http_fast.py) subclasses uvicorn's private HttpToolsProtocol:
uvicorn is pinned to the releases it is tested with, and a uvicorn without what it builds
on stops the broker at start with an error naming the version and what is missing."""

from __future__ import annotations

import asyncio
import sys
import tomllib
from pathlib import Path

import pytest
import uvicorn
from uvicorn.protocols.http import httptools_impl

from minou.config import Settings
from minou.errors import StartupError
from minou.server import http
from minou.server.app import BrokerServer
from minou.server.datadir import LOCK_NAME

ROOT = Path(__file__).resolve().parents[2]
ADVICE = (f"minou is tested with uvicorn{http.UVICORN_TESTED}: install such a release "
          f"(pip install 'uvicorn{http.UVICORN_TESTED}')")


def error(missing: str) -> str:
    return (f"uvicorn {uvicorn.__version__} lacks what minou's HTTP protocol "
            f"(minou/server/http_fast.py) builds on: {missing}. {ADVICE}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def test_the_pin_is_the_tested_range_and_holds_the_installed_uvicorn() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert [d for d in deps if d.startswith("uvicorn")] == [f"uvicorn{http.UVICORN_TESTED}"]
    low, high = (bound.lstrip("<>=") for bound in http.UVICORN_TESTED.split(","))
    assert _version(low) <= _version(uvicorn.__version__) < _version(high)


def test_this_uvicorn_has_all_the_fast_path_needs() -> None:
    assert http.fast_path_missing() == []
    http.check_fast_path()


def test_a_missing_method_is_named_with_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "_unset_keepalive_if_required")
    with pytest.raises(StartupError) as info:
        http.check_fast_path()
    assert str(info.value) == error("HttpToolsProtocol._unset_keepalive_if_required()")


def test_a_missing_module_name_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl, "STATUS_LINE")
    with pytest.raises(StartupError) as info:
        http.check_fast_path()
    assert str(info.value) == error("uvicorn.protocols.http.httptools_impl.STATUS_LINE")


def test_connection_state_no_longer_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = httptools_impl.HttpToolsProtocol.__init__

    def without_keepalive_task(self, config, server_state, app_state, _loop=None):  # type: ignore[no-untyped-def]
        real(self, config, server_state, app_state, _loop)
        # a uvicorn that renamed the keep-alive timer: everything else is still set here
        self.loop = self.parser = self.transport = self.client = self.server_state = None
        self.cycle = self.headers = self.expect_100_continue = None
        self.limit_concurrency = self.timeout_keep_alive = self.pipeline = None

    monkeypatch.setattr(httptools_impl.HttpToolsProtocol, "__init__", without_keepalive_task)
    with pytest.raises(StartupError) as info:
        http.check_fast_path()
    assert str(info.value) == error(
        "HttpToolsProtocol.timeout_keep_alive_task (set by none of __init__, "
        "connection_made, on_message_begin)")


def test_a_missing_module_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    with pytest.raises(StartupError, match=r"lacks what minou's HTTP protocol .* builds on: "
                                           r"the module uvicorn\.protocols\.http\."
                                           r"httptools_impl \("):
        http.check_fast_path()


def test_the_broker_refuses_to_start_before_touching_its_data_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_response_complete")
    server = BrokerServer(Settings(data_dir=str(tmp_path / "d"), port=0, http_port=0,
                                   auth_mode="off"))
    with pytest.raises(StartupError) as info:
        asyncio.run(server.start())
    assert str(info.value) == error("HttpToolsProtocol.on_response_complete()")
    assert not (tmp_path / "d" / LOCK_NAME).exists()
