"""`broker advise --simulation`: build vs rent per simulated pool size."""
from __future__ import annotations

import json
import math
from pathlib import Path

from broker.cli.app import exit_usage, print_json
from broker.times import as_of as rfc3339
from providers.files import read_bytes

SECONDS_PER_YEAR = 365.0 * 86400.0


def read_simulation(path: Path) -> dict:
    try:
        doc = json.loads(read_bytes(path))
    except OSError as e:
        exit_usage(f"cannot read {path}: {e.strerror or e}.")
    except ValueError:
        exit_usage(f"{path} is not JSON; write it with `broker simulate --format json`.")
    except RecursionError:  # a thousand nested brackets: no simulation output looks like that
        exit_usage(f"{path} is nested too deeply to be a `broker simulate --format json` output.")
    if not isinstance(doc, dict):
        exit_usage(f"{path} is not a `broker simulate --format json` output.")
    return doc


def policy_of(doc: dict, path: Path, policy: str) -> dict:
    pols = doc.get("policies")
    if not isinstance(pols, dict) or not pols:
        exit_usage(f"{path} has no \"policies\"; write it with `broker simulate --format json`.")
    if policy not in pols:
        exit_usage(f"{path} has no policy {policy!r}; it has {', '.join(pols)}.")
    d = pols[policy]
    u = d.get("onprem_utilization") if isinstance(d, dict) else None
    if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 <= u <= 1:
        exit_usage(f"{path} policy {policy!r} has no valid onprem_utilization.")
    return d


def _runs(doc: dict, path: Path) -> list[dict]:
    sizes = doc.get("sizes")
    if isinstance(sizes, list) and sizes:
        if not all(isinstance(r, dict) for r in sizes):
            exit_usage(f"{path}: every entry of \"sizes\" must be an object with onprem_gpus and policies; "
                       f"write it with `broker simulate --format json`.")
        return sizes
    if "policies" in doc and "onprem_gpus" in doc:
        return [doc]
    exit_usage(f"{path} holds no simulated pool size; write it with `broker simulate --format json`.")


def _number(v, path: Path, what: str, *, whole: bool = False, positive: bool = False,
            most: float = math.inf) -> float:
    """A finite number >= 0 (> 0 when ``positive``; whole when ``whole``; at most ``most``) from
    the JSON, or exit 2."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
        (v > 0 if positive else v >= 0) and v <= most and (not whole or float(v).is_integer())
    if not ok:
        kind = "a whole number" if whole else "a number"
        bound = f" and at most {most:,.0f}" if most < math.inf else ""
        exit_usage(f"{path}: {what} must be {kind} {'above' if positive else 'at least'} 0{bound}, got {v!r}; "
                   f"write it with `broker simulate --format json`.")
    return v


def advise_simulation(path: Path, policy: str, spec, prices: dict, model: str, as_of: str, fmt: str,
                      owning: dict | None = None, plot: Path | None = None) -> None:
    """Price every size in a `broker simulate` JSON: owning the pool at its simulated utilisation
    plus its cloud bursts scaled to a year, against renting the trace's GPU-hours on demand."""
    from broker.simulate.model import MAX_ONPREM_GPUS
    from broker.simulate.trace import MAX_SPAN_S
    from policies.tco import TcoError, best_size, size_costs

    doc = read_simulation(path)
    trace = doc.get("trace")
    span = trace.get("span_s") if isinstance(trace, dict) else None
    gpu_h = trace.get("gpu_hours") if isinstance(trace, dict) else None
    if span is None or gpu_h is None:
        exit_usage(f"{path} lacks the trace's span_s and gpu_hours; write it with this version's "
                   f"`broker simulate --format json`.")
    span = _number(span, path, "trace.span_s", positive=True, most=MAX_SPAN_S)
    gpu_h = _number(gpu_h, path, "trace.gpu_hours")
    # A trace shorter than a second is no base for a year's figures.
    if span < 1.0:
        exit_usage(f"{path}: trace.span_s must be at least 1 second to scale to a year, got {span!r}.")
    scale = SECONDS_PER_YEAR / span
    od = prices.get("on_demand") or min(prices.values(), key=lambda p: p.usd_per_gpu_hour)
    runs = []
    for run in _runs(doc, path):
        d = policy_of(run, path, policy)
        gpus = int(_number(run.get("onprem_gpus", 0), path, "onprem_gpus", whole=True, most=MAX_ONPREM_GPUS))
        where = f"policy {policy!r} at {gpus} GPUs"
        cloud = _number(d.get("cloud_cost_usd", 0.0), path, f"{where}: cloud_cost_usd") * scale
        p95 = _number(d.get("wait_p95_s", 0.0), path, f"{where}: wait_p95_s")
        runs.append((gpus, float(d["onprem_utilization"]), float(cloud), float(p95)))
    rent_all = gpu_h * scale * od.usd_per_gpu_hour
    if not all(math.isfinite(x) for x in (rent_all, *(r[2] for r in runs))):
        exit_usage(f"{path}: its figures scaled to a year overflow; write it with `broker simulate --format json`.")
    try:
        rows = size_costs(spec, runs, od)
        rec, reason = best_size(rows, rent_all)
    except TcoError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    if plot is not None:
        try:
            _plot(rows, rent_all, plot, model, policy)
        except OSError as e:
            exit_usage(f"cannot write the plot {plot}: {e.strerror or e}.")
    own = dict(owning or {})
    if "as_of" in own:
        own["as_of"] = rfc3339(own["as_of"])
    out = {"simulation": str(path), "policy": policy, "gpu_model": model, "catalog_as_of": rfc3339(as_of),
           "owning": own, "cloud_prices": {k: {"usd_per_gpu_hour": p.usd_per_gpu_hour, "provider": p.provider,
                                               "region": p.region, "instance_type": p.instance_type}
                                           for k, p in prices.items()},
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


def _plot(rows, rent_all: float, path: Path, model: str, policy: str) -> None:
    """Yearly cost per simulated pool size: owning, its bursts, and renting everything."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [str(r.gpus) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    ax.bar(xs, [r.own_per_year / 1e6 for r in rows], label="own the pool", color="tab:blue")
    ax.bar(xs, [r.cloud_per_year / 1e6 for r in rows], bottom=[r.own_per_year / 1e6 for r in rows],
           label=f"burst ({policy})", color="tab:orange")
    ax.axhline(rent_all / 1e6, color="tab:red", linestyle="--", label="rent everything on demand")
    ax.set_xlabel(f"on-prem {model} GPUs")
    ax.set_ylabel("cost per year (M$)")
    ax.set_title(f"Build vs rent per pool size ({model})")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
