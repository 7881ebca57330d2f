"""Option parsing and the lazily opened broker client shared by readers and writers.

Spark hands every data source its options as a ``CaseInsensitiveDict`` of strings
(P8 of the research report): copying it with ``dict()`` lower-cases the keys, so
this module copies it once into a plain dict with lower-case keys and every lookup
uses lower-case names.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import minou
from minou.client.sync import SyncClient
from minou.errors import ConnectionClosed, NotAuthenticated, Timeout, TooManyConnections
from minou.limits import DEFAULT_CREDENTIAL_TTL_S, MAX_CREDENTIAL_TTL_S, MIN_CREDENTIAL_TTL_S

from . import credentials
from .credentials import CachedCredential

T = TypeVar("T")
log = logging.getLogger("pyspark_minou")
# What a lost or restarting broker raises: worth reconnecting for, until reconnectTimeout.
RETRYABLE = (ConnectionClosed, Timeout, OSError)
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
# A stream's source renews its credential at every trigger, so a day covers any stall
# of the driver. Its sink can renew only when a micro-batch commits: an idle stream runs
# none, so the sink's lives the longest the broker allows (a week).
DEFAULT_STREAM_CREDENTIAL_TTL_S = 24 * 3600.0
DEFAULT_STREAM_SINK_CREDENTIAL_TTL_S = MAX_CREDENTIAL_TTL_S

SCHEMA_DDL = (
    "channel string, seq long, id string, key string, payload string, "
    "headers map<string,string>, published_at timestamp"
)
# payloadFormat=binary: the payload as stored (JSON text or a raw message's bytes)
SCHEMA_DDL_BINARY = SCHEMA_DDL.replace("payload string", "payload binary")


def binary_payload(options: Mapping[str, str]) -> bool:
    """The read option payloadFormat: string (JSON text, the default) or binary."""
    value = (opt(options, "payloadFormat", "string") or "string").lower()
    if value not in ("string", "binary"):
        raise MinouSparkError(f"option payloadFormat={value!r}: expected string (JSON text) "
                              "or binary (the bytes as stored, raw messages included)")
    return value == "binary"


class MinouSparkError(ValueError):
    """A misconfigured option or an unrecoverable condition the user must act on."""


def normalize(options: Mapping[str, str]) -> dict[str, str]:
    """A plain dict with lower-case keys (see the module docstring for why)."""
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def opt(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    value = options.get(name.lower())
    return default if value is None or value == "" else value


def opt_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = opt(options, name)
    if value is None:
        return default
    try:
        out = int(value)
    except ValueError:
        raise MinouSparkError(f"option {name}={value!r}: expected an integer") from None
    if out < 1:
        raise MinouSparkError(f"option {name}={value!r}: must be >= 1")
    return out


def opt_seconds(options: Mapping[str, str], name: str, default: float) -> float:
    value = opt(options, name)
    if value is None:
        return default
    try:
        out = float(value)
    except ValueError:
        raise MinouSparkError(f"option {name}={value!r}: expected a number of seconds") \
            from None
    if not out >= 0:  # also refuses NaN
        raise MinouSparkError(f"option {name}={value!r}: must be >= 0 seconds")
    return out


def opt_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = opt(options, name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise MinouSparkError(f"option {name}={value!r}: expected true or false")


def parse_offsets_json(name: str, value: str) -> dict[str, int]:
    """``{"channel": seq}``; seq -2 means earliest and -1 latest (as Kafka's source)."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise MinouSparkError(
            f"option {name}: expected earliest, latest or a JSON object "
            f'{{"channel": seq}}, got {value!r} ({exc})') from None
    if not isinstance(data, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in data.values()):
        raise MinouSparkError(f"option {name}: expected a JSON object of channel -> integer "
                              f"seq, got {value!r}")
    return {str(k): int(v) for k, v in data.items()}


DEFAULT_CLIENT_ID = "spark"


def local_file(option: str, path: str) -> str:
    """A file option as this machine sees it: the path if it exists here, else a file
    shipped with ``--files`` / ``spark.files`` under that name (``SparkFiles.get``).
    Otherwise a precise error: the option, the path and the machine."""
    if os.path.exists(path):
        return path
    with contextlib.suppress(Exception):  # no SparkContext or files root in this process
        from pyspark import SparkFiles

        name = os.path.basename(path)
        root = SparkFiles.getRootDirectory()
        # The process that plans a streaming source gets <root>/streaming_job as its
        # root, where the shipped files are not (PySpark 4.3): look one level up too.
        for shipped in (os.path.join(root, name),
                        os.path.join(os.path.dirname(root.rstrip(os.sep)), name)):
            if os.path.exists(shipped):
                return shipped
    raise MinouSparkError(
        f"option {option}={path!r}: no such file on {socket.gethostname()}. Give a path "
        "that exists on the driver and on every executor, or ship the file with --files "
        "(spark.files) and give its name")


def in_task() -> bool:
    """Whether this code runs in a Spark task (an executor), not in the driver's planning
    and commit processes (which run on the driver's machine and may read its files)."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def job_purpose(kind: str, options: Mapping[str, str]) -> str:
    """The name under which a query's credentials are issued, renewed and revoked: the
    same in every driver-side process of the query (they see the same options), so a
    renewal reaches the credential another process issued without knowing its id."""
    name = opt(options, "writerId") or opt(options, "groupName") or \
        opt(options, "queryName") or opt(options, "pattern") or opt(options, "channel") or ""
    digest = hashlib.sha256(json.dumps(
        sorted((k, v) for k, v in options.items() if k != "brokertoken")).encode())
    return f"spark {kind} {name[:80]} {digest.hexdigest()[:16]}"


@dataclass(frozen=True)
class ClientConfig:
    """How to reach and authenticate to the broker; picklable (no socket in it)."""

    brokers: str
    client_id: str | None = None
    key_file: str | None = None
    broker_token: str | None = field(default=None, repr=False)
    tls_fingerprint: str | None = None
    cafile: str | None = None
    # How long a task or the driver keeps reconnecting to a lost broker before failing.
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT_S
    # How tasks authenticate when the driver holds a key: "credential" (a delegated
    # credential the driver issues; the key never leaves its machine) or "keyFile".
    executor_auth: str = "credential"
    credential_ttl: float = DEFAULT_CREDENTIAL_TTL_S
    purpose: str = ""
    credential: str | None = field(default=None, repr=False)  # the secret: never shown

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, kind: str = "read",
                     streaming: bool = False) -> ClientConfig:
        brokers = opt(options, "brokers")
        if not brokers:
            raise MinouSparkError(
                "option brokers is required: comma-separated broker URLs, e.g. "
                "minou://host:7700")
        key_file = opt(options, "keyFile")
        # Checked where the query is planned, so a missing file fails it at once rather
        # than in every task (executors resolve the same names again: local_file, but
        # never keyFile unless executorAuth=keyFile).
        for option in ("keyFile", "cafile"):
            path = opt(options, option)
            if path is not None:
                local_file(option, path)
        # One id for the driver and every executor: staged transactions belong to the
        # client that staged them, and the driver commits them.
        client_id = opt(options, "clientId") or (
            Path(key_file).stem if key_file else DEFAULT_CLIENT_ID)
        executor_auth = opt(options, "executorAuth", "credential") or "credential"
        if executor_auth not in ("credential", "keyFile"):
            raise MinouSparkError(
                f"option executorAuth={executor_auth!r}: expected credential (the driver "
                "issues a delegated credential; the key stays on its machine) or keyFile "
                "(every executor reads keyFile itself)")
        default_ttl = DEFAULT_CREDENTIAL_TTL_S if not streaming else \
            DEFAULT_STREAM_SINK_CREDENTIAL_TTL_S if kind == "write" else \
            DEFAULT_STREAM_CREDENTIAL_TTL_S
        ttl = opt_seconds(options, "credentialTtl", default_ttl)
        if not MIN_CREDENTIAL_TTL_S <= ttl <= MAX_CREDENTIAL_TTL_S:
            raise MinouSparkError(f"option credentialTtl={ttl:g}: must be "
                                  f"{MIN_CREDENTIAL_TTL_S:g}..{MAX_CREDENTIAL_TTL_S:g} s")
        return cls(brokers, client_id, key_file, opt(options, "brokerToken"),
                   opt(options, "tlsFingerprint"), opt(options, "cafile"),
                   opt_seconds(options, "reconnectTimeout", DEFAULT_RECONNECT_TIMEOUT_S),
                   executor_auth, ttl, job_purpose(kind, options))

    @property
    def delegates(self) -> bool:
        """Whether tasks get a credential issued by the driver instead of the key."""
        return self.key_file is not None and self.executor_auth == "credential"

    def connect(self) -> SyncClient:
        # No reconnect: a task that loses its broker should fail and let Spark retry it,
        # rather than block on a reconnect loop with half a partition read or staged.
        cafile = local_file("cafile", self.cafile) if self.cafile else None
        common: dict[str, Any] = {
            "client_id": self.client_id, "broker_token": self.broker_token,
            "tls_fingerprint": self.tls_fingerprint, "cafile": cafile, "reconnect": False}
        if self.credential is not None and in_task():
            return minou.connect_sync(self.brokers, credential=self.credential, **common)
        key = local_file("keyFile", self.key_file) if self.key_file else None
        return minou.connect_sync(self.brokers, key=key, **common)


class LazyClient:
    """Mixin: ``self.client()`` opens a connection on first use, in whatever process runs.

    Readers and writers are pickled from the planner to executors (P6); a live client
    holds a socket and an event-loop thread, so it is dropped from the pickled state.
    """

    config: ClientConfig
    _client: SyncClient | None = None
    _reached = False  # whether this object ever connected (here: a task, or the driver)

    def client(self) -> SyncClient:
        if self._client is None:
            try:
                self._client = self.config.connect()
            except NotAuthenticated as exc:
                if exc.detail.get("why") == "credential_expired" and in_task():
                    raise MinouSparkError(
                        f"the executors' credential ({self.config.purpose}) expired: the "
                        "driver renews it at every trigger of a minou source and every "
                        "micro-batch commit of a minou sink, and this query ran none for "
                        f"credentialTtl={self.config.credential_ttl:g} s (or its driver "
                        "stopped). Restart the query, or give a longer credentialTtl (up "
                        f"to {MAX_CREDENTIAL_TTL_S:g} s). {exc}") from exc
                raise
            self._reached = True
        return self._client

    # ------------------------------------------------ credentials (driver side)
    def _cached(self) -> CachedCredential:
        c = self.config
        return CachedCredential(c.brokers, c.client_id, c.key_file, c.purpose)

    def delegate(self) -> None:
        """Before this object is pickled for tasks: a credential for them, so executors
        never need the key (docs/spark.md, "Running on a cluster")."""
        c = self.config
        if not c.delegates or c.credential is not None or in_task():
            return
        try:
            secret = credentials.obtain(self._cached(), self.with_client, c.credential_ttl,
                                        c.purpose)
        finally:
            self.close_client()
        self.config = replace(c, credential=secret)

    def renew_credentials(self) -> None:
        """Extend this job's credential (whichever driver-side process issued it) to
        now + credentialTtl; tasks keep the secret they were given."""
        c = self.config
        if c.delegates:
            credentials.renew(self._cached(), self.with_client, c.credential_ttl, c.purpose)

    def revoke_credentials(self) -> None:
        """The job is done: its credential stops working now rather than at expiry."""
        c = self.config
        if not c.delegates:
            return
        try:
            credentials.revoke(self._cached(), self.with_client, c.purpose)
        except Exception as exc:  # best effort: it expires anyway
            log.warning("revoking credential %s failed: %s", c.purpose, exc)

    def with_client(self, call: Callable[[SyncClient], T], what: str = "a call") -> T:
        """``call(client)``; a lost or unreachable broker (it restarted, say) is
        reconnected to, with backoff, and the call made again until reconnectTimeout,
        then fails naming the broker. Only for calls that are safe to repeat (reads by
        seq, offsets, positions, aborts); any other failure drops the connection too,
        so the next call starts on a fresh one."""
        deadline: float | None = None
        delay = 0.2
        while True:
            try:
                return call(self.client())
            except RETRYABLE as exc:
                self.close_client()
                now = time.monotonic()
                deadline = deadline or now + self.config.reconnect_timeout
                self.wait_to_retry(exc, what, deadline, delay)
                delay = min(delay * 2, 2.0)
            except BaseException:
                self.close_client()
                raise

    def with_client_when_room(self, call: Callable[[SyncClient], T], what: str) -> T:
        """``with_client``, and a refusal for a bound on how many such requests one client
        may have answered at once (``TooManyConnections``: this client's other queries
        hold the slots: OFFSETS with ``at``, 4 at once) waited out, with backoff, until
        reconnectTimeout; then fails naming the bound. Several queries planned at the
        same moment under one clientId take turns instead of failing."""
        deadline = time.monotonic() + self.config.reconnect_timeout
        delay = 0.05
        while True:
            try:
                return self.with_client(call, what)
            except TooManyConnections as exc:
                if time.monotonic() + delay > deadline:
                    raise MinouSparkError(
                        f"{what}: the broker at {self.config.brokers} refused it for "
                        f"reconnectTimeout={self.config.reconnect_timeout:g} s because "
                        f"this clientId's other requests of its kind held every slot: "
                        f"{exc}. Give concurrent queries their own clientId, or raise "
                        "reconnectTimeout") from exc
                log.info("%s: refused while this client's other requests are answered "
                         "(%s); trying again in %.2f s", what, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def wait_to_retry(self, exc: BaseException, what: str, deadline: float,
                      delay: float) -> None:
        """Sleep ``delay`` before trying again, or raise if that would pass ``deadline``."""
        if time.monotonic() + delay > deadline:
            if not self._reached and in_task():
                raise MinouSparkError(
                    f"{what}: a task on executor host {socket.gethostname()} cannot reach "
                    f"the broker at {self.config.brokers} (tried for reconnectTimeout="
                    f"{self.config.reconnect_timeout:g} s), though the driver reached it to "
                    "plan the query. Executors must resolve and reach the URLs of option "
                    "brokers: check DNS, firewalls, and that the broker listens on an "
                    f"address they can reach (not 127.0.0.1). Last error: {exc}") from exc
            raise MinouSparkError(
                f"{what}: lost the broker at {self.config.brokers} and could not get it back "
                f"within reconnectTimeout={self.config.reconnect_timeout:g} s: {exc}") from exc
        log.warning("%s: broker at %s lost (%s); reconnecting in %.1f s", what,
                    self.config.brokers, exc, delay)
        time.sleep(delay)

    def close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # Closing is best effort: the work is already done, or failed anyway.
            with contextlib.suppress(Exception):
                client.close()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled on the driver, for tasks: the one moment to hand them a credential.
        self.delegate()
        state = dict(self.__dict__)
        state.pop("_client", None)
        state.pop("_reached", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._client = None
