"""A broker started on a Redis whose live brokers use the other placement is refused.

One Redis (and key prefix) holds one cluster: either a primary and its standbys
(``placement = "primary"``) or brokers that spread the queues (``"spread"``). A broker
of the other kind started beside them (a config copied from the wrong host, a rolling
change of placement) took the queues the others held, and each stopped the other in
turn (a fenced write, exit 1): nothing confirmed was lost, but a misconfigured newcomer
took a serving cluster down. It is refused at start now, naming the broker in the way;
the cluster goes on. Real broker processes, a real redis-server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..redis_server import RedisServer
from . import test_spread
from .test_spread import LEASE, SPREAD_MARKS

pytestmark = SPREAD_MARKS
redis = test_spread.redis  # the fixture: one Redis per test


def config(tmp_path: Path, redis: RedisServer, placement: str) -> Path:
    path = tmp_path / f"{placement}.toml"
    path.write_text(f'[storage]\nurl = "{redis.url}"\nowner_lease = {LEASE}\n'
                    f'placement = "{placement}"\n')
    return path


@pytest.mark.parametrize("serving,newcomer", [("primary", "spread"), ("spread", "primary")])
def test_a_broker_of_the_other_placement_is_refused_and_the_cluster_goes_on(
        broker_factory: Any, redis: RedisServer, tmp_path: Path, serving: str,
        newcomer: str) -> None:
    a = broker_factory.make(config=config(tmp_path, redis, serving), storage=redis.url).start()
    with a.connect_sync("producer") as p:
        first = [p.send(f"mix{k}/v1/1", {"k": k}).seq for k in range(6)]

    b = broker_factory.make(config=config(tmp_path, redis, newcomer), storage=redis.url)
    with pytest.raises(RuntimeError) as refused:
        b.start(timeout=20)
    out = str(refused.value)
    assert f'runs placement = "{serving}"' in out, out
    assert f'this one is set to "{newcomer}"' in out, out
    assert a.url.rsplit("/", 1)[1] in out, out  # the broker in the way, by its address
    assert b.proc is not None and b.proc.wait(10) != 0

    # The serving broker was not touched: it still writes the queues it held.
    assert a.alive, a.output[-2000:]
    with a.connect_sync("producer") as p:
        after = [p.send(f"mix{k}/v1/1", {"k": k}).seq for k in range(6)]
    assert after == [s + 1 for s in first]
    assert "fenced" not in a.output
