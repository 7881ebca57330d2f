"""Hypothesis strategies for every native frame, with realistic field values."""

from __future__ import annotations

from hypothesis import strategies as st

from minou.protocol.frames import (
    Ack,
    Admin,
    Bye,
    Confirm,
    Deliver,
    Delivery,
    Error,
    Extend,
    Frame,
    Heartbeat,
    Hello,
    Nack,
    Offsets,
    Outcome,
    Ping,
    Pong,
    Position,
    Publish,
    Read,
    ReadResult,
    Result,
    Send,
    Settled,
    Stage,
    SubAdd,
    SubRemove,
    Subscribe,
    TxnAbort,
    TxnCommit,
    Unsubscribe,
    Welcome,
)

# Integer ranges MessagePack can carry; most fields are u32/u64 in practice.
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
any_int = st.one_of(i64, u64)
small_int = st.integers(0, 1000)
# NaN != NaN would make round-trip equality meaningless; infinities are fine.
floats = st.floats(allow_nan=False)
seconds = st.one_of(st.just(0.0), st.floats(0, 12 * 3600.0, allow_nan=False))

# Unicode text (Hypothesis never emits lone surrogates, which UTF-8 cannot carry).
text = st.text(max_size=24)
opt_text = st.none() | text
payload = st.binary(max_size=64)

_endpoint = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=12)
_ident = st.text(alphabet="abcdefXYZ0123456789._~-", min_size=1, max_size=12) | st.just("a%2Fb")
channel = st.builds(
    lambda dead, e, v, i: f"{'_dead/' if dead else ''}{e}/v{v}/{i}",
    st.booleans(),
    _endpoint,
    st.integers(1, 999),
    _ident,
)
pattern = st.one_of(
    channel,
    st.builds(lambda e, v: f"{e}/v{v}/*", _endpoint, st.integers(1, 99)),
    st.builds(lambda e: f"{e}/*", _endpoint),
)
headers = st.none() | st.dictionaries(text, text, max_size=4)

# JSON-like values for Any fields: lists and str-keyed maps (tuples would come back as
# lists, so they are not generated), plus bytes which MessagePack carries natively.
json_like = st.recursive(
    st.none() | st.booleans() | any_int | floats | text | payload,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)
args_map = st.dictionaries(text, json_like, max_size=4)
tags = st.lists(u64, max_size=8)

sends = st.builds(
    Send,
    channel=channel,
    data=payload,
    raw=st.booleans(),
    headers=headers,
    priority=st.integers(0, 9),
    ttl=st.none() | seconds,
    delay=st.none() | seconds,
    dedup=opt_text,
    key=opt_text,
    pseq=u64,
)
outcomes = st.builds(
    Outcome,
    seq=u64,
    id=text,
    channel=st.just("") | channel,
    duplicate=st.booleans(),
    code=st.sampled_from([0, 201, 202, 203, 204, 300]),
    error=text,
    fanout=small_int,
)
deliveries = st.builds(
    Delivery,
    tag=u64,
    channel=channel,
    seq=u64,
    id=text,
    data=payload,
    raw=st.booleans(),
    headers=headers,
    attempts=small_int,
    published_at=floats,
    priority=st.integers(0, 9),
    key=opt_text,
)

FRAME_STRATEGIES: dict[type[Frame], st.SearchStrategy[Frame]] = {
    Hello: st.builds(Hello, client_id=text, version=small_int, token=opt_text, session=opt_text,
                    public_key=opt_text, broker_token=opt_text, heartbeat=seconds,
                    producer_id=text),
    Welcome: st.builds(
        Welcome, broker_id=text, version=small_int, session=text, max_message_size=u32,
        client_id=text, admin=st.booleans(), heartbeat=seconds, producer_id=text,
    ),
    Publish: st.builds(Publish, req=u32, msgs=st.lists(sends, max_size=3)),
    Confirm: st.builds(Confirm, req=u32, outcomes=st.lists(outcomes, max_size=3)),
    Subscribe: st.builds(
        Subscribe,
        req=u32,
        sid=u32,
        kind=st.sampled_from(["listen", "consume"]),
        patterns=st.lists(pattern, max_size=3),
        group=opt_text,
        start=st.sampled_from(["", "new", "oldest"]) | u64.map(lambda n: f"seq:{n}"),
        prefetch=st.integers(0, 100_000),
        lease=seconds,
        name=opt_text,
    ),
    Unsubscribe: st.builds(Unsubscribe, req=u32, sid=u32),
    SubAdd: st.builds(SubAdd, req=u32, sid=u32, pattern=pattern),
    SubRemove: st.builds(SubRemove, req=u32, sid=u32, pattern=pattern),
    Deliver: st.builds(Deliver, sid=u32, items=st.lists(deliveries, max_size=3)),
    Ack: st.builds(Ack, req=u32, tags=tags),
    Nack: st.builds(Nack, req=u32, tags=tags, delay=seconds, front=st.booleans()),
    Extend: st.builds(Extend, req=u32, tags=tags, seconds=seconds),
    Settled: st.builds(Settled, req=u32, failed=st.lists(st.tuples(u64, u32, text), max_size=3)),
    Read: st.builds(Read, req=u32, channel=channel, from_seq=u64, limit=u32, to_seq=u64),
    ReadResult: st.builds(
        ReadResult, req=u32, items=st.lists(deliveries, max_size=3), next_seq=u64, first_seq=u64
    ),
    Admin: st.builds(
        Admin, req=u32, op=st.sampled_from(["list", "status", "purge"]) | text, args=args_map
    ),
    Result: st.builds(Result, req=u32, value=json_like),
    Error: st.builds(
        Error,
        req=u32,
        code=st.integers(0, 999),
        message=text,
        detail=args_map,
        fatal=st.booleans(),
    ),
    Ping: st.builds(Ping, req=u32),
    Pong: st.builds(Pong, req=u32),
    Bye: st.builds(Bye, reason=text),
    Heartbeat: st.just(Heartbeat()),
    Stage: st.builds(Stage, req=u32, txn=text, msgs=st.lists(sends, max_size=3)),
    TxnCommit: st.builds(TxnCommit, req=u32, writer_id=text, batch_id=u32, lineage=text,
                         txns=st.lists(text, max_size=3)),
    TxnAbort: st.builds(TxnAbort, req=u32, txns=st.lists(text, max_size=3)),
    Offsets: st.builds(Offsets, req=u32, patterns=st.lists(text, max_size=3), at=seconds),
    Position: st.builds(Position, req=u32, group=text,
                        positions=st.dictionaries(text, u32, max_size=3)),
}
frames: st.SearchStrategy[Frame] = st.one_of(*FRAME_STRATEGIES.values())
