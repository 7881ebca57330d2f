"""The ceiling of any Python HTTP server on this machine, for test e (issue 19,
target 4): the bench's own HTTP client (``http_bench.RawConnection``, 4 processes x 16
keep-alive connections, one request in flight on each) against servers that do nothing
but answer ``POST /v1/messages/...`` with a fixed 201 and a small JSON body:

  httptools  an asyncio protocol with the httptools request parser (the parser uvicorn
             and minou use): what parsing and answering alone cost
  hop        the same, answering only after a thread hop shared by every request that
             came in meanwhile (minou's group commit, with no disk): what the writer
             hand-off adds

Both run on uvloop in one process, as minou's broker does. Printed: requests per
second, median of ``--runs``, and the server's CPU % of one core.

    .venv/bin/python bench/http_floor.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = ("httptools", "hop")
_BODY = b'{"seq":1,"id":"0000000000000000","channel":"bench/v1/q"}'
ANSWER = (b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
          b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY))


def _uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


class _Server(asyncio.Protocol):
    pool = ThreadPoolExecutor(1)
    waiting: list[asyncio.Transport] = []  # answered after the next hop (kind "hop")
    hopping = False

    def __init__(self, kind: str) -> None:
        import httptools

        self.kind = kind
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.kind == "httptools":
            self.transport.write(ANSWER)
            return
        _Server.waiting.append(self.transport)
        if not _Server.hopping:
            _Server.hopping = True
            loop = asyncio.get_running_loop()
            loop.run_in_executor(self.pool, int).add_done_callback(_Server.hopped)

    @staticmethod
    def hopped(_fut: Any) -> None:
        # Everything that came in during the hop goes in the next one, like a commit.
        waiting, _Server.waiting = _Server.waiting, []
        for transport in waiting:
            if not transport.is_closing():
                transport.write(ANSWER)
        if _Server.waiting:
            asyncio.get_running_loop().run_in_executor(_Server.pool, int).add_done_callback(
                _Server.hopped)
        else:
            _Server.hopping = False


def serve(kind: str, ready: Any) -> None:
    _uvloop()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Server(kind), "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        await asyncio.sleep(3600)

    asyncio.run(main())


def client(port: int, conns: int, seconds: float, barrier: Any, out: Any) -> None:
    from http_bench import RawConnection

    _uvloop()

    async def main() -> None:
        headers = (f"Host: 127.0.0.1:{port}\r\nAuthorization: Bearer x\r\n"
                   "Content-Type: application/json\r\n").encode()
        body = b'"' + b"x" * 98 + b'"'
        pool = [RawConnection("127.0.0.1", port, headers) for _ in range(conns)]
        await asyncio.gather(*(c.open() for c in pool))
        barrier.wait(30)
        t0 = time.monotonic()
        deadline, done = t0 + seconds, 0

        async def loop(conn: RawConnection) -> None:
            nonlocal done
            while time.monotonic() < deadline:
                status, _ = await conn.post("/v1/messages/bench/v1/q", body)
                if status == 201:
                    done += 1

        await asyncio.gather(*(loop(c) for c in pool))
        out.put((done, t0, time.monotonic()))
        for c in pool:
            c.close()

    asyncio.run(main())


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_clients(ctx: Any, port: int, procs: int, conns: int, seconds: float,
                  out: Any) -> list[Any]:
    """``procs`` client processes of ``conns`` connections each, started together (a
    barrier): they put their results on ``out``."""
    barrier = ctx.Barrier(procs + 1)
    clients = [ctx.Process(target=client, args=(port, conns, seconds, barrier, out))
               for _ in range(procs)]
    for c in clients:
        c.start()
    barrier.wait(60)
    return clients


def one_run(kind: str, procs: int, conns: int, seconds: float) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    ready, out = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=serve, args=(kind, ready))
    server.start()
    try:
        port = ready.get(timeout=30)
        clients = start_clients(ctx, port, procs, conns, seconds, out)
        cpu0, wall0 = cpu_s(server.pid), time.monotonic()  # type: ignore[arg-type]
        results = [out.get(timeout=seconds + 60) for _ in clients]
        cpu1, wall1 = cpu_s(server.pid), time.monotonic()  # type: ignore[arg-type]
        for c in clients:
            c.join()
    finally:
        server.kill()
        server.join()
    total = sum(r[0] for r in results)
    span = max(r[2] for r in results) - min(r[1] for r in results)
    return total / span, 100 * (cpu1 - cpu0) / (wall1 - wall0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(f"{args.procs} client processes x {args.conns} keep-alive connections, "
          f"{args.seconds:g} s a run, {args.runs} run(s)")
    print("| server | requests/s (min - max) | server CPU % of one core |\n|---|---:|---:|")
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            parser.error(f"unknown server {kind!r}: expected some of {', '.join(KINDS)}")
        runs = [one_run(kind, args.procs, args.conns, args.seconds) for _ in range(args.runs)]
        rates = [r[0] for r in runs]
        print(f"| {kind} | {statistics.median(rates):,.0f} ({min(rates):,.0f} - "
              f"{max(rates):,.0f}) | {statistics.median(r[1] for r in runs):.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
