"""Request/reply in the core (core/replies.py): a request needs a responder and the
requester's own inbox; a reply into another's inbox needs the request's delivery on
the replying session; the broker stores one reply per request and marks a request
delivered again after it."""

from __future__ import annotations

from typing import Any

import pytest

from minou.auth.rules import Rules
from minou.core.broker import Session
from minou.core.replies import reply_token
from minou.errors import BadRequest, NotAuthorized
from minou.names import (
    CORRELATION_ID,
    REPLIED,
    REPLY_TO,
    REPLY_TOKEN,
    REQUEST_ID,
    inbox_of,
    inbox_owner,
)
from minou.protocol.frames import Outcome

from .helpers import Harness, send

INBOX = inbox_of("asker", "i1")


def publish(h: Harness, session: Session, channel: str, value: Any = None,
            **headers: str) -> Outcome:
    out = h.engine.publish([send(channel, value, headers=headers or None)],
                           session.access, h._replied, session=session, publisher=h)
    h.commit()
    return out[0]


def request(h: Harness, asker: Session, channel: str = "q/v1/1", **extra: str) -> Outcome:
    return publish(h, asker, channel, {"n": 1}, **{REPLY_TO: INBOX, CORRELATION_ID: "c1",
                                                   **extra})


def served() -> tuple[Harness, Session, Session, Any]:
    h = Harness()
    asker, worker = Session("asker"), Session("worker")
    sub = h.subscribe(worker, patterns="q/v1/*", group="workers", prefetch=5)
    return h, asker, worker, sub


def test_inbox_names_encode_the_client_and_split_at_the_bang() -> None:
    assert inbox_of("a b!c", "x") == "_inbox/v1/a%20b%21c!x"
    assert inbox_owner("_inbox/v1/a%20b%21c!x") == "a b!c"
    assert inbox_owner("_dead/_inbox/v1/a%20b%21c") == "a b!c"
    assert inbox_owner("_inbox/v1/c!x!y") == "c"  # the first bang: an instance may hold one
    # A "/" is escaped too (ids registered before "/" was refused in new ones)
    assert inbox_of("team/a", "x") == "_inbox/v1/team%2Fa!x"
    assert inbox_owner("_inbox/v1/team%2Fa!x") == "team/a"
    assert inbox_owner("_inbox/v1/*") is None
    assert inbox_owner("_inbox/v2/a") is None
    assert inbox_owner("orders/v1/a") is None


def test_a_request_needs_someone_serving_its_channel() -> None:
    h = Harness()
    asker = Session("asker")
    out = request(h, asker)
    assert (out.code, out.error) == (214, "no consumer or listener is connected to 'q/v1/1': "
                                          "nobody would answer the request (nothing was stored)")
    assert "q/v1/1" not in h.broker.channels
    # A group whose members left serves nobody; a listener does.
    listener = Session("l")
    sub = h.subscribe(listener, kind="listen", patterns="q/v1/1")
    assert request(h, asker).code == 0
    h.engine.unsubscribe(listener, sub.sid)
    assert request(h, asker).code == 214
    h.subscribe(Session("w"), patterns="q/v1/*", group="g")
    assert request(h, asker).code == 0


@pytest.mark.parametrize(("headers", "code", "text"), [
    ({REPLY_TO: inbox_of("someone-else", "i")}, 208, "must be an inbox of the requester"),
    ({REPLY_TO: "q/v1/1"}, 208, "must be an inbox of the requester"),
    ({REPLY_TO: INBOX, CORRELATION_ID: ""}, 200, "needs a x-correlation-id header"),
    ({REPLY_TO: "_inbox/v1/asker!" + "x" * 300}, 201, "characters, the limit is 255"),
])
def test_a_request_names_an_inbox_of_its_own_and_a_correlation_id(
        headers: dict[str, str], code: int, text: str) -> None:
    h, asker, _, _ = served()
    out = publish(h, asker, "q/v1/1", 1, **{CORRELATION_ID: "c", **headers})
    assert out.code == code and text in out.error, out


def test_requests_go_to_one_channel_never_to_an_inbox_or_a_pattern() -> None:
    h, asker, _, _ = served()
    h.subscribe(Session("asker"), 2, kind="listen", patterns=INBOX)
    assert "a request goes to one channel" in request(h, asker, "q/v1/*").error
    out = publish(h, asker, INBOX, 1, **{REPLY_TO: INBOX, CORRELATION_ID: "c"})
    assert "a request cannot go to an inbox" in out.error


def test_a_reply_brings_back_the_token_its_request_was_delivered_with() -> None:
    h, asker, worker, sub = served()
    assert request(h, asker).code == 0
    assert REPLY_TOKEN not in h.broker.channels["q/v1/1"].cache[1].headers  # not stored
    [req] = h.take(sub)
    token = req.headers[REPLY_TOKEN]
    assert token == reply_token(h.broker.state.reply_secret, INBOX, "c1", req.id)
    good = {CORRELATION_ID: "c1", REQUEST_ID: req.id, REPLY_TOKEN: token}
    for headers in ({**good, REPLY_TOKEN: token[:-1] + ("0" if token[-1] != "0" else "1")},
                    {**good, CORRELATION_ID: "c2"}, {**good, REQUEST_ID: "x"},
                    {**good, REQUEST_ID: ""}, {CORRELATION_ID: "c1", REQUEST_ID: req.id}):
        out = publish(h, worker, INBOX, "no", **headers)
        assert (out.code, out.error) == (208, (
            f"{INBOX!r} is another client's inbox: only a reply to a request delivered to "
            "you may go there (x-request-id, x-correlation-id and x-reply-token as the "
            "request's delivery had them)")), headers
    # The token is the right, whoever brings it (another broker, an HTTP consumer).
    out = publish(h, Session("other"), INBOX, "yes", **good)
    assert out.code == 0
    stored = h.broker.channels[INBOX].cache[out.seq]
    assert stored.headers == {CORRELATION_ID: "c1", REQUEST_ID: req.id}  # no token
    # A second reply to the same request is the same message (the dedup key).
    again = publish(h, worker, INBOX, "again", **good)
    assert (again.duplicate, again.seq) == (True, out.seq)
    # Another broker's secret makes other tokens.
    other = Harness()
    assert reply_token(other.broker.state.reply_secret, INBOX, "c1", req.id) != token


def test_a_client_writes_its_own_inboxes_and_a_transaction_none() -> None:
    h = Harness()
    asker = Session("asker")
    assert publish(h, asker, inbox_of("asker", "other"), 1).code == 0
    # STAGE checks each send with Publishing.validate, which refuses both.
    with pytest.raises(BadRequest, match="not staged in a transaction") as refused:
        h.broker.publishing.validate(send(INBOX, 1), asker.access)
    assert refused.value.detail == {"channel": INBOX}
    with pytest.raises(BadRequest, match="not staged in a transaction") as refused:
        h.broker.publishing.validate(send("q/v1/1", 1, headers={REPLY_TO: INBOX}),
                                     asker.access)
    assert refused.value.detail == {"channel": "q/v1/1"}


def test_a_request_answered_and_delivered_again_is_marked_at_once() -> None:
    h, asker, worker, sub = served()
    request(h, asker)
    [req] = h.take(sub)
    publish(h, worker, INBOX, "done", **{CORRELATION_ID: "c1", REQUEST_ID: req.id,
                                         REPLY_TOKEN: req.headers[REPLY_TOKEN]})
    h.nack(worker, [req])  # the ack was lost: the second delivery says it was answered
    [again] = h.take(sub)
    assert (again.attempts, again.headers[REPLIED]) == (2, "1")


def test_a_request_delivered_again_after_its_reply_is_marked() -> None:
    h, asker, worker, sub = served()
    request(h, asker)
    [req] = h.take(sub)
    assert REPLIED not in req.headers
    h.nack(worker, [req])  # not answered yet: delivered again, unmarked
    [again] = h.take(sub)
    assert again.attempts == 2 and REPLIED not in again.headers
    publish(h, worker, INBOX, "done", **{CORRELATION_ID: "c1", REQUEST_ID: again.id,
                                         REPLY_TOKEN: again.headers[REPLY_TOKEN]})
    h.nack(worker, [again])  # answered, the ack lost: marked
    [third] = h.take(sub)
    assert third.attempts == 3 and third.headers[REPLIED] == "1"
    # Past the dedup window the mark goes (the reply may be gone too).
    h.nack(worker, [third])
    h.tick(h.broker.state.dedup_window + 1)
    [fourth] = h.take(sub)
    assert REPLIED not in fourth.headers


RULES = Rules.parse([{"client": "asker", "read": ["q/*"], "write": ["q/v1/1"]},
                     {"client": "worker", "read": ["q/*"], "write": []}])


def test_requests_and_headers_keep_the_write_rules_replies_need_none() -> None:
    """Over HTTP there is no session: the client id comes from the rules' access."""
    h, _, worker, sub = served()
    asker = RULES.for_client("asker")
    refs = {REPLY_TO: INBOX, CORRELATION_ID: "c1"}

    def over_http(channel: str, **headers: str) -> Outcome:
        out = h.engine.publish([send(channel, 1, headers=headers)], asker, h._replied)
        h.commit()
        return out[0]

    assert over_http("q/v1/1", **refs).code == 0  # a request by the rules' client id
    assert over_http("q/v1/2", **refs).code == 208  # a request the rules forbid
    assert over_http("q/v1/2", trace="t").code == 208  # any headers: still the rules
    # A responder whose rules let it write nothing answers with the token alone.
    [req] = h.take(sub)
    worker.access = RULES.for_client("worker")
    good = {CORRELATION_ID: "c1", REQUEST_ID: req.id, REPLY_TOKEN: req.headers[REPLY_TOKEN]}
    out = h.engine.publish([send(INBOX, "over http", headers=good)],  # no session either
                           RULES.for_client("worker"), h._replied)[0]
    h.commit()
    assert out.code == 0, out
    assert publish(h, worker, INBOX, "again", **good).duplicate


def test_the_engine_hands_a_committed_reply_to_whoever_waits_for_it() -> None:
    """HTTP's POST /v1/request waits in Engine.reply_waiters, by (inbox, correlation)."""
    h, asker, worker, sub = served()
    got: list[Any] = []
    h.engine.reply_waiters[(INBOX, "c1")] = got.append
    h.engine.reply_waiters[(INBOX, "other")] = lambda m: got.append(("wrong", m))
    request(h, asker)
    [req] = h.take(sub)
    assert got == []  # the request itself is no reply
    out = publish(h, worker, INBOX, "yes", **{CORRELATION_ID: "c1", REQUEST_ID: req.id,
                                              REPLY_TOKEN: req.headers[REPLY_TOKEN]})
    assert [m.id for m in got] == [out.id]
    assert list(h.engine.reply_waiters) == [(INBOX, "other")]  # answered once, gone
    publish(h, asker, "q/v1/1", 1, **{CORRELATION_ID: "other"})  # not an inbox: nothing
    # The owner's own writes to its inbox, with no headers or another id: nothing either.
    assert publish(h, asker, INBOX, "no headers").code == 0
    assert publish(h, asker, INBOX, "x", **{CORRELATION_ID: "nobody"}).code == 0
    assert len(got) == 1 and list(h.engine.reply_waiters) == [(INBOX, "other")]


def test_no_one_reads_another_clients_inbox_or_a_pattern_over_inboxes() -> None:
    h = Harness()
    admin = Session("root", admin=True)
    for who, pattern in ((Session("mallory"), INBOX), (admin, INBOX),
                         (Session("asker"), "_inbox/v1/*"), (admin, "_dead/" + INBOX)):
        with pytest.raises(NotAuthorized) as refused:
            h.subscribe(who, kind="listen", patterns=pattern)
        assert refused.value.detail == {"channel": pattern}
        assert refused.value.message == (
            f"{pattern!r} reads inboxes: client {who.client_id!r} may read only its own, "
            f"by name (_inbox/v1/{who.client_id}!<instance>)")
    h.subscribe(Session("asker"), kind="listen", patterns=INBOX)  # its owner, by name


def test_an_admin_member_of_a_group_never_gets_another_clients_inbox() -> None:
    """A client may read its own inbox in a consumer group, but not one an admin is a
    member of: the group would hand the admin the inbox's messages (refused the other
    way round too, and with a member of any other client)."""
    h = Harness()
    admin, asker = Session("root", admin=True), Session("asker")
    h.subscribe(admin, patterns="q/v1/1", group="g", prefetch=10)
    with pytest.raises(NotAuthorized) as refused:
        h.subscribe(asker, patterns=["q/v1/1", INBOX], group="g", prefetch=10)
    assert refused.value.detail == {"group": "g", "pattern": INBOX}
    sub = h.subscribe(asker, 2, patterns=["q/v1/1"], group="g", prefetch=10)
    with pytest.raises(NotAuthorized):
        h.broker.add_pattern(asker, sub.sid, INBOX, h.now)
    assert [p.text for p in sub.group.patterns] == ["q/v1/1"]
    own = h.subscribe(asker, 3, patterns=["q/v1/2", INBOX], group="mine", prefetch=10)
    assert publish(h, asker, INBOX, "for me").code == 0
    assert [d.channel for d in h.take(own)] == [INBOX]


def test_one_clients_inboxes_are_a_tenth_of_max_channels_and_go_back_as_they_go() -> None:
    """No rule bounds a client's own inboxes (any instance name): a tenth of
    max_channels is its share, refused past it to whoever would make one more (its
    own publish or listen; a request naming a new one, to the requester), while the
    inboxes it holds go on; one that expires gives its place back."""
    from minou.core.log import ChannelOptions
    from minou.errors import QueueFull

    h, asker, _, _ = served()
    h.broker.max_channels = 30  # a share of 3
    for n in range(3):
        assert publish(h, asker, inbox_of("asker", str(n)), n).code == 0
    out = publish(h, asker, inbox_of("asker", "3"), 3)
    assert out.code and "client 'asker' holds 3 inboxes and may hold 3" in out.error
    assert publish(h, asker, inbox_of("asker", "0"), "again").code == 0  # it has this one
    assert publish(h, Session("other"), inbox_of("other", "0"), 1).code == 0  # others' own
    with pytest.raises(QueueFull, match="inboxes"):
        h.subscribe(asker, kind="listen", patterns=inbox_of("asker", "4"))
    out = publish(h, asker, "q/v1/1", {"n": 1}, **{REPLY_TO: inbox_of("asker", "5"),
                                                   CORRELATION_ID: "c"})
    assert out.code and "inboxes" in out.error and "q/v1/1" not in h.broker.state.channels
    assert request(h, asker, **{REPLY_TO: inbox_of("asker", "1")}).code == 0  # one it has
    # One of its inboxes goes (idle): its place comes back.
    log = h.broker.state.channels[inbox_of("asker", "2")]
    log.options = ChannelOptions(expire_idle=1.0)
    h.broker.state.track_expiry(log, h.now)
    h.now += 5
    h.broker.expiry.remove(log)
    assert h.broker.state.inboxes["asker"] == 2
    assert publish(h, asker, inbox_of("asker", "3"), 3).code == 0
