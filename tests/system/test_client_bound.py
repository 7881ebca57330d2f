"""The broker holds at most ``max_clients`` registered clients: under an auto-accepting
rule anyone with fresh key pairs registered one per HELLO, each kept in memory and
stored for good. Past it a new id is refused precisely while registered ones connect
as before; a reload moves the bound. Real broker process, native client, the admin CLI."""

from __future__ import annotations

import pytest

import minou
from minou.errors import NotAuthenticated, PendingApproval

from ..conftest import OPEN_RULES
from .test_reload import minou_cli


def test_new_clients_past_max_clients_are_refused_and_a_reload_moves_the_bound(
        broker_factory, tmp_path):
    cfg = tmp_path / "bound.toml"
    cfg.write_text("max_clients = 3\n" + OPEN_RULES)
    broker = broker_factory.make(config=cfg).start()  # the admin is the first client
    for cid in ("app-1", "app-2"):
        broker.connect_sync(cid, reconnect=False).close()
    with pytest.raises(NotAuthenticated,
                       match=r"the broker holds 3 clients and the limit is 3 \(max_clients\)"
                       ) as info:
        broker.connect_sync("app-3", reconnect=False)
    assert not isinstance(info.value, PendingApproval)
    with broker.connect_sync("app-1", reconnect=False) as app:  # registered: goes on
        assert app.admin("whoami")["client_id"] == "app-1"
    with minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False)) as admin:
        status = admin.admin("status")["auth"]
        assert status["clients"] == 3 and status["failures"]["too_many_clients"] == 1
    cfg.write_text("max_clients = 10\n" + OPEN_RULES)
    out = minou_cli(broker, "reload", "--json")
    assert out.returncode == 0 and "max_clients" in out.stdout, out.stderr
    with broker.connect_sync("app-3", reconnect=False) as app:
        assert app.admin("whoami")["client_id"] == "app-3"
