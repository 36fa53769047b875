"""``providers.gcp.sdk``: Compute's package loaded by the parts the provider uses, the rest on first
use. Each case runs in a fresh interpreter: this one has the whole package imported already."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICES = "google.cloud.compute_v1.services."


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _prelude() -> str:
    return (
        "import json, sys\n"
        f"def services(): return sorted({{k[len({SERVICES!r}):].split('.')[0] for k in sys.modules "
        f"if k.startswith({SERVICES!r})}})\n"
    )


def test_the_provider_loads_only_the_clients_it_builds():
    got = _run(_prelude() + (
        "import providers.gcp.launch, providers.market.gcp\n"
        "from providers.gcp.sdk import CLIENTS, compute_v1\n"
        "from google.cloud import compute_v1 as public\n"
        "from google.cloud.compute_v1 import gapic_version\n"  # a submodule, not the whole package
        "import google.cloud.compute_v1.types as types\n"
        "print(json.dumps({'services': services(), 'expected': sorted(CLIENTS.values()),\n"
        "  'same': public is compute_v1 is sys.modules['google.cloud.compute_v1'],\n"
        "  'types': compute_v1.Instance is types.Instance, 'version': bool(gapic_version.__version__),\n"
        "  'client': compute_v1.InstancesClient.__name__}))\n"))
    assert got["services"] == got["expected"]
    assert got["same"] and got["types"] and got["version"]
    assert got["client"] == "InstancesClient"


def test_any_other_name_runs_the_package_once_on_first_use():
    got = _run(_prelude() + (
        "from providers.gcp.sdk import compute_v1\n"
        "before = len(services())\n"
        "firewalls = compute_v1.FirewallsClient\n"  # not one the provider builds
        "after = len(services())\n"
        "try:\n    compute_v1.NoSuchClient\n    missing = ''\nexcept AttributeError as e:\n    missing = str(e)\n"
        "import google.cloud.compute_v1.services.firewalls as fw\n"
        "print(json.dumps({'before': before, 'after': after, 'same': firewalls is fw.FirewallsClient,\n"
        "  'missing': missing, 'version': compute_v1.__version__}))\n"))
    assert got["before"] < got["after"] and got["after"] > 100
    assert got["same"]
    assert "NoSuchClient" in got["missing"]
    assert got["version"]


def test_a_package_imported_before_is_used_as_it_is():
    got = _run(_prelude() + (
        "import google.cloud.compute_v1 as whole\n"
        "from providers.gcp.sdk import compute_v1, load\n"
        "print(json.dumps({'same': compute_v1 is whole and load() is whole}))\n"))
    assert got["same"]
