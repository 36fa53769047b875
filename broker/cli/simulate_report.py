"""What `broker simulate` prints and plots: one pool size over time, or a sweep per size."""
from __future__ import annotations

import sys
from pathlib import Path

from broker.cli.app import exit_usage, fitted_table, print_json

COLORS = {"onprem-only": "tab:gray", "ondemand-cheapest": "tab:red", "spot-greedy": "tab:orange",
          "broker": "tab:blue", "broker-burst-overdue": "tab:cyan"}


def fmt_s(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    if s < 100 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 3600:,.0f} h"


def run_one(jobs, catalog, names, cfg, lifetimes) -> dict:
    """Every policy on one pool size, with a progress bar on a terminal for long traces."""
    from broker.simulate import run_policies

    if not sys.stderr.isatty():  # a log, not a terminal: a line per replay, and every tenth of a long trace
        said: dict[str, int] = {}

        def tenth(name: str, done: int) -> None:
            k = done * 10 // len(jobs)
            if k > said.get(name, 0):
                said[name] = k
                sys.stderr.write(f"broker: {name}: {done:,} of {len(jobs):,} jobs replayed\n")
                sys.stderr.flush()
        line, out = progress_lines(), {}
        for k, name in enumerate(names, 1):
            out.update(run_policies(jobs, catalog, [name], cfg, lifetimes, tenth if len(jobs) >= 20_000 else None))
            line(f"{name} on {cfg.onprem_gpus:,} GPUs", k, len(names))
        return out
    if len(jobs) < 20_000:
        return run_policies(jobs, catalog, names, cfg, lifetimes)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} jobs"),
                   TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
    tasks = {n: bar.add_task(n, total=len(jobs)) for n in names}
    with bar:
        return run_policies(jobs, catalog, names, cfg, lifetimes,
                            lambda name, done: bar.update(tasks[name], completed=done))


def progress_lines():
    """``line(what, done, total)``: one line on stderr per finished replay, with the time taken
    so far (a sweep of the Philly trace takes minutes)."""
    import time

    start = time.monotonic()

    def line(what: str, done: int, total: int) -> None:
        sys.stderr.write(f"broker: replayed {what} ({done}/{total}, {fmt_s(time.monotonic() - start)})\n")
        sys.stderr.flush()

    return line


def preemptions_line(doc: dict) -> str:
    life = doc.get("spot_lifetimes", "catalog")
    return "spot preemptions: " + ("the catalog's interruption rates" if life == "catalog"
                                   else f"observed lifetimes ({Path(life).name})")


def print_table(doc: dict) -> None:
    from rich.console import Console

    pols = doc["policies"]
    columns = [(c, "left" if c == "policy" else "right")
               for c in ("policy", "cloud $", "hindsight", "bound $", "p95", "p99", "burst", "util")]
    rows = [(name, f"{d['cloud_cost_usd']:,.0f}", f"{d['hindsight_cost_usd']:,.0f}",
             f"{d['lower_bound_cost_usd']:,.0f}", fmt_s(d["wait_p95_s"]), fmt_s(d["wait_p99_s"]),
             f"{d['jobs_burst']:,}", f"{d['onprem_utilization'] * 100:.0f} %") for name, d in pols.items()]
    con = Console(width=80)
    # Too wide for 80 columns (a sum in the millions, waits of thousands of hours): the hindsight
    # and bound columns go first (the sentences below give both); no figure is ever cut.
    t = fitted_table(con, columns, rows, drop_first=("bound $", "hindsight"),
                     title=f"{doc['jobs']:,} jobs on {doc['onprem_gpus']} on-prem GPUs "
                           f"({doc['gpu_model']} in the cloud, catalog {doc['catalog_as_of'][:10]})")
    con.print(t)
    for name, d in pols.items():
        if d["jobs_burst"] == 0:
            continue
        lb, cost = d["lower_bound_cost_usd"], d["cloud_cost_usd"]
        markets = ", ".join(f"{k} ${v:,.0f}" for k, v in d["cost_by_market_usd"].items())
        provs = ", ".join(f"{k} ${v:,.0f}" for k, v in d["cost_by_provider_usd"].items())
        con.print(f"{name}: spent ${cost:,.0f} ({markets}; {provs}; {d['cloud_gpu_hours']:,.0f} cloud GPU-h, "
                  f"{d['interruptions']:,} interruptions). Running exactly the jobs it burst, each on the cheapest "
                  f"market it was eligible for with no start-up, rework or failed launch, would cost ${lb:,.0f} (the "
                  f"lower bound): it loses ${cost - lb:,.0f} ({(cost / lb - 1) * 100 if lb else 0:.0f} %) to "
                  f"execution (start-ups, preemption rework, on-demand fallbacks).", highlight=False)
    if "broker" in pols and "ondemand-cheapest" in pols and pols["ondemand-cheapest"]["cloud_cost_usd"] > 0:
        b, o = pols["broker"], pols["ondemand-cheapest"]
        con.print(f"broker spends {b['cloud_cost_usd'] / o['cloud_cost_usd']:.2f}x what ondemand-cheapest does, "
                  f"at a p95 wait of {fmt_s(b['wait_p95_s'])} against {fmt_s(o['wait_p95_s'])}; "
                  f"{b['cost_over_hindsight'] or 0:.2f}x its hindsight cost (each job it burst on the market that "
                  f"was cheapest knowing its interruptions).", highlight=False)
    classes = pols.get("broker", {}).get("classes") or {}
    if len(classes) > 1:  # the wait targets per class (policies.classes) and what each got
        con.print("broker waits per class: " + "; ".join(
            f"{c} {v['jobs']:,} jobs p95 {fmt_s(v['wait_p95_s'])} p99 {fmt_s(v['wait_p99_s'])}"
            for c, v in classes.items()), highlight=False)
    con.print(preemptions_line(doc), highlight=False)
    unserved = {n: d["unserved_jobs"] for n, d in pols.items() if d["unserved_jobs"]}
    if unserved:
        con.print("jobs never run (bigger than the cluster and no cloud offer, or never burst): "
                  + ", ".join(f"{n} {k}" for n, k in unserved.items()), highlight=False)


def sweep(doc, jobs, catalog, names, sizes, cfg, lifetimes, workers, fmt, plot) -> None:
    """Every policy at every size in worker processes; one table and one plot."""
    from broker.simulate.sweep import run_sweep

    line = progress_lines()
    res = run_sweep(jobs, catalog, names, sizes, cfg, lifetimes, workers,
                    progress=lambda size, name, done, total: line(f"{name} on {size:,} GPUs", done, total))
    doc["sizes"] = [{"onprem_gpus": s, "policies": {n: r.to_dict() for n, r in res[s].items()}} for s in sizes]
    if plot is not None:
        try:
            write_sweep_plot(doc, plot)
        except OSError as e:
            exit_usage(f"cannot write the plot {plot}: {e.strerror or e}.")
    if fmt == "json":
        print_json(doc)
        return
    print_sweep_table(doc, len(jobs))


def print_sweep_table(doc: dict, n_jobs: int) -> None:
    from rich.console import Console

    columns = [(c, "left" if c == "policy" else "right")
               for c in ("GPUs", "policy", "cloud $", "p95", "p99", "burst", "util")]
    rows = [(f"{run['onprem_gpus']:,}" if k == 0 else "", name, f"{d['cloud_cost_usd']:,.0f}",
             fmt_s(d["wait_p95_s"]), fmt_s(d["wait_p99_s"]), f"{d['jobs_burst']:,}",
             f"{d['onprem_utilization'] * 100:.0f} %")
            for run in doc["sizes"] for k, (name, d) in enumerate(run["policies"].items())]
    con = Console(width=80)
    t = fitted_table(con, columns, rows, drop_first=("burst",),
                     title=f"{n_jobs:,} jobs, {len(doc['sizes'])} pool sizes ({doc['gpu_model']} in the cloud)")
    con.print(t)
    con.print(preemptions_line(doc), highlight=False)


def write_sweep_plot(doc: dict, path: Path) -> None:
    """Three panels against the pool size: cloud cost, p95 wait, on-prem utilisation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.5), constrained_layout=True)
    sizes = [r["onprem_gpus"] for r in doc["sizes"]]
    for name in doc["sizes"][0]["policies"]:
        ds = [r["policies"][name] for r in doc["sizes"]]
        c = COLORS.get(name)
        axes[0].plot(sizes, [d["cloud_cost_usd"] / 1000 for d in ds], "o-", label=name, color=c)
        axes[1].plot(sizes, [max(d["wait_p95_s"], 1) / 3600 for d in ds], "o-", label=name, color=c)
        axes[2].plot(sizes, [d["onprem_utilization"] * 100 for d in ds], "o-", label=name, color=c)
    for ax, title in zip(axes, ("cloud cost (k$)", "p95 wait (h)", "on-prem utilisation (%)")):
        ax.set_title(title)
        ax.set_xlabel("on-prem GPUs")
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plot(results: dict, path: Path) -> None:
    """Three panels over time: pending GPUs on-prem, cloud GPUs (spot solid, on-demand dashed),
    cumulative cloud spend; one colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True, constrained_layout=True)
    colors = COLORS
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
