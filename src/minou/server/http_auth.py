"""Who an HTTP request is: ``Authorization: Bearer <token>``.

The bearer is either a JWT the client signed with its registered key (the same
claims as on the native protocol: ``iss`` client id, ``aud`` broker id, at most
an hour long), or the broker token when one is configured (its holders are
admins). A JWT may be reused until it expires, as bearer tokens are; verified
ones are cached until then, and every use re-checks that the client is still
active with the same key, so a revocation or rotation applies at once. In the
development mode (``--dev``, loopback only) requests need no token.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from typing import TYPE_CHECKING, Any

from ..auth.credentials import looks_like_credential
from ..auth.registry import ACTIVE, PENDING, Identity
from ..auth.tokens import unverified_issuer, verify_token
from ..errors import NotAuthenticated, PendingApproval
from ..limits import HTTP_TOKEN_CACHE
from . import oplog

if TYPE_CHECKING:
    from .ports import Server


class HttpAuth:
    def __init__(self, server: Server) -> None:
        self.server = server
        self._cache: dict[str, tuple[Identity, float]] = {}

    def identify(self, authorization: str | None, query_token: str | None = None,
                 peer: Any = None) -> Identity:
        """The caller's identity, or NotAuthenticated saying what is missing or wrong
        (logged for the operator with the peer's address)."""
        try:
            return self._identify(authorization, query_token)
        except NotAuthenticated as exc:
            token = _bearer(authorization) if authorization else query_token
            claimed = None
            with contextlib.suppress(Exception):  # only to name the caller in the log
                claimed = unverified_issuer(token) if token else None
            oplog.refused(exc, claimed, peer, "HTTP")
            raise

    def _identify(self, authorization: str | None, query_token: str | None) -> Identity:
        settings = self.server.settings
        if settings.auth_mode == "off":
            return Identity("http-dev", True, method="development")
        token = _bearer(authorization) if authorization else query_token
        if not token:
            raise NotAuthenticated(
                "this request needs Authorization: Bearer <token> (a JWT signed with your "
                "client key, e.g. from `minou token`, or the broker token)", why="no_token")
        if settings.broker_token is not None and hmac.compare_digest(
                token.encode(), settings.broker_token.encode()):
            return Identity("broker-token", True, method="broker_token")
        if settings.auth_mode == "token":
            self.server.registry.failures["bad_broker_token"] += 1
            raise NotAuthenticated("the broker token does not match", why="bad_broker_token")
        if looks_like_credential(token):
            return self.server.delegated(token)
        return self._jwt(token)

    def _jwt(self, token: str) -> Identity:
        now = time.time()
        registry = self.server.registry
        cached = self._cache.get(token)
        if cached is not None and cached[1] > now:
            identity = cached[0]
            record = registry.records.get(identity.client_id)
            if record is not None and record.status == ACTIVE and \
                    record.fingerprint == identity.fingerprint:
                return self._with_admin(identity)
            del self._cache[token]
        try:
            client_id = unverified_issuer(token)
            record = registry.records.get(client_id)
            if record is None:
                raise NotAuthenticated(
                    f"client {client_id!r} is not registered: connect once with its key "
                    "(e.g. `minou whoami --key ...`) so an admin can approve it",
                    why="unknown_client")
            claims = verify_token(token, registry._key(record), client_id=client_id,
                                  audience=self.server.core.broker_id, now=now)
            if str(claims.get("jti")) in registry.replay:
                raise NotAuthenticated(
                    "this token opened a native connection (single use there); sign "
                    "another one for HTTP", why="replayed_jti")
            if record.status == PENDING:
                raise PendingApproval(f"client {client_id!r} waits for an admin's approval",
                                      why="pending")
            if record.status != ACTIVE:
                raise NotAuthenticated(f"client {client_id!r} is {record.status}",
                                       why=record.status)
        except NotAuthenticated as exc:
            registry.failures[str(exc.detail.get("why", "token"))] += 1
            raise
        record.last_seen = now
        identity = Identity(client_id, False, record.fingerprint)
        if len(self._cache) >= HTTP_TOKEN_CACHE:
            self._cache.clear()
        self._cache[token] = (identity, float(claims["exp"]))
        return self._with_admin(identity)

    def _with_admin(self, identity: Identity) -> Identity:
        # Admin rights follow the live config (a reload may change auth.admins) and the
        # registry (an id listed there needs its key approved as an admin's).
        admin = self.server.registry.is_admin(identity.client_id, self.server.settings.admins)
        if admin == identity.admin:
            return identity
        return Identity(identity.client_id, admin, identity.fingerprint, identity.method)


def _bearer(header: str) -> str | None:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise NotAuthenticated("the Authorization header must be 'Bearer <token>'",
                               why="bad_header")
    return value.strip()
