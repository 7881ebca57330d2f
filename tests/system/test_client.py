"""The Python client against a real broker: the API a user writes against."""

from __future__ import annotations

import asyncio
import time

import pytest

import minou
from minou.errors import (
    BadRequest,
    ConnectionClosed,
    InvalidChannel,
    SendQueueFull,
    UnknownDelivery,
)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_callback_handler_and_async_for(broker):
    async def main():
        client = await broker.connect("cb")
        got: list[int] = []
        done = asyncio.Event()

        async def handle(msg: minou.Message) -> None:
            got.append(msg.payload["n"])
            await msg.ack()
            if len(got) == 5:
                done.set()

        await client.consume("cb/v1/*", handle, group="g1")
        other = await client.consume("cb/v1/*", group="g2")
        receipts = await client.send_many([("cb/v1/a", {"n": i}) for i in range(5)])
        assert [r.seq for r in receipts] == [1, 2, 3, 4, 5]
        await asyncio.wait_for(done.wait(), 10)
        assert got == [0, 1, 2, 3, 4]

        seen = []
        async for msg in other:
            seen.append(msg.seq)
            msg.ack()
            if len(seen) == 5:
                break
        assert seen == [1, 2, 3, 4, 5]  # a second group sees every message too
        await client.close()

    run(main())


def test_listen_is_fan_out_and_durable_per_client(broker):
    async def main():
        a = await broker.connect("listener-a")
        b = await broker.connect("listener-b")
        sub_a = await a.listen("news/v1/*")
        sub_b = await b.listen("news/v1/*")
        pub = await broker.connect("pub")
        await pub.send("news/v1/1", "first")
        for sub in (sub_a, sub_b):
            msg = await sub.get(5)
            assert msg.payload == "first"
            await msg.ack()
        await a.close()  # a goes away; its durable listener keeps collecting
        await pub.send("news/v1/1", "while away")
        (await sub_b.get(5)).ack()
        a2 = await broker.connect("listener-a")
        again = await a2.listen("news/v1/*")
        msg = await again.get(5)
        assert msg.payload == "while away" and msg.seq == 2
        await msg.ack()
        for c in (a2, b, pub):
            await c.close()

    run(main())


def test_replay_from_seq_and_range_read(broker_factory, tmp_path):
    config = tmp_path / "minou.toml"
    config.write_text('[channels."log/v1"]\nretention = 3600\n')
    broker = broker_factory.make(config=config).start()

    async def main():
        c = await broker.connect()
        await c.send_many([("log/v1/x", i) for i in range(10)])
        replay = await c.listen("log/v1/x", start=7, prefetch=10)
        got = [(await replay.get(5)).payload for _ in range(4)]
        assert got == [6, 7, 8, 9]
        oldest = await c.listen("log/v1/x", name="from-start", start="oldest", prefetch=20)
        assert (await oldest.get(5)).seq == 1
        msgs, next_seq = await c.read("log/v1/x", 3, limit=4)
        assert [m.seq for m in msgs] == [3, 4, 5, 6] and next_seq == 7
        msgs, next_seq = await c.read("log/v1/x", next_seq, limit=100)
        assert [m.payload for m in msgs] == [6, 7, 8, 9] and next_seq == 11
        await c.close()

    run(main())


def test_settled_messages_go_once_their_retention_passed_and_not_before(broker_factory,
                                                                       tmp_path):
    """Retention keeps settled messages for replay, then they go: a channel looked at
    while its settled messages were too young is looked at again when the oldest can
    go (it was looked up in storage every second), and then they do go."""
    config = tmp_path / "minou.toml"
    config.write_text('[channels."log/v1"]\nretention = 2\n')
    broker = broker_factory.make(config=config).start()

    async def stored(c, channel: str) -> list[int]:
        msgs, _ = await c.read(channel, 1, limit=100)
        return [m.payload for m in msgs]

    async def gone(c, channel: str, timeout: float = 20.0) -> None:
        began = time.monotonic()
        while await stored(c, channel):
            assert time.monotonic() - began < timeout, await stored(c, channel)
            await asyncio.sleep(0.1)

    async def main():
        c = await broker.connect()
        sub = await c.consume("log/v1/*", group="g", prefetch=10)
        before = time.monotonic()  # published after this: kept until 2 s after it
        await c.send_many([("log/v1/a", i) for i in range(3)])
        for _ in range(3):
            await (await sub.get(5)).ack()
        assert await stored(c, "log/v1/a") == [0, 1, 2]  # settled, kept for replay
        await gone(c, "log/v1/a")  # looked at (too young) every second meanwhile
        assert time.monotonic() - before >= 2.0
        before = time.monotonic()
        await c.send("log/v1/a", 3)
        await (await sub.get(5)).ack()
        assert await stored(c, "log/v1/a") == [3]
        await gone(c, "log/v1/a")
        assert time.monotonic() - before >= 2.0  # its own two seconds, not the first ones'
        await c.close()

    run(main())


def test_broadcast_reaches_every_id_with_a_reader(broker):
    async def main():
        c = await broker.connect()
        subs = {i: await c.listen(f"alerts/v1/{i}", name=i) for i in ("eu", "us")}
        receipt = await c.send("alerts/v1/*", {"level": "high"})
        assert receipt.fanout == 2
        for sub in subs.values():
            msg = await sub.get(5)
            assert msg.payload == {"level": "high"}
            assert msg.channel.startswith("alerts/v1/")
        none = await c.send("nobody/v1/*", 1)
        assert none.fanout == 0
        await c.close()

    run(main())


def test_add_id_and_remove_id_at_runtime(broker):
    async def main():
        c = await broker.connect()
        sub = await c.listen("room/v1/a", prefetch=10)
        await sub.add_id("b")
        await c.send("room/v1/b", "to b")
        msg = await sub.get(5)
        assert (msg.channel, msg.payload) == ("room/v1/b", "to b")
        await msg.ack()
        await sub.remove_id("b")
        await c.send("room/v1/b", "not for us")
        await c.send("room/v1/a", "for us")
        msg = await sub.get(5)
        assert msg.payload == "for us"
        await c.close()

    run(main())


def test_nack_delay_attempts_and_extend(broker):
    async def main():
        c = await broker.connect()
        await c.send("retry/v1/1", {"job": 1})
        sub = await c.consume("retry/v1/1", lease=30)
        msg = await sub.get(5)
        assert msg.attempts == 1
        assert await msg.extend(60)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await msg.nack(delay=0.5)
        again = await sub.get(5)
        assert loop.time() - t0 >= 0.45  # not before the delay
        assert again.attempts == 2 and again.seq == msg.seq
        with pytest.raises(UnknownDelivery):
            await msg.ack()  # the first delivery's tag is fenced off
        assert await again.ack()
        await c.close()

    run(main())


def test_priority_and_publish_delay(broker):
    async def main():
        c = await broker.connect()
        await c.send("prio/v1/1", "low")
        await c.send("prio/v1/1", "later", delay=0.6)
        await c.send("prio/v1/1", "high", priority=9)
        sub = await c.consume("prio/v1/1", prefetch=10)
        first, second = await sub.get(5), await sub.get(5)
        assert [first.payload, second.payload] == ["high", "low"]
        third = await sub.get(5)
        assert third.payload == "later"
        import time

        assert time.time() >= third.published_at + 0.6
        await c.close()

    run(main())


def test_errors_reach_the_caller(broker):
    async def main():
        c = await broker.connect()
        with pytest.raises(InvalidChannel, match="version"):
            await c.send("bad/1/x", 1)
        with pytest.raises(InvalidChannel):
            await c.consume("no pattern here")
        assert (await c.send("fine/v1/1", 1)).seq == 1
        await c.close()

    run(main())


def test_websocket_transport_speaks_the_same_frames(broker):
    async def main():
        ws_url = broker.http.replace("http://", "ws://") + "/v1/ws"
        c = await broker.connect("over-ws", url=ws_url)
        receipt = await c.send("ws/v1/1", {"via": "websocket"})
        assert receipt.seq == 1
        sub = await c.consume("ws/v1/1")
        msg = await sub.get(5)
        assert msg.payload == {"via": "websocket"}
        assert await msg.ack()
        await c.close()

    run(main())


def test_failover_to_the_next_url(broker):
    async def main():
        dead = "minou://127.0.0.1:1"
        c = await minou.connect([dead, broker.url], **broker.auth())
        assert (await c.send("fo/v1/1", 1)).seq == 1
        await c.close()

    run(main())


def test_reconnects_and_resubscribes_after_restart(broker):
    async def main():
        c = await broker.connect("survivor")
        sub = await c.consume("rs/v1/1", prefetch=5)
        await c.send("rs/v1/1", "before")
        assert await (await sub.get(5)).ack()  # durable before the crash
        broker.kill()
        fut = c.send("rs/v1/1", "during")  # queued while the broker is down
        await asyncio.sleep(0.2)
        broker.start()
        receipt = await asyncio.wait_for(fut, 20)
        assert receipt.seq == 2
        msg = await sub.get(20)
        assert msg.payload == "during"
        assert await msg.ack()
        await c.close()

    run(main())


def test_a_client_without_reconnect_fails_fast_once_its_connection_is_lost(broker):
    async def main():
        c = await broker.connect("one-shot", reconnect=False, request_timeout=30)
        assert await c.offsets(["nr/v1/*"]) == {}
        broker.kill()
        while c.connected:  # the client sees the connection end (run() bounds the wait)
            await asyncio.sleep(0.01)
        broker.start()
        # Not a 30 s Timeout: the connection is gone and this client says so.
        with pytest.raises(ConnectionClosed, match="does not reconnect"):
            await c.offsets(["nr/v1/*"])
        with pytest.raises(ConnectionClosed, match="does not reconnect"):
            c.send("nr/v1/1", "x")
        await c.close()

    run(main())


def test_send_queue_is_bounded(broker):
    async def main():
        c = await broker.connect(max_pending=50)
        broker.kill()
        futs = [c.send("q/v1/1", i) for i in range(50)]
        with pytest.raises(SendQueueFull, match="max_pending=50"):
            c.send("q/v1/1", "one too many")
        c.reconnect = False
        await c.close()
        for fut in futs:
            fut.cancel() if not fut.done() else fut.exception()

    run(main())


def test_offsets_at_a_time_find_the_first_seq_published_then(broker):
    """OFFSETS with ``at``: per channel, the first seq published at or after it (the
    Spark source's startingTimestamp), from storage."""
    import time

    with broker.connect_sync() as c:
        for i in range(5):
            c.send("when/v1/a", {"i": i})
        time.sleep(0.05)
        cut = time.time()
        time.sleep(0.05)
        for i in range(5, 8):
            c.send("when/v1/a", {"i": i})
        c.send("when/v1/b", {"i": 0})  # only after the cut
        got = c.offsets_at("when/v1/*", cut)
        assert got == {"when/v1/a": (1, 9, 6), "when/v1/b": (1, 2, 1)}
        assert c.offsets_at("when/v1/a", cut - 3600)["when/v1/a"][2] == 1
        assert c.offsets_at("when/v1/a", time.time() + 1)["when/v1/a"][2] == 9  # none yet


def test_a_wrong_field_is_refused_at_once_and_never_holds_up_the_others(broker):
    """A priority of the wrong type used to make the whole frame undecodable: every
    publish of that turn then timed out, "may still be stored". Now the call raises,
    nothing of it is sent, and the publishes beside it are confirmed."""
    async def main():
        client = await broker.connect("careless", confirm_timeout=10)
        good = [client.send("careless/v1/a", {"n": i}) for i in range(5)]
        for bad, error in ((dict(priority=5.5), TypeError), (dict(priority=True), TypeError),
                           (dict(priority=2**70), BadRequest),
                           (dict(ttl="9"), TypeError), (dict(delay=10**400), BadRequest),
                           (dict(headers={"a": 1}), TypeError), (dict(key=5), TypeError)):
            with pytest.raises(error):
                client.send("careless/v1/a", {"bad": True}, **bad)
        for bad_payload in ({"x": float("nan")}, [1, {"y": float("-inf")}]):
            with pytest.raises(ValueError, match="NaN or an infinity"):
                client.send("careless/v1/a", bad_payload)  # it would arrive as null
        good += [client.send("careless/v1/a", {"n": i, "none": None}) for i in range(5, 10)]
        receipts = await asyncio.gather(*good)
        assert [r.seq for r in receipts] == list(range(1, 11))
        # send_many checks every message first: a wrong one sends none of them.
        with pytest.raises(TypeError, match=r"priority must be an integer 0\.\.9, got 1\.5"):
            await client.send_many([("careless/v1/b", 1),
                                    {"channel": "careless/v1/b", "payload": 2,
                                     "priority": 1.5}])
        assert (await client.offsets(["careless/v1/b"])) == {}
        await client.close()

    run(main())


def test_send_many_says_which_were_stored_when_the_broker_refuses_some(broker):
    async def main():
        client = await broker.connect("partial")
        with pytest.raises(InvalidChannel) as refused:
            await client.send_many([("partial/v1/a", 1), ("partial/v1/a/../b", 2),
                                    ("partial/v1/a", 3)])
        first, error, last = refused.value.results
        assert isinstance(first, minou.Receipt) and isinstance(last, minou.Receipt)
        assert error is refused.value
        page, _ = await client.read("partial/v1/a", 1)
        assert [m.payload for m in page] == [1, 3]  # a retry sends only the refused one
        await client.close()

    run(main())


def test_a_closed_or_forked_sync_client_says_so_and_never_hangs(broker):
    import os

    client = broker.connect_sync("forker")
    client.send("fork/v1/a", 1)
    pid = os.fork()
    if pid == 0:  # the child: the connection and its thread stayed in the parent
        code = 1
        try:
            client.send("fork/v1/a", 2)
        except ConnectionClosed as exc:
            code = 0 if "after os.fork()" in str(exc) else 2
        finally:
            client.close()  # nothing to do here, and it says nothing
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.send("fork/v1/a", 3).seq == 2  # the parent's client goes on
    client.close()
    client.close()  # twice: nothing
    with pytest.raises(ConnectionClosed, match="client closed"):
        client.send("fork/v1/a", 4)
    with pytest.raises(ConnectionClosed, match="client closed"):
        client.consume("fork/v1/*")
