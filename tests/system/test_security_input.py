"""Second round of the attack table (docs/security.md): token claims and payloads.

Token claims of the wrong type, or not finite, are refused with a message naming
the claim, on the native HELLO and on the HTTP bearer path alike, and counted as
token failures. JSON nested deeper than MAX_JSON_DEPTH, or not UTF-8, is refused
with INVALID_PAYLOAD wherever a client's bytes are decoded (native and WebSocket
frames, HTTP bodies, stream messages, admin arguments), counted, and the
connection goes on. In every test the broker logs no traceback, and a bystander
keeps its stored message and its subscription.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
from typing import Any

import httpx
import pytest
import websockets.sync.client as wsc

import minou
from minou.auth import keys as keyfiles
from minou.auth.tokens import make_token
from minou.errors import ErrorCode
from minou.limits import MAX_JSON_DEPTH
from minou.protocol import frames as f

from ..conftest import RawPeer, client_key, signed_hello
from .test_http_stream import raw_websocket, ws_frame

CONFIG = """
[channels."orders/v1".schema]
type = "object"
"""
DEEP = b"[" * 50_000 + b"]" * 50_000  # 100 KB, far under the message size limit
OVER = b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1)
AT_LIMIT = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
NOT_UTF8 = b'{"name": "caf\xe9"}'  # latin-1, not UTF-8


@pytest.fixture
def target(broker_factory, tmp_path):
    cfg = tmp_path / "input.toml"
    cfg.write_text(CONFIG)
    return broker_factory.make(config=cfg).start()


@pytest.fixture
def bystander(target):
    """A well-behaved client with a stored message and a live subscription; after the
    attack, both still work and the broker never logged a traceback."""
    client = minou.connect_sync(target.url, **target.auth("calm-bystander"),
                                reconnect=False, request_timeout=5)
    client.send("calm/v1/1", {"n": 1})
    sub = client.consume("calm/v1/1", group="calm")
    yield client
    msg = sub.get(timeout=5)
    assert msg.payload == {"n": 1}, "the bystander's message is gone"
    assert msg.ack()
    client.send("calm/v1/1", {"n": 2})
    assert sub.get(timeout=5).payload == {"n": 2}, "the bystander's subscription is broken"
    client.close()
    assert target.alive
    assert "Traceback" not in target.output, target.output
    assert "internal error" not in target.output, target.output


def status(broker) -> dict[str, Any]:
    with minou.connect_sync(broker.url, **broker.admin_auth(reconnect=False)) as a:
        return a.admin("status")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(client_id: str, claims_json: str) -> str:
    """A token whose claims are exactly this JSON text, signed with the client's key
    (so only the claims can be wrong)."""
    key = keyfiles.load_private(client_key(client_id))
    head = _b64(b'{"alg":"EdDSA","typ":"JWT"}') + "." + _b64(claims_json.encode())
    return head + "." + _b64(key.sign(head.encode()))


def claims_with(client_id: str, name: str, raw: str | None) -> str:
    """Good claims for the broker 'minou', with ``name`` set to the JSON text ``raw``
    (None: left out)."""
    now = int(time.time())
    parts = {"iss": json.dumps(client_id), "aud": '"minou"', "iat": str(now),
             "exp": str(now + 60), "jti": json.dumps(os.urandom(8).hex())}
    if raw is None:
        parts.pop(name)
    else:
        parts[name] = raw
    return "{" + ",".join(f'"{k}":{v}' for k, v in parts.items()) + "}"


def hello_error(broker, client_id: str, token: str) -> f.Error:
    pem = keyfiles.public_pem(keyfiles.load_private(client_key(client_id))).decode()
    peer = RawPeer(broker.url)
    try:
        peer.write(f.encode(f.Hello(client_id, 1, token, None, pem)))
        frame = peer.read()
        assert isinstance(frame, f.Error), f"accepted: {frame}"
        assert frame.fatal and frame.code == ErrorCode.NOT_AUTHENTICATED, frame
        assert peer.closed_by_peer()
        return frame
    finally:
        peer.close()


def bearer_error(broker, token: str) -> dict[str, Any]:
    r = httpx.get(f"{broker.http}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text
    return r.json()["error"]


# ------------------------------------------------------------------- token claims
# (claim, JSON text of its value, what the message says)
BAD_CLAIMS = [
    ("exp", "NaN", "claim exp must be a finite number"),
    ("exp", '"soon"', "claim exp must be a number of seconds"),
    ("exp", "Infinity", "claim exp must be a finite number"),
    ("exp", "1e999", "claim exp must be a finite number"),
    ("exp", "-Infinity", "claim exp must be a finite number"),
    ("exp", "true", "claim exp must be a number of seconds"),
    ("exp", "[4102444800]", "claim exp must be a number of seconds"),
    ("exp", "1e300", "before the year 10000"),
    ("iat", "NaN", "claim iat must be a finite number"),
    ("iat", '{"when": 1}', "claim iat must be a number of seconds"),
    ("nbf", "NaN", "claim nbf must be a finite number"),
    ("nbf", '"later"', "claim nbf must be a number of seconds"),
    ("iss", None, "lacks the iss claim"),
    ("aud", "42", "claim aud must be a string"),
    ("aud", '["minou", 7]', "claim aud must be a string"),
    ("jti", "12345", "claim jti must be a string"),
    ("jti", json.dumps("x" * 500), "claim jti must be a string of 1..128"),
    ("jti", '""', "claim jti must be a string"),
    ("exp", None, "lacks the exp claim"),
]


def test_nan_exp_token_is_refused_on_hello_and_as_bearer(target, bystander):
    # A NaN exp compares false with everything: it never expired, and its jti was
    # remembered until NaN, i.e. never forgotten.
    with minou.connect_sync(target.url, **target.auth("tok-nan")):
        pass
    before = status(target)["auth"]["failures"].get("token", 0)
    err = hello_error(target, "tok-nan", signed("tok-nan", claims_with("tok-nan", "exp", "NaN")))
    assert "claim exp must be a finite number" in err.message and "NaN" in err.message
    assert err.detail["claim"] == "exp"
    http = bearer_error(target, signed("tok-nan", claims_with("tok-nan", "exp", "NaN")))
    assert "claim exp must be a finite number" in http["message"]
    assert http["detail"]["claim"] == "exp"
    assert status(target)["auth"]["failures"]["token"] == before + 2


def test_non_numeric_exp_token_is_refused_not_a_crash(target, bystander):
    # A string exp made the HELLO raise TypeError: no answer, a traceback in the log.
    with minou.connect_sync(target.url, **target.auth("tok-str")):
        pass
    before = status(target)["auth"]["failures"].get("token", 0)
    err = hello_error(target, "tok-str",
                      signed("tok-str", claims_with("tok-str", "exp", '"tomorrow"')))
    assert 'claim exp must be a number of seconds since 1970, not "tomorrow"' in err.message
    http = bearer_error(target, signed("tok-str", claims_with("tok-str", "exp", '"tomorrow"')))
    assert http["detail"]["claim"] == "exp"
    assert status(target)["auth"]["failures"]["token"] == before + 2
    # The well-behaved path still works.
    with minou.connect_sync(target.url, **target.auth("tok-str")) as ok:
        assert ok.admin("whoami")["client_id"] == "tok-str"


def test_every_claim_of_the_wrong_type_is_refused_by_name(target, bystander):
    with minou.connect_sync(target.url, **target.auth("tok-all")):
        pass
    before = status(target)["auth"]["failures"].get("token", 0)
    for name, raw, expected in BAD_CLAIMS:
        native = hello_error(target, "tok-all", signed("tok-all", claims_with("tok-all", name,
                                                                               raw)))
        assert expected in native.message, (name, raw, native.message)
        assert native.detail.get("claim") == name, (name, raw, native)
        http = bearer_error(target, signed("tok-all", claims_with("tok-all", name, raw)))
        assert expected in http["message"], (name, raw, http)
    assert status(target)["auth"]["failures"]["token"] == before + 2 * len(BAD_CLAIMS)


def test_a_token_nested_too_deep_is_refused(target, bystander):
    # Claims and headers are JSON too: a token fits 2000 brackets in its 4 KiB.
    with minou.connect_sync(target.url, **target.auth("tok-deep")):
        pass
    deep_claims = claims_with("tok-deep", "extra", "[" * 1400 + "]" * 1400)
    for token in (signed("tok-deep", deep_claims),
                  _b64(b"[" * 1500 + b"]" * 1500) + "." + _b64(b"{}") + ".sig"):
        err = hello_error(target, "tok-deep", token)
        assert "not a JWT" in err.message or "token refused" in err.message, err.message
        bearer_error(target, token)
    with minou.connect_sync(target.url, **target.auth("tok-deep")):  # a good one still works
        pass


# ------------------------------------------------------------------------ payloads
def _codes(confirm: f.Frame) -> list[int]:
    assert isinstance(confirm, f.Confirm), confirm
    return [o.code for o in confirm.outcomes]


def test_deep_and_non_utf8_payloads_are_refused_on_native_frames(target, bystander):
    before = status(target)["counters"]["refused"].get("invalid_payload", 0)
    peer = RawPeer(target.url)
    peer.hello("deep-native")
    peer.write(f.encode(f.Publish(1, [
        f.Send("calm/v1/1", DEEP), f.Send("calm/v1/1", OVER), f.Send("calm/v1/1", NOT_UTF8),
        f.Send("orders/v1/1", DEEP), f.Send("orders/v1/1", NOT_UTF8),  # a schema channel
        f.Send("calm/v1/2", AT_LIMIT),
    ])))
    confirm = peer.read()
    assert _codes(confirm) == [ErrorCode.INVALID_PAYLOAD] * 5 + [0]
    errors = [o.error for o in confirm.outcomes]
    assert "nests arrays and objects 50000 deep; the limit is 64" in errors[0]
    assert f"{MAX_JSON_DEPTH + 1} deep; the limit is 64" in errors[1]
    assert "not UTF-8" in errors[2] and "0xe9" in errors[2] and "not UTF-8" in errors[4]
    # A transaction's STAGE checks the same way; the connection goes on.
    peer.write(f.encode(f.Stage(2, "t1", [f.Send("calm/v1/1", DEEP)])))
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.INVALID_PAYLOAD and not err.fatal
    assert err.detail["limit"] == MAX_JSON_DEPTH
    peer.write(f.encode(f.Ping(3)))
    assert peer.read() == f.Pong(3)
    peer.close()
    assert status(target)["counters"]["refused"]["invalid_payload"] == before + 6


def test_deep_and_non_utf8_payloads_are_refused_over_websocket_frames(target, bystander):
    ws_url = target.http.replace("http://", "ws://")
    with wsc.connect(ws_url + "/v1/ws", max_size=None) as ws:
        ws.send(f.encode(signed_hello("deep-ws")))
        assert isinstance(f.decode_body(*_frame(ws.recv(5))), f.Welcome)
        ws.send(f.encode(f.Publish(1, [f.Send("calm/v1/1", DEEP),
                                       f.Send("calm/v1/1", NOT_UTF8)])))
        confirm = f.decode_body(*_frame(ws.recv(5)))
        assert _codes(confirm) == [ErrorCode.INVALID_PAYLOAD] * 2
        ws.send(f.encode(f.Ping(9)))
        assert f.decode_body(*_frame(ws.recv(5))) == f.Pong(9)


def _frame(data: bytes) -> tuple[int, bytes]:
    _, frame_type = struct.unpack_from(">IB", data)
    return frame_type, data[f.HEADER_SIZE:]


def _bearer(broker, client_id: str) -> dict[str, str]:
    with minou.connect_sync(broker.url, **broker.auth(client_id)):
        pass
    key = keyfiles.load_private(client_key(client_id))
    return {"Authorization": f"Bearer {make_token(client_id, key, 'minou', ttl=600)}"}


def _raw_http(sock: socket.socket, method: str, path: str, headers: dict[str, str],
              body: bytes) -> tuple[int, dict[str, Any]]:
    """One request on a kept-alive socket; the status and the JSON answer."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{head}content-length: "
                 f"{len(body)}\r\n\r\n".encode() + body)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the broker closed the connection"
        data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in top.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the broker closed the connection"
        rest += chunk
    return int(top.split()[1]), json.loads(rest[:length])


def test_deep_and_non_utf8_http_bodies_are_refused_and_the_connection_stays(
        target, bystander):
    h = _bearer(target, "deep-http")
    before = status(target)["counters"]["refused"].get("invalid_payload", 0)
    host, port = target.http.removeprefix("http://").rsplit(":", 1)
    batch_deep = b'[{"channel": "calm/v1/1", "payload": ' + OVER + b"}]"
    batch_utf8 = b'[{"channel": "calm/v1/1", "payload": "caf\xe9"}]'
    cases = [
        ("/v1/messages/calm/v1/1", DEEP, "the limit is 64"),
        ("/v1/messages/calm/v1/1", NOT_UTF8, "not UTF-8"),
        ("/v1/messages/orders/v1/1", DEEP, "the limit is 64"),
        ("/v1/messages", batch_deep, "the limit is 64"),
        ("/v1/messages", batch_utf8, "not UTF-8"),
    ]
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        for path, body, expected in cases:
            code, answer = _raw_http(sock, "POST", path, h, body)
            assert code == 400, (path, answer)
            assert answer["error"]["reason"] == "invalid_payload", (path, answer)
            assert expected in answer["error"]["message"], (path, answer)
        # The same connection still serves a good request.
        code, answer = _raw_http(sock, "POST", "/v1/messages/calm/v1/3", h, AT_LIMIT)
        assert code == 201, answer
    assert status(target)["counters"]["refused"]["invalid_payload"] == before + len(cases)


def test_deep_admin_bodies_and_arguments_are_refused(target, bystander):
    key = keyfiles.load_private(target.admin_key)
    h = {"Authorization": f"Bearer {make_token('admin', key, 'minou', ttl=600)}"}
    with minou.connect_sync(target.url, **target.auth("rotated")):
        pass
    with httpx.Client(base_url=target.http, timeout=10, headers=h) as http:
        for body in (b'{"public_key": ' + DEEP + b"}", NOT_UTF8):
            r = http.post("/v1/clients/rotated/rotate", content=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["reason"] == "invalid_payload"
        assert http.get("/v1/whoami").status_code == 200
    # Native ADMIN arguments are scalars: a nested value is refused, not walked.
    peer = RawPeer(target.url)
    peer.write(f.encode(f.Hello("admin", 1, make_token("admin", key, "minou"))))
    assert isinstance(peer.read(), f.Welcome)
    args = b"\x81\xa7channel" + b"\x91" * 900 + b"\xc0"  # {"channel": [[[...None...]]]}
    body = b"\x93\x05\xa4list" + args
    peer.write(struct.pack(">IB", len(body) + 1, f.FrameType.ADMIN) + body)
    err = peer.read()
    assert isinstance(err, f.Error) and err.code == ErrorCode.BAD_REQUEST, err
    assert "admin argument 'channel' must be a string" in err.message
    peer.close()


def test_deep_and_bad_stream_messages_are_refused_and_the_stream_goes_on(target, bystander):
    h = _bearer(target, "deep-stream")
    before = status(target)["counters"]["refused"].get("invalid_payload", 0)
    url = target.http.replace("http://", "ws://") + "/v1/stream"
    with wsc.connect(url, additional_headers=h, max_size=None) as ws:
        ws.send(DEEP.decode())
        error = json.loads(ws.recv(5))
        assert error["type"] == "error" and error["reason"] == "invalid_payload", error
        assert "stream message nests arrays and objects 50000 deep; the limit is 64" \
            in error["message"]
        ws.send('{"op": "publish", "channel": "calm/v1/1", "payload": ' + OVER.decode() + "}")
        error = json.loads(ws.recv(5))
        assert error["reason"] == "invalid_payload", error
        ws.send(json.dumps({"op": "publish", "channel": "calm/v1/4", "payload": {"ok": 1},
                            "ref": "good"}))
        published = json.loads(ws.recv(5))
        assert published["type"] == "published" and published["ref"] == "good", published
    assert status(target)["counters"]["refused"]["invalid_payload"] == before + 2


def test_text_frames_that_are_not_utf8_close_with_1007_and_no_traceback(target, bystander):
    # RFC 6455 says to fail such a connection (1007); uvicorn did, but logged a
    # traceback for each one, which any client could fill the log with.
    h = _bearer(target, "utf8-stream")
    before = status(target)["counters"]["refused"].get("invalid_payload", 0)
    for path, headers in (("/v1/stream", h), ("/v1/ws", {})):
        with raw_websocket(target.http, path, headers) as sock:
            sock.settimeout(5)
            sock.sendall(ws_frame(b'{"op": "caf\xe9"}', opcode=1))
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        assert data[0] == 0x88, data  # a close frame, with code 1007
        assert struct.unpack_from("!H", data, 2)[0] == 1007, data
    assert status(target)["counters"]["refused"]["invalid_payload"] == before + 2
