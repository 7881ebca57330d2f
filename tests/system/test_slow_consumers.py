"""Consumers that stop reading: they are cut after a while, their deliveries go to
readers that read, and all of them together pin a bounded amount of broker memory.
Real broker processes, raw sockets that never read."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import minou
from minou.protocol import frames as f

from ..conftest import RawPeer, signed_hello, wait_until

BODY = "x" * 4000  # ~4 KB messages, as in the report


def silent_consumer(url: str, name: str, pattern: str, group: str,
                    prefetch: int = 1000) -> socket.socket:
    """HELLO and SUBSCRIBE, then never read the socket again."""
    peer = RawPeer(url)
    peer.hello(name)
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fill up fast
    peer.write(f.encode(f.Subscribe(1, 1, "consume", [pattern], group=group, prefetch=prefetch)))
    return peer.sock


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def read_all(broker: Any, pattern: str, group: str, count: int) -> set[tuple[str, int]]:
    """(channel, seq) of up to ``count`` messages consumed and acked by a reader."""
    seen: set[tuple[str, int]] = set()
    with broker.connect_sync("reader") as r:
        sub = r.consume(pattern, group=group, prefetch=100)
        deadline = time.monotonic() + 60
        while len(seen) < count and time.monotonic() < deadline:
            msg = sub.get(timeout=10)
            seen.add((msg.channel, msg.seq))
            msg.ack()
    return seen


def status(broker) -> dict:
    with minou.connect_sync(broker.url, **broker.admin_auth()) as a:
        return a.admin("status")


def test_a_consumer_that_reads_nothing_is_cut_and_its_messages_go_to_a_reader(
        broker_factory, tmp_path):
    cfg = tmp_path / "stall.toml"
    cfg.write_text("slow_consumer_seconds = 2\n")
    b = broker_factory.make(config=cfg).start()
    # Prefetch all 3,000 (12 MB): more than the kernel's socket buffers take on any
    # machine (the send side autotunes up to net.ipv4.tcp_wmem's max, 4 MB here), so
    # deliveries wait in the broker's own buffer and the stall shows there.
    stuck = silent_consumer(b.url, "stuck", "slow/v1/*", "g", prefetch=3000)
    try:
        with b.connect_sync("producer") as p:
            p.send_many([(f"slow/v1/{i % 8}", BODY) for i in range(3000)])  # ~12 MB
        wait_until(lambda: status(b)["flow"]["slow_consumers_cut"] >= 1, 20,
                   what="the silent consumer to be cut")
        assert "no deliveries were read for 2 s" in b.output
        # Everything it held comes to a consumer that reads.
        assert len(read_all(b, "slow/v1/*", "g", 3000)) == 3000
    finally:
        stuck.close()


def test_silent_consumers_together_pin_a_bounded_amount_of_memory(broker_factory,
                                                                  tmp_path):
    """20 consumers subscribe with prefetch 5000 and never read, under 4 KB messages:
    without a budget each would hold its 4 MiB water mark (80 MB, beside what the kernel
    holds); with an 8 MiB budget the broker holds about the budget plus 256 KiB per
    connection."""
    budget = 8 << 20
    cfg = tmp_path / "budget.toml"
    cfg.write_text(f"delivery_buffer_bytes = {budget}\nslow_consumer_seconds = 600\n")
    b = broker_factory.make(config=cfg).start()
    silent = [silent_consumer(b.url, f"silent-{i}", "mem/v1/*", f"g{i}", prefetch=5000)
              for i in range(20)]
    try:
        before = rss_mib(b.proc.pid)
        with b.connect_sync("producer") as p:
            for _ in range(10):
                p.send_many([(f"mem/v1/{i % 8}", BODY) for i in range(1000)])  # 4 MB
        time.sleep(1.5)  # a few ticks
        flow = status(b)["flow"]
        bound = budget + 20 * ((256 << 10) + (1 << 20))
        assert flow["unsent_delivery_bytes"] <= bound, flow
        assert flow["budget_paused_connections"] >= 1, flow
        grown = rss_mib(b.proc.pid) - before
        assert grown < 150, f"RSS grew {grown:.0f} MiB"  # 40 MB stored + the budget
        # A reader of its own group still gets messages while the silent ones are held.
        with b.connect_sync("live") as r:
            got = r.consume("mem/v1/*", group="live", start="oldest").get(timeout=10)
            assert got.payload == BODY
    finally:
        for s in silent:
            s.close()


def _anon_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def _small_window_peer(broker: Any) -> RawPeer:
    """A raw connection with a small receive window from the start (set after the
    connect, it stays tiny for good): what it does not read stays in the broker."""
    peer = RawPeer(broker.url)
    peer.sock.close()
    peer.sock = socket.socket()
    peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.sock.settimeout(10)
    peer.sock.connect(("127.0.0.1", broker.port))
    return peer


def _steady_anon_mib(pid: int) -> float:
    """``_anon_mib`` once it stopped moving (three readings 0.3 s apart within 1 MiB)."""
    last, steady = -1.0, 0
    while steady < 3:
        time.sleep(0.3)
        now = _anon_mib(pid)
        steady = steady + 1 if abs(now - last) < 1 else 0
        last = now
    return last


def _silent_reader(broker: Any, reads: int) -> RawPeer:
    """HELLO and ``reads`` READs of 8 messages of ``wide/v1/r`` in one write, then
    nothing read (a small receive window from the start: set later, it stays tiny)."""
    peer = _small_window_peer(broker)
    frames = [f.encode(f.Read(i + 1, "wide/v1/r", 1, 8)) for i in range(reads)]
    peer.write(f.encode(signed_hello("app")) + b"".join(frames))
    return peer


def test_a_reader_asking_on_without_reading_the_answers_holds_little(broker) -> None:
    """READs pipelined behind the HELLO by a client that reads none of the answers:
    the broker answers a few, then reads nothing more from it until it reads some
    (before, every answer waited in the broker: 200 READs of 8 MB held 1.1 GB). Once
    it reads, every answer comes, in order."""
    with broker.connect_sync("app") as c:
        for _ in range(40):
            c.send("wide/v1/r", "y" * 250_000)
    before = _anon_mib(broker.proc.pid)
    peer = _silent_reader(broker, 60)
    last = _steady_anon_mib(broker.proc.pid)
    assert last - before < 50, f"60 unread answers of 2 MB: the broker grew {last - before:.0f} MiB"
    assert isinstance(peer.read(), f.Welcome)
    answers = [peer.read() for _ in range(60)]
    assert [a.req for a in answers] == list(range(1, 61))  # type: ignore[attr-defined]
    assert all(len(a.items) == 8 for a in answers)  # type: ignore[attr-defined]
    peer.close()


def test_a_reader_whose_reads_wait_and_that_reads_nothing_is_cut(broker_factory,
                                                               tmp_path) -> None:
    """Its READs wait for it to read the answers; reading nothing at all for
    ``slow_consumer_seconds``, it is cut (logged, counted), as a consumer that stops
    reading its deliveries is: what it held goes."""
    cfg = tmp_path / "stall.toml"
    cfg.write_text("slow_consumer_seconds = 2\n")
    b = broker_factory.make(config=cfg).start()
    with b.connect_sync("app") as c:
        for _ in range(40):
            c.send("wide/v1/r", "y" * 250_000)
    peer = _silent_reader(b, 60)
    wait_until(lambda: status(b)["flow"]["slow_consumers_cut"] >= 1, 20,
               what="the silent reader to be cut")
    assert "no answers were read for 2 s while more requests waited" in b.output
    peer.close()


def test_requests_pipelined_by_a_client_that_reads_no_answer_wait(broker) -> None:
    """Any request, not only READ: 10,000 OFFSETS of 100 channels (~7 KB answers each)
    sent by a client that reads nothing held ~70 MB (20,000: 141 MB, and on). Past
    16 MiB of answers unread nothing more is read from it; once it reads, every answer
    comes, in order."""
    names = [f"ch{i:03d}/v1/" + "x" * 60 for i in range(100)]
    with broker.connect_sync("app") as c:
        for name in names:
            c.send(name, {"n": 1})
    before = _anon_mib(broker.proc.pid)
    peer = _small_window_peer(broker)
    peer.write(f.encode(signed_hello("app")))
    for chunk in range(20):
        frames = b"".join(f.encode(f.Offsets(chunk * 500 + i + 1, names)) for i in range(500))
        peer.sock.settimeout(0.5)
        try:
            peer.sock.sendall(frames)
        except TimeoutError:
            break  # the broker stopped reading this client: as meant
    peer.sock.settimeout(10)
    time.sleep(1)
    grown = _anon_mib(broker.proc.pid) - before
    assert grown < 45, f"unread answers grew the broker by {grown:.0f} MiB"
    assert isinstance(peer.read(), f.Welcome)
    first = [peer.read() for _ in range(300)]
    assert [a.req for a in first] == list(range(1, 301))  # type: ignore[attr-defined]
    assert all(len(a.value) == 100 for a in first)  # type: ignore[attr-defined]
    peer.close()


def test_kv_reads_pipelined_by_a_client_that_reads_no_answer_wait(broker) -> None:
    """Answers that come after a storage read (a KV get) are written later than the
    request is handled: 300 gets of a 900 KB value by a client reading nothing held
    257 MiB. Now at most 4 such answers are on their way at once, and none past 16 MiB
    unread; once the client reads, they come in order."""
    with broker.connect_sync("app") as c:
        c.kv("big").put("k", "x" * 900_000)
    before = _anon_mib(broker.proc.pid)
    peer = _small_window_peer(broker)
    gets = b"".join(f.encode(f.Admin(i + 1, "kv.get", {"bucket": "big", "key": "k"}))
                    for i in range(300))
    peer.write(f.encode(signed_hello("app")) + gets)
    last = _steady_anon_mib(broker.proc.pid)
    assert last - before < 60, f"300 unread KV answers grew the broker by {last - before:.0f} MiB"
    assert isinstance(peer.read(), f.Welcome)
    first = [peer.read() for _ in range(30)]
    assert [a.req for a in first] == list(range(1, 31))  # type: ignore[attr-defined]
    peer.close()


def test_kv_watch_polls_answered_at_once_by_a_client_that_reads_no_answer_wait(
        broker) -> None:
    """A KV watch's long poll (``kv.read`` with ``wait``) that has revisions to answer
    answers at once, a page of up to 4 MiB (KV_PAGE_BYTES), as a ``kv.read`` without
    ``wait`` does, and counts as one: 200 of them (after=0, wait=30) sent by a client
    reading nothing were not counted by READS_PER_CONNECTION, and held ~800 MB of
    answers in the broker (the long-poll bound counts only those that wait). Now at
    most 4 are on their way at once, none past 16 MiB unread; once it reads, they come
    in order, each the whole page."""
    with broker.connect_sync("app") as c:
        bucket = c.kv("wide")
        for i in range(5):  # 4.5 MB of values: each poll answers them all, one page
            bucket.put(f"k{i}", "x" * 900_000)
    before = _anon_mib(broker.proc.pid)
    peer = _small_window_peer(broker)
    polls = b"".join(f.encode(f.Admin(i + 1, "kv.read", {"bucket": "wide", "after": 0,
                                                         "wait": 30}))
                     for i in range(200))
    peer.write(f.encode(signed_hello("app")) + polls)
    last = _steady_anon_mib(broker.proc.pid)
    assert last - before < 80, f"200 unread KV polls grew the broker by {last - before:.0f} MiB"
    assert isinstance(peer.read(), f.Welcome)
    first = [peer.read() for _ in range(10)]
    assert [a.req for a in first] == list(range(1, 11))  # type: ignore[attr-defined]
    assert [len(a.value["entries"]) for a in first] == [5] * 10  # type: ignore[attr-defined]
    peer.close()


def test_kv_watch_polls_woken_at_once_by_a_commit_answer_a_few_at_a_time(broker) -> None:
    """60 polls that wait (after the bucket's revision), from a client reading nothing,
    all woken by one commit of 4.5 MB of values: each is to answer that page. They
    answer as reads do, 4 at most on their way and none past 16 MiB unread (before,
    the 60 pages, ~270 MB, were built and held at once); once it reads, all come."""
    with broker.connect_sync("app") as c:
        revision = c.kv("wide").put("k", "start")
    before = _anon_mib(broker.proc.pid)
    peer = _small_window_peer(broker)
    polls = b"".join(f.encode(f.Admin(i + 1, "kv.read", {"bucket": "wide",
                                                         "after": revision, "wait": 30}))
                     for i in range(60))
    peer.write(f.encode(signed_hello("app")) + polls)
    wait_until(lambda: status(broker)["long_polls"].get("KV watches") == 60,
               what="60 polls waiting")
    with broker.connect_sync("app") as c:  # one commit: every poll woken at once
        c.send_many([{"channel": "_kv/v1/wide", "payload": "x" * 900_000, "key": f"v{i}"}
                     for i in range(5)])
    last = _steady_anon_mib(broker.proc.pid)
    assert last - before < 80, f"60 woken unread KV polls grew the broker by " \
                               f"{last - before:.0f} MiB"
    assert isinstance(peer.read(), f.Welcome)
    answers = [peer.read() for _ in range(60)]
    assert sorted(a.req for a in answers) == list(range(1, 61))  # type: ignore[attr-defined]
    assert {len(a.value["entries"]) for a in answers} == {5}  # type: ignore[attr-defined]
    peer.close()
