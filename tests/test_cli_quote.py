"""`broker quote` as a user runs it: a real process, table and JSON, exit codes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from decimal import Decimal

import pytest

from tests.conftest import ROOT


def _env(env_extra=None) -> dict:
    env = {**os.environ, **(env_extra or {})}
    env.pop("BROKER_CONFIG", None)
    return env


def run(args, env_extra=None):
    return subprocess.run([sys.executable, "-m", "broker.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=_env(env_extra), timeout=60)


def test_a_quote_here_reads_the_suites_state_never_the_users(mini, broker_home):
    """An in-process quote reads the live market from the default store: under the suite's
    ``BROKER_HOME``, never ``~/.local/state/broker``."""
    r = subprocess.run([sys.executable, "-c", "from broker.config import default_db_url; print(default_db_url())"],
                       capture_output=True, text=True, cwd=ROOT, env=_env(mini), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(f"sqlite:///{broker_home}"), r.stdout
    assert ".local/state" not in r.stdout
    assert run(["quote", "--gpu", "H100:8", "--hours", "1"], mini).returncode == 0


@pytest.fixture
def mini(mini_catalog_dir):
    return {"BROKER_CATALOG__PATH": str(mini_catalog_dir)}


def test_json_has_exactly_the_documented_shape(mini):
    r = run(["quote", "--gpu", "H100:8", "--hours", "24", "--data-in-gb", "500", "--format", "json"], mini)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"quote_id", "valid_until", "catalog_as_of", "demand", "offers", "excluded", "spot_model",
                        "prices_only"}
    assert doc["prices_only"] is True  # no [providers.*] table is enabled
    offer = doc["offers"][0]
    assert set(offer) == {"rank", "provider", "region", "zone", "instance_type", "gpu", "gpus_per_node", "nodes",
                          "market", "hourly_usd", "interconnect_gbps", "sla_pct", "cost_usd",
                          "price_as_of", "price_source", "stale", "zones", "interruptions_per_hour",
                          "interruption_source", "starts_at", "upfront_usd", "max_run_hours"}
    # No live market refreshed: the bundled catalog's price, its date, and every zone it knows.
    assert offer["price_source"] == f"bundled:{offer['price_as_of'][:10]}" and offer["stale"] is True
    assert offer["price_as_of"].endswith("T00:00:00Z")  # RFC 3339, as every timestamp
    assert offer["zone"] == offer["zones"][0]
    assert set(offer["cost_usd"]) == {"compute", "interruption", "storage", "data_transfer", "sla_risk", "total"}
    assert set(doc["excluded"][0]) == {"provider", "region", "instance_type", "market", "kind", "reason",
                                       "starts_at", "upfront_usd", "max_run_hours"}
    totals = [o["cost_usd"]["total"] for o in doc["offers"]]
    assert totals == sorted(totals)
    for o in doc["offers"]:
        c = o["cost_usd"]
        lines = sum(Decimal(str(c[k])) for k in ("compute", "interruption", "storage", "data_transfer", "sla_risk"))
        assert lines == Decimal(str(c["total"]))
    assert {o["market"] for o in doc["offers"]} == {"on_demand"}
    assert all("interruptible" in e["reason"] for e in doc["excluded"] if e["market"] == "spot")


def test_interruptible_admits_spot(mini):
    r = run(["quote", "--gpu", "H100:8", "--hours", "24", "--interruptible", "--checkpoint-minutes", "30",
             "--format", "json", "--top", "0"], mini)
    doc = json.loads(r.stdout)
    assert "spot" in {o["market"] for o in doc["offers"]}
    assert doc["offers"][0]["market"] == "spot"


def test_table_shows_the_cost_lines(mini):
    r = run(["quote", "--gpu", "H100:8", "--hours", "24"], mini)
    assert r.returncode == 0, r.stderr
    for word in ("provider", "instance", "market", "compute", "transfer", "total", "p5.48xlarge", "excluded"):
        assert word in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--gpu", "H100:0", "--hours", "1"], "--gpu count must be at least 1"),
        (["--gpu", "H100", "--hours", "1"], "MODEL:COUNT"),
        (["--gpu", "Z900:8", "--hours", "1"], "unknown GPU model"),
        (["--gpu", "H100:8", "--hours", "-1"], "--hours"),
        (["--gpu", "H100:8", "--hours", "1", "--data-in-gb", "-3"], "--data-in-gb"),
        (["--gpu", "H100:8", "--hours", "1", "--providers", "ibm"], "--providers"),
        (["--gpu", "H100:8", "--hours", "1", "--format", "xml"], "--format"),
        (["--gpu", "H100:8", "--hours", "1", "--deadline", "tomorrow"], "--deadline"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(mini, args, needle):
    r = run(["quote", *args], mini)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_residency_and_provider_filters(mini):
    r = run(["quote", "--gpu", "H100:8", "--hours", "1", "--residency", "eu", "--providers", "gcp,aws",
             "--format", "json"], mini)
    doc = json.loads(r.stdout)
    assert doc["offers"]
    assert {o["region"] for o in doc["offers"]} <= {"eu-west-1", "europe-west4"}
    assert any("azure not allowed" in e["reason"] for e in doc["excluded"])


def test_table_groups_exclusions_by_kind(mini):
    r = run(["quote", "--gpu", "H100:8", "--hours", "1", "--residency", "eu", "--providers", "gcp,aws"], mini)
    assert r.returncode == 0, r.stderr
    doc = json.loads(run(["quote", "--gpu", "H100:8", "--hours", "1", "--residency", "eu", "--providers", "gcp,aws",
                          "--format", "json"], mini).stdout)
    counts = {}
    for e in doc["excluded"]:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    assert {"provider", "residency", "market"} <= set(counts)
    lines = [l.strip() for l in r.stdout.splitlines() if " × " in l]
    assert [l.split(":")[0] for l in lines] == [f"{n} × {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def test_at_80_columns_no_total_is_cut(mini):
    args = ["quote", "--gpu", "H100:8", "--hours", "2400", "--data-in-gb", "50000", "--data-out-gb", "5000",
            "--top", "0"]
    doc = json.loads(run([*args, "--format", "json"], mini).stdout)
    r = run(args, {**mini, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    table = r.stdout.split("offers excluded")[0]
    assert "…" not in table
    rows = [line.split() for line in table.splitlines()[:-1] if line.split() and line.split()[0].isdigit()]
    assert [(row[0], row[-1]) for row in rows] == [(str(o["rank"]), f"{o['cost_usd']['total']:.2f}")
                                                    for o in doc["offers"]]


@pytest.mark.parametrize("columns", ["80", "120"])
def test_the_heading_and_stale_marks_fit_without_cutting(mini, columns):
    args = ["quote", "--gpu", "H100:8", "--hours", "2400", "--data-in-gb", "50000", "--data-out-gb", "5000"]
    doc = json.loads(run([*args, "--format", "json"], mini).stdout)
    r = run(args, {**mini, "COLUMNS": columns})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= int(columns) and "…" not in r.stdout
    header_at = next(i for i, l in enumerate(lines) if l.split()[:2] == ["#", "provider"])
    heading = lines[:header_at]
    # each part of the heading whole on one line: what, the quote id, the oldest price and its source
    oldest = min(o["price_as_of"] for o in doc["offers"])[:10]
    for part in ("H100 x 8 for 2400 h", "quote q-", f"oldest price {oldest} (bundled)"):
        assert sum(part in line for line in heading) == 1, (part, heading)
    qid = next(line for line in heading if "quote q-" in line).split("quote ")[1].split()[0]
    assert qid.startswith("q-") and len(qid) == len(doc["quote_id"])
    stale = [o for o in doc["offers"] if o["stale"]]
    assert stale  # the mini catalog's prices are older than max_age_h
    header = lines[header_at].split()
    body = lines[header_at + 1:next(i for i, l in enumerate(lines) if l.startswith("* stale"))]
    rows = [l.split() for l in body if l.split() and l.split()[0].isdigit()]
    if "$/h" in header:  # each stale $/h is marked, and the mark explained
        at = header.index("$/h")
        assert [row[at] for row in rows] == [f"{o['hourly_usd']:.2f}" + ("*" if o["stale"] else "")
                                             for o in doc["offers"]]
        assert "* stale: the price is older than [catalog] max_age_h (broker catalog refresh)" in lines
    else:  # no column to mark: how many is said instead
        assert any(l.startswith(f"* stale: {len(stale)} of these offers use a price older than [catalog] max_age_h")
                   for l in lines)


def test_the_whole_catalog_at_80_columns_cuts_no_id_or_total():
    """The bundled catalog's longest region and instance names side by side: the table drops
    its detail columns, closes its gaps and wraps a name inside its cell rather than cut it."""
    args = ["quote", "--gpu", "any:8", "--gpu-memory", "1", "--hours", "2400", "--data-in-gb", "50000",
            "--interruptible", "--top", "0"]
    doc = json.loads(run([*args, "--format", "json"]).stdout)
    r = run(args, {"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("* stale")[0]
    assert max(len(line) for line in table.splitlines()) <= 80 and "…" not in table
    # a row ends with its total; a line that does not holds the rest of a wrapped name
    rows = [line.split() for line in table.splitlines() if re.match(r"\s*\d+ .* \d+\.\d\d\*?$", line.rstrip())]
    assert [(row[0], row[-1]) for row in rows] == [(str(o["rank"]), f"{o['cost_usd']['total']:.2f}")
                                                    for o in doc["offers"]]
    lines = table.splitlines()
    head = next(line for line in lines if line.split()[:2] == ["#", "provider"])
    span = {c: (head.index(c), head.index(n)) for c, n in (("region", "instance"), ("instance", "market"))}
    cells: list[dict[str, str]] = []
    for line in lines[lines.index(head) + 2:]:
        row = re.match(r"\s*\d+ .* \d+\.\d\d\*?$", line.rstrip())
        if row:
            cells.append({})
        for c, (a, b) in span.items():  # a wrapped name goes on below, in its own column
            cells[-1][c] = cells[-1].get(c, "") + line[a:b].strip()
    assert [(c["region"], c["instance"]) for c in cells] == [(o["region"], o["instance_type"]) for o in doc["offers"]]


def test_an_in_process_quote_loads_no_sdk_database_or_array_library(mini, tmp_path):
    """What `broker quote` imports is what it costs to start: no cloud SDK, gRPC, SQLAlchemy,
    numpy (one quote prices with the scalar model) or structlog (it logs nothing)."""
    snippet = ("import json, runpy, sys\n"
               "sys.argv = ['broker', *sys.argv[1:]]\n"
               "try:\n    runpy.run_module('broker.cli', run_name='__main__')\n"
               "except SystemExit as e:\n    assert not e.code, e.code\n"
               "sys.stderr.write(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n")
    env = {**os.environ, **mini, "BROKER_HOME": str(tmp_path)}
    env.pop("BROKER_CONFIG", None)
    for fmt in ("json", "table"):
        r = subprocess.run([sys.executable, "-c", snippet, "quote", "--gpu", "H100:8", "--hours", "24",
                            "--format", fmt], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        loaded = set(json.loads(r.stderr))
        assert {"broker", "policies", "providers", "typer"} <= loaded
        assert not loaded & {"numpy", "structlog", "grpc", "sqlalchemy", "sqlmodel", "pydantic", "boto3",
                             "botocore", "google", "azure", "msal"}, fmt


def test_with_no_provider_enabled_the_heading_says_the_offers_are_prices_only(mini, tmp_path):
    """A newcomer's first quote: no [providers.*] table enabled, so nothing can be launched here,
    and the heading says so; with a provider enabled it does not."""
    r = run(["quote", "--gpu", "H100:8", "--hours", "1"], {**mini, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("prices only: no provider is enabled"), r.stdout[:300]
    cfg = tmp_path / "broker.toml"
    cfg.write_text('[providers.aws]\nenabled = true\nregions = ["us-east-1"]\nimage_id = "ami-12345678"\n')
    r = run(["quote", "--gpu", "H100:8", "--hours", "1", "--config", str(cfg)], mini)
    assert r.returncode == 0 and "prices only" not in r.stdout, r.stdout[:300] + r.stderr
    r = run(["quote", "--gpu", "H100:8", "--hours", "1", "--config", str(cfg), "-o", "json"], mini)
    doc = json.loads(r.stdout)
    assert doc["prices_only"] is False and {o["provider"] for o in doc["offers"]} == {"aws"}
