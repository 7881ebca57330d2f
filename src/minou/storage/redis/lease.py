"""The primary lease: which broker of those on one Redis (one key prefix) serves.

Several brokers may run on one Redis; one of them, the primary, holds a lease key
(``SET NX PX``) and renews it every third of ``owner_lease``; the others wait as
standbys and take over once it runs out: a crashed primary is replaced within
``owner_lease``, and a paused one that wakes up finds the key gone or someone else's.
Correctness never depends on the lease alone: taking over raises every queue's epoch
(``RedisStorage.open`` claims them) and every write checks the epoch, or the lease
itself for shared state, inside its script, so a stale primary writes nothing.

Each broker also keeps a ``member:<id>`` hash (its addresses, since when), expiring
with its lease, so standbys and clients can be told where the primary is. Leases are
Redis timers (``PX``): no clock has to agree across machines.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from .client import node_client
from .keys import shared_base

# The brokers alive on this prefix: a sorted set of member ids scored by when their
# record runs out, in Redis's own clock (TIME), so counting them needs no SCAN and no
# clock of the brokers'. KEYS[1] the set; ARGV: member, milliseconds it lives.
_SEEN = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
# A broker's record and its place in the alive set, in one step that a Redis at
# ``maxmemory`` still runs (allow-oom: a few bounded bytes): refused, no broker would
# stay alive, none would deliver, and consumers could not free the room publishes need.
# KEYS[1] the member hash, KEYS[2] the alive set; ARGV: member, milliseconds it lives,
# milliseconds its record lives, then field, value pairs.
_RECORD = "#!lua flags=allow-oom\n" + r"""
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
""" + _SEEN.replace("KEYS[1]", "KEYS[2]")
# Renew the lease only if it is still ours; refresh this member's record with it.
# Returns 0 if the lease is not ours, else how many brokers are alive (this one too).
_RENEW = r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
""" + _SEEN.replace("KEYS[1]", "KEYS[3]")
# Take the lease if nobody holds it, raising the term: each holder's is newer than any
# before it (Redis Cluster claims compare terms, scripts.ADMIT). KEYS[1] the lease,
# KEYS[2] the term; ARGV: member, milliseconds.
_TAKE = r"""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""
EVENTS_KEPT = 50  # the cluster's recent takeovers and hand-overs, newest first
# Give the lease up if ours, and wake one standby waiting in wait_handoff at once.
_RELEASE = r"""
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""


class PrimaryLease:
    """Blocking, for one thread at a time (the broker's lease thread)."""

    def __init__(self, client: redis.Redis, prefix: str, member: str, lease_s: float) -> None:
        self.client = client
        self.member = member
        self.lease_ms = max(1, int(lease_s * 1000))
        base = shared_base(prefix)
        self.key = base + "primary"
        self._term = base + "term"
        self.member_key = base + "member:" + member
        self._member_base = base + "member:"
        self._events = base + "events"
        self._alive = base + "alive"
        self._handoff = base + "handoff"  # a list a releasing primary pushes to
        self.renewals = 0
        self.alive = 1  # brokers on this prefix at the last renewal or record, this one too
        self.held_since: float | None = None  # monotonic, while this broker is primary

    def _record(self, info: dict[str, str]) -> None:
        # Alive for one lease (its record stays three, for `minou cluster` to show it
        # gone): a standby refreshes both every third of the lease.
        fields = [x for pair in info.items() for x in pair]
        self.alive = int(self.client.eval(_RECORD, 2, self.member_key, self._alive,
                                          self.member, self.lease_ms, self.lease_ms * 3,
                                          *fields))

    def seen(self, info: dict[str, str]) -> int:
        """Record this broker as alive for one lease (brokers spreading queues keep
        this up instead of a primary lease); how many brokers are alive."""
        self._record(info)
        return self.alive

    def alive_members(self) -> list[str]:
        """The ids of the brokers alive now (their records not run out), sorted."""
        seconds, micros = node_client(self.client, self._alive).time()
        now_ms = seconds * 1000 + micros // 1000
        return sorted((m.decode() if isinstance(m, bytes) else str(m))
                      for m in self.client.zrangebyscore(self._alive, f"({now_ms}", "+inf"))

    def try_acquire(self, info: dict[str, str]) -> bool:
        """Take the lease if nobody holds it (or this broker still does)."""
        self._record(info)
        taken = int(self.client.eval(_TAKE, 2, self.key, self._term, self.member,
                                     self.lease_ms))
        if not taken and self.renew():
            taken = True
        if taken and self.held_since is None:
            self.held_since = time.monotonic()
        return bool(taken)

    def renew(self) -> bool:
        """Extend the lease; False: another broker holds it (or nobody: it ran out)."""
        alive = int(self.client.eval(_RENEW, 3, self.key, self.member_key, self._alive,
                                     self.member, self.lease_ms, self.lease_ms * 3))
        if alive:
            self.renewals += 1
            self.alive = alive
        return bool(alive)

    def release(self) -> bool:
        """Give the lease up (a clean stop): a standby takes over at once."""
        self.held_since = None
        return bool(self.client.eval(_RELEASE, 2, self.key, self._handoff, self.member,
                                     self.lease_ms))

    def wait_handoff(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for a primary to give the lease up (a clean stop, a
        soft stop): True at once when one does, so a standby takes over without waiting
        for its next try."""
        return self.client.blpop([self._handoff], timeout=seconds) is not None

    def take_handoff(self) -> bool:
        """Whether a primary gave the lease up since anyone last looked (and clear it):
        a standby that found the lease free at its next try was handed it over too."""
        return self.client.lpop(self._handoff) is not None

    def leave(self) -> None:
        """A clean stop, primary or standby: this broker's record goes at once (after a
        crash it runs out by itself)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.member_key)
        pipe.zrem(self._alive, self.member)
        pipe.execute()

    def close(self) -> None:
        from .client import close

        close(self.client)

    def holder(self) -> dict[str, Any] | None:
        """The primary now: its id and what it said of itself, or None."""
        raw = self.client.get(self.key)
        if raw is None:
            return None
        member = raw.decode() if isinstance(raw, bytes) else str(raw)
        info = self.client.hgetall(self._member_base + member)
        out: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else k):
                               (v.decode() if isinstance(v, bytes) else v)
                               for k, v in info.items()}
        out["id"] = member
        return out

    def note(self, what: str, **detail: Any) -> None:
        """Record a cluster event (a takeover, a lease given back) for every broker's
        ``minou cluster`` to show."""
        entry = json.dumps({"at": round(time.time(), 3), "by": self.member, "what": what,
                            **detail})
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(self._events, entry)
        pipe.ltrim(self._events, 0, EVENTS_KEPT - 1)
        pipe.execute()

    def events(self) -> list[dict[str, Any]]:
        out = []
        for raw in self.client.lrange(self._events, 0, EVENTS_KEPT - 1):
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out

    def other_placements(self, placement: str) -> list[dict[str, Any]]:
        """The live brokers on this prefix whose record says another placement than
        ``placement`` (records without one, of older brokers, are not judged)."""
        return [r for r in self.members() if r["alive"] and r["id"] != self.member
                and r.get("placement", placement) != placement]

    def members(self) -> list[dict[str, Any]]:
        """Every broker whose record is fresh (the primary and the standbys), with
        ``alive``: it renewed or tried the lease within the last lease."""
        seconds, micros = node_client(self.client, self._alive).time()  # the alive set's clock
        now_ms = seconds * 1000 + micros // 1000
        alive = {(m.decode() if isinstance(m, bytes) else str(m))
                 for m in self.client.zrangebyscore(self._alive, now_ms, "+inf")}
        out = []
        for key in self.client.scan_iter(match=self._member_base + "*", count=100):
            info = self.client.hgetall(key)
            name = key.decode() if isinstance(key, bytes) else str(key)
            row: dict[str, Any] = {(k.decode() if isinstance(k, bytes) else k):
                                   (v.decode() if isinstance(v, bytes) else v)
                                   for k, v in info.items()}
            row["id"] = name[len(self._member_base):]
            row["alive"] = row["id"] in alive
            out.append(row)
        return sorted(out, key=lambda r: str(r.get("since", "")))
