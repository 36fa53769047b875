"""`broker catalog refresh | show`: the live market (prices, zones, quotas, reservations)."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import app, check_format, exit_error, exit_usage, print_json

catalog_app = typer.Typer(
    name="catalog", no_args_is_help=True, rich_markup_mode=None,
    help="The prices, zones, quotas and reservations quotes use: the clouds' own APIs over the "
         "bundled catalog.")
app.add_typer(catalog_app)

REFRESH_HELP = """Ask the enabled clouds' APIs for prices, zones, quotas, reservations and spot
signals now, and store them (dated) for every replica. Each source (price list, spot history,
placement scores, quotas, reservations, zones) refreshes on its own: one that is denied, missing,
failing or unreadable keeps its last good data and gets one warning line; the others are fresh
(exit 0). A provider none of whose sources answered keeps all its last good data (exit 1). A
price under 5 % or over 300 % of the list price is refused with a warning.

\b
Examples:
  broker catalog refresh
  broker catalog refresh --provider aws --format json
"""

SHOW_HELP = """List what a quote would use: each offering's price with its source and date,
stale marks, zones and the quota left; then each provider's last refresh.

\b
Examples:
  broker catalog show --gpu H100
  broker catalog show --provider gcp --format json
"""


def _load(config: Optional[str]):
    from broker.config import ConfigError, load
    from broker.errors import BrokerError

    try:
        return load(config)
    except (ConfigError, BrokerError, ValueError) as e:
        exit_usage(str(e))


def _store_failed(url: str, e: BaseException) -> None:
    """Exit with one sentence, as `broker db` and `broker tokens` do: a database that does not
    answer (refused, or not within ``[store] connect_timeout_s``) is exit 7, one that cannot be
    used exit 2."""
    from broker.cli.db import _reason, _unreachable
    from broker.errors import Unavailable, outcome
    from broker.migrate import where

    sentence = f"cannot open the store at {where(url)}: {_reason(e)}."
    if _unreachable(e):
        exit_error(sentence, outcome(Unavailable("")).exit_code)
    exit_usage(sentence)


def _open_store(cfg):
    """The store (its schema brought up to date), or exit (see :func:`_store_failed`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from broker.errors import BrokerError
    from broker.store import Store

    try:
        return Store(cfg.db_url, connect_timeout_s=cfg.store.connect_timeout_s)
    except BrokerError as e:  # the store's schema is newer than this broker
        exit_usage(str(e))
    except (SQLAlchemyError, OSError) as e:
        _store_failed(cfg.db_url, e)


def _reader(cfg):
    """What `catalog show` reads the market from (None: an embedded store not made yet), once the
    database has answered within ``[store] connect_timeout_s``; or exit (see :func:`_store_failed`)."""
    from sqlalchemy.exc import SQLAlchemyError

    from broker import market_store

    db = market_store.reader(cfg.db_url, cfg.store.connect_timeout_s)
    if db is not None and hasattr(db, "connect"):  # a server: reads below take its silence for "never refreshed"
        try:
            with db.connect():
                pass
        except SQLAlchemyError as e:
            db.dispose()
            _store_failed(cfg.db_url, e)
    return db


@catalog_app.command("refresh", help=REFRESH_HELP)
def refresh_cmd(
    provider: Optional[str] = typer.Option(None, "--provider", help="Only this cloud, e.g. aws (a wrong name lists them)."),
    config: Optional[str] = typer.Option(None, "--config", help="Config file (default $BROKER_CONFIG)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    from broker import market
    from broker.errors import BrokerError

    check_format(fmt)
    cfg = _load(config)
    from providers import registry  # here, not at the top: `broker --help` reads no cloud's settings

    if provider is not None and provider not in registry.names():
        exit_usage(f"--provider must be {registry.choices()}, got {provider!r}.")
    if provider is None and not market.enabled_providers(cfg):
        exit_usage("no provider is enabled in the config: nothing to refresh.")
    store = _open_store(cfg)
    try:
        outcomes = market.refresh(cfg, store.engine, [provider] if provider else None)
        _, warnings = market.live_catalog(cfg, store.engine)
    except BrokerError as e:
        exit_usage(str(e))
    finally:
        store.close()
    if fmt == "json":
        print_json({"providers": [vars(o) for o in outcomes], "warnings": warnings})
    else:
        for o in outcomes:
            print(o.headline())
        for o in outcomes:
            for w in o.warnings():
                print(f"warning: {w}")
        for w in warnings:
            print(f"warning: {w}")
    if not all(o.ok for o in outcomes):
        raise typer.Exit(1)


@catalog_app.command("show", help=SHOW_HELP)
def show_cmd(
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Only this GPU model (H100, A100, ...)."),
    provider: Optional[str] = typer.Option(None, "--provider", help="Only this provider."),
    config: Optional[str] = typer.Option(None, "--config", help="Config file (default $BROKER_CONFIG)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
) -> None:
    import time

    from broker import market, market_store
    from broker.views import iso, market_fields

    check_format(fmt)
    cfg = _load(config)
    from providers import registry  # here, not at the top: `broker --help` reads no cloud's settings

    if provider is not None and provider not in registry.names():
        exit_usage(f"--provider must be {registry.choices()}, got {provider!r}.")
    db = _reader(cfg)
    now = time.time()
    try:
        catalog, warnings = market.live_catalog(cfg, db, now)
    except ValueError as e:
        exit_usage(str(e))
    if gpu and gpu.upper() not in catalog.by_gpu:
        exit_usage(f"--gpu {gpu} is not in the catalog; known: {', '.join(catalog.gpu_models)}.")
    rows = []
    for o in catalog.offerings:
        if (gpu and o.instance.gpu.upper() != gpu.upper()) or (provider and o.provider != provider):
            continue
        rows.append({"provider": o.provider, "region": o.region, "instance_type": o.instance.name,
                     "gpu": o.instance.gpu, "gpus_per_node": o.instance.gpus, "market": o.market.value,
                     "hourly_usd": o.hourly_micros / 1e6, "reservation": o.reservation,
                     "free_nodes": o.reserved_nodes if o.reservation else None,
                     "quota_left": o.quota_left if o.quota_left >= 0 else None,
                     "quota": o.quota_label or None, **market_fields(o)})
    stored = market_store.load(db) if db is not None else {}
    refreshes = [{"provider": p, "fetched_at": iso(r.snapshot.fetched_at) if r.snapshot.fetched_at else None,
                  "attempted_at": iso(r.attempted_at), "last_error": r.last_error,
                  "sources": {k: {"ok_at": iso(v.ok_at) if v.ok_at else None, "error": v.error}
                              for k, v in sorted(r.sources().items())}}
                 for p, r in sorted(stored.items()) if not provider or p == provider]
    if fmt == "json":
        print_json({"offerings": rows, "refreshes": refreshes, "warnings": warnings})
        return
    _table(rows, refreshes, warnings)


def _table(rows: list[dict], refreshes: list[dict], warnings: list[str]) -> None:
    from broker.cli.app import console as make_console, fitted_table

    console = make_console()
    columns = [(c, "right" if c in ("$/h", "quota left") else "left")
               for c in ("provider", "region", "instance", "market", "$/h", "source", "as of", "zones", "quota left")]
    cells = []
    for r in rows:
        quota = "" if r["quota_left"] is None else f"{r['quota_left']:g} {r['quota']}"
        if r["reservation"]:
            quota = f"{r['free_nodes']} nodes free in {r['reservation']}"
        cells.append((r["provider"], r["region"], r["instance_type"], r["market"],
                      f"{r['hourly_usd']:.2f}" + ("*" if r["stale"] else ""), r["price_source"],
                      (r["price_as_of"] or "")[:10], " ".join(z.rsplit("-", 1)[-1] for z in r["zones"]), quota))
    # On a narrow terminal the details go first (--format json has them all); what is sold where
    # and at what price always shows in full.
    console.print("what a quote uses (* stale)", highlight=False, markup=False)
    console.print(fitted_table(console, columns, cells, drop_first=("zones", "source", "as of", "quota left"),
                               fold=("zones", "quota left")))
    for r in refreshes:
        failing = {k: v for k, v in r["sources"].items() if v["error"]}
        state = f"last error: {r['last_error']}" if r["last_error"] and not failing else "ok"
        if failing:
            state = f"{len(failing)} of {len(r['sources'])} sources failing"
        console.print(f"{r['provider']}: data of {r['fetched_at'] or 'never'}, last tried {r['attempted_at']}, {state}",
                      highlight=False, markup=False)
        for name, v in failing.items():
            console.print(f"warning: {r['provider']} {name} failing (its data is of {v['ok_at'] or 'never'}): "
                          f"{v['error']}", highlight=False, markup=False)
    for w in warnings:
        console.print(f"warning: {w}", highlight=False, markup=False)
    if not refreshes:
        console.print("no live market stored yet: the bundled catalog (broker catalog refresh)", markup=False)


__all__ = ["catalog_app", "exit_error"]
