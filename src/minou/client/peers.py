"""Peer channels (busmq's bi-directional channels): two sides of one conversation,
role ``a`` and role ``b``, each sending to the other, durable and in order, across
reconnects of either side (docs/peers.md).

A peer channel ``chat/v1/room-1`` is two channels: ``chat/v1/room-1!a`` carries what
``a`` sends, ``chat/v1/room-1!b`` what ``b`` sends. Each side reads the other's in a
consumer group of its role (``peer-a:chat/v1/room-1``), subscribed *exclusive*: the
first client to take a role reserves the channel it reads (as a ``!`` rule does), no
other client may read it, and one connection at a time holds the role. A message
waits until the other side reads it, even if that side has never connected yet.

Iterating acks each message when the next one is asked for (or the peer closes): a
side that dies while handling one gets it again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .message import Message, Receipt, until_closed

if TYPE_CHECKING:
    from .aio import Client, Subscription

ROLES = ("a", "b")
PEER_PREFETCH = 100  # messages in flight to one side (acked in order as it reads)


def peer_channels(channel: str, role: str) -> tuple[str, str]:
    """(the channel ``role`` sends on, the channel it reads) of peer channel ``channel``."""
    if role not in ROLES:
        raise ValueError(f"role must be 'a' or 'b', not {role!r}")
    other = ROLES[1 - ROLES.index(role)]
    return f"{channel}!{role}", f"{channel}!{other}"


def peer_group(channel: str, role: str) -> str:
    return f"peer-{role}:{channel}"


class Peer:
    """One side of a peer channel: ``send()`` to the other side, iterate (or ``get()``)
    what it sent. Made by ``Client.peer``."""

    def __init__(self, client: Client, channel: str, role: str, sub: Subscription) -> None:
        self.client = client
        self.channel = channel
        self.role = role
        self.sending, self.reading = peer_channels(channel, role)
        self._sub = sub
        self._last: Message | None = None  # handed out, acked when the next is asked for

    async def send(self, payload: Any, *, headers: dict[str, str] | None = None,
                   key: str | None = None) -> Receipt:
        """Send ``payload`` to the other side; returns once it is durable."""
        return await self.client.send(self.sending, payload, headers=headers, key=key)

    async def get(self, timeout: float | None = None) -> Message:
        """The next message from the other side (acking the one before); raises
        ``Timeout`` after ``timeout`` seconds."""
        self._ack_last()
        msg = await self._sub.get(timeout)
        self._last = msg
        return msg

    def __aiter__(self) -> AsyncIterator[Message]:
        return until_closed(self.get)

    def _ack_last(self) -> None:
        if self._last is not None:
            self._last.ack()  # an ack the caller made already is refused, harmlessly
            self._last = None

    async def close(self) -> None:
        """Ack what was handed out and leave the role (the reservation stays: the
        same client takes it again later; an admin releases it for another)."""
        last, self._last = self._last, None
        if last is not None:
            await last.ack()
        await self._sub.close()
