"""What the doors and the admin operations may use of the broker process: the one
interface between ``app.BrokerServer`` (which builds everything) and the modules it
builds, so that none of them imports ``app`` and ``server/`` has no import circle.

Only types here; ``BrokerServer`` is the implementation, checked by mypy-style
structural typing (``tests/unit/test_ports.py`` checks that it has every member).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..auth.credentials import Credentials
    from ..auth.registry import Identity, Registry
    from ..config import Settings
    from ..core.broker import Broker, Session
    from ..errors import StorageFull, StorageUnavailable
    from ..protocol import frames as f
    from .admission import Admission
    from .engine import CommitScheduler, Engine
    from .lookups import ClientLookups


class Server(Protocol):
    """The broker process as its doors see it."""

    # -------------------------------------------------------------- the parts
    settings: Settings
    core: Broker
    engine: Engine
    scheduler: CommitScheduler
    registry: Registry
    credentials: Credentials
    admission: Admission
    input_budget: Any  # input_budget.InputBudget: frames and bodies still arriving
    lookups: ClientLookups  # OFFSETS-at being answered, per client
    metrics: Any  # metrics.Metrics
    rates: Any  # rate_history.RateHistory
    tls: Any  # tls.TlsFiles when the listeners speak TLS
    http_consumers: Any  # http_consumers.HttpConsumers with the HTTP API
    resp_groups: Any  # resp_groups.RespGroups with the Redis protocol
    http_asks: set[Any]  # futures of HTTP requests awaiting their replies
    closing: bool  # stop() has begun
    http_task: asyncio.Task[Any] | None
    connections: set[Any]  # connection.NativeConnection
    streams: set[Any]  # http_stream.StreamSession
    max_frame_size: int

    # ------------------------------------------------------ state and counters
    started_at: float
    stop_reason: str
    storage_full: StorageFull | None
    storage_down: StorageUnavailable | None
    primary: Any  # primary.PrimaryRole when several brokers share the storage, else None
    spread: Any  # spread.SpreadRole when they spread the queues (placement = "spread")
    storage_full_since: float
    authentications: Counter[str]
    slow_consumers: int
    dead_connections: int
    counters_internal: int

    @property
    def accepting(self) -> bool: ...

    @property
    def draining(self) -> bool: ...

    # ---------------------------------------------------- sessions and identity
    def admit(self, conn: Any) -> None: ...
    def input_done(self, holder: Any) -> None: ...
    def authenticate(self, hello: f.Hello, peer: str = "") -> Identity: ...
    def delegated(self, credential: str, client_id: str | None = None) -> Identity: ...
    def access_for(self, identity: Identity) -> Any: ...
    def http_identity(self, identity: Identity) -> Identity: ...
    def open_session(self, identity: Identity, conn: Any) -> Session: ...
    def count_tls_failure(self) -> None: ...
    def wake_groups(self, session: Session) -> None: ...
    def note_unsent(self, conn: Any, buffered: int) -> bool: ...

    # ------------------------------------------------------- reads and admin
    def read_range(self, conn: Any, frame: f.Read) -> None: ...
    def read_messages(self, channel: str, from_seq: int, upto: int,
                      limit: int, max_bytes: int = ...) -> Awaitable[list[Any]]: ...
    def offsets_at(self, session: Session, patterns: list[str], at: float,
                   limit: int | None) -> asyncio.Future[dict[str, list[int]]]: ...
    def seqs_at(self, found: dict[str, list[int]], at: float
                ) -> Awaitable[dict[str, list[int]]]: ...
    def oldest_published(self, log_: Any, group: str | None = None
                         ) -> Awaitable[float | None]: ...
    def message_receipt(self, message_id: str) -> Awaitable[dict[str, Any]]: ...
    def admin(self, op: str, args: dict[str, Any], caller: Identity | None = None) -> Any: ...
    def spawn_reply(self, conn: Any, req: int, pending: Any, *,
                    read_only: bool = False) -> Any: ...
    def persist_registry(self) -> None: ...
    def drop_client(self, client_id: str, reason: str, *, credential: str = "") -> int: ...
    def reapply_identities(self) -> list[dict[str, Any]]: ...
    def ended_subscriptions(self, subs: list[Any], reason: str) -> None: ...
    def reload(self, *, by: str = "admin request") -> dict[str, Any]: ...
    def soft_stop(self, by: str) -> dict[str, Any]: ...
    def status(self) -> dict[str, Any]: ...
    def queue_rates(self, queue: str) -> dict[str, float]: ...
    def render_metrics(self) -> Awaitable[bytes]: ...
