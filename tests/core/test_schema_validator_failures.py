"""A schema whose validator fails on a payload (a $ref loop only that payload reaches,
which compile_schema cannot see) refuses that message as a schema mismatch, counted
like one; the rest of the batch is stored and the broker goes on."""

from __future__ import annotations

import pytest

from minou.core.broker import Session
from minou.core.log import ChannelOptions
from minou.errors import ErrorCode, SchemaMismatch
from minou.protocol.frames import Send
from minou.schemas import compile_schema

from .helpers import Harness, js

# The loop behind an $id: the static check follows "#/..." refs only, and no probe
# instance has the property "q".
LOOPING = {"$id": "http://schemas.example.com/s.json",
           "definitions": {"a": {"$ref": "s.json#/definitions/a"}},
           "properties": {"q": {"$ref": "#/definitions/a"}}}
CH = "a/v1/1"


def harness() -> Harness:
    schema = compile_schema(LOOPING, key="a/v1")

    def options(key: str) -> ChannelOptions:
        return ChannelOptions(schema=schema) if key == "a/v1" else ChannelOptions()

    return Harness(channel_options=options)


def test_a_payload_the_validator_fails_on_is_refused_as_a_schema_mismatch() -> None:
    h = harness()
    outcomes = h.publish(Send(CH, js({"p": 1})), Send(CH, js({"q": 1})),
                         Send(CH, js({"p": 2})))
    assert [o.code for o in outcomes] == [0, ErrorCode.SCHEMA_MISMATCH, 0]
    assert h.broker.counters.refused == {"schema_mismatch": 1}
    assert h.broker.schema_refusals == {"a/v1": 1}
    with pytest.raises(SchemaMismatch) as caught:
        h.broker.publishing.validate(Send(CH, js({"q": 2})), Session("c").access)
    assert caught.value.detail["schema"] == "a/v1" and caught.value.detail["path"] == "$"
    assert "RecursionError" in caught.value.message
    assert 'channels."a/v1".schema' in caught.value.message
