"""Start-up: rebuild memory from what storage holds (``restore``), and the one-time
migrations of stored state that older versions wrote."""

from __future__ import annotations

from collections.abc import Iterable

from ..names import match_keys, migrate_listen_key, parse_pattern
from .group import Group, GroupChannel
from .log import ChannelLog
from .snapshot import Snapshot
from .state import BrokerState
from .stream_ids import StreamIds, point_key, prune_points, stored_points
from .transactions import WRITER_LINEAGE_META

LISTEN_KEYS_META = "listen_keys"  # storage meta: "escaped" once older listener keys migrated


class Restorer:
    def __init__(self, state: BrokerState) -> None:
        self.state = state
        self._listen_keys_escaped = False  # restore() reads the storage's marker

    def restore(self, snap: Snapshot, now: float) -> None:
        """Rebuild memory from storage after a start."""
        state = self.state
        for gdef in snap.groups:
            state.add_group(Group(gdef.key, gdef.kind, [parse_pattern(p) for p in gdef.patterns]))
        logs = self._channels(snap, now)
        self._group_states(snap, now)
        self._attach_unsaved(logs, now)
        state.dedup.load(snap.dedup, now)  # built into memory over the next ticks
        state.producers.load(snap.producers, now)
        state.reservations = dict(snap.reservations)
        state.transactions.fences = {(w, c): b for w, c, b in snap.fences}
        state.transactions.writers = dict(snap.writers)
        state.transactions.load(snap.staged)
        state.transactions.lineages = {
            key[len(WRITER_LINEAGE_META):]: value for key, value in snap.meta.items()
            if key.startswith(WRITER_LINEAGE_META) and value}
        self._listen_keys_escaped = snap.meta.get(LISTEN_KEYS_META) == "escaped"

    def adopt(self, snap: Snapshot, now: float) -> list[ChannelLog]:
        """Add a queue's stored part (``Storage.open_queue``) to a running state, as
        ``restore`` would have built it; every other queue stays as it is. Groups the
        snapshot defines and memory does not know yet (another broker's readers made
        them) are added; known ones keep their members and patterns. Returns the new
        channels. ValueError if memory holds one of them already."""
        state = self.state
        clash = sorted(rec.name for rec in snap.channels if rec.name in state.channels)
        if clash:
            raise ValueError(f"channel(s) {', '.join(clash)} are held already: release "
                             "their queue before it is adopted again")
        for gdef in snap.groups:
            if gdef.key not in state.groups:
                state.add_group(Group(
                    gdef.key, gdef.kind, [parse_pattern(p) for p in gdef.patterns]))
        logs = self._channels(snap, now)
        touched = self._group_states(snap, now)
        touched.update(self._attach_unsaved(logs, now))
        for entry in snap.dedup:
            if entry[2] > now:
                state.dedup.put(*entry)
        state.producers.load(snap.producers, now)
        state.transactions.fences.update({(w, c): b for w, c, b in snap.fences})
        state.ids.hashed_all = False  # the new channels' ids are found by their hash
        for grp in touched:
            state.mark_ready(grp)
        return logs

    def _channels(self, snap: Snapshot, now: float) -> list[ChannelLog]:
        state = self.state
        logs = []
        for rec in snap.channels:
            log = ChannelLog(rec.name, state.options(rec.name))
            log.special_count = state.special_count
            log.cached = state.cached_bytes
            if log.kv is not None:
                log.kv.count = state.kv_count
            log.next_seq = log.end = rec.next_seq
            log.first_seq = min(rec.first_seq, rec.next_seq)
            log.cache_lo = rec.next_seq
            log.count = rec.count
            log.gone = rec.gone  # adopted: storage built it for the log
            state.add_channel(log)
            state.track_expiry(log, now)
            logs.append(log)
        for channel, seq, priority, deliver_at in snap.specials:
            if channel in state.channels:
                state.channels[channel].add_special(seq, priority, deliver_at)
        self._stream_ids(snap, logs)
        return logs

    def _stream_ids(self, snap: Snapshot, logs: list[ChannelLog]) -> None:
        """The explicit Redis stream ids of these channels (core/stream_ids.py), but
        for points no live message needs any more (dropped from storage too)."""
        mine = {log.name: log for log in logs}
        meta = self.state.batch.meta
        for name, points in stored_points(snap.meta).items():
            log = mine.get(name)
            if log is None:
                continue
            ids = StreamIds()
            for seq, value in points:
                if seq < log.next_seq:
                    ids.add(seq, value)
                else:  # a point whose message was never stored
                    meta[point_key(name, seq)] = None
            prune_points(name, ids, log.first_seq, meta)
            log.stream_ids = ids if len(ids) else None

    def _group_states(self, snap: Snapshot, now: float) -> dict[Group, None]:
        state = self.state
        touched: dict[Group, None] = {}
        for key, channel, floor, blob in snap.group_states:
            grp, read = state.groups.get(key), state.channels.get(channel)
            if grp is None or read is None or channel in grp.gcs:
                continue
            gc = GroupChannel(grp, read, floor)
            gc.restore(floor, blob)
            grp.gcs[channel] = gc
            read.states.append(gc)
            gc.load_specials(now)
            if gc.delayed or gc.sched:
                state.timed[gc] = None
            grp.ready[gc] = None
            touched[grp] = None
        return touched

    def _attach_unsaved(self, logs: list[ChannelLog], now: float) -> dict[Group, None]:
        """Channels created after a group's last save: the group reads them from their
        first seq. The groups reading a channel are looked up by its ``match_keys``
        (``BrokerState.patterns``): trying every group against every channel took
        20,000 groups x 100,000 channels (their bounds) = 2e9 checks at each start.
        Attached in the order that did: group by group, each's channels in order."""
        state = self.state
        found: list[tuple[int, int, Group, ChannelLog]] = []
        for j, log in enumerate(logs):
            found += [(grp.rank, j, grp, log)
                      for grp in state.patterns.groups_of(match_keys(log.name))
                      if log.name not in grp.gcs]
        found.sort(key=lambda f: f[:2])
        touched: dict[Group, None] = {}
        for _, _, grp, log in found:
            state.attach(grp, log, log.first_seq, now)
            touched[grp] = None
        return touched

    def migrate_listen_keys(self, registered: Iterable[str]) -> dict[str, str]:
        """Once, on the first start after an upgrade: give the listeners older versions
        stored their unambiguous keys (``names.migrate_listen_key``), deciding by the
        ``registered`` client ids. Returns ``{old key: new key}`` for the renamed ones."""
        if self._listen_keys_escaped:
            return {}
        state = self.state
        ids = set(registered)
        with_colon = [c for c in ids if ":" in c]
        renames = {key: new for key, grp in state.groups.items() if grp.kind == "listen"
                   and (new := migrate_listen_key(key, ids, with_colon)) != key}
        # Distinct old keys give distinct new ones, so rebuilding the table loses none.
        state.groups = {renames.get(key, key): grp for key, grp in state.groups.items()}
        for old, new in renames.items():
            grp = state.groups[new]
            grp.key = new
            state.batch.group_defs[old] = None  # with its states
            state.batch.group_defs[new] = grp.definition()
            for name, gc in grp.gcs.items():
                state.batch.group_states[(new, name)] = gc.durable_state()
        state.batch.meta[LISTEN_KEYS_META] = "escaped"
        self._listen_keys_escaped = True
        return renames
