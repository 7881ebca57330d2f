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

from ..errors import ConfigError, NotAuthenticated, PendingApproval
from .keys import PublicKey, fingerprint, load_public, public_pem
from .tokens import ReplayGuard, algorithm_for, verify_token

ACTIVE, PENDING, REVOKED = "active", "pending", "revoked"
MAX_PENDING = 1000  # unknown clients cannot grow the registry without bound
MAX_PUBLIC_KEY_BYTES = 4096


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

    def public(self) -> dict[str, object]:
        return {
            "client_id": self.client_id, "fingerprint": self.fingerprint,
            "algorithm": self.algorithm, "status": self.status,
            "created_at": self.created_at, "updated_at": self.updated_at,
            "last_seen": self.last_seen, "note": self.note,
        }


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
    method: str = "key"  # "key", "broker_token" or "development"


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
    def __init__(self, records: Iterable[ClientRecord] = ()) -> None:
        self.records: dict[str, ClientRecord] = {r.client_id: r for r in records}
        self.replay = ReplayGuard()
        self.failures: Counter[str] = Counter()  # why authentications failed, for metrics
        self._keys: dict[str, PublicKey] = {}
        self._changes: dict[str, ClientRecord | None] = {}

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
    ) -> Identity:
        """Verify ``token`` for ``client_id``; register a first-seen key. Raises
        NotAuthenticated (or PendingApproval) with a precise reason."""
        moment = time.time() if now is None else now
        try:
            return self._authenticate(client_id, token, public_key, audience, admins, accepts,
                                      moment)
        except NotAuthenticated as exc:
            self.failures[str(exc.detail.get("why", "token"))] += 1
            raise

    def _authenticate(self, client_id: str, token: str, public_key: str | None, audience: str,
                      admins: frozenset[str], accepts: Callable[[str], bool | None],
                      now: float) -> Identity:
        record = self.records.get(client_id)
        if record is None:
            return self._first_contact(client_id, token, public_key, audience, admins, accepts,
                                       now)
        if record.status == REVOKED:
            raise NotAuthenticated(f"client {client_id!r} is revoked; an admin can approve it "
                                   "again", why="revoked")
        if public_key is not None and public_key.strip() != record.public_key.strip() and \
                (presented := fingerprint(parse_public_key(public_key))) != record.fingerprint:
            raise NotAuthenticated(
                f"client {client_id!r} is registered with key {record.fingerprint}, not "
                f"{presented}; an admin can rotate it (minou clients rotate)", why="other_key")
        verify_token(token, self._key(record), client_id=client_id, audience=audience,
                     replay=self.replay, now=now)
        if record.status == PENDING:
            raise PendingApproval(
                f"client {client_id!r} (key {record.fingerprint}) waits for an admin's "
                f"approval: minou clients approve {client_id}", why="pending",
                fingerprint=record.fingerprint)
        record.last_seen = now  # kept in memory; saved with the record's next change
        return Identity(client_id, client_id in admins, record.fingerprint)

    def _first_contact(self, client_id: str, token: str, public_key: str | None, audience: str,
                       admins: frozenset[str], accepts: Callable[[str], bool | None],
                       now: float) -> Identity:
        if public_key is None:
            raise NotAuthenticated(
                f"client {client_id!r} is not registered; present its public key on the first "
                "connection", why="unknown_client")
        key = parse_public_key(public_key)
        # The token must verify with the presented key: only its holder can register it.
        verify_token(token, key, client_id=client_id, audience=audience, replay=self.replay,
                     now=now)
        accepted = client_id not in admins and accepts(client_id) is True
        if not accepted and sum(r.status == PENDING for r in self.records.values()) >= MAX_PENDING:
            raise NotAuthenticated(f"{MAX_PENDING} clients already wait for approval; "
                                   "new ones are refused until an admin decides",
                                   why="too_many_pending")
        record = ClientRecord(
            client_id=client_id, public_key=canonical_pem(key), fingerprint=fingerprint(key),
            algorithm=algorithm_for(key), status=ACTIVE if accepted else PENDING,
            created_at=now, updated_at=now,
            note="auto-accepted by a rule" if accepted else "first connection",
            last_seen=now,
        )
        self._save(record)
        if not accepted:
            raise PendingApproval(
                f"client {client_id!r} (key {record.fingerprint}) is new and waits for an "
                f"admin's approval: minou clients approve {client_id}", why="pending",
                fingerprint=record.fingerprint)
        return Identity(client_id, False, record.fingerprint)

    # ----------------------------------------------------------------- admin
    def _get(self, client_id: str) -> ClientRecord:
        record = self.records.get(client_id)
        if record is None:
            raise KeyError(f"no client {client_id!r} is registered or pending")
        return record

    def register(self, client_id: str, public_key: str, *, note: str,
                 now: float | None = None) -> ClientRecord:
        """Record ``public_key`` for ``client_id`` as active (the broker's own admin key)."""
        key = parse_public_key(public_key)
        moment = time.time() if now is None else now
        record = ClientRecord(
            client_id=client_id, public_key=canonical_pem(key), fingerprint=fingerprint(key),
            algorithm=algorithm_for(key), status=ACTIVE, created_at=moment, updated_at=moment,
            note=note)
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

    def approve(self, client_id: str, *, by: str, now: float | None = None) -> ClientRecord:
        return self._set_status(client_id, ACTIVE, f"approved by {by}", now)

    def revoke(self, client_id: str, *, by: str, now: float | None = None) -> ClientRecord:
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
