"""minou: a small, durable, secure message broker."""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from .errors import (
    ClientError,
    ConfigError,
    ConnectionClosed,
    InvalidChannel,
    InvalidPayload,
    MessageTooLarge,
    MinouError,
    NoResponders,
    NotAuthenticated,
    NotAuthorized,
    NotFound,
    OutOfSequence,
    PendingApproval,
    QueueFull,
    RequestError,
    ResponderError,
    RevisionMismatch,
    SchemaMismatch,
    SendQueueFull,
    ShuttingDown,
    Timeout,
    UnknownDelivery,
)

if TYPE_CHECKING:
    from .client.aio import Client, Subscription, connect
    from .client.message import Message, Receipt
    from .client.sync import SyncClient, connect_sync

# The client is imported on first use: ``minou start`` (which imports this package)
# needs none of it, and it is half of the broker's import time (asyncio's client side,
# websockets, JWT signing): a restart serves sooner without it.
_CLIENT = {"Client": "aio", "Subscription": "aio", "connect": "aio", "Message": "message",
           "Receipt": "message", "SyncClient": "sync", "connect_sync": "sync"}


def __getattr__(name: str) -> Any:
    module = _CLIENT.get(name)
    if module is None:
        raise AttributeError(f"module 'minou' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".client.{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Client",
    "ClientError",
    "ConfigError",
    "ConnectionClosed",
    "InvalidChannel",
    "InvalidPayload",
    "Message",
    "MessageTooLarge",
    "MinouError",
    "NoResponders",
    "NotAuthenticated",
    "NotAuthorized",
    "NotFound",
    "OutOfSequence",
    "PendingApproval",
    "QueueFull",
    "Receipt",
    "RequestError",
    "ResponderError",
    "RevisionMismatch",
    "SchemaMismatch",
    "SendQueueFull",
    "ShuttingDown",
    "Subscription",
    "SyncClient",
    "Timeout",
    "UnknownDelivery",
    "__version__",
    "connect",
    "connect_sync",
]
