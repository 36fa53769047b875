"""`broker decisions`: what the autoscaler decided, and why (including "did not burst, because …")."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import (app, check_format, console, exit_refused, exit_usage, print_json,
                            server_option_default)


@app.command(help="List the autoscaler's decisions, newest first: every burst, scale-in and "
                  "\"did not burst, because …\", with the jobs and leases involved.\n\n"
                  "  broker decisions --limit 20\n\n  broker decisions --format json")
def decisions(
    limit: int = typer.Option(50, "--limit", help="How many (newest first)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help="Broker address host:port (env BROKER_SERVER)."),
) -> None:
    from broker.client import BrokerClient, ClientError
    from broker.paging import MAX_PAGE

    check_format(fmt)
    if not 1 <= limit <= MAX_PAGE:
        exit_usage(f"--limit must be from 1 to {MAX_PAGE:,}, got {limit}.")
    try:
        with BrokerClient(server or server_option_default()) as c:
            rows = c.decisions(limit)
    except ClientError as e:
        exit_refused(e)
    if fmt == "json":
        print_json(rows)
        return
    from rich.table import Table

    t = Table()
    for col in ("at", "action", "jobs", "lease", "reason"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["at"] or "", r["action"], ",".join(r["job_ids"][:6]), r["lease_id"], r["reason"])
    console().print(t)
