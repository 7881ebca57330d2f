"""Request/reply: who may ask, who may answer, and whether anyone serves. No I/O.

A request is a publish whose headers name a reply inbox (``x-reply-to``) and a
correlation id. The broker checks three things the clients cannot be trusted with:

* the inbox is one of the requester's own, so nobody directs replies into another's;
* someone serves the channel (a group with a connected member reads it), else the
  request is refused at once with ``NO_RESPONDERS`` and nothing is stored;
* a reply written into another client's inbox answers a request the replying
  connection holds right now (``x-reply-tag`` names that delivery), carries the same
  correlation id, and is stored under the dedup key ``reply:<request id>``: a request
  redelivered after its reply was stored is marked ``x-replied``, so a handler that
  opted in does not run twice within the dedup window.

Reading inboxes is checked with every other read (``rights.inbox_refusal``).
"""

from __future__ import annotations

import msgspec

from ..errors import BadRequest, NoResponders, NotAuthorized
from ..names import (
    CORRELATION_ID,
    REPLIED,
    REPLY_TAG,
    REPLY_TO,
    inbox_of,
    inbox_owner,
    is_inbox,
    reply_dedup_key,
    validate_channel,
)
from ..protocol.frames import Send
from .log import Msg
from .session import Session
from .state import BrokerState


def has_responders(state: BrokerState, channel: str) -> bool:
    """Whether a connected consumer or listener reads ``channel`` now."""
    return any(group.members and group.matches(channel) for group in state.groups.values())


def check_request(state: BrokerState, send: Send, client_id: str) -> None:
    """Raise unless ``send`` (headers naming ``x-reply-to``) is a request ``client_id``
    may make and some connected reader serves."""
    headers = send.headers or {}
    target = send.channel
    if target.endswith("*"):
        raise BadRequest(f"a request goes to one channel, not to the pattern {target!r}",
                         channel=target)
    if is_inbox(target):
        raise BadRequest(f"a request cannot go to an inbox ({target!r})", channel=target)
    reply_to = headers[REPLY_TO]
    if inbox_owner(reply_to) != client_id:
        raise NotAuthorized(
            f"a request's {REPLY_TO} must be an inbox of the requester's own "
            f"({inbox_of(client_id)}!<instance>), not {reply_to[:255]!r}", channel=target)
    validate_channel(reply_to)
    if not headers.get(CORRELATION_ID):
        raise BadRequest(f"a request needs a {CORRELATION_ID} header", channel=target)
    if not has_responders(state, target):
        raise NoResponders(f"no consumer or listener is connected to {target!r}: nobody "
                           "would answer the request (nothing was stored)", channel=target)


def check_reply(send: Send, session: Session | None) -> Send:
    """``send`` goes to an inbox: return what to store, or raise NotAuthorized. A
    client may write its own inbox; another's only as the reply to a request its
    connection holds (the tag in ``x-reply-tag``, which is not stored)."""
    target = send.channel
    if session is not None and inbox_owner(target) == session.client_id:
        return send
    headers = send.headers or {}
    tag = headers.get(REPLY_TAG, "")
    lease = session.leases.get(int(tag)) if session is not None and tag.isdigit() else None
    asked = lease.msg.headers if lease is not None else None
    if not asked or asked.get(REPLY_TO) != target or \
            asked.get(CORRELATION_ID) != headers.get(CORRELATION_ID):
        raise NotAuthorized(
            f"{target!r} is another client's inbox: only a reply to a request this "
            f"connection holds may go there ({REPLY_TAG}: its delivery tag, "
            f"{CORRELATION_ID}: the request's)", channel=target)
    kept = {k: v for k, v in headers.items() if k != REPLY_TAG}
    return msgspec.structs.replace(send, headers=kept or None,
                                   dedup=reply_dedup_key(lease.msg.id))  # type: ignore[union-attr]


def redelivery_headers(state: BrokerState, msg: Msg, now: float) -> dict[str, str] | None:
    """A request delivered again: its headers, marked ``x-replied`` when its reply is
    in the dedup window already (the handler ran and answered; only the ack was lost)."""
    headers = msg.headers
    if headers and REPLY_TO in headers and \
            state.dedup.get(headers[REPLY_TO], reply_dedup_key(msg.id), now) is not None:
        return {**headers, REPLIED: "1"}
    return headers
