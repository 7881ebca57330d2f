"""Client key pairs: make, save, load, fingerprint. Ed25519 by default."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from ..errors import ConfigError

PrivateKey = Union[ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey]  # noqa: UP007
PublicKey = Union[ed25519.Ed25519PublicKey, ec.EllipticCurvePublicKey, rsa.RSAPublicKey]  # noqa: UP007


def generate() -> ed25519.Ed25519PrivateKey:
    return ed25519.Ed25519PrivateKey.generate()


def private_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    public = key.public_key() if hasattr(key, "private_bytes") else key
    return public.public_bytes(serialization.Encoding.PEM,  # type: ignore[union-attr]
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def fingerprint(key: PrivateKey | PublicKey | bytes) -> str:
    """SHA-256 of the public key (DER), as ``SHA256:AB:CD:...``: the format of TLS
    certificate fingerprints (``openssl x509 -fingerprint -sha256``), so every
    fingerprint minou prints reads the same."""
    public = load_public(key) if isinstance(key, bytes) else key
    if hasattr(public, "private_bytes"):
        public = public.public_key()  # type: ignore[union-attr]
    der = public.public_bytes(serialization.Encoding.DER,  # type: ignore[union-attr]
                              serialization.PublicFormat.SubjectPublicKeyInfo)
    return "SHA256:" + ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def save(key: PrivateKey, directory: str | os.PathLike[str], client_id: str) -> tuple[Path, Path]:
    """Write ``<client_id>.key`` (mode 0600) and ``<client_id>.pub``; refuse to overwrite."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    private, public = folder / f"{client_id}.key", folder / f"{client_id}.pub"
    if private.exists():
        raise ConfigError(f"{private} already exists; remove it first or choose another client id")
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private_pem(key))
    public.write_bytes(public_pem(key))
    return private, public


def load_private(path: str | os.PathLike[str]) -> PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read key file {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not an unencrypted PEM private key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey
                      | rsa.RSAPrivateKey):
        raise ConfigError(f"{path}: only Ed25519, EC P-256 and RSA keys are supported")
    return key


def load_public(pem: bytes) -> PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a PEM public key: {exc}") from exc
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey
                      | rsa.RSAPublicKey):
        raise ConfigError("only Ed25519, EC P-256 and RSA public keys are supported")
    return key
