"""`broker simulate`: replay a job trace under burst policies and compare cost and waits."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from broker.cli.app import FORMATS, app, exit_usage, print_json

_POLICIES = ("onprem-only", "ondemand-cheapest", "spot-greedy", "broker")


@app.command("simulate")
def simulate_cmd(
    trace: Path = typer.Option(..., "--trace", help="Job trace CSV: job_id, submit_time_s, num_gpus, duration_s "
                               "[, queue|vc, interruptible, gpu_model, data_gb, kind, checkpoint_minutes]."),
    onprem_gpus: int = typer.Option(..., "--onprem-gpus", help="On-prem GPUs (a multiple of --gpus-per-node)."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per on-prem node."),
    policy: Optional[list[str]] = typer.Option(None, "--policy", help="Policy to replay (repeatable): "
                                               + ", ".join(_POLICIES) + ". Default: all."),
    spot_lifetimes: Optional[Path] = typer.Option(None, "--spot-lifetimes", help="Observed spot lifetimes CSV "
                                                  "(cloud, observed_lifetime_s, ended_by); default: the catalog's "
                                                  "interruption rates as exponential lifetimes."),
    interruptible_share: float = typer.Option(0.5, "--interruptible-share", help="Share of jobs marked "
                                              "interruptible (by a seeded hash of the job id) when the trace has "
                                              "no interruptible column."),
    seed: int = typer.Option(0, "--seed", help="Seed for the interruptible marks and spot lifetimes."),
    gpu_model: str = typer.Option("A100", "--gpu-model", help="Cloud GPU model for jobs whose row names none."),
    checkpoint_minutes: int = typer.Option(30, "--checkpoint-minutes", help="Checkpoint interval of interruptible "
                                           "jobs whose row names none."),
    catalog_dir: Optional[Path] = typer.Option(None, "--catalog", help="Price catalog directory (default: bundled)."),
    fmt: str = typer.Option("table", "--format", help="table or json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: queue depth, cloud GPUs by market and "
                                        "cumulative cloud spend over time, one line per policy."),
) -> None:
    """Replay a trace: on-prem FIFO with backfill, bursting by each policy; cost and waits."""
    if fmt not in FORMATS:
        exit_usage(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}.")
    names = list(dict.fromkeys(policy or _POLICIES))
    bad = [n for n in names if n not in _POLICIES]
    if bad:
        exit_usage(f"unknown policy {bad[0]!r}; known: {', '.join(_POLICIES)}.")
    if gpus_per_node <= 0:
        exit_usage(f"--gpus-per-node must be positive, got {gpus_per_node}.")
    if onprem_gpus < 0 or onprem_gpus % gpus_per_node:
        exit_usage(f"--onprem-gpus must be a non-negative multiple of --gpus-per-node ({gpus_per_node}), "
                   f"got {onprem_gpus}.")
    if not 0.0 <= interruptible_share <= 1.0:
        exit_usage(f"--interruptible-share must be between 0 and 1, got {interruptible_share}.")
    if checkpoint_minutes < 0:
        exit_usage(f"--checkpoint-minutes must be zero or positive, got {checkpoint_minutes}.")
    if plot is not None and plot.suffix.lower() != ".png":
        exit_usage(f"--plot writes a PNG; give a path ending in .png, got {plot}.")

    from broker.simulate import SimConfig, TraceError, load_lifetimes, load_trace, run_policies
    from providers.catalog import CatalogError, bundled, load

    try:
        catalog = load(catalog_dir) if catalog_dir else bundled()
    except (CatalogError, OSError, ValueError) as e:
        exit_usage(f"cannot load the price catalog: {str(e).rstrip('.')}.")
    model = gpu_model.strip().upper()
    if model not in catalog.by_gpu:
        exit_usage(f"--gpu-model {gpu_model!r} is not in the catalog; known: {', '.join(catalog.gpu_models)}.")
    try:
        jobs = load_trace(trace, interruptible_share, seed, model)
        lifetimes = load_lifetimes(spot_lifetimes) if spot_lifetimes else None
    except TraceError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    unknown = sorted({j.gpu_model for j in jobs if j.gpu_model not in catalog.by_gpu})
    if unknown:
        exit_usage(f"the trace names GPU model(s) {', '.join(unknown)} that the catalog does not sell; "
                   f"known: {', '.join(catalog.gpu_models)}.")
    cfg = SimConfig(onprem_gpus=onprem_gpus, gpus_per_node=gpus_per_node, seed=seed,
                    default_gpu_model=model, checkpoint_minutes=checkpoint_minutes)

    progress = None
    bar = None
    if sys.stderr.isatty() and len(jobs) >= 20_000:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
        from rich.console import Console

        bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                       TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
        tasks = {n: bar.add_task(n, total=len(jobs)) for n in names}

        def progress(name: str, done: int) -> None:
            bar.update(tasks[name], completed=done)

        bar.start()
    try:
        results = run_policies(jobs, catalog, names, cfg, lifetimes, progress)
    finally:
        if bar is not None:
            bar.stop()

    if plot is not None:
        try:
            write_plot(results, plot)
        except OSError as e:
            exit_usage(f"cannot write the plot {plot}: {e.strerror or e}.")

    doc = {
        "trace": str(trace),
        "jobs": len(jobs),
        "onprem_gpus": onprem_gpus,
        "gpus_per_node": gpus_per_node,
        "interruptible_share": interruptible_share,
        "seed": seed,
        "gpu_model": model,
        "spot_lifetimes": str(spot_lifetimes) if spot_lifetimes else None,
        "catalog_as_of": catalog.as_of,
        "policies": {n: r.to_dict() for n, r in results.items()},
    }
    if fmt == "json":
        print_json(doc)
        return
    _print_table(doc)


def _fmt_s(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _print_table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    pols = doc["policies"]
    t = Table(title=f"{doc['jobs']:,} jobs on {doc['onprem_gpus']} on-prem GPUs "
                    f"({doc['gpu_model']} in the cloud, catalog {doc['catalog_as_of']})")
    for col in ("policy", "cloud $", "lower bound $", "lost to execution", "wait p50", "p95", "p99", "mean",
                "jobs burst", "cloud GPU-h", "interruptions", "on-prem util"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name, d in pols.items():
        lb, cost = d["lower_bound_cost_usd"], d["cloud_cost_usd"]
        lost = f"{(cost / lb - 1) * 100:+.0f} %" if lb > 0 else "-"
        t.add_row(name, f"{cost:,.0f}", f"{lb:,.0f}", lost, _fmt_s(d["wait_p50_s"]), _fmt_s(d["wait_p95_s"]),
                  _fmt_s(d["wait_p99_s"]), _fmt_s(d["wait_mean_s"]), f"{d['jobs_burst']:,}",
                  f"{d['cloud_gpu_hours']:,.0f}", f"{d['interruptions']:,}", f"{d['onprem_utilization'] * 100:.1f} %")
    con = Console(width=160)
    con.print(t)
    for name, d in pols.items():
        if d["jobs_burst"] == 0:
            continue
        lb, cost = d["lower_bound_cost_usd"], d["cloud_cost_usd"]
        markets = ", ".join(f"{k} ${v:,.0f}" for k, v in d["cost_by_market_usd"].items())
        provs = ", ".join(f"{k} ${v:,.0f}" for k, v in d["cost_by_provider_usd"].items())
        con.print(f"{name}: spent ${cost:,.0f} ({markets}; {provs}). Running exactly the jobs it burst, each on the "
                  f"cheapest market it was eligible for with no start-up, rework or failed launch, would cost "
                  f"${lb:,.0f}: it loses ${cost - lb:,.0f} ({(cost / lb - 1) * 100 if lb else 0:.0f} %) to "
                  f"execution (start-ups, preemption rework, on-demand fallbacks).", highlight=False)
    if "broker" in pols and "ondemand-cheapest" in pols and pols["ondemand-cheapest"]["cloud_cost_usd"] > 0:
        b, o = pols["broker"], pols["ondemand-cheapest"]
        con.print(f"broker spends {b['cloud_cost_usd'] / o['cloud_cost_usd']:.2f}x what ondemand-cheapest does, "
                  f"at a p95 wait of {_fmt_s(b['wait_p95_s'])} against {_fmt_s(o['wait_p95_s'])}.", highlight=False)
    unserved = {n: d["unserved_jobs"] for n, d in pols.items() if d["unserved_jobs"]}
    if unserved:
        con.print("jobs never run (bigger than the cluster and no cloud offer, or never burst): "
                  + ", ".join(f"{n} {k}" for n, k in unserved.items()), highlight=False)


def write_plot(results: dict, path: Path) -> None:
    """Three panels over time: pending GPUs on-prem, cloud GPUs (spot solid, on-demand dashed),
    cumulative cloud spend; one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True, constrained_layout=True)
    colors = {"onprem-only": "tab:gray", "ondemand-cheapest": "tab:red", "spot-greedy": "tab:orange",
              "broker": "tab:blue"}
    for name, r in results.items():
        s = r.series
        days = [h / 24.0 for h in s["t_h"]]
        c = colors.get(name)
        axes[0].plot(days, s["pending_gpus"], label=name, color=c, linewidth=0.9)
        if any(s["cloud_gpus_spot"]):
            axes[1].plot(days, s["cloud_gpus_spot"], label=f"{name} spot", color=c, linewidth=0.9)
        if any(s["cloud_gpus_on_demand"]):
            axes[1].plot(days, s["cloud_gpus_on_demand"], label=f"{name} on-demand", color=c, linewidth=0.9,
                         linestyle="--")
        axes[2].plot(days, [v / 1000.0 for v in s["cloud_cost_usd"]], label=name, color=c, linewidth=1.2)
    axes[0].set_ylabel("GPUs pending on-prem")
    axes[0].set_yscale("symlog", linthresh=10)
    axes[0].set_title("Queue depth")
    axes[1].set_ylabel("cloud GPUs")
    axes[1].set_title("Cloud GPUs by market (solid: spot, dashed: on-demand)")
    axes[2].set_ylabel("cumulative cloud spend (k$)")
    axes[2].set_title("Cloud spend")
    axes[2].set_xlabel("days since the first job")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8, ncol=2)
    fig.savefig(path, dpi=110)
    plt.close(fig)
