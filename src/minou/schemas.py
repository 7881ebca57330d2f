"""JSON Schemas for channel versions: load, compile, validate, and check evolution.

A channel version (``orders/v1``) may declare a schema under
``[channels."orders/v1"] schema = ...``, either inline or as a path to a JSON
file. The schema is compiled once at start-up with fastjsonschema and every
payload published to a channel of that version is validated before it is stored.

Two choices about fastjsonschema matter for a broker:

* Remote ``$ref`` is refused. In fastjsonschema 2.22.3, ``handlers={}`` does
  *not* stop fetching: a URI whose scheme has no handler falls through to
  ``urllib.request.urlopen``, which would reach any host (server-side request
  forgery from a config file) or read ``file://`` paths. We pass a mapping that
  claims every scheme and raises, so a ref to another document fails at
  compile time with a ConfigError and no I/O happens. Refs inside the document
  (``#/definitions/...``, ``#/$defs/...``) still work.
* ``use_default=False``: otherwise the compiled validator fills ``default``
  values into the payload it checks, silently changing what a producer sent.

Declaring ``orders/v2`` next to ``orders/v1`` is checked by :func:`compare`.
The rules are the ones a schema registry usually calls backward compatibility
(relaxing is fine, tightening or removing is not), with two deliberate
exceptions: adding an optional field is compatible and removing a field is
breaking, because consumers care about the fields they read. Whatever the
comparison cannot reason about (``$ref``, ``oneOf``, ``pattern``...) is
reported as breaking rather than guessed at.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import unquote

import fastjsonschema
from fastjsonschema import JsonSchemaDefinitionException, JsonSchemaValueException

from .errors import ConfigError

__all__ = [
    "Compatibility",
    "CompiledSchema",
    "SchemaViolation",
    "compare",
    "compatibility_report",
    "compile_schema",
    "load_schema",
]


class SchemaViolation(Exception):
    """A payload does not match its channel version's schema."""

    def __init__(self, path: str, reason: str) -> None:
        # Both go to args so the exception pickles and reprs faithfully.
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A channel version's schema, ready to validate payloads."""

    key: str
    # A private copy: fingerprint must keep describing it even if the caller's dict changes.
    source: dict[str, Any] = field(compare=False)
    fingerprint: str
    _check: Callable[[Any], Any] = field(repr=False, compare=False)

    def validate(self, value: object) -> None:
        """Raise SchemaViolation if ``value`` (a decoded JSON payload) does not match, or
        if the validator fails on it: that refuses one message, never the broker."""
        try:
            self._check(value)
        except JsonSchemaValueException as exc:
            raise _violation(exc) from None
        except Exception as exc:  # RecursionError from a $ref loop compile_schema missed
            raise SchemaViolation(
                "$", f"cannot be checked: the schema's validator failed on it "
                f"({type(exc).__name__}: {exc}); the operator must fix {_where(self.key)}"
            ) from None


def _violation(exc: JsonSchemaValueException) -> SchemaViolation:
    # fastjsonschema names the value "data", "data.items[2].qty", ...; its message
    # repeats that name first ("data.items[2].qty must be integer").
    name = exc.name or "data"
    path = "$" + name[4:] if name.startswith("data") else "$." + name
    message = exc.message or "is invalid"
    reason = message[len(name) + 1 :] if message.startswith(name + " ") else message
    if exc.rule == "additionalProperties":
        extra = _extra_properties(exc.value, exc.definition)
        if extra:
            # fastjsonschema prints a set, whose order changes from run to run.
            reason = f"must not contain {extra} properties"
    return SchemaViolation(path, reason)


def _extra_properties(value: object, definition: object) -> list[str] | None:
    if not isinstance(value, dict) or not isinstance(definition, dict):
        return None
    declared = definition.get("properties") or {}
    patterns = definition.get("patternProperties") or {}
    try:
        return sorted(
            k for k in value if k not in declared and not any(re.search(p, k) for p in patterns)
        )
    except (TypeError, re.error):
        return None


# --- loading and compiling ------------------------------------------------------------------


def _where(key: str) -> str:
    return f'channels."{key}".schema'


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _reject_constant(name: str) -> NoReturn:
    # Python's json accepts NaN/Infinity; they are not JSON and make no sense in a schema.
    raise ValueError(f"{name} is not valid JSON")


class _RepeatedKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A key given twice would keep its last value silently: a schema read differently
    # from how it was written.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(f"key {json.dumps(key)} is given twice in one object (JSON "
                               "readers keep the last value silently); give each key once")
        out[key] = value
    return out


def load_schema(raw: dict[str, Any] | str, *, key: str, base_dir: Path) -> dict[str, Any]:
    """Return the schema document configured for ``key``: inline, or read from a JSON file.

    A relative path is relative to ``base_dir`` (the config file's directory).
    """
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(
            f"{_where(key)}: expected a JSON Schema object or a file path, "
            f"got {json.dumps(raw, default=str)}"
        )
    path = base_dir / Path(raw).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"{_where(key)}: cannot read schema file {path}: {exc.strerror or exc}"
        ) from exc
    try:
        document = json.loads(data, parse_constant=_reject_constant,
                              object_pairs_hook=_unique_object)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{_where(key)}: {path} is not valid JSON: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno})"
        ) from exc
    except _RepeatedKey as exc:
        raise ConfigError(f"{_where(key)}: {path}: {exc}") from exc
    except ValueError as exc:  # undecodable bytes, NaN/Infinity
        raise ConfigError(f"{_where(key)}: {path} is not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(
            f"{_where(key)}: {path} must hold a JSON object, got {_json_type(document)}"
        )
    return document


def _refuse_remote(uri: str) -> NoReturn:
    raise JsonSchemaDefinitionException(
        f"$ref {uri!r} points outside the schema document; minou never fetches schemas, "
        "put the definition under definitions/$defs and use a '#/...' ref"
    )


class _RefuseEveryScheme(Mapping[str, Callable[[str], Any]]):
    """fastjsonschema handlers claiming every URI scheme, so urllib is never reached."""

    def __getitem__(self, scheme: str) -> Callable[[str], Any]:
        return _refuse_remote

    def __contains__(self, scheme: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


_NO_REMOTE_REFS = _RefuseEveryScheme()


def _canonical(document: object) -> str:
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


# Subschemas applied to the very value their schema is (no property or item is entered
# first): a $ref cycle through these alone recurses without end.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")
# Probed at compile time: a validator that recurses on one of these is refused whatever
# the static check below could see (refs resolved through an $id, say).
_PROBES: tuple[object, ...] = ({}, [], None, 0, "", False)
_FOLLOW = object()  # in place of a subschema: the one a $ref points to


def _pointer(document: object, ref: str) -> object:
    """The subschema a local ``#/...`` ref names, or _MISSING."""
    node = document
    for part in ref[2:].split("/") if ref != "#" else ():
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _local_refs(node: object) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            yield ref
        for value in node.values():
            yield from _local_refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _local_refs(value)


def _nested_ids(node: object, top: bool = True) -> bool:
    """Whether a subschema sets its own base URI ($id, draft-04 id): "#/..." refs under it
    name that resource, not the document, so the static check cannot follow them."""
    if isinstance(node, dict):
        if not top and isinstance(node.get("$id", node.get("id")), str):
            return True
        return any(_nested_ids(v, False) for v in node.values())
    return isinstance(node, list) and any(_nested_ids(v, False) for v in node)


def _in_place(node: dict[str, Any], at: str) -> Iterator[tuple[str, object]]:
    """(where, subschema) of what ``node`` applies to its own value."""
    ref = node.get("$ref")
    if isinstance(ref, str):  # fastjsonschema ignores a $ref's sibling keywords
        if ref == "#" or ref.startswith("#/"):
            yield ref, _FOLLOW
        return
    for word in _IN_PLACE_ONE:
        if word in node:
            yield f"{at}/{word}", node[word]
    for word in _IN_PLACE_MANY:
        if isinstance(node.get(word), list):
            for i, sub in enumerate(node[word]):
                yield f"{at}/{word}/{i}", sub
    dependencies = node.get("dependencies")
    if isinstance(dependencies, dict):  # a schema dependency applies to the object itself
        for name, sub in dependencies.items():
            yield f"{at}/dependencies/{name}", sub


def _ref_loop(document: dict[str, Any]) -> list[str] | None:
    """A chain of $refs (with allOf, not... between them) that comes back to where it
    started without entering a property or an item: validating any value that reaches
    it never ends. JSON Schema leaves them undefined ("Schemas SHOULD NOT make use of
    infinite recursive nesting like this")."""
    if _nested_ids(document):
        return None
    done: set[str] = set()

    def walk(at: str, node: object, trail: list[str]) -> list[str] | None:
        if node is _FOLLOW:  # a $ref: go on where it points
            node = _pointer(document, at)
        if at in trail:
            return [*trail[trail.index(at):], at]
        if at in done or not isinstance(node, dict):
            return None
        trail.append(at)
        for where, sub in _in_place(node, at):
            loop = walk(where, sub, trail)
            if loop:
                return loop
        trail.pop()
        done.add(at)
        return None

    for ref in dict.fromkeys(_local_refs(document)):
        loop = walk(ref, _FOLLOW, [])
        if loop:
            return loop
    return None


def compile_schema(source: dict[str, Any], *, key: str) -> CompiledSchema:
    """Compile ``source`` for ``key``; an unusable schema is a ConfigError naming the key."""
    if not isinstance(source, dict):
        raise ConfigError(
            f"{_where(key)}: invalid JSON Schema: expected an object, got {_json_type(source)}"
        )
    try:
        loop = _ref_loop(source)
    except RecursionError:
        raise ConfigError(f"{_where(key)}: invalid JSON Schema: nested too deeply") from None
    if loop:
        raise ConfigError(
            f"{_where(key)}: invalid JSON Schema: $ref loop {' -> '.join(loop)} applies the "
            "schema to the same value again without end; a recursive schema must enter a "
            "property or an item before it refers back"
        )
    try:
        fingerprint = hashlib.sha256(_canonical(source).encode()).hexdigest()[:16]
        # Deep copies: fastjsonschema rewrites "$ref" values in place while resolving.
        own = copy.deepcopy(source)
        check = fastjsonschema.compile(
            copy.deepcopy(source), handlers=_NO_REMOTE_REFS, use_default=False
        )
    except Exception as exc:  # fastjsonschema also leaks TypeError, re.error, ... on bad input
        raise ConfigError(
            f"{_where(key)}: invalid JSON Schema: {str(exc) or type(exc).__name__}"
        ) from exc
    for probe in copy.deepcopy(_PROBES):
        try:
            check(probe)
        except RecursionError:
            raise ConfigError(
                f"{_where(key)}: invalid JSON Schema: validating {json.dumps(probe)} "
                "recurses without end (a $ref loop that enters no property or item)"
            ) from None
        except Exception:  # a mismatch; any other failure, validate() turns into a refusal
            continue
    return CompiledSchema(key=key, source=own, fingerprint=fingerprint, _check=check)


# --- compatibility between versions ---------------------------------------------------------

_BREAKING = " (breaking)"
_UNVERIFIABLE = " changed in a way minou cannot verify (treated as breaking)"

# Keywords with no effect on which payloads are valid (default included: use_default=False).
_ANNOTATIONS = frozenset(
    {"title", "description", "examples", "default", "$comment", "deprecated", "readOnly",
     "writeOnly"}
)
_UPPER_LIMITS = ("maxLength", "maximum", "exclusiveMaximum", "maxItems", "maxProperties")
_LOWER_LIMITS = ("minLength", "minimum", "exclusiveMinimum", "minItems", "minProperties")
_ANALYSED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "enum", "const",
     *_UPPER_LIMITS, *_LOWER_LIMITS}
)
_MISSING = object()


def _is_breaking(change: str) -> bool:
    return change.endswith(_BREAKING) or change.endswith(_UNVERIFIABLE)


@dataclass(frozen=True)
class Compatibility:
    """The verdict on one version step of one endpoint (``orders/v1`` -> ``orders/v2``)."""

    old: str
    new: str
    compatible: bool
    changes: list[str]

    def summary(self) -> str:
        head = f"{self.old} -> {self.new}"
        if not self.changes:
            return f"{head}: compatible (no changes)"
        if self.compatible:
            return f"{head}: compatible ({'; '.join(self.changes)})"
        breaking = [c.removesuffix(_BREAKING) for c in self.changes if _is_breaking(c)]
        rest = len(self.changes) - len(breaking)
        tail = f" (and {rest} compatible change{'s' if rest != 1 else ''})" if rest else ""
        return f"{head}: BREAKING: {'; '.join(breaking)}{tail}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "old": self.old,
            "new": self.new,
            "compatible": self.compatible,
            "changes": list(self.changes),
        }


def compare(
    old: dict[str, Any], new: dict[str, Any], *, old_key: str, new_key: str
) -> Compatibility:
    """Can ``new`` replace ``old`` without breaking anyone? See the module docstring."""
    changes: list[str] = []
    _diff(old, new, "$", changes)
    return Compatibility(
        old=old_key,
        new=new_key,
        compatible=not any(_is_breaking(c) for c in changes),
        changes=changes,
    )


_VERSIONED = re.compile(r"(?P<endpoint>[^/]+)/v(?P<number>[0-9]+)")


def compatibility_report(schemas: dict[str, dict[str, Any]]) -> list[Compatibility]:
    """Compare each endpoint's consecutive declared versions (v2 before v10).

    Keys that are not ``endpoint/vN`` (``orders/*``) have no neighbours and are skipped.
    """
    by_endpoint: dict[str, list[tuple[int, str]]] = {}
    for key in schemas:
        m = _VERSIONED.fullmatch(key)
        if m:
            by_endpoint.setdefault(m["endpoint"], []).append((int(m["number"]), key))
    report = []
    for endpoint in sorted(by_endpoint):
        versions = [key for _, key in sorted(by_endpoint[endpoint])]
        for old_key, new_key in pairwise(versions):
            report.append(
                compare(schemas[old_key], schemas[new_key], old_key=old_key, new_key=new_key)
            )
    return report


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if re.fullmatch(r"[\w-]+", name) else f"{path}[{json.dumps(name)}]"


def _show(value: object) -> str:
    return json.dumps(value, default=repr)


def _same(a: object, b: object) -> bool:
    # Canonical JSON, not ==: in Python True == 1 and 1 == 1.0, in JSON Schema they differ.
    return _canonical_or_repr(a) == _canonical_or_repr(b)


def _canonical_or_repr(value: object) -> str:
    try:
        return _canonical(value)
    except (TypeError, ValueError):
        return repr(value)


def _subschema(node: object) -> dict[str, Any] | None:
    """A subschema as a dict; absent and ``true`` both mean "anything"; None: cannot analyse."""
    if node is _MISSING or node is True:
        return {}
    return node if isinstance(node, dict) else None


def _diff(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    o, n = _subschema(old), _subschema(new)
    if o is None or n is None:
        out.append(f"schema of {path}{_UNVERIFIABLE}")
        return
    if "type" in o or "type" in n:  # else enum/const alone decide, and are compared below
        _diff_type(_type_of(o), _type_of(n), path, out)
    _diff_object(o, n, path, out)
    _diff_additional(
        o.get("additionalProperties", _MISSING), n.get("additionalProperties", _MISSING), path, out
    )
    _diff_items(o.get("items", _MISSING), n.get("items", _MISSING), path, out)
    _diff_enum(o.get("enum", _MISSING), n.get("enum", _MISSING), path, out)
    _diff_const(o.get("const", _MISSING), n.get("const", _MISSING), path, out)
    for keyword in _UPPER_LIMITS:
        _diff_limit(keyword, o.get(keyword, _MISSING), n.get(keyword, _MISSING), path, out, +1)
    for keyword in _LOWER_LIMITS:
        _diff_limit(keyword, o.get(keyword, _MISSING), n.get(keyword, _MISSING), path, out, -1)
    for keyword in sorted((o.keys() | n.keys()) - _ANALYSED - _ANNOTATIONS):
        if not _same(o.get(keyword, _MISSING), n.get(keyword, _MISSING)):
            out.append(f"{keyword} of {path}{_UNVERIFIABLE}")


_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
    (type(None), "null"), (list, "array"), (dict, "object"),
)


def _type_of(node: dict[str, Any]) -> object:
    """The node's "type", else the types of its enum/const values, else _MISSING (any)."""
    if "type" in node:
        return node["type"]
    # Without this, replacing enum ["new", "paid"] by type "string" would read as a
    # narrowing from any type to string, when it accepts strictly more.
    values = [node["const"]] if "const" in node else node.get("enum")
    if not isinstance(values, list) or not values:
        return _MISSING
    inferred: list[str] = []
    for value in values:
        name = next((t for cls, t in _JSON_TYPES if isinstance(value, cls)), None)
        if name is None:
            return _MISSING
        if name not in inferred:
            inferred.append(name)
    return inferred[0] if len(inferred) == 1 else inferred


def _types(node: object) -> frozenset[str] | None:
    if isinstance(node, str):
        return frozenset((node,))
    if isinstance(node, list) and all(isinstance(t, str) for t in node):
        return frozenset(node)
    return None


def _covers(types: frozenset[str] | None, t: str) -> bool:
    # None is "no type keyword": every type is accepted.
    return types is None or t in types or (t == "integer" and "number" in types)


def _show_types(node: object) -> str:
    if node is _MISSING:
        return "any"
    if isinstance(node, list):
        return " or ".join(str(t) for t in node)
    return str(node)


def _diff_type(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    o = None if old is _MISSING else _types(old)
    n = None if new is _MISSING else _types(new)
    if (o is None and old is not _MISSING) or (n is None and new is not _MISSING):
        out.append(f"type of {path}{_UNVERIFIABLE}")
        return
    widens = n is None or (o is not None and all(_covers(n, t) for t in o))
    narrows = o is None or (n is not None and all(_covers(o, t) for t in n))
    shown = f"from {_show_types(old)} to {_show_types(new)}"
    if widens and narrows:
        return  # same set of types, spelled differently ("string" vs ["string"])
    if widens:
        out.append(f"type of {path} widened {shown}")
    elif narrows:
        out.append(f"type of {path} narrowed {shown}{_BREAKING}")
    else:
        out.append(f"type of {path} changed {shown}{_BREAKING}")


def _names(node: object) -> list[str] | None:
    if node is _MISSING:
        return []
    if isinstance(node, list) and all(isinstance(x, str) for x in node):
        return node
    return None


def _diff_object(o: dict[str, Any], n: dict[str, Any], path: str, out: list[str]) -> None:
    old_props, new_props = o.get("properties", {}), n.get("properties", {})
    old_req, new_req = _names(o.get("required", _MISSING)), _names(n.get("required", _MISSING))
    if not isinstance(old_props, dict) or not isinstance(new_props, dict):
        if not _same(old_props, new_props):
            out.append(f"properties of {path}{_UNVERIFIABLE}")
        old_props = new_props = {}
    if old_req is None or new_req is None:
        if not _same(o.get("required"), n.get("required")):
            out.append(f"required of {path}{_UNVERIFIABLE}")
        old_req = new_req = []
    # Fields already reported as removed or added need no extra "became required" sentence.
    reported: set[str] = set()
    for name, schema in old_props.items():
        if name not in new_props:
            out.append(f"removed field {_child(path, name)}{_BREAKING}")
            reported.add(name)
        else:
            _diff(schema, new_props[name], _child(path, name), out)
    for name in new_props:
        if name not in old_props:
            if name in new_req and name not in old_req:
                out.append(f"added required field {_child(path, name)}{_BREAKING}")
            else:
                out.append(f"added optional field {_child(path, name)}")
            reported.add(name)
    for name in new_req:
        if name not in old_req and name not in reported:
            out.append(f"field {_child(path, name)} became required{_BREAKING}")
    for name in old_req:
        if name not in new_req and name not in reported:
            out.append(f"field {_child(path, name)} became optional")


def _diff_additional(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    if new is False:
        out.append(f"additionalProperties: false added at {path}{_BREAKING}")
    elif old is False:
        if _subschema(new) == {}:
            out.append(f"additionalProperties: false removed at {path}")
        elif _subschema(new) is not None:
            out.append(f"additionalProperties of {path} relaxed from false to a schema")
        else:
            out.append(f"additionalProperties of {path}{_UNVERIFIABLE}")
    else:
        _diff(old, new, f"{path}.*", out)


def _diff_items(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    if _subschema(old) is None or _subschema(new) is None:  # tuple form, false
        out.append(f"items of {path}{_UNVERIFIABLE}")
        return
    _diff(old, new, f"{path}[]", out)


def _diff_enum(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    if old is _MISSING and isinstance(new, list):
        out.append(f"enum {_show(new)} added at {path}{_BREAKING}")
    elif new is _MISSING and isinstance(old, list):
        out.append(f"enum of {path} removed")
    elif isinstance(old, list) and isinstance(new, list):
        old_values = {_canonical_or_repr(v) for v in old}
        new_values = {_canonical_or_repr(v) for v in new}
        out.extend(
            f"enum value {_show(v)} removed from {path}{_BREAKING}"
            for v in old
            if _canonical_or_repr(v) not in new_values
        )
        out.extend(
            f"enum value {_show(v)} added to {path}"
            for v in new
            if _canonical_or_repr(v) not in old_values
        )
    else:
        out.append(f"enum of {path}{_UNVERIFIABLE}")


def _diff_const(old: object, new: object, path: str, out: list[str]) -> None:
    if _same(old, new):
        return
    if old is _MISSING:
        out.append(f"const {_show(new)} added at {path}{_BREAKING}")
    elif new is _MISSING:
        out.append(f"const of {path} removed")
    else:
        out.append(f"const of {path} changed from {_show(old)} to {_show(new)}{_BREAKING}")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _diff_limit(
    keyword: str, old: object, new: object, path: str, out: list[str], direction: int
) -> None:
    """``direction`` +1 for upper bounds (raising relaxes), -1 for lower bounds."""
    if _same(old, new):
        return
    if (old is not _MISSING and not _is_number(old)) or (
        new is not _MISSING and not _is_number(new)
    ):
        # e.g. draft-04's boolean exclusiveMinimum
        out.append(f"{keyword} of {path}{_UNVERIFIABLE}")
    elif new is _MISSING:
        out.append(f"{keyword} of {path} removed (was {_show(old)})")
    elif old is _MISSING:
        out.append(f"{keyword} {_show(new)} added at {path}{_BREAKING}")
    else:
        assert isinstance(old, (int, float)) and isinstance(new, (int, float))
        if old == new:
            return  # 10 and 10.0
        relaxed = (new - old) * direction > 0
        verb = "raised" if new > old else "lowered"
        shown = f"{keyword} of {path} {verb} from {_show(old)} to {_show(new)}"
        out.append(shown if relaxed else shown + _BREAKING)
