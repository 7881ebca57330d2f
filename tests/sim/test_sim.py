"""The simulator in the suite: a fixed budget of seeds on every run, determinism, one
reproduction of each known broker bug (expected to fail until fixed, then kept as a
regression), and planted bugs the invariants must catch (so that a check that can never
fail is noticed).

``MINOU_SIM_SEEDS`` sets the budget (default 200); ``make simulate`` runs many more.
"""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minou.core import group as group_mod
from minou.core.group import BURST_BYTES, Group, GroupChannel, PatternIndex, Subscription
from minou.core.rights import Rights
from minou.core.settlement import Settlement
from minou.server.delivery_budget import DeliveryBudget
from minou.server.engine import Engine
from minou.storage.memory import MemoryStorage

from .known import KNOWN_BUGS
from .run import Case, Result, run_case, shrink

SEEDS = int(os.environ.get("MINOU_SIM_SEEDS", "200"))
ROOT = Path(__file__).resolve().parents[2]


def _explain(r: Result) -> str:
    small = shrink(r, budget_s=20.0)
    return "\n".join([f"seed {r.case.seed}: {r.violation}",
                      f"reproduce: {r.case.command()}", "shortest history found:",
                      *small.history[-150:], f"reproduce it: {small.case.command()}"])


def test_seed_budget() -> None:
    """SEEDS histories of 400 steps, every known bug tolerated: nothing else breaks."""
    for seed in range(SEEDS):
        r = run_case(Case(seed))
        if r.failed:
            pytest.fail(_explain(r), pytrace=False)


def test_few_clients_and_long_histories() -> None:
    for seed in range(SEEDS // 10):
        for case in (Case(seed, clients=1, steps=300), Case(seed, clients=5, steps=1200)):
            r = run_case(case)
            if r.failed:
                pytest.fail(_explain(r), pytrace=False)


def test_seeds_with_every_ack_folded_into_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quarter of the budget with a group's acks folded into runs at each commit
    (FOLD_ACKED 0; a broker folds past 1,024, which these histories seldom reach):
    the runs and their stored form meet the same invariants as the set."""
    monkeypatch.setattr(group_mod, "FOLD_ACKED", 0)
    for seed in range(SEEDS // 4):
        r = run_case(Case(seed))
        if r.failed:
            pytest.fail(_explain(r), pytrace=False)


def test_same_seed_same_history() -> None:
    for seed in (1, 2, 3):
        assert run_case(Case(seed)).digest == run_case(Case(seed)).digest


def test_same_history_whatever_the_hash_seed() -> None:
    """Nothing depends on the order of a set of strings: two processes with different
    PYTHONHASHSEED write the same histories."""
    code = ("from tests.sim.run import Case, run_case\n"
            "print(' '.join(run_case(Case(s, steps=250)).digest for s in range(8)))")

    def digests(hash_seed: str) -> str:
        # This tree's src first: the venv's own install may be another checkout's.
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                             capture_output=True, text=True, timeout=120)
        return out.stdout.strip()

    assert digests("1") == digests("2")


# One short history per known bug (none today), every other known bug tolerated. Each
# fails its invariant while the bug is there; once it is fixed, take the bug out of
# known.py and move its case to FIXED_CASES.
KNOWN_CASES: dict[str, Case] = {}


def test_known_bug_cases_meet_their_bugs() -> None:
    """While tolerated, each known bug's case passes and does meet the bug; with the bug
    not tolerated (strict), it fails: the case still reproduces it."""
    assert set(KNOWN_CASES) == set(KNOWN_BUGS)
    for bug, case in KNOWN_CASES.items():
        r = run_case(case)
        assert not r.failed, f"{r.violation}\nreproduce: {r.case.command()}"
        assert r.known.get(bug), f"{r.case.command()} no longer meets {bug}"
        strict = run_case(Case(case.seed, case.clients, case.steps, case.features,
                               strict=frozenset({bug})))
        assert strict.failed, f"{bug} is fixed: take it out of known.py"


# The reproductions of known bugs since fixed (out of known.py): each must pass with
# nothing tolerated.
FIXED_CASES = {
    # A numbered send answered as such a duplicate: its producer state must take the
    # failed commit's error before the next commit stores it (a crash came between).
    "dedup_answered_early_numbered": Case(206920, steps=151, features=frozenset({
        "broadcast", "crash", "dedup", "delay", "evict", "exclusive", "flow", "foreign",
        "full", "numbered", "priority", "retention", "slow", "ttl", "txn"})),
    # The same, when the original was also dropped from its channel (drop_oldest)
    # before its commit failed: the duplicate still has to get the commit's error.
    "dedup_answered_early_after_overflow": Case(1237, features=frozenset({
        "broadcast", "crash", "dedup", "delay", "exclusive", "extend", "flow", "foreign",
        "full", "nack", "numbered", "priority", "retention", "slow", "ttl", "txn"})),
    "txn_replay_answered_early": Case(1198, clients=1, steps=83, features=frozenset({
        "broadcast", "crash", "dedup", "delay", "extend", "foreign", "full", "nack",
        "numbered", "priority", "slow", "ttl", "txn"})),
    "dedup_answered_early": Case(518, clients=1, steps=4, features=frozenset({"dedup"})),
    "overflow_drops_failed_seq": Case(3927, clients=2, steps=41, features=frozenset({"full"})),
    # A connection paused (full socket, over its share of the delivery budget) that
    # subscribed again got deliveries on the new subscription (NativeConnection).
    "subscribe_while_paused": Case(2002625, clients=5, steps=181),
    "trailing_hole_counted": Case(137, clients=2, steps=106, features=frozenset({
        "broadcast", "crash", "dedup", "delay", "flow", "full", "numbered", "priority",
        "slow", "ttl", "txn"})),
}


@pytest.mark.parametrize("bug", sorted(FIXED_CASES))
def test_fixed_bug(bug: str) -> None:
    assert bug not in KNOWN_BUGS, f"{bug} is fixed: take it out of known.py"
    case = FIXED_CASES[bug]
    r = run_case(Case(case.seed, case.clients, case.steps, case.features,
                      strict=frozenset(KNOWN_BUGS)))
    assert not r.failed, f"{r.violation}\nreproduce: {r.case.command()}"


# --------------------------------------------------------------- planted bugs
@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    yield monkeypatch


def _first_failure(seeds: int = 60) -> Result:
    for seed in range(seeds):
        r = run_case(Case(seed, steps=300))
        if r.failed:
            return r
    raise AssertionError(f"no invariant caught the planted bug in {seeds} seeds")


def test_catches_a_confirm_before_the_commit(planted: pytest.MonkeyPatch) -> None:
    """Publishes answered when staged, not when durable."""
    real = Engine.publish

    def publish(self: Engine, sends: Any, access: Any, reply: Any, **kw: Any) -> Any:
        outcomes = real(self, sends, access, lambda o, f: None, **kw)
        reply(outcomes, None)
        return outcomes

    planted.setattr(Engine, "publish", publish)
    assert _first_failure().violation.name == "confirmed_is_durable"  # type: ignore[union-attr]


def test_catches_an_ack_confirmed_before_its_commit(planted: pytest.MonkeyPatch) -> None:
    """Acks answered at once, before the commit that makes them durable (in a scratch
    checkout this took the simulator 0.1 s: seed 4)."""
    real = Engine.settle

    def settle(self: Engine, session: Any, op: str, tags: Any, reply: Any,
               **kw: Any) -> Any:
        failed = real(self, session, op, tags, None, **kw)
        if reply is not None:
            reply(failed, None)
        return failed

    planted.setattr(Engine, "settle", settle)
    assert _first_failure().violation.name == "ack_is_final"  # type: ignore[union-attr]


def test_catches_an_ack_that_does_not_settle(planted: pytest.MonkeyPatch) -> None:
    """An ack that frees the lease but puts the message back in the queue."""
    def settle(self: GroupChannel, seq: int) -> None:
        self.pending.pop(seq, None)
        heapq.heappush(self.front, seq)

    planted.setattr(GroupChannel, "settle", settle)
    assert _first_failure().violation.name in (  # type: ignore[union-attr]
        "ack_is_final", "attempts_never_decrease", "requeue_limit", "progress")


def test_catches_a_tag_settled_by_anyone(planted: pytest.MonkeyPatch) -> None:
    """Fenced acks gone: any connection may settle any pending delivery."""
    real = Settlement._lease

    def lease(self: Settlement, session: Any, tag: int) -> Any:
        for grp in self.state.groups.values():
            for sub in grp.members:
                if tag in sub.session.leases and sub.session is not session:
                    return real(self, sub.session, tag)
        return real(self, session, tag)

    planted.setattr(Settlement, "_lease", lease)
    assert _first_failure().violation.name == "tags_fenced"  # type: ignore[union-attr]


def test_catches_a_returned_message_given_back(planted: pytest.MonkeyPatch) -> None:
    """The round-robin no longer passes over the member a message came back from."""
    real = Group.member_for
    planted.setattr(Group, "member_for", lambda self, avoid=0: real(self, 0))
    assert _first_failure().violation.name == "round_robin"  # type: ignore[union-attr]


def test_catches_a_second_reader_of_an_exclusive_channel(
        planted: pytest.MonkeyPatch) -> None:
    """Reservations no longer keep other clients out."""
    planted.setattr(Rights, "read_refusal", lambda self, session, pattern, owner_to_be=None:
                    None)
    assert _first_failure().violation.name == "exclusive_one_reader"  # type: ignore[union-attr]


def test_catches_a_delivery_budget_that_never_pauses_a_writer(
        planted: pytest.MonkeyPatch) -> None:
    """A delivery write never pauses its connection, however far over the budget (only
    the tick's recount does): readers that stop pile up more than the budget allows."""
    planted.setattr(DeliveryBudget, "note", lambda self, holder, buffered, limit: False)
    assert _first_failure(200).violation.name == "delivery_budget"  # type: ignore[union-attr]


def test_catches_in_flight_bounds_that_never_stop_a_member(
        planted: pytest.MonkeyPatch) -> None:
    """A subscription's credit without its in-flight check (``InFlightBytes.stops``,
    inlined in ``Subscription.credit``, the one gate deliveries pass): members take past
    their share and their own bound."""
    def credit(self: Subscription) -> int:
        if self.paused or not self.active or self.burst >= BURST_BYTES:
            return 0
        return self.prefetch - self.unsettled

    planted.setattr(Subscription, "credit", property(credit))
    assert _first_failure(100).violation.name == "in_flight_bytes"  # type: ignore[union-attr]


def test_catches_a_redelivery_before_its_attempt_count_is_stored(
        planted: pytest.MonkeyPatch) -> None:
    """A returned message goes out again at once: a crash before the commit storing its
    last count sends a lower count than a client already saw."""
    real = Settlement.return_lease

    def return_lease(self: Settlement, lease: Any, now: float, **kw: Any) -> None:
        real(self, lease, now, **{**kw, "counted": False})

    planted.setattr(Settlement, "return_lease", return_lease)
    assert _first_failure(400).violation.name == "attempts_never_decrease"  # type: ignore[union-attr]


def test_catches_a_store_that_does_not_fence_a_paused_broker(
        planted: pytest.MonkeyPatch) -> None:
    """Fencing gone: a broker paused past its lease writes after the takeover."""
    planted.setattr(MemoryStorage, "_check_fence", lambda self, batch: None)
    found = None
    for seed in range(400):
        r = run_case(Case(seed, steps=300, features=frozenset({"takeover", "nack"})))
        if r.failed:
            found = r
            break
    assert found is not None and found.violation.name == "fenced_after_takeover"  # type: ignore[union-attr]


def test_catches_a_reader_index_out_of_the_groups_order(planted: pytest.MonkeyPatch) -> None:
    """The groups of a new channel taken from the index bucket by bucket, not in the
    order of the groups (``a/*`` made after ``a/v1/*`` attached first): delivery
    order would follow the index's buckets, not what a scan of the groups gave."""
    def groups_of(self: PatternIndex, keys: list[str]) -> list[Group]:
        return list(dict.fromkeys(g for k in keys for g in self.readers.get(k, ())))

    planted.setattr(PatternIndex, "groups_of", groups_of)
    assert _first_failure().violation.name == "reader_index"  # type: ignore[union-attr]
