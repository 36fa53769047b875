"""`broker advise`: build vs rent, from measured utilisation and the price catalog."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from broker.cli.advise_sweep import advise_simulation, policy_of, read_simulation
from broker.cli.app import app, check_format, check_writable, console, exit_usage, fitted_table, print_json
from broker.times import as_of
from providers.files import read_text


#: The sane range of each owning-cost flag: a value outside is a typo (2^63 GPUs, a PUE of 40),
#: and past it the yearly sums stop meaning anything.
MAX_GPUS = 1_000_000
BOUNDS = {"--gpus-per-server": (1, 128), "--server-capex": (0, 1e8), "--amortisation-years": (0.1, 50),
          "--kw-per-server": (0, 1000), "--pue": (1, 10), "--usd-per-kwh": (0, 100),
          "--staff-per-year": (0, 1e10), "--facility-per-year": (0, 1e10)}


def _check_bounds(gpus, values: tuple) -> None:
    """``--gpus`` and the owning-cost flags (``values`` in the order of BOUNDS; None: the
    catalog's capex.csv gives it) within their ranges, or exit 2 naming the flag."""
    _check_gpus(gpus)
    for (flag, (lo, hi)), v in zip(BOUNDS.items(), values):
        if v is not None and not lo <= v <= hi:  # NaN fails both comparisons
            exit_usage(f"{flag} must be a number from {lo:g} to {hi:g}, got {v}.")


def _check_gpus(gpus, required: bool = False) -> None:
    if gpus is None and required:
        exit_usage("--gpus must be a positive whole number.")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 < gpus <= MAX_GPUS):
        exit_usage(f"--gpus must be a positive whole number, at most {MAX_GPUS:,}, got {gpus}.")


def _utilization_arg(text: str) -> float:
    """A fraction 0..1 ("0.7") or a percentage with its sign ("70%"); anything else is refused
    (a bare "70" or "1.5" is ambiguous)."""
    t = text.strip()
    pct = t.endswith("%")
    try:
        v = float(t[:-1]) / 100 if pct else float(t)
    except ValueError:
        exit_usage(f"--utilization must be a number: a fraction such as 0.7 or a percentage such as 70%, got {text!r}.")
    if not 0 <= v <= 1:
        exit_usage(f"--utilization must lie between 0 and 1, or 0% and 100% with the % sign, got {text!r}.")
    return v


def _measured(gpus, utilization, from_simulate, sim_policy, sacct) -> tuple[float, int | None, str]:
    """The utilisation, the GPUs it applies to and where it came from."""
    from policies.tco import sacct_usage

    if from_simulate is not None:
        doc = read_simulation(from_simulate)
        u = policy_of(doc, from_simulate, sim_policy)["onprem_utilization"]
        if gpus is None:
            gpus = doc.get("onprem_gpus")
            if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
                exit_usage(f"{from_simulate} gives no positive whole onprem_gpus (got {gpus!r}); pass --gpus.")
        return u, gpus, f"simulated ({sim_policy}, {from_simulate.name})"
    if sacct is not None:
        if gpus is None:
            exit_usage("--sacct needs --gpus: the GPUs the accounted cluster has.")
        try:
            usage = sacct_usage(read_text(sacct), sacct.name)
        except OSError as e:
            exit_usage(f"cannot read {sacct}: {e.strerror or e}.")
        except ValueError as e:
            exit_usage(f"{str(e).rstrip('.')}.")
        if gpus <= 0:
            exit_usage(f"--gpus must be positive, got {gpus}.")
        return usage.utilization(gpus), gpus, (f"Slurm accounting ({usage.jobs} jobs, {usage.gpu_seconds / 3600:,.0f} "
                                               f"GPU-h over {usage.window_s / 86400:.1f} days)")
    return _utilization_arg(utilization), gpus, "given"


@app.command("advise")
def advise_cmd(
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs to own (default: --from-simulate's on-prem GPUs)."),
    utilization: Optional[str] = typer.Option(None, "--utilization", help="Sustained utilisation: a fraction "
                                              "(0.7) or a percentage with its sign (70%)."),
    from_simulate: Optional[Path] = typer.Option(None, "--from-simulate", help="A `broker simulate --format json` "
                                                 "output: use its on-prem utilisation."),
    simulation: Optional[Path] = typer.Option(None, "--simulation", help="A `broker simulate --format json` output, "
                                              "one pool size or a sweep (--onprem-gpus 256,512,...): build vs rent "
                                              "per size from its simulated cloud cost, wait and utilisation."),
    sim_policy: str = typer.Option("", "--sim-policy", help="Which policy to read from --from-simulate "
                                   "(default onprem-only) or --simulation (default broker)."),
    sacct: Optional[Path] = typer.Option(None, "--sacct", help="A Slurm accounting export (sacct --parsable2 "
                                         "--format=JobID,AllocTRES,Elapsed,Start,End): utilisation = GPU-time used "
                                         "/ (GPUs x the window it covers)."),
    gpu_model: Optional[str] = typer.Option(None, "--gpu-model", help="GPU model to price in the catalog "
                                            "(default: --simulation's, else H100)."),
    gpus_per_server: Optional[int] = typer.Option(None, "--gpus-per-server", help="Default: the catalog's "
                                                  "capex.csv for the model."),
    server_capex: Optional[float] = typer.Option(None, "--server-capex", help="USD per server (default: the "
                                                 "catalog's capex.csv for the GPU model, dated and sourced)."),
    amortisation_years: float = typer.Option(4.0, "--amortisation-years"),
    kw_per_server: Optional[float] = typer.Option(None, "--kw-per-server", help="Default: capex.csv's."),
    pue: float = typer.Option(1.4, "--pue"),
    usd_per_kwh: float = typer.Option(0.12, "--usd-per-kwh"),
    staff_per_year: float = typer.Option(150_000.0, "--staff-per-year", help="USD a year, whole fleet."),
    facility_per_year: float = typer.Option(60_000.0, "--facility-per-year", help="USD a year, whole fleet."),
    catalog_dir: Optional[Path] = typer.Option(None, "--catalog", help="Price catalog directory (default: bundled)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of yearly cost against utilisation."),
) -> None:
    """Build or rent? The cheapest of owning, renting and a hybrid, with the break-even utilisation.

    Examples: broker advise --gpus 512 --utilization 0.55;
    broker advise --simulation sweep.json (from broker simulate --onprem-gpus 256,512,1024 --format json).
    """
    from policies.tco import OnPrem, TcoError, advise

    check_format(fmt)
    _check_bounds(gpus, (gpus_per_server, server_capex, amortisation_years, kw_per_server, pue, usd_per_kwh,
                         staff_per_year, facility_per_year))
    sources = [s for s in (utilization, from_simulate, sacct, simulation) if s is not None]
    if len(sources) != 1:
        exit_usage("give the utilisation exactly one way: --utilization, --from-simulate, --sacct or --simulation.")
    if plot is not None and plot.suffix.lower() != ".png":
        exit_usage(f"--plot writes a PNG; give a path ending in .png, got {str(plot)[:200]}.")
    if plot is not None:
        check_writable(plot, "--plot")
    catalog = _catalog(catalog_dir)
    model, prices = _model_and_prices(catalog, gpu_model, simulation)
    owning = _owning(model, catalog_dir, gpus_per_server, server_capex, kw_per_server)
    spec = OnPrem(gpus=1, gpus_per_server=owning["gpus_per_server"], server_capex_usd=owning["server_capex_usd"],
                  amortisation_years=amortisation_years, kw_per_server=owning["kw_per_server"], pue=pue,
                  usd_per_kwh=usd_per_kwh, staff_usd_per_year=staff_per_year,
                  facility_usd_per_year=facility_per_year)
    if simulation is not None:
        advise_simulation(simulation, sim_policy or "broker", spec, prices, model, catalog.as_of, fmt,
                          owning=owning, plot=plot)
        return
    gpu_model = model
    u, gpus, source = _measured(gpus, utilization, from_simulate, sim_policy or "onprem-only", sacct)
    _check_gpus(gpus, required=True)
    spec = replace(spec, gpus=gpus)
    try:
        adv = advise(spec, u, prices)
    except TcoError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    if plot is not None:
        try:
            _plot(spec, adv, plot, gpu_model.upper())
        except OSError as e:
            exit_usage(f"cannot write the plot {plot}: {e.strerror or e}.")
    out = {"gpus": gpus, "gpu_model": gpu_model.upper(), "utilization_source": source,
           "catalog_as_of": as_of(catalog.as_of), "owning": {**owning, "as_of": as_of(owning["as_of"])},
           **adv.to_dict()}
    if fmt == "json":
        print_json(out)
        return
    _print_advice(adv, gpus, gpu_model.upper(), u, source)


def _model_and_prices(catalog, gpu_model: Optional[str], simulation: Optional[Path]) -> tuple[str, dict]:
    """The GPU model and its cloud prices: the simulation's when there is one, else the catalog's."""
    from policies.tco import cheapest_prices

    sim_doc = read_simulation(simulation) if simulation is not None else None
    model = _model(gpu_model, sim_doc, simulation)
    prices = _sim_prices(sim_doc, simulation, model) if sim_doc is not None else None
    if not prices:
        prices = cheapest_prices(catalog.offerings, catalog.committed_micros, model)
    if not prices:
        exit_usage(f"the catalog sells no {model} on demand; known: {', '.join(catalog.gpu_models)}.")
    return model, prices


def _model(flag: Optional[str], sim_doc: Optional[dict], simulation: Optional[Path]) -> str:
    """The GPU model to price: a simulation's own, which a contradicting --gpu-model may not
    change; else --gpu-model; else H100."""
    given = flag.strip().upper() if flag is not None else None
    if given == "":
        exit_usage("--gpu-model is empty; name a GPU model such as A100 or H100.")
    simulated = sim_doc.get("gpu_model") if sim_doc is not None else None
    if simulated is not None and (not isinstance(simulated, str) or not simulated.strip()):
        exit_usage(f"{simulation}: gpu_model must be a GPU model name; write it with `broker simulate --format json`.")
    simulated = simulated.strip().upper() if simulated else None
    if given and simulated and given != simulated:
        exit_usage(f"--gpu-model {given} contradicts {simulation.name}, whose bursts were priced as {simulated}: "
                   f"leave --gpu-model out, or simulate again with --gpu-model {given}.")
    return simulated or given or "H100"


def _sim_prices(doc: dict, path: Path, model: str) -> dict:
    """The cloud prices the simulation recorded (``gpu_prices``), or {} for an older file."""
    import math

    from policies.tco import CloudPrice

    raw = doc.get("gpu_prices")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        exit_usage(f"{path}: gpu_prices must be an object; write it with `broker simulate --format json`.")
    out = {}
    for kind, p in raw.items():
        v = p.get("usd_per_gpu_hour") if isinstance(p, dict) else None
        if kind not in ("on_demand", "committed_1y") or isinstance(v, bool) or not isinstance(v, (int, float)) \
                or not math.isfinite(v) or v <= 0:
            exit_usage(f"{path}: gpu_prices.{kind} must hold a positive usd_per_gpu_hour; write it with "
                       f"`broker simulate --format json`.")
        out[kind] = CloudPrice(kind, float(v), str(p.get("provider", ""))[:64], str(p.get("region", ""))[:64],
                               str(p.get("instance_type", ""))[:64])
    return out


def _owning(model: str, catalog_dir: Optional[Path], gpus_per_server, server_capex, kw_per_server) -> dict:
    """Server size, price and power for ``model``: the flags, else the catalog's capex.csv."""
    from providers.capex import CapexError, load_capex

    try:
        row = load_capex(catalog_dir).get(model)
    except CapexError as e:
        exit_usage(f"{str(e).rstrip('.')}.")
    if row is None and server_capex is None:
        exit_usage(f"the catalog's capex.csv has no server price for {model}; give --server-capex (USD per "
                   f"server) and --kw-per-server.")
    return {"gpu_model": model,
            "gpus_per_server": gpus_per_server if gpus_per_server is not None else (row.gpus_per_server if row else 8),
            "server_capex_usd": server_capex if server_capex is not None else row.server_capex_usd,
            "kw_per_server": kw_per_server if kw_per_server is not None else (row.kw_per_server if row else 10.2),
            "as_of": row.as_of if row and server_capex is None else "",
            "source": row.source if row and server_capex is None else "--server-capex"}


def _catalog(catalog_dir: Optional[Path]):
    from providers.catalog import CatalogError, bundled, load

    try:
        return load(catalog_dir) if catalog_dir else bundled()
    except (CatalogError, OSError, ValueError) as e:
        exit_usage(f"cannot load the price catalog: {str(e).rstrip('.')}.")


def _print_advice(adv, gpus: int, model: str, u: float, source: str) -> None:
    con = console()
    rows = [["build (own)", f"${adv.onprem_per_year / max(1e-9, gpus * 8760 * max(u, 1e-9)):.2f} used", "-",
             f"${adv.costs['build']['1y']:,.0f}", f"${adv.costs['build']['3y']:,.0f}"]]
    for k, p in adv.prices.items():
        be = adv.break_even[k]
        where, _, region = p.label.rpartition(" ")  # "aws p5.48xlarge us-east-1": the region below
        rows.append([f"rent {k.replace('_', ' ')}\n({where}\n {region})" if where else f"rent {k.replace('_', ' ')}\n({p.label})",
                     f"${p.usd_per_gpu_hour:.2f}",
                     "never" if be is None else f"{be * 100:.0f} %",
                     f"${adv.costs['rent_' + k]['1y']:,.0f}", f"${adv.costs['rent_' + k]['3y']:,.0f}"])
    rows.append(["hybrid (own the base,\nburst on demand)", "-", "-", f"${adv.costs['hybrid']['1y']:,.0f}",
                 f"${adv.costs['hybrid']['3y']:,.0f}"])
    con.print(f"Build vs rent: {gpus:,} {model} GPUs at {u * 100:.0f} % utilisation ({source})", highlight=False)
    columns = [(c, "left" if c == "choice" else "right") for c in ("choice", "per GPU-h", "break-even", "1 year", "3 years")]
    con.print(fitted_table(con, columns, rows, drop_first=("break-even", "per GPU-h"), fold=("choice",)))
    lines = ", ".join(f"{k.replace('_', ' ')} ${v:,.0f}" for k, v in adv.onprem_lines.items())
    con.print(f"owning, per year: {lines}", highlight=False)
    con.print(f"recommendation: {adv.reason}", highlight=False)


def _plot(spec, adv, path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from policies.tco import rent_cost_per_year

    us = [k / 100 for k in range(0, 101)]
    fig, ax = plt.subplots(figsize=(9, 5.5), constrained_layout=True)
    ax.plot([u * 100 for u in us], [spec.cost_per_year(u) / 1e6 for u in us], label="build (own)", color="tab:blue",
            linewidth=2)
    styles = {"on_demand": ("tab:red", "-"), "committed_1y": ("tab:orange", "--")}
    for k, p in adv.prices.items():
        c, ls = styles.get(k, ("tab:gray", ":"))
        ax.plot([u * 100 for u in us], [rent_cost_per_year(spec.gpus, u, p) / 1e6 for u in us], color=c,
                linestyle=ls, label=f"rent {k.replace('_', ' ')} ${p.usd_per_gpu_hour:.2f}/GPU-h ({p.provider})")
        be = adv.break_even[k]
        if be is not None:
            ax.axvline(be * 100, color=c, linestyle=":", linewidth=1)
            ax.annotate(f"break-even {be * 100:.0f} %", (be * 100, 0), xytext=(4, 8), textcoords="offset points",
                        color=c, fontsize=8, rotation=90)
    ax.axvline(adv.utilization * 100, color="black", linewidth=1.2)
    ax.annotate(f"measured {adv.utilization * 100:.0f} %: {adv.recommendation}", (adv.utilization * 100, 0),
                xytext=(4, 120), textcoords="offset points", fontsize=9)
    ax.axvspan(0, 40, color="tab:red", alpha=0.05)
    ax.axvspan(60, 100, color="tab:blue", alpha=0.05)
    ax.set_xlabel("sustained utilisation (%)")
    ax.set_ylabel("cost per year (M$)")
    ax.set_title(f"{spec.gpus} {model} GPUs: owning vs renting")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
