"""Link credentials (spread.py): what one broker presents to another for a client it
authenticated. Only the cluster's secret makes one; it names one client and expires."""

from __future__ import annotations

import time

import pytest

from minou.errors import NotAuthenticated
from minou.server.spread import LINK_PREFIX, SpreadRole


def role(secret: bytes) -> SpreadRole:
    r = SpreadRole.__new__(SpreadRole)  # only the secret matters here
    r.secret = secret
    return r


def test_a_link_credential_vouches_for_its_client_only() -> None:
    a = role(b"s" * 32)
    cred = a.link_credential("app-1")
    a.verify_link(cred, "app-1")  # accepted
    with pytest.raises(NotAuthenticated, match="not signed"):
        a.verify_link(cred, "app-2")


@pytest.mark.parametrize("forge", [
    lambda c: c[:-2] + ("AA" if not c.endswith("AA") else "BB"),  # tampered signature
    lambda c: "mdc1" + c[len(LINK_PREFIX):],  # another prefix
    lambda c: "mlk1.notanumber.xyz",  # malformed
    lambda c: "mlk1",  # malformed
])
def test_forged_link_credentials_are_refused(forge) -> None:
    a = role(b"s" * 32)
    with pytest.raises(NotAuthenticated):
        a.verify_link(forge(a.link_credential("app-1")), "app-1")


def test_another_clusters_secret_or_none_is_refused() -> None:
    cred = role(b"o" * 32).link_credential("app-1")
    with pytest.raises(NotAuthenticated, match="not signed"):
        role(b"s" * 32).verify_link(cred, "app-1")
    with pytest.raises(NotAuthenticated):
        role(b"").verify_link(role(b"").link_credential("app-1"), "app-1")


def test_an_expired_link_credential_is_refused() -> None:
    a = role(b"s" * 32)
    expires = int(time.time()) - 1
    cred = f"{LINK_PREFIX}.{expires}.{a._sign('app-1', expires)}"
    with pytest.raises(NotAuthenticated, match="expired"):
        a.verify_link(cred, "app-1")
