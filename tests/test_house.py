"""House rules that hold for the product code as a whole, checked on its source.

- No product file (``broker/``, ``policies/``, ``providers/``; generated ``*_pb2*`` modules and
  migration revisions aside) is longer than 600 lines, and no function longer than 80.
- Lease states are the :class:`broker.lease.LeaseState` enum: outside ``broker/lease*`` no string
  literal stands for one (a comparison or assignment against a ``state``, a ``state=`` argument,
  a membership test against a collection of lease states, a ``state = '…'`` in SQL text).
- ``policies/`` is pure: nothing from ``broker/``, from ``providers/`` only the domain types and
  the catalog's types, and no clock (time is a parameter).
- ``providers/`` never imports ``broker/``, and a cloud SDK is imported at module level only by
  that cloud's own modules (its registration's provider package and market source), so
  ``broker serve`` listens before any SDK is loaded.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from broker.lease import LeaseState
from providers.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("broker", "policies", "providers")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _generated(path: Path) -> bool:
    rel = path.relative_to(ROOT).parts
    return "_pb2" in path.name or rel[:3] == ("broker", "migrations", "versions")


def product_files(*tops: str) -> list[Path]:
    files = [p for top in tops or PRODUCT for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if not _generated(p) and "__pycache__" not in p.parts]


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_the_product_files_are_found():
    names = {_rel(p) for p in product_files()}
    assert {"broker/lease.py", "policies/cost.py", "providers/base.py", "providers/aws/launch.py"} <= names
    assert not any("_pb2" in n or "/migrations/versions/" in n for n in names)


# ---------------------------------------------------------------------------------------------
# Size


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function longer than ``limit`` lines."""
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    out.append((prefix + child.name, child.lineno, length))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def test_no_product_file_is_longer_than_600_lines():
    long = {_rel(p): n for p in product_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not long, (f"product files over {MAX_FILE_LINES} lines (split them by concern): "
                      + ", ".join(f"{f} ({n})" for f, n in sorted(long.items())))


def test_no_function_is_longer_than_80_lines():
    long = [f"{_rel(p)}:{line} {name} ({n} lines)"
            for p in product_files() for name, line, n in long_functions(p.read_text(encoding="utf-8"))]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(long)


def test_the_function_length_check_counts_methods_and_nested_functions():
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    inner = textwrap.indent(body, "    ")
    source = f"class C:\n    def m(self):\n{body}\n\n    def short(self):\n        def inner():\n{inner}\n"
    assert long_functions(source) == [("C.m", 2, 81), ("C.short", 84, 82), ("C.short.inner", 85, 81)]
    assert long_functions("def f():\n" + "\n".join(f"    y = {i}" for i in range(79))) == []


# ---------------------------------------------------------------------------------------------
# Lease states are the enum

LEASE_STATES = frozenset(s.value for s in LeaseState)
# Names that hold a lease state: an attribute, a variable, a keyword argument or a mapping key.
STATE_NAMES = frozenset({"state", "states", "lease_state", "from_state", "to_state", "new_state", "old_state"})
_SQL_STATE = re.compile(r"\bstate\s*(?:=|!=|<>|\bin\b|\bnot\s+in\b)\s*\(?\s*'(?:%s)'"
                        % "|".join(sorted(LEASE_STATES)), re.I)


def _names_state(node: ast.AST) -> bool:
    """``x.state``, ``state``, ``row["state"]``, ``col(Lease.state)``."""
    if isinstance(node, ast.Attribute):
        return node.attr in STATE_NAMES
    if isinstance(node, ast.Name):
        return node.id in STATE_NAMES
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in STATE_NAMES
    if isinstance(node, ast.Call):
        return any(_names_state(a) for a in node.args)
    return False


def _lease_literals(node: ast.AST | None) -> list[str]:
    """The lease-state strings ``node`` is made of: one literal, or a tuple, list or set (also
    through ``frozenset(...)``) of string literals that are all lease states; else []."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) and node.value in LEASE_STATES else []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "frozenset", "set", "tuple", "list") and len(node.args) == 1:
        return _lease_literals(node.args[0])
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
        values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(values) == len(node.elts) and set(values) <= LEASE_STATES:
            return values
    return []


def lease_state_literals(source: str) -> list[tuple[int, str]]:
    """(line, what) for every place ``source`` spells a lease state as a string."""
    hits: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides, sides[1:]):
                for x, y in ((a, b), (b, a)):
                    if _names_state(x) and _lease_literals(y):
                        hits.append((node.lineno, f"state compared with {_lease_literals(y)}"))
                        break
                else:
                    if isinstance(op, (ast.In, ast.NotIn)) and len(_lease_literals(b)) >= 2:
                        hits.append((node.lineno, f"membership test in {_lease_literals(b)}"))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_names_state(t) for t in targets) and _lease_literals(node.value):
                hits.append((node.lineno, f"state set to {_lease_literals(node.value)}"))
        elif isinstance(node, ast.Call):
            hits += [(node.lineno, f"{kw.arg}={_lease_literals(kw.value)}") for kw in node.keywords
                     if kw.arg in STATE_NAMES and _lease_literals(kw.value)]
            if (isinstance(node.func, ast.Attribute) and node.func.attr in ("in_", "not_in", "notin_")
                    and _names_state(node.func.value)):
                hits += [(node.lineno, f".{node.func.attr}({_lease_literals(a)})") for a in node.args
                         if _lease_literals(a)]
        elif isinstance(node, ast.Dict):
            hits += [(node.lineno, f"{{{k.value!r}: {_lease_literals(v)}}}") for k, v in zip(node.keys, node.values)
                     if isinstance(k, ast.Constant) and k.value in STATE_NAMES and _lease_literals(v)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_STATE.search(node.value):
            hits.append((node.lineno, f"SQL {_SQL_STATE.search(node.value)[0]!r}"))
    return sorted(set(hits))


def test_lease_states_are_the_enum_outside_broker_lease():
    # providers/ knows no leases (its "running" and "failed" are the clouds' own states).
    files = [p for p in product_files("broker", "policies")
             if not (p.parent == ROOT / "broker" and p.name.startswith("lease"))]
    assert ROOT / "broker/store.py" in files and ROOT / "broker/lease.py" not in files
    found = [f"{_rel(p)}:{line}: {what}" for p in files
             for line, what in lease_state_literals(p.read_text(encoding="utf-8"))]
    assert not found, ("lease states spelt as strings (use broker.lease.LeaseState, LIVE or ENDED):\n"
                       + "\n".join(found))


@pytest.mark.parametrize("code", [
    'if lease.state == "running": pass',
    'if "released" != row.state: pass',
    'ok = lease.state in ("requested", "provisioning")',
    'ok = lease.state not in {"released", "failed"}',
    'ok = row["state"] == "draining"',
    'ok = state == "failed"',
    'lease.state = "failed"',
    'store.update_lease(lease, now=1.0, state="released")',
    'store.list_leases(states=("running", "draining"))',
    'q = q.where(col(LeaseRow.state).in_(["requested", "provisioning"]))',
    'q = q.where(t.c.state.not_in(("released", "failed")))',
    'row = {"lease_id": "l-1", "state": "provisioning"}',
    'ended = frozenset({"released", "failed"})\nok = x in frozenset({"released", "failed"})',
    "sql = \"UPDATE leases SET ended_at = 1 WHERE state = 'released'\"",
    "sql = \"SELECT * FROM leases WHERE state IN ('requested', 'provisioning')\"",
])
def test_the_lease_state_check_finds_strings_used_as_lease_states(code):
    assert lease_state_literals(textwrap.dedent(code)), code


@pytest.mark.parametrize("code", [
    "if lease.state is LeaseState.RUNNING: pass",
    "ok = lease.state in LIVE",
    "store.update_lease(lease, now=1.0, state=LeaseState.RELEASED)",
    'log.info("released", lease_id="l-1")',  # an event name
    'self._lost("released")',  # the leader lock's release
    'snapshot = {"running": [], "pending": []}',  # a queue snapshot's jobs
    'ok = node.status == "running"',  # not a state field
    'ok = job.state == "RUNNING2"',
    'ok = inst.state in ("running", "stopped")',  # mixed: not only lease states
    'ok = word in ("running",)',  # one common word is not a set of lease states
    'sql = "SELECT state FROM leases WHERE lease_id = :id"',
    'help = "the state: requested, provisioning, running, draining, released or failed"',
])
def test_the_lease_state_check_leaves_other_strings_alone(code):
    assert lease_state_literals(textwrap.dedent(code)) == [], code


# ---------------------------------------------------------------------------------------------
# Imports and the clock

# Module roots of the cloud SDKs, from the clouds' registrations (google.protobuf is gRPC's, not a
# cloud SDK; moto is the AWS emulator, which no product module imports at all at module level).
SDKS = tuple(m for r in REGISTRY for m in r.sdk_modules) + ("moto",)


def _sdk_allowed(rel: str, module: str) -> bool:
    """``module`` is an SDK that ``rel`` (a product file) may import at module level: one of the
    cloud's own modules (its provider package, its market source) imports its own SDK."""
    dotted = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    return any(_under(module, r.sdk_modules) and any(_under(dotted, own) for own in r.modules)
               for r in REGISTRY)


def imports(tree: ast.AST, *, module_level: bool = False) -> list[tuple[int, str]]:
    """(line, module) of every absolute import; with ``module_level``, only those run at import
    time (not in a function, not under ``if TYPE_CHECKING``)."""
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if module_level and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.lineno, child.module))
            visit(child)

    visit(tree)
    return out


def _under(module: str, roots: tuple[str, ...] | str) -> bool:
    roots = (roots,) if isinstance(roots, str) else roots
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_the_import_scan_sees_nested_imports_and_skips_lazy_ones_at_module_level():
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import boto3\nelse:\n    import json\n"
                     "class C:\n    from azure import x\n"
                     "def f():\n    import botocore\n    from . import y\n")
    assert [m for _, m in imports(tree)] == ["os", "boto3", "json", "azure", "botocore"]
    assert [m for _, m in imports(tree, module_level=True)] == ["os", "json", "azure"]


def test_providers_import_nothing_from_broker():
    found = [f"{_rel(p)}:{line} imports {m}" for p in product_files("providers")
             for line, m in imports(_tree(p)) if _under(m, "broker")]
    assert not found, "providers/ must not depend on the broker: " + ", ".join(found)


def test_policies_import_only_pure_modules():
    # The domain types (providers.base) and the catalog's types are data; nothing else of the
    # broker or the providers (stores, clients, SDKs) may reach a policy.
    allowed = ("providers.base", "providers.catalog")
    found = [f"{_rel(p)}:{line} imports {m}" for p in product_files("policies")
             for line, m in imports(_tree(p))
             if _under(m, ("broker", "providers")) and not _under(m, allowed)]
    assert not found, "policies/ is pure: " + ", ".join(found)


CLOCK_CALLS = frozenset({"now", "utcnow", "today", "time", "time_ns", "monotonic", "monotonic_ns",
                         "perf_counter", "perf_counter_ns"})


def clock_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every import of ``time`` and every call of a clock (``datetime.now()``,
    ``date.today()``, ``time.time()``, ...)."""
    found = [(line, f"imports {m}") for line, m in imports(tree) if _under(m, "time")]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in CLOCK_CALLS):
            found.append((node.lineno, f"calls {ast.unparse(node.func)}()"))
    return found


def test_policies_read_no_clock():
    found = [f"{_rel(p)}:{line} {what}" for p in product_files("policies") for line, what in clock_reads(_tree(p))]
    assert not found, "policies/ takes the time as a parameter: " + ", ".join(found)


def test_the_clock_check_finds_clock_reads():
    tree = ast.parse("import time\nimport datetime as dt\nfrom time import monotonic\n"
                     "a = dt.datetime.now(dt.timezone.utc)\nb = dt.date.today()\nc = time.time()\n"
                     "d = dt.datetime.fromisoformat('2026-01-01').timestamp()\ne = snapshot.now\n")
    assert clock_reads(tree) == [(1, "imports time"), (3, "imports time"), (4, "calls dt.datetime.now()"),
                                 (5, "calls dt.date.today()"), (6, "calls time.time()")]


def test_the_sdk_rule_lets_each_cloud_import_only_its_own_sdk():
    assert _sdk_allowed("providers/aws/client.py", "boto3")
    assert _sdk_allowed("providers/aws/__init__.py", "botocore.exceptions")
    assert _sdk_allowed("providers/market/gcp.py", "google.cloud.billing_v1")
    assert not _sdk_allowed("providers/market/gcp.py", "boto3")
    assert not _sdk_allowed("providers/azure/launch.py", "google.auth")
    assert not _sdk_allowed("providers/catalog.py", "boto3")
    assert not _sdk_allowed("broker/market.py", "azure.core")


def test_cloud_sdks_are_imported_at_module_level_only_by_the_provider_packages():
    found = [f"{_rel(p)}:{line} imports {m}" for p in product_files()
             for line, m in imports(_tree(p), module_level=True)
             if _under(m, SDKS) and not _sdk_allowed(_rel(p), m)]
    assert not found, ("a cloud SDK imported where `broker serve` or the CLI loads it before listening "
                       "(import it inside the function that needs it): " + ", ".join(found))


# ---------------------------------------------------------------------------------------------
# Schedulers behind one interface

#: The core that reads and acts on schedulers only through broker.watchers (base, registry).
SCHEDULER_NEUTRAL = ("broker/autoscaler.py", "broker/service.py", "broker/config.py", "broker/notices.py")


def scheduler_packages() -> tuple[str, ...]:
    """The package of every registered scheduler kind (``broker.slurm``), and the node-side
    programs' package."""
    from broker.watchers.registry import KIND_MODULES

    return tuple(sorted({m.rsplit(".", 1)[0] for m in KIND_MODULES} | {"broker.slurm_node"}))


def named_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import, ``from a import b`` also as ``a.b``, and every string
    constant that reads as a dotted module path (for importlib)."""
    out = list(imports(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(r"[a-z_]+(\.[a-z_]+)+(:\w+)?", node.value):
            out.append((node.lineno, node.value.split(":")[0]))
    return out


def test_the_core_names_no_scheduler_package():
    pkgs = scheduler_packages()
    assert "broker.slurm" in pkgs
    found = [f"{rel}:{line} names {m}" for rel in SCHEDULER_NEUTRAL
             for line, m in named_modules(_tree(ROOT / rel)) if _under(m, pkgs)]
    assert not found, ("the autoscaler, service, notices and settings schema reach schedulers through "
                       "broker.watchers (base, registry): " + ", ".join(found))


@pytest.mark.parametrize("code", [
    "from broker.slurm.watcher import slurm_source\n",
    "def f():\n    from broker import slurm\n",
    "import broker.slurm_node.programs as p\n",
    "importlib.import_module('broker.slurm.kind')\n",
])
def test_the_scheduler_check_finds_every_way_to_name_a_package(code):
    assert any(_under(m, scheduler_packages()) for _, m in named_modules(ast.parse(code)))


def test_the_in_server_scheduler_packages_never_import_the_node_side_programs():
    found = [f"{_rel(p)}:{line} names {m}" for pkg in scheduler_packages() if pkg != "broker.slurm_node"
             for p in product_files(pkg.replace(".", "/")) for line, m in named_modules(_tree(p))
             if _under(m, "broker.slurm_node")]
    assert product_files("broker/slurm_node") and product_files("broker/slurm")
    assert not found, "the watcher side must not load the programs slurmctld runs: " + ", ".join(found)
