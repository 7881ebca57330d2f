"""What one simulated world is made of, drawn from its seed before anything runs: the
broker's settings, the channels and their options, the readers' groups, the clients.

The groups are fixed for the whole history (made durable before the first publish, and
joined only with their own patterns): that is what lets the end of a run say, for every
confirmed message, which groups had to see it. The one exception is the consumer group
of the exclusive channel (rules: ``read = ["*", "!e/*"]``): the first client to
subscribe reserves the channel, so the group is made by whoever gets there first.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from minou.auth.rules import Rules
from minou.core.log import ChannelOptions
from minou.limits import BUDGET_SHARE
from minou.names import consume_group_key, listen_group_key

# Every feature a history may use; shrinking a failure switches them off one by one.
FEATURES = ("crash", "full", "ttl", "delay", "priority", "dedup", "broadcast", "numbered",
            "nack", "extend", "slow", "flow", "txn", "evict", "foreign", "exclusive",
            "retention", "budget", "takeover")

T0 = 1_000_000.0  # the simulated wall clock at the start (seconds)
ENDPOINTS = ("a/v1", "b/v1")
IDS = ("x", "y")
EXCLUSIVE = "e/v1/x"  # the channel the rules make exclusive


@dataclass(frozen=True)
class GroupSpec:
    """A reader group: consumers share it, a durable listener is its owner's alone."""

    kind: str  # "consume" | "listen"
    name: str  # the consumer group, or the listener's name
    patterns: tuple[str, ...]
    owner: str = ""  # a listener's client id
    exclusive: bool = False  # reads a reserved (!) channel: made by its first reader

    @property
    def key(self) -> str:
        if self.kind == "consume":
            return consume_group_key(self.name)
        return listen_group_key(self.owner, self.name)

    def matches(self, channel: str) -> bool:
        return any(channel == p or (p.endswith("*") and channel.startswith(p[:-1]))
                   for p in self.patterns)


@dataclass
class Scenario:
    seed: int
    clients: list[str]
    features: frozenset[str]
    options: dict[str, ChannelOptions]  # "a/v1" -> its options
    groups: list[GroupSpec]
    writers: list[str]  # clients that run staged transactions
    dedup_window: float
    default_lease: float
    cache_budget: int
    page: int  # the storage page a load reads
    pause_bytes: int  # publish_pause_bytes (flow control)
    # delivery_buffer_bytes (DeliveryBudget), its share per connection, and the unread
    # bytes that pause one connection (the socket's high water mark)
    budget_bytes: int = 1 << 40
    budget_share: int = BUDGET_SHARE
    high_water: int = 400
    # in_flight_bytes, and InFlightBytes' share and per-subscription bound
    in_flight_bytes: int = 1 << 40
    in_flight_share: int = 1 << 40
    in_flight_per_sub: int = 1 << 40
    channels: list[str] = field(default_factory=list)  # the concrete channels
    rules: Rules = field(default_factory=lambda: Rules.parse(None))

    def options_for(self, key: str) -> ChannelOptions:
        return self.options.get(key, ChannelOptions())

    def channel_options(self, channel: str) -> ChannelOptions:
        """A channel's options (a dead-letter channel has its channel's, as in the core)."""
        body = channel.removeprefix("_dead/")
        return self.options_for("/".join(body.split("/")[:2]))

    @classmethod
    def draw(cls, seed: int, rng: random.Random, clients: int,
             features: frozenset[str]) -> Scenario:
        names = [f"c{i}" for i in range(1, clients + 1)]
        options = {ep: _draw_options(rng, features) for ep in ENDPOINTS}
        channels = [f"{ep}/{i}" for ep in ENDPOINTS for i in IDS]
        groups = [GroupSpec("consume", "g1", ("a/v1/*",))]
        if rng.random() < 0.7:
            groups.append(GroupSpec("consume", "g2", (rng.choice(channels), "b/v1/*")))
        if rng.random() < 0.7:
            groups.append(GroupSpec("listen", "l1", ("a/*",), owner=rng.choice(names)))
        if rng.random() < 0.4:
            groups.append(GroupSpec("consume", "g3", (rng.choice(channels),)))
        writers = [n for n in names if "txn" in features and rng.random() < 0.4]
        rules = Rules.parse(None)
        if "exclusive" in features:
            options[EXCLUSIVE.split("/")[0] + "/v1"] = _draw_options(rng, features)
            channels.append(EXCLUSIVE)
            groups.append(GroupSpec("consume", "ex", (EXCLUSIVE,), exclusive=True))
            rules = Rules.parse([{"client": "*", "read": ["*", "!e/*"], "write": ["*"]}])
        # Drawn from their own generator: the histories of runs without the feature
        # (and the seeds pinned before it existed) stay what they were.
        budget: dict[str, int] = {}
        if "budget" in features:
            brng = random.Random(f"budget-{seed}")
            budget = {"budget_bytes": brng.choice((300, 800, 2_000)),
                      "budget_share": brng.choice((0, 100, 300)),
                      "high_water": brng.choice((400, 3_000)),
                      "in_flight_bytes": brng.choice((1_500, 4_000, 1 << 40)),
                      "in_flight_share": brng.choice((0, 600, 1_200)),
                      "in_flight_per_sub": brng.choice((1_200, 3_000, 1 << 40))}
        return cls(
            seed=seed, clients=names, features=features, options=options, groups=groups,
            writers=writers,
            dedup_window=rng.choice((2.0, 10.0, 120.0)),
            default_lease=rng.choice((1.0, 5.0, 30.0)),
            cache_budget=rng.choice((1_500, 48 << 20)) if "evict" in features else 48 << 20,
            page=rng.choice((2, 3, 50)),
            pause_bytes=rng.choice((200, 1 << 40)) if "flow" in features else 1 << 40,
            channels=channels, rules=rules, **budget,
        )


def _draw_options(rng: random.Random, features: frozenset[str]) -> ChannelOptions:
    max_items = rng.choice((None, None, 3, 8))
    return ChannelOptions(
        prefetch=rng.choice((1, 2, 5)),
        ttl=rng.choice((None, None, 3.0, 20.0)) if "ttl" in features else None,
        max_items=max_items,
        overflow=rng.choice(("refuse", "drop_oldest")),
        requeue_limit=rng.choice((0, 1, 2, 10)),
        dead_letter=rng.random() < 0.8,
        retention=rng.choice((None, 0.0, 5.0)) if "retention" in features else None,
    )
