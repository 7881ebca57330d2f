"""TLS on every listener of a real broker: a self-signed pair made on first start,
clients that pin its fingerprint or trust its certificate file."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request

import pytest

import minou
from minou.errors import ConnectionClosed

from ..conftest import auth


@pytest.fixture
def tls_broker(broker_factory, tmp_path):
    cfg = tmp_path / "tls.toml"
    cfg.write_text("[tls]\nself_signed = true\n")
    return broker_factory.make(config=cfg).start()


def test_self_signed_pair_is_made_once_and_its_fingerprint_printed(tls_broker):
    assert tls_broker.url.startswith("minous://")
    assert tls_broker.http.startswith("https://")
    assert tls_broker.tls_fingerprint and tls_broker.tls_fingerprint.startswith("SHA256:")
    cert = tls_broker.data_dir / "tls" / "cert.pem"
    key = tls_broker.data_dir / "tls" / "key.pem"
    assert cert.exists() and oct(key.stat().st_mode & 0o777) == "0o600"
    first = tls_broker.tls_fingerprint
    tls_broker.stop()
    tls_broker.start()
    assert tls_broker.tls_fingerprint == first  # the same pair after a restart


def test_pinned_client_talks_over_tls(tls_broker):
    with tls_broker.connect_sync("pinned") as c:
        assert c.send("tls/v1/1", {"secret": 1}).seq == 1
        assert c.consume("tls/v1/1").get(timeout=5).payload == {"secret": 1}


def test_client_with_the_certificate_file_verifies_the_chain(tls_broker):
    cafile = str(tls_broker.data_dir / "tls" / "cert.pem")
    with minou.connect_sync(tls_broker.url, cafile=cafile, **auth("ca-client")) as c:
        assert c.send("tls/v1/2", {"n": 2}).seq == 1


def test_wrong_pin_and_unverified_certificates_are_refused(tls_broker):
    wrong = "SHA256:" + ":".join(["00"] * 32)
    with pytest.raises(ConnectionClosed, match="does not match the pinned"):
        minou.connect_sync(tls_broker.url, tls_fingerprint=wrong, reconnect=False,
                           **auth("mitm-victim"))
    with pytest.raises(ConnectionClosed, match="CERTIFICATE_VERIFY_FAILED"):
        minou.connect_sync(tls_broker.url, reconnect=False, **auth("naive"))


def test_plain_text_client_on_a_tls_listener_gets_nothing(tls_broker):
    plain = tls_broker.url.replace("minous://", "minou://")
    with pytest.raises(ConnectionClosed):
        minou.connect_sync(plain, reconnect=False, request_timeout=2, **auth("plain"))


def test_https_and_wss_use_the_same_certificate(tls_broker):
    cafile = str(tls_broker.data_dir / "tls" / "cert.pem")
    context = ssl.create_default_context(cafile=cafile)
    with urllib.request.urlopen(f"{tls_broker.http}/health", context=context, timeout=5) as r:
        assert r.status == 200
    wss = tls_broker.http.replace("https://", "wss://") + "/v1/ws"

    async def over_wss() -> int:
        c = await minou.connect(wss, tls_fingerprint=tls_broker.tls_fingerprint,
                                **auth("wss-client"))
        receipt = await c.send("tls/v1/3", {"n": 3})
        await c.close()
        return receipt.seq

    assert asyncio.run(over_wss()) == 1
