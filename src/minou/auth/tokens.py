"""Short-lived tokens a client signs with its own key, and their verification.

The algorithm is fixed by the registered key's type (Ed25519 -> EdDSA, P-256 ->
ES256, RSA -> RS256), never taken from the token's header: ``alg: none``, HMAC
and algorithm confusion are refused before any signature check.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, NoReturn

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..errors import NotAuthenticated
from ..limits import (
    CLOCK_LEEWAY_S,
    DEFAULT_TOKEN_TTL_S,
    MAX_JTI_CHARS,
    MAX_TOKEN_BYTES,
    MAX_TOKEN_LIFETIME_S,
    MIN_RSA_BITS,
    REPLAY_GUARD_CAPACITY,
    REPLAY_GUARD_PER_CLIENT,
)
from .keys import PrivateKey, PublicKey

REQUIRED_CLAIMS = ("iss", "aud", "exp", "iat", "jti")
LATEST_NUMERIC_DATE = 253_402_300_799  # 9999-12-31T23:59:59Z: a later exp or iat is no date


def algorithm_for(key: PrivateKey | PublicKey) -> str:
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "EdDSA"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise NotAuthenticated(f"EC keys must use P-256, not {key.curve.name}")
        return "ES256"
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise NotAuthenticated(f"RSA keys must have at least {MIN_RSA_BITS} bits")
        return "RS256"
    raise NotAuthenticated(f"unsupported key type {type(key).__name__}")


def make_token(client_id: str, key: PrivateKey, audience: str, *,
               ttl: float = DEFAULT_TOKEN_TTL_S, now: float | None = None) -> str:
    """A token proving ``client_id`` to broker ``audience`` for ``ttl`` seconds."""
    issued = int(now if now is not None else time.time())
    claims = {"iss": client_id, "aud": audience, "iat": issued, "exp": issued + int(ttl),
              "jti": os.urandom(12).hex()}
    return jwt.encode(claims, key, algorithm=algorithm_for(key))  # type: ignore[arg-type]


class ReplayGuard:
    """Remembers every jti until its token expires, to refuse a replayed token. The
    broker stores them too (``take_new``, ``load``), so a restart forgets none.

    Only tokens of registered, active clients are remembered (the registry checks
    the status first), each client holds at most ``per_client`` ids, and admins may
    go past the shared ``capacity``: no stranger and no single client can fill it and
    lock the others out."""

    def __init__(self, *, capacity: int = REPLAY_GUARD_CAPACITY,
                 per_client: int = REPLAY_GUARD_PER_CLIENT) -> None:
        self._seen: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._per: dict[str, int] = {}
        self._capacity = capacity
        self._per_client = per_client
        self._new: list[tuple[str, float]] = []

    def load(self, used: Iterable[tuple[str, float]], now: float) -> None:
        for jti, expires in sorted(used, key=lambda item: item[1]):
            if expires > now:
                self._seen[jti] = (expires, "")  # stored without their client

    def __contains__(self, jti: str) -> bool:
        return jti in self._seen

    def __len__(self) -> int:
        return len(self._seen)

    def take_new(self) -> list[tuple[str, float]]:
        """The jtis remembered since the last call, for storage."""
        new, self._new = self._new, []
        return new

    def check_and_remember(self, jti: str, expires: float, now: float, *, client: str = "",
                           privileged: bool = False) -> None:
        seen, per = self._seen, self._per
        while seen and next(iter(seen.values()))[0] < now:
            _, (_, owner) = seen.popitem(last=False)
            if owner:
                left = per.get(owner, 1) - 1
                if left > 0:
                    per[owner] = left
                else:
                    per.pop(owner, None)
        if jti in seen:
            raise NotAuthenticated("token already used (replayed jti); sign a new one",
                                   reason_detail="replayed_jti")
        # Forgetting an unexpired id would let a captured token in again: refuse (for at
        # most a token's lifetime) rather than evict.
        if client and per.get(client, 0) >= self._per_client:
            raise NotAuthenticated(
                f"client {client!r} opened {self._per_client} connections with tokens that "
                "have not expired yet; try again in a minute (or sign shorter-lived tokens)",
                reason_detail="replay_guard_client_full", why="busy")
        if len(seen) >= self._capacity and not privileged:
            raise NotAuthenticated(
                f"{len(seen)} connections were opened with tokens that have not "
                "expired yet; try again in a minute", reason_detail="replay_guard_full",
                why="busy")
        seen[jti] = (expires, client)
        if client:
            per[client] = per.get(client, 0) + 1
        self._new.append((jti, expires))


def unverified_issuer(token: str) -> str:
    """The client id a token claims, to find its registered key (then verify!)."""
    _check_size(token)
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except (jwt.PyJWTError, ValueError, RecursionError) as exc:  # some PyJWTs let these out
        raise NotAuthenticated(f"token is not a JWT: {exc}") from None
    iss = claims.get("iss")
    if iss is None:
        raise NotAuthenticated("token lacks the iss claim (the client id)", claim="iss")
    if not isinstance(iss, str) or not iss:
        _bad_claim("iss", "must be a non-empty string (the client id)", iss)
    return iss


def _check_size(token: str) -> None:
    if not isinstance(token, str) or not token:
        raise NotAuthenticated("no token")
    if len(token) > MAX_TOKEN_BYTES:
        raise NotAuthenticated(f"token is {len(token)} bytes, the limit is {MAX_TOKEN_BYTES}")


def verify_token(token: str, key: PublicKey, *, client_id: str, audience: str,
                 replay: ReplayGuard | None = None, now: float | None = None,
                 leeway: float = CLOCK_LEEWAY_S) -> dict[str, Any]:
    """Check ``token`` against ``client_id``'s registered public ``key``; return its claims.

    Raises NotAuthenticated with a precise reason for every way a token can be wrong.
    """
    _check_size(token)
    expected = algorithm_for(key)
    try:
        header = jwt.get_unverified_header(token)
    except (jwt.PyJWTError, ValueError, RecursionError) as exc:
        raise NotAuthenticated(f"token is not a JWT: {exc}") from None
    alg = header.get("alg")
    if alg != expected:
        raise NotAuthenticated(
            f"token algorithm {alg!r} is refused: client {client_id!r} is registered with a "
            f"key that signs {expected}"
        )
    moment = now if now is not None else time.time()
    try:
        # The signature only: every claim is checked below, strictly and with our clock.
        claims = jwt.decode(token, key, algorithms=[expected],  # type: ignore[arg-type]
                            options=_SIGNATURE_ONLY)
    except jwt.InvalidSignatureError:
        raise NotAuthenticated(
            f"token signature does not match the key registered for {client_id!r}") from None
    except (jwt.PyJWTError, ValueError, RecursionError) as exc:
        raise NotAuthenticated(f"token refused: {exc}") from None
    _check_claims(claims, client_id=client_id, audience=audience, now=moment, leeway=leeway)
    if replay is not None:
        replay.check_and_remember(claims["jti"], float(claims["exp"]), moment)
    return claims


# PyJWT's own claim checks let NaN through when told the time, and raise TypeError on
# a string exp: they are off, and _check_claims does them all.
_SIGNATURE_ONLY: Any = {
    "verify_signature": True, "require": [], "verify_exp": False, "verify_nbf": False,
    "verify_iat": False, "verify_aud": False, "verify_iss": False, "verify_sub": False,
    "verify_jti": False,
}


def _check_claims(claims: dict[str, Any], *, client_id: str, audience: str, now: float,
                  leeway: float) -> None:
    """Every claim minou reads has the right type and a finite value, or NotAuthenticated
    names it (``detail.claim``)."""
    for name in REQUIRED_CLAIMS:
        if claims.get(name) is None:
            raise NotAuthenticated(f"token lacks the {name} claim", claim=name)
    iss, aud, jti = claims["iss"], claims["aud"], claims["jti"]
    if not isinstance(iss, str) or not iss:
        _bad_claim("iss", "must be a non-empty string (the client id)", iss)
    if not (isinstance(aud, str) or (isinstance(aud, list) and aud and
                                     all(isinstance(a, str) for a in aud))):
        _bad_claim("aud", "must be a string (the broker id) or a list of strings", aud)
    if not isinstance(jti, str) or not 1 <= len(jti) <= MAX_JTI_CHARS:
        _bad_claim("jti", f"must be a string of 1..{MAX_JTI_CHARS} characters", jti)
    exp, iat = _numeric_date(claims, "exp"), _numeric_date(claims, "iat")
    nbf = _numeric_date(claims, "nbf") if claims.get("nbf") is not None else None
    if iss != client_id:
        raise NotAuthenticated(f"token was issued by {iss!r}, not {client_id!r}", claim="iss")
    if aud != audience and not (isinstance(aud, list) and audience in aud):
        raise NotAuthenticated(f"token is for another broker (aud is not {audience!r})",
                               claim="aud")
    if exp + leeway < now:
        raise NotAuthenticated("token expired; sign a new one", claim="exp")
    if iat - leeway > now or (nbf is not None and nbf - leeway > now):
        raise NotAuthenticated("token is not valid yet (issued in the future: check the clock)",
                               claim="iat" if iat - leeway > now else "nbf")
    if exp - iat > MAX_TOKEN_LIFETIME_S:
        raise NotAuthenticated(
            f"token lives {exp - iat:.0f} s; the limit is {MAX_TOKEN_LIFETIME_S:.0f} s",
            claim="exp")


def _numeric_date(claims: dict[str, Any], name: str) -> float:
    """A NumericDate claim (RFC 7519: seconds since 1970) as a float: a JSON number
    (not a bool, a string, NaN or an infinity) between 1970 and the year 9999."""
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        _bad_claim(name, "must be a number of seconds since 1970", value)
    if not 0 <= value <= LATEST_NUMERIC_DATE:  # NaN fails this too
        _bad_claim(name, "must be a finite number of seconds since 1970 (before the year "
                         "10000)", value)
    return float(value)


def _bad_claim(name: str, rule: str, value: object) -> NoReturn:
    try:
        shown = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        shown = type(value).__name__
    if len(shown) > 40:
        shown = shown[:37] + "..."
    raise NotAuthenticated(f"token claim {name} {rule}, not {shown}", claim=name)
