"""The key registry: which public key proves which client id. No I/O.

A client always presents its public key with its token. The first time a
client id is seen, the key is checked (the token must verify with it, so the
client holds the private key) and recorded: *active* when a rule auto-accepts
the id, otherwise *pending* until an admin approves it. From then on only
tokens signed by the recorded key are accepted for that id. Admin identities
are never auto-accepted: a rule ``client = "*"`` must not let a stranger claim
the admin's name first.

Every change is returned to the caller to persist (``take_changes``); the
server writes them with its next storage commit.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from ..core.paging import page_of
from ..errors import BadRequest, ConfigError, NotAuthenticated, PendingApproval
from ..limits import (
    DEFAULT_MAX_CLIENTS,
    MAX_CLIENT_ID,
    MAX_PENDING_CLIENTS,
    MAX_PENDING_PER_ADDRESS,
    MAX_PUBLIC_KEY_BYTES,
    PENDING_ATTEMPTS,
    REGISTRATIONS_PER_ADDRESS,
)
from ..names import check_label
from .attempts import AttemptLimiter
from .keys import PublicKey, fingerprint, load_public, public_pem
from .tokens import ReplayGuard, algorithm_for, verify_token

ACTIVE, PENDING, REVOKED = "active", "pending", "revoked"


def check_client_id(client_id: str) -> None:
    """A new client's id: 1..200 printable characters without spaces or "/" (one that
    prints like another's, or forges a line of a listing, or a path when it names its
    key file, is refused). Ids registered before this check stay valid."""
    try:
        check_label("client id", client_id, MAX_CLIENT_ID, slash=False)
    except BadRequest as exc:
        raise NotAuthenticated(exc.message, why="client_id") from None

class ClientRecord(msgspec.Struct, kw_only=True):
    client_id: str
    public_key: str  # PEM (SubjectPublicKeyInfo)
    fingerprint: str
    algorithm: str
    status: str
    created_at: float
    updated_at: float
    note: str = ""
    last_seen: float | None = None
    # Whether an admin approved this key as an admin (or the broker made it). Listing an
    # id in auth.admins is not enough: a stranger may have registered that id first
    # through an auto-accepting rule. None: written by an older version (see settle).
    admin_approved: bool | None = None

    def public(self) -> dict[str, object]:
        return {
            "client_id": self.client_id, "fingerprint": self.fingerprint,
            "algorithm": self.algorithm, "status": self.status,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "last_seen": self.last_seen, "note": self.note,
        }


_GONE = ClientRecord(client_id="", public_key="", fingerprint="", algorithm="", status="",
                     created_at=0.0, updated_at=0.0)  # what a forgotten id looks up as
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(ClientRecord).decode


def encode_record(record: ClientRecord) -> bytes:
    return _encode(record)


def decode_record(blob: bytes) -> ClientRecord:
    record = _decode(blob)
    # Recomputed, not trusted: records written before fingerprints took the TLS format
    # (full SHA-256, uppercase) must still match the keys their clients present.
    with contextlib.suppress(ConfigError):
        record.fingerprint = fingerprint(load_public(record.public_key.encode()))
    return record


@dataclass(frozen=True)
class Identity:
    """Who a connection proved to be."""

    client_id: str
    admin: bool
    fingerprint: str = ""
    method: str = "key"  # "key", "credential", "broker_token" or "development"
    credential: str = ""  # the id of the delegated credential it presented


def parse_public_key(pem: str | bytes) -> PublicKey:
    data = pem.encode() if isinstance(pem, str) else pem
    if len(data) > MAX_PUBLIC_KEY_BYTES:
        raise NotAuthenticated(f"public key is {len(data)} bytes; the limit is "
                               f"{MAX_PUBLIC_KEY_BYTES}")
    try:
        key = load_public(data)
        algorithm_for(key)
    except (ConfigError, NotAuthenticated) as exc:
        raise NotAuthenticated(f"public key refused: {exc}", why="bad_key") from None
    return key


def canonical_pem(key: PublicKey) -> str:
    """One text per key (SubjectPublicKeyInfo PEM), whatever encoding was presented."""
    return public_pem(key).decode().strip()


class Registry:
    def __init__(self, records: Iterable[ClientRecord] = (),
                 admins: frozenset[str] = frozenset()) -> None:
        self.records: dict[str, ClientRecord] = {r.client_id: r for r in records}
        self.replay = ReplayGuard()
        self._pending_from: dict[str, str] = {}  # pending client id -> address it came from
        self._pending_attempts = AttemptLimiter(*PENDING_ATTEMPTS)
        # New ids auto-accepted per address: pending ones wait for an admin and are
        # bounded in number, active ones would otherwise come as fast as HELLOs do.
        self._registrations = AttemptLimiter(*REGISTRATIONS_PER_ADDRESS)
        self.failures: Counter[str] = Counter()  # why authentications failed, for metrics
        self._keys: dict[str, PublicKey] = {}
        self._changes: dict[str, ClientRecord | None] = {}
        for record in self.records.values():
            if record.admin_approved is None:
                # Records from before admin approval existed keep the rights they had
                # (their id was an admin at this start), and are saved with the answer.
                record.admin_approved = record.client_id in admins
                self._changes[record.client_id] = record

    # ------------------------------------------------------------------- admins
    def is_admin(self, client_id: str, admins: frozenset[str]) -> bool:
        """Listed in auth.admins AND approved as an admin with its current key."""
        record = self.records.get(client_id)
        return client_id in admins and record is not None and record.admin_approved is True

    def admin_pending(self, client_id: str, admins: frozenset[str]) -> bool:
        """Listed in auth.admins but its key was registered as a non-admin: it waits for
        an admin's approval (``minou clients approve``) before it gets admin rights."""
        record = self.records.get(client_id)
        return client_id in admins and record is not None and record.admin_approved is not True

    def refresh(self, stored: Iterable[ClientRecord]) -> list[str]:
        """Take the records another broker stored (queues spread over brokers: each
        keeps the registry in memory), newer than the ones here and not changed here
        since; returns the client ids no longer allowed with the key they had (revoked,
        or their key rotated): their connections must go."""
        gone: list[str] = []
        for record in stored:
            mine = self.records.get(record.client_id)
            if record.client_id in self._changes or (
                    mine is not None and mine.updated_at >= record.updated_at):
                continue
            if mine is not None and mine.status == ACTIVE and (
                    record.status != ACTIVE or record.fingerprint != mine.fingerprint):
                gone.append(record.client_id)
            self.records[record.client_id] = record
            self._keys.pop(record.client_id, None)
        # A record missing from storage is not dropped here: it may be one this broker
        # made and is still writing (forgetting a client is rare: restart to see it).
        return gone

    def overwrite(self, record: ClientRecord) -> None:
        """The stored record wins over the one here, whatever their times (another
        broker's write landed last over one of this broker's own)."""
        self.records[record.client_id] = record
        self._keys.pop(record.client_id, None)
        self._changes.pop(record.client_id, None)

    # ------------------------------------------------------------ persistence
    def take_changes(self) -> dict[str, ClientRecord | None]:
        changes, self._changes = self._changes, {}
        return changes

    def _save(self, record: ClientRecord) -> None:
        self.records[record.client_id] = record
        self._keys.pop(record.client_id, None)
        self._changes[record.client_id] = record

    def _key(self, record: ClientRecord) -> PublicKey:
        key = self._keys.get(record.client_id)
        if key is None:
            key = self._keys[record.client_id] = parse_public_key(record.public_key)
        return key

    # --------------------------------------------------------- authentication
    def authenticate(
        self,
        *,
        client_id: str,
        token: str,
        public_key: str | None,
        audience: str,
        admins: frozenset[str],
        accepts: Callable[[str], bool | None],
        now: float | None = None,
        address: str = "",
        max_clients: int = DEFAULT_MAX_CLIENTS,
    ) -> Identity:
        """Verify ``token`` for ``client_id``; register a first-seen key. Raises
        NotAuthenticated (or PendingApproval) with a precise reason. ``address`` (the
        peer's host) bounds what one place can register; ``max_clients`` (the config's,
        read at each HELLO so that a reload moves it) what all places can."""
        moment = time.time() if now is None else now
        try:
            return self._authenticate(client_id, token, public_key, audience, admins, accepts,
                                      moment, address, max_clients)
        except NotAuthenticated as exc:
            self.failures[str(exc.detail.get("why", "token"))] += 1
            raise

    def _authenticate(self, client_id: str, token: str, public_key: str | None, audience: str,
                      admins: frozenset[str], accepts: Callable[[str], bool | None],
                      now: float, address: str, max_clients: int) -> Identity:
        record = self.records.get(client_id)
        if record is None:
            return self._first_contact(client_id, token, public_key, audience, admins, accepts,
                                       now, address, max_clients)
        if record.status == REVOKED:
            raise NotAuthenticated(f"client {client_id!r} is revoked; an admin can approve it "
                                   "again", why="revoked")
        if public_key is not None and public_key.strip() != record.public_key.strip() and \
                (presented := fingerprint(parse_public_key(public_key))) != record.fingerprint:
            raise NotAuthenticated(
                f"client {client_id!r} is registered with key {record.fingerprint}, not "
                f"{presented}; an admin can rotate it (minou clients rotate)", why="other_key")
        if record.status == PENDING and not self._pending_attempts.allow(client_id, now):
            raise NotAuthenticated(
                f"client {client_id!r} waits for approval and asked {PENDING_ATTEMPTS[0]} "
                f"times in {PENDING_ATTEMPTS[1]:g} s; ask less often", why="too_many_attempts")
        claims = verify_token(token, self._key(record), client_id=client_id, audience=audience,
                              now=now)
        if record.status == PENDING:
            raise PendingApproval(
                f"client {client_id!r} (key {record.fingerprint}) waits for an admin's "
                f"approval: minou clients approve {client_id}", why="pending",
                fingerprint=record.fingerprint)
        # Remembered only now, for an active client: strangers cannot fill the guard.
        admin = self.is_admin(client_id, admins)
        self.replay.check_and_remember(str(claims["jti"]), float(claims["exp"]), now,
                                       client=client_id, privileged=admin)
        record.last_seen = now  # kept in memory; saved with the record's next change
        return Identity(client_id, admin, record.fingerprint)

    def _first_contact(self, client_id: str, token: str, public_key: str | None, audience: str,
                       admins: frozenset[str], accepts: Callable[[str], bool | None],
                       now: float, address: str, max_clients: int) -> Identity:
        if public_key is None:
            raise NotAuthenticated(
                f"client {client_id!r} is not registered; present its public key on the first "
                "connection", why="unknown_client")
        check_client_id(client_id)
        key = parse_public_key(public_key)
        # The token must verify with the presented key: only its holder can register it.
        claims = verify_token(token, key, client_id=client_id, audience=audience, now=now)
        accepted = client_id not in admins and accepts(client_id) is True
        # Every record is kept in memory and stored for good, whatever its status (a
        # revoked one too: it keeps its id from being claimed again with another key).
        if len(self.records) >= max_clients:
            raise NotAuthenticated(
                f"the broker holds {len(self.records)} clients and the limit is "
                f"{max_clients} (max_clients): new ones are refused, registered ones "
                "connect as before; an admin can forget unused ones (minou clients "
                "forget) or raise max_clients", why="too_many_clients", limit=max_clients)
        if not accepted and sum(r.status == PENDING
                                for r in self.records.values()) >= MAX_PENDING_CLIENTS:
            raise NotAuthenticated(f"{MAX_PENDING_CLIENTS} clients already wait for approval; "
                                   "new ones are refused until an admin decides",
                                   why="too_many_pending")
        if not accepted and address:
            mine = sum(1 for cid, host in self._pending_from.items()
                       if host == address and self.records.get(cid, _GONE).status == PENDING)
            if mine >= MAX_PENDING_PER_ADDRESS:
                raise NotAuthenticated(
                    f"{mine} clients registered from {address} already wait for approval; "
                    "new ones from there are refused until an admin decides",
                    why="too_many_pending")
        if accepted and address and not self._registrations.allow(address, now):
            raise NotAuthenticated(self._registrations_refused(address, now),
                                   why="too_many_registrations")
        if accepted:
            self.replay.check_and_remember(str(claims["jti"]), float(claims["exp"]), now,
                                           client=client_id)
        record = ClientRecord(
            client_id=client_id, public_key=canonical_pem(key), fingerprint=fingerprint(key),
            algorithm=algorithm_for(key), status=ACTIVE if accepted else PENDING,
            created_at=now, updated_at=now,
            note="auto-accepted by a rule" if accepted else "first connection",
            last_seen=now, admin_approved=False,
        )
        self._save(record)
        if not accepted:
            if address:
                if len(self._pending_from) >= MAX_PENDING_CLIENTS * 2:  # forget decided ones
                    self._pending_from = {c: h for c, h in self._pending_from.items()
                                          if self.records.get(c, _GONE).status == PENDING}
                self._pending_from[client_id] = address
            raise PendingApproval(
                f"client {client_id!r} (key {record.fingerprint}) is new and waits for an "
                f"admin's approval: minou clients approve {client_id}", why="pending",
                fingerprint=record.fingerprint)
        return Identity(client_id, False, record.fingerprint)

    def _registrations_refused(self, address: str, now: float) -> str:
        limit, window = REGISTRATIONS_PER_ADDRESS
        if self._registrations.used(address, now) >= limit:
            return (f"{limit} new clients were registered from {address} within {window:g} s; "
                    "new ones from there are refused for the rest of that time, registered "
                    "ones connect as before")
        # The limiter tracks a bounded number of addresses: more at once are refused too.
        return (f"new clients are registering from {self._registrations.max_keys} "
                f"addresses within {window:g} s; new ones are refused for a while, "
                "registered ones connect as before")

    # ----------------------------------------------------------------- admin
    def _get(self, client_id: str) -> ClientRecord:
        record = self.records.get(client_id)
        if record is None:
            raise KeyError(f"no client {client_id!r} is registered or pending")
        return record

    def register(self, client_id: str, public_key: str, *, note: str,
                 now: float | None = None) -> ClientRecord:
        """Record ``public_key`` for ``client_id`` as active (the broker's own admin key)."""
        check_client_id(client_id)
        key = parse_public_key(public_key)
        moment = time.time() if now is None else now
        record = ClientRecord(
            client_id=client_id, public_key=canonical_pem(key), fingerprint=fingerprint(key),
            algorithm=algorithm_for(key), status=ACTIVE, created_at=moment, updated_at=moment,
            note=note, admin_approved=True)
        self._save(record)
        return record

    def _set_status(self, client_id: str, status: str, note: str,
                    now: float | None) -> ClientRecord:
        record = self._get(client_id)
        record.status = status
        record.updated_at = time.time() if now is None else now
        record.note = note
        self._save(record)
        return record

    def approve(self, client_id: str, *, by: str, admins: frozenset[str] = frozenset(),
                now: float | None = None) -> ClientRecord:
        """Activate a pending or revoked client; for an id in ``admins``, also approve its
        key as an admin's (the one way a registered key gains admin rights)."""
        record = self._get(client_id)
        promote = client_id in admins and record.admin_approved is not True
        if client_id in admins:
            record.admin_approved = True
        note = f"approved as admin by {by}" if promote else f"approved by {by}"
        return self._set_status(client_id, ACTIVE, note, now)

    def revoke(self, client_id: str, *, by: str, now: float | None = None) -> ClientRecord:
        self._get(client_id).admin_approved = False
        return self._set_status(client_id, REVOKED, f"revoked by {by}", now)

    def rotate(self, client_id: str, public_key: str, *, by: str,
               now: float | None = None) -> ClientRecord:
        """Replace the key of ``client_id``; tokens signed by the old key stop working."""
        record = self._get(client_id)
        key = parse_public_key(public_key)
        record.public_key = canonical_pem(key)
        record.fingerprint = fingerprint(key)
        record.algorithm = algorithm_for(key)
        record.status = ACTIVE
        record.updated_at = time.time() if now is None else now
        record.note = f"key rotated by {by}"
        self._save(record)
        return record

    def forget(self, client_id: str) -> ClientRecord:
        """Drop a record (reject a pending client, or let an id register afresh)."""
        record = self._get(client_id)
        del self.records[client_id]
        self._keys.pop(client_id, None)
        self._changes[client_id] = None
        return record

    def listing(self) -> list[dict[str, object]]:
        return [r.public() for _, r in sorted(self.records.items())]

    def page(self, after: str, limit: int) -> tuple[list[dict[str, object]], bool]:
        """The records after client id ``after``, sorted, at most ``limit`` of them;
        whether more follow."""
        ids, more = page_of(self.records, after, limit)
        return [self.records[cid].public() for cid in ids], more
