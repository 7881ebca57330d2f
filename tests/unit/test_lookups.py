"""The OFFSETS-at lookups one client may have being answered at once
(server/lookups.py), without a broker: counted per client over all its connections,
refused past the bound with the client and the limit, given back once whatever ends
a lookup."""

from __future__ import annotations

import pytest

from minou.auth.registry import Identity
from minou.errors import ErrorCode, TooManyConnections
from minou.server.lookups import ClientLookups


def test_a_client_has_only_so_many_lookups_and_another_is_not_refused_for_it() -> None:
    lookups = ClientLookups(per_client=2)
    greedy, other = Identity("greedy", False), Identity("other", False)
    held = [lookups.take(greedy), lookups.take(greedy)]
    with pytest.raises(TooManyConnections) as refused:
        lookups.take(greedy)
    exc = refused.value
    assert exc.code == ErrorCode.TOO_MANY_CONNECTIONS
    assert exc.detail == {"limit": 2, "client": "greedy"}
    assert "client 'greedy' has 2 OFFSETS requests with at being answered" in exc.message
    assert "max_offsets_at_per_client" in exc.message
    assert len(lookups) == 2  # the refused one took nothing
    lookups.take(other)()  # another client is not refused for it
    held.pop()()
    lookups.take(greedy)  # one given back: one more
    assert len(lookups) == 2


def test_a_slot_is_given_back_once_however_often_its_end_is_reported() -> None:
    """An answer and a cancellation of the same lookup both give back: the second
    must not free another lookup's slot."""
    lookups = ClientLookups(per_client=2)
    me = Identity("me", False)
    first, second = lookups.take(me), lookups.take(me)
    first()
    first()
    assert lookups.clients == {"me": 1}
    second()
    assert lookups.clients == {}  # a client id seen once is not kept


def test_admins_and_the_broker_itself_are_not_bounded_here() -> None:
    lookups = ClientLookups(per_client=1)
    root = Identity("root", True)
    for _ in range(5):
        lookups.take(root)
        lookups.take(None)
    assert len(lookups) == 0
