"""The HTTP protocol's fast path (server/http_fast.py) over a fake transport: raw
HTTP/1.1 bytes in, the response bytes out, as uvicorn tests its protocols."""

from __future__ import annotations

import json
import logging
from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minou.errors import ErrorCode
from minou.server.http_consumers import HttpConsumers
from minou.server.http_fast import query_params

from .conftest import Harness, post

pytestmark = pytest.mark.anyio

CH = "orders/v1/1"
TOKEN = "t" * 32


async def test_a_publish_is_answered_201_once_committed(broker: Harness, http) -> None:
    peer = http(broker)
    assert broker.server.admission.stats()["open"]["http"] == 1
    broker.storage.hold()
    peer.send(post(f"/v1/messages/{CH}?priority=3", b'{"total": 12.5}',
                   "X-Minou-Header-Trace: abc"))
    await broker.storage.writer_held()
    assert peer.transport.data == b""  # nothing is answered before the commit
    broker.storage.release()

    status, headers, body = await peer.response()
    assert status == 201
    assert headers["content-type"] == "application/json"
    assert headers["x-content-type-options"] == "nosniff"  # the security headers
    assert "connection" not in headers  # kept alive
    assert body == {"channel": CH, "seq": 1, "id": body["id"], "duplicate": False,
                    "fanout": 1}
    [stored] = broker.storage.stored(CH)
    assert (stored.id, stored.data, stored.priority, stored.headers) == \
        (body["id"], b'{"total": 12.5}', 3, {"trace": "abc"})
    assert peer.transport.writes == 1  # head and body in one write

    peer.send(post(f"/v1/messages/{CH}", b'{"total": 2}'))  # the same connection goes on
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 2)


async def test_pipelined_publishes_are_answered_in_order(broker: Harness, http) -> None:
    peer = http(broker)
    peer.send(post(f"/v1/messages/{CH}", b'{"n": 1}') + post(f"/v1/messages/{CH}", b'{"n": 2}'))
    first, second = await peer.response(), await peer.response()
    assert [(first[0], first[2]["seq"]), (second[0], second[2]["seq"])] == [(201, 1), (201, 2)]


async def test_a_body_over_the_message_limit_is_refused_413_before_it_all_arrives(
        make_server, http) -> None:
    broker = await make_server(max_message_size=100)
    peer = http(broker)
    # 1000 bytes announced, 150 sent: past the limit already.
    peer.send(post(f"/v1/messages/{CH}", b"x" * 150, length=1000))
    status, headers, body = await peer.response()
    assert status == 413
    assert headers["connection"] == "close"
    assert body["error"]["code"] == ErrorCode.MESSAGE_TOO_LARGE
    assert body["error"]["reason"] == "message_too_large"
    assert body["error"]["detail"] == {"limit": 100}
    # The rest of the body is read and dropped while the connection lingers.
    assert peer.protocol.closing and not peer.transport.closed
    peer.send(b"x" * 850 + post(f"/v1/messages/{CH}", b"{}"))
    assert peer.responses() == []
    assert broker.storage.stored(CH) == [] and CH not in broker.server.core.channels
    assert broker.server.core.counters.as_dict()["refused"]["message_too_large"] == 1


async def test_a_body_at_the_limit_is_published(make_server, http) -> None:
    broker = await make_server(max_message_size=100)
    peer = http(broker)
    payload = b'"' + b"x" * 98 + b'"'
    peer.send(post(f"/v1/messages/{CH}", payload))
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 1)


async def test_a_batch_publish_answers_one_outcome_per_message(broker: Harness, http) -> None:
    peer = http(broker)
    batch = [{"channel": CH, "payload": {"n": 1}}, {"channel": "bad", "payload": 2}]
    peer.send(post("/v1/messages", json.dumps(batch).encode()))
    status, _, body = await peer.response()
    assert status == 200
    ok, refused = body["results"]
    assert (ok["channel"], ok["seq"]) == (CH, 1)
    assert refused["error"]["code"] == ErrorCode.INVALID_CHANNEL


async def test_a_publish_without_a_bearer_is_refused_401(make_server, http) -> None:
    broker = await make_server(auth_mode="token", broker_token=TOKEN)
    peer = http(broker)
    peer.send(post(f"/v1/messages/{CH}", b"{}"))
    status, headers, body = await peer.response()
    assert status == 401
    assert headers["www-authenticate"] == 'Bearer realm="minou"'
    assert body["error"]["detail"]["why"] == "no_token"
    # Refused at its headers, its body not waited for: the connection is closed.
    assert headers["connection"] == "close"

    peer = http(broker)
    peer.send(post(f"/v1/messages/{CH}", b"{}", f"Authorization: Bearer {TOKEN}"))
    status, _, body = await peer.response()
    assert (status, body["seq"]) == (201, 1)


async def test_each_pipelined_request_is_checked_with_its_own_token(make_server,
                                                                   http) -> None:
    """The identity checked at a request's headers serves that request only: one that
    follows in the same read, with no body (not checked at its headers), is checked
    with its own token when it runs."""
    broker = await make_server(auth_mode="token", broker_token=TOKEN)
    peer = http(broker)
    refused_now = post(f"/v1/messages/{CH}", b"{", f"Authorization: Bearer {TOKEN}")
    ack = post("/v1/ack/1.2.3", b"", "Authorization: Bearer wrong")
    peer.send(refused_now + ack)
    (first, _, _), (second, headers, body) = peer.responses()  # both answered at once
    assert first == 400  # bad JSON, so the ack runs as a hot request too
    assert (second, json.loads(body)["error"]["detail"]["why"]) == (401, "bad_broker_token")
    # The refusal's own header, then the security headers, as on every answer
    assert headers["www-authenticate"] == 'Bearer realm="minou"'
    assert headers["x-content-type-options"] == "nosniff"
    assert int(headers["content-length"]) == len(body)


async def test_a_connection_publishes_to_each_url_it_names(broker: Harness, http) -> None:
    """The route of a URL is parsed once per connection and kept while the URL is the
    same: a different one is routed anew."""
    peer = http(broker)
    other = "orders/v1/2"
    for channel, n in [(CH, 1), (CH, 2), (other, 3), (f"{other}?priority=7", 4), (CH, 5)]:
        peer.send(post(f"/v1/messages/{channel}", b'{"n": %d}' % n))
        status, _, body = await peer.response()
        assert (status, body["channel"]) == (201, channel.split("?")[0])
    assert [m.data for m in broker.storage.stored(CH)] == [b'{"n": 1}', b'{"n": 2}',
                                                          b'{"n": 5}']
    assert [(m.data, m.priority) for m in broker.storage.stored(other)] == [
        (b'{"n": 3}', 0), (b'{"n": 4}', 7)]


async def test_a_consumer_connection_consumes_and_acks_in_turn(broker: Harness, http) -> None:
    """Consumes and acks alternate on one connection, each answered for its own
    message; an ack's URL (a receipt, used once) does not displace the consume's as
    the route the connection keeps."""
    broker.server.http_consumers = HttpConsumers(broker.server)  # as the listener does
    peer = http(broker)
    for n in (1, 2):
        peer.send(post(f"/v1/messages/{CH}", b'{"n": %d}' % n))
        assert (await peer.response())[0] == 201
    consume = f"/v1/consume/{CH}?group=g&wait=1"
    for n in (1, 2):
        peer.send(post(consume, b""))
        status, _, body = await peer.response()
        assert (status, body["payload"]) == (200, {"n": n})
        peer.send(post(f"/v1/ack/{body['receipt']}", b""))
        status, _, _ = await peer.response()
        assert status == 200
        assert peer.protocol._hot_url == consume.encode()
    peer.send(post(consume, b""))
    assert (await peer.response())[0] == 204  # both acked: nothing left


async def test_answers_carry_the_current_default_headers(broker: Harness, http) -> None:
    """Hot answers' heads are made once and kept until uvicorn's default headers
    change (its date header, each second)."""
    peer = http(broker)
    state = peer.protocol.server_state
    for date in (b"Mon, 30 Nov 2026 19:00:00 GMT", b"Mon, 30 Nov 2026 19:00:01 GMT"):
        state.default_headers = [(b"date", date), (b"server", b"minou")]
        for n in range(2):
            peer.send(post(f"/v1/messages/{CH}", b"[%d]" % n))
            status, headers, body = await peer.response()
            assert (status, headers["date"], headers["server"]) == (201, date.decode(),
                                                                   "minou")
            assert headers["x-content-type-options"] == "nosniff"
            assert int(headers["content-length"]) == len(json.dumps(body,
                                                                    separators=(",", ":")))
    peer.send(post(f"/v1/messages/{CH}", b"[9]", "Connection: close"))
    status, headers, _ = await peer.response()
    assert (status, headers["connection"]) == (201, "close")


async def test_uvicorn_logs_through_the_brokers_logging(broker: Harness, http) -> None:
    """uvicorn's own logging setup would give its loggers their own handlers and
    format; the listener leaves them to propagate to the broker's."""
    http(broker)  # builds the listener's configuration, as start_http does
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        assert logger.handlers == [] and logger.propagate, name
    assert logging.getLogger("uvicorn.error").getEffectiveLevel() == logging.WARNING
    assert not logging.getLogger("uvicorn.access").propagate  # access_log=False: none


@given(st.lists(st.tuples(st.text("ab=&%+2;x ", max_size=4), st.text("ab=&%+2;x ", max_size=4)),
                max_size=5).map(lambda kv: "&".join(f"{k}={v}" if v else k for k, v in kv))
       | st.text("ab=&%+20;x ", max_size=12))
def test_query_params_are_parse_qsl_s(query: str) -> None:
    """The hot routes' query parser answers as the stdlib's (the routes on Starlette's
    path read queries with it), fast path or not."""
    expected = dict(parse_qsl(query, keep_blank_values=True))
    assert query_params(query.encode("latin-1")) == expected
