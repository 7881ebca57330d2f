"""OFFSETS with ``at`` (a Spark starting timestamp over many channels) costs the event
loop a match of every channel and the reader thread a lookup of each: one client may
have max_offsets_at_per_client (a setting, 4 by default) of them being answered at once over all its
connections. Past it the request is refused at once, precisely and counted; the
client's others and every other client are answered as before, and its slots come
back whatever ends a lookup. Real broker, raw sockets."""

from __future__ import annotations

import json
import time

import minou
from minou.errors import ErrorCode
from minou.protocol import frames as f

from ..conftest import RawPeer, wait_until

BOUND = 4  # max_offsets_at_per_client's default, written out: what a client is told
CHANNELS = 20_000  # enough that a lookup is still going when the last request comes
PATTERN = "bound/*"


def _make_channels(broker) -> None:
    writer = RawPeer(broker.url)
    try:
        writer.hello("writer")
        writer.sock.settimeout(120)
        for lo in range(0, CHANNELS, 5_000):
            writer.write(f.encode(f.Publish(lo + 1, [f.Send(f"bound/v1/c{i}", b"1")
                                                     for i in range(lo, lo + 5_000)])))
            assert isinstance(writer.read(), f.Confirm)
    finally:
        writer.close()


def _peers(broker, client: str, count: int) -> list[RawPeer]:
    peers = []
    for _ in range(count):
        peer = RawPeer(broker.url)
        peers.append(peer)
        peer.hello(client)
        peer.sock.settimeout(120)
    return peers


def _ask(peer: RawPeer, count: int, since: float) -> None:
    """``count`` OFFSETS-at written at once (a connection has 4 answered at a time:
    READS_PER_CONNECTION; more would wait, not be refused)."""
    peer.write(b"".join(f.encode(f.Offsets(req, [PATTERN], at=since))
                        for req in range(1, count + 1)))


def _answered_whole(frame: f.Frame) -> bool:
    """Every channel, each with its one message published after ``since``."""
    return isinstance(frame, f.Result) and len(frame.value) == CHANNELS and \
        all(v == [1, 2, 1] for v in frame.value.values())


def _refusals(admin) -> int:
    return int(admin.admin("status")["counters"]["refused"].get("too_many_connections", 0))


def test_one_client_has_only_so_many_offsets_at_at_once_over_its_connections(broker):
    """Three connections of one client send 4 each at once: 12 lookups of 20,000
    channels, each ~70 ms of the loop at 50,000 (20 held every other client's PING
    ~1.2 s). Those past 4 are refused before any work; the rest answer in full, as
    does another client asking meanwhile; once answered the slots are free again."""
    _make_channels(broker)
    since = time.time() - 3600
    greedy = _peers(broker, "greedy", 3)
    other = _peers(broker, "other", 1)[0]
    fourth: list[RawPeer] = []
    admin = minou.connect_sync(broker.url, **broker.admin_auth())
    try:
        before = _refusals(admin)
        for peer in greedy:
            _ask(peer, BOUND, since)
        _ask(other, 1, since)
        answers = [peer.read() for peer in greedy for _ in range(BOUND)]
        refused = [a for a in answers if isinstance(a, f.Error)]
        assert refused, "12 lookups of one client at once, none refused"
        for error in refused:
            assert error.code == ErrorCode.TOO_MANY_CONNECTIONS and not error.fatal
            assert "client 'greedy' has 4 OFFSETS requests with at being answered" in \
                error.message
            assert "max_offsets_at_per_client" in error.message
            assert error.detail["limit"] == BOUND and error.detail["client"] == "greedy"
        answered = [a for a in answers if not isinstance(a, f.Error)]
        assert len(answered) >= BOUND and all(_answered_whole(a) for a in answered)
        assert _answered_whole(other.read())  # another client: not refused, answered
        assert _refusals(admin) - before == len(refused)
        wait_until(lambda: "client 'greedy' refused: it has 4 OFFSETS lookups with at being "
                   "answered, the limit (max_offsets_at_per_client)" in broker.output,
                   what="the refusal logged")
        # All answered: the client's slots are free, over connections as before (a
        # refusal is not fatal: the connections refused go on).
        fourth += _peers(broker, "greedy", 1)
        for peer in greedy + fourth:
            _ask(peer, 1, since)
        assert all(_answered_whole(peer.read()) for peer in greedy + fourth)
    finally:
        admin.close()
        for peer in greedy + fourth + [other]:
            peer.close()


def test_the_lookups_of_a_connection_that_goes_give_their_slots_back(broker):
    """A client whose connection goes with 4 lookups being answered, back at once on
    new connections (a restarted Spark driver), is answered: the lookups are given up
    with their connection (nobody is there to read them), not finished first."""
    _make_channels(broker)
    since = time.time() - 3600
    gone = _peers(broker, "flaky", 1)[0]
    _ask(gone, BOUND, since)
    gone.close()  # after the requests (read first), while they are looked up
    back = _peers(broker, "flaky", BOUND)  # each HELLO answered: the close was seen
    try:
        for peer in back:
            _ask(peer, 1, since)
        answers = [peer.read() for peer in back]
        assert [a for a in answers if isinstance(a, f.Error)] == []
        assert all(_answered_whole(a) for a in answers)
    finally:
        for peer in back:
            peer.close()



def _ready_frames(peer: RawPeer) -> list[f.Frame]:
    """The frames already arrived on ``peer``'s socket, without waiting for more."""
    peer.sock.setblocking(False)
    try:
        while True:
            try:
                data = peer.sock.recv(65536)
            except BlockingIOError:
                break
            if not data:
                break
            peer.reader.receive_data(data)
    finally:
        peer.sock.setblocking(True)
    frames = []
    while (ev := peer.reader.next_event()) is not None:
        frames.append(ev)
    return frames


def test_plain_offsets_over_many_channels_are_matched_between_other_work(broker):
    """OFFSETS with a wildcard (no ``at``) over more channels than one slice
    (OFFSETS_MATCH_SLICE) are matched a slice a turn of the event loop, as those with
    ``at``: another client's PING, sent once the first of 50 pipelined ones is
    answered, is answered while the rest are still being matched (whole, each held the
    loop for its whole match: 50 over 50,000 channels held every other client ~3.5 s,
    and that PING came after the 50th answer). They are not refused per client (a
    reader asks one at every batch); a connection takes 4 at a time. A pattern that
    matches nothing still tries every channel: small answers, which arrive in the
    order they are written."""
    _make_channels(broker)
    asker, pinger = _peers(broker, "plain", 1)[0], _peers(broker, "pinger", 1)[0]
    try:
        count = 50
        asker.write(b"".join(f.encode(f.Offsets(req, ["nothing/*"]))
                             for req in range(1, count + 1)))
        assert asker.read() == f.Result(1, {})
        pinger.write(f.encode(f.Ping(7)))
        assert pinger.read() == f.Pong(7)
        already = _ready_frames(asker)  # answers written before the PONG was
        rest = [asker.read() for _ in range(count - 1 - len(already))]
    finally:
        asker.close()
        pinger.close()
    assert sorted(fr.req for fr in already + rest) == list(range(2, count + 1))
    assert all(fr.value == {} for fr in already + rest)
    assert len(already) < count - 1, "the PING waited for every OFFSETS match"


def _pipelined(peer: RawPeer, count: int, since: float) -> list[f.Frame]:
    """``count`` OFFSETS-at (at most READS_PER_CONNECTION, so none waits its turn on
    the connection) in one write: read in one go, each takes its client's slot before
    any can be answered; their answers, by request."""
    _ask(peer, count, since)
    return sorted((peer.read() for _ in range(count)), key=lambda fr: fr.req)


def test_the_bound_per_client_is_a_setting_a_reload_moves(broker_factory, tmp_path):
    """Many Spark queries planned at once under one identity need more than 4:
    ``max_offsets_at_per_client`` sets it (refusals name it), a reload moves it on a
    running broker, from the next request, and a bad value is refused by the reload
    precisely with nothing changed."""
    from ..conftest import OPEN_RULES
    from .test_reload import minou_cli

    cfg = tmp_path / "lookups.toml"
    cfg.write_text("max_offsets_at_per_client = 1\n" + OPEN_RULES)
    b = broker_factory.make(config=cfg).start()
    writer = RawPeer(b.url)
    writer.hello("writer")
    writer.write(f.encode(f.Publish(1, [f.Send(f"bound/v1/c{i}", b"1") for i in range(2_000)])))
    assert isinstance(writer.read(), f.Confirm)
    writer.close()
    since = time.time() - 3600
    peer = _peers(b, "planner", 1)[0]

    def refused_at(count: int, limit: int) -> None:
        *answered, last = _pipelined(peer, count, since)
        assert all(isinstance(a, f.Result) and len(a.value) == 2_000 for a in answered)
        assert isinstance(last, f.Error) and last.code == ErrorCode.TOO_MANY_CONNECTIONS, last
        assert not last.fatal and last.detail["limit"] == limit
        assert f"a client may have {limit} at once (max_offsets_at_per_client)" in last.message

    try:
        refused_at(2, 1)
        cfg.write_text("max_offsets_at_per_client = 3\n" + OPEN_RULES)
        out = minou_cli(b, "reload", "--json")
        assert out.returncode == 0, out.stderr
        assert "max_offsets_at_per_client" in json.loads(out.stdout)["changed"]
        answers = _pipelined(peer, 3, since)  # the same connection: three at once now
        assert [type(a) for a in answers] == [f.Result] * 3, answers
        refused_at(4, 3)
        cfg.write_text("max_offsets_at_per_client = 0\n" + OPEN_RULES)
        out = minou_cli(b, "reload", "--json")
        assert out.returncode != 0
        assert "max_offsets_at_per_client: expected an integer >= 1 and <= 1000, got 0" in \
            out.stdout + out.stderr
        refused_at(4, 3)  # nothing changed
    finally:
        peer.close()
