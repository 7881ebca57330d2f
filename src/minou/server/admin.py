"""Admin operations, shared by the native ``ADMIN`` frame, the HTTP API and the CLI.

Each operation takes the server, its arguments and the caller's identity. The
adapters check the caller is an admin before any of these runs (``whoami`` and a
client's own credentials excepted). An operation returns a JSON-able value, or an
awaitable of one when it must read storage. Operations that change state are answered after the
commit that makes the change durable (the adapters wait for it).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..auth.credentials import check_ttl
from ..core import maintenance
from ..core.log import Msg, page_end, read_weight
from ..core.paging import page_args
from ..errors import BadRequest, NotAuthenticated, NotAuthorized, NotFound
from ..limits import (
    DEFAULT_BROWSE,
    DEFAULT_CREDENTIAL_TTL_S,
    DEFAULT_REQUEUE,
    MAX_BROWSE,
    MAX_DELETE,
    MAX_FROM_SEQ,
    MAX_REQUEUE,
    MAX_REQUEUE_BYTES,
    STORAGE_READ_BYTES,
    STORAGE_READ_PAGE,
)
from ..names import DEAD_PREFIX, validate_channel
from . import federation, kv
from .http_requests import REQUEST_OP, request_op
from .kv import KV_OPS

if TYPE_CHECKING:
    from ..auth.registry import Identity
    from .ports import Server

log = logging.getLogger("minou.admin")
Op = Callable[["Server", dict[str, Any], "Identity | None"], Any]
# What a non-admin may run: each acts on the caller's own identity only.
# (KV reads check the caller's read rights on the bucket themselves.)
# (REQUEST_OP refuses every caller but the brokers' own links.)
SELF_SERVICE_OPS = frozenset({"whoami", "credentials.issue", "credentials.renew",
                              "credentials.revoke", "credentials.list", *KV_OPS,
                              "messages.delete",
                              REQUEST_OP, *federation.SELF_SERVICE})
# Operations that only look at the broker's state: answered at once, not after the
# next commit, so an operator can look while storage is out of reach (a commit that
# cannot happen would hold the answer).
LOOK_OPS = frozenset({"status", "list", "queues", "whoami", "queue", "clients.list",
                      "cluster", "credentials.list", "federation"})
# How to ask for less, named in the FRAME_TOO_LARGE refusal of an answer over
# MAX_FRAME_SIZE: the listings of everything registered page, the others narrow.
NARROWING = {
    "list": "take a queue or a channel prefix: minou list -q QUEUE, --channel PREFIX",
    # queues takes no narrowing: one queue at a time is list's or queue's
    "queues": "ask one queue at a time: list with a queue (minou list -q QUEUE), "
              "or queue (GET /v1/queues/QUEUE)",
    "queue": "name a channel or a group (GET /v1/queues/QUEUE?channel=ID&group=G)",
    "clients.list": "ask a smaller page: limit, then after=next "
                    "(minou clients list --limit N)",
    "credentials.list": "ask a smaller page: limit, then after=next "
                        "(minou credentials list --limit N)",
    "kv.buckets": "ask a smaller page: limit, then after=next (minou kv ls --limit N)",
    "kv.keys": "ask a smaller page: limit, then after=next",
    "kv.history": "ask a smaller page: limit, then after=next",
    "kv.read": "ask a smaller page: limit, then after=next",
}


def narrowing(op: str | None) -> str:
    """What the refusal of ``op``'s too large answer suggests."""
    if op in NARROWING:
        return f"ask for less ({op}: {NARROWING[op]})"
    return ("ask for less (admin listings take a page: limit, then after=next; list and "
            "queues take a queue or a channel prefix: minou list -q QUEUE, --channel PREFIX)")


def _str_arg(args: dict[str, Any], name: str, *, required: bool = True) -> str | None:
    value = args.get(name)
    if value is None or value == "":
        if required:
            raise BadRequest(f"give {name}")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value


def _int_arg(args: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = args.get(name, default)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{name} must be an integer {lo}..{hi}")
    return value


def _queue_arg(args: dict[str, Any]) -> str:
    queue = _str_arg(args, "queue")
    assert queue is not None
    body = queue[len(DEAD_PREFIX):] if queue.startswith(DEAD_PREFIX) else queue
    parts = body.split("/")
    if len(parts) != 2:
        raise BadRequest(f"queue {queue!r} must be endpoint/version, e.g. orders/v1")
    validate_channel(f"{body}/x")
    return queue


def _by(caller: Identity | None) -> str:
    return caller.client_id if caller is not None else "the broker"


# ------------------------------------------------------------------ status
def _status(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    return server.status()


def _list(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    core = server.core
    now = time.time()
    prefix = str(args.get("channel") or "")
    exact = None
    if args.get("queue"):
        queue = _queue_arg(args)
        exact, prefix = (f"{queue}/{prefix}", "") if prefix else (None, f"{queue}/")
    channels = [core.channel_stats(log, now) for name, log in sorted(core.channels.items())
                if (name == exact if exact else name.startswith(prefix))]
    prefix = exact or prefix
    names = {c["channel"] for c in channels}
    groups = [core.group_stats(g, now) for _, g in sorted(core.groups.items())
              if not prefix or any(n in g.gcs for n in names)]
    return {"channels": channels, "groups": groups}


async def _queues(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """Every queue with its figures and ages (GET /v1/queues, the dashboard's list)."""
    core = server.core
    now = time.time()
    names = sorted({maintenance.queue_of(n) for n in core.channels})
    out = []
    reads = 0
    for queue in names:
        oldest: dict[str, float | None] = {}
        waiting: dict[str, float | None] = {}
        for log in maintenance.channels_of(core, queue):
            if reads < 200 and log.count:  # two storage reads at most per channel
                oldest[log.name] = await server.oldest_published(log)
                waiting[log.name] = await published_at(
                    server, log, maintenance.oldest_waiting(core, log))
                reads += 1
        stats = maintenance.queue_stats(core, queue, None, oldest, now,
                                        oldest_waiting=waiting)
        out.append({k: stats[k] for k in ("queue", "depth", "unsettled", "published",
                                          "delivered", "acked", "dropped", "expired",
                                          "oldest_age_s", "consumers", "listeners",
                                          "waiting", "in_flight", "oldest_waiting_age_s",
                                          "oldest_in_flight_age_s")}
                   | {"channels": len(stats["channels"]), "rates": server.queue_rates(queue)})
    return {"queues": out,
            "groups": [core.group_stats(g, now) for _, g in sorted(core.groups.items())]}


def _whoami(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    if caller is None:
        return None
    return {"client_id": caller.client_id, "admin": caller.admin, "method": caller.method,
            "fingerprint": caller.fingerprint,
            "access": server.access_for(caller).describe()}


async def _queue(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    queue = _queue_arg(args)
    channel_id = _str_arg(args, "channel", required=False)
    group = _str_arg(args, "group", required=False)
    logs = maintenance.channels_of(server.core, queue, channel_id)
    if not logs:
        raise NotFound(f"no channel in queue {queue!r}" +
                         (f" with id {channel_id!r}" if channel_id else ""))
    oldest = {log.name: await server.oldest_published(log, group) for log in logs}
    waiting = {log.name: await published_at(
        server, log, maintenance.oldest_waiting(server.core, log, group)) for log in logs}
    now = time.time()
    stats = maintenance.queue_stats(server.core, queue, channel_id, oldest, now,
                                    group=group, oldest_waiting=waiting)
    rates = stats["rates"] = server.queue_rates(queue)
    stats["diagnosis"] = maintenance.diagnose(
        server.core, queue, stats, now, draining=server.draining,
        schema_recent=rates["schema_refused"], deliver_rate=rates["delivered"],
        rate_window=server.rates.window_s)
    return stats


async def published_at(server: Server, log: Any, seq: int | None) -> float | None:
    """When message ``seq`` of ``log`` (or the next live one) was published; from memory
    when it is there, else one storage read."""
    if seq is None:
        return None
    found = log.lookup(seq)
    if isinstance(found, Msg):
        return found.published_at
    msgs = await server.read_messages(log.name, seq, log.end, 1)
    return msgs[0].published_at if msgs else None


def message_view(m: Msg, attempts: int = 0) -> dict[str, Any]:
    """A stored message as JSON: the payload parsed (JSON) or base64 (raw)."""
    import msgspec

    if m.raw:
        payload: Any = None
        payload_base64: str | None = base64.b64encode(m.data).decode()
    else:
        payload, payload_base64 = msgspec.json.decode(m.data), None
    return {"channel": m.channel, "seq": m.seq, "id": m.id, "published_at": m.published_at,
            "priority": m.priority, "headers": m.headers or {}, "key": m.key,
            "expires_at": m.expires_at, "deliver_at": m.deliver_at, "size": len(m.data),
            "attempts": attempts, "payload": payload, "payload_base64": payload_base64}


async def _browse(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    channel = _str_arg(args, "channel")
    assert channel is not None
    validate_channel(channel)
    from_seq = _int_arg(args, "from_seq", 0, 0, MAX_FROM_SEQ)
    limit = _int_arg(args, "limit", DEFAULT_BROWSE, 1, MAX_BROWSE)
    log = server.core.channels.get(channel)
    if log is None:
        raise NotFound(f"no channel {channel!r}")
    msgs = await server.read_messages(channel, max(from_seq, log.first_seq), log.end, limit)
    attempts = {}
    for gc in log.states:
        for seq, n in gc.attempts.items():
            attempts[seq] = max(attempts.get(seq, 0), n)
    next_seq = page_end(msgs, limit, STORAGE_READ_BYTES, log.end)
    return {"channel": channel, "first_seq": log.first_seq, "next_seq": next_seq,
            "end": log.end, "messages": [message_view(m, attempts.get(m.seq, 0)) for m in msgs]}


def _purge(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    queue = _queue_arg(args)
    channel_id = _str_arg(args, "channel", required=False)
    logs = maintenance.channels_of(server.core, queue, channel_id)
    if not logs:
        _known_or_not_found(server, queue, channel_id)
    removed = {log.name: maintenance.purge(server.core, log) for log in logs}
    server.engine.changed()
    return {"queue": queue, "purged": removed, "messages": sum(removed.values())}


def _delete_messages(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """Delete messages of one channel by seq: an admin, or a client that may write the
    channel (``XDEL`` on the Redis port)."""
    channel = _str_arg(args, "channel")
    assert channel is not None
    validate_channel(channel)
    if caller is not None:
        server.access_for(caller).check_write(channel)
    seqs = _seqs_arg(args)
    log = server.core.channels.get(channel)
    deleted = maintenance.delete_messages(server.core, log, seqs) if log is not None else []
    if deleted:
        server.engine.changed()
    return {"channel": channel, "deleted": deleted, "messages": len(deleted)}


def _seqs_arg(args: dict[str, Any]) -> list[int]:
    """``seqs``: one seq, or several separated by commas (arguments are scalars)."""
    value = args.get("seqs")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise BadRequest("give seqs: a message seq, or several separated by commas")
    parts = value.split(",")
    if len(parts) > MAX_DELETE:
        raise BadRequest(f"at most {MAX_DELETE} seqs at once (got {len(parts)})")
    seqs = []
    for part in parts:
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or not 1 <= int(part) <= MAX_FROM_SEQ:
            raise BadRequest(f"seqs: {part[:32]!r} is not a message seq (1..{MAX_FROM_SEQ})")
        seqs.append(int(part))
    return seqs


def _known_or_not_found(server: Server, queue: str, channel_id: str | None) -> None:
    """Nothing to remove: fine for a known queue's dead letters, NotFound otherwise (an
    unknown name is more often a typo than an empty queue)."""
    live = queue.removeprefix(DEAD_PREFIX)
    if queue.startswith(DEAD_PREFIX) and maintenance.channels_of(server.core, live, channel_id):
        return
    if channel_id:
        raise NotFound(f"queue {live!r} has no channel {channel_id!r}", queue=live,
                       channel=channel_id)
    raise NotFound(f"no queue {live!r}: no channel of it exists (see minou list)", queue=live)


def _delete_group(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    group = _str_arg(args, "group")
    assert group is not None
    members = [m for m in server.core.groups[group].members] if group in server.core.groups \
        else []
    result = maintenance.delete_group(server.core, group, time.time(),
                                      force=bool(args.get("force")))
    server.ended_subscriptions(members, f"group {group!r} was deleted by {_by(caller)}")
    if server.resp_groups is not None:  # its Redis consumer names go with it
        server.resp_groups.group_deleted(group)
    server.engine.changed()
    return result


async def _requeue_dead(server: Server, args: dict[str, Any],
                        caller: Identity | None) -> Any:
    queue = _queue_arg(args)
    if queue.startswith(DEAD_PREFIX):
        queue = queue[len(DEAD_PREFIX):]
    channel_id = _str_arg(args, "channel", required=False)
    limit = _int_arg(args, "limit", DEFAULT_REQUEUE, 1, MAX_REQUEUE)
    # seqs: those dead letters only, of the channel given (of each channel without one)
    seqs = _seqs_arg(args) if args.get("seqs") not in (None, "") else None
    moved: dict[str, int] = {}
    more = False
    for dead in maintenance.channels_of(server.core, DEAD_PREFIX + queue, channel_id):
        if seqs is not None:  # these dead letters only (the dashboard's one message)
            msgs = [m for seq in seqs
                    for m in await server.read_messages(dead.name, seq, seq + 1, 1)]
        else:
            msgs, cut = await _dead_pages(server, dead, limit)
            more = more or cut
        moved[dead.name] = maintenance.requeue_dead(server.core, dead, msgs, time.time())
    server.engine.changed()
    # ``more``: a channel's dead letters passed MAX_REQUEUE_BYTES; requeue again for the rest.
    return {"queue": queue, "requeued": moved, "messages": sum(moved.values()), "more": more}


async def _dead_pages(server: Server, dead: Any, limit: int) -> tuple[list[Msg], bool]:
    """The first ``limit`` dead letters of ``dead``, read a page at a time, and at most
    MAX_REQUEUE_BYTES of them (their copies wait in memory for the commit): whether that
    bound left some behind."""
    msgs: list[Msg] = []
    seq, weight = dead.first_seq, 0
    while len(msgs) < limit and seq < dead.end:
        if weight >= MAX_REQUEUE_BYTES:
            return msgs, True
        want = min(limit - len(msgs), STORAGE_READ_PAGE)
        page = await server.read_messages(dead.name, seq, dead.end, want)
        if not page:
            break
        msgs += page
        weight += sum(map(read_weight, page))
        seq = page_end(page, want, STORAGE_READ_BYTES, dead.end)
    return msgs, False


def _purge_dead(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    queue = _queue_arg(args)
    if not queue.startswith(DEAD_PREFIX):
        queue = DEAD_PREFIX + queue
    return _purge(server, {**args, "queue": queue}, caller)


async def _receipt(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    message_id = _str_arg(args, "id")
    assert message_id is not None
    return await server.message_receipt(message_id)


def _soft_stop(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    return server.soft_stop(_by(caller))


# ----------------------------------------------------------------- clients
def _client_id(args: dict[str, Any]) -> str:
    client_id = _str_arg(args, "client_id")
    assert client_id is not None
    return client_id


def _registry_op(server: Server, action: Callable[[], Any]) -> Any:
    try:
        record = action()
    except KeyError as exc:
        raise NotFound(str(exc.args[0])) from None
    except NotAuthenticated as exc:  # a bad public key given to rotate
        raise BadRequest(exc.message) from None
    server.persist_registry()
    return record.public()


def _clients_list(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """A page of the registered and pending clients (core/paging.py: ``limit``,
    ``after``; ``more``, ``next``, ``total``), with the rules, reservations and writers."""
    after, limit = page_args(args)
    page, more = server.registry.page(after, limit)
    listed = {str(item["client_id"]) for item in page}
    online: dict[str, int] = {}
    for c in server.connections:
        if c.identity is not None and c.identity.client_id in listed:
            online[c.identity.client_id] = online.get(c.identity.client_id, 0) + 1
    rules = server.settings.rules
    out = []
    for item in page:
        client_id = str(item["client_id"])
        item["connections"] = online.get(client_id, 0)
        item["admin"] = server.registry.is_admin(client_id, server.settings.admins)
        # Listed in auth.admins, but its key was registered as a non-admin's.
        item["admin_pending"] = server.registry.admin_pending(client_id,
                                                              server.settings.admins)
        item["access"] = rules.for_client(client_id).describe()
        out.append(item)
    writers = server.core.transactions.writers
    # The first 1,000 only: an answer must fit a frame however many ids clients own.
    return {"clients": out, "more": more,
            "next": str(out[-1]["client_id"]) if out else after,
            "total": len(server.registry.records),
            "reservations": dict(sorted(server.core.reservations.items())),
            "writers": dict(sorted(writers.items())[:1000]), "writers_total": len(writers),
            "rules": rules.describe(), "admins": sorted(server.settings.admins)}


def _approve(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    client_id = _client_id(args)
    result = _registry_op(server, lambda: server.registry.approve(
        client_id, by=_by(caller), admins=server.settings.admins))
    result["admin"] = server.registry.is_admin(client_id, server.settings.admins)
    server.reapply_identities()  # a promotion applies to live connections at once
    return result


def _self(caller: Identity | None, client_id: str) -> bool:
    return caller is not None and caller.client_id == client_id


def _revoke(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    client_id = _client_id(args)
    if _self(caller, client_id):
        raise BadRequest("an admin cannot revoke itself (ask another admin)")
    result = _registry_op(server, lambda: server.registry.revoke(client_id, by=_by(caller)))
    result["connections_closed"] = server.drop_client(
        client_id, f"client {client_id!r} was revoked by {_by(caller)}")
    return result


def _rotate(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    client_id = _client_id(args)
    if client_id not in server.registry.records:
        raise NotFound(f"no client {client_id!r} is registered or pending")
    public_key = args.get("public_key")
    if not isinstance(public_key, str) or not public_key.strip():
        raise BadRequest("give public_key: the new public key (PEM), e.g. from minou keygen")
    result = _registry_op(
        server, lambda: server.registry.rotate(client_id, public_key, by=_by(caller)))
    # Connections authenticated with the old key end now; the new key must reconnect.
    if not _self(caller, client_id):
        result["connections_closed"] = server.drop_client(
            client_id, f"the key of client {client_id!r} was rotated by {_by(caller)}")
    return result


def _forget(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    client_id = _client_id(args)
    if _self(caller, client_id):
        raise BadRequest("an admin cannot forget itself (ask another admin)")
    result = _registry_op(server, lambda: server.registry.forget(client_id))
    result["connections_closed"] = server.drop_client(
        client_id, f"client {client_id!r} was removed by {_by(caller)}")
    return result


# ------------------------------------------------------------- credentials
def _credential_owner(server: Server, caller: Identity | None) -> str | None:
    """Whose credentials the caller may handle: its own, or (admins) anyone's."""
    if caller is None or (caller.admin and caller.method != "credential"):
        return None
    return caller.client_id


def _issue_credential(server: Server, args: dict[str, Any], caller: Identity | None
                      ) -> Any:
    if caller is None or caller.method != "key":
        how = caller.method if caller is not None else "no identity"
        raise NotAuthorized(
            "only a client that proved itself with its own key can issue a credential "
            f"(this connection used {how}); a credential cannot issue another",
            op="credentials.issue")
    owner = server.registry.records.get(caller.client_id)
    if owner is None:
        raise NotFound(f"client {caller.client_id!r} is not registered")
    ttl = check_ttl(args.get("ttl", DEFAULT_CREDENTIAL_TTL_S))
    purpose = _str_arg(args, "purpose", required=False) or ""
    secret, record = server.credentials.issue(owner, ttl=ttl, purpose=purpose)
    server.persist_registry()
    log.info("credential %s issued to %s for %.0f s%s", record.id, owner.client_id, ttl,
             f" ({purpose})" if purpose else "")
    return {**record.public(), "credential": secret}


def _renew_credential(server: Server, args: dict[str, Any], caller: Identity | None
                      ) -> Any:
    """By ``id``, or every live credential of the caller issued for ``purpose``."""
    if caller is not None and caller.method == "credential":
        raise NotAuthorized("a credential cannot renew itself: the holder of the client's "
                            "key renews it", op="credentials.renew")
    ttl = check_ttl(args.get("ttl", DEFAULT_CREDENTIAL_TTL_S))
    owner = _credential_owner(server, caller)
    ids = _credential_ids(server, args, caller)
    renewed = [server.credentials.renew(i, client_id=owner, ttl=ttl).public() for i in ids]
    server.persist_registry()
    return renewed[0] if "id" in args else {"renewed": renewed}


def _revoke_credential(server: Server, args: dict[str, Any], caller: Identity | None
                       ) -> Any:
    """By ``id``, or every live credential of the caller issued for ``purpose``; the
    connections that presented them close."""
    owner = _credential_owner(server, caller)
    revoked, closed = [], 0
    for credential_id in _credential_ids(server, args, caller):
        record = server.credentials.revoke(credential_id, client_id=owner)
        closed += server.drop_client(
            record.client_id, f"credential {record.id!r} was revoked by {_by(caller)}",
            credential=record.id)
        log.info("credential %s of %s revoked by %s", record.id, record.client_id,
                 _by(caller))
        revoked.append(record.public())
    server.persist_registry()
    if "id" in args:
        return {**revoked[0], "connections_closed": closed}
    return {"revoked": revoked, "connections_closed": closed}


def _credential_ids(server: Server, args: dict[str, Any], caller: Identity | None
                    ) -> list[str]:
    if "id" in args:
        return [str(_str_arg(args, "id"))]
    purpose = _str_arg(args, "purpose", required=False)
    if purpose is None or caller is None:
        raise BadRequest("give id (one credential) or purpose (all of yours issued for it)")
    return [r.id for r in server.credentials.tagged(caller.client_id, purpose, time.time())]


def _list_credentials(server: Server, args: dict[str, Any], caller: Identity | None
                      ) -> Any:
    """A page of the live credentials the caller may see (core/paging.py: ``limit``,
    ``after``; ``more``, ``next``, ``total``), sorted by id: up to 50,000 of up to
    200-character purposes listed whole passed the frame limit."""
    after, limit = page_args(args)
    page, more, total = server.credentials.page(_credential_owner(server, caller), after,
                                                limit)
    return {"credentials": page, "more": more,
            "next": str(page[-1]["id"]) if page else after, "total": total}


def _release(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    channel = _str_arg(args, "channel")
    assert channel is not None
    owner = server.core.release(channel)
    if owner is None:
        raise NotFound(f"channel {channel!r} is not reserved")
    server.engine.commit(urgent=False)
    return {"channel": channel, "released_from": owner}


def _release_writer(server: Server, args: dict[str, Any], caller: Identity | None
                    ) -> Any:
    """Free a writer id (TXN_COMMIT) for the next client that commits under it; with
    ``drop_fences`` also forget its fences (after a squatter moved them)."""
    writer_id = _str_arg(args, "writer_id")
    assert writer_id is not None
    drop = args.get("drop_fences", False)
    if not isinstance(drop, bool):
        raise BadRequest("drop_fences must be true or false")
    owner = server.core.release_writer(writer_id, drop_fences=drop)
    if owner is None and not drop:
        raise NotFound(f"writer id {writer_id!r} belongs to no client")
    server.engine.commit(urgent=False)
    return {"writer_id": writer_id, "released_from": owner, "fences_dropped": drop}


def _reload(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    return server.reload()


def _cluster(server: Server, args: dict[str, Any], caller: Identity | None) -> Any:
    """The brokers sharing this broker's storage and who serves; one broker alone on
    SQLite is a cluster of one."""
    if server.primary is not None:
        return server.primary.view()
    st = server.status()
    me = {"id": st["broker_id"], "role": "primary", "self": True,
          "native": st["native"], "http": st["http"]}
    return {"storage": st["storage"]["path"], "owner_lease": None, "primary": me["id"],
            "brokers": [me], "queues": [], "events": [], "this_broker": None}


OPERATIONS: dict[str, Op] = {
    "status": _status,
    "list": _list,
    "queues": _queues,
    "whoami": _whoami,
    "queue": _queue,
    "browse": _browse,
    "purge": _purge,
    "messages.delete": _delete_messages,
    "group.delete": _delete_group,
    "dead.requeue": _requeue_dead,
    "dead.purge": _purge_dead,
    "receipt": _receipt,
    "soft_stop": _soft_stop,
    "clients.list": _clients_list,
    "clients.approve": _approve,
    "clients.revoke": _revoke,
    "clients.rotate": _rotate,
    "clients.forget": _forget,
    "reservations.release": _release,
    "writers.release": _release_writer,
    "reload": _reload,
    "cluster": _cluster,
    "credentials.issue": _issue_credential,
    "credentials.renew": _renew_credential,
    "credentials.revoke": _revoke_credential,
    "credentials.list": _list_credentials,
    **kv.OPERATIONS,
    REQUEST_OP: request_op,
    **federation.OPERATIONS,
}


def run_admin(server: Server, op: str, args: dict[str, Any],
              caller: Identity | None = None) -> Any | Awaitable[Any]:
    handler = OPERATIONS.get(op)
    if handler is None:
        raise BadRequest(f"unknown admin operation {op!r} (known: {', '.join(OPERATIONS)})")
    if not isinstance(args, dict):
        raise BadRequest("admin arguments must be a map")
    for name, value in args.items():  # every operation takes scalars: no deep values
        if not isinstance(value, str | int | float | bool | None):
            raise BadRequest(f"admin argument {str(name)[:64]!r} must be a string, a number, "
                             "a boolean or null")
    refuse_credential(op, caller)
    return handler(server, args, caller)


def refuse_credential(op: str, caller: Identity | None) -> None:
    """NotAuthorized for an admin operation asked with a delegated credential (an
    admin's too: its identity says admin, for its reading rights). Checked here and
    by every door before it forwards an operation to another broker, whose link
    speaks for the client without saying how it proved itself."""
    if caller is not None and caller.method == "credential" and op not in SELF_SERVICE_OPS:
        raise NotAuthorized(
            f"admin operation {op!r} refused: this connection presented a delegated "
            "credential, which never carries admin rights", op=op)
