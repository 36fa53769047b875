"""`broker advise --simulation`: build vs rent per simulated pool size."""
from __future__ import annotations

from pathlib import Path

from broker.cli.app import exit_usage, print_json

SECONDS_PER_YEAR = 365.0 * 86400.0


def _runs(doc: dict, path: Path) -> list[dict]:
    if isinstance(doc.get("sizes"), list) and doc["sizes"]:
        return doc["sizes"]
    if "policies" in doc and "onprem_gpus" in doc:
        return [doc]
    exit_usage(f"{path} holds no simulated pool size; write it with `broker simulate --format json`.")


def advise_simulation(path: Path, policy: str, spec, prices: dict, model: str, as_of: str, fmt: str) -> None:
    """Price every size in a `broker simulate` JSON: owning the pool at its simulated utilisation
    plus its cloud bursts scaled to a year, against renting the trace's GPU-hours on demand."""
    from broker.cli.advise import _policy_of, _read_json
    from policies.tco import TcoError, best_size, size_costs

    doc = _read_json(path)
    trace = doc.get("trace")
    span = trace.get("span_s") if isinstance(trace, dict) else None
    gpu_h = trace.get("gpu_hours") if isinstance(trace, dict) else None
    if not isinstance(span, (int, float)) or span <= 0 or not isinstance(gpu_h, (int, float)):
        exit_usage(f"{path} lacks the trace's span_s and gpu_hours; write it with this version's "
                   f"`broker simulate --format json`.")
    scale = SECONDS_PER_YEAR / span
    od = prices.get("on_demand") or min(prices.values(), key=lambda p: p.usd_per_gpu_hour)
    runs = []
    for run in _runs(doc, path):
        d = _policy_of(run, path, policy)
        runs.append((int(run.get("onprem_gpus", 0)), float(d["onprem_utilization"]),
                     float(d.get("cloud_cost_usd", 0.0)) * scale, float(d.get("wait_p95_s", 0.0))))
    rent_all = gpu_h * scale * od.usd_per_gpu_hour
    try:
        rows = size_costs(spec, runs, od)
        rec, reason = best_size(rows, rent_all)
    except TcoError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    out = {"simulation": str(path), "policy": policy, "gpu_model": model, "catalog_as_of": as_of,
           "rent_all_on_demand_per_year_usd": round(rent_all, 2), "recommendation": rec, "reason": reason,
           "sizes": [{"onprem_gpus": r.gpus, "onprem_utilization": round(r.utilization, 4),
                      "wait_p95_s": r.wait_p95_s, "own_per_year_usd": round(r.own_per_year, 2),
                      "cloud_per_year_usd": round(r.cloud_per_year, 2),
                      "total_per_year_usd": round(r.total_per_year, 2),
                      "break_even_utilization": None if r.break_even is None else round(r.break_even, 4)}
                     for r in rows]}
    if fmt == "json":
        print_json(out)
        return
    from rich.console import Console
    from rich.table import Table

    con = Console(width=80)
    t = Table(title=f"Build vs rent per pool size ({policy}, cloud {model}, a year of this trace)")
    for c in ("GPUs", "util", "p95 wait", "own $/yr", "cloud $/yr", "total $/yr", "break-even"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(f"{r.gpus:,}", f"{r.utilization * 100:.0f} %", f"{r.wait_p95_s:,.0f} s", f"{r.own_per_year:,.0f}",
                  f"{r.cloud_per_year:,.0f}", f"{r.total_per_year:,.0f}",
                  "-" if r.break_even is None else f"{r.break_even * 100:.0f} %")
    con.print(t)
    con.print(f"renting everything on demand ({od.label}, ${od.usd_per_gpu_hour:.2f}/GPU-h): "
              f"${rent_all:,.0f}/yr", highlight=False)
    con.print(f"recommendation: {reason}.", highlight=False)
