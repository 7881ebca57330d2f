"""Staged publishes and fenced commits: the exactly-once sink's broker side. No I/O.

A writer (a Spark job's tasks, say) stages messages under transaction ids; nothing
of a staged transaction is visible. One ``commit`` then publishes every message of
the named transactions in one storage batch, fenced per ``(writer_id, channel)``
on a batch id: a channel whose fence is already at or past ``batch_id`` has seen
this batch, so its messages are discarded (a replayed batch after a crash). The
fences are stored with the messages they let through, in the same commit, so a
crash can never separate the two.

Staged data lives in memory only: a broker restart loses it, the commit then
fails (unknown transaction), the writer's job fails and is replayed, and the
fence makes the replay safe. Orphans (failed attempts) expire a TTL after their last
STAGE; a STAGE to an expired id fails. A commit publishes everything it names or
nothing: it is checked whole (rules, schemas, room) before anything is published.

Names belong to clients. Transaction ids are per client (two clients may both use
``t1``), and a writer id belongs to the first client that commits under it: a fence
is a promise about one writer's batches, so another client (admins included) may not
move it. Fences stored before owners existed are claimed by the first client that
commits under their writer id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from sys import getsizeof
from typing import Any

from ..errors import BadRequest, NotAuthorized, NotFound, OutOfSequence, QueueFull
from ..limits import (
    MAX_ANSWERS,
    MAX_ANSWERS_PER_CLIENT,
    MAX_BATCH,
    MAX_STAGED_BYTES,
    MAX_STAGED_BYTES_PER_CLIENT,
    MAX_TXN_ID,
    MAX_WRITERS_PER_CLIENT,
    STAGED_TTL_S,
)
from ..names import check_label
from ..protocol.frames import Send

WRITER_LINEAGE_META = "writer_lineage:"  # + writer id: the run its fences belong to ("": none)


@dataclass(slots=True)
class StagedTxn:  # staged[(owner, txn)]: only its owner may commit or abort it
    touched: float  # the last STAGE: a transaction still being staged never expires
    sends: list[Send] = field(default_factory=list)
    bytes: int = 0
    parts: int = 0  # STAGE calls so far: each is stored as one part


# What staged messages really hold is weighed with the objects the broker keeps, not
# with a model of them: a model (payload + names + 8 B a header + 200 B a message, no
# cost per transaction) counted a federation page of 10 messages with its two headers
# 3.8 KB where it held 7.1 KB (a header is a dict entry and two str objects, ~110 B
# before its text), and a transaction of one empty message 206 B where it held 525 B:
# a client could hold 2-2.5x the staging bounds it was held to.
_SLOT = 8  # a pointer
# The Send struct and its pointer in the transaction's list, with the eighth more a
# growing list keeps spare; its strings, bytes and dict are weighed one by one (a
# str's size depends on its widest character).
_SEND_HELD = getsizeof(Send("", b"")) + _SLOT + _SLOT // 8
_BOXED = getsizeof(1 << 40)  # an int past the small ones Python shares (or a float)
# A transaction: its StagedTxn, its (owner, id) key, its entry in ``staged`` (3
# pointers and an index, up to half of the table spare after it grew: 7 pointers),
# its list (and the 6 spare pointers a short one keeps) and the boxed numbers the
# StagedTxn holds (its bytes, touched); its id's str is weighed with the id.
_TXN_HELD = (getsizeof(StagedTxn(0.0)) + getsizeof(("", "")) + 7 * _SLOT
             + getsizeof([]) + 6 * _SLOT + 2 * _BOXED)


def staged_weight(send: Send) -> int:
    """What staging ``send`` costs the broker (counted against MAX_STAGED_BYTES): the
    objects of it the broker keeps, by ``sys.getsizeof`` (a header key shared between
    messages by the decoder counts in each: over, never under)."""
    weight = _SEND_HELD + getsizeof(send.data) + getsizeof(send.channel)
    headers = send.headers
    if headers is not None:
        weight += getsizeof(headers)
        for k, v in headers.items():
            weight += getsizeof(k) + getsizeof(v)
    if send.key is not None:
        weight += getsizeof(send.key)
    if send.dedup is not None:
        weight += getsizeof(send.dedup)
    if send.ttl is not None:
        weight += _BOXED
    if send.delay is not None:
        weight += _BOXED
    if not -5 <= send.pseq <= 256:  # (a priority is 0..9: shared)
        weight += _BOXED
    return weight


def staged_txn_weight(txn: str) -> int:
    """What holding a transaction costs besides its messages: a page of one message
    (a federation link's, a writer's task) holds its id and its bookkeeping."""
    return _TXN_HELD + getsizeof(txn)


class Transactions:
    def __init__(self, max_answers: int = MAX_ANSWERS,
                 max_answers_per_client: int = MAX_ANSWERS_PER_CLIENT) -> None:
        self.staged: dict[tuple[str, str], StagedTxn] = {}  # (owner, txn id) -> staged
        # Expired ids, for a TTL more: a late STAGE must fail, not silently start a new
        # transaction that a commit would then publish without the expired part.
        self.gone: dict[tuple[str, str], float] = {}
        self.fences: dict[tuple[str, str], int] = {}  # (writer_id, channel) -> last batch id
        self.writers: dict[str, str] = {}  # writer_id -> the client that owns it
        self.lineages: dict[str, str] = {}  # writer_id -> the run of batches it fences
        # (owner, txn) -> (when, the commit's result): a TXN_COMMIT sent again (its answer
        # was lost with the connection, or the broker restarted) gets the same answer
        # instead of "unknown transaction", for as long as a staged one would live.
        # Oldest first; at most max_answers of them, max_answers_per_client a client.
        self.done: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        self._done_of: dict[str, dict[str, None]] = {}  # owner -> its txns in done, in order
        self.max_answers = max_answers
        self.max_answers_per_client = max_answers_per_client
        self.answers_forgotten = 0  # answers dropped before their hour, for room
        # Forgotten while loading: their stored rows go with the next expiry's
        self._forgotten_rows: list[tuple[str, str]] = []
        self.bytes = 0  # staged_weight of everything staged
        self.owner_bytes: dict[str, int] = {}  # ... by client
        self.committed = 0  # transactions committed since start
        self.discarded = 0  # messages dropped by a fence (replayed batches)
        self.expired = 0

    def stage(self, owner: str, txn: str, sends: list[Send], now: float) -> int:
        """Add ``sends`` to transaction ``txn``; return how many it holds."""
        if not txn or len(txn) > MAX_TXN_ID:
            raise BadRequest(f"a transaction id is 1..{MAX_TXN_ID} characters")
        if len(sends) > MAX_BATCH:
            raise BadRequest(f"{len(sends)} messages in one frame; the limit is {MAX_BATCH}")
        staged = self.staged.get((owner, txn))
        size = sum(staged_weight(s) for s in sends)
        if staged is None:
            size += staged_txn_weight(txn)
        if self.bytes + size > MAX_STAGED_BYTES:
            raise QueueFull(f"{self.bytes} bytes are staged already (limit {MAX_STAGED_BYTES}); "
                            "commit or abort transactions first", limit=MAX_STAGED_BYTES)
        mine = self.owner_bytes.get(owner, 0)
        if mine + size > MAX_STAGED_BYTES_PER_CLIENT:
            raise QueueFull(
                f"client {owner!r} has {mine} bytes staged already and this stage weighs "
                f"{size} (a client may stage {MAX_STAGED_BYTES_PER_CLIENT} of the broker's "
                f"{MAX_STAGED_BYTES}, a message weighing the memory it holds: its bytes "
                "and its objects); commit or abort transactions first",
                client=owner, limit=MAX_STAGED_BYTES_PER_CLIENT)
        if (owner, txn) in self.gone:
            raise NotFound(f"transaction {txn!r} expired (nothing staged for "
                           f"{STAGED_TTL_S:.0f} s); stage the whole of it again under a new id",
                           txns=txn)
        if staged is None:
            staged = self.staged[(owner, txn)] = StagedTxn(now)
        staged.touched = now
        staged.sends.extend(sends)
        self._add_bytes(owner, staged, size)
        staged.parts += 1
        return len(staged.sends)

    def _add_bytes(self, owner: str, staged: StagedTxn, size: int) -> None:
        """Count ``size`` more (less, if negative) for ``staged``, its owner, the broker."""
        staged.bytes += size
        self.bytes += size
        mine = self.owner_bytes.get(owner, 0) + size
        if mine:
            self.owner_bytes[owner] = mine
        else:
            self.owner_bytes.pop(owner, None)

    def _drop(self, key: tuple[str, str]) -> StagedTxn:
        staged = self.staged.pop(key)
        self._add_bytes(key[0], staged, -staged.bytes)
        return staged

    def peek(self, owner: str, txns: list[str]) -> list[Send]:
        """The messages of ``owner``'s transactions ``txns`` (all must exist), left staged."""
        missing = [t for t in txns if (owner, t) not in self.staged]
        if missing:
            raise NotFound(f"unknown transaction(s) {missing[:5]}: never staged (by this "
                           "client), already committed or aborted, or expired (an hour after "
                           "the last STAGE)", txns=", ".join(missing[:5]))
        return [send for t in txns for send in self.staged[(owner, t)].sends]

    def take(self, owner: str, txns: list[str]) -> list[Send]:
        """Remove ``txns`` (as ``peek`` checks them) and return their messages."""
        sends = self.peek(owner, txns)
        for t in txns:
            self._drop((owner, t))
        self.committed += len(txns)
        return sends

    def check_writer(self, client_id: str, writer_id: str) -> None:
        """Raise unless ``client_id`` may commit under ``writer_id``: its own, or unowned
        (and then the client may own one more)."""
        owner = self.writers.get(writer_id)
        if owner is None:  # a new id: named as names are, and one more for its client
            check_label("writer_id", writer_id, MAX_TXN_ID)
            owned = sum(1 for o in self.writers.values() if o == client_id)
            if owned >= MAX_WRITERS_PER_CLIENT:
                raise QueueFull(
                    f"client {client_id!r} owns {owned} writer ids (the limit is "
                    f"{MAX_WRITERS_PER_CLIENT}); commit under one it owns, or have an admin "
                    "release old ones (minou writers release ID)",
                    client=client_id, limit=MAX_WRITERS_PER_CLIENT)
        if owner is not None and owner != client_id:
            raise NotAuthorized(
                f"writer id {writer_id!r} belongs to client {owner!r} (the first to commit "
                f"under it); client {client_id!r} may not commit under it: use a writer id "
                "of your own (an admin can release it: writers.release)",
                writer_id=writer_id, owner=owner, client=client_id)

    def bind_writer(self, writer_id: str, client_id: str) -> None:
        """``writer_id`` is ``client_id``'s from now on (``check_writer`` came first)."""
        self.writers[writer_id] = client_id

    @staticmethod
    def check_names(txns: list[str]) -> None:
        """A commit names each transaction once: a name twice would be taken twice."""
        if len(set(txns)) != len(txns):
            twice = sorted(t for t, n in Counter(txns).items() if n > 1)
            raise BadRequest(f"the commit names transaction(s) {twice[:5]} more than once; "
                             "name each once", txns=", ".join(twice[:5]))

    def check_lineage(self, writer_id: str, lineage: str) -> None:
        """Raise if ``writer_id`` fences another run of batches than ``lineage``: that
        run's fences would discard this one's first batches as replays."""
        if len(lineage) > MAX_TXN_ID:  # stored with the writer: bounded like an id
            raise BadRequest(f"a lineage is at most {MAX_TXN_ID} characters, got "
                             f"{len(lineage)}", limit=MAX_TXN_ID)
        bound = self.lineages.get(writer_id)
        if lineage and bound and bound != lineage:
            raise BadRequest(
                f"writer id {writer_id!r} fences the batches of another run (query "
                f"{bound}, from another checkpoint); this one ({lineage}) would have its "
                "batches discarded as replays of those. Give this query its own writerId, "
                "or let it take the writer over (the old run's fences go, so nothing of "
                f"this one is discarded): minou writers release {writer_id} --drop-fences",
                writer_id=writer_id, lineage=lineage, bound=bound, why="lineage")

    def fence(self, writer_id: str, batch_id: int, sends: list[Send], after: int = -1
              ) -> tuple[list[Send], list[str], dict[tuple[str, str], int]]:
        """Split ``sends`` by the fence: (to publish, channels skipped as replays, the
        fence values to store with the publish). ``check_writer`` comes first.

        ``after`` (when ``>= 0``) is the fence the writer believes its channels are at:
        the batch covers ``(after, batch_id]``. A fence past ``after`` but short of
        ``batch_id`` means another session of the writer (a federation runner that
        lost its turn, say) committed part of that range with other bounds: publishing
        would repeat that part, replaying would lose the rest, so it is refused."""
        keep: list[Send] = []
        skipped: set[str] = set()
        updates: dict[tuple[str, str], int] = {}
        for send in sends:
            key = (writer_id, send.channel)
            fence = self.fences.get(key)  # None: no batch of this writer seen here yet
            if fence is not None and fence >= batch_id:
                skipped.add(send.channel)
                continue
            if fence is not None and 0 <= after < fence:
                raise OutOfSequence(
                    f"writer {writer_id!r} is at {fence} on {send.channel!r}, inside this "
                    f"batch ({after}, {batch_id}]: another session of the writer committed "
                    f"part of it. Read the fences again (txn.fences) and go on after {fence}",
                    writer_id=writer_id, channel=send.channel, fence=fence, after=after,
                    batch_id=batch_id)
            keep.append(send)
            updates[key] = batch_id
        return keep, sorted(skipped), updates

    def abort(self, owner: str, txns: list[str]) -> int:
        dropped = 0
        for t in txns:
            if (owner, t) in self.staged:
                self._drop((owner, t))
                dropped += 1
        return dropped

    def expire(self, now: float, ttl: float = STAGED_TTL_S) -> list[tuple[str, str]]:
        """Drop what was staged, or committed, more than ``ttl`` ago; return their
        (owner, txn) (their stored rows go)."""
        old = [t for t, s in self.staged.items() if now - s.touched > ttl]
        for t in old:
            self._drop(t)
            self.gone[t] = now
        self.gone = {t: at for t, at in self.gone.items() if now - at <= ttl}
        self.expired += len(old)
        done = []
        for key, (at, _) in self.done.items():  # oldest first: stop at the first young
            if now - at <= ttl:
                break
            done.append(key)
        for key in done:
            self.forget(key)
        forgotten, self._forgotten_rows = self._forgotten_rows, []
        return old + done + forgotten

    def remember(self, owner: str, txn: str, at: float, result: dict[str, Any]
                 ) -> list[tuple[str, str]]:
        """Keep the answer of ``owner``'s commit of ``txn`` (for a TXN_COMMIT sent again);
        return the (owner, txn) of the oldest answers forgotten to stay within the
        bounds (their stored rows go)."""
        key = (owner, txn)
        if key in self.done:  # committed again under the same id: the newest answer
            self.forget(key)
        self.done[key] = (at, result)
        mine = self._done_of.get(owner)
        if mine is None:
            mine = self._done_of[owner] = {}
        mine[txn] = None
        dropped: list[tuple[str, str]] = []
        while len(mine) > self.max_answers_per_client:
            dropped.append(self.forget((owner, next(iter(mine)))))
        while len(self.done) > self.max_answers:
            dropped.append(self.forget(next(iter(self.done))))
        self.answers_forgotten += len(dropped)
        return dropped

    def forget(self, key: tuple[str, str]) -> tuple[str, str]:
        """Drop the answer kept for ``key`` (if any); return ``key``."""
        if self.done.pop(key, None) is not None:
            mine = self._done_of[key[0]]
            del mine[key[1]]
            if not mine:
                del self._done_of[key[0]]
        return key

    def present(self, owner: str, txns: list[str]) -> list[str]:
        """Those of ``owner``'s ``txns`` staged here, or committed here lately (queues
        spread over brokers: a transaction's parts are staged on each queue's owner)."""
        return [t for t in txns if (owner, t) in self.staged or (owner, t) in self.done]

    def answered(self, owner: str, txns: list[str]) -> dict[str, Any] | None:
        """The result of the commit that took all of ``txns`` already, if one did."""
        results = [self.done.get((owner, t)) for t in txns]
        if txns and all(r is not None for r in results):
            first = results[0][1]  # type: ignore[index]
            if all(r[1] == first for r in results):  # type: ignore[index]
                return first
        return None

    def load(self, parts: list[tuple[str, str, int, list[Send], float]]) -> None:
        """Staged transactions read back from storage (in part order)."""
        answers = []
        for owner, txn, part, sends, touched in parts:
            if part == 0:  # a commit's answer (see ``done``)
                answers.append((touched, owner, txn, sends))
                continue
            staged = self.staged.get((owner, txn))
            size = sum(staged_weight(s) for s in sends)
            if staged is None:
                staged = self.staged[(owner, txn)] = StagedTxn(touched)
                size += staged_txn_weight(txn)
            staged.touched = max(staged.touched, touched)
            staged.sends.extend(sends)
            self._add_bytes(owner, staged, size)
            staged.parts += 1
        # Oldest first, as commits added them (storage reads them by name): the expiry
        # and the bounds take them from the front.
        answers.sort(key=lambda a: a[0])
        for touched, owner, txn, result in answers:
            self._forgotten_rows += self.remember(owner, txn, touched, result)  # type: ignore[arg-type]

    def stats(self) -> dict[str, int]:
        return {"staged": len(self.staged), "staged_bytes": self.bytes,
                "committed": self.committed, "discarded_by_fence": self.discarded,
                "expired": self.expired, "answers": len(self.done),
                "answers_forgotten": self.answers_forgotten, "fences": len(self.fences),
                "writers": len(self.writers)}
