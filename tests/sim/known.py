"""Broker bugs the simulator found and that are not fixed yet. Each is named here with
what it breaks; a run tolerates the ones it is given (the CI budget tolerates them
all, so that it guards everything else), and counts how often each was met.
``python -m tests.sim --strict`` tolerates none: a known bug then fails its seed, and
``test_sim.py`` keeps one reproduction of each (``KNOWN_CASES``) and checks that it
still fails when strict; once the bug is fixed, its entry goes and its case moves to
``FIXED_CASES``: a regression run with nothing tolerated.

A workaround changes only what the simulator checks or what its storage returns,
never the broker.
"""

from __future__ import annotations

from minou.storage.memory import MemoryStorage

from .ledger import Ledger

KNOWN_BUGS: dict[str, str] = {}  # none today: the four it found are fixed


def tolerates(ledger: Ledger, name: str) -> bool:
    """Whether ``ledger``'s run tolerates known bug ``name`` (and count that it met it)."""
    assert name in KNOWN_BUGS, name
    if name not in ledger.tolerated:
        return False
    ledger.seen_known[name] = ledger.seen_known.get(name, 0) + 1
    return True


class SimStorage(MemoryStorage):
    """The memory store, with the known storage bugs worked around when tolerated (an
    override of ``open`` or ``apply`` that asks ``tolerates``; none is known now)."""

    def __init__(self, name: str, ledger: Ledger) -> None:
        super().__init__(name, claim=True)  # fenced as on Redis: takeovers are simulated
        self.ledger = ledger
