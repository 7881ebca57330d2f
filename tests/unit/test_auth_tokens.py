"""Client key pairs and self-signed tokens: every forged or stale token is refused
with a reason that says what is wrong (the token half of issue #3's attack table)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from minou.auth import keys
from minou.auth.tokens import ReplayGuard, make_token, unverified_issuer, verify_token
from minou.errors import ConfigError, NotAuthenticated

AUD = "broker-1"
NOW = 1_800_000_000.0


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(header: dict, claims: dict, signature: bytes = b"") -> str:
    head = b64(json.dumps(header).encode()) + "." + b64(json.dumps(claims).encode())
    return head + "." + b64(signature)


def claims(**over: object) -> dict:
    base = {"iss": "billing-1", "aud": AUD, "iat": int(NOW), "exp": int(NOW) + 60,
            "jti": "abc"}
    base.update(over)
    return base


@pytest.fixture
def key():
    return keys.generate()


def verify(token: str, key, **kw):
    kw.setdefault("client_id", "billing-1")
    return verify_token(token, key.public_key(), audience=AUD, now=NOW, **kw)


def test_keygen_files_mode_and_fingerprint(tmp_path, key):
    private, public = keys.save(key, tmp_path, "billing-1")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    loaded = keys.load_private(private)
    assert keys.fingerprint(loaded) == keys.fingerprint(public.read_bytes())
    assert re.fullmatch(r"SHA256:(?:[0-9A-F]{2}:){31}[0-9A-F]{2}", keys.fingerprint(key))
    with pytest.raises(ConfigError, match="already exists"):
        keys.save(keys.generate(), tmp_path, "billing-1")
    (tmp_path / "junk.key").write_text("not a key")
    with pytest.raises(ConfigError, match="not an unencrypted PEM private key"):
        keys.load_private(tmp_path / "junk.key")


@pytest.mark.parametrize("make", [
    keys.generate,
    lambda: ec.generate_private_key(ec.SECP256R1()),
    lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
])
def test_round_trip_for_every_supported_key_type(make):
    k = make()
    token = make_token("billing-1", k, AUD, now=NOW)
    assert unverified_issuer(token) == "billing-1"
    got = verify(token, k)
    assert got["iss"] == "billing-1" and got["aud"] == AUD and got["exp"] - got["iat"] == 60


def test_alg_none_is_refused(key):
    with pytest.raises(NotAuthenticated, match="algorithm 'none' is refused"):
        verify(forge({"alg": "none", "typ": "JWT"}, claims()), key)


def test_hs256_signed_with_the_public_key_is_refused(key):
    secret = keys.public_pem(key)
    head = forge({"alg": "HS256", "typ": "JWT"}, claims()).rsplit(".", 1)[0]
    sig = hmac.new(secret, head.encode(), hashlib.sha256).digest()
    with pytest.raises(NotAuthenticated, match=r"algorithm .HS256. is refused.*signs EdDSA"):
        verify(head + "." + b64(sig), key)


def test_token_signed_by_another_clients_key(key):
    token = make_token("billing-1", keys.generate(), AUD, now=NOW)
    with pytest.raises(NotAuthenticated, match="signature does not match the key registered"):
        verify(token, key)


@pytest.mark.parametrize(("token_now", "message"), [
    (NOW - 120, "token expired"),
    (NOW + 120, "not valid yet"),
])
def test_expired_and_not_yet_valid(key, token_now, message):
    with pytest.raises(NotAuthenticated, match=message):
        verify(make_token("billing-1", key, AUD, now=token_now), key)


def test_wrong_audience_and_wrong_issuer(key):
    with pytest.raises(NotAuthenticated, match="for another broker"):
        verify(make_token("billing-1", key, "other-broker", now=NOW), key)
    with pytest.raises(NotAuthenticated, match="issued by 'billing-2', not 'billing-1'"):
        verify(make_token("billing-2", key, AUD, now=NOW), key)


def test_replayed_jti_is_refused_and_forgotten_after_expiry(key):
    guard = ReplayGuard()
    token = make_token("billing-1", key, AUD, now=NOW)
    first = verify(token, key, replay=guard)
    with pytest.raises(NotAuthenticated, match="replayed jti"):
        verify(token, key, replay=guard)
    fresh = make_token("billing-1", key, AUD, now=NOW)
    assert verify(fresh, key, replay=guard)["jti"] != first["jti"]  # a new token passes
    guard.check_and_remember(first["jti"], NOW + 60, now=NOW + 61)  # expired: forgotten


def test_a_full_replay_guard_refuses_rather_than_forgets() -> None:
    guard = ReplayGuard(capacity=2)
    guard.check_and_remember("a", NOW + 60, now=NOW)
    guard.check_and_remember("b", NOW + 60, now=NOW)
    with pytest.raises(NotAuthenticated, match="try again in a minute"):
        guard.check_and_remember("c", NOW + 60, now=NOW)
    with pytest.raises(NotAuthenticated, match="replayed jti"):  # "a" is still known
        guard.check_and_remember("a", NOW + 60, now=NOW)
    guard.check_and_remember("c", NOW + 120, now=NOW + 61)  # a and b expired: room again


def test_oversized_garbage_and_long_lived_tokens(key):
    with pytest.raises(NotAuthenticated, match="the limit is 4096"):
        verify("x" * 5000, key)
    with pytest.raises(NotAuthenticated, match="not a JWT"):
        verify("garbage", key)
    with pytest.raises(NotAuthenticated, match="no token"):
        verify("", key)
    with pytest.raises(NotAuthenticated, match="limit is 3600"):
        verify(make_token("billing-1", key, AUD, ttl=7200, now=NOW), key)


def test_missing_claims_are_named(key):
    import jwt

    token = jwt.encode({k: v for k, v in claims().items() if k != "jti"}, key,
                       algorithm="EdDSA")
    with pytest.raises(NotAuthenticated, match="lacks the jti claim"):
        verify(token, key)


def signed_claims(key, claims_json: str) -> str:
    """A token whose claims are exactly this JSON text (NaN, Infinity and all)."""
    head = b64(b'{"alg":"EdDSA","typ":"JWT"}') + "." + b64(claims_json.encode())
    return head + "." + b64(key.sign(head.encode()))


def with_claim(name: str, raw: str) -> str:
    parts = {k: json.dumps(v) for k, v in claims().items()} | {name: raw}
    return "{" + ",".join(f'"{k}":{v}' for k, v in parts.items()) + "}"


@pytest.mark.parametrize(("name", "raw", "message"), [
    ("exp", "NaN", "claim exp must be a finite number of seconds since 1970 (before the "
                   "year 10000), not NaN"),
    ("exp", "Infinity", "claim exp must be a finite number"),
    ("exp", "-1", "claim exp must be a finite number"),
    ("exp", "1e400", "claim exp must be a finite number"),  # json reads it as inf
    ("exp", "1" + "0" * 30, "claim exp must be a finite number"),  # float() would overflow
    ("exp", '"1800000060"', 'claim exp must be a number of seconds since 1970, not '
                            '"1800000060"'),
    ("exp", "false", "claim exp must be a number of seconds since 1970, not false"),
    ("iat", "NaN", "claim iat must be a finite number"),
    ("iat", "[1800000000]", "claim iat must be a number of seconds since 1970, not [18"),
    ("nbf", "NaN", "claim nbf must be a finite number"),
    ("iss", "7", "claim iss must be a non-empty string"),
    ("iss", '""', "claim iss must be a non-empty string"),
    ("aud", "{}", "claim aud must be a string (the broker id) or a list of strings"),
    ("aud", '["broker-1", null]', "claim aud must be a string"),
    ("aud", "[]", "claim aud must be a string"),
    ("jti", "12", "claim jti must be a string of 1..128 characters, not 12"),
    ("jti", json.dumps("j" * 129), "claim jti must be a string of 1..128 characters, not "
                                   '"jjjj'),
])
def test_claims_of_the_wrong_type_or_not_finite_are_named(key, name, raw, message):
    token = signed_claims(key, with_claim(name, raw))
    guard = ReplayGuard()
    with pytest.raises(NotAuthenticated) as info:
        verify(token, key, replay=guard)
    assert message in info.value.message
    assert info.value.detail["claim"] == name
    assert len(guard) == 0  # nothing remembered for a refused token


def test_nbf_in_the_future_and_a_list_audience(key):
    token = signed_claims(key, with_claim("nbf", str(int(NOW) + 120)))
    with pytest.raises(NotAuthenticated, match="not valid yet") as info:
        verify(token, key)
    assert info.value.detail["claim"] == "nbf"
    assert verify(signed_claims(key, with_claim("nbf", "null")), key)["nbf"] is None  # absent
    assert verify(signed_claims(key, with_claim("aud", '["other", "broker-1"]')), key)
    with pytest.raises(NotAuthenticated, match="for another broker"):
        verify(signed_claims(key, with_claim("aud", '["other"]')), key)


def test_the_issuer_lookup_is_strict_too(key):
    with pytest.raises(NotAuthenticated, match=r"claim iss must be a non-empty string .*, not 7"):
        unverified_issuer(signed_claims(key, with_claim("iss", "7")))
    deep = b64(b"[" * 1500 + b"]" * 1500) + "." + b64(b"{}") + ".x"
    with pytest.raises(NotAuthenticated, match="not a JWT"):
        unverified_issuer(deep)
    with pytest.raises(NotAuthenticated, match="not a JWT"):
        verify(deep, key)


def test_no_clock_given_checks_the_same_way(key):
    token = signed_claims(key, with_claim("exp", "NaN"))
    with pytest.raises(NotAuthenticated, match="claim exp must be a finite number"):
        verify_token(token, key.public_key(), client_id="billing-1", audience=AUD)
