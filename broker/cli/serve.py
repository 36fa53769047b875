"""`broker serve`: the gRPC API, the reconciler and the autoscaler (in one process, or in
``--processes N`` sharing the port: :mod:`broker.processes`).

Start-up failures (configuration, the store, the listen address) exit 2 with one sentence and no
traceback, so a supervisor that restarts on failure (systemd ``RestartPreventExitStatus=2``)
does not loop on a typo; only a crash after start-up exits 1.
"""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import app, exit_usage

HELP = """Serve the Broker gRPC API (with health and reflection) on 127.0.0.1:50051.

Runs the reconciler (and the autoscaler when [autoscaler] is enabled) in the
background. State lives in SQLite (WAL) under ~/.local/state/broker/ by default,
or in the database named by --db / [store] url (PostgreSQL for several replicas).
Configuration comes from --config (TOML) and BROKER_<SECTION>__<KEY> environment
variables (e.g. BROKER_RECONCILER__INTERVAL_S=10); an unknown key or variable is
refused. Start-up errors exit 2; SIGTERM stops it gracefully.

--processes N (or [server] processes) runs N serving processes on the one port
(SO_REUSEPORT), one core each; the first also runs the reconciler, the autoscaler,
the market refresh and /metrics (the sum over all of them). SIGTERM stops them all;
if one dies, the others are stopped and serve exits 1 for its service manager to
restart it.

\b
Examples:
  broker serve
  broker serve --processes 2 --listen 127.0.0.1:50051
  broker serve --config /etc/broker/broker.toml --db postgresql+psycopg://broker@127.0.0.1/broker
"""


@app.command(help=HELP)
def serve(
    listen: Optional[str] = typer.Option(None, "--listen", help="host:port to listen on (default 127.0.0.1:50051)."),
    config: Optional[str] = typer.Option(None, "--config", help="TOML configuration file.", envvar="BROKER_CONFIG"),
    db: Optional[str] = typer.Option(None, "--db", help="SQLAlchemy URL of the store."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    processes: Optional[str] = typer.Option(
        None, "--processes", metavar="N",
        help="Serving processes sharing the port, 1 to 64 (default [server] processes, 1)."),
    process: Optional[int] = typer.Option(None, "--process", hidden=True),
    ready_fd: Optional[int] = typer.Option(None, "--ready-fd", hidden=True),
) -> None:
    from broker import config as cfgmod
    from broker.errors import BrokerError
    from broker.telemetry import bridge_native_stderr, configure

    if log_level not in ("debug", "info", "warning", "error"):
        exit_usage(f"--log-level must be debug, info, warning or error, got {log_level!r}.")
    n = _processes(processes)
    configure(log_level)
    if process is not None:  # one of the serving processes the parent below started
        from broker.processes import die_with_parent

        die_with_parent()
    try:
        cfg = cfgmod.load(config, overrides={"server.listen": listen, "store.url": db, "server.processes": n})
        if process is None:
            _check_free(cfg.listen)
    except BrokerError as e:
        exit_usage(str(e))
    if process is None and cfg.server.processes > 1:
        import sys

        from broker.processes import supervise

        argv = [sys.executable, "-m", "broker", "serve", "--processes", str(cfg.server.processes),
                "--log-level", log_level]
        for flag, value in (("--listen", listen), ("--config", config), ("--db", db)):
            if value is not None:
                argv += [flag, value]
        raise typer.Exit(supervise(argv, cfg.server.processes))
    # This process serves: what gRPC's C core writes to fd 2 becomes JSON records too (the log's
    # handler moves to the original stream; a supervising parent above keeps its plain stderr).
    bridge_native_stderr()
    configure(log_level)
    from broker.serving import serve as run

    try:  # listens first (health NOT_SERVING), then builds the service: both are start-up
        run(cfg, cfg.listen, lambda: _service(cfg), process=process or 0, ready_fd=ready_fd, settle_heap=True)
    except BrokerError as e:
        exit_usage(str(e))
    except (OSError, RuntimeError) as e:  # binding the API port
        exit_usage(f"cannot serve on {cfg.listen}: {_reason(e)}")


def _processes(value: Optional[str]) -> Optional[int]:
    """``--processes``: a whole number from 1 to MAX_PROCESSES, or exit 2 saying so."""
    if value is None:
        return None
    from broker.config import MAX_PROCESSES

    text = value.strip()
    n = int(text) if text.isdigit() and len(text) <= 6 else None
    if n is None or not 1 <= n <= MAX_PROCESSES:
        exit_usage(f"--processes must be a whole number from 1 to {MAX_PROCESSES}, got {value[:32]!r}.")
    return n


def _service(cfg):
    """The wired Service (store opened, providers and autoscaler built), or a BrokerError."""
    from broker.errors import ConfigError, Unavailable
    from broker.service import Service

    from providers.capex import CapexError
    from providers.catalog import CatalogError

    where = cfg.db_url.split("@")[-1]
    try:
        service = Service(cfg)
    except (CatalogError, CapexError) as e:
        raise ConfigError(f"config: catalog.path {cfg.catalog.path or '(the bundled catalog)'}: {e}") from None
    except OSError as e:
        raise ConfigError(f"cannot open the store at {where}: {_reason(e)}") from None
    except Exception as e:  # the database driver's own errors: unreachable, refused, bad URL
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

        if isinstance(e, (ArgumentError, NoSuchModuleError)):
            raise ConfigError(f"config: store.url {where!r} is not a usable database URL: {_reason(e)}") from None
        if isinstance(e, SQLAlchemyError):
            raise Unavailable(f"cannot open the store at {where}: {_reason(e)}") from None
        raise
    return service


def _check_free(listen: str) -> None:
    """Refuse a listen address this host cannot bind (in use, not ours) before anything starts."""
    import errno
    import socket

    from broker.config import split_host_port
    from broker.errors import ConfigError

    host, port = split_host_port(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"cannot serve on {listen}: {host} does not resolve ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover is no conflict
        try:
            s.bind(addr)
        except OSError as e:
            why = "the port is already in use" if e.errno == errno.EADDRINUSE else _reason(e)
            raise ConfigError(f"cannot serve on {listen}: {why}") from None


def _reason(e: BaseException) -> str:
    """The first line of an exception's own text, without the driver's boilerplate."""
    orig = getattr(e, "orig", None) or e
    text = getattr(orig, "strerror", None) or str(orig) or type(orig).__name__
    filename = getattr(orig, "filename", None)
    return text.strip().splitlines()[0].rstrip(".") + (f" ({filename})" if filename else "")
