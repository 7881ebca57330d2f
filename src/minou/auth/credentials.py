"""Delegated credentials: a secret a client hands to work it runs elsewhere. No I/O.

A Spark driver holds the client's private key; its executors are other machines
that should never see it. As with Kafka's delegation tokens, the driver (proved
by its key) asks the broker for a credential: the same client id and rules, a
bounded lifetime the driver extends while the job runs (``renew``), usable by
any number of connections until it expires or is revoked. A credential gives
no admin rights even to an admin, and cannot issue further credentials.

The broker keeps only a SHA-256 of the secret (the secret is 256 random bits, so
a fast hash is enough), the owner's key fingerprint (a rotated key voids every
credential issued under the old one) and the expiry. Every change is returned
to the caller to persist (``take_changes``), as the key registry does.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import secrets
import time
from collections.abc import Iterable

import msgspec

from ..core.paging import page_of
from ..errors import BadRequest, NotAuthenticated, NotFound
from ..limits import (
    MAX_CREDENTIAL_TTL_S,
    MAX_CREDENTIALS,
    MAX_CREDENTIALS_PER_CLIENT,
    MAX_PURPOSE_CHARS,
    MIN_CREDENTIAL_TTL_S,
)
from .registry import ACTIVE, REVOKED, ClientRecord

PREFIX = "mdc1"  # minou delegated credential, format 1: mdc1.<id>.<secret>
MAX_CREDENTIAL_CHARS = 128  # a real one is 65; more is an attack or a mistake
EXPIRED_KEPT_S = 3600.0  # an expired credential is remembered this long (for its error)


class Credential(msgspec.Struct, kw_only=True):
    id: str  # public handle (in logs, listings, revocations); never the secret
    client_id: str
    fingerprint: str  # of the owner's key when issued
    secret_sha256: str
    issued_at: float
    expires_at: float
    purpose: str = ""
    renewed_at: float | None = None

    def public(self) -> dict[str, object]:
        return {"id": self.id, "client_id": self.client_id, "purpose": self.purpose,
                "issued_at": self.issued_at, "expires_at": self.expires_at,
                "renewed_at": self.renewed_at}


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Credential).decode


def encode_credential(record: Credential) -> bytes:
    return _encode(record)


def decode_credential(blob: bytes) -> Credential:
    return _decode(blob)


def looks_like_credential(token: str) -> bool:
    """Whether a bearer token is a delegated credential rather than a JWT."""
    return token.startswith(PREFIX + ".")


def check_ttl(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not MIN_CREDENTIAL_TTL_S <= value <= MAX_CREDENTIAL_TTL_S:  # NaN fails too
        raise BadRequest(f"ttl must be a number of seconds {MIN_CREDENTIAL_TTL_S:g}.."
                         f"{MAX_CREDENTIAL_TTL_S:g}, not {str(value)[:40]}")
    return float(value)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Credentials:
    def __init__(self, records: Iterable[Credential] = ()) -> None:
        self.records: dict[str, Credential] = {r.id: r for r in records}
        self._changes: dict[str, Credential | None] = {}
        self._missing: set[str] = set()  # refresh(): not in storage at the last one
        # (expires_at, id) of every expiry still to come, for lapsed(): the connections
        # a credential opened end with it. A renewal pushes its new end; the old entry
        # is skipped when it comes up.
        self._ends: list[tuple[float, str]] = [(r.expires_at, r.id)
                                               for r in self.records.values()]
        heapq.heapify(self._ends)

    def __len__(self) -> int:
        return len(self.records)

    def take_changes(self) -> dict[str, Credential | None]:
        changes, self._changes = self._changes, {}
        return changes

    def refresh(self, stored: Iterable[Credential]) -> set[str]:
        """Take the credentials another broker stored (issued, renewed or revoked
        there), keeping those changed here and not yet stored; return those gone from
        storage (the connections that presented them must go here too)."""
        fresh = {r.id: r for r in stored}
        # Missing twice in a row (once may be one this broker issued and is still
        # writing): revoked or expired elsewhere.
        missing = {c for c in self.records if c not in fresh and c not in self._changes}
        gone = missing & self._missing
        for credential_id in gone:
            del self.records[credential_id]
        self._missing = missing - self._missing
        for credential_id, record in fresh.items():
            if credential_id not in self._changes:
                mine = self.records.get(credential_id)
                if mine is None or mine.expires_at != record.expires_at:
                    self._will_end(record)
                self.records[credential_id] = record
        return gone

    def _save(self, record: Credential) -> None:
        self.records[record.id] = record
        self._changes[record.id] = record
        self._will_end(record)

    def _will_end(self, record: Credential) -> None:
        ends = self._ends
        if len(ends) > 4 * len(self.records) + 1024:  # renewals left stale entries
            ends[:] = [(r.expires_at, r.id) for r in self.records.values()]
            heapq.heapify(ends)
        heapq.heappush(ends, (record.expires_at, record.id))

    def lapsed(self, now: float) -> set[str]:
        """The credentials that expired since the last call (and were not renewed in
        time): the connections that presented them must go, as on a revocation."""
        ended: set[str] = set()
        ends = self._ends
        while ends and ends[0][0] <= now:
            _, credential_id = heapq.heappop(ends)
            record = self.records.get(credential_id)
            # Gone (expired and forgotten, or revoked: cutting again is harmless), or
            # ended at this entry's time rather than renewed past it.
            if record is None or record.expires_at <= now:
                ended.add(credential_id)
        return ended

    def _drop(self, credential_id: str) -> None:
        if self.records.pop(credential_id, None) is not None:
            self._changes[credential_id] = None

    # ------------------------------------------------------------------ issue
    def issue(self, owner: ClientRecord, *, ttl: float, purpose: str = "",
              now: float | None = None) -> tuple[str, Credential]:
        """A new credential for ``owner`` (an active client that just proved its key):
        the secret to hand out (shown once, never stored) and its record."""
        moment = time.time() if now is None else now
        self.expire(moment)
        if len(purpose) > MAX_PURPOSE_CHARS:
            raise BadRequest(f"purpose is {len(purpose)} characters; the limit is "
                             f"{MAX_PURPOSE_CHARS}")
        held = sum(1 for r in self.records.values() if r.client_id == owner.client_id)
        if held >= MAX_CREDENTIALS_PER_CLIENT or len(self.records) >= MAX_CREDENTIALS:
            self.expire(moment, kept=0.0)  # expired ones are kept only while there is room
            held = sum(1 for r in self.records.values() if r.client_id == owner.client_id)
        if held >= MAX_CREDENTIALS_PER_CLIENT:
            raise BadRequest(
                f"client {owner.client_id!r} holds {held} unexpired credentials, the limit; "
                "revoke some (minou credential revoke) or issue shorter-lived ones",
                why="too_many_credentials")
        if len(self.records) >= MAX_CREDENTIALS:
            raise BadRequest(f"the broker holds {len(self.records)} unexpired credentials, "
                             "its limit; try again when some expire",
                             why="too_many_credentials")
        credential_id = secrets.token_hex(8)
        secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        record = Credential(id=credential_id, client_id=owner.client_id,
                            fingerprint=owner.fingerprint, secret_sha256=_digest(secret),
                            issued_at=moment, expires_at=moment + check_ttl(ttl),
                            purpose=purpose)
        self._save(record)
        return f"{PREFIX}.{credential_id}.{secret}", record

    def _owned(self, credential_id: str, client_id: str | None) -> Credential:
        record = self.records.get(credential_id)
        if record is None or (client_id is not None and record.client_id != client_id):
            # The same answer for another client's id: ids are not secret, but whose
            # credential exists is none of a stranger's business.
            raise NotFound(f"no credential {credential_id[:40]!r} of yours is live "
                             "(expired, revoked or never issued)", why="no_credential")
        return record

    def renew(self, credential_id: str, *, client_id: str | None, ttl: float,
              now: float | None = None) -> Credential:
        """Extend a live credential to ``now + ttl``; ``client_id`` None: any owner."""
        moment = time.time() if now is None else now
        record = self._owned(credential_id, client_id)
        if record.expires_at <= moment:
            raise NotFound(f"credential {credential_id!r} expired at {record.expires_at:.0f}; "
                             "issue a new one", why="credential_expired")
        record.expires_at = max(record.expires_at, moment + check_ttl(ttl))
        record.renewed_at = moment
        self._save(record)
        return record

    def tagged(self, client_id: str, purpose: str, now: float) -> list[Credential]:
        """``client_id``'s live credentials issued for ``purpose`` (a job's name: the
        process that renews a job's credentials need not know their ids)."""
        return [r for r in self.records.values() if r.client_id == client_id
                and r.purpose == purpose and r.expires_at > now]

    def revoke(self, credential_id: str, *, client_id: str | None) -> Credential:
        record = self._owned(credential_id, client_id)
        self._drop(credential_id)
        return record

    def revoke_client(self, client_id: str) -> list[str]:
        """Drop every credential of a client (revoked, rotated or forgotten)."""
        gone = [r.id for r in self.records.values() if r.client_id == client_id]
        for credential_id in gone:
            self._drop(credential_id)
        return gone

    def expire(self, now: float, kept: float = EXPIRED_KEPT_S) -> int:
        """Forget credentials expired more than ``kept`` seconds ago (until then, one
        presented is refused as expired rather than as unknown)."""
        gone = [r.id for r in self.records.values() if r.expires_at <= now - kept]
        for credential_id in gone:
            self._drop(credential_id)
        return len(gone)

    def live(self, now: float) -> int:
        return sum(1 for r in self.records.values() if r.expires_at > now)

    def listing(self, client_id: str | None = None, now: float | None = None
                ) -> list[dict[str, object]]:
        moment = time.time() if now is None else now
        return [r.public() for r in sorted(self.records.values(), key=lambda r: r.issued_at)
                if (client_id is None or r.client_id == client_id) and r.expires_at > moment]

    def page(self, client_id: str | None, after: str, limit: int, now: float | None = None
             ) -> tuple[list[dict[str, object]], bool, int]:
        """The live credentials of ``client_id`` (None: everyone's) after id ``after``,
        sorted by id, at most ``limit``; whether more follow; how many there are."""
        moment = time.time() if now is None else now
        live = [r.id for r in self.records.values()
                if (client_id is None or r.client_id == client_id) and r.expires_at > moment]
        ids, more = page_of(live, after, limit)
        return [self.records[i].public() for i in ids], more, len(live)

    # ----------------------------------------------------------------- verify
    def verify(self, token: str, owners: dict[str, ClientRecord], *,
               client_id: str | None = None, now: float | None = None) -> Credential:
        """The live credential ``token`` is, whose owner is still active with the key it
        had at issue; else NotAuthenticated saying which of those failed."""
        moment = time.time() if now is None else now
        if not isinstance(token, str) or len(token) > MAX_CREDENTIAL_CHARS:
            raise NotAuthenticated("credential is malformed (too long)", why="bad_credential")
        prefix, _, rest = token.partition(".")
        credential_id, _, secret = rest.partition(".")
        if prefix != PREFIX or not credential_id or not secret:
            raise NotAuthenticated(f"credential is malformed: expected {PREFIX}.<id>.<secret>",
                                   why="bad_credential")
        record = self.records.get(credential_id)
        if record is None or not hmac.compare_digest(_digest(secret), record.secret_sha256):
            raise NotAuthenticated(
                f"credential {credential_id[:40]!r} is unknown to this broker (revoked, "
                "expired and forgotten, or issued by another broker)", why="bad_credential")
        if client_id and client_id != record.client_id:
            raise NotAuthenticated(f"credential {credential_id!r} belongs to client "
                                   f"{record.client_id!r}, not {client_id!r}",
                                   why="bad_credential")
        if record.expires_at <= moment:
            raise NotAuthenticated(
                f"credential {credential_id!r} of client {record.client_id!r} expired "
                f"{moment - record.expires_at:.0f} s ago; the process holding the client's "
                "key must issue or renew one", why="credential_expired")
        owner = owners.get(record.client_id)
        if owner is None or owner.status == REVOKED:
            raise NotAuthenticated(
                f"client {record.client_id!r} is revoked; its credential {credential_id!r} "
                "no longer works", why="revoked")
        if owner.status != ACTIVE:
            raise NotAuthenticated(f"client {record.client_id!r} is {owner.status}",
                                   why=owner.status)
        if owner.fingerprint != record.fingerprint:
            raise NotAuthenticated(
                f"the key of client {record.client_id!r} was rotated after credential "
                f"{credential_id!r} was issued; issue a new one with the new key",
                why="revoked")
        return record
