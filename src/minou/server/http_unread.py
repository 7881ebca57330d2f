"""HTTP answers written and not read: what the broker holds for them is bounded in time
and in all. No I/O but ``abort`` on the sockets it cuts.

An HTTP answer is written whole into its socket's buffer (a KV page of up to 4 MiB, a
browse page of 8 MiB, a value of 1 MiB), and a client that asked and never reads
leaves it there: its socket stays open (the idle timeout's close waits for the buffer
to drain), so the answer was held for good. 100 sockets asking a 4.5 MB KV watch page
each and reading nothing held 434 MiB, still held 25 s later; max_connections of them
would be 40 GB. So, checked every tick over the HTTP sockets not upgraded to a
WebSocket (those have bounds of their own):

* a socket whose unsent answer bytes have not gone down for ``slow_consumer_seconds``
  is cut, as a native client whose answers wait unread is;
* past HTTP_UNSENT_BYTES over all of them, the sockets that have sent nothing for
  EVICT_MIN_IDLE_S are cut, the fullest first, until the rest fit.

Each cut drops its socket's buffer (``abort``), is counted as a slow consumer and
logged (rate limited).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..limits import EVICT_MIN_IDLE_S


class UnreadAnswers:
    def __init__(self) -> None:
        # socket -> (bytes unsent at the last look, since when they have not gone down)
        self.seen: dict[Any, tuple[int, float]] = {}
        self.unsent = 0  # over every socket watched, at the last look

    def check(self, sockets: Iterable[tuple[Any, Any]], now: float, stall_s: float,
              budget: int) -> list[tuple[Any, int, float]]:
        """The sockets to cut now, each with the answer bytes it holds and how long it
        has sent none (``now`` is monotonic); the caller aborts them. ``sockets``: each
        with its protocol, whose transport (``http_fast.CoalescingTransport``) counts
        the bytes of the answers written since its buffer was last empty: the answer
        being written is held whole until it is, not only its unsent part (100 sockets
        with 1.5 MB unsent each held 4.3 MB each)."""
        seen: dict[Any, tuple[int, float]] = {}
        held: dict[Any, int] = {}
        for sock, proto in sockets:
            size = sock.get_write_buffer_size()
            if size <= 0:
                continue
            before = self.seen.get(sock)
            seen[sock] = (size, now if before is None or size < before[0] else before[1])
            held[sock] = max(size, getattr(getattr(proto, "transport", None),
                                           "outstanding", 0))
        self.seen = seen
        total = sum(held.values())
        cut = [(s, held[s], now - since) for s, (_, since) in seen.items()
               if now - since >= stall_s]
        total -= sum(size for _, size, _ in cut)
        if total > budget:
            chosen = {id(s) for s, _, _ in cut}
            stalled = sorted(((s, held[s], now - since) for s, (_, since) in seen.items()
                              if id(s) not in chosen and now - since >= EVICT_MIN_IDLE_S),
                             key=lambda item: -item[1])
            for item in stalled:
                if total <= budget:
                    break
                cut.append(item)
                total -= item[1]
        for sock, _, _ in cut:
            seen.pop(sock, None)
        self.unsent = total
        return cut


def cut_all(cut: list[tuple[Any, int, float]], log_cut: Callable[[Any, int, float], None]
            ) -> int:
    """Abort the sockets ``check`` chose (their buffers are dropped); how many."""
    for sock, size, silent in cut:
        log_cut(sock, size, silent)
        sock.abort()
    return len(cut)
