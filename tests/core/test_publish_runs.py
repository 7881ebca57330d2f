"""A frame's run of plain sends to one channel is staged at once (``_publish_run``), and a
commit's run of plain messages of one channel made visible at once (``_commit_run``):
the outcomes, the staged messages, the pending batch, what the commit makes visible and
every state must be exactly those the one-by-one paths give. Hypothesis drives both
paths with the same frames (any mix of plain and other sends, bad payloads, refused
channels, full channels, broken producer sequences) and compares everything they leave
behind."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from minou.auth.rules import ALLOW_ALL, Access
from minou.core.broker import Broker, Session
from minou.core.log import ChannelOptions
from minou.core.publishing import MAX_PSEQ
from minou.errors import StorageFull
from minou.protocol.frames import Send
from minou.schemas import compile_schema

PLAIN, OTHER = "plain/v1/a", "plain/v1/b"
SMALL_REFUSE, SMALL_DROP = "small/v1/r", "small/v1/d"
WITH_SCHEMA, BARRED, BROADCAST = "typed/v1/1", "barred/v1/1", "plain/v1/*"
CHANNELS = [PLAIN, OTHER, SMALL_REFUSE, SMALL_DROP, WITH_SCHEMA, BARRED, BROADCAST,
            "bad name", "_kv/v1/orders/x", "_inbox/v1/x"]
MAX_SIZE = 64
SCHEMA = compile_schema({"type": "string"}, key="typed/v1")


def _options(key: str) -> ChannelOptions:
    if key == "small/v1":
        return ChannelOptions(max_items=5)
    if key == "typed/v1":
        return ChannelOptions(schema=SCHEMA, ttl=30.0)
    return ChannelOptions(ttl=60.0 if key == "plain/v1" else None)


def _broker(bulk: bool) -> tuple[Broker, Session, Access]:
    b = Broker(channel_options=_options, max_message_size=MAX_SIZE)
    b.publishing.bulk = b.commits.bulk = bulk
    b.state.producers.max_states = 3  # states evicted while their sessions still hold them
    opts = _options("small/v1")
    for name in (SMALL_REFUSE, SMALL_DROP):  # overflow differs by channel: set per log
        b.publish([Send(name, b'"x"')], 1.0)
        b.channels[name].options = ChannelOptions(
            max_items=opts.max_items, overflow="drop_oldest" if name == SMALL_DROP else "refuse")
    b.on_committed(b.take_writes(), 1.0)
    # Channels publishes create exist before the runs (a run needs its channel's log).
    b.publish([Send(PLAIN, b"1"), Send(OTHER, b"1"), Send(BARRED, b"1")], 1.0)
    b.on_committed(b.take_writes(), 1.0)
    # A group reading: commits mark its channels ready.
    b.subscribe(Session("r"), 1, kind="consume", patterns=["plain/v1/*"], group="g",
                prefetch=1000, now=1.0)
    session = Session("c", producer_id="p")
    access = Access("c", write=["plain/*", "small/*", "typed/*", "_kv/*"])
    return b, session, access


payloads = st.sampled_from([b'"hello"', b"12", b"[1, 2]", b'{"a": 1}', b"{not json",
                            b"x" * 80, b'"' + b"y" * 60 + b'"', b"\xff\xfe"])
send_specs = st.fixed_dictionaries({
    "channel": st.sampled_from(CHANNELS),
    "data": payloads,
    "raw": st.booleans(),
    "extra": st.sampled_from([None] * 12 + ["headers", "dedup", "priority", "ttl", "key",
                                            "delay"]),
    "pseq": st.sampled_from(["next"] * 8 + ["same", "skip", "zero", "back", "huge"]),
})
# Runs of one spec (a channel, a payload...) repeated: what a client's frame mostly is.
runs = st.tuples(send_specs, st.integers(1, 8))
frames = st.lists(st.tuples(st.lists(runs, min_size=1, max_size=5),
                            st.booleans(), st.booleans()), min_size=1, max_size=8)


def _sends(runs: list[tuple[dict[str, Any], int]], last: dict[str, int]) -> list[Send]:
    out = []
    for spec in (spec for spec, times in runs for _ in range(times)):
        channel = spec["channel"]
        prev = last.get(channel, 0)
        pseq = {"next": prev + 1, "same": prev, "skip": prev + 3, "zero": 0,
                "back": max(prev - 2, 0),  # a new producer state takes any first one:
                "huge": prev + 1 if prev else MAX_PSEQ - 2}[spec["pseq"]]  # near the top
        if pseq > prev:
            last[channel] = pseq
        extra: dict[str, Any] = {}
        kind = spec["extra"]
        if kind == "headers":
            extra["headers"] = {"h": "1"}
        elif kind == "dedup":
            extra["dedup"] = f"d{len(out) % 3}"
        elif kind == "priority":
            extra["priority"] = 2
        elif kind == "ttl":
            extra["ttl"] = 5.0
        elif kind == "key":
            extra["key"] = "k"
        elif kind == "delay":
            extra["delay"] = 1.0
        out.append(Send(channel, spec["data"], spec["raw"], pseq=pseq, **extra))
    return out


def _visible(b: Broker) -> dict[str, Any]:
    """Everything a commit leaves behind, as plain values."""
    return {
        "logs": {name: (log.count, log.end, log.inflight, log.published, log.cache_bytes,
                        sorted((seq, msgspec.structs.astuple(m)) for seq, m in log.cache.items()),
                        dict(log.special))
                 for name, log in b.channels.items()},
        "counters": dataclasses.asdict(b.counters),
        "ready": [(g.key, [(gc.log.name) for gc in g.ready]) for g in b.state.ready_groups],
        "durable": b.state.durable,
    }


def _seen(b: Broker, outcomes: list[Any], staged: list[Any]) -> dict[str, Any]:
    """Everything a publish leaves behind, as plain values."""
    batch = b.state.batch
    return {
        "outcomes": [msgspec.structs.astuple(o) for o in outcomes],
        "staged": [msgspec.structs.astuple(m) for m in staged],
        "batch": (dict(batch.channels), [msgspec.structs.astuple(m) for m in batch.messages],
                  list(batch.deletes), [(s.key, p) for s, p in batch.sequenced],
                  batch.bytes, batch.specials, list(batch.dedup), len(batch.publishes)),
        "producers": {k: s.row() for k, s in b.state.producers.states.items()},
        "dirty": [s.key for s in b.state.producers.dirty],
        "logs": {name: (log.next_seq, log.inflight, log.count, log.dropped, log.touched)
                 for name, log in b.channels.items()},
        "counters": dataclasses.asdict(b.counters),
        "replays": [(i, s.key, p) for i, s, p in b.state.replays],
        "refusals": dict(b.state.schema_refusals),
    }


@settings(max_examples=300, deadline=None)
@given(frames)
def test_a_run_staged_at_once_leaves_what_one_by_one_leaves(
        plan: list[tuple[list[dict[str, Any]], bool, bool]]) -> None:
    bulk, one = _broker(True), _broker(False)
    last: dict[str, int] = {}
    for t, (specs, numbered, commit) in enumerate(plan):
        sends = _sends(specs, last if numbered else {})  # (the unnumbered ones are not read)
        now = 10.0 + t
        seen = []
        for b, session, access in (bulk, one):
            outcomes, staged = b.publish(sends, now, access,
                                         session if numbered else Session("u"))
            seen.append(_seen(b, outcomes, staged))
        assert seen[0] == seen[1]
        if commit:
            after = []
            for b, _, _ in (bulk, one):
                b.state.ready_groups.clear()  # as a pump does: the commit marks them again
                for group in b.state.groups.values():
                    group.ready.clear()
                b.on_committed(b.take_writes(), now)
                after.append(_visible(b))
            assert after[0] == after[1]


def test_a_frame_of_plain_sends_takes_the_run() -> None:
    """The comparison above is only worth something if runs are taken: a frame of plain
    sends to one channel is staged by ``_publish_run``, its producer state moved on."""
    b, session, access = _broker(True)
    calls = []
    run = b.publishing._publish_run

    def counted(*args: Any) -> int:
        calls.append(taken := run(*args))
        return taken

    b.publishing._publish_run = counted  # type: ignore[method-assign]
    b.publish([Send(PLAIN, b"1", pseq=1)], 5.0, access, session)  # makes the state
    outcomes, staged = b.publish([Send(PLAIN, b'"v"', pseq=p) for p in range(2, 102)], 6.0,
                                 access, session)
    assert calls[-1] == 100
    assert [o.seq for o in outcomes] == list(range(3, 103))
    pstate = session.producer_states[PLAIN]
    assert (pstate.last, pstate.run_pseq, pstate.run_last, pstate.run_seq) == (101, 1, 101, 2)
    assert all(m.expires_at == 66.0 for m in staged)  # the channel's ttl
    assert ALLOW_ALL.unrestricted


def test_a_run_stops_at_the_largest_producer_sequence() -> None:
    """Sequences past MAX_PSEQ are refused one by one (they would break the commit)."""
    seen = []
    for bulk in (True, False):
        b, session, access = _broker(bulk)
        b.publish([Send(PLAIN, b"1", pseq=MAX_PSEQ - 3)], 5.0, access, session)
        outcomes, staged = b.publish(  # the run starts inside the frame, not at its start
            [Send(OTHER, b"0"), Send(OTHER, b"0")]
            + [Send(PLAIN, b"2", pseq=p) for p in range(MAX_PSEQ - 2, MAX_PSEQ + 3)], 6.0,
            access, Session("c", producer_id="p", producer_states=session.producer_states))
        assert [o.seq for o in outcomes] == [2, 3, 3, 4, 5, 0, 0]
        assert "producer sequence (pseq) is 1.." in outcomes[5].error
        seen.append(_seen(b, outcomes, staged))
    assert seen[0] == seen[1]


def test_a_bucket_s_puts_are_committed_one_by_one() -> None:
    """A bucket's commit compacts its keys message by message: never a run."""
    seen = []
    for bulk in (True, False):
        b, session, _ = _broker(bulk)
        puts = [Send("_kv/v1/config", b"1", key=k) for k in ("a", "b", "a", "c", "a")]
        b.publish(puts, 5.0, ALLOW_ALL, session)
        batch = b.take_writes()
        b.on_committed(batch, 5.0)
        kv = b.channels["_kv/v1/config"].kv
        seen.append((_visible(b), kv.latest("a", 5.0), kv.history("a"), kv.keys("", 5.0),
                     list(b.state.batch.deletes)))
    assert seen[0] == seen[1]
    assert seen[0][1:4] == (5, [5], ["a", "b", "c"])


def test_plain_sends_to_an_inbox_are_checked_as_replies() -> None:
    """An inbox takes only replies to a request its owner made: a run of plain sends to
    one (its log exists once a reply was stored) is never staged unchecked."""
    seen = []
    for bulk in (True, False):
        b, session, _ = _broker(bulk)
        b.state.log("_inbox/v1/x", 5.0)
        outcomes, staged = b.publish([Send("_inbox/v1/x", b"1") for _ in range(3)], 6.0,
                                     ALLOW_ALL, session)
        assert [o.code for o in outcomes] != [0, 0, 0] and not staged
        seen.append(_seen(b, outcomes, staged))
    assert seen[0] == seen[1]


def test_a_frame_to_a_channel_with_a_schema_is_checked_send_by_send() -> None:
    """Once the channel exists, a frame of plain sends to it is still checked against
    its schema: a payload it refuses is refused, the others stored."""
    seen = []
    for bulk in (True, False):
        b, _, access = _broker(bulk)
        b.publish([Send(WITH_SCHEMA, b'"first"')], 5.0, access)  # makes the channel
        outcomes, staged = b.publish([Send(WITH_SCHEMA, d) for d in (b'"a"', b"1", b'"b"')],
                                     6.0, access)
        assert [o.code != 0 for o in outcomes] == [False, True, False]
        seen.append(_seen(b, outcomes, staged))
    assert seen[0] == seen[1]


def test_a_stream_whose_ids_are_used_up_refuses_a_frame_of_plain_sends() -> None:
    """A Redis stream whose last id is the largest there is takes no more messages,
    through any door: a run of plain sends to it is refused send by send too."""
    from minou.core.stream_ids import ID_HEADER

    last = f"{(1 << 64) - 1}-{(1 << 64) - 1}"
    seen = []
    for bulk in (True, False):
        b, _, access = _broker(bulk)
        [put], _ = b.publish([Send(PLAIN, b'"x"', headers={ID_HEADER: last})], 5.0, access,
                             resp_door=True)
        assert put.code == 0
        outcomes, staged = b.publish([Send(PLAIN, b'"a"'), Send(PLAIN, b'"b"')], 6.0,
                                     access)
        assert all(o.code for o in outcomes) and not staged
        assert "exhausted" in outcomes[0].error
        seen.append(_seen(b, outcomes, staged))
    assert seen[0] == seen[1]


def test_while_publishes_are_refused_a_frame_to_an_existing_channel_stages_nothing() -> None:
    """A full disk (or a stopping broker) refuses every send, a run of plain sends to
    a channel that exists too."""
    full = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)
    seen = []
    for bulk in (True, False):
        b, _, access = _broker(bulk)
        b.state.storage_refusal = full
        outcomes, staged = b.publish([Send(PLAIN, b'"a"'), Send(PLAIN, b'"b"')], 6.0,
                                     access)
        assert [o.code for o in outcomes] == [int(full.code)] * 2 and not staged
        seen.append(_seen(b, outcomes, staged))
    assert seen[0] == seen[1]


def test_a_run_whose_commit_fails_is_dropped_as_one_by_one() -> None:
    """A full disk fails the commit that holds a run: its seqs become gaps, its producer
    sequences are refused with the error (a resend gets it), exactly as one by one; the
    next frame is then refused or stored the same way too."""
    full = StorageFull("storage full: test", data_dir="/nowhere", free_bytes=0)
    seen = []
    for bulk in (True, False):
        b, session, access = _broker(bulk)
        b.publish([Send(PLAIN, b"1", pseq=1)], 5.0, access, session)
        b.on_committed(b.take_writes(), 5.0)
        run = [Send(PLAIN, b'"v"', pseq=p) for p in range(2, 12)]
        outcomes, staged = b.publish(run, 6.0, access, session)
        assert len(staged) == 10
        b.on_failed(b.take_writes(), full)
        resent, _ = b.publish(run[:2], 7.0, access, session)  # answered from the state
        later, staged_later = b.publish(
            [Send(PLAIN, b'"w"', pseq=p) for p in range(12, 15)], 8.0, access, session)
        b.on_committed(b.take_writes(), 8.0)
        log = b.channels[PLAIN]
        assert [o.code for o in resent] == [int(full.code)] * 2
        assert [o.seq for o in later] == [13, 14, 15] and log.gone.n == 10
        seen.append((_seen(b, later, staged_later), _visible(b),
                     [msgspec.structs.astuple(o) for o in outcomes + resent],
                     sorted(log.gone)))
    assert seen[0] == seen[1]
