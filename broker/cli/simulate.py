"""`broker simulate`: replay a job trace under burst policies and compare cost and waits."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from broker.cli.app import FORMATS, app, check_writable, exit_usage, print_json
from broker.times import as_of

_POLICIES = ("onprem-only", "ondemand-cheapest", "spot-greedy", "broker", "broker-burst-overdue")
_POLICY_HELP = f"Policy to replay (repeatable): {', '.join(_POLICIES)}. Default: all."
LIFETIMES_FILE = "spot_instance_lifetimes_aws_gcp_2020.csv"
_REPO = Path(__file__).resolve().parents[2]


def default_lifetimes(trace: Path) -> Path | None:
    """The observed spot lifetimes of the shared data, when present: beside the trace's
    directory (``data/traces/x.csv`` -> ``data/spot/``), in ``$BROKER_SHARED_DATA/spot/`` or in
    ``../shared/data/spot/``."""
    dirs = [trace.resolve().parent.parent / "spot"]
    if os.environ.get("BROKER_SHARED_DATA"):
        dirs.append(Path(os.environ["BROKER_SHARED_DATA"]) / "spot")
    dirs.append(_REPO.parent / "shared" / "data" / "spot")
    for d in dirs:
        if (d / LIFETIMES_FILE).is_file():
            return d / LIFETIMES_FILE
    return None


def _sizes(text: str, per_node: int) -> list[int]:
    from broker.simulate.model import MAX_GPUS_PER_NODE, MAX_ONPREM_GPUS

    if not 0 < per_node <= MAX_GPUS_PER_NODE:
        exit_usage(f"--gpus-per-node must be between 1 and {MAX_GPUS_PER_NODE}, got {per_node}.")
    parts = [x.strip() for x in text.split(",")]
    if not all(x.isascii() and x.isdigit() for x in parts):
        exit_usage(f"--onprem-gpus takes whole numbers separated by commas, such as 512 or 256,512,1024; "
                   f"got {text!r}.")
    sizes = [int(x) for x in parts]
    big = [s for s in sizes if s > MAX_ONPREM_GPUS]
    if big:
        exit_usage(f"--onprem-gpus must be at most {MAX_ONPREM_GPUS:,}, got {big[0]:,}.")
    bad = [s for s in sizes if s % per_node]
    if bad:
        exit_usage(f"--onprem-gpus must be a multiple of --gpus-per-node ({per_node}) or a comma-separated list "
                   f"of them, got {text!r}.")
    return list(dict.fromkeys(sizes))


def _check(names, share, ckpt, plot, fractional, jobs) -> None:
    bad = [n for n in names if n not in _POLICIES]
    if bad:
        exit_usage(f"unknown policy {bad[0]!r}; known: {', '.join(_POLICIES)}.")
    if not 0.0 <= share <= 1.0:
        exit_usage(f"--interruptible-share must be between 0 and 1, got {share}.")
    if ckpt < 0:
        exit_usage(f"--checkpoint-minutes must be zero or positive, got {ckpt}.")
    if plot is not None and plot.suffix.lower() != ".png":
        exit_usage(f"--plot writes a PNG; give a path ending in .png, got {str(plot)[:200]}.")
    if plot is not None:
        check_writable(plot, "--plot")
    if fractional not in ("round-up", "skip"):
        exit_usage(f"--fractional-gpus must be round-up or skip, got {fractional!r}.")
    if jobs is not None and jobs <= 0:
        exit_usage(f"--jobs must be positive, got {jobs}.")


def _inputs(trace, catalog_dir, gpu_model, share, seed, strict, fractional, columns, spot_lifetimes):
    """The catalog, the trace and the spot lifetimes (with where they came from)."""
    from broker.simulate import TraceError, load_lifetimes, parse_columns, read_trace
    from providers.catalog import CatalogError, bundled, load

    try:
        catalog = load(catalog_dir) if catalog_dir else bundled()
    except (CatalogError, OSError, ValueError) as e:
        exit_usage(f"cannot load the price catalog: {str(e).rstrip('.')}.")
    model = gpu_model.strip().upper()
    if model not in catalog.by_gpu:
        exit_usage(f"--gpu-model {gpu_model!r} is not in the catalog; known: {', '.join(catalog.gpu_models)}.")
    life_path = None
    if spot_lifetimes == "auto":
        life_path = default_lifetimes(trace)
    elif spot_lifetimes != "catalog":
        life_path = Path(spot_lifetimes)
    try:
        tr = _depth_trace(trace, seed, model) or read_trace(
            trace, share, seed, model, strict=strict, fractional=fractional,
            columns=parse_columns(columns) if columns else None)
        lifetimes = load_lifetimes(life_path) if life_path else None
    except TraceError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    unknown = sorted({j.gpu_model for j in tr.jobs if j.gpu_model not in catalog.by_gpu})
    if unknown:
        exit_usage(f"the trace names GPU model(s) {', '.join(unknown)} that the catalog does not sell; "
                   f"known: {', '.join(catalog.gpu_models)}.")
    return catalog, model, tr, lifetimes, life_path


def _depth_trace(path: Path, seed: int, model: str):
    """A per-minute queue-depth series (Helios' vc, minute, total_gpu, running_gpu, ...) is no
    job trace: its arrivals are derived (broker.simulate.workloads), and stderr says how."""
    from broker.simulate.trace import Trace
    from broker.simulate.workloads import is_queue_depth, queue_depth_jobs
    from providers.files import lines

    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            header = [h.strip().lower() for h in next(lines(f), "").split(",")]
    except (OSError, UnicodeDecodeError):
        return None  # read_trace says what is wrong with it
    if not is_queue_depth(header):
        return None
    w = queue_depth_jobs(path, seed, model)
    typer.echo(f"broker: {path.name} is a per-minute queue-depth series, not a job trace: {w.note}.", err=True)
    return Trace(str(path), w.jobs)


@app.command("simulate")
def simulate_cmd(
    trace: Path = typer.Option(..., "--trace", help="Job trace CSV: job_id, submit_time_s, num_gpus, duration_s "
                               "[, queue|vc, interruptible, gpu_model, data_gb, kind, checkpoint_minutes]; public "
                               "cluster traces' column names are recognised (see --columns)."),
    onprem_gpus: str = typer.Option(..., "--onprem-gpus", help="On-prem GPUs (a multiple of --gpus-per-node), or "
                                    "several sizes to sweep: 256,384,512,768,1024."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per on-prem node."),
    policy: Optional[list[str]] = typer.Option(None, "--policy", help=_POLICY_HELP),
    spot_lifetimes: str = typer.Option("auto", "--spot-lifetimes", help="Spot lifetimes: a CSV (cloud, "
                                       "observed_lifetime_s, ended_by); 'auto' (default) uses the shared data's "
                                       "observed 2020 lifetimes when present (spot/ beside the trace's folder, "
                                       "$BROKER_SHARED_DATA/spot or ../shared/data/spot), and says which on "
                                       "stderr; 'catalog' the catalog's rates."),
    interruptible_share: float = typer.Option(0.5, "--interruptible-share", help="Share of jobs marked "
                                              "interruptible (by a seeded hash of the job id) when the trace has "
                                              "no interruptible column."),
    seed: int = typer.Option(0, "--seed", help="Seed for the interruptible marks and spot lifetimes."),
    gpu_model: str = typer.Option("A100", "--gpu-model", help="Cloud GPU model for jobs whose row names none."),
    checkpoint_minutes: int = typer.Option(30, "--checkpoint-minutes", help="Checkpoint interval of interruptible "
                                           "jobs whose row names none."),
    strict: bool = typer.Option(False, "--strict", help="Refuse CPU-only, fractional, never-started, "
                                "unfinished and duration-less rows instead of skipping and counting them."),
    fractional_gpus: str = typer.Option("round-up", "--fractional-gpus", help="A share of a GPU: round-up to "
                                        "whole GPUs or skip the row."),
    columns: Optional[str] = typer.Option(None, "--columns", help="Map fields to headers the aliases miss: "
                                          "submit=creation_time,gpus=num_gpu,duration=run_s (fields: job_id, "
                                          "submit, gpus, duration, start, end, gpu_milli, queue, ...)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Worker processes for a sweep (default: CPUs)."),
    catalog_dir: Optional[Path] = typer.Option(None, "--catalog", help="Price catalog directory (default: bundled)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: over time for one size (queue, cloud "
                                        "GPUs, spend), or per size for a sweep (cost, p95 wait, utilisation)."),
) -> None:
    """Replay a trace: on-prem FIFO with backfill, bursting by each policy; cost and waits.

    Examples: broker simulate --trace philly.csv --onprem-gpus 512;
    broker simulate --trace philly.csv --onprem-gpus 256,512,1024 --format json > sweep.json
    """
    if fmt not in FORMATS:
        exit_usage(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}.")
    names = list(dict.fromkeys(policy or _POLICIES))
    sizes = _sizes(onprem_gpus, gpus_per_node)
    _check(names, interruptible_share, checkpoint_minutes, plot, fractional_gpus, jobs)
    catalog, model, tr, lifetimes, life_path = _inputs(trace, catalog_dir, gpu_model, interruptible_share, seed,
                                                       strict, fractional_gpus, columns, spot_lifetimes)
    from broker.cli import simulate_report as report
    from broker.simulate import SimConfig

    warn = tr.warning()
    if warn:
        sys.stderr.write(f"broker: {trace.name}: {warn}\n")
    sys.stderr.write(f"broker: spot lifetimes: {f'observed ({life_path})' if life_path else 'the catalog rates'}\n")
    cfg = SimConfig(onprem_gpus=sizes[0], gpus_per_node=gpus_per_node, seed=seed, default_gpu_model=model,
                    checkpoint_minutes=checkpoint_minutes)
    doc = {"trace": tr.to_dict(), "gpus_per_node": gpus_per_node, "interruptible_share": interruptible_share,
           "seed": seed, "gpu_model": model, "spot_lifetimes": str(life_path) if life_path else "catalog",
           "catalog_as_of": as_of(catalog.as_of), "gpu_prices": _gpu_prices(catalog, model)}
    if len(sizes) > 1:
        report.sweep(doc, tr.jobs, catalog, names, sizes, cfg, lifetimes, jobs, fmt, plot)
        return
    results = report.run_one(tr.jobs, catalog, names, cfg, lifetimes)
    if plot is not None:
        try:
            report.write_plot(results, plot)
        except OSError as e:
            exit_usage(f"cannot write the plot {plot}: {e.strerror or e}.")
    doc.update({"jobs": len(tr.jobs), "onprem_gpus": sizes[0], "policies": {n: r.to_dict() for n, r in results.items()}})
    if fmt == "json":
        print_json(doc)
        return
    report.print_table(doc)


def _gpu_prices(catalog, model: str) -> dict:
    """The cheapest on-demand (and committed) price per GPU-hour of the simulated model, so
    `broker advise --simulation` prices owning against what was simulated."""
    from policies.tco import cheapest_prices

    return {k: {"usd_per_gpu_hour": round(p.usd_per_gpu_hour, 6), "provider": p.provider, "region": p.region,
                "instance_type": p.instance_type}
            for k, p in cheapest_prices(catalog.offerings, catalog.committed_micros, model).items()}
