"""The OpenAPI 3.1 document of the HTTP API, served at ``/openapi.json``.

Written out by hand, next to the routes it describes (``http_api.py``); the
test suite runs schemathesis against it and a live broker, so the two cannot
drift apart silently. Every bound it states is taken from ``minou.limits``, the
constants the broker enforces (tests/unit/test_openapi.py checks each one).
"""

from __future__ import annotations

from typing import Any

from .. import __version__
from ..errors import ERROR_TABLE
from ..limits import (
    DEFAULT_ADMIN_PAGE,
    DEFAULT_BROWSE,
    DEFAULT_CREDENTIAL_TTL_S,
    DEFAULT_KV_PAGE,
    DEFAULT_REQUEST_TIMEOUT_S,
    KV_PAGE_BYTES,
    MAX_ADMIN_PAGE,
    MAX_BATCH_HTTP,
    MAX_BROWSE,
    MAX_CHANNEL_LENGTH,
    MAX_CREDENTIAL_TTL_S,
    MAX_DELAY_S,
    MAX_DELETE,
    MAX_FROM_SEQ,
    MAX_GROUP_NAME,
    MAX_HTTP_WAIT_S,
    MAX_KEY_LENGTH,
    MAX_KV_PAGE,
    MAX_KV_REVISION,
    MAX_KV_WAIT_S,
    MAX_LEASE_S,
    MAX_PRIORITY,
    MAX_PURPOSE_CHARS,
    MAX_REQUEST_TIMEOUT_S,
    MAX_REQUEUE,
    MIN_CREDENTIAL_TTL_S,
    MIN_PRIORITY,
    RATE_HISTORY_QUEUES,
    RATE_HISTORY_S,
)

# The channel name rules of minou.names: a channel (endpoint/version/id) is at most
# MAX_CHANNEL_LENGTH characters, which JSON Schema cannot say of three path parameters,
# so the document gives the endpoint a share and the id what the longest version leaves.
_ENDPOINT_MAX_LENGTH = 50
_SEQ = "[1-9][0-9]{0,14}"  # a message seq as text: 15 digits stay under MAX_FROM_SEQ
_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]+$", "minLength": 1,
         "maxLength": _ENDPOINT_MAX_LENGTH}
_VERSION = {"type": "string", "pattern": "^v[1-9][0-9]{0,5}$"}
_LONGEST_VERSION = "v999999"  # what the pattern above allows (names._VERSION)
_ID_CHARS = r"(?:[A-Za-z0-9._~!$&'()+,;=:@-]|%[0-9A-Fa-f]{2})"
_ID = {"type": "string", "pattern": f"^(?:{_ID_CHARS}+|\\*)$", "minLength": 1,
       "maxLength": MAX_CHANNEL_LENGTH - _ENDPOINT_MAX_LENGTH - len(f"/{_LONGEST_VERSION}/")}
# A new group's name is 1..MAX_GROUP_NAME printable characters (names.check_label: spaces
# and non-ASCII letters too, which a portable pattern cannot list; printable ASCII here).
_GROUP = {"type": "string", "pattern": "^[!-~]+$", "minLength": 1, "maxLength": MAX_GROUP_NAME}
_SECONDS = {"type": "number", "minimum": 0, "maximum": MAX_DELAY_S}
_PRIORITY = {"type": "integer", "minimum": MIN_PRIORITY, "maximum": MAX_PRIORITY}
# Not a limit: the Nagios route takes any finite threshold; a documented range only.
_NAGIOS_MAX_MINUTES = 1e6


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _path(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema,
            "description": description}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": description}


def _paging(what: str) -> list[dict[str, Any]]:
    """An admin listing's page arguments (core/paging.py)."""
    return [_query("after", {"type": "string"}, f"{what} after this one (paging: the "
                   "answer's next)"),
            _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_ADMIN_PAGE},
                   f"at most this many (default {DEFAULT_ADMIN_PAGE})")]


def _errors(*codes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in sorted({400, 401, 403, 404, *codes}):
        reasons = sorted({i.reason for i in ERROR_TABLE.values() if i.http_status == status})
        out[str(status)] = _json(_ref("Error"), ", ".join(reasons) or "error")
    return out


def _op(summary: str, *, tag: str, params: list[dict[str, Any]] | None = None,
        ok: dict[str, Any], ok_status: str = "200", errors: tuple[int, ...] = (),
        body: dict[str, Any] | None = None, extra: dict[str, Any] | None = None,
        public: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "tags": [tag], "parameters": params or [],
                          "responses": {ok_status: ok, **(extra or {}), **_errors(*errors)}}
    if public:
        op["security"] = []
        op["responses"] = {ok_status: ok, **(extra or {})}
    if body is not None:
        op["requestBody"] = body
    return op


MESSAGE_PARAMS = [_path("endpoint", _NAME), _path("version", _VERSION),
                  _path("id", _ID, "the channel id (URL-encoded); '*' broadcasts")]
QUEUE_PARAMS = [_path("endpoint", _NAME), _path("version", _VERSION)]
OBJECT = {"type": "object"}
TEXT = {"description": "Prometheus text format 0.0.4",
        "content": {"text/plain": {"schema": {"type": "string"}}}}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "reason", "message", "detail"],
        "properties": {"code": {"type": "integer"}, "reason": {"type": "string"},
                       "message": {"type": "string"}, "detail": {"type": "object"}}}}},
    "Published": {"type": "object", "required": ["channel", "seq", "id", "duplicate", "fanout"],
                  "properties": {"channel": {"type": "string"}, "seq": {"type": "integer"},
                                 "id": {"type": "string"}, "duplicate": {"type": "boolean"},
                                 "fanout": {"type": "integer"}}},
    "Delivery": {"type": "object",
                 "required": ["receipt", "channel", "seq", "id", "headers", "attempts",
                              "published_at", "priority"],
                 "properties": {"receipt": {"type": "string"}, "channel": {"type": "string"},
                                "seq": {"type": "integer"}, "id": {"type": "string"},
                                "payload": {}, "payload_base64": {"type": ["string", "null"]},
                                "headers": {"type": "object",
                                            "additionalProperties": {"type": "string"}},
                                "attempts": {"type": "integer"},
                                "published_at": {"type": "number"},
                                "priority": {"type": "integer"},
                                "key": {"type": ["string", "null"]}}},
    "Message": {"type": "object", "required": ["channel", "payload"],
                "additionalProperties": False,
                "properties": {"channel": {"type": "string"}, "payload": {},
                               "headers": {"type": "object",
                                           "additionalProperties": {"type": "string"}},
                               "priority": _PRIORITY,
                               "ttl": {"type": "number", "minimum": 0},
                               "delay": {"type": "number", "minimum": 0},
                               "dedup": {"type": "string"}, "key": {"type": "string"}}},
    "Settled": {"type": "object", "required": ["receipt", "settled"],
                "properties": {"receipt": {"type": "string"},
                               "settled": {"enum": ["ack", "nack"]}}},
    "Queue": {"type": "object", "required": ["queue", "depth", "unsettled", "channels",
                                             "consumers", "listeners", "groups", "options"],
              "properties": {"queue": {"type": "string"},
                             "depth": {"type": "integer",
                                       "description": "messages stored (waiting, in flight, "
                                                      "or settled and kept by retention)"},
                             "unsettled": {"type": "integer",
                                           "description": "the old name of in_flight, for "
                                                         "every group"},
                             "oldest_age_s": {"type": ["number", "null"],
                                              "description": "age of the oldest message not "
                                                             "yet settled (waiting or in "
                                                             "flight)"},
                             "waiting": {"type": "integer",
                                         "description": "messages stored and not yet "
                                                        "delivered (new, requeued or "
                                                        "delayed): per channel, its "
                                                        "furthest-behind reader's"},
                             "in_flight": {"type": "integer",
                                           "description": "messages delivered and not yet "
                                                          "settled (acked or nacked)"},
                             "oldest_waiting_age_s": {"type": ["number", "null"],
                                                      "description": "seconds since the "
                                                                     "oldest waiting message "
                                                                     "was published"},
                             "oldest_in_flight_age_s": {"type": ["number", "null"],
                                                        "description": "seconds since the "
                                                                       "oldest in-flight "
                                                                       "message was "
                                                                       "published"},
                             "channels": {"type": "array"}, "groups": {"type": "array"},
                             "consumers": {"type": "integer"},
                             "listeners": {"type": "integer"},
                             "rates": {"type": "object"}, "options": {"type": "object"},
                             "diagnosis": {"type": "string"}}},
    "RateHistory": {
        "type": "object",
        "required": ["queue", "now", "interval_s", "t", "published", "delivered", "acked"],
        "properties": {
            "queue": {"type": ["string", "null"], "description": "null: the whole broker"},
            "now": {"type": "number", "description": "the broker's clock (unix seconds)"},
            "interval_s": {"type": "number", "description": "about one sample a second (less "
                           "often with tens of thousands of queues: see t)"},
            "t": {"type": "array", "items": {"type": "number"},
                  "description": "sample times (unix seconds), oldest first; empty for a "
                                 "queue with no history (at most "
                                 f"{RATE_HISTORY_QUEUES} queues have one)"},
            **{name: {"type": "array", "items": {"type": ["number", "null"]},
                      "description": f"messages {name} per second since the sample before "
                                     "(null: unknown)"}
               for name in ("published", "delivered", "acked")}}},
    "Receipt": {"type": "object", "required": ["id", "channel", "seq", "state"],
                "properties": {"id": {"type": "string"}, "channel": {"type": "string"},
                               "seq": {"type": "integer"},
                               "state": {"enum": ["stored", "delivered", "acked", "removed",
                                                  "dead_lettered"]},
                               "groups": {"type": "array"},
                               "dead_letter": {"type": "object"}}},
}


_BUCKET = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
_KV_KEY = {"type": "string", "pattern": "^(?!/)(?!.*//)[A-Za-z0-9_=./:@-]+$",
           "minLength": 1, "maxLength": MAX_KEY_LENGTH,
           "description": "letters, digits and _ = . / : @ - (no leading '/', no '//')"}
_REVISION = {"type": "integer", "minimum": 0, "maximum": MAX_KV_REVISION}
_ENTRY = {"type": "object", "properties": {
    "bucket": {"type": "string"}, "key": {"type": "string"}, "revision": _REVISION,
    "op": {"enum": ["put", "del"]}, "value": {},
    "value_base64": {"type": ["string", "null"]}, "created": {"type": "number"},
    "expires_at": {"type": ["number", "null"]}}}
_HISTORY = {"type": "object", "properties": {
    "bucket": {"type": "string"}, "key": {"type": "string"},
    "entries": {"type": "array", "items": _ENTRY,
                "description": f"oldest first, at most {KV_PAGE_BYTES >> 20} MiB of values "
                               "(always one)"},
    "next": {**_REVISION, "description": "the last revision answered: after= of the next page"},
    "more": {"type": "boolean", "description": "more revisions follow: ask for the next page"}}}
_ETAG = {"ETag": {"description": 'the revision, quoted ("7")', "schema": {"type": "string"}}}


def _kv_paths() -> dict[str, Any]:
    """Key-value buckets (docs/kv.md): reads need the bucket's read rule, writes its
    write rule (``kv/<bucket>``)."""
    bucket = _path("bucket", _BUCKET, "the bucket (its channel is _kv/v1/<bucket>)")
    key = _path("key", _KV_KEY, "the key")
    condition = [
        {"name": "If-Match", "in": "header", "required": False,
         "schema": {"type": "string", "pattern": '^("[0-9]{1,18}"|[0-9]{1,18})$'},
         "description": "compare-and-set: written only if the key is at this revision "
                        "(the ETag of a GET); else 412 revision_mismatch"},
        {"name": "If-None-Match", "in": "header", "required": False,
         "schema": {"enum": ["*"]},
         "description": "create: written only if the key has no value; else 412 (not "
                        "with If-Match)"}]
    written = {"description": "stored (durable); the ETag is the new revision",
               "headers": _ETAG, "content": {"application/json": {"schema": {
                   "type": "object", "properties": {"bucket": {"type": "string"},
                                                    "key": {"type": "string"},
                                                    "revision": _REVISION}}}}}
    return {
        "/v1/kv": {"get": _op(
            "The buckets the caller may read: keys, revisions held, options; sorted by "
            "name, a page at a time (after=next while more)", tag="kv",
            params=_paging("buckets"),
            ok=_json(OBJECT, "buckets, more (another page), next, total"))},
        "/v1/kv/{bucket}": {"get": _op(
            "A bucket's keys with a value, sorted (page with after=)", tag="kv",
            params=[bucket, _query("prefix", {"type": "string"}, "keys starting with this"),
                    _query("after", {"type": "string"}, "keys after this one (paging)"),
                    _query("limit", {"type": "integer", "minimum": 1,
                                     "maximum": MAX_KV_PAGE},
                           f"at most this many (default {DEFAULT_KV_PAGE})")],
            ok=_json(OBJECT, "keys, more (another page), revision (the bucket's latest)"))},
        "/v1/kv/{bucket}/{key}": {
            "get": _op(
                "A key's value and revision (ETag); ?revision= a stored one, ?history=true "
                "its stored revisions, a page at a time (after=next while more)", tag="kv",
                params=[bucket, key,
                        _query("revision", {"type": "integer", "minimum": 1,
                                            "maximum": MAX_KV_REVISION}, "a stored revision of it"),
                        _query("history", {"type": "boolean"}, "its stored revisions instead"),
                        _query("after", {"type": "integer", "minimum": 0,
                                         "maximum": MAX_KV_REVISION},
                               "with history: the revisions after this one (default 0)"),
                        _query("limit", {"type": "integer", "minimum": 1,
                                         "maximum": MAX_KV_PAGE},
                               f"with history: at most this many (default {DEFAULT_KV_PAGE})")],
                ok={"description": "the value; with history=true a page of its revisions",
                    "headers": _ETAG,
                    "content": {"application/json": {"schema": {"anyOf": [_ENTRY,
                                                                          _HISTORY]}}}}),
            "put": _op(
                "Store a value (a new revision)", tag="kv",
                params=[bucket, key, *condition,
                        _query("ttl", {"type": "number", "exclusiveMinimum": 0,
                                       "maximum": MAX_DELAY_S},
                               "seconds the value lives (default: the bucket's ttl)")],
                body={"required": True, "description": "the value (any JSON value)",
                      "content": {"application/json": {"schema": {}}}},
                ok=written, errors=(412, 413, 422, 429, 507)),
            "delete": _op(
                "Delete a key (a delete revision; its history stays)", tag="kv",
                params=[bucket, key, *condition], ok=written, errors=(412, 429, 507))},
        "/v1/kv-watch/{bucket}": {"get": _op(
            "The revisions after ?after= (a watch's long poll), or with ?latest=true the "
            "current values page by page", tag="kv",
            params=[bucket,
                    _query("after", {"type": "integer", "minimum": 0, "maximum": MAX_KV_REVISION},
                           "revisions after this one (default 0)"),
                    _query("prefix", {"type": "string"}, "keys starting with this"),
                    _query("wait", {"type": "number", "minimum": 0,
                                    "maximum": MAX_KV_WAIT_S},
                           "seconds to wait for a change when there is none yet"),
                    _query("latest", {"type": "boolean"}, "only the keys' current values"),
                    _query("limit", {"type": "integer", "minimum": 1,
                                     "maximum": MAX_KV_PAGE}, "revisions read at most")],
            ok=_json(OBJECT, "entries, next (the revision to go on after), revision"),
            errors=(503,))},
    }


def document(server_url: str | None = None) -> dict[str, Any]:
    paths: dict[str, Any] = {
        "/health": {"get": _op("Liveness and storage readiness", tag="monitoring",
                               ok=_json(OBJECT, "serving"), public=True,
                               extra={"503": _json(OBJECT, "stopping, storage failed, "
                                                   "storage full or storage unavailable "
                                                   "(with the reason)")})},
        "/metrics": {"get": _op("Prometheus metrics (kitten_mq_* and minou_*); per-queue "
                                "and per-group series for the first metrics_max_queues "
                                "of each by name", tag="monitoring", ok=TEXT)},
        "/statistics": {"get": _op("Same as /metrics", tag="monitoring", ok=TEXT)},
        "/v1/messages/{endpoint}/{version}/{id}": {"post": _op(
            "Publish a message (durable when this returns)", tag="messages",
            params=[*MESSAGE_PARAMS,
                    _query("payload", {"type": "string"}, "a string payload instead of a body"),
                    _query("priority", _PRIORITY,
                           f"{MIN_PRIORITY}..{MAX_PRIORITY}, higher first"),
                    _query("ttl", _SECONDS, "seconds to live"),
                    _query("delay", _SECONDS, "seconds before delivery"),
                    _query("dedup", {"type": "string"}, "drop repeats of this key"),
                    _query("key", {"type": "string"}, "a message key")],
            body={"required": True, "description": "the message (any JSON value); ignored "
                  "when ?payload= is given", "content": {"application/json": {"schema": {}}}},
            ok=_json(_ref("Published"), "stored"), ok_status="201",
            errors=(404, 413, 422, 429, 503, 507))},
        "/v1/messages": {"post": _op(
            "Publish many messages in one request (each durable when this returns)",
            tag="messages",
            body={"required": True, "content": {"application/json": {"schema": {
                "type": "array", "minItems": 1, "maxItems": MAX_BATCH_HTTP,
                "items": _ref("Message")}}}},
            ok=_json({"type": "object", "required": ["results"], "properties": {"results": {
                "type": "array", "items": {"type": "object"}}}},
                "one result per message, in order: a receipt or an error"),
            errors=(503, 507))},
        "/v1/messages/{message_id}/receipt": {"get": _op(
            "What happened to a message: stored, delivered, acked, dead-lettered (and why)",
            tag="messages", params=[_path("message_id", {"type": "string"})],
            ok=_json(_ref("Receipt"), "the message's state"), errors=(404,))},
        "/v1/consume/{endpoint}/{version}/{id}": {"post": _op(
            "Take the next message as a competing consumer (long-poll)", tag="messages",
            params=[*MESSAGE_PARAMS,
                    _query("group", _GROUP, "consumer group (default: pattern)"),
                    _query("wait", {"type": "number", "minimum": 0,
                                    "maximum": MAX_HTTP_WAIT_S},
                           "seconds to wait for a message"),
                    _query("lease", {"type": "number", "minimum": 0, "maximum": MAX_LEASE_S},
                           "seconds before an unsettled message comes back")],
            ok=_json(_ref("Delivery"), "a message and its receipt"),
            extra={"204": {"description": "nothing arrived within wait"}}, errors=(503,))},
        "/v1/request/{endpoint}/{version}/{id}": {"post": _op(
            "Send a request and wait for its reply (request/reply: a consumer serving the "
            "channel answers; docs/requests.md)", tag="messages",
            params=[*MESSAGE_PARAMS,
                    _query("timeout", {"type": "number", "exclusiveMinimum": 0,
                                       "maximum": MAX_REQUEST_TIMEOUT_S},
                           f"seconds to wait for the reply (default "
                           f"{DEFAULT_REQUEST_TIMEOUT_S:g}); the request expires unserved "
                           "after that long"),
                    _query("payload", {"type": "string"}, "a string payload instead of a body")],
            body={"required": True, "description": "the request (any JSON value); "
                  "x-minou-header-<name> request headers travel with it",
                  "content": {"application/json": {"schema": {}}}},
            ok={"description": "the reply's body, as the responder returned it "
                "(x-minou-correlation-id and x-minou-reply-id headers)",
                "content": {"application/json": {"schema": {}},
                            "application/octet-stream": {"schema": {"type": "string",
                                                                    "format": "binary"}}}},
            errors=(413, 422, 429, 502, 503, 504, 507))},
        "/v1/ack/{receipt}": {"post": _op(
            "Acknowledge a delivered message", tag="messages",
            params=[_path("receipt", {"type": "string"})],
            ok=_json(_ref("Settled"), "settled (durable)"), errors=(404, 507))},
        "/v1/nack/{receipt}": {"post": _op(
            "Return a delivered message", tag="messages",
            params=[_path("receipt", {"type": "string"}),
                    _query("delay", _SECONDS, "seconds before retry"),
                    _query("front", {"type": "boolean"}, "retry first (default) or last")],
            ok=_json(_ref("Settled"), "settled (durable)"), errors=(404, 507))},
        "/v1/whoami": {"get": _op("The caller's identity and rights", tag="messages",
                                  ok=_json(OBJECT, "identity"))},
        "/v1/status": {"get": _op("Broker status", tag="admin", ok=_json(OBJECT, "status"))},
        "/v1/cluster": {"get": _op(
            "The brokers sharing this broker's storage (several on one Redis): which is the "
            "primary, the standbys, the queues with their fencing epochs, recent takeovers",
            tag="admin", ok=_json(OBJECT, "cluster"))},
        "/v1/queues": {"get": _op("Queues (endpoint/version) and reader groups (with the "
                                  "queues spread over brokers: every broker's, merged)",
                                  tag="admin",
                                  ok=_json(OBJECT, "queues"))},
        "/v1/rates/history": {"get": _op(
            f"The last {RATE_HISTORY_S // 60} minutes of publish, deliver and ack rates, "
            "one sample a second",
            tag="admin",
            params=[_query("queue", {"type": "string"},
                           "endpoint/version (default: the whole broker)")],
            ok=_json(_ref("RateHistory"), "rates per second, oldest first"))},
        "/v1/queues/{endpoint}/{version}": {"get": _op(
            "Inspect a queue: depth, waiting, in flight, oldest ages, consumers, rates",
            tag="admin",
            params=[*QUEUE_PARAMS, _query("channel", {"type": "string"}, "one channel id"),
                    _query("group", {"type": "string"},
                           "waiting, in flight and oldest ages for this group")],
            ok=_json(_ref("Queue"), "the queue"))},
        "/v1/queues/{endpoint}/{version}/{id}/messages": {"get": _op(
            "Browse a channel's stored messages", tag="admin",
            params=[*MESSAGE_PARAMS,
                    _query("from_seq", {"type": "integer", "minimum": 0,
                                        "maximum": MAX_FROM_SEQ}, "first seq"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_BROWSE},
                           f"at most this many (default {DEFAULT_BROWSE})")],
            ok=_json(OBJECT, "a page of messages"))},
        "/v1/queues/{endpoint}/{version}/{id}/messages/{seq}": {"delete": _op(
            "Delete one stored message (a dead letter: /v1/queues/_dead/...)", tag="admin",
            params=[*MESSAGE_PARAMS, _path("seq", {"type": "integer", "minimum": 1,
                                                   "maximum": MAX_FROM_SEQ})],
            ok=_json(OBJECT, "the seqs deleted (empty: it was not there)"))},
        "/v1/queues/{endpoint}/{version}/purge": {"post": _op(
            "Remove every message of a queue (or one channel)", tag="admin",
            params=[*QUEUE_PARAMS, _query("channel", {"type": "string"}, "one channel id")],
            ok=_json(OBJECT, "messages removed per channel"))},
        "/v1/dead/{endpoint}/{version}/requeue": {"post": _op(
            "Move dead letters back to their channels", tag="admin",
            params=[*QUEUE_PARAMS, _query("channel", {"type": "string"}, "one channel id"),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_REQUEUE},
                           "at most this many per channel"),
                    _query("seqs", {"type": "string",
                                    "pattern": f"^{_SEQ}(,{_SEQ}){{0,{MAX_DELETE - 1}}}$"},
                           f"only these dead letters (at most {MAX_DELETE} seqs) of the "
                           "channel given, or of each channel")],
            ok=_json(OBJECT, "messages requeued per channel"))},
        "/v1/dead/{endpoint}/{version}/purge": {"post": _op(
            "Remove dead letters", tag="admin",
            params=[*QUEUE_PARAMS, _query("channel", {"type": "string"}, "one channel id")],
            ok=_json(OBJECT, "messages removed per channel"))},
        "/v1/groups/{group}": {"delete": _op(
            "Delete a reader group (a durable listener that will not come back)", tag="admin",
            params=[_path("group", _GROUP, "e.g. consume:billing"),
                    _query("force", {"type": "boolean"}, "even with connected members")],
            ok=_json(OBJECT, "deleted"))},
        "/v1/reservations/{channel}/release": {"post": _op(
            "Release a reserved (!) channel for its next reader", tag="admin",
            params=[_path("channel", {"type": "string"}, "the reserved channel")],
            ok=_json(OBJECT, "released"))},
        "/v1/clients": {"get": _op(
            "Registered and pending clients, sorted by id, a page at a time (after=next "
            "while more), with rules and reservations", tag="admin",
            params=_paging("client ids"),
            ok=_json(OBJECT, "clients, more (another page), next, total"))},
        "/v1/admin/reload": {"post": _op("Re-read the config file", tag="admin",
                                         ok=_json(OBJECT, "what changed"))},
        "/v1/admin/soft-stop": {"post": _op(
            "Stop accepting, let deliveries settle, exit", tag="admin",
            ok=_json(OBJECT, "stopping"), errors=(503,))},
    }
    paths["/v1/federation"] = {"get": _op(
        "The federation links ([[federation]]): each direction's state, last error, "
        "messages carried, lag (docs/federation.md)", tag="admin",
        ok=_json(OBJECT, "links"))}
    paths["/status/federation/{link}"] = {"get": _op(
        "Nagios plugin output for a federation link: critical while a direction is not "
        "carrying, warning past ?minutes= of lag (X-Nagios-Exit header: 0..3)",
        tag="monitoring",
        params=[_path("link", {"type": "string"}, "the link's name"),
                _query("minutes", {"type": "number", "minimum": 0,
                                   "maximum": _NAGIOS_MAX_MINUTES},
                       "warn when a direction lags more than this (default 10)")],
        ok={"description": "OK/WARNING/CRITICAL/UNKNOWN line with perfdata",
            "content": {"text/plain": {"schema": {"type": "string"}}}})}
    for suffix, params in (("{endpoint}/{version}", QUEUE_PARAMS),
                           ("{endpoint}/{version}/{id}", MESSAGE_PARAMS)):
        paths[f"/status/nagios/{suffix}"] = {"get": _op(
            "Nagios plugin output for a queue or channel (X-Nagios-Exit header: 0..3)",
            tag="monitoring",
            params=[*params,
                    _query("minutes", {"type": "number", "minimum": 0,
                                       "maximum": _NAGIOS_MAX_MINUTES},
                           "warn when the oldest message not yet settled (waiting or "
                           "in flight) is older (default 10)"),
                    _query("group", {"type": "string"}, "one reader group only")],
            ok={"description": "OK/WARNING/CRITICAL/UNKNOWN line with perfdata",
                "content": {"text/plain": {"schema": {"type": "string"}}}})}
        paths[f"/status/queues/{suffix}"] = {"get": _op(
            "A queue's (or channel's) state as JSON", tag="monitoring",
            params=[*params, _query("group", {"type": "string"},
                                    "waiting, in flight and oldest ages for this group")],
            ok=_json(_ref("Queue"), "the queue"))}
    for action, summary in (("approve", "Approve a pending client"),
                            ("revoke", "Revoke a client"),
                            ("forget", "Remove a client's record")):
        paths[f"/v1/clients/{{client_id}}/{action}"] = {"post": _op(
            summary, tag="admin", params=[_path("client_id", {"type": "string"})],
            ok=_json(OBJECT, "the client record"))}
    paths["/v1/clients/{client_id}/rotate"] = {"post": _op(
        "Give a client a new public key", tag="admin",
        params=[_path("client_id", {"type": "string"})],
        body={"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["public_key"],
            "properties": {"public_key": {"type": "string"}}}}}},
        ok=_json(OBJECT, "the client record"))}
    ttl = {"type": "number", "minimum": MIN_CREDENTIAL_TTL_S, "maximum": MAX_CREDENTIAL_TTL_S,
           "description": f"seconds it lives (default {DEFAULT_CREDENTIAL_TTL_S:g})"}
    credential_id = [_path("id", {"type": "string"})]
    paths["/v1/credentials"] = {
        "post": _op(
            "Issue a delegated credential for the caller (key-authenticated only): the "
            "same client id and rules, no admin rights, for tasks that must not hold the "
            "key (Spark executors). The secret is in the answer only", tag="credentials",
            body={"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "properties": {
                    "ttl": ttl,
                    "purpose": {"type": "string", "maxLength": MAX_PURPOSE_CHARS}}}}}},
            ok=_json(OBJECT, "id, expires_at and credential (the secret)")),
        "get": _op("The caller's live credentials (an admin's: everyone's), without "
                   "secrets, sorted by id, a page at a time (after=next while more)",
                   tag="credentials", params=_paging("credential ids"),
                   ok=_json(OBJECT, "credentials, more (another page), next, total"))}
    paths["/v1/credentials/{id}/renew"] = {"post": _op(
        "Extend a live credential to now + ttl", tag="credentials", params=credential_id,
        body={"required": False, "content": {"application/json": {"schema": {
            "type": "object", "additionalProperties": False,
            "properties": {"ttl": ttl}}}}},
        ok=_json(OBJECT, "the credential, without its secret"))}
    paths["/v1/credentials/{id}"] = {"delete": _op(
        "Revoke a credential and close the connections that presented it",
        tag="credentials", params=credential_id, ok=_json(OBJECT, "what was revoked"))}
    paths.update(_kv_paths())
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "minou", "version": __version__,
                 "description": "The HTTP API of a minou broker. Messages: any client with "
                                "a token, under its rules. Admin and monitoring routes: admin "
                                "identities. Also: the native frames over WebSocket at /v1/ws "
                                "and a JSON stream at /v1/stream."},
        "components": {"schemas": SCHEMAS, "securitySchemes": {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "a JWT signed with the client's key (minou token), a delegated "
                           "credential (mdc1...), or the broker token"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    }
    if server_url:
        doc["servers"] = [{"url": server_url}]
    return doc
