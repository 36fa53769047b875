"""`broker decisions`: what the autoscaler decided, and why (including "did not burst, because …")."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import (app, check_format, console, exit_error, exit_usage, print_json,
                            server_option_default)


@app.command(help="List the autoscaler's decisions, newest first: every burst, scale-in and "
                  "\"did not burst, because …\", with the jobs and leases involved.\n\n"
                  "  broker decisions --limit 20\n\n  broker decisions --format json")
def decisions(
    limit: int = typer.Option(50, "--limit", help="How many (newest first)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help="Broker address host:port (env BROKER_SERVER)."),
) -> None:
    import grpc

    from broker import convert
    from broker.v1 import broker_pb2 as pb
    from broker.v1 import broker_pb2_grpc as pb_grpc
    from broker.views import iso

    check_format(fmt)
    if limit <= 0:
        exit_usage(f"--limit must be at least 1, got {limit}.")
    target = server or server_option_default()
    try:
        from broker.client import open_channel

        with open_channel(target) as ch:
            resp = pb_grpc.BrokerStub(ch).ListDecisions(pb.ListDecisionsRequest(limit=limit), timeout=30)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAVAILABLE:
            exit_error(f"no broker answering at {target} (start one with `broker serve`).")
        exit_error(e.details() or e.code().name)
    rows = [{"decision_id": d.decision_id, "at": iso(convert.from_ts(d.at)), "action": d.action,
             "reason": d.reason, "job_ids": list(d.job_ids), "lease_id": d.lease_id} for d in resp.decisions]
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
