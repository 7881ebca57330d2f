"""Messages that leave their channel unread: expired (TTL) ones, and ones requeued past
their channel's limit. Both are copied to the channel's dead-letter channel
(``_dead/<channel>``) when its options keep dead letters."""

from __future__ import annotations

from ..names import dead_letter_channel, is_dead_letter
from .log import ChannelLog, Msg
from .publishing import make_room
from .state import BrokerState


class DeadLetters:
    def __init__(self, state: BrokerState) -> None:
        self.state = state

    def expire(self, channel: str, seq: int, msg: Msg | None) -> bool:
        """Remove message ``seq`` of ``channel``, past its TTL; dead-letter its body if
        known. False if it was gone already."""
        state = self.state
        log = state.channels[channel]
        if not log.delete_one(seq):
            return False
        log.expired += 1
        state.counters.expired += 1
        state.batch.deletes.append((channel, seq))
        state.batch.channels[channel] = log.next_seq
        if msg is not None:
            self.dead_letter(msg, "ttl", "", "message TTL expired")
        return True

    def dead_letter(self, msg: Msg, reason: str, group: str, text: str) -> None:
        """Stage a copy of ``msg`` in its dead-letter channel, saying why in its headers."""
        state = self.state
        state.counters.dead_lettered += 1
        src = state.channels.get(msg.channel)
        if src is None or not src.options.dead_letter or is_dead_letter(msg.channel):
            return
        log = state.log(dead_letter_channel(msg.channel), msg.published_at)
        # A dead letter cannot be refused (its message is leaving its channel anyway):
        # a full dead-letter channel drops its oldest, whatever the channel's overflow.
        make_room(state, log)
        headers = dict(msg.headers or {})
        headers.update({
            "x-dead-reason": reason, "x-dead-detail": text,
            "x-original-channel": msg.channel, "x-original-seq": str(msg.seq),
            "x-original-id": msg.id,
        })
        if group:
            headers["x-dead-group"] = group
        self._stage(log, msg.data, msg.raw, headers, msg.published_at, msg.key)

    def keep(self, channel: str, data: bytes, raw: bool, headers: dict[str, str],
             key: str | None, now: float) -> Msg:
        """Stage a message that never was in ``channel`` (a federation link's, refused by
        its destination) in ``channel``'s dead letters, whatever its options say."""
        state = self.state
        state.counters.dead_lettered += 1
        log = state.log(dead_letter_channel(channel), now)
        make_room(state, log)
        return self._stage(log, data, raw, headers, now, key)

    def _stage(self, log: ChannelLog, data: bytes, raw: bool, headers: dict[str, str],
               published_at: float, key: str | None) -> Msg:
        state = self.state
        dead = Msg(log.name, log.next_seq, state.ids.new_id(log, log.next_seq), data,
                   raw, headers, 0, published_at, None, None, key)
        log.next_seq += 1
        log.inflight += 1
        state.batch.channels[log.name] = log.next_seq
        state.batch.messages.append(dead)
        return dead
