"""Fuzzing a real broker process: shared settings, the broker, and the one assertion.

Each target throws hostile bytes at a listener of a real ``minou start`` and then
checks that the broker logged no unhandled exception (no traceback, no ERROR
line), is still running, and still serves a well-behaved client. The number of
examples per target comes from ``MINOU_FUZZ_EXAMPLES``: small in ``make test``,
large in ``make fuzz``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, settings

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token

from ..conftest import BrokerProcess, client_key

EXAMPLES = int(os.environ.get("MINOU_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])
CONFIG = """
[channels."orders/v1".schema]
type = "object"
required = ["total"]
[channels."orders/v1".schema.properties.total]
type = "number"
minimum = 0
"""
# A traceback, or a line logged at ERROR or above (minou's "date time LEVEL logger: ..."
# or uvicorn's "LEVEL:  ..."); anchored, so a client's text in a warning does not count.
_TROUBLE = re.compile(r"^(Traceback|(\S+ \S+ )?(ERROR|CRITICAL)\b)", re.MULTILINE)


class Watched:
    """A broker under fuzzing: its log is read from where the last check stopped."""

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker
        self.offset = broker.log_path.stat().st_size

    def check(self, example: object = None) -> None:
        """The broker runs, and logged nothing unhandled since the last check."""
        with open(self.broker.log_path, "rb") as log:
            log.seek(self.offset)
            raw = log.read()
        self.offset += len(raw)
        new = raw.decode(errors="replace")
        trouble = _TROUBLE.search(new)
        assert trouble is None, f"the broker logged, after {example!r:.2000}:\n{new[-6000:]}"
        assert self.broker.alive, f"the broker died after {example!r:.2000}:\n{new[-6000:]}"

    def serves_a_good_client(self) -> None:
        """A well-behaved client still publishes, consumes and acks (native and HTTP)."""
        b = self.broker
        with minou.connect_sync(b.url, **b.auth("fuzz-good"), reconnect=False,
                                request_timeout=10) as client:
            client.send("good/v1/1", {"n": 1})
            sub = client.consume("good/v1/1", group="good")
            msg = sub.get(timeout=10)
            assert msg.payload == {"n": 1}
            assert msg.ack()
        r = httpx.post(f"{b.http}/v1/messages/good/v1/2", json={"n": 2},
                       headers=bearer(b, "fuzz-good"), timeout=10)
        assert r.status_code == 201, r.text
        assert httpx.get(f"{b.http}/health", timeout=10).json()["status"] == "ok"
        self.check("a well-behaved client")


def bearer(broker: BrokerProcess, client_id: str) -> dict[str, str]:
    """An HTTP bearer for ``client_id`` (registered on first use by a native HELLO)."""
    with minou.connect_sync(broker.url, **broker.auth(client_id), reconnect=False):
        pass
    key = keyfiles.load_private(client_key(client_id))
    return {"Authorization": f"Bearer {make_token(client_id, key, 'minou', ttl=3000)}"}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watched]:
    base: Path = tmp_path_factory.mktemp("fuzzed")
    cfg = base / "fuzz.toml"
    cfg.write_text(CONFIG)
    broker = BrokerProcess(base / "data", config=cfg).start()
    watched = Watched(broker)
    yield watched
    broker.kill()
