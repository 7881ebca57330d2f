"""Queues spread over brokers: a queue is claimed (entered in Redis's registry for good,
its epoch and owner set) only for a publish that may land in it. A front used to claim a
queue before its owner's engine looked at the message, and a producer's refused first
sequence was stored with the queue's keys: every name a client made up, invalid or not
its to write, left a queue in Redis that every broker adopted ever after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis import Redis as redis_client
from redis import exceptions as redis_errors

import minou
from minou.storage.redis.keys import shared_base

from ..redis_server import RedisServer
from . import test_spread
from .test_full_disk import bearer
from .test_spread import (
    LEASE,
    SPREAD_MARKS,
    publish_all,
    spread_brokers,
)

pytestmark = SPREAD_MARKS
redis = test_spread.redis  # the fixture: one Redis per test


def registry(redis: RedisServer) -> set[str]:
    return {q.decode() for q in redis.client().smembers(shared_base("minou") + "queues")}


def test_an_invalid_channel_name_is_refused_before_its_queue_is_claimed(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A publish to a channel whose endpoint or version is not a name (``orders}/v1/x``,
    ``{orders/v1}/x``, ``orders /v1/x``) is refused as invalid; its "queue" is never
    claimed: no entry in the registry or the owners, no key under a hash tag it would
    choose (``orders}/v1`` makes the tag ``{orders}``). Before, a front claimed the queue
    before the owner's engine looked at the name: every such publish left keys behind."""
    a, _b = spread_brokers(broker_factory, redis, tmp_path, 2)
    publish_all(a, 1)
    bad = ["orders}/v1/x", "{orders/v1}/x", "orders /v1/x", "orders/v1}/x", "a/{b}/x"]
    with a.connect_sync("producer") as c:
        for name in bad:
            with pytest.raises(minou.MinouError, match="invalid channel"):
                c.send(name, {"n": 0})
    client = redis.client()
    queues = registry(redis)
    assert all(q.startswith("orders/v") for q in queues), queues
    assert set(client.hkeys(shared_base("minou") + "owners")) <= {q.encode() for q in queues}
    tags = {k.split(b"}")[0] for k in client.scan_iter("*")}
    assert tags <= {f"minou:{{{q}".encode() for q in queues} | {b"minou:{shared"}, tags


def test_publishes_a_client_may_not_write_claim_no_queue(
        broker_factory: Any, redis: RedisServer, tmp_path: Path) -> None:
    """A client allowed to write ``orders/v1`` only publishes to 300 other queues
    through either broker (native), and to 50 through the Redis-protocol door: each
    refused (``NOT_AUTHORIZED``), none in the registry, at once (3,000 native ones took
    0.9 s in a probe; before, ~27 ms each: a claim per name, 3,000 queues left)."""
    cfg = tmp_path / "limited.toml"
    cfg.write_text(f'[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n'
                   'placement = "spread"\n[[rules]]\nclient = "*"\n'
                   'read = ["orders/v1/*"]\nwrite = ["orders/v1/*"]\n')
    brokers = [broker_factory.make(config=cfg, storage=redis.url, resp_port=0).start()
               for _ in range(2)]
    token = bearer(brokers[0], "limited")["Authorization"].split()[1]
    door = redis_client(port=brokers[0].resp_port, username="limited", password=token)
    for i in range(50):  # the Redis-protocol door, which has no front
        with pytest.raises(redis_errors.NoPermissionError):
            door.xadd(f"resp{i}/v1/x", {"payload": "{}"})
    door.close()
    for n, b in enumerate(brokers):
        with b.connect_sync("limited") as c:
            c.send("orders/v1/1", {"n": n})
            for i in range(150):
                with pytest.raises(minou.MinouError, match="may not write"):
                    c.send(f"junk{i}/v{n + 1}/x", {"n": i})
            with pytest.raises(minou.MinouError, match="may not read"):
                c.consume(f"junk{n}/v9/x", group="g", prefetch=1)
    assert registry(redis) == {"orders/v1"}
