"""`make mutate`'s launcher: ``mutmut run`` (pinned, 3.8.1) with one change to how a mutant's
tests are run: the tests that killed its function's mutants last time go first, in a
pytest session of their own.

    python tests/mutation_run.py run --max-children 3 [mutant names...]

Why: mutmut hands each mutant's child every test that reaches the function (up to ~800
for the rule parser) and pytest collects them all before the first runs with ``-x``.
Collecting 800 node ids costs ~0.35 s, running the one test that kills the mutant a few
milliseconds. A session holding only the known killers (at most 8, from
``tests/mutation_killers.json``) costs ~0.08 s; only a mutant they do not kill pays for the
full list, which it must run anyway. The verdicts are the ones plain ``mutmut run``
gives: a killed mutant fails a test of its own list either way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

# Run as a script, this directory heads sys.path: drop it, so that nothing here shadows a
# module of the copy under mutants/ that mutmut tests.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    del sys.path[0]

from mutmut.__main__ import cli  # type: ignore[import-untyped]
from mutmut.runners.harness import PytestRunner  # type: ignore[import-untyped]

KILLERS = Path(__file__).with_name("mutation_killers.json")
NO_TESTS_RAN = 5  # pytest's exit code when a selection is empty (e.g. all deselected by -k)


def _load_killers() -> dict[str, list[str]]:
    try:
        return dict(json.loads(KILLERS.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


_KNOWN = _load_killers()  # read once, before mutmut forks a child per mutant
_run_listed_tests = PytestRunner.run_tests


def _run_known_killers_first(self: PytestRunner, *, mutant_name: str | None,
                             tests: Iterable[str]) -> int:
    tests = list(tests)
    if mutant_name:
        listed = set(tests)
        first = [t for t in _KNOWN.get(mutant_name.rsplit("__mutmut_", 1)[0], [])
                 if t in listed]
        if first:
            code = _run_listed_tests(self, mutant_name=mutant_name, tests=first)
            if code not in (0, NO_TESTS_RAN):
                return code  # killed (or timed out, crashed): the rest cannot change that
            tests = [t for t in tests if t not in set(first)]
            if not tests:
                return code
    return _run_listed_tests(self, mutant_name=mutant_name, tests=tests)


PytestRunner.run_tests = _run_known_killers_first

if __name__ == "__main__":
    sys.argv[0] = "mutmut"
    sys.exit(cli())
