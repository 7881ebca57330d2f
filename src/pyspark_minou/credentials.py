"""The executors' credential, as the driver's processes share it.

Spark runs a query's driver-side code in several Python processes: the one that plans
a batch (and pickles the reader/writer for tasks, once per query for a source, once
per micro-batch for a sink), the long-lived one that asks a stream's source for
offsets, a fresh one for each micro-batch commit. They share nothing but the driver's
machine, so they share the credential through a file there, next to nothing else:
``$XDG_CACHE_HOME/minou/credentials/<hash>`` (mode 0600, in a 0700 directory), one
per job (broker URLs, client id, key file and the job's purpose). A pickling reuses a
live one after renewing it (so a sink does not issue one per micro-batch, and a query
started again does not pile up new ones), renewals and revocations name it by id.
The file holds a credential, never the key (which is on the same machine anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minou.errors import NotFound

log = logging.getLogger("pyspark_minou")
WithClient = Callable[[Callable[[Any], Any], str], Any]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "minou" / "credentials"


class CachedCredential:
    """The file of one job's credential: ``load``, ``save``, ``drop``."""

    def __init__(self, brokers: str, client_id: str | None, key_file: str | None,
                 purpose: str) -> None:
        job = json.dumps([brokers, client_id, os.path.abspath(key_file or ""), purpose])
        self.path = cache_dir() / hashlib.sha256(job.encode()).hexdigest()[:32]

    def load(self) -> tuple[str, str] | None:
        """(id, secret) of the job's last credential, if this machine has one."""
        try:
            data = json.loads(self.path.read_text())
            return str(data["id"]), str(data["credential"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, credential_id: str, secret: str) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
            with os.fdopen(fd, "w") as out:  # mkstemp: mode 0600
                json.dump({"id": credential_id, "credential": secret}, out)
            os.replace(tmp, self.path)
        except OSError as exc:  # no cache: each pickling issues its own (they expire)
            log.warning("cannot keep the executors' credential in %s: %s", self.path, exc)

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def obtain(cache: CachedCredential, with_client: WithClient, ttl: float,
           purpose: str) -> str:
    """The job's secret for tasks: the cached one renewed to now + ttl, or a new one."""
    cached = cache.load()
    if cached is not None:
        credential_id, secret = cached
        try:
            with_client(lambda c: c.renew_credential(credential_id, ttl),
                        "renewing the executors' credential")
            return secret
        except NotFound:  # expired, revoked, or its client's key rotated: a new one
            cache.drop()
    issued = with_client(lambda c: c.issue_credential(ttl=ttl, purpose=purpose),
                         "issuing a credential for the executors")
    cache.save(str(issued["id"]), str(issued["credential"]))
    log.info("issued credential %s (%s), %.0f s", issued["id"], purpose, ttl)
    return str(issued["credential"])


def renew(cache: CachedCredential, with_client: WithClient, ttl: float,
          purpose: str) -> None:
    """Extend the job's credential; by purpose when this process cannot see the file."""
    cached = cache.load()
    if cached is None:
        with_client(lambda c: c.admin("credentials.renew", purpose=purpose, ttl=ttl),
                    "renewing the executors' credential")
        return
    with_client(lambda c: c.renew_credential(cached[0], ttl),
                "renewing the executors' credential")


def revoke(cache: CachedCredential, with_client: WithClient, purpose: str) -> None:
    cached = cache.load()
    cache.drop()
    if cached is None:
        with_client(lambda c: c.admin("credentials.revoke", purpose=purpose),
                    "revoking the executors' credential")
        return
    with contextlib.suppress(NotFound):  # already gone: that is what was asked
        with_client(lambda c: c.revoke_credential(cached[0]),
                    "revoking the executors' credential")
