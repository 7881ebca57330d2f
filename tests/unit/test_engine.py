"""The engine (CommitScheduler, Engine) without a loop, a thread or a disk: time is
passed in, the host records what it is asked to do."""

from __future__ import annotations

from typing import Any

import pytest

from minou.auth.rules import ALLOW_ALL
from minou.core.broker import Broker, Session
from minou.errors import (
    ErrorCode,
    OutOfSequence,
    PublishBacklog,
    RequestError,
    ShuttingDown,
    StorageFull,
    StorageUnavailable,
)
from minou.protocol.frames import Send
from minou.server.engine import DELIVERY_RECHECK_S, CommitScheduler, Engine, pump

DELAY = 0.005


def scheduler(pause: int = 1000) -> CommitScheduler:
    return CommitScheduler(Broker(), settle_delay=DELAY, pause_bytes=lambda: pause,
                           resume_bytes=100)


def publish(s: CommitScheduler, n: int = 1, size: int = 10, now: float = 0.0) -> None:
    sends = [Send("orders/v1/1", b'"' + b"x" * (size - 2) + b'"') for _ in range(n)]
    outcomes, _ = s.core.publish(sends, now)
    assert all(o.code == 0 for o in outcomes), outcomes


def test_one_commit_at_a_time_and_what_arrives_meanwhile_forms_the_next() -> None:
    s = scheduler()
    publish(s, 2)
    assert s.request(0.0) == "now"
    first = s.take()
    assert first is not None and len(first.messages) == 2 and s.handoffs == 1
    publish(s, 3)
    assert s.take() is None  # the writer is busy: the three wait
    assert s.committed(first, 1.0, 1.0) == "now"  # publishes waited: go on at once
    second = s.take()
    assert second is not None and len(second.messages) == 3 and s.handoffs == 2
    assert s.committed(second, 1.1, 1.1) == "none"
    assert s.take() is None and s.idle


def test_settlements_ride_along_while_publishes_flow_and_go_alone_when_idle() -> None:
    s = scheduler()
    publish(s)
    batch = s.take()
    assert batch is not None
    s.committed(batch, 10.0, 10.0)
    # Just after a publish commit: an ack waits for the next one (a timer, armed once).
    assert s.request(10.0 + DELAY, urgent=False) == "timer"
    assert s.request(10.0 + DELAY, urgent=False) == "none"
    assert s.timer_fired(10.0 + 2 * DELAY) is None
    # Publishes are never held back, and neither is a forced commit.
    assert s.request(10.0 + DELAY) == "now"
    assert s.request(10.0 + DELAY, urgent=False, force=True) == "now"
    # Long after the last publish commit, an ack commits at once.
    assert s.request(11.0, urgent=False) == "now"


def test_force_commits_an_empty_batch_and_a_stopped_writer_takes_nothing() -> None:
    s = scheduler()
    assert s.take() is None  # nothing to write
    s.request(0.0, force=True)
    assert s.take() is None  # an empty batch after all: nothing handed over
    publish(s)
    s.stop()
    assert s.take() is None and s.stopped


def test_backing_off_is_asked_only_when_there_is_work() -> None:
    s = scheduler()
    asked: list[bool] = []

    def backing_off() -> bool:
        asked.append(True)
        return True

    assert s.take(backing_off) is None and asked == []
    publish(s)
    assert s.take(backing_off) is None and asked == [True]
    assert s.take() is not None  # no longer backing off


def test_flow_control_counts_staged_and_writing_bytes_and_pauses_past_the_limit() -> None:
    s = scheduler(pause=1000)
    conn = object()
    publish(s, 5, size=100)  # 500 bytes staged
    assert s.uncommitted_bytes == 500 and not s.staged(conn) and s.backlog() is None
    batch = s.take()
    publish(s, 6, size=100)  # 500 being written + 600 staged
    assert s.uncommitted_bytes == 1100
    assert s.staged(conn) and s.staged(conn) and s.flow_pauses == 1  # counted once
    assert s.backlog() == (1100, 1000)
    assert s.resumable() == []  # still behind
    assert batch is not None
    s.committed(batch, 1.0, 1.0)  # 600 staged: above a quarter of the limit
    assert s.resumable() == [] and s.backlog() == (600, 1000)  # HTTP waits for sockets
    second = s.take()
    assert second is not None
    s.committed(second, 1.1, 1.1)
    assert s.uncommitted_bytes == 0 and s.resumable() == [conn] and s.backlog() is None


def test_a_failed_commit_leaks_no_bytes_and_a_forgotten_publisher_is_not_resumed() -> None:
    s = scheduler(pause=100)
    conn = object()
    publish(s, 2, size=100)
    assert s.staged(conn)
    batch = s.take()
    assert batch is not None and s.uncommitted_bytes == 200
    s.failed()
    s.core.on_failed(batch, StorageFull("disk full"))  # its publishers are told, dropped
    assert s.idle and s.uncommitted_bytes == 0
    s.forget(conn)
    assert s.resumable() == [] and s.backlog() is None


def test_answers_wait_for_the_commit_that_holds_them() -> None:
    s = scheduler()
    told: list[str] = []
    publish(s)
    s.core.after_commit(lambda: told.append("durable"))
    batch = s.take()
    assert batch is not None and told == []
    s.committed(batch, 1.0, 1.0)
    assert told == ["durable"]


def test_a_draining_pump_sends_nothing_new_and_a_full_page_asks_for_more() -> None:
    from minou.core.broker import Session
    from minou.core.log import Msg
    from minou.server import engine

    core = Broker()
    sub = core.subscribe(Session("c"), 1, kind="consume", patterns=["orders/v1/1"],
                         now=0.0, group="g", prefetch=10)
    core.publish([Send("orders/v1/1", b"1")], 0.0)
    core.on_committed(core.take_writes(), 0.0)
    assert engine.pump(core, 0.0, draining=True) == engine.Pumped()
    turn = engine.pump(core, 0.0)
    assert [d.seq for d in turn.deliveries[sub]] == [1] and turn.loads == []
    assert not turn.again  # nothing more is ready

    seen: list[tuple[str, int, list[int], int]] = []

    class Core:
        def on_loaded(self, channel: str, from_seq: int, msgs: list[Msg], hi: int) -> None:
            seen.append((channel, from_seq, [m.seq for m in msgs], hi))

    load = engine.Load("orders/v1/1", 1, 100)
    page = [Msg("orders/v1/1", s, f"i{s}", b"1") for s in (1, 2, 3)]
    engine.loaded(Core(), load, page, page=3)  # type: ignore[arg-type]
    engine.loaded(Core(), load, page[:2], page=3)  # type: ignore[arg-type]
    assert seen == [("orders/v1/1", 1, [1, 2, 3], 4), ("orders/v1/1", 1, [1, 2], 100)]


# ------------------------------------------------------------------- Engine
class Host:
    """The engine's host, recording: writes wait until ``finish``; timers and pump
    requests are kept for the test to run."""

    def __init__(self) -> None:
        self.writes: list[Any] = []
        self.soon: list[Any] = []
        self.later: list[tuple[float, Any]] = []
        self.loads: list[Any] = []
        self.full = False

    def write(self, batch: Any) -> None:
        self.writes.append(batch)

    def call_soon(self, callback: Any) -> None:
        self.soon.append(callback)

    def call_later(self, delay: float, callback: Any) -> None:
        self.later.append((delay, callback))

    def load(self, load: Any) -> None:
        self.loads.append(load)

    def backing_off(self) -> bool:
        return self.full


class Door:
    """A pausable publisher that records its answers."""

    def __init__(self) -> None:
        self.paused = False
        self.answers: list[tuple[list[Any], Any]] = []

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False

    def reply(self, outcomes: list[Any], failure: Any) -> None:
        self.answers.append(([(o.seq, o.code) for o in outcomes], failure))


def engine(pause: int = 1000) -> tuple[Engine, Host]:
    clock = [100.0]
    host = Host()
    e = Engine(Broker(), host, settle_delay=DELAY, pause_bytes=lambda: pause,
               resume_bytes=100, clock=lambda: clock[0], monotonic=lambda: clock[0])
    return e, host


def sends(n: int, size: int = 10) -> list[Send]:
    return [Send("orders/v1/1", b'"' + b"x" * (size - 2) + b'"') for _ in range(n)]


def test_a_publish_is_answered_once_its_commit_is_durable() -> None:
    e, host = engine()
    door = Door()
    outcomes = e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)
    assert [o.seq for o in outcomes] == [1, 2]
    [batch] = host.writes  # handed to the writer at once: publishes are urgent
    assert door.answers == []
    e.committed(batch)
    assert door.answers == [([(1, 0), (2, 0)], None)]
    assert host.soon == [e.pump]  # what was stored may be delivered


def test_commits_asked_while_the_writer_is_busy_follow_its_answer() -> None:
    """An urgent commit asked while a batch is being written is the writer's answer's
    to start; a forced one (group states that deliveries alone changed) and one
    that may wait (settlements) are remembered, not dropped."""
    e, host = engine()
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    [first] = host.writes
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    e.commit()
    assert host.writes == [first] and host.later == []  # nothing more while it writes
    e.committed(first)
    assert len(host.writes) == 2 and len(host.writes[1].messages) == 1
    e.commit(force=True)  # while the second is written: nothing staged, forced
    assert e.scheduler._force  # remembered for the next batch taken
    e.committed(host.writes[1])
    e.commit()
    assert len(host.writes) == 2 and not e.scheduler._force  # taken (nothing to write)
    e.commit(urgent=False)  # a settlement-like ask right after a publish commit
    assert host.later == [(DELAY, e._timer_fired)]  # it waits for the timer


def test_a_failed_commit_answers_every_stored_outcome_with_its_error() -> None:
    e, host = engine()
    door = Door()
    e.publish([*sends(1), Send("bad", b"1")], ALLOW_ALL, door.reply, publisher=door)
    full = StorageFull("disk full")
    e.not_written(host.writes.pop(), full, stop=False)
    [(outcomes, failure)] = door.answers
    assert failure is full
    assert outcomes[0] == (0, int(full.code))  # stored: now refused with the error
    assert outcomes[1][1] == int(ErrorCode.INVALID_CHANNEL)  # refused at once, as it was
    assert e.core.counters.as_dict()["refused"]["storage_full"] == 1


def test_a_pausable_publisher_is_paused_past_the_limit_and_resumed_after_the_commit() -> None:
    e, host = engine(pause=15)
    door = Door()
    e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door)
    assert not door.paused  # 10 bytes: under the limit
    e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door)
    assert door.paused and e.scheduler.flow_pauses == 1
    [first] = host.writes
    e.committed(first)  # the second publish goes to the writer at once...
    assert door.paused  # ...and is still 10 bytes behind: over a quarter of the limit
    second = host.writes[1]
    e.committed(second)
    assert not door.paused and len(door.answers) == 2


def test_a_publish_that_cannot_be_paused_is_refused_whole_while_behind() -> None:
    e, host = engine(pause=15)
    door = Door()
    e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)  # 20 bytes: paused
    http = Door()
    with pytest.raises(PublishBacklog) as refused:
        e.publish(sends(1), ALLOW_ALL, http.reply)
    assert refused.value.detail == {"uncommitted_bytes": 20, "limit": 15, "retry_after": 1}
    assert http.answers == [] and len(e.core.batch.messages) == 0  # nothing staged
    e.committed(host.writes.pop())
    e.publish(sends(1), ALLOW_ALL, http.reply)
    assert len(host.writes) == 1  # taken, and handed to the writer


def test_stopping_refuses_unpausable_publishes_whole_and_socket_ones_send_by_send() -> None:
    e, host = engine()
    e.accepting = False
    with pytest.raises(ShuttingDown):
        e.publish(sends(1), ALLOW_ALL, Door().reply)
    door = Door()
    e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)
    assert door.answers == [([(0, int(ErrorCode.SHUTTING_DOWN))] * 2, None)]
    assert host.writes == []


def test_settlements_are_answered_after_their_commit_and_extends_at_once() -> None:
    e, host = engine()
    session = Session("c")
    e.core.subscribe(session, 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=10, now=100.0)
    e.publish(sends(2), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    turn = pump(e.core, 100.0)
    [items] = turn.deliveries.values()
    answers: list[Any] = []
    failed = e.settle(session, "ack", [items[0].tag, 999],
                      lambda refused, exc: answers.append((refused, exc)))
    assert [tag for tag, _, _ in failed] == [999]
    assert answers == []  # waits for the commit that makes the ack durable
    e.commit(force=True)
    e.committed(host.writes.pop())
    assert answers == [(failed, None)]
    e.settle(session, "extend", [items[1].tag], lambda refused, exc: answers.append(refused),
             seconds=30)
    assert answers[-1] == []  # at once: a lease lives in memory only


def test_when_durable_answers_at_once_when_nothing_waits_to_be_written() -> None:
    e, host = engine()
    said: list[str] = []
    e.when_durable(lambda: said.append("now"))
    assert said == ["now"] and host.writes == []
    e.core.batch.used_tokens.append(("t", 1.0))
    e.when_durable(lambda: said.append("later"))
    assert said == ["now"]
    e.committed(host.writes.pop())
    assert said == ["now", "later"]


def test_a_duplicate_of_a_message_being_written_waits_for_its_commit() -> None:
    """Found by the simulator (seed 518): a repeat of a dedup key whose first send is
    still being written was answered at once, before anything was durable."""
    e, host = engine()
    first, again = Door(), Door()
    e.publish([Send("orders/v1/1", b"1", dedup="k")], ALLOW_ALL, first.reply, publisher=first)
    [writing] = host.writes
    [dup] = e.publish([Send("orders/v1/1", b"1", dedup="k")], ALLOW_ALL, again.reply,
                      publisher=again)
    assert dup.duplicate and again.answers == []  # not before the original is durable
    e.committed(writing)  # then the answers (an empty batch: nothing is written for it)
    assert again.answers == [([(1, 0)], None)] and len(host.writes) == 1


def _a_duplicate_behind_a_failed_commit() -> tuple[Engine, Host, Door, Door, StorageFull]:
    """A publish and a repeat of its dedup key, the first's commit failed (disk full)."""
    e, host = engine()
    first, again = Door(), Door()
    e.publish([Send("orders/v1/1", b"1", dedup="k")], ALLOW_ALL, first.reply, publisher=first)
    e.publish([Send("orders/v1/1", b"1", dedup="k")], ALLOW_ALL, again.reply, publisher=again)
    full = StorageFull("disk full")
    e.not_written(host.writes.pop(), full, stop=False)
    return e, host, first, again, full


def test_a_duplicate_of_a_message_whose_commit_fails_gets_the_error() -> None:
    e, host, first, again, full = _a_duplicate_behind_a_failed_commit()
    assert first.answers == [([(0, int(full.code))], full)]
    assert again.answers == []  # it waits for the next commit (what the failed one carried)
    e.committed(host.writes.pop())
    assert again.answers == [([(0, int(full.code))], None)]
    assert e.core.state.awaited == {} and e.core.state.lost == {}
    # A resend now stores it: the failed commit forgot the key.
    resend = Door()
    [out] = e.publish([Send("orders/v1/1", b"1", dedup="k")], ALLOW_ALL, resend.reply,
                      publisher=resend)
    assert not out.duplicate and out.seq == 2


def test_a_duplicate_waiting_for_the_commit_after_a_failed_one_gets_that_ones_error() -> None:
    e, host, _first, again, full = _a_duplicate_behind_a_failed_commit()
    assert again.answers == []
    still = StorageFull("disk still full")
    e.not_written(host.writes.pop(), still, stop=False)
    assert again.answers == [([(0, int(full.code))], still)]
    assert e.core.state.awaited == {} and e.core.state.lost == {}


def test_a_publish_to_another_brokers_queue_is_refused_unless_a_front_routed_it() -> None:
    """Queues spread over brokers: ``route`` refuses sends whose queue this broker does
    not own, before anything is staged; a front that just routed them says so."""
    e, host = engine()
    asked: list[list[str]] = []
    moved = RequestError("queue orders/v1 is owned by another broker")

    def route(batch: Any, access: Any) -> RequestError | None:
        asked.append([x.channel for x in batch])
        return moved

    e.route = route
    door = Door()
    with pytest.raises(RequestError) as refused:
        e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)
    assert refused.value is moved and asked == [["orders/v1/1", "orders/v1/1"]]
    assert not e.core.batch and host.writes == []
    [out] = e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door, routed=True)
    assert out.seq == 1 and len(asked) == 1


def test_answers_alone_are_given_without_a_write_once_the_writer_is_idle() -> None:
    e, host = engine()
    said: list[str] = []
    e.after_commit(lambda: said.append("done"))  # nothing staged: nothing to write
    assert said == ["done"] and host.writes == [] and e.scheduler.handoffs == 0


def test_a_replayed_commit_is_answered_only_if_the_commit_it_repeats_was_stored() -> None:
    """Found by the simulator (seed 1198): a Spark batch committed again while its first
    commit was still being written was answered "discarded"; that first commit then
    failed, and the batch was stored by neither."""
    e, host = engine()
    writer = Session("spark")
    answers: list[Any] = []

    def commit(txn: str) -> None:
        e.core.stage(writer, txn, [Send("orders/v1/1", b"1")], 100.0)
        e.commit_txns(writer, "job", 1, [txn], lambda result: answers.append(result),
                      lambda exc: answers.append(exc))

    commit("t1")
    first = host.writes.pop()  # being written
    commit("t2")  # the same batch again: the fence already says batch 1
    full = StorageFull("disk full")
    e.not_written(first, full, stop=False)
    assert answers == [full]  # the first commit's own answer
    e.committed(host.writes.pop())  # the replay's commit (what the failed one carried)
    [lost] = answers[1:]
    assert isinstance(lost, RequestError) and lost.code == ErrorCode.STORAGE_UNAVAILABLE
    assert "was not stored" in lost.message
    assert e.core.transactions.fences.get(("job", "orders/v1/1"), -1) < 1  # free to retry


# ------------------------------------------------- what rides along, what goes now
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def consumer_holding(e: Engine, host: Host, n: int, *, prefetch: int
                     ) -> tuple[Session, list[Any]]:
    """A consumer of ``orders/v1/1`` (group g) and what the first pump gave it, after
    ``n`` messages were published and committed."""
    session = Session("c")
    e.core.subscribe(session, 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=prefetch, now=100.0)
    e.publish(sends(n), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    [items] = pump(e.core, 100.0).deliveries.values()
    return session, items


def timed_engine(pause: int = 1000) -> tuple[Engine, Host, Clock]:
    clock, host = Clock(), Host()
    e = Engine(Broker(), host, settle_delay=DELAY, pause_bytes=lambda: pause,
               resume_bytes=100, clock=clock, monotonic=clock)
    return e, host, clock


def consume(e: Engine, session: Session, sid: int = 1) -> None:
    """A subscription made in the core: a new group for each session (state to commit)."""
    e.core.subscribe(session, sid, kind="consume", patterns=["orders/v1/1"],
                     group=f"g-{session.client_id}", prefetch=10, now=100.0)


def publish_committed(e: Engine, host: Host) -> None:
    """A publish and its commit: publishes flow (for the next ``2 * DELAY``)."""
    door = Door()
    e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door)
    e.committed(host.writes.pop())
    assert door.answers


def _subscribe(e: Engine, s: Session, said: list[str]) -> None:
    e.subscribe(s, 1, kind="consume", patterns=["orders/v1/1"], group="g", prefetch=10)


def _subscribe_answered(e: Engine, s: Session, said: list[str]) -> None:
    e.subscribe(s, 1, lambda: said.append("subscribed"), kind="consume",
                patterns=["orders/v1/1"], group="g", prefetch=10)


def _unsubscribe(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)
    e.unsubscribe(s, 2)


def _unsubscribe_answered(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)
    e.unsubscribe(s, 2, lambda: said.append("unsubscribed"))


def _close(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)
    e.close(s)


def _after_input(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)  # what a read staged
    e.after_input()


def _changed(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)  # an admin action
    e.changed()


def _ack(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)
    e.settle(s, "ack", [], lambda refused, exc: said.append("acked"))


def _when_durable(e: Engine, s: Session, said: list[str]) -> None:
    consume(e, s, 2)
    e.when_durable(lambda: said.append("durable"))


NOT_URGENT = [_subscribe, _subscribe_answered, _unsubscribe, _unsubscribe_answered, _close,
              _after_input, _changed, _ack, _when_durable]


@pytest.mark.parametrize("action", NOT_URGENT, ids=lambda f: f.__name__.strip("_"))
def test_state_changes_ride_along_with_the_publishes_commits_while_they_flow(action: Any
                                                                             ) -> None:
    e, host, clock = timed_engine()
    session = Session("c")
    publish_committed(e, host)
    said: list[str] = []
    action(e, session, said)
    assert host.writes == [] and said == []  # no fsync of its own in front of publishes
    [(delay, fire)] = host.later  # at most settle_delay later
    assert delay == DELAY
    action(e, Session("d"), said)
    assert len(host.later) == 1 and host.writes == []  # one timer armed at a time
    clock.now += DELAY
    fire()
    assert len(host.writes) == 1
    e.committed(host.writes.pop())
    # Answered once that commit is durable (both changes, where there is an answer).
    assert len(said) == (2 if action in (_subscribe_answered, _unsubscribe_answered, _ack,
                                         _when_durable) else 0)
    # After the timer, the next change while publishes flow arms a timer again.
    publish_committed(e, host)
    action(e, Session("e"), said)
    assert host.writes == [] and len(host.later) == 2


@pytest.mark.parametrize("action", NOT_URGENT, ids=lambda f: f.__name__.strip("_"))
def test_state_changes_commit_at_once_when_no_publishes_flow(action: Any) -> None:
    e, host, clock = timed_engine()
    publish_committed(e, host)
    clock.now += 2 * DELAY  # the last publish commit is 2 * settle_delay old
    said: list[str] = []
    action(e, Session("c"), said)
    assert host.later == [] and len(host.writes) == 1


def test_a_transaction_commit_goes_at_once_even_while_publishes_flow() -> None:
    e, host, _ = timed_engine()
    writer = Session("spark")
    publish_committed(e, host)
    e.core.stage(writer, "t1", [Send("orders/v1/1", b"1")], 100.0)
    answers: list[Any] = []
    e.commit_txns(writer, "job", 1, ["t1"], answers.append, answers.append)
    assert host.later == [] and len(host.writes) == 1 and answers == []
    e.committed(host.writes.pop())
    [result] = answers
    assert isinstance(result, dict) and not result.get("replayed_channels")


def test_a_replay_of_a_durable_transaction_commit_is_answered_with_its_result() -> None:
    e, host, _ = timed_engine()
    writer = Session("spark")
    answers: list[Any] = []
    for txn in ("t1", "t2"):  # batch 1, then batch 1 again (a restarted query)
        e.core.stage(writer, txn, [Send("orders/v1/1", b"1")], 100.0)
        e.commit_txns(writer, "job", 1, [txn], answers.append, answers.append)
        e.committed(host.writes.pop())
    _, again = answers
    assert isinstance(again, dict), again  # not an error: the first commit is durable
    assert again.get("replayed_channels") == ["orders/v1/1"]


def _writer_past_one_commit(e: Engine, host: Host, batch_id: int = 1, lineage: str = ""
                            ) -> tuple[Session, list[Any]]:
    """A Spark writer whose first transaction (batch ``batch_id``) is committed and
    durable, with a second one, t2, staged; and the list its answers go to."""
    writer = Session("spark")
    answers: list[Any] = []
    e.core.stage(writer, "t1", [Send("orders/v1/1", b"1")], 100.0)
    e.commit_txns(writer, "job", batch_id, ["t1"], answers.append, answers.append, lineage)
    e.committed(host.writes.pop())
    e.core.stage(writer, "t2", [Send("orders/v1/1", b"2")], 100.0)
    return writer, answers


def test_a_transaction_commit_carries_its_lineage() -> None:
    """A writer id bound to one run of batches refuses another run's commit."""
    e, host, _ = timed_engine()
    writer, answers = _writer_past_one_commit(e, host, lineage="run-1")
    with pytest.raises(RequestError) as refused:
        e.commit_txns(writer, "job", 2, ["t2"], answers.append, answers.append, "run-2")
    assert refused.value.code == ErrorCode.BAD_REQUEST
    assert refused.value.detail["why"] == "lineage" and refused.value.detail["bound"] == "run-1"


def test_a_transaction_commit_carries_the_fence_its_writer_believes_in() -> None:
    """``after``: the batch covers (after, batch_id]; a fence inside that range (another
    session of the writer committed part of it) refuses the commit."""
    e, host, _ = timed_engine()
    writer, answers = _writer_past_one_commit(e, host, batch_id=2)
    with pytest.raises(OutOfSequence) as refused:
        e.commit_txns(writer, "job", 5, ["t2"], answers.append, answers.append, after=1)
    assert refused.value.detail["fence"] == 2 and refused.value.detail["after"] == 1
    e.commit_txns(writer, "job", 5, ["t2"], answers.append, answers.append, after=2)
    e.committed(host.writes.pop())
    assert [a.get("replayed_channels") for a in answers] == [[], []]


def test_a_transaction_commit_while_stopping_is_refused() -> None:
    e, host, _ = timed_engine()
    e.accepting = False
    with pytest.raises(ShuttingDown):
        e.commit_txns(Session("spark"), "job", 1, [], print, print)
    with pytest.raises(ShuttingDown):
        e.subscribe(Session("c"), 1, kind="consume", patterns=["orders/v1/1"], group="g")
    assert host.writes == []


def test_while_storage_is_full_an_http_publish_gets_the_storage_error_and_nothing_is_staged(
        ) -> None:
    e, host, _ = timed_engine()
    full = StorageFull("disk full", data_dir="/data", free_bytes=0)
    e.core.storage_refusal = full
    with pytest.raises(StorageFull) as refused:
        e.publish(sends(1), ALLOW_ALL, Door().reply)
    assert refused.value.code == ErrorCode.STORAGE_FULL
    assert refused.value.detail == {"data_dir": "/data", "free_bytes": 0}
    assert refused.value.message == full.message
    assert len(e.core.batch.messages) == 0 and host.writes == []
    e.core.storage_refusal = None
    e.publish(sends(1), ALLOW_ALL, Door().reply)
    assert len(host.writes) == 1


def test_a_failed_commit_that_stops_storage_writes_nothing_more() -> None:
    e, host, _ = timed_engine()
    publish_committed(e, host)  # publishes flow: a commit wanted now would arm a timer
    door = Door()
    session = Session("c")
    e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door)
    writing = host.writes.pop()
    consume(e, session)  # staged while the writer holds the publish
    e.not_written(writing, StorageFull("disk gone"), stop=True)
    assert door.answers and door.answers[0][1] is not None
    assert host.writes == [] and host.later == [] and e.scheduler.stopped
    e.changed()
    assert host.writes == []


def test_once_storage_stopped_for_good_what_waits_for_a_commit_is_answered_at_once() -> None:
    """Found by the chaos run (tests/chaos.py): a primary fenced after a pause kept the
    HTTP requests that came next (an ack, an admin call) waiting for a commit that
    would never come, until its HTTP server gave up on them 5 s later."""
    e, host, _ = timed_engine()
    session = Session("c")
    consume(e, session)  # state to write: what comes next waits for a commit
    e.commit(force=True)
    fenced = StorageUnavailable("this broker no longer serves (another broker took over)")
    e.not_written(host.writes.pop(), fenced, stop=True)
    assert not e.accepting  # nothing is written any more: no new work is taken
    said: list[Any] = []
    e.when_durable(lambda: said.append("durable"), said.append)  # an HTTP ack, an admin op
    e.after_commit(lambda: said.append("durable"), said.append)
    assert said == [fenced, fenced]
    door = Door()
    with pytest.raises(ShuttingDown):  # a door that cannot wait (HTTP): refused whole
        e.publish(sends(1), ALLOW_ALL, door.reply)
    e.publish(sends(1), ALLOW_ALL, door.reply, publisher=door)  # native: refused, answered
    assert door.answers == [([(0, ErrorCode.SHUTTING_DOWN)], None)]
    assert host.writes == []


def test_once_storage_stopped_for_good_a_resend_is_answered_from_its_producer_with_why(
        ) -> None:
    """A numbered resend of a stored send gets its duplicate outcome, and the reply
    carries the error that stopped storage (nothing new is stored)."""
    e, host, _ = timed_engine()
    p = Session("app", producer_id="00000000000000aa")
    e.publish([Send("orders/v1/1", b"1", pseq=1)], ALLOW_ALL, Door().reply, session=p,
              publisher=Door())
    e.committed(host.writes.pop())
    consume(e, Session("c"))
    e.commit(force=True)
    fenced = StorageUnavailable("this broker no longer serves (another broker took over)")
    e.not_written(host.writes.pop(), fenced, stop=True)
    said: list[Any] = []
    e.publish([Send("orders/v1/1", b"1", pseq=1)], ALLOW_ALL,
              lambda outcomes, exc: said.append((outcomes, exc)), session=p, publisher=Door())
    [([replay], exc)] = said
    assert (replay.code, replay.duplicate, replay.seq) == (0, True, 1)
    assert exc is fenced and host.writes == []


def test_a_failed_commit_carries_what_it_held_into_the_next_commit() -> None:
    e, host, clock = timed_engine()
    publish_committed(e, host)
    session = Session("c")
    consume(e, session)
    e.commit(force=True)
    writing = host.writes.pop()
    e.not_written(writing, StorageFull("disk full"), stop=False)
    # Publishes flow: the carried state rides along with the next commit, not at once.
    assert host.writes == [] and len(host.later) == 1
    clock.now += DELAY
    host.later[0][1]()
    assert len(host.writes) == 1


def test_a_publisher_that_closes_while_paused_is_not_resumed() -> None:
    e, host, _ = timed_engine(pause=15)
    door = Door()
    session = Session("c", conn=door)
    e.publish(sends(2), ALLOW_ALL, door.reply, session=session, publisher=door)
    assert door.paused
    e.close(session)
    e.committed(host.writes.pop())
    assert door.paused  # gone: nobody to resume
    assert e.scheduler.resumable() == []


def test_closing_gives_unsettled_deliveries_back_to_the_group() -> None:
    e, host, _ = timed_engine()
    first, second = Session("a"), Session("b")
    for s in (first, second):
        e.core.subscribe(s, 1, kind="consume", patterns=["orders/v1/1"], group="g",
                         prefetch=1, now=100.0)
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    turn = pump(e.core, 100.0)
    [(sub, [item])] = turn.deliveries.items()
    holder = first if sub.session is first else second
    other = second if holder is first else first
    e.close(holder)
    # It goes out again only once its attempt count is stored (a crash before that
    # must not send attempt 1 again to someone who saw attempt 2).
    assert pump(e.core, 100.0).deliveries == {}
    e.commit()
    e.committed(host.writes.pop())
    assert host.soon[-1] == e.pump  # what came back may go out again
    again = pump(e.core, 100.0)
    [(sub2, [item2])] = again.deliveries.items()
    assert sub2.session is other and item2.seq == item.seq and item2.attempts == 2


@pytest.mark.parametrize("extra", [0, 1])
def test_flow_control_pauses_only_past_the_limit_exactly(extra: int) -> None:
    e, _, _ = timed_engine(pause=20 + extra)
    door = Door()
    e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)  # 20 bytes: at the limit
    assert not door.paused
    e.publish(sends(1), ALLOW_ALL, Door().reply)  # HTTP is not refused at the limit
    assert e.scheduler.uncommitted_bytes == 30
    big = Door()
    e.publish(sends(1), ALLOW_ALL, big.reply, publisher=big)
    assert big.paused  # 40: past it


def test_an_http_publish_is_refused_only_once_past_the_limit() -> None:
    e, _, _ = timed_engine(pause=20)
    e.publish(sends(2), ALLOW_ALL, Door().reply)  # 20 bytes, being written
    e.publish(sends(1), ALLOW_ALL, Door().reply)  # at the limit, not past it: taken
    with pytest.raises(PublishBacklog) as refused:
        e.publish(sends(1), ALLOW_ALL, Door().reply)
    assert refused.value.detail == {"uncommitted_bytes": 30, "limit": 20, "retry_after": 1}


def test_when_durable_tells_its_failure_when_that_commit_fails() -> None:
    e, host, _ = timed_engine()
    consume(e, Session("c"))
    said: list[Any] = []
    e.when_durable(lambda: said.append("durable"), said.append)
    full = StorageFull("disk full")
    e.not_written(host.writes.pop(), full, stop=False)
    assert said == [full]


def test_a_draining_engine_delivers_nothing_new() -> None:
    e, host, _ = timed_engine()
    delivered: list[Any] = []

    class Conn:
        def send_deliveries(self, sid: int, items: list[Any]) -> None:
            delivered.extend(items)

    consume(e, Session("c", conn=Conn()))
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    e.draining = True
    e.pump()
    assert delivered == []
    e.draining = False
    e.pump()
    assert [d.seq for d in delivered] == [1]


def test_a_nack_without_options_redelivers_at_once_and_first() -> None:
    e, host, _ = timed_engine()
    session, [first] = consumer_holding(e, host, 3, prefetch=1)
    assert first.seq == 1
    e.commit(force=True)
    e.committed(host.writes.pop())  # its attempt count is stored
    e.settle(session, "nack", [first.tag], None)
    [[again]] = pump(e.core, 100.0).deliveries.values()
    assert (again.seq, again.attempts) == (1, 2)  # no delay, back at the front


def test_a_transaction_commit_without_a_lineage_binds_none() -> None:
    e, host, _ = timed_engine()
    writer, answers = _writer_past_one_commit(e, host)
    e.commit_txns(writer, "job", 2, ["t2"], answers.append, answers.append, "run-2")
    e.committed(host.writes.pop())
    assert all(isinstance(a, dict) for a in answers) and len(answers) == 2


def test_a_settlement_whose_commit_fails_is_answered_with_its_refusals_and_the_error(
        ) -> None:
    e, host, _ = timed_engine()
    session, [item] = consumer_holding(e, host, 1, prefetch=10)
    answers: list[Any] = []
    failed = e.settle(session, "ack", [item.tag, 999],
                      lambda refused, exc: answers.append((refused, exc)))
    e.commit(force=True)
    full = StorageFull("disk full")
    e.not_written(host.writes.pop(), full, stop=False)
    assert answers == [(failed, full)] and [t for t, _, _ in failed] == [999]


def test_an_extend_without_a_duration_is_refused_at_once() -> None:
    e, host, _ = timed_engine()
    session, [item] = consumer_holding(e, host, 1, prefetch=10)
    answers: list[Any] = []
    with pytest.raises(RequestError) as refused:
        e.settle(session, "extend", [item.tag], lambda refused, exc: answers.append(refused))
    assert refused.value.code == ErrorCode.BAD_REQUEST and answers == []
    with pytest.raises(ValueError):
        e.settle(session, "bury", [item.tag], None)


def test_an_ack_through_the_engine_observes_its_latency() -> None:
    """The ack latency users see (a histogram) runs from the delivery to the ack."""
    e, host, clock = timed_engine()
    seen: list[float] = []

    class Histogram:
        def observe(self, seconds: float) -> None:
            seen.append(seconds)

        def observe_since(self, now: float, times: list[float]) -> None:
            seen.extend(now - t for t in times)

    e.core.state.ack_latency = Histogram()
    session, [item] = consumer_holding(e, host, 1, prefetch=10)
    clock.now = 102.5
    e.settle(session, "ack", [item.tag], None)
    assert seen == [pytest.approx(2.5)]


def test_a_pump_turn_stops_at_the_burst_limit_and_asks_for_another() -> None:
    """So that a connection's writes can pause it between turns."""
    e, host, _ = timed_engine(pause=10 << 20)
    delivered: list[int] = []

    class Conn:
        def send_deliveries(self, sid: int, items: list[Any]) -> None:
            delivered.extend(d.seq for d in items)

    e.core.subscribe(Session("c", conn=Conn()), 1, kind="consume", patterns=["orders/v1/1"],
                     group="g", prefetch=10, now=100.0)
    e.publish(sends(3, size=600_000), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    host.soon.clear()
    e.pump()
    assert delivered == [1, 2] and host.soon == [e.pump]  # 1.2 MB: past the burst limit
    host.soon.clear()
    e.pump()
    assert delivered == [1, 2, 3] and host.soon == []


def test_one_pump_turn_is_scheduled_however_often_it_is_asked_for() -> None:
    e, host, _ = timed_engine()
    e.after_input()
    e.changed()
    e.request_pump()
    assert host.soon == [e.pump]
    e.pump()
    e.request_pump()
    assert host.soon == [e.pump, e.pump]


def test_flow_pauses_count_each_pause_of_a_publisher() -> None:
    """The flow_pauses counter users see: once per pause, again after a resume."""
    e, host, _ = timed_engine(pause=15)
    door = Door()
    for expected in (1, 2):
        e.publish(sends(2), ALLOW_ALL, door.reply, publisher=door)
        assert door.paused and e.scheduler.flow_pauses == expected
        e.committed(host.writes.pop())
        assert not door.paused


# ------------------------------------------- commit timing and flow-control bounds
def _publish_committed_at_1() -> CommitScheduler:
    """A scheduler (settle_delay 0.25: times exact in binary) that committed a publish
    at t=1.0."""
    s = CommitScheduler(Broker(), settle_delay=0.25, pause_bytes=lambda: 1000,
                        resume_bytes=100)
    publish(s)
    batch = s.take()
    assert batch is not None
    s.committed(batch, 1.0, 1.0)
    return s


def test_publishes_stop_flowing_exactly_two_settle_delays_after_their_last_commit() -> None:
    assert _publish_committed_at_1().request(1.25, urgent=False) == "timer"  # ride along
    # The first ask 2 * settle_delay after it (nothing staged before waits to ride along).
    assert _publish_committed_at_1().request(1.5, urgent=False) == "now"  # not flowing


def test_state_waits_settle_delay_from_when_it_was_staged_not_from_the_timer() -> None:
    """The timer armed for an ack that a publish commit took since must not commit the
    next ack alone at once: that one waits its own settle_delay for a publish commit."""
    s = _publish_committed_at_1()
    s.core.subscribe(Session("c"), 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=10, now=1.0)
    assert s.request(1.0, urgent=False) == "timer"  # armed at 1.0 for 1.25
    publish(s)
    assert s.request(1.0) == "now"
    taken = s.take()  # the publish commit takes the subscription along
    assert taken is not None and taken.group_defs
    s.committed(taken, 1.125, 1.125)
    s.core.subscribe(Session("d"), 1, kind="consume", patterns=["orders/v1/1"], group="h",
                     prefetch=10, now=1.125)
    assert s.request(1.125, urgent=False) == "none"  # the armed timer serves it
    assert s.timer_fired(1.25) == 0.125  # staged at 1.125: it may wait until 1.375
    assert s.request(1.25, urgent=False) == "none"  # the timer is still armed
    assert s.timer_fired(1.375) is None  # its settle_delay is over: commit it now
    batch = s.take()
    assert batch is not None and not batch.messages and batch.group_defs
    # Taken: the next change waits its own settle_delay, on a timer armed afresh.
    s.committed(batch, 1.5, 1.5)
    s.core.subscribe(Session("e"), 1, kind="consume", patterns=["orders/v1/1"], group="i",
                     prefetch=10, now=1.5)
    assert s.request(1.5, urgent=False) == "timer"
    assert s.timer_fired(1.75) is None


@pytest.mark.parametrize("ends", [1.25, 1.5])  # exactly its settle_delay, and past it
def test_state_held_past_settle_delay_by_a_commit_goes_when_that_commit_ends(
        ends: float) -> None:
    s = CommitScheduler(Broker(), settle_delay=0.25, pause_bytes=lambda: 1000,
                        resume_bytes=100)
    publish(s)
    first = s.take()
    assert first is not None
    s.core.subscribe(Session("c"), 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=10, now=1.0)
    s.committed(first, 1.0, 1.0)  # publishes flow: the subscription rides along...
    publish(s)
    second = s.take()  # ...with this publish commit, which is slow
    assert second is not None and second.group_defs
    s.core.subscribe(Session("d"), 1, kind="consume", patterns=["orders/v1/1"], group="h",
                     prefetch=10, now=1.0)
    assert s.request(1.0, urgent=False) == "none"  # the timer armed by the first
    assert s.timer_fired(1.25) is None and s.take() is None  # the writer is busy
    # The commit ends once the staged state waited its settle_delay: it goes at once.
    assert s.committed(second, ends, ends) == "now"
    assert s.take() is not None


def test_state_staged_during_a_publish_commit_rides_along_with_the_next() -> None:
    """A subscription staged while a publish commit is written is not committed at once
    when that commit ends: publishes flow, so a timer is armed for it."""
    s = scheduler()
    publish(s)
    batch = s.take()
    assert batch is not None
    s.core.subscribe(Session("c"), 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=10, now=0.0)
    assert s.committed(batch, 0.0, 0.0) == "timer"
    assert s.take() is not None  # what the timer then commits


@pytest.mark.parametrize("pause, resume", [(p, 10**6) for p in range(40, 130, 7)]
                         + [(400, 30), (400, 31)])
def test_paused_publishers_resume_once_at_most_min_resume_or_a_quarter_is_uncommitted(
        pause: int, resume: int) -> None:
    threshold = min(resume, pause // 4)
    for left, resumed in ((threshold, True), (threshold + 1, False)):
        s = CommitScheduler(Broker(), settle_delay=DELAY, pause_bytes=lambda: pause,
                            resume_bytes=resume)
        conn = object()
        publish(s, size=pause + 1)
        assert s.staged(conn)
        batch = s.take()
        assert batch is not None
        publish(s, size=left)  # staged while the first is written
        s.committed(batch, 0.0, 0.0)
        assert s.uncommitted_bytes == left
        assert s.resumable() == ([conn] if resumed else [])


@pytest.mark.parametrize("flowing", [True, False])
def test_state_a_pump_turn_leaves_staged_is_committed_not_urgently(flowing: bool) -> None:
    e, host, clock = timed_engine()
    publish_committed(e, host)
    if not flowing:
        clock.now += 2 * DELAY + 1
    consume(e, Session("c"))  # staged state the pump turn finds
    assert pump(e.core, clock.now).commit
    e.pump()
    if flowing:  # rides along with the publishes' commits
        assert host.writes == [] and [d for d, _ in host.later] == [DELAY]
    else:
        assert len(host.writes) == 1 and host.later == []


def test_a_pump_turn_with_nothing_staged_asks_for_no_commit() -> None:
    e, _, _ = timed_engine()
    assert not pump(e.core, 100.0).commit


def test_a_refused_numbered_publish_is_answered_once_its_refusal_is_durable() -> None:
    """Else a resend after a crash would look like a gap. (A producer's first sequence
    on a channel has no row to keep it in: its refusal is answered at once, and
    written with the state once a message is stored there.)"""
    e, host = engine()
    door = Door()
    p = Session("app", producer_id="00000000000000aa")
    [_, out] = e.publish([Send("orders/v1/1", b"1", pseq=1), Send("orders/v1/1", b"{", pseq=2)],
                         ALLOW_ALL, door.reply, session=p, publisher=door)
    assert out.code == int(ErrorCode.INVALID_PAYLOAD)
    assert door.answers == []
    [batch] = host.writes  # the producer state remembering the refusal
    e.committed(batch)
    assert door.answers == [([(1, 0), (0, int(ErrorCode.INVALID_PAYLOAD))], None)]
    door2 = Door()  # a first sequence refused: nothing to write, answered at once
    [bad] = e.publish([Send("bad", b"1", pseq=1)], ALLOW_ALL, door2.reply, session=p,
                      publisher=door2)
    assert bad.code == int(ErrorCode.INVALID_CHANNEL) and host.writes == [batch]
    assert door2.answers == [([(0, int(ErrorCode.INVALID_CHANNEL))], None)]


def test_a_refused_numbered_publish_is_answered_when_its_refusal_cannot_be_stored() -> None:
    """Storage out of reach must not hold a refusal back until it returns."""
    e, host = engine()
    door = Door()
    p = Session("app", producer_id="00000000000000aa")
    p.producer_states.clear()
    e.core.state.producers.states.clear()
    bad = Session("app", producer_id="00000000000000bb")
    e.publish([Send("orders/v1/1", b"{", pseq=1)], ALLOW_ALL, door.reply, session=bad,
              publisher=door)
    assert door.answers == [([(0, int(ErrorCode.INVALID_PAYLOAD))], None)]  # no row
    e.publish([Send("orders/v1/1", b"1", pseq=2), Send("orders/v1/1", b"{", pseq=3)],
              ALLOW_ALL, door.reply, session=p, publisher=door)
    [batch] = host.writes
    e.not_written(batch, StorageUnavailable("redis is down"), stop=False)
    assert door.answers[1][0][1] == (0, int(ErrorCode.INVALID_PAYLOAD))
    # While the broker refuses publishes for it, a numbered refusal is answered at once.
    e.core.storage_refusal = StorageUnavailable("redis is down")
    door2 = Door()
    [out] = e.publish([Send("orders/v1/1", b"2", pseq=4)], ALLOW_ALL, door2.reply,
                      session=p, publisher=door2)
    assert out.code == int(ErrorCode.STORAGE_UNAVAILABLE)
    assert door2.answers == [([(0, int(ErrorCode.STORAGE_UNAVAILABLE))], None)]


def test_a_publish_latency_is_observed_once_confirmed_in_seconds_since_received() -> None:
    e, host = engine()
    seen: list[float] = []

    class Histogram:
        def observe(self, seconds: float) -> None:
            seen.append(seconds)

    e.publish_latency = Histogram()
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    assert seen == []
    e.committed(host.writes.pop())
    [latency] = seen
    assert 0 <= latency < 1
    e.publish(sends(1), ALLOW_ALL, Door().reply, publisher=Door())
    e.not_written(host.writes.pop(), StorageFull("disk full"), stop=False)
    assert len(seen) == 1  # a publish that was not stored is not a latency


def test_after_a_failed_commit_a_replay_of_a_durable_send_is_still_its_duplicate() -> None:
    """Numbered sends in one publish: pseq 1 was stored before (its replay is answered
    from the producer's state), pseq 2 was in the commit that failed (its error, on its
    channel); a send refused at once keeps its own refusal."""
    e, host = engine()
    p = Session("app", producer_id="00000000000000aa")
    e.publish([Send("orders/v1/1", b"1", pseq=1)], ALLOW_ALL, Door().reply, session=p,
              publisher=Door())
    e.committed(host.writes.pop())
    said: list[Any] = []
    e.publish([Send("orders/v1/1", b"1", pseq=1), Send("orders/v1/2", b"2", pseq=2),
               Send("bad", b"3")], ALLOW_ALL,
              lambda outcomes, exc: said.append((outcomes, exc)), session=p, publisher=Door())
    full = StorageFull("disk full")
    e.not_written(host.writes.pop(), full, stop=False)
    [(outcomes, exc)] = said
    assert exc is full
    replay, lost, bad = outcomes
    assert (replay.code, replay.duplicate, replay.seq, replay.channel) == (0, True, 1,
                                                                           "orders/v1/1")
    assert (lost.code, lost.channel, lost.error) == (int(full.code), "orders/v1/2",
                                                     full.message)
    assert bad.code == int(ErrorCode.INVALID_CHANNEL) and bad.channel == "bad"


def test_a_forced_commit_carries_delivery_state_once_and_later_deliveries_wait() -> None:
    """Group states that deliveries alone changed are committed when forced (the
    ticker), not by every take after that."""
    s = scheduler()
    session = Session("c")
    s.core.subscribe(session, 1, kind="consume", patterns=["orders/v1/1"], group="g",
                     prefetch=10, now=0.0)

    def deliver() -> None:
        publish(s)
        batch = s.take()
        assert batch is not None
        s.committed(batch, 0.0, 0.0)
        assert pump(s.core, 0.0).deliveries
        assert s.core.has_dirty and not s.core.batch  # only deliveries changed state

    deliver()
    assert s.take() is None  # nothing asks for it
    s.request(0.0, force=True)
    forced = s.take()
    assert forced is not None and forced.group_states
    s.committed(forced, 0.0, 0.0)
    deliver()
    assert s.take() is None  # the force was used up


def test_nothing_is_delivered_while_the_lease_may_have_run_out_and_it_resumes_after() -> None:
    """A cluster primary woken from a pause past its lease delivers nothing until it knows
    it still holds it (``may_deliver``): another broker may serve, and ack, those messages
    already. It looks again shortly, and delivers once allowed."""
    e, host, _ = timed_engine()
    delivered: list[int] = []

    class Conn:
        def send_deliveries(self, sid: int, items: list[Any]) -> None:
            delivered.extend(d.seq for d in items)

    e.core.subscribe(Session("c", conn=Conn()), 1, kind="consume", patterns=["orders/v1/1"],
                     group="g", prefetch=10, now=100.0)
    e.publish(sends(2), ALLOW_ALL, Door().reply, publisher=Door())
    e.committed(host.writes.pop())
    holds = [False]
    e.may_deliver = lambda: holds[0]
    host.soon.clear()
    e.pump()
    assert delivered == []
    assert [d for d, _ in host.later] == [DELIVERY_RECHECK_S]  # looks again shortly
    holds[0] = True
    host.later.pop()[1]()  # the recheck asks for a pump turn
    assert host.soon == [e.pump]
    e.pump()
    assert delivered == [1, 2]
