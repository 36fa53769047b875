"""The mutation score of the decision code: ``mutmut`` per module, each against the tests that cover it.

    nice -n 19 .venv/bin/python benchmarks/mutation.py                 # every module (long: hours)
    nice -n 19 .venv/bin/python benchmarks/mutation.py policies/budget.py broker/reconciler.py
    nice -n 19 .venv/bin/python benchmarks/mutation.py --report        # the table from the last runs
    nice -n 19 .venv/bin/python benchmarks/mutation.py --mutants 'broker.reconciler.*orphan*' broker/reconciler.py

Each module runs in its own work folder, ``.mutation/<module>/`` (a copy of the product and the
tests, with a ``[tool.mutmut]`` table naming that one module and its test files), so the runs
neither mix their statistics nor touch the work tree, and a second run re-tests only what
changed. ``mutmut`` (the ``mutation`` extra) is run as ``python -m mutmut`` with the interpreter
running this script.

The table: per module the mutants killed, survived, timed out (counted as killed, as mutmut's
own score does), with no covering test, not yet checked; the score is killed+timeout over all
checked, and ``score*`` leaves out the mutants listed as equivalent in
``benchmarks/mutation_equivalent.md`` (a mutant name at the start of a line, then why).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.md"
COPIED = ("broker", "broker_sandbox", "policies", "providers", "proto", "deploy")

# A pytest plugin loaded in every mutant's run: structlog's default console renderer prints an
# exception logged with ``log.exception`` as a rich traceback with every frame's locals when rich
# is installed (mutmut brings it in), which costs seconds of CPU per logged error, enough to
# turn a killed mutant into a timeout. Plain tracebacks carry the same text for a failing test.
PLUGIN = "mutation_logging"
PLUGIN_SOURCE = '''"""Plain tracebacks in structlog's console output, and property tests that neither
shrink a failure nor draw new examples per run (written by benchmarks/mutation.py)."""
import structlog
from hypothesis import Phase, settings

# A mutant is killed by the first failing example: shrinking it only costs the run's time limit.
# Derandomized, every mutant meets the same examples, so a verdict does not depend on luck.
settings.register_profile("mutation", phases=(Phase.explicit, Phase.reuse, Phase.generate),
                          derandomize=True, database=None)
settings.load_profile("mutation")


def pytest_configure(config):
    processors = list(structlog.get_config()["processors"])
    if processors and isinstance(processors[-1], structlog.dev.ConsoleRenderer):
        processors[-1] = structlog.dev.ConsoleRenderer(colors=False,
                                                       exception_formatter=structlog.dev.plain_traceback)
        structlog.configure(processors=processors)
'''

# Each module with the test files that exercise it (fast ones: in-memory clouds, no gRPC server
# where a faster test covers the same code). Keep them small: every mutant reruns the covering tests.
MODULES: dict[str, list[str]] = {
    "policies/budget.py": ["tests/test_policy_boundaries.py", "tests/test_budget.py"],
    "policies/bulk.py": ["tests/test_bulk_pricing.py", "tests/test_cost.py", "tests/test_cost_lines.py"],
    "policies/causes.py": ["tests/test_causes.py", "tests/test_diagnose.py"],
    "policies/classes.py": ["tests/test_classes.py", "tests/test_triggers.py"],
    "policies/cost.py": ["tests/test_cost.py", "tests/test_cost_lines.py", "tests/test_policy_boundaries.py"],
    "policies/demand.py": ["tests/test_cost.py", "tests/test_quote_encoding.py"],
    "policies/diagnose.py": ["tests/test_diagnose.py", "tests/test_policy_boundaries.py"],
    # tests/test_lifetimes.py reaches every function in process; tests/test_simulate.py (a replay per test) is left out
    "policies/lifetimes.py": ["tests/test_lifetimes.py", "tests/test_spot_choice.py"],
    "policies/offload.py": ["tests/test_workloads.py"],
    "policies/placement.py": ["tests/test_placement.py", "tests/test_diagnose.py"],
    "policies/queue.py": ["tests/test_diagnose.py", "tests/test_selection.py"],
    "policies/selection.py": ["tests/test_selection.py", "tests/test_classes.py"],
    "policies/spot.py": ["tests/test_spot.py", "tests/test_cost.py"],
    "policies/spot_choice.py": ["tests/test_spot_choice.py"],
    "policies/tco.py": ["tests/test_tco.py"],
    "policies/waits.py": ["tests/test_waits.py", "tests/test_triggers.py"],
    "policies/triggers.py": ["tests/test_triggers.py", "tests/test_classes.py", "tests/test_policy_boundaries.py"],
    "broker/lifecycle.py": ["tests/test_lifecycle_fake.py", "tests/test_boundaries.py",
                            "tests/test_lifecycle_paths.py"],
    # only these in-memory tests reach a several-shape launch (the others go through the mocked clouds)
    "broker/shapes.py": ["tests/test_lifecycle_paths.py"],
    # tests/test_reconciler_isolation.py is left out: one of its tests takes minutes (a launch resumed
    # again and again), which every mutant of the pass would rerun.
    "broker/reconciler.py": ["tests/test_lifecycle_fake.py", "tests/test_boundaries.py",
                             "tests/test_reconciler_losses.py", "tests/test_reconciler_rules.py",
                             "tests/test_reconciler_pass.py", "tests/test_reconciler_limits.py"],
    # tests/test_autoscaler.py walks the same code through gRPC on the mocked clouds, several seconds a
    # test; tests/test_autoscaler_fake.py reaches every branch in process, on clouds in memory.
    "broker/autoscaler.py": ["tests/test_autoscaler_fake.py", "tests/test_autoscaler_edges.py"],
}

# mutmut's exit codes for a mutant (mutmut/stats.py): what each counts as here.
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no_tests", 33: "no_tests", 34: "skipped",
          36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          37: "killed", None: "not_checked"}


@dataclass
class Score:
    module: str
    counts: Counter[str]
    survivors: list[str]
    equivalent: int
    text_only: int = 0  # survivors that change only a string's text (a message, a log line)

    @property
    def checked(self) -> int:
        return sum(v for k, v in self.counts.items() if k not in ("not_checked", "no_tests", "skipped"))

    def score(self, leave_out: int = 0) -> float:
        caught = self.counts["killed"] + self.counts["timeout"]
        n = self.checked - leave_out
        return 100.0 * caught / n if n > 0 else 0.0


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


def equivalent_names() -> set[str]:
    """Mutant names listed (first word of a ``- `name` reason`` line) as equivalent."""
    if not EQUIVALENT.exists():
        return set()
    return set(re.findall(r"^- `([\w.]+__mutmut_\d+)`", EQUIVALENT.read_text(), flags=re.M))


def prepare(module: str, timeout_multiplier: float = 10.0) -> Path:
    """The module's work folder: a fresh copy of what changed, and its own [tool.mutmut]."""
    work = WORK / slug(module)
    work.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        # copy2 keeps mtimes: mutmut regenerates the mutants of a file only when it changed.
        shutil.copytree(ROOT / name, work / name, dirs_exist_ok=True, copy_function=shutil.copy2,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(ROOT / "tests", work / "tests", dirs_exist_ok=True, copy_function=shutil.copy2,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    plugin = work / f"{PLUGIN}.py"
    if not plugin.exists() or plugin.read_text() != PLUGIN_SOURCE:
        plugin.write_text(PLUGIN_SOURCE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tool = project.setdefault("tool", {})
    tool["mutmut"] = {
        "source_paths": ["broker", "broker_sandbox", "policies", "providers"],
        "only_mutate": [module],
        "pytest_add_cli_args_test_selection": MODULES[module],
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-p", PLUGIN, "-o", "addopts=", "--timeout=300"],
        "also_copy": ["proto", "deploy", f"{PLUGIN}.py"],
        "timeout_multiplier": timeout_multiplier,
        "use_git_change_detection": False,
        # this file is written here: mutmut would take any change to it (another timeout
        # multiplier) for a changed dependency and re-test every mutant
        "cache_invalidation_exclude": ["pyproject.toml"],
    }
    (work / "pyproject.toml").write_text(tomli_w.dumps(project))
    return work


def run(module: str, max_children: int, mutants: list[str], timeout_multiplier: float = 10.0) -> int:
    work = prepare(module, timeout_multiplier)
    env = {**os.environ, "BROKER_SHARED_DATA": os.environ.get("BROKER_SHARED_DATA",
                                                              str(ROOT.parent / "shared" / "data"))}
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *mutants]
    print(f"== {module}: {' '.join(MODULES[module])}", flush=True)
    t0 = time.monotonic()
    with open(work / "mutmut.log", "w") as log:
        rc = subprocess.call(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    print(f"   mutmut exit {rc} after {time.monotonic() - t0:.0f} s (log: {work / 'mutmut.log'})", flush=True)
    return rc


def _functions(mutated: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function of mutmut's mutated copy by name (``x_f__mutmut_orig``, ``x_f__mutmut_3``)."""
    tree = ast.parse(mutated.read_text())
    return {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and "__mutmut_" in n.name}


def _differences(a: ast.AST, b: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """The smallest differing node pairs of two trees (a node of another type or field value)."""
    if type(a) is not type(b):
        return [(a, b)]
    out: list[tuple[ast.AST, ast.AST]] = []
    for field, va in ast.iter_fields(a):
        vb = getattr(b, field, None)
        if isinstance(va, ast.AST) and isinstance(vb, ast.AST):
            out += _differences(va, vb)
        elif isinstance(va, list) and isinstance(vb, list):
            if len(va) != len(vb):
                return [(a, b)]
            for x, y in zip(va, vb):
                if isinstance(x, ast.AST) and isinstance(y, ast.AST):
                    out += _differences(x, y)
                elif x != y:
                    return [(a, b)]
        elif va != vb and field not in ("lineno", "col_offset", "end_lineno", "end_col_offset", "name"):
            return [(a, b)]
    return out


def _show(node: ast.AST) -> str:
    """A node as source; an operator (``>=``, ``and``, ``+``) by its name."""
    text = ast.unparse(node) if not isinstance(node, (ast.cmpop, ast.operator, ast.boolop, ast.unaryop)) else ""
    return text[:60] or type(node).__name__


def describe(mutant: str, functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> tuple[bool, str]:
    """(changes only a string's text, 'line N: old → new') for one mutant, from the mutated copy."""
    name = mutant.rsplit(".", 1)[-1]
    orig = functions.get(re.sub(r"__mutmut_\d+$", "__mutmut_orig", name))
    new = functions.get(name)
    if orig is None or new is None:
        return False, "?"
    diffs = _differences(orig, new)
    text = all(isinstance(x, ast.Constant) and isinstance(x.value, str) and isinstance(y, ast.Constant)
               and isinstance(y.value, str) for x, y in diffs) and bool(diffs)
    line = ""
    if diffs:
        x, y = diffs[0]
        # line numbers of the original source: the mutated copy keeps each function's lines as they were
        where = getattr(x, "lineno", orig.lineno) - orig.lineno
        line = f"+{where}: {_show(x)} → {_show(y)}"
    return text, line


def score(module: str, equivalent: set[str]) -> Score | None:
    meta = WORK / slug(module) / "mutants" / (module + ".meta")
    if not meta.exists():
        return None
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    counts: Counter[str] = Counter(STATUS.get(c, "suspicious") for c in codes.values())
    survivors = sorted(k for k, c in codes.items() if STATUS.get(c) == "survived")
    functions = _functions(WORK / slug(module) / "mutants" / module)
    text_only = sum(1 for k in survivors if describe(k, functions)[0])
    return Score(module, counts, survivors, sum(1 for k in survivors if k in equivalent), text_only)


def report(modules: list[str], show_survivors: bool) -> None:
    eq = equivalent_names()
    rows = [s for s in (score(m, eq) for m in modules) if s is not None]
    head = f"{'module':26} {'mutants':>7} {'killed':>6} {'survived':>8} {'timeout':>7} {'no test':>7} " \
           f"{'unchecked':>9} {'score':>6} {'score*':>6} {'text':>5}"
    print(head)
    total: Counter[str] = Counter()
    equiv = text = 0
    for s in rows:
        total += s.counts
        equiv += s.equivalent
        text += s.text_only
        print(f"{s.module:26} {sum(s.counts.values()):7} {s.counts['killed']:6} {s.counts['survived']:8} "
              f"{s.counts['timeout']:7} {s.counts['no_tests']:7} {s.counts['not_checked']:9} "
              f"{s.score():5.1f}% {s.score(s.equivalent):5.1f}% {s.text_only:5}")
    if len(rows) > 1:
        all_ = Score("all", total, [], equiv)
        print(f"{'all':26} {sum(total.values()):7} {total['killed']:6} {total['survived']:8} {total['timeout']:7} "
              f"{total['no_tests']:7} {total['not_checked']:9} {all_.score():5.1f}% {all_.score(equiv):5.1f}% {text:5}")
    print("score = (killed + timeout) / checked; score* leaves out the survivors listed as equivalent "
          f"in {EQUIVALENT.relative_to(ROOT)}; text = survivors that change only a string's text")
    if show_survivors:
        for s in rows:
            functions = _functions(WORK / slug(s.module) / "mutants" / s.module)
            for name in s.survivors:
                text, change = describe(name, functions)
                tag = " (equivalent)" if name in eq else " (text)" if text else ""
                print(f"survived{tag}: {name} {change}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help=f"modules to test (default: all {len(MODULES)})")
    ap.add_argument("--report", action="store_true", help="only print the table from the last runs")
    ap.add_argument("--survivors", action="store_true", help="list the surviving mutants too")
    ap.add_argument("--max-children", type=int, default=2, help="mutants tested at once (default 2)")
    ap.add_argument("--mutants", nargs="*", default=[], help="only these mutant names (globs allowed)")
    ap.add_argument("--timeout-multiplier", type=float, default=10.0,
                    help="a mutant's CPU-time limit in multiples of its tests' clean run (default 10); "
                         "a new value re-tests only the timed-out mutants")
    args = ap.parse_args(argv)
    # ``--mutants`` takes every word after it: a module named after the mutants is a module
    args.modules += [m for m in args.mutants if m.endswith(".py")]
    args.mutants = [m for m in args.mutants if not m.endswith(".py")]
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        print(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)}", file=sys.stderr)
        return 2
    failed = []
    if not args.report:
        for m in modules:
            if run(m, args.max_children, args.mutants, args.timeout_multiplier) != 0:
                failed.append(m)
    report(modules, args.survivors)
    if failed:
        print(f"mutmut failed for {', '.join(failed)} (see its log)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
