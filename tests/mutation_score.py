"""The mutation score per file, from what ``mutmut run`` left in ``mutants/``.

    python tests/mutation_score.py            # the table (make mutate prints it)
    python tests/mutation_score.py --survivors minou.core.log   # their names
    python tests/mutation_score.py --save-killers   # tests/mutation_killers.json (make mutate)

Score = (killed + timeout) / all mutants of the file. A mutant no test reaches counts
against the score: it is a path the fast suite never enters.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
TARGET = 90.0  # per file, issue 28
KILLERS = ROOT / "tests" / "mutation_killers.json"
KILLERS_PER_FUNCTION = 8  # enough to put nearly every mutant's killer first


def save_killers(log: Path, out: Path = KILLERS) -> int:
    """Fold the run's "mutant<TAB>test" lines (conftest.py writes them) into the file
    conftest.py orders tests by: per mutated function, the tests that killed its mutants,
    most kills first. Functions this run did not test keep what they had."""
    kills: dict[str, Counter[str]] = {}
    for line in log.read_text(encoding="utf-8").splitlines():
        mutant, _, test = line.partition("\t")
        if test:
            kills.setdefault(mutant.rsplit("__mutmut_", 1)[0], Counter())[test] += 1
    known = json.loads(out.read_text()) if out.exists() else {}
    for function, tests in kills.items():
        known[function] = [t for t, _ in tests.most_common(KILLERS_PER_FUNCTION)]
    out.write_text(json.dumps(dict(sorted(known.items())), indent=0, ensure_ascii=False) + "\n")
    return len(kills)


def load(mutants: Path) -> dict[str, dict[str, str]]:
    """File (relative to src/) -> mutant name -> status."""
    out: dict[str, dict[str, str]] = {}
    for meta in sorted(mutants.glob("src/**/*.py.meta")):
        data = json.loads(meta.read_text())
        codes = data.get("exit_code_by_key", {})
        if codes:
            rel = str(meta.relative_to(mutants / "src"))[: -len(".meta")]
            out[rel] = {k: status_by_exit_code[v] for k, v in codes.items()}
    return out


def table(results: dict[str, dict[str, str]]) -> tuple[str, bool]:
    rows = ["| file | mutants | killed + timeout | survived | no test reaches | other | score |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    totals: Counter[str] = Counter()
    ok = True
    for path, statuses in sorted(results.items()):
        c = Counter(statuses.values())
        killed = c["killed"] + c["timeout"]
        other = len(statuses) - killed - c["survived"] - c["no tests"]
        score = 100.0 * killed / len(statuses)
        ok = ok and score >= TARGET and not c["no tests"]
        rows.append(f"| {path} | {len(statuses)} | {killed} | {c['survived']} | "
                    f"{c['no tests']} | {other} | {score:.1f} % |")
        totals.update(c)
        totals["all"] += len(statuses)
    killed = totals["killed"] + totals["timeout"]
    if totals["all"]:
        rows.append(f"| **all** | **{totals['all']}** | **{killed}** | "
                    f"**{totals['survived']}** | **{totals['no tests']}** | "
                    f"**{totals['all'] - killed - totals['survived'] - totals['no tests']}** | "
                    f"**{100.0 * killed / totals['all']:.1f} %** |")
    return "\n".join(rows), ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mutants", type=Path, default=ROOT / "mutants")
    p.add_argument("--survivors", metavar="PREFIX", nargs="?", const="",
                   help="list surviving, unreached and unchecked mutants whose name starts so")
    p.add_argument("--save-killers", action="store_true",
                   help=f"fold mutants/killers.tsv into {KILLERS.relative_to(ROOT)}")
    args = p.parse_args()
    if args.save_killers:
        log = args.mutants / "killers.tsv"
        if not log.exists():
            print(f"no {log}: nothing to save", file=sys.stderr)
            return 0
        print(f"{save_killers(log)} functions' killers saved to {KILLERS.relative_to(ROOT)}")
        return 0
    results = load(args.mutants)
    if not results:
        print("no mutation results: run `make mutate` first", file=sys.stderr)
        return 2
    if args.survivors is not None:
        for statuses in results.values():
            for name, status in sorted(statuses.items()):
                if status in ("survived", "no tests", "not checked") \
                        and name.startswith(args.survivors):
                    print(f"{status:9} {name}")
        return 0
    text, ok = table(results)
    print(text)
    print(f"\ntarget: {TARGET:.0f} % per file and no mutant that no test reaches: "
          + ("met" if ok else "not met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
