"""``BrokerServer`` offers every member of ``ports.Server``, the interface its doors
and admin operations are written against (they never import ``app``)."""

from __future__ import annotations

import inspect
from pathlib import Path

from minou.config import Settings
from minou.server.app import BrokerServer
from minou.server.ports import Server
from minou.storage.memory import MemoryStorage


def members() -> set[str]:
    names = set(Server.__annotations__)
    names |= {name for name, _ in inspect.getmembers(Server)
              if not name.startswith("_") and name not in dir(object)}
    return names - {"_is_protocol"}


def test_broker_server_has_every_member_of_the_port(tmp_path: Path) -> None:
    server = BrokerServer(Settings(data_dir=str(tmp_path), http_port=None),
                          storage=MemoryStorage("ports-test"))
    missing = sorted(name for name in members() if not hasattr(server, name))
    assert missing == []
    assert len(members()) > 40  # the annotations were read, not an empty protocol


def test_a_method_of_the_port_takes_what_the_server_takes() -> None:
    for name in ("authenticate", "admin", "read_messages", "drop_client", "reload"):
        port = inspect.signature(getattr(Server, name))
        real = inspect.signature(getattr(BrokerServer, name))
        assert list(port.parameters) == list(real.parameters), name
