"""Channel names and patterns: parse, validate, match.

A channel is ``endpoint/version/id``; its dead-letter channel is
``_dead/endpoint/version/id``. Patterns are a concrete channel,
``endpoint/version/*`` or ``endpoint/*`` (each optionally under ``_dead/``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from .errors import BadRequest, InvalidChannel
from .limits import MAX_CHANNEL_LENGTH, MAX_KEY_LENGTH

DEAD_PREFIX = "_dead/"
_ENDPOINT = re.compile(r"[A-Za-z0-9_-]+")
_VERSION = re.compile(r"v[1-9][0-9]{0,5}")
# An id is URL-encoded: unreserved characters and %XX escapes. "/" must be %2F.
_ID = re.compile(r"(?:[A-Za-z0-9._~!$&'()+,;=:@-]|%[0-9A-Fa-f]{2})+")


def _check_endpoint_version(endpoint: str, version: str, text: str) -> None:
    if not _ENDPOINT.fullmatch(endpoint):
        raise InvalidChannel(
            f"invalid channel {text!r}: endpoint {endpoint!r} must be letters, digits, '-' or '_'",
            channel=text,
        )
    if not _VERSION.fullmatch(version):
        raise InvalidChannel(
            f"invalid channel {text!r}: version {version!r} must look like v1, v2, ...",
            channel=text,
        )


def is_queue_name(queue: str) -> bool:
    """Whether ``queue`` is a valid ``endpoint/version`` (what a valid channel's queue
    is): a name that is not must never become Redis keys or a queue to claim."""
    endpoint, _, version = queue.partition("/")
    return bool(_ENDPOINT.fullmatch(endpoint) and _VERSION.fullmatch(version))


@lru_cache(maxsize=65536)
def validate_channel(name: str) -> str:
    """Return ``name`` if it is a valid concrete channel, else raise InvalidChannel."""
    if not isinstance(name, str) or not name:
        raise InvalidChannel("channel name is empty", channel=name)
    body = name[len(DEAD_PREFIX):] if name.startswith(DEAD_PREFIX) else name
    # The limit is on the channel itself, so every channel has a valid dead-letter twin.
    if len(body) > MAX_CHANNEL_LENGTH:
        raise InvalidChannel(
            f"channel name is {len(body)} characters, the limit is {MAX_CHANNEL_LENGTH}",
            channel=name[:64],
        )
    parts = body.split("/")
    if len(parts) != 3:
        raise InvalidChannel(
            f"invalid channel {name!r}: expected endpoint/version/id"
            + (" (a '/' inside the id must be written %2F)" if len(parts) > 3 else ""),
            channel=name,
        )
    endpoint, version, ident = parts
    _check_endpoint_version(endpoint, version, name)
    if ident == "*":
        raise InvalidChannel(
            f"{name!r} is a pattern, not a channel; send() to it to broadcast", channel=name
        )
    if not ident:
        raise InvalidChannel(
            f"invalid channel {name!r}: the id after {endpoint}/{version}/ is empty "
            f"(e.g. {endpoint}/{version}/42, or {endpoint}/{version}/* to broadcast)",
            channel=name,
        )
    if not _ID.fullmatch(ident):
        raise InvalidChannel(
            f"invalid channel {name!r}: id {ident!r} must be URL-encoded", channel=name
        )
    return name


def dead_letter_channel(channel: str) -> str:
    return channel if channel.startswith(DEAD_PREFIX) else DEAD_PREFIX + channel


def is_dead_letter(channel: str) -> bool:
    return channel.startswith(DEAD_PREFIX)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed pattern. ``prefix`` is what a matching channel starts with."""

    text: str
    prefix: str
    concrete: bool

    def matches(self, channel: str) -> bool:
        if self.concrete:
            return channel == self.text
        return channel.startswith(self.prefix)


@lru_cache(maxsize=4096)
def parse_pattern(text: str) -> Pattern:
    """Parse ``endpoint/version/id``, ``endpoint/version/*`` or ``endpoint/*``."""
    if not isinstance(text, str) or not text:
        raise InvalidChannel("pattern is empty", channel=text)
    dead = text.startswith(DEAD_PREFIX)
    body = text[len(DEAD_PREFIX):] if dead else text
    parts = body.split("/")
    if len(parts) == 2 and parts[1] == "*":
        _check_endpoint_version(parts[0], "v1", text)
        return Pattern(text, text[:-1], concrete=False)
    if len(parts) == 3 and parts[2] == "*":
        _check_endpoint_version(parts[0], parts[1], text)
        return Pattern(text, text[:-1], concrete=False)
    try:
        validate_channel(text)
    except InvalidChannel as exc:
        raise InvalidChannel(
            f"invalid pattern {text!r}: use endpoint/version/id, endpoint/version/* or "
            f"endpoint/* ({exc.message})",
            channel=text,
        ) from None
    return Pattern(text, text, concrete=True)


def match_keys(channel: str) -> list[str]:
    """The ``prefix`` of every pattern that matches ``channel``: its name, and its name
    cut after each "/". (A wildcard's prefix ends in "/", a concrete pattern's never
    does, so ``p.matches(channel)`` is ``p.prefix in match_keys(channel)``: patterns
    can be looked up by what a channel is, instead of each tried against it.)"""
    keys = [channel]
    cut = channel.find("/")
    while cut >= 0:
        keys.append(channel[:cut + 1])
        cut = channel.find("/", cut + 1)
    return keys


def broadcast_prefix(target: str) -> str | None:
    """For ``endpoint/version/*`` return the prefix of its channels, else None."""
    body = target[len(DEAD_PREFIX):] if target.startswith(DEAD_PREFIX) else target
    parts = body.split("/")
    if len(parts) == 3 and parts[2] == "*":
        _check_endpoint_version(parts[0], parts[1], target)
        return target[:-1]
    return None


def reservation_key(channel: str) -> str:
    """The channel whose reservation governs reading ``channel``: its dead letters
    (``_dead/X``) belong to whoever reserved ``X``."""
    return channel[len(DEAD_PREFIX):] if channel.startswith(DEAD_PREFIX) else channel


# Group keys. A consumer group's name is shared on purpose (``consume:<name>``, one
# client-supplied part, so unambiguous). A listener is durable per client and name:
# ``listen:<client>:<name>``, where the client id is escaped ("%" -> "%25", ":" -> "%3A")
# so that no (client, name) pair spells another pair's key. Ids without "%" or ":"
# (nearly all) keep the key older versions stored; see ``migrate_listen_key``.
LISTEN_PREFIX = "listen:"
LEGACY_LISTEN_PREFIX = "listen-legacy:"  # an old key no client can be told apart in


def check_label(kind: str, text: object, limit: int, *, slash: bool = True,
                space: bool = False) -> str:
    """Return ``text`` if it may name a thing a client makes the broker keep (a client,
    a group, a writer): 1..``limit`` printable characters, no control or invisible ones
    (NUL, line breaks, right-to-left marks: a name that prints like another's, or forges
    a line of a listing), no spaces unless ``space`` (Redis group names may hold them)
    and no "/" unless ``slash``."""
    if not isinstance(text, str) or not text:
        raise BadRequest(f"{kind} is empty: give 1..{limit} printable characters")
    if len(text) > limit:
        raise BadRequest(f"{kind} is {len(text)} characters, the limit is {limit}",
                         limit=limit)
    if not text.isprintable() or (not space and " " in text) or (not slash and "/" in text):
        bad = next(c for c in text if not c.isprintable() or (not space and c == " ")
                   or (not slash and c == "/"))
        what = {" ": "a space", "/": "a '/'"}.get(bad, f"U+{ord(bad):04X}")
        rule = ", ".join(x for x, allowed in (("spaces", space), ("/", slash)) if not allowed)
        raise BadRequest(f"{kind} {text[:64]!r} holds {what}: names are printable "
                         f"characters{f' without {rule}' if rule else ''}",
                         character=f"U+{ord(bad):04X}")
    return text


def escape_client(client_id: str) -> str:
    return client_id.replace("%", "%25").replace(":", "%3A")


def listen_group_key(client_id: str, name: str) -> str:
    return f"{LISTEN_PREFIX}{escape_client(client_id)}:{name}"


def consume_group_key(name: str) -> str:
    return f"consume:{name}"


def migrate_listen_key(key: str, registered: set[str], with_colon: list[str]) -> str:
    """The key an older version's listener ``key`` has now.

    Older versions stored ``listen:<client>:<name>`` unescaped, so for client ids with
    ":" one key could be two clients' (``a`` + ``b:n`` or ``a:b`` + ``n``). The
    registered ids that could have made it decide: exactly one is its owner; none: the
    part before the first ":" (what the old version gave that id too); several: nobody
    can be told to own it, so it gets a key no client can make (an admin may delete it).
    ``with_colon`` are the registered ids that contain ":".
    """
    if not key.startswith(LISTEN_PREFIX):
        return key
    rest = key[len(LISTEN_PREFIX):]
    first = rest.split(":", 1)[0]
    owners = [first] if first in registered else []
    owners += [c for c in with_colon if rest.startswith(c + ":")]
    if len(owners) > 1:
        return LEGACY_LISTEN_PREFIX + rest
    client = owners[0] if owners else first
    return listen_group_key(client, rest[len(client) + 1:])


def schema_key(channel: str) -> str:
    """``orders/v1/42`` -> ``orders/v1``: the pair that fixes one JSON format."""
    body = channel[len(DEAD_PREFIX):] if channel.startswith(DEAD_PREFIX) else channel
    endpoint, version, _ = body.split("/", 2)
    return f"{endpoint}/{version}"


# Request/reply (docs/requests.md). A client's replies arrive on an inbox channel,
# ``_inbox/v1/<client id, URL-encoded>!<instance>`` (one per client object, so processes
# sharing a client id never take each other's replies), which only that client may
# read; a request names it in REPLY_TO, and a reply may be written there only with the
# REPLY_TOKEN the request's delivery carried (the broker drops it when storing the
# reply). "!" splits unambiguously: quote() always escapes it in the client id.
INBOX_ENDPOINT = "_inbox"
_INBOX_PATH = INBOX_ENDPOINT + "/"
INBOX_PREFIX = "_inbox/v1/"
REPLY_TO = "x-reply-to"
CORRELATION_ID = "x-correlation-id"
REQUEST_ID = "x-request-id"  # on a reply: the message id of the request it answers
REPLY_TOKEN = "x-reply-token"  # on a request's delivery: the right to reply to it
REPLY_ERROR = "x-reply-error"  # a reply that carries the responder's error, not a result
REPLIED = "x-replied"  # on a redelivered request whose reply the broker already stored


def inbox_of(client_id: str, instance: str = "") -> str:
    """The inbox channel of ``client_id`` (one of its instances); InvalidChannel when
    the encoded name is too long."""
    tail = f"!{instance}" if instance else ""
    return validate_channel(INBOX_PREFIX + quote(client_id, safe="") + tail)


def inbox_owner(channel: str) -> str | None:
    """The client whose inbox ``channel`` (or its dead letters) is; None for a pattern
    or a channel that is no inbox."""
    body = channel[len(DEAD_PREFIX):] if channel.startswith(DEAD_PREFIX) else channel
    if not body.startswith(INBOX_PREFIX) or body.endswith("*"):
        return None
    return unquote(body[len(INBOX_PREFIX):].split("!", 1)[0])


def is_inbox(pattern: str) -> bool:
    """Whether ``pattern`` (a channel or a pattern, dead letters included) reads inboxes."""
    if pattern.startswith(_INBOX_PATH):
        return True
    return pattern.startswith(DEAD_PREFIX) and \
        pattern.startswith(_INBOX_PATH, len(DEAD_PREFIX))


def reply_dedup_key(request_id: str) -> str:
    """The dedup key a reply to message ``request_id`` is stored under in the inbox."""
    return f"reply:{request_id}"


# Key-value buckets (docs/kv.md). Bucket ``config`` is the channel ``_kv/v1/config``:
# a put is a message whose key is the KV key, its seq the revision; a delete is a
# message carrying KV_OP = "del" (a tombstone). A put or delete with KV_EXPECT is a
# compare-and-set: stored only if the key's revision is still that ("0": no value).
KV_ENDPOINT = "_kv"
KV_PREFIX = "_kv/v1/"
KV_OP = "x-kv-op"
KV_EXPECT = "x-kv-expect"
KV_DELETE = "del"
_BUCKET = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KV_KEY = re.compile(r"[A-Za-z0-9_=./:@-]+")


def kv_channel(bucket: str) -> str:
    """The channel of ``bucket``; InvalidChannel for a bad bucket name."""
    if not isinstance(bucket, str) or not _BUCKET.fullmatch(bucket):
        raise InvalidChannel(f"invalid bucket {str(bucket)[:80]!r}: 1 to 64 letters, digits, "
                             "'-' or '_'", channel=str(bucket)[:80])
    return KV_PREFIX + bucket


def is_kv(channel: str) -> bool:
    """Whether ``channel`` (or pattern) is a bucket's (dead letters are not)."""
    return channel.startswith(KV_PREFIX)


def kv_bucket(channel: str) -> str:
    return channel[len(KV_PREFIX):]


def validate_kv_key(key: object) -> str:
    """Return ``key`` if it may name a value: 1..MAX_KEY_LENGTH of letters, digits and
    ``_ = . / : @ -`` (so it is its own URL path segment and a prefix means one thing)."""
    if not isinstance(key, str) or not key:
        raise BadRequest("a KV key is a non-empty string")
    if len(key) > MAX_KEY_LENGTH:
        raise BadRequest(f"KV key is {len(key)} characters, the limit is {MAX_KEY_LENGTH}",
                         limit=MAX_KEY_LENGTH)
    if not _KV_KEY.fullmatch(key) or key.startswith("/") or "//" in key:
        raise BadRequest(f"invalid KV key {key[:80]!r}: use letters, digits and _ = . / : @ - "
                         "(no leading '/', no '//')")
    return key


# Federation (docs/federation.md): the broker a message was first published on, kept
# over every hop (a link never sends a message to where it began), and where a copy
# came from (the source channel and seq). From its second hop on, a message also names
# every broker it was on (a JSON list, its origin first): a link never sends it to one
# of them. The origin alone let a message of a third broker go round two brokers linked
# both ways for ever (a hub and its spokes).
FEDERATED_FROM = "x-federated-from"
FEDERATED_SEQ = "x-federated-seq"
FEDERATED_PATH = "x-federated-path"
