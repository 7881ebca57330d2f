"""Channel schemas: payload validation, loading from config, refusing remote refs, and the
compatibility check between consecutive versions of one endpoint."""

from __future__ import annotations

import copy
import json
import pickle
import select
import socket
import threading

import fastjsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minou.errors import ConfigError
from minou.schemas import (
    Compatibility,
    SchemaViolation,
    compare,
    compatibility_report,
    compile_schema,
    load_schema,
)

KEY = "orders/v1"
WHERE = 'channels."orders/v1".schema'

ORDER = {
    "type": "object",
    "required": ["customer"],
    "additionalProperties": False,
    "properties": {
        "customer": {"type": "object", "properties": {"id": {"type": "integer"}}},
        "items": {
            "type": "array",
            "items": {"type": "object", "properties": {"qty": {"type": "integer"}}},
        },
        "note": {"type": "string", "default": "none"},
    },
}


def violation(schema: dict, value: object) -> SchemaViolation:
    with pytest.raises(SchemaViolation) as info:
        compile_schema(schema, key=KEY).validate(value)
    return info.value


# --- validation -----------------------------------------------------------------------------


def test_a_valid_message_passes_and_is_not_modified():
    message = {"customer": {"id": 7}, "items": [{"qty": 1}]}
    before = copy.deepcopy(message)
    assert compile_schema(ORDER, key=KEY).validate(message) is None
    # fastjsonschema fills in "default" values unless told not to; a broker must not.
    assert message == before


@pytest.mark.parametrize(
    ("value", "path", "reason"),
    [
        ({}, "$", "must contain ['customer'] properties"),
        ({"customer": {"id": "7"}}, "$.customer.id", "must be integer"),
        ({"customer": {}, "items": [{}, {"qty": 1}, {"qty": 1.5}]}, "$.items[2].qty",
         "must be integer"),
        ({"customer": {}, "zz": 1, "yy": 2, "aa": 3}, "$",
         "must not contain ['aa', 'yy', 'zz'] properties"),
        ([], "$", "must be object"),
    ],
    ids=["missing-required", "nested-type", "array-item", "additional-properties", "root-type"],
)
def test_violations_name_the_path_and_the_reason(value, path, reason):
    err = violation(ORDER, value)
    assert (err.path, err.reason) == (path, reason)
    assert str(err) == f"{path}: {reason}"


def test_a_violation_behind_a_local_ref_has_the_full_path():
    schema = {
        "$defs": {"line": {"type": "object", "properties": {"qty": {"type": "integer"}}}},
        "type": "object",
        "properties": {"lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}},
    }
    err = violation(schema, {"lines": [{"qty": 1}, {"qty": "x"}]})
    assert (err.path, err.reason) == ("$.lines[1].qty", "must be integer")


def test_a_violation_survives_pickling():
    err = violation(ORDER, {})
    again = pickle.loads(pickle.dumps(err))
    assert (again.path, again.reason, str(again)) == (err.path, err.reason, str(err))


def test_fingerprint_ignores_key_order_and_tracks_content():
    a = compile_schema({"type": "object", "required": ["x"]}, key=KEY)
    b = compile_schema({"required": ["x"], "type": "object"}, key=KEY)
    c = compile_schema({"type": "object", "required": ["y"]}, key=KEY)
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a == b  # same key and content


def test_compiling_does_not_rewrite_the_callers_document():
    # With an $id, fastjsonschema rewrites every "$ref" in place into an absolute URI.
    schema = {
        "$id": "https://schemas.example.com/order.json",
        "definitions": {"qty": {"type": "integer"}},
        "properties": {"qty": {"$ref": "#/definitions/qty"}},
    }
    before = copy.deepcopy(schema)
    compiled = compile_schema(schema, key=KEY)
    assert schema == before and compiled.source == before
    schema["properties"]["qty"] = {"type": "string"}  # the config dict changes later
    assert compiled.source == before
    with pytest.raises(SchemaViolation):
        compiled.validate({"qty": "x"})


# --- loading and compiling ------------------------------------------------------------------


def test_load_schema_inline(tmp_path):
    assert load_schema(ORDER, key=KEY, base_dir=tmp_path) is ORDER


def test_load_schema_from_a_path_relative_to_the_config(tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "orders.json").write_text(json.dumps(ORDER))
    assert load_schema("schemas/orders.json", key=KEY, base_dir=tmp_path) == ORDER


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.json", None, "cannot read schema file"),
        ("bad.json", '{"type": ', "is not valid JSON"),
        ("nan.json", '{"maximum": NaN}', "is not valid JSON"),
        ("latin1.json", b'{"title": "caf\xe9"}', "is not valid JSON"),
        ("list.json", "[1, 2]", "must hold a JSON object, got an array"),
        # Read as written: a repeated key would silently keep its last value.
        ("twice.json", '{"type": "object", "properties": {"a": {"type": "string"}, '
                       '"a": {}}}',
         'twice.json: key "a" is given twice in one object (JSON readers keep the '
         'last value silently); give each key once'),
    ],
)
def test_load_schema_errors_name_the_key(tmp_path, name, content, message):
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
    elif content is not None:
        (tmp_path / name).write_text(content)
    with pytest.raises(ConfigError) as info:
        load_schema(name, key=KEY, base_dir=tmp_path)
    assert str(info.value).startswith(f"{WHERE}: ")
    assert message in str(info.value)


@pytest.mark.parametrize("raw", [5, "", ["a"]])
def test_load_schema_refuses_other_values(tmp_path, raw):
    with pytest.raises(ConfigError, match=r'^channels\."orders/v1"\.schema: expected'):
        load_schema(raw, key=KEY, base_dir=tmp_path)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": 5},  # JsonSchemaDefinitionException
        {"required": "customer"},
        {"$ref": "#/definitions/nope"},
        {"items": 5},  # fastjsonschema raises TypeError for this one
        {"pattern": "("},  # ... and re.error for this one
        {"maximum": float("nan")},  # not JSON, cannot be fingerprinted
    ],
)
def test_an_invalid_schema_is_a_config_error_naming_the_key(schema):
    with pytest.raises(ConfigError) as info:
        compile_schema(schema, key=KEY)
    assert str(info.value).startswith(f"{WHERE}: invalid JSON Schema: ")


def test_a_schema_must_be_an_object():
    with pytest.raises(ConfigError, match="invalid JSON Schema: expected an object, got an arr"):
        compile_schema([], key=KEY)  # type: ignore[arg-type]


# --- remote refs ----------------------------------------------------------------------------


def test_handlers_default_would_fetch_so_minou_must_not_rely_on_it():
    # Documents why compile_schema passes its own handlers: fastjsonschema's default
    # resolves an unknown scheme with urllib, here reading a file the schema points at.
    assert "urlopen" in fastjsonschema.ref_resolver.resolve_remote.__code__.co_names


def test_a_remote_http_ref_is_refused_without_connecting():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        outcome: list[BaseException] = []

        def attempt() -> None:
            try:
                compile_schema({"$ref": f"http://127.0.0.1:{port}/x.json"}, key=KEY)
            except BaseException as exc:
                outcome.append(exc)

        # A thread, so a regression shows up as a failed assertion, not a hung test:
        # urlopen would wait forever for a reply this server never sends.
        worker = threading.Thread(target=attempt, daemon=True)
        worker.start()
        worker.join(timeout=5)
        connected, _, _ = select.select([server], [], [], 0)
    worker.join(timeout=5)  # closing the server resets any pending connection
    assert connected == [], "compile_schema opened a connection for a remote $ref"
    assert len(outcome) == 1 and isinstance(outcome[0], ConfigError)
    assert str(outcome[0]).startswith(f"{WHERE}: invalid JSON Schema: $ref 'http://127.0.0.1:")
    assert "minou never fetches schemas" in str(outcome[0])


def test_a_file_ref_is_refused_even_when_the_file_is_a_valid_schema(tmp_path):
    target = tmp_path / "qty.json"
    target.write_text('{"type": "integer"}')
    with pytest.raises(ConfigError, match="minou never fetches schemas"):
        compile_schema({"properties": {"qty": {"$ref": target.as_uri()}}}, key=KEY)


def test_a_relative_ref_against_a_remote_id_is_refused():
    schema = {"$id": "http://example.com/order.json", "properties": {"a": {"$ref": "item.json"}}}
    with pytest.raises(ConfigError) as info:
        compile_schema(schema, key=KEY)
    assert "$ref 'http://example.com/item.json' points outside" in str(info.value)


# --- $ref loops -----------------------------------------------------------------------------

LOOP = "applies the schema to the same value again without end"


@pytest.mark.parametrize(
    ("schema", "loop"),
    [
        ({"$ref": "#"}, "# -> #"),
        ({"$ref": "#/definitions/a", "definitions": {"a": {"$ref": "#/definitions/b"},
                                                     "b": {"$ref": "#/definitions/a"}}},
         "#/definitions/a -> #/definitions/b -> #/definitions/a"),
        # Reached only through a property (no probe gets there), through allOf.
        ({"properties": {"x": {"$ref": "#/$defs/a"}},
          "$defs": {"a": {"allOf": [{"type": "object"}, {"$ref": "#/$defs/a"}]}}},
         "#/$defs/a -> #/$defs/a/allOf/1 -> #/$defs/a"),
        ({"anyOf": [{"type": "string"}, {"not": {"$ref": "#"}}]},
         "# -> #/anyOf/1 -> #/anyOf/1/not -> #"),
        ({"dependencies": {"x": {"$ref": "#"}}}, "# -> #/dependencies/x -> #"),
    ],
    ids=["root", "a-b-a", "behind-a-property", "anyOf-not", "dependencies"],
)
def test_a_ref_loop_that_consumes_nothing_is_refused_naming_the_loop(schema, loop):
    with pytest.raises(ConfigError) as info:
        compile_schema(schema, key=KEY)
    assert str(info.value) == (
        f"{WHERE}: invalid JSON Schema: $ref loop {loop} {LOOP}; a recursive schema must "
        "enter a property or an item before it refers back")


def test_a_loop_through_an_id_is_refused_by_the_probes():
    # The static check follows "#/..." refs only; a probe instance still recurses.
    schema = {"$id": "http://schemas.example.com/s.json", "$ref": "s.json#"}
    with pytest.raises(ConfigError) as info:
        compile_schema(schema, key=KEY)
    assert str(info.value) == (f"{WHERE}: invalid JSON Schema: validating {{}} recurses "
                               "without end (a $ref loop that enters no property or item)")


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "object", "properties": {"child": {"$ref": "#"}}},
         {"child": {"child": {}}}),
        ({"$ref": "#/definitions/node", "definitions": {"node": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
        }}}, {"kids": [{"kids": []}, {}]}),
        ({"definitions": {"a": {"type": "integer"}}, "allOf": [{"$ref": "#/definitions/a"}],
          "anyOf": [{"$ref": "#/definitions/a"}]}, 1),
        # JSON-Schema-Test-Suite's infinite-loop-detection case: one definition reached
        # twice for the same value is no loop.
        ({"$defs": {"int": {"type": "integer"}},
          "allOf": [{"properties": {"foo": {"$ref": "#/$defs/int"}}},
                    {"additionalProperties": {"$ref": "#/$defs/int"}}]}, {"foo": 1}),
    ],
    ids=["tree", "nodes", "shared-definition", "same-definition-twice"],
)
def test_recursion_that_enters_a_property_or_item_compiles(schema, value):
    assert compile_schema(schema, key=KEY).validate(value) is None


def test_a_validator_that_fails_is_a_violation_of_that_message_not_an_error():
    # A loop only a payload reaches, behind an $id: neither check sees it at compile time.
    schema = {"$id": "http://schemas.example.com/s.json",
              "definitions": {"a": {"$ref": "s.json#/definitions/a"}},
              "properties": {"q": {"$ref": "#/definitions/a"}}}
    compiled = compile_schema(schema, key=KEY)
    compiled.validate({"p": 1})
    err = violation(schema, {"q": 1})
    assert err.path == "$"
    assert err.reason == (
        "cannot be checked: the schema's validator failed on it (RecursionError: maximum "
        f"recursion depth exceeded); the operator must fix {WHERE}")


# --- compatibility --------------------------------------------------------------------------


def obj(props: dict, required: tuple[str, ...] = (), **extra: object) -> dict:
    schema: dict = {"type": "object", "properties": props, **extra}
    if required:
        schema["required"] = list(required)
    return schema


STR = {"type": "string"}
INT = {"type": "integer"}

COMPATIBLE = [
    (obj({"qty": INT}), obj({"qty": INT, "note": STR}), ["added optional field $.note"]),
    (obj({"qty": INT}), obj({"qty": {"type": "number"}}),
     ["type of $.qty widened from integer to number"]),
    (obj({"note": STR}), obj({"note": {"type": ["string", "null"]}}),
     ["type of $.note widened from string to string or null"]),
    (obj({"note": {"type": ["string", "null"]}}),
     obj({"note": {"type": ["string", "null", "integer"]}}),
     ["type of $.note widened from string or null to string or null or integer"]),
    (obj({"note": STR}), obj({"note": {}}), ["type of $.note widened from string to any"]),
    (obj({"qty": INT}, ("qty",)), obj({"qty": INT}), ["field $.qty became optional"]),
    (obj({"s": {"enum": ["new", "paid"]}}), obj({"s": {"enum": ["new", "paid", "void"]}}),
     ['enum value "void" added to $.s']),
    (obj({"s": {"enum": ["new"]}}), obj({"s": STR}), ["enum of $.s removed"]),
    (obj({"k": {"maxLength": 10}}), obj({"k": {"maxLength": 20}}),
     ["maxLength of $.k raised from 10 to 20"]),
    (obj({"k": {"maxLength": 10}}), obj({"k": {}}), ["maxLength of $.k removed (was 10)"]),
    (obj({"k": {"maximum": 10}}), obj({"k": {"maximum": 10.5}}),
     ["maximum of $.k raised from 10 to 10.5"]),
    (obj({"k": {"maximum": 10}}), obj({"k": {}}), ["maximum of $.k removed (was 10)"]),
    (obj({"k": {"minLength": 3}}), obj({"k": {"minLength": 1}}),
     ["minLength of $.k lowered from 3 to 1"]),
    (obj({"k": {"minLength": 3}}), obj({"k": {}}), ["minLength of $.k removed (was 3)"]),
    (obj({"k": {"minimum": 0}}), obj({"k": {"minimum": -5}}),
     ["minimum of $.k lowered from 0 to -5"]),
    (obj({"k": {"minimum": 0}}), obj({"k": {}}), ["minimum of $.k removed (was 0)"]),
    (obj({"k": {"maxItems": 2}}), obj({"k": {"maxItems": 3}}),
     ["maxItems of $.k raised from 2 to 3"]),
    (obj({}, additionalProperties=False), obj({}), ["additionalProperties: false removed at $"]),
    (obj({}, additionalProperties=False), obj({}, additionalProperties=True),
     ["additionalProperties: false removed at $"]),
    (obj({"k": {"const": 1}}), obj({"k": {}}), ["const of $.k removed"]),
    (obj({"c": obj({"id": INT})}), obj({"c": obj({"id": INT, "email": STR})}),
     ["added optional field $.c.email"]),
    (obj({"l": {"type": "array", "items": obj({"q": INT})}}),
     obj({"l": {"type": "array", "items": obj({"q": {"type": "number"}})}}),
     ["type of $.l[].q widened from integer to number"]),
    (obj({"a-b": INT, "x y": INT}), obj({"a-b": {"type": "number"}, "x y": {"type": "number"}}),
     ["type of $.a-b widened from integer to number",
      'type of $["x y"] widened from integer to number']),
]

BREAKING = [
    (obj({"qty": INT, "sku": STR}), obj({"sku": STR}), ["removed field $.qty (breaking)"]),
    (obj({"qty": INT}), obj({"qty": INT, "email": STR}, ("email",)),
     ["added required field $.email (breaking)"]),
    (obj({"email": STR}), obj({"email": STR}, ("email",)),
     ["field $.email became required (breaking)"]),
    (obj({}), obj({}, ("email",)), ["field $.email became required (breaking)"]),
    (obj({"qty": {"type": "number"}}), obj({"qty": INT}),
     ["type of $.qty narrowed from number to integer (breaking)"]),
    (obj({"n": {"type": ["string", "null"]}}), obj({"n": STR}),
     ["type of $.n narrowed from string or null to string (breaking)"]),
    (obj({"n": {}}), obj({"n": STR}), ["type of $.n narrowed from any to string (breaking)"]),
    (obj({"n": STR}), obj({"n": INT}), ["type of $.n changed from string to integer (breaking)"]),
    (obj({"s": {"enum": ["new", "paid"]}}), obj({"s": {"enum": ["new"]}}),
     ['enum value "paid" removed from $.s (breaking)']),
    (obj({"s": STR}), obj({"s": {"type": "string", "enum": ["new"]}}),
     ['enum ["new"] added at $.s (breaking)']),
    (obj({"s": {"enum": [1]}}), obj({"s": {"enum": [True]}}),
     ["enum value 1 removed from $.s (breaking)", "enum value true added to $.s"]),
    (obj({"s": {"enum": [1, "a"]}}), obj({"s": STR}),
     ["type of $.s narrowed from integer or string to string (breaking)", "enum of $.s removed"]),
    (obj({"k": {"maxLength": 10}}), obj({"k": {"maxLength": 5}}),
     ["maxLength of $.k lowered from 10 to 5 (breaking)"]),
    (obj({"k": {}}), obj({"k": {"maxLength": 5}}), ["maxLength 5 added at $.k (breaking)"]),
    (obj({"k": {"maximum": 10}}), obj({"k": {"maximum": 9}}),
     ["maximum of $.k lowered from 10 to 9 (breaking)"]),
    (obj({"k": {"minLength": 1}}), obj({"k": {"minLength": 2}}),
     ["minLength of $.k raised from 1 to 2 (breaking)"]),
    (obj({"k": {"minimum": 0}}), obj({"k": {"minimum": 1}}),
     ["minimum of $.k raised from 0 to 1 (breaking)"]),
    (obj({"k": {}}), obj({"k": {"minimum": 0}}), ["minimum 0 added at $.k (breaking)"]),
    (obj({}), obj({}, additionalProperties=False),
     ["additionalProperties: false added at $ (breaking)"]),
    (obj({"k": {"const": "order"}}), obj({"k": {"const": "refund"}}),
     ['const of $.k changed from "order" to "refund" (breaking)']),
    (obj({"k": {}}), obj({"k": {"const": "order"}}), ['const "order" added at $.k (breaking)']),
    (obj({"c": obj({"id": INT, "email": STR})}), obj({"c": obj({"id": INT, "email": STR},
                                                               ("email",))}),
     ["field $.c.email became required (breaking)"]),
    (obj({"l": {"type": "array", "items": obj({"q": {"type": "number"}})}}),
     obj({"l": {"type": "array", "items": obj({"q": INT})}}),
     ["type of $.l[].q narrowed from number to integer (breaking)"]),
    (obj({"l": {"type": "array"}}), obj({"l": {"type": "array", "items": INT}}),
     ["type of $.l[] narrowed from any to integer (breaking)"]),
    (obj({"c": {"$ref": "#/$defs/a"}}), obj({"c": {"$ref": "#/$defs/b"}}),
     ["$ref of $.c changed in a way minou cannot verify (treated as breaking)"]),
    ({"oneOf": [STR, INT]}, {"oneOf": [STR]},
     ["oneOf of $ changed in a way minou cannot verify (treated as breaking)"]),
    ({"anyOf": [STR]}, {},
     ["anyOf of $ changed in a way minou cannot verify (treated as breaking)"]),
    (obj({"k": {"pattern": "^a"}}), obj({"k": {"pattern": "^b"}}),
     ["pattern of $.k changed in a way minou cannot verify (treated as breaking)"]),
    (obj({"k": {"items": [INT]}}), obj({"k": {"items": [INT, STR]}}),
     ["items of $.k changed in a way minou cannot verify (treated as breaking)"]),
    ({"$defs": {"a": INT}}, {"$defs": {"a": STR}},
     ["$defs of $ changed in a way minou cannot verify (treated as breaking)"]),
    (obj({"k": {"exclusiveMinimum": True, "minimum": 0}}), obj({"k": {"minimum": 0}}),
     ["exclusiveMinimum of $.k changed in a way minou cannot verify (treated as breaking)"]),
]


@pytest.mark.parametrize(("old", "new", "changes"), COMPATIBLE)
def test_compatible_changes(old, new, changes):
    result = compare(old, new, old_key="orders/v1", new_key="orders/v2")
    assert result.changes == changes
    assert result.compatible


@pytest.mark.parametrize(("old", "new", "changes"), BREAKING)
def test_breaking_changes(old, new, changes):
    result = compare(old, new, old_key="orders/v1", new_key="orders/v2")
    assert result.changes == changes
    assert not result.compatible


@pytest.mark.parametrize(
    "new",
    [
        copy.deepcopy(ORDER),
        {**ORDER, "description": "an order", "title": "Order", "$comment": "v1 again"},
        {**ORDER, "type": ["object"]},
    ],
    ids=["identical", "annotations-only", "same-types-spelled-differently"],
)
def test_no_changes(new):
    result = compare(ORDER, new, old_key="orders/v1", new_key="orders/v2")
    assert (result.compatible, result.changes) == (True, [])
    assert result.summary() == "orders/v1 -> orders/v2: compatible (no changes)"


def test_the_same_number_spelled_differently_is_no_change():
    result = compare({"maximum": 10}, {"maximum": 10.0}, old_key="a/v1", new_key="a/v2")
    assert (result.compatible, result.changes) == (True, [])


def test_summaries():
    def summary(old: dict, new: dict) -> str:
        return compare(old, new, old_key="orders/v1", new_key="orders/v2").summary()

    qty = obj({"qty": INT})
    assert summary(qty, obj({"qty": INT, "note": STR})) == (
        "orders/v1 -> orders/v2: compatible (added optional field $.note)"
    )
    assert summary(qty, obj({})) == "orders/v1 -> orders/v2: BREAKING: removed field $.qty"
    assert summary(qty, obj({"note": STR, "n": STR}, ("n",))) == (
        "orders/v1 -> orders/v2: BREAKING: removed field $.qty; added required field $.n "
        "(and 1 compatible change)"
    )
    assert summary({"pattern": "a"}, {"pattern": "b"}) == (
        "orders/v1 -> orders/v2: BREAKING: pattern of $ changed in a way minou cannot verify "
        "(treated as breaking)"
    )


def test_as_dict_is_plain_json():
    result = compare(obj({"qty": INT}), obj({}), old_key="orders/v1", new_key="orders/v2")
    assert json.loads(json.dumps(result.as_dict())) == {
        "old": "orders/v1",
        "new": "orders/v2",
        "compatible": False,
        "changes": ["removed field $.qty (breaking)"],
    }


def test_report_sorts_versions_numerically_and_stays_within_an_endpoint():
    schemas = {
        "orders/v10": obj({"a": INT, "b": INT, "c": INT}),
        "orders/v2": obj({"a": INT, "b": INT}),
        "billing/v3": obj({"z": INT}),
        "orders/v1": obj({"a": INT}),
        "billing/v4": obj({"z": INT}),
        "orders/*": obj({}),  # options for every version; nothing to compare it with
        "audit/v1": obj({}),
    }
    report = compatibility_report(schemas)
    assert [(c.old, c.new) for c in report] == [
        ("billing/v3", "billing/v4"),
        ("orders/v1", "orders/v2"),
        ("orders/v2", "orders/v10"),
    ]
    assert [c.changes for c in report] == [
        [], ["added optional field $.b"], ["added optional field $.c"],
    ]
    assert all(isinstance(c, Compatibility) and c.compatible for c in report)
    assert compatibility_report({}) == []


# Scalar schemas only: there, every rule compare() calls compatible is a true relaxation,
# so whatever the old version accepted the new one must accept too.
_TYPES = ["integer", "number", "string", "null"]
_KEYWORDS = {
    "type": st.one_of(
        st.sampled_from(_TYPES), st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3,
                                          unique=True)
    ),
    "minimum": st.integers(-10, 10),
    "maximum": st.integers(-10, 10),
    "minLength": st.integers(0, 4),
    "maxLength": st.integers(0, 4),
    "enum": st.lists(st.sampled_from([0, 1, 2.5, "", "a", None, False]), min_size=1, max_size=4,
                     unique_by=json.dumps),
}
# Every value near every limit the strategies can draw, so a wrongly "compatible"
# tightening always has a witness.
_PROBES = [
    None, True, False, 2.5,
    *range(-11, 12), *(n + 0.5 for n in range(-11, 11)),
    *("abcde"[:n] for n in range(6)),
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_compatible_means_old_payloads_still_validate(data):
    names = sorted(_KEYWORDS)
    old = {k: data.draw(_KEYWORDS[k]) for k in data.draw(st.sets(st.sampled_from(names),
                                                                   max_size=3))}
    # new is old with one or two keywords dropped or redrawn, so many pairs are close
    # enough to be compatible; two independent schemas almost never are.
    new = dict(old)
    for keyword in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=2)):
        if keyword in new and data.draw(st.booleans()):
            del new[keyword]
        else:
            new[keyword] = data.draw(_KEYWORDS[keyword])
    if not compare(old, new, old_key="a/v1", new_key="a/v2").compatible:
        return
    check_old = compile_schema(old, key="a/v1")
    check_new = compile_schema(new, key="a/v2")
    for value in _PROBES:
        try:
            check_old.validate(value)
        except SchemaViolation:
            continue
        check_new.validate(value)
