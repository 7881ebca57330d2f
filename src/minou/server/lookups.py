"""Expensive lookups one client may have being answered at once: OFFSETS with ``at``
(each matches the request's patterns against every channel on the event loop, then
looks each channel up in storage on the one reader thread). Without a bound, 20 of
them over 50,000 channels, sent at once from a few connections of one client, held
every other client's PING ~1.2 s; a connection alone was already bounded (4 answers
waiting for storage, ``READS_PER_CONNECTION``), a client's many connections were not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import TooManyConnections
from ..limits import MAX_OFFSETS_AT_PER_CLIENT
from . import oplog

if TYPE_CHECKING:
    from ..auth.registry import Identity


def nothing() -> None:
    pass


class ClientLookups:
    """How many OFFSETS-at lookups each client has being answered, over all its
    connections: at most ``per_client``. Admins, and the broker itself (no caller),
    are not bounded here, as for the long polls one client may have waiting."""

    def __init__(self, per_client: int = MAX_OFFSETS_AT_PER_CLIENT) -> None:
        self.per_client = per_client
        self.clients: Counter[str] = Counter()

    def __len__(self) -> int:
        """Lookups being answered now, all clients together."""
        return sum(self.clients.values())

    def take(self, caller: Identity | None) -> Callable[[], None]:
        """A slot for one lookup of ``caller``'s, or ``TooManyConnections`` (counted by
        whoever answers it, as every refusal); returns what gives it back (once, however
        often it is called: on the answer, an error or a cancellation alike)."""
        client = None if caller is None or caller.admin else caller.client_id
        if client is None:
            return nothing
        held = self.clients[client]
        if held >= self.per_client:
            oplog.client_bound(client, "OFFSETS lookups with at being answered",
                               "max_offsets_at_per_client", self.per_client)
            raise TooManyConnections(
                f"client {client!r} has {held} OFFSETS requests with at being answered "
                f"(over all its connections); a client may have {self.per_client} at once "
                f"(max_offsets_at_per_client), each matching and looking up many channels: "
                "wait for an answer before asking again", limit=self.per_client,
                client=client)
        self.clients[client] = held + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self.clients[client] -= 1
            if self.clients[client] <= 0:  # gone: a client id seen once is not kept
                del self.clients[client]

        return give_back
