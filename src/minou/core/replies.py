"""Request/reply: who may ask, who may answer, and whether anyone serves. No I/O.

A request is a publish whose headers name a reply inbox (``x-reply-to``) and a
correlation id. The broker checks three things the clients cannot be trusted with:

* the inbox is one of the requester's own, so nobody directs replies into another's;
* someone serves the channel (a group with a connected member reads it), else the
  request is refused at once with ``NO_RESPONDERS`` and nothing is stored;
* a reply written into another client's inbox answers a request its writer was handed:
  every delivery of a request carries ``x-reply-token``, a MAC of (inbox, correlation
  id, request id) under the brokers' secret, and a reply must bring it back with
  ``x-request-id``. Any broker sharing the secret can check it (queues spread over
  brokers: the reply may be stored by another broker than the one that delivered the
  request), and no lease lookup is needed (HTTP consumers can answer too). The reply
  is stored under the dedup key ``reply:<request id>``: a request delivered again
  after its reply was stored is marked ``x-replied``, so a handler that opted in does
  not run twice within the dedup window.

Reading inboxes is checked with every other read (``rights.inbox_refusal``).
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

from ..errors import BadRequest, NoResponders, NotAuthorized
from ..names import (
    CORRELATION_ID,
    REPLIED,
    REPLY_TO,
    REPLY_TOKEN,
    REQUEST_ID,
    inbox_of,
    inbox_owner,
    is_inbox,
    match_keys,
    reply_dedup_key,
    validate_channel,
)
from ..protocol.frames import Send
from .log import Msg
from .state import BrokerState


def has_responders(state: BrokerState, channel: str) -> bool:
    """Whether a connected consumer or listener reads ``channel`` now."""
    return any(group.members for group in state.patterns.groups_of(match_keys(channel)))


def reply_token(secret: bytes, inbox: str, correlation: str, request_id: str) -> str:
    """The right to reply to request ``request_id``: handed out with its delivery."""
    text = f"{inbox}\0{correlation}\0{request_id}".encode()
    return hmac.new(secret, text, hashlib.sha256).hexdigest()[:32]


def check_request(state: BrokerState, send: Send, client_id: str) -> None:
    """Raise unless ``send`` (headers naming ``x-reply-to``) is a request ``client_id``
    may make and some connected reader serves. (No detail fields: a publish answers
    with its outcome's code and text only.)"""
    headers = send.headers or {}
    target = send.channel
    if target.endswith("*"):
        raise BadRequest(f"a request goes to one channel, not to the pattern {target!r}")
    if is_inbox(target):
        raise BadRequest(f"a request cannot go to an inbox ({target!r})")
    reply_to = headers[REPLY_TO]
    if inbox_owner(reply_to) != client_id:
        raise NotAuthorized(
            f"a request's {REPLY_TO} must be an inbox of the requester's own "
            f"({inbox_of(client_id)}!<instance>), not {reply_to[:255]!r}")
    validate_channel(reply_to)
    if reply_to not in state.channels and (state.hosts is None or state.hosts(reply_to)):
        # Its reply would make the inbox: past the requester's share it is refused to
        # the requester now, not to the responder later.
        state.check_new_inboxes((reply_to,))
    if not headers.get(CORRELATION_ID):
        raise BadRequest(f"a request needs a {CORRELATION_ID} header")
    if not has_responders(state, target):
        raise NoResponders(f"no consumer or listener is connected to {target!r}: nobody "
                           "would answer the request (nothing was stored)")


def check_reply(state: BrokerState, send: Send, client_id: str | None) -> Send:
    """``send`` goes to an inbox: return what to store, or raise NotAuthorized. A
    client may write its own inboxes; another's only with the reply token of a request
    it was handed (which is not stored)."""
    target = send.channel
    if client_id is not None and inbox_owner(target) == client_id:
        return send
    headers = send.headers or {}
    token, request_id = headers.get(REPLY_TOKEN, ""), headers.get(REQUEST_ID, "")
    expected = reply_token(state.reply_secret, target, headers.get(CORRELATION_ID, ""),
                           request_id)
    if not request_id or not hmac.compare_digest(token, expected):
        raise NotAuthorized(
            f"{target!r} is another client's inbox: only a reply to a request delivered to "
            f"you may go there ({REQUEST_ID}, {CORRELATION_ID} and {REPLY_TOKEN} as the "
            "request's delivery had them)")
    kept = {k: v for k, v in headers.items() if k != REPLY_TOKEN}
    return msgspec.structs.replace(send, headers=kept, dedup=reply_dedup_key(request_id))


def delivery_headers(state: BrokerState, msg: Msg, attempts: int, now: float
                     ) -> dict[str, str]:
    """A request's headers as delivered: with its reply token, and marked ``x-replied``
    when delivered again after its reply was stored (the handler ran and answered;
    only the ack was lost)."""
    headers = msg.headers
    assert headers is not None
    reply_to = headers[REPLY_TO]
    out = {**headers, REPLY_TOKEN: reply_token(
        state.reply_secret, reply_to, headers.get(CORRELATION_ID, ""), msg.id)}
    if attempts > 1 and state.dedup.get(reply_to, reply_dedup_key(msg.id), now) is not None:
        out[REPLIED] = "1"
    return out
