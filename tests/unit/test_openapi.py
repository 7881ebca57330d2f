"""The OpenAPI document states the limits the broker enforces, taken from minou.limits:
every bound in it is checked here against the constant it mirrors, so the two cannot
drift apart (schemathesis, in tests/system, only samples them)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from minou import limits
from minou.errors import InvalidChannel
from minou.names import validate_channel
from minou.server import openapi

DOC = openapi.document()
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
          "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def parameter(path: str, name: str, method: str = "post") -> dict[str, Any]:
    (found,) = [p for p in DOC["paths"][path][method]["parameters"] if p["name"] == name]
    return found


def param(path: str, name: str, method: str = "post") -> dict[str, Any]:
    return parameter(path, name, method)["schema"]


def body(path: str, method: str = "post") -> dict[str, Any]:
    return DOC["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]


def span(schema: dict[str, Any]) -> tuple[Any, Any]:
    return schema.get("minimum"), schema.get("maximum")


MESSAGE = "/v1/messages/{endpoint}/{version}/{id}"
CONSUME = "/v1/consume/{endpoint}/{version}/{id}"
BROWSE = "/v1/queues/{endpoint}/{version}/{id}/messages"


def test_message_bounds_are_the_brokers() -> None:
    assert body("/v1/messages")["maxItems"] == limits.MAX_BATCH_HTTP
    message = DOC["components"]["schemas"]["Message"]["properties"]
    assert span(message["priority"]) == (limits.MIN_PRIORITY, limits.MAX_PRIORITY)
    assert span(param(MESSAGE, "priority")) == (limits.MIN_PRIORITY, limits.MAX_PRIORITY)
    for name in ("ttl", "delay"):
        assert span(param(MESSAGE, name)) == (0, limits.MAX_DELAY_S)
    assert span(param("/v1/nack/{receipt}", "delay")) == (0, limits.MAX_DELAY_S)


def test_consume_bounds_are_the_brokers() -> None:
    assert span(param(CONSUME, "wait")) == (0, limits.MAX_HTTP_WAIT_S)
    assert span(param(CONSUME, "lease")) == (0, limits.MAX_LEASE_S)


def test_admin_bounds_are_the_brokers() -> None:
    assert span(param(BROWSE, "from_seq", "get")) == (0, limits.MAX_FROM_SEQ)
    assert span(param(BROWSE, "limit", "get")) == (1, limits.MAX_BROWSE)
    assert f"(default {limits.DEFAULT_BROWSE})" in parameter(BROWSE, "limit", "get")["description"]
    requeue = param("/v1/dead/{endpoint}/{version}/requeue", "limit")
    assert span(requeue) == (1, limits.MAX_REQUEUE)
    history = DOC["components"]["schemas"]["RateHistory"]["properties"]["t"]["description"]
    assert f"at most {limits.RATE_HISTORY_QUEUES} queues" in history


def test_kv_history_bounds_are_the_brokers() -> None:
    key = "/v1/kv/{bucket}/{key}"
    assert span(param(key, "after", "get")) == (0, limits.MAX_KV_REVISION)
    assert span(param(key, "limit", "get")) == (1, limits.MAX_KV_PAGE)
    assert f"(default {limits.DEFAULT_KV_PAGE})" in parameter(key, "limit", "get")["description"]
    answer = DOC["paths"][key]["get"]["responses"]["200"]["content"]["application/json"]
    (page,) = [s for s in answer["schema"]["anyOf"] if "more" in s["properties"]]
    assert f"at most {limits.KV_PAGE_BYTES >> 20} MiB" in page["properties"]["entries"][
        "description"]


def test_credential_bounds_are_the_brokers() -> None:
    for path in ("/v1/credentials", "/v1/credentials/{id}/renew"):
        ttl = body(path)["properties"]["ttl"]
        assert span(ttl) == (limits.MIN_CREDENTIAL_TTL_S, limits.MAX_CREDENTIAL_TTL_S)
    purpose = body("/v1/credentials")["properties"]["purpose"]
    assert purpose["maxLength"] == limits.MAX_PURPOSE_CHARS


def test_the_channel_path_parameters_add_up_to_the_channel_limit() -> None:
    endpoint, version, ident = (param(MESSAGE, name) for name in ("endpoint", "version", "id"))
    assert re.search(version["pattern"], openapi._LONGEST_VERSION)
    assert not re.search(version["pattern"], openapi._LONGEST_VERSION + "9")
    longest = ("e" * endpoint["maxLength"], openapi._LONGEST_VERSION, "i" * ident["maxLength"])
    channel = "/".join(longest)
    assert len(channel) == limits.MAX_CHANNEL_LENGTH
    assert validate_channel(channel) == channel  # the longest the document allows is valid
    with pytest.raises(InvalidChannel, match=f"the limit is {limits.MAX_CHANNEL_LENGTH}"):
        validate_channel(channel + "i")
    with pytest.raises(InvalidChannel, match="must look like v1"):
        validate_channel(f"e/{openapi._LONGEST_VERSION}0/i")  # a longer version is no version


def _every_bound(node: Any, where: str, out: list[tuple[str, Any]]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in BOUNDS:
                out.append((f"{where}.{key}", value))
            else:
                _every_bound(value, f"{where}/{key}", out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _every_bound(value, f"{where}[{i}]", out)


def test_every_bound_in_the_document_is_a_named_constant() -> None:
    """A literal added later (``"maximum": 500``) fails here until it is a constant of
    minou.limits (or a documented-only one of openapi.py, listed below)."""
    named = {value for name, value in vars(limits).items()
             if name.isupper() and isinstance(value, int | float)}
    named |= {openapi._NAGIOS_MAX_MINUTES, openapi._ENDPOINT_MAX_LENGTH,
              param(MESSAGE, "id")["maxLength"]}  # checked by the test above
    found: list[tuple[str, Any]] = []
    _every_bound(DOC, "#", found)
    assert len(found) > 20
    trivial = {0, 1}  # "at least one", "not negative"
    assert [(where, value) for where, value in found
            if value not in trivial and value not in named] == []
