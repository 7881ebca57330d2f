"""``Session``: the core's side of one connection (its subscriptions, leases, rights
and producer states)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..auth.rules import ALLOW_ALL, Access
from .group import Lease, Subscription
from .producers import ProducerState


@dataclass(eq=False)
class Session:
    """One connected client as the core sees it. ``conn`` belongs to the adapter."""

    client_id: str
    conn: Any = None
    subs: dict[int, Subscription] = field(default_factory=dict)
    leases: dict[int, Lease] = field(default_factory=dict)
    access: Access = ALLOW_ALL  # what the rules let this client read and write
    admin: bool = False
    producer_id: str = ""  # numbers this connection's idempotent publishes
    # channel -> its producer state: the publish path looks up the session's own few
    producer_states: dict[str, ProducerState] = field(default_factory=dict)
