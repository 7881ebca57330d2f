"""Running histories: one case, many seeds with a progress bar, and shrinking a failure
to a short history printed step by step.

    python -m tests.sim --seeds 100000            # seeds 0..99999
    python -m tests.sim --seed 1234 --steps 57    # one history, printed if it fails
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .invariants import Violation
from .known import KNOWN_BUGS
from .scenario import FEATURES
from .world import World

DEFAULT_CLIENTS = 3
DEFAULT_STEPS = 400
SHOWN_LINES = 400  # of a shrunk history; its last lines are the interesting ones
PLAIN_PROGRESS_S = 30.0  # without a terminal, a progress line this often


@dataclass(frozen=True)
class Case:
    """Everything a history depends on."""

    seed: int
    clients: int = DEFAULT_CLIENTS
    steps: int = DEFAULT_STEPS
    features: frozenset[str] = frozenset(FEATURES)
    strict: frozenset[str] = frozenset()  # known bugs not tolerated (known.py)

    def command(self) -> str:
        """The one line that replays this history."""
        parts = [f"python -m tests.sim --seed {self.seed}"]
        if self.clients != DEFAULT_CLIENTS:
            parts.append(f"--clients {self.clients}")
        if self.steps != DEFAULT_STEPS:
            parts.append(f"--steps {self.steps}")
        if self.features != frozenset(FEATURES):
            parts.append(f"--features {','.join(sorted(self.features)) or 'none'}")
        if self.strict:
            parts.append("--strict" + ("" if self.strict == frozenset(KNOWN_BUGS) else
                                       " " + " ".join(sorted(self.strict))))
        return " ".join(parts)


@dataclass
class Result:
    case: Case
    violation: Violation | None
    step: int  # the step that broke an invariant (steps + 1: the end)
    digest: str
    history: list[str] = field(repr=False)
    known: dict[str, int] = field(default_factory=dict)  # tolerated known bugs met

    @property
    def failed(self) -> bool:
        return self.violation is not None


def run_case(case: Case) -> Result:
    world = World(case.seed, clients=case.clients, steps=case.steps, features=case.features,
                  tolerate=frozenset(KNOWN_BUGS) - case.strict)
    violation: Violation | None = None
    try:
        world.run()
    except Violation as exc:
        violation = exc
    return Result(case, violation, world.step_no, world.digest(), world.history,
                  dict(world.ledger.seen_known))


def shrink(result: Result, budget_s: float = 120.0) -> Result:
    """A shorter history breaking the same invariant: fewer clients, fewer features,
    fewer steps (a history's first steps do not depend on how many follow)."""
    assert result.violation is not None
    name = result.violation.name
    deadline = time.monotonic() + budget_s
    best = result

    def cut(r: Result) -> Result:
        return r if r.step > r.case.steps else run_case(replace(r.case, steps=r.step))

    def attempt(case: Case) -> bool:
        nonlocal best
        if time.monotonic() > deadline:
            return False
        r = run_case(case)
        if r.violation is not None and r.violation.name == name and (
                r.step <= best.step or case.clients < best.case.clients
                or len(case.features) < len(best.case.features)):
            best = cut(r)
            return True
        return False

    best = cut(best)
    changed = True
    while changed and time.monotonic() < deadline:
        before = best.case
        for clients in range(1, best.case.clients):
            if attempt(replace(best.case, clients=clients)):
                break
        for feature in sorted(best.case.features):
            attempt(replace(best.case, features=best.case.features - {feature}))
        while best.step > best.case.steps and best.case.steps > 1:  # broke at the end
            if not attempt(replace(best.case, steps=best.case.steps // 2)):
                break
        changed = best.case != before
    return best


def show(result: Result, console: Console, lines: int = SHOWN_LINES) -> None:
    history = result.history
    if len(history) > lines:
        console.print(f"[dim]... {len(history) - lines} earlier lines[/dim]")
        history = history[-lines:]
    for line in history:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def run_seeds(seeds: Iterator[int], total: int, base: Case, console: Console
              ) -> list[Result]:
    """Run many seeds with a progress bar; print each failure as it comes."""
    failures: list[Result] = []
    known: dict[str, int] = {}
    columns = (TextColumn("[bold]simulate"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]:>7.1f} histories/s"),
               TextColumn("[red]{task.fields[failed]} failed"),
               TimeElapsedColumn(), TimeRemainingColumn())
    started = time.monotonic()
    next_line = PLAIN_PROGRESS_S
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("seeds", total=total, rate=0.0, failed=0)
        for done, seed in enumerate(seeds, 1):
            r = run_case(replace(base, seed=seed))
            for k, n in r.known.items():
                known[k] = known.get(k, 0) + n
            if r.failed:
                failures.append(r)
                progress.console.print(
                    f"[red]seed {seed}: {r.violation} (step {r.step})[/red]\n"
                    f"  reproduce: {replace(r.case, steps=min(r.step, r.case.steps)).command()}",
                    highlight=False, soft_wrap=True)
            elapsed = time.monotonic() - started
            rate = done / max(elapsed, 1e-9)
            progress.update(task, advance=1, rate=rate, failed=len(failures))
            if not console.is_terminal and elapsed >= next_line:  # a log, not a bar
                next_line = elapsed + PLAIN_PROGRESS_S
                console.print(f"{done}/{total} histories, {rate:.1f}/s, "
                              f"{len(failures)} failed", highlight=False)
    if known:
        console.print("known broker bugs met (tolerated; --strict fails on them): " + ", ".join(
            f"{k} x{n}" for k, n in sorted(known.items())))
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    p.add_argument("--first", type=int, default=0, help="the first seed of --seeds")
    p.add_argument("--seed", type=int, help="run this one seed (and print its history)")
    p.add_argument("--clients", type=int, default=DEFAULT_CLIENTS)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--features", help=f"comma-separated, of: {','.join(FEATURES)}")
    p.add_argument("--strict", nargs="*", metavar="BUG",
                   help="known broker bugs fail too (all, or those named): "
                   + ", ".join(KNOWN_BUGS))
    p.add_argument("--no-shrink", action="store_true")
    p.add_argument("--history", action="store_true", help="print the history even if it passes")
    args = p.parse_args(argv)
    features = frozenset(FEATURES)
    if args.features is not None:
        features = frozenset(f for f in args.features.split(",") if f and f != "none")
        unknown = features - set(FEATURES)
        if unknown:
            p.error(f"unknown features {sorted(unknown)}")
    strict = frozenset()
    if args.strict is not None:
        strict = frozenset(args.strict or KNOWN_BUGS)
        if strict - set(KNOWN_BUGS):
            p.error(f"unknown known bugs {sorted(strict - set(KNOWN_BUGS))}")
    base = Case(args.seed or 0, args.clients, args.steps, features, strict)
    console = Console(highlight=False)
    if args.seed is not None:
        r = run_case(base)
        if args.history or r.failed:
            show(r, console, lines=len(r.history) if not r.failed else SHOWN_LINES)
        console.print(f"digest {r.digest}")
        if not r.failed:
            console.print(f"seed {args.seed}: ok ({args.steps} steps)")
            return 0
        console.print(f"[red]seed {args.seed}: {r.violation} (step {r.step})[/red]",
                      soft_wrap=True)
        return _shrunk(r, console, args.no_shrink)
    failures = run_seeds(iter(range(args.first, args.first + args.seeds)), args.seeds, base,
                         console)
    if not failures:
        console.print(f"[green]{args.seeds} histories, no invariant broken[/green]")
        return 0
    names = sorted({f.violation.name for f in failures if f.violation})
    console.print(f"[red]{len(failures)} of {args.seeds} histories broke {', '.join(names)}[/red]")
    return _shrunk(failures[0], console, args.no_shrink)


def _shrunk(r: Result, console: Console, skip: bool) -> int:
    if skip:
        return 1
    console.print("shrinking ...")
    small = shrink(r)
    console.rule("shortest history found")
    show(small, console)
    console.print(f"[red]{small.violation}[/red]", soft_wrap=True)
    console.print(f"reproduce: {small.case.command()}", soft_wrap=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
