"""Admin operations reachable over the native protocol (``ADMIN`` frames).

The connection checks the caller is an admin before any of these runs
(``whoami`` excepted). Operations that change state answer after the commit
that makes the change durable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import BadRequest, NotAuthenticated

if TYPE_CHECKING:
    from .app import BrokerServer
    from .connection import NativeConnection

Op = Callable[["BrokerServer", dict[str, Any], "NativeConnection | None"], Any]


def _status(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    return server.status()


def _list(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    core = server.core
    now = time.time()
    prefix = str(args.get("channel") or "")
    return {
        "channels": [
            core.channel_stats(log, now)
            for name, log in sorted(core.channels.items())
            if name.startswith(prefix)
        ],
        "groups": [core.group_stats(g, now) for _, g in sorted(core.groups.items())],
    }


def _whoami(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    identity = conn.identity if conn is not None else None
    if identity is None:
        return None
    session = conn.session if conn is not None else None
    return {"client_id": identity.client_id, "admin": identity.admin,
            "method": identity.method, "fingerprint": identity.fingerprint,
            "access": session.access.describe() if session is not None else None}


def _client_id(args: dict[str, Any]) -> str:
    client_id = args.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        raise BadRequest("give client_id")
    return client_id


def _by(conn: NativeConnection | None) -> str:
    return conn.identity.client_id if conn is not None and conn.identity else "the broker"


def _registry_op(server: BrokerServer, action: Callable[[], Any]) -> Any:
    try:
        record = action()
    except KeyError as exc:
        raise BadRequest(str(exc.args[0])) from None
    except NotAuthenticated as exc:  # a bad public key given to rotate
        raise BadRequest(exc.message) from None
    server._persist_registry()
    return record.public()


def _clients_list(server: BrokerServer, args: dict[str, Any],
                  conn: NativeConnection | None) -> Any:
    online: dict[str, int] = {}
    for c in server.connections:
        if c.identity is not None:
            online[c.identity.client_id] = online.get(c.identity.client_id, 0) + 1
    rules = server.settings.rules
    out = []
    for item in server.registry.listing():
        client_id = str(item["client_id"])
        item["connections"] = online.get(client_id, 0)
        item["admin"] = client_id in server.settings.admins
        item["access"] = rules.for_client(client_id).describe()
        out.append(item)
    return {"clients": out, "reservations": dict(sorted(server.core.reservations.items())),
            "rules": rules.describe(), "admins": sorted(server.settings.admins)}


def _approve(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    client_id = _client_id(args)
    return _registry_op(server, lambda: server.registry.approve(client_id, by=_by(conn)))


def _revoke(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    client_id = _client_id(args)
    if conn is not None and conn.identity is not None and conn.identity.client_id == client_id:
        raise BadRequest("an admin cannot revoke itself (ask another admin)")
    result = _registry_op(server, lambda: server.registry.revoke(client_id, by=_by(conn)))
    result["connections_closed"] = server.drop_client(
        client_id, f"client {client_id!r} was revoked by {_by(conn)}")
    return result


def _rotate(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    client_id = _client_id(args)
    public_key = args.get("public_key")
    if not isinstance(public_key, str) or not public_key.strip():
        raise BadRequest("give public_key: the new public key (PEM), e.g. from minou keygen")
    result = _registry_op(
        server, lambda: server.registry.rotate(client_id, public_key, by=_by(conn)))
    # Connections authenticated with the old key end now; the new key must reconnect.
    if conn is None or conn.identity is None or conn.identity.client_id != client_id:
        result["connections_closed"] = server.drop_client(
            client_id, f"the key of client {client_id!r} was rotated by {_by(conn)}")
    return result


def _forget(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    client_id = _client_id(args)
    if conn is not None and conn.identity is not None and conn.identity.client_id == client_id:
        raise BadRequest("an admin cannot forget itself (ask another admin)")
    result = _registry_op(server, lambda: server.registry.forget(client_id))
    result["connections_closed"] = server.drop_client(
        client_id, f"client {client_id!r} was removed by {_by(conn)}")
    return result


def _release(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    channel = args.get("channel")
    if not isinstance(channel, str) or not channel:
        raise BadRequest("give channel: the reserved channel to release")
    owner = server.core.release(channel)
    if owner is None:
        raise BadRequest(f"channel {channel!r} is not reserved")
    server.request_write(urgent=False)
    return {"channel": channel, "released_from": owner}


def _reload(server: BrokerServer, args: dict[str, Any], conn: NativeConnection | None) -> Any:
    return server.reload()


OPERATIONS: dict[str, Op] = {
    "status": _status,
    "list": _list,
    "whoami": _whoami,
    "clients.list": _clients_list,
    "clients.approve": _approve,
    "clients.revoke": _revoke,
    "clients.rotate": _rotate,
    "clients.forget": _forget,
    "reservations.release": _release,
    "reload": _reload,
}


def run_admin(server: BrokerServer, op: str, args: dict[str, Any],
              conn: NativeConnection | None = None) -> Any:
    handler = OPERATIONS.get(op)
    if handler is None:
        raise BadRequest(f"unknown admin operation {op!r} (known: {', '.join(OPERATIONS)})")
    return handler(server, args, conn)
