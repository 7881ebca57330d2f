"""Short-lived tokens a client signs with its own key, and their verification.

The algorithm is fixed by the registered key's type (Ed25519 -> EdDSA, P-256 ->
ES256, RSA -> RS256), never taken from the token's header: ``alg: none``, HMAC
and algorithm confusion are refused before any signature check.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..errors import NotAuthenticated
from .keys import PrivateKey, PublicKey

MAX_TOKEN_BYTES = 4096  # a real token is ~300 bytes; more is an attack or a mistake
MAX_TOKEN_LIFETIME_S = 3600.0  # exp - iat: tokens are meant to be short-lived
DEFAULT_TOKEN_TTL_S = 60.0
CLOCK_LEEWAY_S = 5.0
MIN_RSA_BITS = 2048


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
    broker stores them too (``take_new``, ``load``), so a restart forgets none."""

    def __init__(self, *, capacity: int = 100_000) -> None:
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._capacity = capacity
        self._new: list[tuple[str, float]] = []

    def load(self, used: Iterable[tuple[str, float]], now: float) -> None:
        for jti, expires in sorted(used, key=lambda item: item[1]):
            if expires > now:
                self._seen[jti] = expires

    def __contains__(self, jti: str) -> bool:
        return jti in self._seen

    def take_new(self) -> list[tuple[str, float]]:
        """The jtis remembered since the last call, for storage."""
        new, self._new = self._new, []
        return new

    def check_and_remember(self, jti: str, expires: float, now: float) -> None:
        while self._seen and next(iter(self._seen.values())) < now:
            self._seen.popitem(last=False)
        if jti in self._seen:
            raise NotAuthenticated("token already used (replayed jti); sign a new one",
                                   reason_detail="replayed_jti")
        if len(self._seen) >= self._capacity:
            # Forgetting an unexpired id would let a captured token in again: refuse
            # (for at most a token's lifetime) rather than evict.
            raise NotAuthenticated(
                f"{len(self._seen)} connections were opened with tokens that have not "
                "expired yet; try again in a minute", reason_detail="replay_guard_full",
                why="busy")
        self._seen[jti] = expires
        self._new.append((jti, expires))


def unverified_issuer(token: str) -> str:
    """The client id a token claims, to find its registered key (then verify!)."""
    _check_size(token)
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise NotAuthenticated(f"token is not a JWT: {exc}") from None
    iss = claims.get("iss")
    if not isinstance(iss, str) or not iss:
        raise NotAuthenticated("token lacks the iss claim (the client id)")
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
    except jwt.PyJWTError as exc:
        raise NotAuthenticated(f"token is not a JWT: {exc}") from None
    alg = header.get("alg")
    if alg != expected:
        raise NotAuthenticated(
            f"token algorithm {alg!r} is refused: client {client_id!r} is registered with a "
            f"key that signs {expected}"
        )
    moment = now if now is not None else time.time()
    try:
        claims = jwt.decode(
            token, key, algorithms=[expected], audience=audience, leeway=leeway,  # type: ignore[arg-type]
            options={"require": ["iss", "aud", "exp", "iat", "jti"], "verify_iat": True},
        ) if now is None else _decode_at(token, key, expected, audience, leeway, moment)
    except jwt.ExpiredSignatureError:
        raise NotAuthenticated("token expired; sign a new one") from None
    except jwt.ImmatureSignatureError:
        raise NotAuthenticated("token is not valid yet (issued in the future: check the clock)") \
            from None
    except jwt.InvalidAudienceError:
        raise NotAuthenticated(f"token is for another broker (aud is not {audience!r})") from None
    except jwt.InvalidSignatureError:
        raise NotAuthenticated(
            f"token signature does not match the key registered for {client_id!r}") from None
    except jwt.MissingRequiredClaimError as exc:
        raise NotAuthenticated(f"token lacks the {exc.claim} claim") from None
    except jwt.PyJWTError as exc:
        raise NotAuthenticated(f"token refused: {exc}") from None
    if claims["iss"] != client_id:
        raise NotAuthenticated(f"token was issued by {claims['iss']!r}, not {client_id!r}")
    if claims["exp"] - claims["iat"] > MAX_TOKEN_LIFETIME_S:
        raise NotAuthenticated(
            f"token lives {claims['exp'] - claims['iat']:.0f} s; the limit is "
            f"{MAX_TOKEN_LIFETIME_S:.0f} s")
    if replay is not None:
        replay.check_and_remember(str(claims["jti"]), float(claims["exp"]), moment)
    return claims


def _decode_at(token: str, key: PublicKey, alg: str, audience: str, leeway: float,
               now: float) -> dict[str, Any]:
    """jwt.decode with an explicit clock (tests and replays of old traffic)."""
    claims = jwt.decode(token, key, algorithms=[alg], audience=audience,  # type: ignore[arg-type]
                        options={"require": ["iss", "aud", "exp", "iat", "jti"],
                                 "verify_exp": False, "verify_iat": False})
    if claims["exp"] + leeway < now:
        raise jwt.ExpiredSignatureError("expired")
    if claims["iat"] - leeway > now:
        raise jwt.ImmatureSignatureError("iat in the future")
    return claims
