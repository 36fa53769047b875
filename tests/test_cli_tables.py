"""Tables at 80 columns (COLUMNS=80): no id, price, total, wait or utilisation is cut."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from providers import registry
from tests.conftest import ROOT


def broker(*args: str, columns: str = "80") -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": columns}
    env.pop("BROKER_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_catalog_show_fits_80_columns_with_every_region_instance_and_price_whole():
    r = broker("catalog", "show")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 80 and "…" not in r.stdout, max(lines, key=len)
    doc = json.loads(broker("catalog", "show", "-o", "json").stdout)
    table = [line.split() for line in lines if line.startswith(tuple(f"{n} " for n in registry.names()))]
    assert len(table) == len(doc["offerings"]) > 100
    for cells, o in zip(table, doc["offerings"]):
        price = f"{o['hourly_usd']:.2f}" + ("*" if o["stale"] else "")
        assert cells[:5] == [o["provider"], o["region"], o["instance_type"], o["market"], price], (cells, o)


def _policy(cost: float, wait_s: float, util: float) -> dict:
    return {"cloud_cost_usd": cost, "hindsight_cost_usd": cost * 0.9, "lower_bound_cost_usd": cost * 0.8,
            "wait_p95_s": wait_s * 0.8, "wait_p99_s": wait_s, "jobs_burst": 123_456, "onprem_utilization": util,
            "cost_by_market_usd": {"spot": cost}, "cost_by_provider_usd": {"aws": cost}, "cloud_gpu_hours": 1e6,
            "interruptions": 10, "cost_over_hindsight": 1.1, "unserved_jobs": 0}


def test_simulate_tables_keep_p99_and_utilisation_whole_at_80_columns(capsys):
    """A month-long queue (p99 of 2,847 h) and millions of dollars: every figure whole."""
    from broker.cli.simulate_report import print_sweep_table, print_table

    names = ("onprem-only", "ondemand-cheapest", "spot-greedy", "broker", "broker-burst-overdue")
    pols = {n: _policy(12_345_678.0 * (k + 1), 2847.1 * 3600, 0.987) for k, n in enumerate(names)}
    print_table({"jobs": 76_590, "onprem_gpus": 512, "gpu_model": "A100", "catalog_as_of": "2025-06-01",
                 "spot_lifetimes": "catalog", "policies": pols})
    one = capsys.readouterr().out
    print_sweep_table({"gpu_model": "A100", "spot_lifetimes": "catalog",
                       "sizes": [{"onprem_gpus": s, "policies": pols} for s in (256, 512, 1_024)]}, 76_590)
    sweep = capsys.readouterr().out
    for out, n in ((one, len(names)), (sweep, 3 * len(names))):
        assert "…" not in out and max(map(len, out.splitlines())) <= 80, out
        rows = [line for line in out.splitlines() if line.rstrip().endswith(" %")]  # the table's rows
        assert len(rows) == n and all("2,847 h" in line and line.rstrip().endswith("99 %") for line in rows), out
        assert all("61,728,390" in line for line in rows if "broker-burst-overdue" in line), out


def test_advise_keeps_its_totals_and_offers_whole_at_80_and_50_columns():
    """A million GPUs' totals ($30,576,409,560) and the offers' instance types were cut with an
    ellipsis at 80 columns; at a narrower terminal the rates give way, never the totals."""
    for columns in ("80", "50"):
        r = broker("advise", "--gpus", "1000000", "--utilization", "0.9", columns=columns)
        assert r.returncode == 0, r.stderr
        table = r.stdout.split("owning, per year")[0]
        assert max(map(len, table.splitlines())) <= int(columns) and "…" not in table, table
        doc = json.loads(broker("advise", "--gpus", "1000000", "--utilization", "0.9", "-o", "json").stdout)
        for total in (doc["cost_usd"]["build"]["3y"], doc["cost_usd"]["rent_committed_1y"]["3y"]):
            assert f"${total:,.0f}" in table, (total, table)
        assert "gpu_1x_h100_pcie" in table.replace("\n", "") or "a3-highgpu-8g" in table, table
