"""NativeConnection and BrokerServer over fake transports: the native protocol's
conversation (docs/protocol.md), commits, flow control and slow consumers."""

from __future__ import annotations

import asyncio
import gc
import json
import struct
import time
import weakref

import pytest

from minou.errors import ErrorCode
from minou.limits import CONSUMER_WRITE_HIGH, CONSUMER_WRITE_LOW
from minou.protocol import frames as f

from .conftest import Harness, Peer, wait_for

pytestmark = pytest.mark.anyio

CH = "orders/v1/1"


def publish(req: int, *payloads: object, channel: str = CH) -> f.Publish:
    return f.Publish(req, [f.Send(channel, json.dumps(p).encode()) for p in payloads])


def frame(frame_type: int, body: bytes) -> bytes:
    """A frame as raw bytes, whatever its body."""
    return struct.pack(">IB", len(body) + 1, frame_type) + body


async def consumer(broker: Harness, client_id: str = "worker", **kw: object) -> Peer:
    peer = await broker.connect(client_id)
    peer.send(f.Subscribe(1, 1, "consume", ["orders/v1/*"], group="workers", **kw))
    assert await peer.expect(f.Result) == f.Result(1, {"sid": 1})
    return peer


# ------------------------------------------------------------------- HELLO
async def test_hello_is_answered_by_one_welcome_in_the_same_read(broker: Harness) -> None:
    peer = await broker.connect(client_id=None)
    assert peer.transport.write_limits == (CONSUMER_WRITE_HIGH, CONSUMER_WRITE_LOW)
    peer.send(f.Hello("alice", heartbeat=0))
    # No await: the reply is written by data_received itself, in one write.
    assert peer.transport.writes == 1
    [welcome] = peer.frames()
    assert isinstance(welcome, f.Welcome)
    assert (welcome.broker_id, welcome.version, welcome.client_id, welcome.admin) == \
        ("minou", 1, "alice", True)  # auth off: a development identity, an admin
    assert welcome.max_message_size == broker.server.settings.max_message_size
    assert len(welcome.producer_id) == 16
    assert broker.server.authentications["development"] == 1


async def test_a_hello_fed_byte_by_byte_is_answered_at_its_last_byte(
        broker: Harness) -> None:
    peer = await broker.connect(client_id=None)
    data = f.encode(f.Hello("bytewise"))
    for i in range(len(data) - 1):
        peer.send_bytes(data[i:i + 1])
        assert peer.transport.writes == 0
    peer.send_bytes(data[-1:])
    [welcome] = peer.frames()
    assert isinstance(welcome, f.Welcome) and welcome.client_id == "bytewise"


async def test_frames_pipelined_behind_the_hello_are_answered_in_one_write(
        broker: Harness) -> None:
    peer = await broker.connect(client_id=None)
    peer.send(f.Hello("pipelined"), f.Ping(1), f.Ping(2))
    assert peer.transport.writes == 1
    assert [type(x) for x in peer.frames()] == [f.Welcome, f.Pong, f.Pong]


# -------------------------------------------------------- PUBLISH, CONFIRM
async def test_confirm_waits_for_the_commit(broker: Harness) -> None:
    peer = await broker.connect("publisher")
    broker.storage.hold()
    peer.send(publish(7, {"total": 1}, {"total": 2}))
    await broker.storage.writer_held()
    assert peer.frames() == []  # the writer holds the batch: nothing is confirmed
    assert broker.storage.stored(CH) == []

    broker.storage.release()
    confirm = await peer.expect(f.Confirm)
    assert confirm.req == 7
    assert [(o.seq, o.channel, o.code) for o in confirm.outcomes] == [(1, CH, 0), (2, CH, 0)]
    stored = broker.storage.stored(CH)
    assert [(m.seq, m.id, json.loads(m.data)) for m in stored] == \
        [(1, confirm.outcomes[0].id, {"total": 1}), (2, confirm.outcomes[1].id, {"total": 2})]
    assert broker.server.messages_committed == 2


async def test_a_bad_send_fails_alone_and_its_batch_is_confirmed(broker: Harness) -> None:
    peer = await broker.connect("publisher")
    peer.send(f.Publish(1, [f.Send(CH, b'{"ok": 1}'), f.Send("no-version/1", b"{}"),
                            f.Send(CH, b"{not json")]))
    confirm = await peer.expect(f.Confirm)
    codes = [o.code for o in confirm.outcomes]
    assert codes == [0, ErrorCode.INVALID_CHANNEL, ErrorCode.INVALID_PAYLOAD]
    assert confirm.outcomes[0].seq == 1
    assert [m.seq for m in broker.storage.stored(CH)] == [1]


# ---------------------------------------------------------------- bad input
async def _error(peer: Peer) -> f.Error:
    error = await peer.expect(f.Error)
    assert error.detail["reason"]  # every error names its reason
    return error


async def test_a_malformed_frame_gets_an_error_and_the_connection_goes_on(
        broker: Harness) -> None:
    peer = await broker.connect()
    peer.send_bytes(frame(f.FrameType.PUBLISH, b"\xc1"))  # 0xc1: never valid MessagePack
    error = await _error(peer)
    assert (error.req, error.code, error.fatal) == (0, ErrorCode.MALFORMED_FRAME, False)
    assert "PUBLISH" in error.message
    peer.send(f.Ping(5))
    assert await peer.expect(f.Pong) == f.Pong(5)
    assert not peer.transport.closed
    assert broker.server.core.counters.as_dict()["refused"]["malformed_frame"] == 1


async def test_an_unknown_frame_type_gets_an_error_and_the_connection_goes_on(
        broker: Harness) -> None:
    peer = await broker.connect()
    peer.send_bytes(frame(99, b"\x90") + f.encode(f.Ping(6)))
    error = await _error(peer)
    assert (error.code, error.fatal) == (ErrorCode.UNKNOWN_COMMAND, False)
    assert await peer.expect(f.Pong) == f.Pong(6)
    assert not peer.transport.closed


async def test_a_frame_a_client_may_not_send_gets_an_error(broker: Harness) -> None:
    peer = await broker.connect()
    peer.send(f.Confirm(3, []))
    error = await _error(peer)
    assert (error.req, error.code, error.fatal) == (3, ErrorCode.UNEXPECTED_FRAME, False)
    assert not peer.transport.closed


async def test_link_credit_is_refused_to_a_client_even_an_admin(broker: Harness) -> None:
    """``link.credit`` gives deliveries back as never sent (their attempt uncounted):
    only the brokers' own links may send it, or a client could dodge max_deliveries."""
    peer = await broker.connect()
    peer.send(f.Subscribe(1, 1, "consume", ["orders/v1/*"], "g"))
    await peer.expect(f.Result)
    peer.send(f.Admin(2, "link.credit", {"sid": 1, "wanted": 0, "withdraw": [1]}))
    error = await _error(peer)
    assert (error.req, error.code, error.fatal) == (2, ErrorCode.NOT_AUTHORIZED, False)
    assert "brokers' own links" in error.message
    peer.send(f.Ping(3))  # the connection goes on
    assert await peer.expect(f.Pong) == f.Pong(3)


async def test_a_frame_over_the_limit_is_fatal(broker: Harness) -> None:
    peer = await broker.connect()
    too_large = broker.server.max_frame_size + 1
    # Only the header: the broker must not wait for (or buffer) the body.
    peer.send_bytes(struct.pack(">IB", too_large, f.FrameType.PUBLISH))
    error = await _error(peer)
    assert (error.code, error.fatal) == (ErrorCode.FRAME_TOO_LARGE, True)
    assert error.detail["size"] == too_large
    await peer.closed()
    assert peer.conn not in broker.server.connections
    assert peer.transport not in broker.server.admission.open


async def test_a_zero_length_frame_is_fatal(broker: Harness) -> None:
    peer = await broker.connect()
    peer.send_bytes(b"\x00\x00\x00\x00\x13")
    error = await _error(peer)
    assert (error.code, error.fatal) == (ErrorCode.MALFORMED_FRAME, True)
    await peer.closed()


async def test_anything_before_hello_is_fatal(broker: Harness) -> None:
    peer = await broker.connect(client_id=None)
    peer.send(f.Ping(1), f.Hello("late"))
    error = await _error(peer)
    assert (error.req, error.code, error.fatal) == (1, ErrorCode.UNEXPECTED_FRAME, True)
    await peer.closed()
    assert peer.frames() == []  # the HELLO behind it was not answered
    assert peer.conn.session is None


async def test_a_connection_that_went_is_not_held_until_its_hello_deadline(
        broker: Harness) -> None:
    """The HELLO deadline's timer goes with the HELLO or with the connection: left to
    ring, it held every connection (its buffers, its session's objects) hello_timeout
    (10 s) after it went, long enough for the cyclic GC to move it to its oldest
    generation, freed only by a rare full collection: a client reconnecting in a loop
    grew the broker ~3-5 KiB a connection (bench/federation_reconnect_loop.py)."""
    welcomed = await broker.connect("leaves")
    silent = await broker.connect(client_id=None)  # gone before its HELLO
    gone = [weakref.ref(p.conn) for p in (welcomed, silent)]
    for peer in (welcomed, silent):
        peer.transport.close()
    await asyncio.sleep(0)  # connection_lost runs on the next turn
    await asyncio.sleep(0)
    broker.peers.clear()
    del welcomed, silent, peer
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    assert len(broker.server.connections) == 0


async def test_bye_closes_and_gives_unsettled_deliveries_back(broker: Harness) -> None:
    worker = await consumer(broker)
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}))
    first = (await worker.expect(f.Deliver)).items[0]
    worker.send(f.Bye("done"))
    await worker.closed()
    again = await (await consumer(broker, "worker-2")).expect(f.Deliver)
    assert [(d.seq, d.attempts) for d in again.items] == [(first.seq, first.attempts + 1)]


# ------------------------------------------------------------- flow control
async def test_a_publisher_is_paused_while_the_disk_is_behind(make_server) -> None:
    broker = await make_server(publish_pause_bytes=1)
    peer = await broker.connect("publisher")
    broker.storage.hold()
    peer.send(publish(1, {"n": 1}))
    # Paused by the read that staged the publish, before any commit.
    assert peer.transport.events == ["pause_reading"]
    assert broker.server.flow_pauses == 1
    await broker.storage.writer_held()
    assert peer.frames() == []
    assert not peer.transport.reading

    broker.storage.release()
    assert (await peer.expect(f.Confirm)).outcomes[0].seq == 1
    await wait_for(lambda: peer.transport.reading, "reading to resume after the commit")
    assert peer.transport.events == ["pause_reading", "resume_reading"]
    assert broker.server.uncommitted_bytes == 0
    assert broker.server.status()["flow"]["publisher_pauses"] == 1


async def test_a_publisher_under_the_limit_is_never_paused(broker: Harness) -> None:
    peer = await broker.connect("publisher")
    peer.send(publish(1, {"n": 1}))
    await peer.expect(f.Confirm)
    assert peer.transport.events == []
    assert broker.server.flow_pauses == 0


# -------------------------------------------------- SUBSCRIBE, DELIVER, ACK
async def test_a_consumer_gets_what_is_published_and_its_ack_settles_after_the_commit(
        broker: Harness) -> None:
    worker = await consumer(broker)
    publisher = await broker.connect("publisher")
    publisher.send(f.Publish(1, [f.Send(CH, b'{"total": 12.5}', headers={"h": "v"})]))
    confirm = await publisher.expect(f.Confirm)

    deliver = await worker.expect(f.Deliver)
    assert deliver.sid == 1
    [item] = deliver.items
    assert (item.channel, item.seq, item.id, item.data, item.headers, item.attempts) == \
        (CH, 1, confirm.outcomes[0].id, b'{"total": 12.5}', {"h": "v"}, 1)

    broker.storage.hold()
    worker.send(f.Ack(2, [item.tag]))
    await broker.storage.writer_held()
    assert worker.frames() == []  # no SETTLED before the ack is durable
    broker.storage.release()
    assert await worker.expect(f.Settled) == f.Settled(2, [])

    worker.send(f.Ack(3, [item.tag]))  # settled already
    settled = await worker.expect(f.Settled)
    assert [(tag, code) for tag, code, _ in settled.failed] == \
        [(item.tag, ErrorCode.UNKNOWN_DELIVERY)]


async def test_an_ack_without_req_gets_no_reply_but_errors_for_bad_tags(
        broker: Harness) -> None:
    worker = await consumer(broker)
    worker.send(f.Ack(0, [12345]), f.Ping(9))
    error = await worker.expect(f.Error)
    assert (error.req, error.code, error.detail) == \
        (0, ErrorCode.UNKNOWN_DELIVERY, {"tag": 12345})
    assert await worker.expect(f.Pong) == f.Pong(9)


async def test_deliveries_stop_above_the_write_water_mark(broker: Harness) -> None:
    worker = await consumer(broker)
    worker.protocol.pause_writing()  # what asyncio calls past set_write_buffer_limits' high
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}))
    await publisher.expect(f.Confirm)
    await wait_for(lambda: not broker.server.engine.pump_pending, "the pump to run")
    assert worker.frames() == []

    worker.protocol.resume_writing()
    assert [d.seq for d in (await worker.expect(f.Deliver)).items] == [1]


async def test_a_subscription_made_while_deliveries_are_paused_is_paused_too(
        broker: Harness) -> None:
    """A consumer that stopped reading cannot get round the pause by subscribing again
    (found by the simulator: the new subscription started unpaused)."""
    worker = await consumer(broker)
    worker.protocol.pause_writing()
    worker.send(f.Subscribe(2, 2, "consume", ["invoices/v1/*"], group="others"))
    assert await worker.expect(f.Result) == f.Result(2, {"sid": 2})
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}, channel="invoices/v1/1"))
    await publisher.expect(f.Confirm)
    await wait_for(lambda: not broker.server.engine.pump_pending, "the pump to run")
    assert worker.frames() == []

    worker.protocol.resume_writing()
    deliver = await worker.expect(f.Deliver)
    assert (deliver.sid, [d.seq for d in deliver.items]) == (2, [1])


async def test_a_slow_consumer_is_cut_and_its_deliveries_go_back(make_server) -> None:
    broker = await make_server(slow_consumer_bytes=1000)
    slow = await consumer(broker, "slow")
    slow.transport.buffered = 5000  # the peer stopped reading: the kernel holds this much
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}))

    error = await slow.expect(f.Error)
    assert (error.code, error.fatal, error.detail["limit"]) == \
        (ErrorCode.SLOW_CONSUMER, True, 1000)
    first = (await slow.expect(f.Deliver)).items[0]  # written before the cut
    await slow.closed()
    assert broker.server.slow_consumers == 1
    assert broker.server.core.counters.as_dict()["refused"]["slow_consumer"] == 1

    fast = await consumer(broker, "fast")
    [again] = (await fast.expect(f.Deliver)).items
    assert (again.seq, again.id, again.attempts) == (first.seq, first.id, 2)


async def test_a_consumer_under_the_limit_is_not_cut(make_server) -> None:
    broker = await make_server(slow_consumer_bytes=1000)
    worker = await consumer(broker)
    worker.transport.buffered = 1000  # at the limit, not over it
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}))
    assert [d.seq for d in (await worker.expect(f.Deliver)).items] == [1]
    assert not worker.transport.closed and broker.server.slow_consumers == 0


async def _holding_one(make_server) -> tuple[Harness, Peer]:
    """A consumer holding one unsettled delivery."""
    broker = await make_server()
    worker = await consumer(broker)
    publisher = await broker.connect("publisher")
    publisher.send(publish(1, {"n": 1}))
    await worker.expect(f.Deliver)
    return broker, worker


# No await between the calls to watch_consumers below: the ticker's own calls (with the
# real time) cannot come in between.
async def test_a_consumer_that_reads_nothing_for_slow_consumer_seconds_is_cut(
        make_server) -> None:
    broker, worker = await _holding_one(make_server)
    seconds = broker.server.settings.slow_consumer_seconds
    now = time.monotonic()
    worker.transport.buffered = 100  # unsent: the peer stopped reading
    broker.server.watch_consumers(now)  # notes what was sent so far
    broker.server.watch_consumers(now)  # nothing more: stalled from now on
    broker.server.watch_consumers(now + seconds - 0.5)
    assert worker.frames() == [] and not worker.transport.closed
    broker.server.watch_consumers(now + seconds)
    error = await worker.expect(f.Error)
    assert (error.code, error.fatal, error.detail["seconds"]) == \
        (ErrorCode.SLOW_CONSUMER, True, seconds)
    assert "1 were unsettled" in error.message
    await worker.closed()
    assert broker.server.slow_consumers == 1


async def test_a_consumer_that_reads_is_not_cut(make_server) -> None:
    broker, worker = await _holding_one(make_server)
    seconds = broker.server.settings.slow_consumer_seconds
    now = time.monotonic()
    worker.transport.buffered = 100
    broker.server.watch_consumers(now)
    broker.server.watch_consumers(now)
    worker.transport.buffered = 50  # the kernel took 50 bytes: the peer reads
    broker.server.watch_consumers(now + seconds)
    broker.server.watch_consumers(now + seconds * 1.5)
    assert worker.frames() == [] and not worker.transport.closed
    assert broker.server.unsent_delivery_bytes == 50


# ----------------------------------------------------------- connection limit
async def test_a_connection_over_the_limit_is_refused_when_its_hello_comes(
        make_server) -> None:
    broker = await make_server(max_connections=1)
    await broker.connect("first")
    second = await broker.connect(client_id=None)
    assert second.conn is None
    second.send(f.Hello("second"))
    error = await second.expect(f.Error)
    assert (error.code, error.fatal) == (ErrorCode.TOO_MANY_CONNECTIONS, True)
    assert second.transport.events == ["write_eof"]  # read until the peer closes
    second.transport.close()
    await asyncio.sleep(0)
    assert second.transport not in broker.server.admission.refusing


async def test_a_soft_stop_answers_the_last_ack_before_it_closes_the_connections(
        broker: Harness) -> None:
    """The drain ends when no delivery is out any more, which an ack makes true at
    once; its SETTLED waits for the commit. A stop requested then closed the
    connections first: the consumer heard nothing and took a durable ack for a lost one
    (test_admin_cli's soft stop, once under load)."""
    peer = await broker.connect("drainer")
    peer.send(publish(1, {"n": 1}))
    await peer.expect(f.Confirm)
    peer.send(f.Subscribe(2, 1, "consume", [CH], group="g", prefetch=1))
    await peer.expect(f.Result)
    delivery = (await peer.expect(f.Deliver)).items[0]
    server = broker.server
    server.soft_stop("test")
    broker.storage.hold()
    peer.send(f.Ack(3, [delivery.tag]))
    await broker.storage.writer_held()  # the ack is being committed: no delivery is out
    await asyncio.sleep(0.2)  # the drain looks every 50 ms
    assert not server._stopping.is_set()  # it waits for the ack's commit
    broker.storage.release()
    settled = await peer.expect(f.Settled)
    assert (settled.req, settled.failed) == (3, [])
    await wait_for(server._stopping.is_set, "the stop once the ack is answered")
