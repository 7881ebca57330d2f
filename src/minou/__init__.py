"""minou: a small, durable, secure message broker."""

from __future__ import annotations

__version__ = "0.1.0"

from .client.aio import Client, Subscription, connect
from .client.message import Message, Receipt
from .client.sync import SyncClient, connect_sync
from .errors import (
    ClientError,
    ConfigError,
    ConnectionClosed,
    InvalidChannel,
    InvalidPayload,
    MessageTooLarge,
    MinouError,
    NotAuthenticated,
    NotAuthorized,
    NotFound,
    OutOfSequence,
    PendingApproval,
    QueueFull,
    RequestError,
    SchemaMismatch,
    SendQueueFull,
    ShuttingDown,
    Timeout,
    UnknownDelivery,
)

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
    "NotAuthenticated",
    "NotAuthorized",
    "NotFound",
    "OutOfSequence",
    "PendingApproval",
    "QueueFull",
    "Receipt",
    "RequestError",
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
