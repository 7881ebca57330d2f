"""schemathesis against /openapi.json and a real broker: for every documented operation,
generated requests (valid ones, and schemathesis' negative cases) must get no 5xx, only
documented status codes and content types, and bodies that match the document."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from minou.server.openapi import document

from ..conftest import BrokerProcess

TOKEN = "schemathesis-broker-token"
SKIP = {("POST", "/v1/admin/soft-stop")}  # it would stop the broker under test
# Valid per the document but refused on meaning, which JSON Schema cannot say: a
# public key must be a PEM key (400 otherwise). Every other check still runs.
# So is a compare-and-set that finds the key at another revision (412), and a write
# with both If-Match and If-None-Match (400).
NOT_EXPRESSIBLE = {("POST", "/v1/clients/{client_id}/rotate"),
                   ("PUT", "/v1/kv/{bucket}/{key}"), ("DELETE", "/v1/kv/{bucket}/{key}")}
# Answers in 5xx by design: a request nobody serves is 503 no_responders, one nobody
# answers in time 504 reply_timeout (both documented). A 500 is still caught: it is
# not among the documented statuses (status_code_conformance).
SERVER_ANSWERS = {("POST", "/v1/request/{endpoint}/{version}/{id}")}
OPERATIONS = sorted((method.upper(), path) for path, item in document()["paths"].items()
                    for method in item if (method.upper(), path) not in SKIP)


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("fuzz")
    cfg = base / "fuzz.toml"
    cfg.write_text(f'[auth]\nbroker_token = "{TOKEN}"\n')
    broker = BrokerProcess(base / "data", config=cfg).start()
    yield broker
    broker.kill()


@pytest.fixture(scope="module")
def api_schema(fuzz_broker: BrokerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{fuzz_broker.http}/openapi.json")


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_operation_conforms_to_the_document(api_schema, fuzz_broker, method, path):
    operation = api_schema[path][method]

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case: schemathesis.Case) -> None:
        if case.query and "wait" in case.query:
            case.query["wait"] = 0.1  # a long-poll would only make the run slow
        excluded = [positive_data_acceptance] if (method, path) in NOT_EXPRESSIBLE else []
        if (method, path) in SERVER_ANSWERS:
            case.query = {**(case.query or {}), "timeout": 0.1}  # no 5 s waits
            excluded.append(not_a_server_error)
        case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                               excluded_checks=excluded or None)

    run()
    assert fuzz_broker.alive
