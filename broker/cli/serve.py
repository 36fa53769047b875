"""`broker serve`: the gRPC API, the reconciler and the autoscaler in one process."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import app, exit_usage

HELP = """Serve the Broker gRPC API (with health and reflection) on 127.0.0.1:50051.

Runs the reconciler (and the autoscaler when [autoscaler] is enabled) in the
background. State lives in SQLite (WAL) under ~/.local/state/broker/ by default,
or in the database named by --db / [store] url (PostgreSQL for several replicas).
Configuration comes from --config (TOML) and BROKER_<SECTION>__<KEY> environment
variables (e.g. BROKER_RECONCILER__INTERVAL_S=10). SIGTERM stops it gracefully.

\b
Examples:
  broker serve
  broker serve --config /etc/broker/broker.toml --db postgresql+psycopg://broker@127.0.0.1/broker
"""


@app.command(help=HELP)
def serve(
    listen: Optional[str] = typer.Option(None, "--listen", help="host:port to listen on (default 127.0.0.1:50051)."),
    config: Optional[str] = typer.Option(None, "--config", help="TOML configuration file.", envvar="BROKER_CONFIG"),
    db: Optional[str] = typer.Option(None, "--db", help="SQLAlchemy URL of the store."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
) -> None:
    from broker import config as cfgmod
    from broker.telemetry import configure

    configure(log_level)
    try:
        cfg = cfgmod.load(config, overrides={"server.listen": listen, "store.url": db})
    except cfgmod.ConfigError as e:
        exit_usage(str(e))
    from broker.server import serve as run
    from broker.service import Service
    from providers.base import ConfigError as ProviderConfigError

    try:
        service = Service(cfg)
    except (cfgmod.ConfigError, ProviderConfigError) as e:
        exit_usage(str(e))
    from broker.autoscaler import attach

    try:
        attach(service)
    except (cfgmod.ConfigError, ProviderConfigError) as e:
        service.stop()
        exit_usage(str(e))
    try:
        run(service, cfg.listen)
    except OSError as e:
        exit_usage(f"cannot serve on {cfg.listen}: {e}")
