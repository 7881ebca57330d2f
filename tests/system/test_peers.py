"""Peer channels (issue 21, item 2) against a real broker: two roles of one
conversation, each side's messages durable and in order for the other, across the
other side's absence, its reconnects and a kill -9 of the broker; one client per role."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import minou
from minou.errors import NotAuthorized

CHANNEL = "chat/v1/room-1"


def run(coro: Any, timeout: float = 90) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def take(peer: Any, n: int) -> list[Any]:
    return [(await peer.get(timeout=10)).payload for _ in range(n)]


def test_two_sides_talk_in_order_even_before_the_other_came(broker):
    async def scenario() -> None:
        alice = await broker.connect("alice")
        a = await alice.peer(CHANNEL, role="a")
        for n in range(50):  # b has never connected: these wait for it
            await a.send({"n": n})
        bob = await broker.connect("bob")
        b = await bob.peer(CHANNEL, role="b")
        assert await take(b, 50) == [{"n": n} for n in range(50)]
        await asyncio.gather(*(b.send(f"re {n}") for n in range(3)))
        got = []
        async for msg in a:
            got.append(msg.payload)
            if len(got) == 3:
                break
        assert sorted(got) == ["re 0", "re 1", "re 2"]
        assert (a.sending, a.reading) == (CHANNEL + "!a", CHANNEL + "!b")
        await a.close()
        await b.close()
        await alice.close()
        await bob.close()

    run(scenario())


def test_a_role_belongs_to_one_client_and_one_connection(broker):
    async def scenario() -> None:
        alice, alice2, mallory = (await broker.connect("alice"), await broker.connect("alice"),
                                  await broker.connect("mallory"))
        try:
            a = await alice.peer(CHANNEL, role="a")
            with pytest.raises(NotAuthorized, match="reserved by client 'alice'"):
                await mallory.peer(CHANNEL, role="a")
            with pytest.raises(NotAuthorized, match="reserved by client 'alice'"):
                await mallory.listen(CHANNEL + "!b")  # nor reads it any other way
            with pytest.raises(NotAuthorized, match="held by another connection"):
                await alice2.peer(CHANNEL, role="a")
            await a.close()
            a2 = await alice2.peer(CHANNEL, role="a")  # the same client, once free
            # The other role is free for anyone, once.
            await (await mallory.peer(CHANNEL, role="b")).send("hi")
            assert (await a2.get(timeout=5)).payload == "hi"
            with pytest.raises(ValueError, match="role must be 'a' or 'b'"):
                await alice.peer(CHANNEL, role="c")
        finally:
            for c in (alice, alice2, mallory):
                await c.close()

    run(scenario())


def test_what_a_side_did_not_finish_comes_again_to_it(broker):
    async def scenario() -> None:
        alice, bob = await broker.connect("alice"), await broker.connect("bob")
        a = await alice.peer(CHANNEL, role="a")
        for n in range(3):
            await a.send(n)
        b = await bob.peer(CHANNEL, role="b")
        assert (await b.get(timeout=5)).payload == 0
        assert (await b.get(timeout=5)).payload == 1  # acks 0; 1 is being handled...
        await bob.close()  # ...when bob goes away
        bob = await broker.connect("bob")
        b = await bob.peer(CHANNEL, role="b")
        assert await take(b, 2) == [1, 2]
        await alice.close()
        await bob.close()

    run(scenario())


def test_both_sides_ride_through_a_broker_killed_mid_conversation(broker):
    total = 300

    async def scenario() -> tuple[list[int], list[int]]:
        alice = await broker.connect("alice", reconnect=True, request_timeout=10)
        bob = await broker.connect("bob", reconnect=True, request_timeout=10)
        a = await alice.peer(CHANNEL, role="a")
        b = await bob.peer(CHANNEL, role="b")
        sent: list[int] = []
        seen: list[int] = []

        async def talk() -> None:
            for n in range(total):
                while True:
                    try:
                        await a.send(n)
                        break
                    except minou.MinouError:  # not confirmed across the kill: again
                        await asyncio.sleep(0.1)
                sent.append(n)

        async def listen() -> None:
            while len(set(seen)) < total:
                try:
                    seen.append((await b.get(timeout=15)).payload)
                except minou.MinouError:
                    continue

        talking, listening = asyncio.create_task(talk()), asyncio.create_task(listen())
        while len(sent) < total // 3:
            await asyncio.sleep(0.01)
        broker.kill()
        await asyncio.to_thread(broker.start)
        await asyncio.wait_for(asyncio.gather(talking, listening), 60)
        await alice.close()
        await bob.close()
        return sent, seen

    sent, seen = run(scenario(), 120)
    assert sent == list(range(total))
    assert set(seen) == set(range(total))  # nothing lost
    # In order: a message comes again only after a crash, and then in order again.
    firsts = list(dict.fromkeys(seen))
    assert firsts == sorted(firsts)


def test_sync_peer(broker):
    with broker.connect_sync("alice") as alice, broker.connect_sync("bob") as bob:
        a = alice.peer(CHANNEL, role="a")
        b = bob.peer(CHANNEL, role="b")
        a.send({"q": 1})
        assert b.get(timeout=5).payload == {"q": 1}
        b.send({"r": 1})
        assert a.get(timeout=5).payload == {"r": 1}
        a.close()
        b.close()
