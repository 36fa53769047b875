"""`broker sandbox`: the project's mocked clouds and a broker configured against them."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Optional

import typer

from broker.cli.app import DEFAULT_SERVER, app, exit_error, exit_usage

HELP = """Try the broker with no cloud account: start the mocked AWS, GCP, Azure and
Lambda Cloud (the ones the test suite runs against; real API calls over loopback HTTP) and a
`broker serve` configured against them, then print the commands to use.

Everything listens on 127.0.0.1; state lives in its own directory (default
$BROKER_HOME/sandbox, i.e. ~/.local/state/broker/sandbox), emptied at each start:
the clouds keep their instances in memory. Ctrl-C stops it all. Needs the
sandbox extra: pip install -e '.[sandbox]'.

\b
Examples:
  broker sandbox
  broker sandbox --listen 127.0.0.1:50061 --home /tmp/broker-sandbox
"""


@app.command(help=HELP)
def sandbox(
    listen: str = typer.Option(DEFAULT_SERVER, "--listen", help="host:port of the sandbox's broker (loopback)."),
    home_dir: Optional[str] = typer.Option(None, "--home", help="State directory (default $BROKER_HOME/sandbox)."),
) -> None:
    from broker.config import default_state_dir, is_loopback_host, split_host_port

    try:
        host, _ = split_host_port(listen)
    except ValueError as e:
        exit_usage(f"--listen {e}.")
    if not is_loopback_host(host):
        exit_usage(f"--listen must be a loopback address: the sandbox serves this machine only, got {listen!r}.")
    try:
        from broker_sandbox.run import Sandbox, SandboxError
    except ImportError as e:
        exit_usage(f"the sandbox needs its extra ({e.name} is missing): pip install -e '.[sandbox]'.")
    from broker.cli.serve import _check_free
    from broker.errors import ConfigError

    try:
        _check_free(listen)
    except ConfigError as e:
        exit_usage(f"{e} (choose another with --listen).")
    if home_dir is not None and not home_dir.strip():
        exit_usage("--home is empty; give the sandbox's state directory, or leave it out.")
    home = Path(home_dir) if home_dir else default_state_dir() / "sandbox"
    box = Sandbox(home, listen)
    sys.stderr.write("broker: starting the mocked clouds and a broker against them...\n")
    try:
        box.start()
    except SandboxError as e:
        exit_error(f"sandbox: {e}")
    except OSError as e:
        box.stop()
        exit_usage(f"sandbox: cannot use {home}: {e.strerror or e}.")
    signal.signal(signal.SIGTERM, _interrupt)  # stops like Ctrl-C: the finally below ends it all
    print(_instructions(listen, home), flush=True)
    try:
        code = box.wait()
    except KeyboardInterrupt:
        code = 0
    finally:
        box.stop()
    if code not in (0, -signal.SIGTERM):
        exit_error(f"sandbox: broker serve exited {code}: {box.last_log_line()}")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _instructions(listen: str, home: Path) -> str:
    return f"""Sandbox ready: mocked AWS, GCP, Azure and Lambda Cloud on 127.0.0.1, a broker on {listen}.
State and the broker's log: {home}. Ctrl-C stops it all.

In another terminal:
  export BROKER_SERVER={listen}
  broker quote --server $BROKER_SERVER --gpu H100:8 --hours 2   # note the quote id
  broker launch --quote-id QUOTE_ID --offer 1                     # note the lease id
  broker handoff LEASE_ID --job-id train-1
  broker watch --lease LEASE_ID --after 0                         # Ctrl-C to stop watching
  broker release LEASE_ID"""
