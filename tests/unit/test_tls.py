"""TLS files, fingerprints and contexts, checked with real handshakes on 127.0.0.1.

Every connection is a real asyncio TLS server on an ephemeral loopback port; the
client closes first and the server waits for that, so each TLS session ends with
a clean close_notify and nothing is left for a ResourceWarning.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import os
import re
import ssl
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from minou import tls
from minou.errors import ClientError, ConfigError

HOSTS = ["minou.test", "192.0.2.7", "0.0.0.0", "localhost"]
posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> tls.TlsFiles:
    return tls.ensure_self_signed(tmp_path_factory.mktemp("broker") / "tls", hosts=HOSTS)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> tls.TlsFiles:
    return tls.ensure_self_signed(tmp_path_factory.mktemp("other") / "tls", hosts=[])


def expected_fingerprint(cert: Path) -> str:
    # Independent of the module: the stdlib's PEM decoder and hashlib.
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(cert.read_text())).digest()
    return "SHA256:" + ":".join(f"{byte:02X}" for byte in digest)


# -- a loopback echo server and client ----------------------------------------------------


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        writer.write(await reader.readline())
        await writer.drain()
        await reader.read()  # until the client's close_notify: it closes first
    except (ConnectionError, ssl.SSLError):
        pass  # the client dropped us after a failed pin check; nothing to assert here
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving(files: tls.TlsFiles) -> AsyncIterator[int]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0, ssl=tls.server_context(files))
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _roundtrip(port: int, ctx: ssl.SSLContext, server_hostname: str | None,
                     pin: str | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname=server_hostname)
    try:
        if pin is not None:
            tls.check_pin(writer.get_extra_info("ssl_object"), pin)
        writer.write(b"ping\n")
        await writer.drain()
        return await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()


def roundtrip(files: tls.TlsFiles, ctx: ssl.SSLContext, *, server_hostname: str | None = None,
              pin: str | None = None) -> bytes:
    """Start a TLS echo server with ``files``, connect with ``ctx``, send one line back."""

    async def main() -> bytes:
        async with asyncio.timeout(2), serving(files) as port:
            return await _roundtrip(port, ctx, server_hostname, pin)

    return asyncio.run(main())


# -- generated files ----------------------------------------------------------------------


def test_generate_then_reuse(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "tls"
    first = tls.ensure_self_signed(directory, hosts=["minou.test"])
    assert first.generated
    assert first.cert == directory / "cert.pem" and first.key == directory / "key.pem"
    assert first.cert.is_file() and first.key.is_file()
    # No temporary files left behind by the atomic writes.
    assert sorted(p.name for p in directory.iterdir()) == ["cert.pem", "key.pem"]
    key_pem = first.key.read_bytes()

    again = tls.ensure_self_signed(directory, hosts=["other.name"])
    assert not again.generated
    assert again.fingerprint == first.fingerprint
    assert again.key.read_bytes() == key_pem  # loaded, not regenerated


@posix_only
def test_generated_files_are_private(tmp_path: Path) -> None:
    files = tls.ensure_self_signed(tmp_path / "tls", hosts=[])
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(files.cert.parent.stat().st_mode) == 0o700


def test_generate_regenerates_a_half_written_pair(tmp_path: Path) -> None:
    first = tls.ensure_self_signed(tmp_path, hosts=[])
    first.cert.unlink()  # as if the broker died between writing the key and the cert
    second = tls.ensure_self_signed(tmp_path, hosts=[])
    assert second.generated and second.fingerprint != first.fingerprint
    assert tls.load_files(second.cert, second.key).fingerprint == second.fingerprint


def test_generate_never_overwrites_a_broken_pair(tmp_path: Path) -> None:
    files = tls.ensure_self_signed(tmp_path, hosts=[])
    files.cert.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=re.escape(str(files.cert))):
        tls.ensure_self_signed(tmp_path, hosts=[])
    assert files.cert.read_text() == "not a certificate\n"


def test_certificate_contents(broker: tls.TlsFiles) -> None:
    cert = x509.load_pem_x509_certificate(broker.cert.read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "minou broker"
    assert cert.issuer == cert.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "minou.test"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"),
        ipaddress.ip_address("192.0.2.7"),
    ]  # 0.0.0.0 is a bind address, not a name a client dials
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert isinstance(public.curve, ec.SECP256R1)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 825 <= lifetime.days <= 826


# -- fingerprints -------------------------------------------------------------------------


def test_fingerprint_is_sha256_of_the_der(broker: tls.TlsFiles) -> None:
    expected = expected_fingerprint(broker.cert)
    assert broker.fingerprint == expected
    assert tls.cert_fingerprint(broker.cert.read_bytes()) == expected
    assert tls.cert_fingerprint(ssl.PEM_cert_to_DER_cert(broker.cert.read_text())) == expected
    assert tls.load_files(broker.cert, broker.key).fingerprint == expected


def test_cert_fingerprint_refuses_garbage() -> None:
    with pytest.raises(ValueError):
        tls.cert_fingerprint(b"\x30\x03\x02\x01\x00")
    with pytest.raises(ValueError):
        tls.cert_fingerprint(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")


def test_normalize_fingerprint_accepts_what_people_paste(broker: tls.TlsFiles) -> None:
    canonical = broker.fingerprint
    bare = canonical.removeprefix("SHA256:")
    for text in (canonical, canonical.lower(), bare, bare.replace(":", ""),
                 bare.replace(":", "").lower(), "sha256:" + bare.replace(":", ""),
                 f"  SHA256 Fingerprint={bare}\n"):
        assert tls.normalize_fingerprint(text) == canonical, text


@pytest.mark.parametrize("text", [
    "", "SHA256:", "SHA256:AB:CD", "AB" * 31, "AB" * 33, "ZZ" * 32, "SHA1:" + "AB" * 32,
    "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",  # ssh-style base64
    "AB CD" + "AB" * 30,
])
def test_normalize_fingerprint_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="SHA-256"):
        tls.normalize_fingerprint(text)


# -- handshakes ---------------------------------------------------------------------------


@pytest.mark.parametrize("server_hostname", [None, "localhost", "minou.test", "::1"])
def test_cafile_verifies_chain_and_hostname(broker: tls.TlsFiles,
                                            server_hostname: str | None) -> None:
    ctx = tls.client_context(cafile=str(broker.cert))
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert roundtrip(broker, ctx, server_hostname=server_hostname) == b"ping\n"


def test_cafile_works_with_strict_verification(broker: tls.TlsFiles) -> None:
    # Python 3.13 turns these on in create_default_context; the certificate must pass.
    ctx = tls.client_context(cafile=str(broker.cert))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
    assert roundtrip(broker, ctx) == b"ping\n"


def test_cafile_refuses_a_name_not_in_the_certificate(broker: tls.TlsFiles) -> None:
    ctx = tls.client_context(cafile=str(broker.cert))
    with pytest.raises(ssl.SSLCertVerificationError, match=r"(?i)hostname"):
        roundtrip(broker, ctx, server_hostname="example.com")
    unchecked = tls.client_context(cafile=str(broker.cert), server_hostname_check=False)
    assert roundtrip(broker, unchecked, server_hostname="example.com") == b"ping\n"


def test_cafile_refuses_another_broker(broker: tls.TlsFiles, other: tls.TlsFiles) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        roundtrip(broker, tls.client_context(cafile=str(other.cert)))


def test_default_context_refuses_self_signed(broker: tls.TlsFiles) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        roundtrip(broker, tls.client_context())


def test_pin_with_the_right_fingerprint(broker: tls.TlsFiles) -> None:
    ctx = tls.client_context(fingerprint=broker.fingerprint)
    assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_NONE
    assert roundtrip(broker, ctx, pin=broker.fingerprint) == b"ping\n"
    lowercase = broker.fingerprint.removeprefix("SHA256:").replace(":", "").lower()
    assert roundtrip(broker, ctx, pin=lowercase) == b"ping\n"


def test_pin_with_a_wrong_fingerprint(broker: tls.TlsFiles, other: tls.TlsFiles) -> None:
    ctx = tls.client_context(fingerprint=other.fingerprint)
    with pytest.raises(tls.TlsPinMismatch) as caught:
        roundtrip(broker, ctx, pin=other.fingerprint)
    assert str(caught.value) == (f"broker certificate fingerprint {broker.fingerprint} "
                                 f"does not match the pinned {other.fingerprint}")
    assert isinstance(caught.value, ClientError)
    assert not isinstance(caught.value, OSError)  # reconnect loops must not retry it
    assert (caught.value.expected, caught.value.actual) == (other.fingerprint,
                                                            broker.fingerprint)


def test_pin_together_with_cafile(broker: tls.TlsFiles) -> None:
    ctx = tls.client_context(cafile=str(broker.cert), fingerprint=broker.fingerprint)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert roundtrip(broker, ctx, pin=broker.fingerprint) == b"ping\n"


def test_contexts_require_tls12(broker: tls.TlsFiles) -> None:
    assert tls.server_context(broker).minimum_version == ssl.TLSVersion.TLSv1_2
    for ctx in (tls.client_context(), tls.client_context(cafile=str(broker.cert)),
                tls.client_context(fingerprint=broker.fingerprint)):
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2


def test_client_context_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SHA-256"):
        tls.client_context(fingerprint="SHA256:AB:CD")
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError, match=re.escape(str(missing))):
        tls.client_context(cafile=str(missing))


# -- configured files ---------------------------------------------------------------------


def test_load_files_refuses_a_key_from_another_pair(broker: tls.TlsFiles,
                                                    other: tls.TlsFiles) -> None:
    with pytest.raises(ConfigError, match="does not match") as caught:
        tls.load_files(broker.cert, other.key)
    assert str(other.key) in str(caught.value) and str(broker.cert) in str(caught.value)


def test_load_files_refuses_garbage(broker: tls.TlsFiles, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match=re.escape(f"certificate {garbage}")):
        tls.load_files(garbage, broker.key)
    with pytest.raises(ConfigError, match=re.escape(f"key {garbage}")):
        tls.load_files(broker.cert, garbage)
    # A certificate where the key belongs is not a key either.
    with pytest.raises(ConfigError, match=re.escape(f"key {broker.cert}")):
        tls.load_files(broker.cert, broker.cert)


def test_load_files_refuses_missing_and_encrypted(broker: tls.TlsFiles, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ConfigError, match=re.escape(f"cannot read TLS certificate {missing}")):
        tls.load_files(missing, broker.key)
    with pytest.raises(ConfigError, match=re.escape(f"cannot read TLS key {missing}")):
        tls.load_files(broker.cert, missing)

    private = serialization.load_pem_private_key(broker.key.read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.pem"
    encrypted.write_bytes(private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(ConfigError, match=re.escape(f"key {encrypted} is encrypted")):
        tls.load_files(broker.cert, encrypted)
