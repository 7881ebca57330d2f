"""minou: a small, durable, secure message broker."""

from __future__ import annotations

__version__ = "0.1.0"

from .client.aio import Client, Subscription, connect
from .client.message import Message, Receipt
from .client.sync import SyncClient, connect_sync
from .errors import (
    ClientError,
    ConnectionClosed,
    MinouError,
    RequestError,
    SendQueueFull,
    Timeout,
)

__all__ = [
    "Client",
    "ClientError",
    "ConnectionClosed",
    "Message",
    "MinouError",
    "Receipt",
    "RequestError",
    "SendQueueFull",
    "Subscription",
    "SyncClient",
    "Timeout",
    "__version__",
    "connect",
    "connect_sync",
]
