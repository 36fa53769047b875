"""`broker quote`'s work without the CLI framework: its options read from the command line for the
common case, the quote (in-process on the bundled catalog, or from a running broker), and its
table or JSON.

``broker/cli/quote.py`` declares the command to typer (its help, and every error in how it is
called) and runs :func:`run`; :func:`fast` answers a well-formed `broker quote` without typer,
which costs more to import and build than the quote itself, and declines (returns False) every
command line it does not read exactly as typer would: typer then answers it.
``tests/test_cli_quote_fast.py`` keeps the two option tables equal.
"""
from __future__ import annotations

import errno
import os
import sys
from typing import Optional

from broker.terminal import check_format, exit_refused, exit_usage, plain_console, print_json
from broker.terminal import console as make_console, fitted_table
from broker.times import parse_iso

HELP = """Quote GPU capacity across AWS, GCP and Azure at full cost.

Runs in-process on the bundled catalog (no server needed), or against a running
`broker serve` with --server, which also stores the quote so `broker launch
--quote-id Q --offer N` can take one of its offers.

Every offer's total is the sum of its lines: compute (stretched for weaker
interconnect on multi-node jobs), spot interruption rework, storage, data
transfer in and out, and SLA risk. Offers that cannot serve the demand are
listed with the reason (spot for a job that does not checkpoint, too little GPU
memory, no interconnect for a multi-node job, region not allowed, under the
minimum SLA).

\b
Examples:
  broker quote --gpu H100:8 --hours 24 --data-in-gb 500 --data-out-gb 50
  broker quote --gpu A100:16 --nodes 2 --hours 12 --interruptible --checkpoint-minutes 30
  broker quote --gpu any:4 --gpu-memory 40 --hours 6 --residency eu --format json
"""


MAX_GPU_COUNT = 1_000_000


def parse_gpu(text: str) -> tuple[str, int]:
    """'H100:8' -> ('H100', 8); 'any:4' -> ('', 4)."""
    model, sep, count = text.partition(":")
    if not sep:
        exit_usage(f"--gpu must look like MODEL:COUNT (e.g. H100:8), got {text!r}.")
    try:
        n = int(count)
    except ValueError:
        exit_usage(f"--gpu count must be a whole number, got {count!r}.")
    if not 0 < n <= MAX_GPU_COUNT:  # the catalog's largest node x [limits] max_nodes bounds it further
        exit_usage(f"--gpu count must be at least 1 and at most {MAX_GPU_COUNT:,}, got {n:,}.")
    model = model.strip()
    return ("" if model.lower() in ("any", "*", "") else model.upper()), n


def split_list(text: Optional[str]) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def parse_deadline(text: Optional[str], now: float) -> Optional[float]:
    if not text:
        return None
    if text.endswith("h") and text[:-1].replace(".", "", 1).isdigit():
        hours = float(text[:-1])
        if hours > 87840:  # as --hours: ten years
            exit_usage(f"--deadline is at most 87840h (ten years) from now, got {text[:40]!r}.")
        return now + hours * 3600
    try:
        return parse_iso(text)
    except ValueError:
        exit_usage(f"--deadline must be an ISO time (2026-12-03T18:00Z) or hours from now (36h), got {text[:40]!r}.")


def _table(doc: dict, console) -> None:
    d = doc["demand"]
    what = f"{d['gpu_model'] or 'any GPU'}" + (f" >= {d['min_gpu_memory_gb']} GB" if d["min_gpu_memory_gb"] else "")
    right = ("#", "nodes", "$/h", "compute", "interrupt", "storage", "transfer", "sla risk", "total $")
    columns = [(c, "right" if c in right else "left") for c in
               ("#", "provider", "region", "instance", "market", "nodes", "$/h", "compute", "interrupt",
                "storage", "transfer", "sla risk", "total $")]
    rows = []
    offers = doc["offers"]
    for o in offers:
        c = o["cost_usd"]
        rows.append((str(o["rank"]), o["provider"], o["region"], o["instance_type"], o["market"], str(o["nodes"]),
                     f"{o['hourly_usd']:.2f}" + ("*" if o.get("stale") else ""), f"{c['compute']:.2f}", f"{c['interruption']:.2f}",
                     f"{c['storage']:.2f}", f"{c['data_transfer']:.2f}", f"{c['sla_risk']:.2f}",
                     f"{c['total']:.2f}"))
    # The oldest price behind the shown offers, and where it came from (a live API or the
    # bundled catalog), rather than one catalog date that live prices make meaningless.
    oldest = min(offers, key=lambda o: o.get("price_as_of") or "", default=None)
    prices = (f"oldest price {oldest['price_as_of'][:10]} ({oldest['price_source'].split(':')[0]})"
              if oldest and oldest.get("price_source") and oldest.get("price_as_of")
              else f"prices as of {doc['catalog_as_of']}")
    # The heading's parts (what, which quote, how old its prices are) are never split: each line
    # takes as many whole parts as the terminal holds.
    # No provider enabled: every offer is a price to compare, none can be launched here.
    only = ("prices only: no provider is enabled",) if doc.get("prices_only") else ()
    for line in _pack((*only, f"{what} x {d['gpus']} for {d['hours']:g} h", f"quote {doc['quote_id']}", prices),
                      console.width):
        console.print(line, highlight=False, markup=False)
    # On a narrow terminal the cost lines go first (--format json has them all), then the
    # hourly price and node count; the rank, where, what and the total always show in full.
    t = fitted_table(console, columns, rows,
                     drop_first=("sla risk", "storage", "interrupt", "transfer", "compute", "nodes", "$/h"),
                     fold=("provider", "region", "instance", "market"))
    console.print(t)
    stale = sum(1 for o in offers if o.get("stale"))
    if stale and any(c.header == "$/h" for c in t.columns):
        console.print("* stale: the price is older than [catalog] max_age_h (broker catalog refresh)",
                      highlight=False, markup=False)
    elif stale:  # the $/h column (and its marks) did not fit
        console.print(f"* stale: {stale} of these offers use a price older than [catalog] max_age_h "
                      f"(--format json marks which; broker catalog refresh)", highlight=False, markup=False)
    for o in offers:
        if o.get("starts_at"):  # queued capacity: when it starts, and what is paid up front
            fee = (f", ${o['upfront_usd'] * o['nodes']:,.2f} up front, not refundable" if o.get("upfront_usd")
                   else ", paid per hour")
            console.print(f"#{o['rank']} {o['provider']} {o['instance_type']} queued: starts at {o['starts_at']}"
                          f"{fee}, runs at most {o['max_run_hours']:g} h", highlight=False, markup=False)
    if doc.get("spot_model") and (d.get("interruptible") or any(o["market"] == "spot" for o in offers)):
        console.print(f"spot judged by {doc['spot_model']}", highlight=False, markup=False)
    _excluded(console, doc["excluded"])


def _pack(parts: tuple[str, ...], width: int, sep: str = "  ·  ") -> list[str]:
    """``parts`` joined by ``sep`` into lines of at most ``width`` (a part longer than that
    alone on its line), never splitting a part."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines


def _excluded(console, excluded: list[dict]) -> None:
    """One line per kind of exclusion, most common first, with its most common sentence."""
    from collections import Counter

    if not excluded:
        return
    kinds = Counter(e["kind"] for e in excluded)
    console.print(f"{len(excluded)} offers excluded (--format json lists each with its reason):")
    for kind, n in kinds.most_common():
        sentences = Counter(e["reason"] for e in excluded if e["kind"] == kind)
        example, _ = sentences.most_common(1)[0]
        more = f" (and {len(sentences) - 1} similar)" if len(sentences) > 1 else ""
        console.print(f"  {n:5d} × {kind}: {example}{more}", highlight=False)


FLAG = {"gpus": "--gpu", "gpu_model": "--gpu", "min_gpu_memory_gb": "--gpu-memory", "hours": "--hours",
        "nodes": "--nodes", "data_in_gb": "--data-in-gb", "data_out_gb": "--data-out-gb",
        "data_location": "--data-location", "checkpoint_minutes": "--checkpoint-minutes",
        "providers": "--providers", "regions": "--regions", "residency": "--residency",
        "min_sla_pct": "--min-sla", "deadline": "--deadline"}


def print_table(doc: dict) -> None:
    """The quote as a table: plain text where rich would print it as such, else rich's."""
    plain = plain_console()
    if plain is not None:
        _table(doc, plain)
        if plain.fits:
            plain.flush()
            return
    _table(doc, make_console())


def run(gpu: str, hours: float, data_in_gb: float = 0.0, data_out_gb: float = 0.0, data_location: str = "onprem",
        nodes: int = 0, gpu_memory: int = 0, interruptible: bool = False, checkpoint_minutes: int = 0,
        providers: Optional[str] = None, regions: Optional[str] = None, residency: Optional[str] = None,
        min_sla: float = 0.0, deadline: Optional[str] = None, top: int = 10, fmt: str = "table",
        server: Optional[str] = None, config: Optional[str] = None) -> None:
    import time

    from policies.demand import Demand, DemandError

    check_format(fmt)
    if top < 0:
        exit_usage(f"--top must be zero or more, got {top}.")
    from policies.demand import MAX_HOURS

    if not 0 < hours <= MAX_HOURS:  # one sentence for every bad runtime: NaN fails both comparisons
        exit_usage(f"--hours must be a positive number of at most {MAX_HOURS} (ten years), got {hours}.")
    for name, v in (("--data-in-gb", data_in_gb), ("--data-out-gb", data_out_gb),
                    ("--nodes", nodes), ("--gpu-memory", gpu_memory), ("--checkpoint-minutes", checkpoint_minutes),
                    ("--min-sla", min_sla)):
        if not 0 <= v <= 1e9:  # NaN fails both comparisons
            exit_usage(f"{name} must be a finite number from 0 to 1e9, got {v}.")
    model, count = parse_gpu(gpu)
    now = time.time()
    demand = Demand(
        gpus=count, hours=hours, gpu_model=model, min_gpu_memory_gb=gpu_memory, nodes=nodes,
        data_in_gb=data_in_gb, data_location=data_location, data_out_gb=data_out_gb,
        interruptible=interruptible, checkpoint_minutes=checkpoint_minutes,
        providers=split_list(providers), regions=split_list(regions), residency=split_list(residency),
        min_sla_pct=min_sla, deadline=parse_deadline(deadline, now),
    )
    if server is not None and not server.strip():  # "--server $BROKER" with nothing in it
        exit_usage("--server is empty; give HOST:PORT, or leave it out to quote in-process.")
    if server:
        from broker.client import BrokerClient, ClientError

        try:
            with BrokerClient(server) as c:
                doc = c.quote(demand, top=top)
        except ClientError as e:
            exit_refused(e)
    else:
        from broker import market, market_store
        from broker.errors import ConfigError
        from broker.quote_config import load

        try:
            cfg = load(config)
            # one quote, then the process ends: scalar pricing over the stored live market
            engine = market.quote_engine(cfg, market_store.reader(cfg.db_url, cfg.store.connect_timeout_s),
                                         log_refused=False, bulk=False)
            demand = engine.validate(demand)
        except (ConfigError, ValueError) as e:
            if isinstance(e, DemandError):
                exit_usage(f"{FLAG.get(e.field, e.field)}: {e}")
            exit_usage(str(e))
        from broker.views import quote_to_dict

        doc = quote_to_dict(engine.quote(demand, now=now, top=top))
    if fmt == "json":
        print_json(doc)
    else:
        print_table(doc)


#: The command's options: flag -> (parameter of :func:`run`, type); a bool is a flag taking no
#: value. The same as broker/cli/quote.py declares to typer (tests/test_cli_quote_fast.py).
OPTIONS: dict[str, tuple[str, type]] = {
    "--gpu": ("gpu", str), "--hours": ("hours", float), "--data-in-gb": ("data_in_gb", float),
    "--data-out-gb": ("data_out_gb", float), "--data-location": ("data_location", str), "--nodes": ("nodes", int),
    "--gpu-memory": ("gpu_memory", int), "--interruptible": ("interruptible", bool),
    "--checkpoint-minutes": ("checkpoint_minutes", int), "--providers": ("providers", str),
    "--regions": ("regions", str), "--residency": ("residency", str), "--min-sla": ("min_sla", float),
    "--deadline": ("deadline", str), "--top": ("top", int), "--format": ("fmt", str), "-o": ("fmt", str),
    "--server": ("server", str), "--config": ("config", str),
}
REQUIRED = ("gpu", "hours")
#: Read from the environment when the option is not given (as typer's ``envvar``).
ENVVARS = {"config": "BROKER_CONFIG"}


def parse(args: list[str], environ=None) -> dict | None:
    """``args`` (after ``quote``) as :func:`run`'s keyword arguments, or None for anything typer
    alone answers the same way: help, an unknown option, a value that is not of its type or
    looks like an option, a flag given a value, a positional argument, a missing option."""
    environ = os.environ if environ is None else environ
    got: dict = {}
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if a.startswith("--"):
            name, eq, value = a.partition("=")
        elif a.startswith("-o") and len(a) > 2:
            name, eq, value = "-o", "=", a[2:]  # click reads -ojson as -o json
        else:
            name, eq, value = a, "", ""
        if name not in OPTIONS:
            return None
        dest, kind = OPTIONS[name]
        if kind is bool:
            if eq:
                return None
            got[dest] = True
            continue
        if not eq:
            if i >= len(args):
                return None
            value = args[i]
            i += 1
        if value.startswith("-"):
            return None
        try:
            got[dest] = kind(value)
        except ValueError:
            return None
    for dest, var in ENVVARS.items():
        if dest not in got and environ.get(var):
            got[dest] = environ[var]
    return got if all(r in got for r in REQUIRED) else None


def fast(args: list[str]) -> bool:
    """Run `broker quote` ``args`` without typer; False (nothing done) when typer must read them.
    What the CLI does before any command (``BROKER_TLS_CA`` and ``BROKER_TOKEN`` checked) is typer's too."""
    kwargs = parse(args)
    if kwargs is None or os.environ.get("BROKER_TLS_CA") or os.environ.get("BROKER_TOKEN"):
        return False
    try:
        run(**kwargs)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except OSError as e:  # a closed pipe (| head): exit 1 without a traceback, as typer does
        if e.errno != errno.EPIPE:
            raise
        from typer._click.utils import PacifyFlushWrapper

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        raise SystemExit(1) from None
    return True
