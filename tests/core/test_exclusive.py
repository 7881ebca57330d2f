"""Exclusive subscriptions (a peer channel's role, docs/peers.md): one channel by name
in a consumer group; the first client reserves the channel, one connection at a time
holds the group."""

from __future__ import annotations

import pytest

from minou.core.broker import Session
from minou.errors import BadRequest, NotAuthorized

from .helpers import Harness

CH = "chat/v1/room-1!b"


def take(h: Harness, session: Session, sid: int = 1, **kw: object) -> object:
    return h.subscribe(session, sid, patterns=kw.pop("patterns", CH), group="peer-a",
                       start="oldest", exclusive=True, **kw)


@pytest.mark.parametrize(("kw", "text"), [
    ({"kind": "listen"}, "an exclusive subscription consumes one channel, by name"),
    ({"patterns": "chat/v1/*"}, "an exclusive subscription consumes one channel, by name"),
    ({"patterns": [CH, "chat/v1/other"]},
     "an exclusive subscription consumes one channel, by name"),
])
def test_an_exclusive_subscription_consumes_one_channel_by_name(kw: dict[str, object],
                                                                text: str) -> None:
    h = Harness()
    with pytest.raises(BadRequest, match=f"^{text}$"):
        take(h, Session("alice"), **kw)
    assert h.broker.reservations == {}


def test_the_first_client_reserves_the_channel_and_one_connection_holds_it() -> None:
    h = Harness()
    first, second, other = Session("alice"), Session("alice"), Session("mallory")
    sub = take(h, first)
    assert h.broker.reservations == {CH: "alice"}
    assert h.commit().reservations == {CH: "alice"}  # stored
    with pytest.raises(NotAuthorized, match="reserved by client 'alice'"):
        take(h, other)
    with pytest.raises(NotAuthorized, match="reserved by client 'alice'"):
        h.subscribe(other, patterns=CH, group="sneak")  # any read of it
    with pytest.raises(NotAuthorized) as held:
        take(h, second)
    assert held.value.message == ("group 'peer-a' is exclusive and held by another "
                                  "connection (client 'alice'); it is free once that one "
                                  "is gone")
    assert held.value.detail == {"group": "consume:peer-a", "client": "alice"}
    take(h, first, 2)  # the holder's own connection may subscribe again
    h.engine.unsubscribe(first, 1)
    h.engine.unsubscribe(first, 2)
    take(h, second)  # free once that connection left
    assert sub.group.members[0].session is second


def test_admins_take_a_role_but_reserve_nothing() -> None:
    h = Harness()
    take(h, Session("admin", admin=True))
    assert h.broker.reservations == {}
