"""Bad input over a raw socket: a precise error frame, counted, nobody else hurt."""

from __future__ import annotations

import struct

import msgspec
import pytest
import websockets.sync.client as wsc
from websockets.exceptions import ConnectionClosed as WsClosed

import minou
from minou.errors import ErrorCode
from minou.limits import MAX_HELLO_FRAME_SIZE
from minou.protocol import frames as f

from ..conftest import RawPeer, signed_hello, wait_until


@pytest.fixture
def raw(broker):
    peers: list[RawPeer] = []

    def make() -> RawPeer:
        p = RawPeer(broker.url)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()


@pytest.fixture
def bystander(broker):
    """A well-behaved client with a backlog: it must not notice anybody's bad input."""
    client = minou.connect_sync(broker.url, **broker.admin_auth())
    client.send("calm/v1/1", {"n": 1})
    yield client
    sub = client.consume("calm/v1/1")
    msg = sub.get(timeout=5)
    assert msg.payload == {"n": 1}
    assert msg.ack()
    client.send("calm/v1/1", {"n": 2})
    client.close()


def raw_frame(frame_type: int, body: bytes) -> bytes:
    return struct.pack(">IB", len(body) + 1, frame_type) + body


def refused(client: minou.SyncClient) -> dict[str, int]:
    return client.admin("status")["counters"]["refused"]


def test_unknown_command_gets_error_and_connection_goes_on(raw, bystander):
    peer = raw()
    peer.hello()
    peer.write(raw_frame(99, b"\x90"))
    err = peer.read()
    assert isinstance(err, f.Error)
    assert err.code == ErrorCode.UNKNOWN_COMMAND and "99" in err.message
    peer.write(f.encode(f.Ping(7)))
    assert peer.read() == f.Pong(7)
    assert refused(bystander)["unknown_command"] == 1


def test_malformed_body_names_the_frame_and_the_field(raw, bystander):
    peer = raw()
    peer.hello()
    body = msgspec.msgpack.encode(["not-an-int", []])
    peer.write(raw_frame(f.FrameType.PUBLISH, body))
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.MALFORMED_FRAME
    assert "PUBLISH" in err.message and "Expected `int`" in err.message
    peer.write(f.encode(f.Ping(1)))
    assert peer.read() == f.Pong(1)
    assert refused(bystander)["malformed_frame"] == 1


def test_frame_over_the_limit_is_fatal_with_an_error_first(raw, bystander):
    peer = raw()
    peer.hello()
    peer.write(struct.pack(">IB", 1 << 30, f.FrameType.PUBLISH))
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.FRAME_TOO_LARGE and err.fatal
    assert peer.closed_by_peer()
    assert refused(bystander)["frame_too_large"] == 1


def test_truncated_frame_then_disconnect_is_counted(raw, bystander):
    peer = raw()
    peer.hello()
    whole = f.encode(f.Publish(1, [f.Send("calm/v1/1", b'{"half": true}')]))
    peer.write(whole[: len(whole) // 2])
    peer.close()
    wait_until(lambda: refused(bystander).get("truncated_frame") == 1, what="truncation counted")
    # Half a publish stores nothing.
    assert client_depth(bystander, "calm/v1/1") == 1


def client_depth(client: minou.SyncClient, channel: str) -> int:
    rows = client.admin("list", channel=channel)["channels"]
    return sum(r["depth"] for r in rows if r["channel"] == channel)


def test_frames_before_hello_are_refused(raw, bystander):
    peer = raw()
    peer.write(f.encode(f.Publish(3, [f.Send("calm/v1/1", b"1")])))
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.UNEXPECTED_FRAME
    assert "HELLO" in err.message and err.fatal
    assert peer.closed_by_peer()
    assert client_depth(bystander, "calm/v1/1") == 1


def test_a_stranger_cannot_make_the_broker_read_a_large_frame_before_hello(broker, raw,
                                                                          bystander):
    """Before a HELLO is accepted, frames are a HELLO's size. A stranger (no key needed)
    that sent most of a 16 MB frame and no HELLO had it read whole and held until
    hello_timeout: 10 such connections held +150 MiB, max_connections of them 160 GB.
    Now it is refused at the frame's header, natively and through /v1/ws."""
    peer = raw()
    peer.write(struct.pack(">IB", 16_000_000, f.FrameType.HELLO) + b"\0" * 1000)
    err = peer.read()  # at once: the rest of the frame is never waited for
    assert isinstance(err, f.Error) and err.code == ErrorCode.FRAME_TOO_LARGE and err.fatal
    assert "before a HELLO is accepted" in err.message
    assert err.detail["limit"] == MAX_HELLO_FRAME_SIZE
    assert peer.closed_by_peer()
    with wsc.connect(broker.http.replace("http://", "ws://") + "/v1/ws") as ws:
        ws.send(struct.pack(">IB", 200_000, f.FrameType.HELLO) + b"\0" * 199_999)
        with pytest.raises(WsClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009  # too big
    assert refused(bystander)["frame_too_large"] == 1


def test_a_large_frame_right_behind_an_accepted_hello_is_taken(raw, bystander):
    """The HELLO's limit ends when it is accepted, with the frames already read behind
    it: a client may pipeline a large publish in the same write as its HELLO."""
    peer = raw()
    big = f.Send("calm/v1/2", b'"' + b"x" * 500_000 + b'"')
    peer.write(f.encode(signed_hello("pipeliner")) + f.encode(f.Publish(1, [big])))
    assert isinstance(peer.read(), f.Welcome)
    confirm = peer.read()
    assert isinstance(confirm, f.Confirm) and [o.code for o in confirm.outcomes] == [0]


def test_bad_messages_in_a_batch_fail_alone(raw, bystander):
    peer = raw()
    peer.hello()
    sends = [
        f.Send("calm/v1/1", b'{"ok": 1}'),
        f.Send("calm/v1/1", b"{bad json"),
        f.Send("calm//1", b"1"),
        f.Send("calm/v1/1", b'"' + b"x" * (2 << 20) + b'"'),
        f.Send("calm/v1/1", b"2", priority=42),
        f.Send("calm/v1/1", b'{"ok": 2}'),
    ]
    peer.write(f.encode(f.Publish(5, sends)))
    confirm = peer.read()
    assert isinstance(confirm, f.Confirm) and confirm.req == 5
    codes = [o.code for o in confirm.outcomes]
    assert codes == [0, ErrorCode.INVALID_PAYLOAD, ErrorCode.INVALID_CHANNEL,
                     ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.BAD_REQUEST, 0]
    assert "not valid JSON" in confirm.outcomes[1].error
    assert "version" in confirm.outcomes[2].error
    assert "limit" in confirm.outcomes[3].error
    assert "priority 42" in confirm.outcomes[4].error
    assert [o.seq for o in confirm.outcomes if not o.code] == [2, 3]
    counts = refused(bystander)
    assert counts["invalid_payload"] == 1 and counts["invalid_channel"] == 1
    assert counts["message_too_large"] == 1 and counts["bad_request"] == 1


def test_ack_of_unknown_tag_is_refused_precisely(raw, bystander):
    peer = raw()
    peer.hello()
    peer.write(f.encode(f.Ack(9, [123456])))
    settled = peer.read()
    assert isinstance(settled, f.Settled) and settled.req == 9
    [(tag, code, text)] = settled.failed
    assert tag == 123456 and code == ErrorCode.UNKNOWN_DELIVERY and "123456" in text
    peer.write(f.encode(f.Ack(0, [55])))  # fire-and-forget ack: the error comes unasked
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.UNKNOWN_DELIVERY
    assert err.detail["tag"] == 55
    assert refused(bystander)["unknown_delivery"] == 2


def test_a_client_cannot_settle_another_clients_delivery(broker, raw):
    owner = broker.connect_sync("owner")
    owner.send("jobs/v1/1", {"job": 1})
    sub = owner.consume("jobs/v1/1", group="workers")
    msg = sub.get(timeout=5)
    thief = raw()
    thief.hello("thief")
    thief.write(f.encode(f.Ack(1, [msg.tag])))
    settled = thief.read()
    assert isinstance(settled, f.Settled)
    assert settled.failed and settled.failed[0][1] == ErrorCode.UNKNOWN_DELIVERY
    assert msg.ack() is True  # still the owner's to settle
    owner.close()


def test_random_garbage_never_hurts_the_broker(broker, raw, bystander):
    import random

    rng = random.Random(7)
    for _ in range(30):
        peer = raw()
        if rng.random() < 0.5:
            peer.hello()
        peer.write(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 400))))
        peer.close()
    with broker.connect_sync() as other:
        assert other.send("calm/v1/2", {"still": "fine"}).seq == 1


def test_max_connections_and_hello_deadline(broker_factory, tmp_path):
    cfg = tmp_path / "small.toml"
    cfg.write_text("max_connections = 2\nhello_timeout = 0.5\n")
    broker = broker_factory.make(config=cfg).start()
    first = RawPeer(broker.url)
    first.hello("one")
    second = RawPeer(broker.url)
    second.hello("two")
    third = RawPeer(broker.url)
    err = third.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.TOO_MANY_CONNECTIONS
    assert "max_connections = 2" in err.message and third.closed_by_peer()
    for p in (first, second, third):
        p.close()
    silent = RawPeer(broker.url)  # connects and says nothing
    err = silent.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.UNEXPECTED_FRAME and err.fatal
    assert "no HELLO within 0.5 s" in err.message and silent.closed_by_peer()
    silent.close()


def test_a_development_broker_checks_client_ids_as_any_other(tmp_path):
    """--dev asks for no key, but an id is still an id: with a control character, a
    right-to-left mark or a "/" it would forge lines of the log, the dashboard and the
    listings. Refused at the HELLO with why=client_id; a plain id still gets in."""
    from ..conftest import BrokerProcess

    broker = BrokerProcess(tmp_path / "dev", extra=["--dev"], open_rules=False).start()
    try:
        for bad in ("a\x00b", "app\nFORGED line", "a/b", "rtl\u202eevil"):
            peer = RawPeer(broker.url)
            peer.write(f.encode(f.Hello(bad)))
            err = peer.read()
            assert isinstance(err, f.Error), (bad, err)
            assert err.code == ErrorCode.NOT_AUTHENTICATED, (bad, err)
            assert err.detail["why"] == "client_id"
            assert "client id" in err.message
            peer.sock.close()
        peer = RawPeer(broker.url)
        peer.write(f.encode(f.Hello("app-1")))
        assert isinstance(peer.read(), f.Welcome)
        peer.sock.close()
        with minou.connect_sync(broker.url, client_id="app-2") as app:
            assert app.admin("whoami")["client_id"] == "app-2"
    finally:
        broker.stop()
