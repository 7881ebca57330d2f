"""Idle expiry: a channel whose options set ``expire_idle`` is removed, with its
messages and the reader groups that read only it, once it has seen no publish, no
delivery and no connected reader for that many seconds (busmq's expiring queues;
request/reply inboxes by default). No I/O: the removal goes to storage with the next
batch, as a purge does.

A removed channel leaves a tombstone, its next seq (storage keeps its row with no
messages in it): a channel of the same name made later goes on from there, so no seq
and no message id is ever given twice. Tombstones are bounded: an inbox's goes at once
(its name, a client object's, is not made again) and past ``MAX_RETIRED_CHANNELS`` the
oldest go, with their rows (``WriteBatch.forgets``); such a name made again starts
from seq 1.
"""

from __future__ import annotations

import heapq

from ..limits import MAX_RETIRED_CHANNELS
from ..names import is_inbox
from .group import Group
from .log import ChannelLog
from .state import BrokerState
from .stream_ids import point_key
from .subscriptions import Subscriptions

EXPIRY_SCAN_S = 1.0  # how often the channels that may expire are looked at


class Expiry:
    def __init__(self, state: BrokerState, subscriptions: Subscriptions) -> None:
        self.state = state
        self.subscriptions = subscriptions
        self._next_scan = 0.0

    def tick(self, now: float) -> list[tuple[str, int]]:
        """Remove the channels idle past their ``expire_idle``; return each one's name
        and the messages removed with it."""
        if now < self._next_scan:
            return []
        self._next_scan = now + EXPIRY_SCAN_S
        state = self.state
        heap, expiring = state.expiry_heap, state.expiring
        gone: list[tuple[str, int]] = []
        while heap and heap[0][0] <= now:
            due, _, log = heapq.heappop(heap)
            if expiring.get(log) != due:
                continue  # stale: the channel went, or is watched with another due
            idle: float = log.options.expire_idle  # type: ignore[assignment]
            if log.inflight or any(gc.group.members or gc.pending for gc in log.states):
                # A publish on its way, or a reader connected: looked at each scan
                # while so, so that its idle time counts from when it was last seen.
                log.touched = now
                state.watch_expiry(log, now + min(idle, EXPIRY_SCAN_S))
            elif now - log.touched >= idle:
                gone.append((log.name, self.remove(log)))
            else:  # published to or delivered from since: idle from then
                state.watch_expiry(log, log.touched + idle)
        return gone

    def remove(self, log: ChannelLog) -> int:
        """Remove ``log`` with its messages, its reader groups' positions in it, and the
        groups left reading nothing, whose patterns name channels (a listener of just
        this channel; a wildcard's group stays for the channels to come); return the
        messages removed."""
        state = self.state
        name = log.name
        groups: list[Group] = []
        for gc in list(log.states):
            groups.append(gc.group)
            self.subscriptions.detach(gc)
        for grp in groups:  # none has a member: the channel would not be idle
            if not grp.gcs and all(p.concrete for p in grp.patterns):
                state.drop_group(grp)
                state.batch.group_defs[grp.key] = None
        removed = log.truncate_below(log.end)
        if log.stream_ids is not None:  # a stream made again under the name starts anew
            for seq in log.stream_ids.seqs:
                state.batch.meta[point_key(name, seq)] = None
        state.batch.truncates[name] = log.first_seq
        state.batch.channels[name] = log.next_seq
        state.drop_channel(log)
        del state.expiring[log]
        state.retired[name] = log.next_seq
        # An inbox's name is made once (a client object's): nothing of it needs to stay.
        # Other names may come again (and go on at the next seq) while few enough are
        # kept; past MAX_RETIRED_CHANNELS the oldest are forgotten.
        forget = [name] if is_inbox(name) else []
        if len(state.retired) - len(state.forgetting) - len(forget) > MAX_RETIRED_CHANNELS:
            oldest = next((n for n in state.retired if n not in state.forgetting), None)
            if oldest is not None and oldest not in forget:
                forget.append(oldest)
        for old in forget:
            state.forgetting.add(old)
            state.batch.forgets.append(old)
        state.counters.channels_expired += 1
        return removed
