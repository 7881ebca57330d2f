"""The RESP request parser on hiredis's C reader, when it is installed (``minou[resp]``).

Parsing pipelined commands was a fifth of the Redis door's time per ``XADD`` in pure
Python (4.4 µs a command; 0.9 µs here, the C reader's 0.6 and the bookkeeping below
that keeps the results exact). hiredis reads *replies*, so it
takes more than Redis accepts in a request and words its errors its own way; this
parser gives exactly ``RespParser``'s results for what client libraries send (arrays
of bulk strings, written the one way they all write them) and hands everything else to
``RespParser``, from the start of the first command not yet returned:

* an inline command (``PING\\r\\n`` from ``nc``), a non-bulk element (``:1``, ``$-1``,
  a nested array), anything hiredis refuses: the pure parser reads it, and answers in
  Redis's words where the stream is broken;
* a command over a limit, and an unfinished one whose headers already say it will be
  (``*1048577``, ``$99999999999``): the pure parser refuses them as soon as they come,
  as it would have;
* an unfinished command over 64 KiB (a large message arriving read by read): the pure
  parser holds it, costing per argument, not per byte, and one copy of it, not three.

The pure parser keeps the stream until it stands between two commands again, then the
C reader takes it back. Where the C reader is more lenient than Redis and cannot be told
apart cheaply — a ``+``, ``=`` or ``(`` string where a bulk string belongs, the two bytes
after a bulk not being CRLF (Redis does not look at them either) — the command is read as
the bulk strings it carries; only that connection's own stream is concerned.

The bytes of the unfinished command are kept (``_raw``) so the pure parser can take
over from it: where each returned command ended is computed from its arguments (their
canonical framing: what the libraries send), once per read, in C-level loops.
"""

from __future__ import annotations

from itertools import chain

import hiredis

from .resp import (
    ARG_OVERHEAD,
    MAX_ARRAY,
    RespParser,
    RespProtocolError,
    default_max_request,
)

# An unfinished command up to this size is checked by a pure parser of its own after
# each read; a bigger one is left to the pure parser until it ends.
PROBE_LIMIT = 64 * 1024


class HiredisParser:
    """``RespParser``'s interface and results (see the module docstring)."""

    def __init__(self, max_bulk: int, max_request: int | None = None) -> None:
        self.max_bulk = max_bulk
        self.max_request = max_request if max_request is not None else \
            default_max_request(max_bulk)
        self._reader = hiredis.Reader()
        self._raw = bytearray()  # the unfinished command's bytes, from its first
        self._pure: RespParser | None = None  # reading until the next boundary
        self.handovers = 0  # times the pure parser took the stream (the slow path)
        self.error: RespProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a request not complete yet (bounded as ``RespParser``'s)."""
        return self._pure.buffered if self._pure is not None else len(self._raw)

    @property
    def pending(self) -> int:
        """Bytes held of the request not complete yet (as ``RespParser.pending``)."""
        return self._pure.pending if self._pure is not None else len(self._raw)

    def feed(self, data: bytes) -> list[list[bytes]]:
        if self.error is not None:
            return []
        if self._pure is not None:
            return self._feed_pure(data)
        if not data:
            return []
        raw = self._raw
        raw += data
        reader = self._reader
        out: list[list[bytes]] = []
        try:
            reader.feed(data)
            max_bulk, max_request = self.max_bulk, self.max_request
            while (command := reader.gets()) is not False:
                # Only a non-empty array of bulk strings within the limits is a command
                # the C reader read as Redis would; anything else: the pure parser's.
                if type(command) is not list or not command or len(command) > MAX_ARRAY:
                    return self._hand_over(out)
                try:
                    total = len(b"".join(command))  # TypeError: not all bytes
                except TypeError:
                    return self._hand_over(out)
                if total + ARG_OVERHEAD * len(command) > max_request or (
                        total > max_bulk and max(map(len, command)) > max_bulk):
                    return self._hand_over(out)
                out.append(command)
        except hiredis.ProtocolError:
            return self._hand_over(out)
        if out:
            del raw[:_framed_size(out)]
        if len(raw) > PROBE_LIMIT:  # a big command: the pure parser holds it (per bulk,
            return self._hand_over([], returned=out)  # not per byte), and counts
        if raw:  # the unfinished command: refused now if its headers already say so
            probe = RespParser(self.max_bulk, self.max_request)
            if probe.feed(bytes(raw)) or probe.error is not None:
                # (complete to the pure parser: an inline "$10" the C reader waits on)
                return self._hand_over([], returned=out)
        return out

    def _hand_over(self, out: list[list[bytes]], returned: list[list[bytes]] | None = None
                   ) -> list[list[bytes]]:
        """The pure parser reads on from the first command not returned: ``out`` were
        read from the start of ``_raw``, ``returned`` before it (already cut off)."""
        raw = self._raw
        if out:
            del raw[:_framed_size(out)]
        self.handovers += 1
        pending = bytes(raw)
        raw.clear()
        self._reader = hiredis.Reader()
        self._pure = RespParser(self.max_bulk, self.max_request)
        return (returned or []) + out + self._feed_pure(pending)

    def _feed_pure(self, data: bytes) -> list[list[bytes]]:
        pure = self._pure
        assert pure is not None
        out = pure.feed(data)
        if pure.error is not None:
            self.error = pure.error
        elif pure.at_boundary:
            self._pure = None  # the C reader takes the next command
        return out


def _framed_size(commands: list[list[bytes]]) -> int:
    """Bytes of ``commands`` as libraries frame them (``*<n>\\r\\n`` and ``$<len>\\r\\n
    <arg>\\r\\n`` each): where the last of them ended in the stream."""
    lengths = list(map(len, chain.from_iterable(commands)))
    # The digits of many numbers at C speed: the text of a list of k numbers is their
    # digits and 2k characters more ("[", "]" and the k-1 ", ").
    return (len(str(list(map(len, commands)))) + len(commands)  # "*<n>" + 3 - 2
            + sum(lengths) + len(str(lengths)) + 3 * len(lengths))  # "$<len>" + 5 - 2
