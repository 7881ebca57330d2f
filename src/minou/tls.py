"""TLS for every listener: certificate files, fingerprints, and SSL contexts.

A broker either uses a configured certificate and key (:func:`load_files`) or, on
first start, generates a self-signed pair into its data directory
(:func:`ensure_self_signed`) and prints the fingerprint. A client then either
verifies the broker with a CA file (for a self-signed broker that is the broker's
own ``cert.pem``) or pins the certificate's fingerprint::

    ctx = client_context(fingerprint="SHA256:AB:CD:...")
    reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
    check_pin(writer.get_extra_info("ssl_object"), "SHA256:AB:CD:...")  # before sending anything

Fingerprints look like ``openssl x509 -fingerprint -sha256`` prints them, after
the ``=``: ``SHA256:`` and the SHA-256 of the DER certificate as uppercase hex
pairs joined by colons.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import ClientError, ConfigError

__all__ = [
    "TlsFiles",
    "TlsPinMismatch",
    "cert_fingerprint",
    "check_pin",
    "client_context",
    "ensure_self_signed",
    "load_files",
    "normalize_fingerprint",
    "server_context",
]

CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
COMMON_NAME = "minou broker"
# Always in the certificate, so a broker generated with only a public name still
# verifies for clients on the same machine.
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
_PREFIX = "SHA256:"
_DIGEST_SIZE = 32


@dataclass(frozen=True)
class TlsFiles:
    """A certificate and its key on disk, already checked to belong together."""

    cert: Path
    key: Path
    fingerprint: str  # "SHA256:AA:BB:..." of the first (leaf) certificate in ``cert``
    generated: bool  # True if ensure_self_signed created the pair just now


class TlsPinMismatch(ClientError):
    """The broker's certificate is not the one the client pinned.

    Deliberately not an ``ssl.SSLError``/``OSError``: reconnect loops usually retry
    those, and retrying against an impostor (or a re-keyed broker) cannot succeed.
    """

    def __init__(self, message: str, *, expected: str, actual: str | None) -> None:
        super().__init__(message)
        self.expected = expected
        self.actual = actual


# -- fingerprints -------------------------------------------------------------------------


def _format_digest(digest: bytes) -> str:
    return _PREFIX + ":".join(f"{byte:02X}" for byte in digest)


def normalize_fingerprint(text: str) -> str:
    """Return the canonical ``SHA256:AA:BB:...`` form of a fingerprint a person typed.

    Accepts any case, with or without the ``SHA256:`` prefix (or the
    ``SHA256 Fingerprint=`` that openssl prints) and with or without colons.
    Raises ``ValueError`` unless it is exactly 32 bytes of hex.
    """
    body = text.strip()
    lowered = body.lower()
    # Users paste from `openssl x509 -fingerprint -sha256` as often as from our own output.
    for prefix in ("sha256 fingerprint=", "sha256:"):
        if lowered.startswith(prefix):
            body = body[len(prefix):]
            break
    hexdigits = body.replace(":", "").strip()
    try:
        digest = bytes.fromhex(hexdigits)
    except ValueError:
        digest = b""
    # bytes.fromhex skips inner whitespace, so also insist on exactly 64 hex characters.
    if len(digest) != _DIGEST_SIZE or len(hexdigits) != 2 * _DIGEST_SIZE:
        raise ValueError(
            f"not a SHA-256 certificate fingerprint: {text!r}; expected 32 bytes of hex "
            "such as SHA256:AB:CD:... (64 hex digits, colons optional)"
        )
    return _format_digest(digest)


def cert_fingerprint(cert_pem_or_der: bytes) -> str:
    """Fingerprint of a certificate given as PEM or DER (the first one, for a PEM chain).

    Raises ``ValueError`` if the bytes are not a certificate.
    """
    if b"-----BEGIN" in cert_pem_or_der:
        cert = x509.load_pem_x509_certificate(cert_pem_or_der)
    else:
        cert = x509.load_der_x509_certificate(cert_pem_or_der)
    # cryptography parses strict DER, so this hashes exactly the bytes a peer sends.
    return _format_digest(cert.fingerprint(hashes.SHA256()))


# -- certificate files --------------------------------------------------------------------


def _spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_files(cert: Path, key: Path) -> TlsFiles:
    """Check that ``cert`` and ``key`` are readable PEM and belong together.

    ``cert`` may hold a chain (leaf first). Raises ``ConfigError`` naming the bad file.
    """
    cert, key = Path(cert), Path(key)
    try:
        cert_data = cert.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS certificate {cert}: {exc.strerror}") from exc
    try:
        key_data = key.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS key {key}: {exc.strerror}") from exc
    try:
        chain = x509.load_pem_x509_certificates(cert_data)
    except ValueError as exc:
        # cryptography's own message is a parser detail plus an FAQ link; the file is the news.
        raise ConfigError(
            f"TLS certificate {cert} is not a PEM certificate (-----BEGIN CERTIFICATE-----)"
        ) from exc
    try:
        private = serialization.load_pem_private_key(key_data, password=None)
    except TypeError as exc:
        # TypeError is how cryptography reports a key that needs a password.
        raise ConfigError(
            f"TLS key {key} is encrypted; minou needs an unencrypted PEM key"
        ) from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(
            f"TLS key {key} is not a PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from exc
    leaf = chain[0]
    try:
        matches = _spki(private.public_key()) == _spki(leaf.public_key())
    except (ValueError, UnsupportedAlgorithm):
        matches = False
    if not matches:
        raise ConfigError(f"TLS key {key} does not match the certificate in {cert}")
    return TlsFiles(cert=cert, key=key, fingerprint=_format_digest(leaf.fingerprint(
        hashes.SHA256())), generated=False)


def _san_entries(hosts: list[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    seen: set[str] = set()
    for raw in [*DEFAULT_HOSTS, *hosts]:
        host = raw.strip().strip("[]").rstrip(".").lower()  # "[::1]" and "name." too
        if not host or host in seen:
            continue
        seen.add(host)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            try:
                # SANs hold A-labels; a Unicode name has to be IDNA-encoded first.
                name = host.encode("idna").decode("ascii")
            except UnicodeError as exc:
                raise ConfigError(f"TLS host {raw!r} is not a valid host name") from exc
            entries.append(x509.DNSName(name))
            continue
        # A bind-all address (0.0.0.0, ::) is where the broker listens, never what a
        # client dials, so it has no place in the certificate.
        if not address.is_unspecified:
            entries.append(x509.IPAddress(address))
    return entries


def _build_self_signed(
    hosts: list[str], days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        # Backdated so a client whose clock is a little behind still accepts it.
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(_san_entries(hosts)), critical=False)
        # An end-entity certificate, not a CA: OpenSSL (Python's ssl) trusts a
        # self-signed leaf listed in cafile as its own anchor, rustls/webpki refuse a
        # CA certificate used as a server certificate, and a leaked key cannot mint
        # certificates for other names.
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        # SKI == AKI marks it as self-signed to strict verifiers (Python 3.13 turns on
        # VERIFY_X509_STRICT). No KeyUsage on purpose: OpenSSL 1.1.1 only treats a
        # certificate as self-signed if its KeyUsage (when present) allows keyCertSign.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _fsync_dir(directory: Path) -> None:
    # Makes the renames durable; directories cannot be opened on Windows, where it is moot.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    # mkstemp creates the file 0600, so the key is never readable by others, not even
    # for an instant; os.replace means a reader sees the old file or the whole new one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if mode != 0o600:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ensure_self_signed(directory: Path, *, hosts: list[str], days: int = 825) -> TlsFiles:
    """Return ``directory/cert.pem`` and ``key.pem``, generating them if either is missing.

    Existing files are loaded and checked, never overwritten (a broken pair raises
    ``ConfigError``); delete both to regenerate, e.g. after adding a host name. A new
    pair is an EC P-256 key and a self-signed certificate for ``hosts`` plus localhost,
    127.0.0.1 and ::1, valid for ``days`` (825 is the most Apple clients accept).
    """
    directory = Path(directory)
    cert_path, key_path = directory / CERT_NAME, directory / KEY_NAME
    if cert_path.exists() and key_path.exists():
        return load_files(cert_path, key_path)
    if days < 1:
        raise ConfigError(f"TLS certificate validity must be at least one day, not {days}")
    # The mode only applies when the directory is created here; an existing data
    # directory keeps whatever its owner chose.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    key, cert = _build_self_signed(hosts, days)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # Key first, certificate last: a crash in between leaves no cert.pem, so the next
    # start regenerates instead of pairing a new key with an old certificate.
    _write_atomic(key_path, key_pem, 0o600)
    _write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _fsync_dir(directory)
    return TlsFiles(cert=cert_path, key=key_path,
                    fingerprint=_format_digest(cert.fingerprint(hashes.SHA256())),
                    generated=True)


# -- SSL contexts -------------------------------------------------------------------------


def _harden(ctx: ssl.SSLContext) -> ssl.SSLContext:
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    # Renegotiation is a DoS lever and no minou client needs it.
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)
    return ctx


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """A TLS 1.2+ server context presenting ``files``."""
    ctx = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    try:
        ctx.load_cert_chain(str(files.cert), str(files.key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot use TLS certificate {files.cert} with key {files.key}: {exc}"
        ) from exc
    return ctx


def client_context(
    *,
    cafile: str | None = None,
    fingerprint: str | None = None,
    server_hostname_check: bool = True,
) -> ssl.SSLContext:
    """A TLS 1.2+ client context.

    * ``cafile``: verify the chain against that file only (not the system store) and,
      unless ``server_hostname_check`` is False, the host name.
    * ``fingerprint`` alone: a self-signed certificate cannot be chain-verified without
      its file, so the handshake verifies nothing and the caller MUST call
      :func:`check_pin` right after it, before sending anything.
    * both: the chain is verified and the caller still calls :func:`check_pin`.
    * neither: the system's default verification.

    Raises ``ConfigError`` for an unreadable CA file or a malformed fingerprint.
    """
    if fingerprint is not None:
        try:
            normalize_fingerprint(fingerprint)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if cafile is None and fingerprint is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        # check_hostname has to be switched off before CERT_NONE is allowed.
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return _harden(ctx)
    try:
        ctx = ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS CA file {cafile}: {exc}") from exc
    ctx.check_hostname = server_hostname_check
    return _harden(ctx)


def check_pin(ssl_object: ssl.SSLObject | ssl.SSLSocket, fingerprint: str) -> None:
    """Raise :class:`TlsPinMismatch` unless the peer's certificate has ``fingerprint``.

    ``ssl_object`` is a connected socket or, with asyncio,
    ``writer.get_extra_info("ssl_object")``. A malformed ``fingerprint`` raises
    ``ConfigError``.
    """
    try:
        expected = normalize_fingerprint(fingerprint)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    # binary_form returns the certificate even when the context verified nothing.
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        raise TlsPinMismatch(
            f"broker sent no certificate; expected the pinned {expected}",
            expected=expected, actual=None,
        )
    actual = _format_digest(hashlib.sha256(der).digest())
    if actual != expected:
        raise TlsPinMismatch(
            f"broker certificate fingerprint {actual} does not match the pinned {expected}",
            expected=expected, actual=actual,
        )
