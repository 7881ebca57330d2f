"""engine.CommitScheduler without a loop, a thread or a disk: time is passed in."""

from __future__ import annotations

from minou.core.broker import Broker
from minou.errors import StorageFull
from minou.protocol.frames import Send
from minou.server.engine import CommitScheduler

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
    s.timer_fired()
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
    page = [Msg("orders/v1/1", s, f"i{s}", b"1") for s in (1, 2)]
    engine.loaded(Core(), load, page, page=2)  # type: ignore[arg-type]
    engine.loaded(Core(), load, page[:1], page=2)  # type: ignore[arg-type]
    assert seen == [("orders/v1/1", 1, [1, 2], 3), ("orders/v1/1", 1, [1], 100)]
