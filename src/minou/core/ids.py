"""Message ids: ``<16 hex digits><seq in hex>``, the first part a 64-bit hash of the
channel name, so a receipt lookup finds the message without an index."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from ..errors import UnknownDelivery
from .log import ChannelLog

_MESSAGE_ID = re.compile(r"[0-9a-f]{16}[1-9a-f][0-9a-f]{0,14}")  # what new_id makes


class MessageIds:
    def __init__(self) -> None:
        self.by_hash: dict[int, list[str]] = {}  # channel hash -> the names hashed to it
        self.hashed_all = False  # pragma: no mutate  (falsy either way)
        # Channels restored from storage get hashed on the first lookup.

    def new_id(self, log: ChannelLog, seq: int) -> str:
        """The id of message ``seq`` of ``log``."""
        return f"{self.channel_hash(log):016x}{seq:x}"

    def channel_hash(self, log: ChannelLog) -> int:
        h = log.id_hash
        if not h:
            digest = hashlib.blake2b(log.name.encode(), digest_size=8).digest()
            h = log.id_hash = int.from_bytes(digest, "big") or 1  # pragma: no mutate
            names = self.by_hash.setdefault(h, [])
            if log.name not in names:  # a channel made again after it expired
                names.append(log.name)
        return h

    def find(self, message_id: str,
             channels: Mapping[str, ChannelLog]) -> tuple[ChannelLog, int] | None:
        """The channel and seq a message id names, if that channel is known.

        Raises UnknownDelivery when two known channels share the id's 64-bit hash (a
        collision someone made on purpose): the id then names no single message, and
        answering for either channel could hand one client's receipt to another.
        """
        if not _MESSAGE_ID.fullmatch(message_id):
            return None
        h, seq = int(message_id[:16], 16), int(message_id[16:], 16)
        if not self.hashed_all:  # ids of channels created before this run: hash them once
            for known in channels.values():
                self.channel_hash(known)
            self.hashed_all = True  # pragma: no mutate  (else: hashing again, idempotent)
        logs = {name: log for name in self.by_hash.get(h, ())  # names hashed to h
                if (log := channels.get(name)) is not None}
        if len(logs) > 1:
            why = "more than one channel has its hash: it names no one message"  # pragma: no mutate
            raise UnknownDelivery(
                f"message id {message_id!r} is ambiguous: {why}", id=message_id)
        for found in logs.values():
            return found, seq
        return None
