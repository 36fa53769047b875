"""`broker launch | release | leases | lease | handoff | watch`: leases on a running broker."""
from __future__ import annotations

import json
import uuid
from typing import Optional

import typer

from broker.cli.app import (app, check_format, console, exit_refused, exit_usage, print_json,
                            server_option_default)
from broker.fields import TEN_YEARS_S
from broker.lease import LeaseState
from broker.cli.app import fitted_table

SERVER_HELP = "Broker address host:port (env BROKER_SERVER, default 127.0.0.1:50051)."


def _client(server: Optional[str]):
    from broker.client import BrokerClient

    return BrokerClient(server or server_option_default())


def _fail(e) -> None:
    exit_refused(e)


def _print_leases(leases: list[dict], fmt: str) -> None:
    if fmt == "json":
        print_json(leases)
        return
    right = ("nodes", "$/h", "cost so far")
    columns = [(c, "right" if c in right else "left") for c in
               ("lease", "state", "provider", "region", "zone", "instance", "market", "nodes", "$/h",
                "cost so far", "job")]
    rows = [(l["lease_id"], l["state"], l["provider"], l["region"], l["zone"], l["instance_type"], l["market"],
             str(l["nodes"]), f"{l['hourly_usd']:.2f}", f"{l['cost_so_far_usd']:.2f}",
             (l.get("job") or {}).get("job_id", "")) for l in leases]
    # On a narrow terminal the details go first; the lease id (to paste into `broker release`),
    # its state and its cost so far always show in full.
    t = fitted_table(console(), columns, rows,
                     drop_first=("zone", "job", "market", "nodes", "region", "$/h", "instance", "provider"))
    console().print(t)
    for l in leases:
        if l["state"] in (LeaseState.FAILED, LeaseState.DRAINING) and l["state_reason"]:
            console().print(f"{l['lease_id']}: {l['state_reason']}")


def _dump(obj, fmt: str) -> None:
    if fmt == "json":
        print_json(obj)
    else:
        _print_leases([obj], "table")
        for i in obj["instances"]:
            print(f"  {i['node_name'] or '-':28} {i['instance_id']:36} {i['zone']:16} {i['private_ip'] or '-':15} {i['state']}")


LAUNCH_HELP = """Launch GPU capacity as a lease.

\b
Either take offer N of a stored quote (from `broker quote --server ...`):
  broker launch --quote-id q-mx6-1f2e --offer 1
or name the capacity explicitly:
  broker launch --provider gcp --region us-central1 --instance-type a3-highgpu-8g --market spot --count 2

The lease is persisted before any cloud call; a retry with the same
--idempotency-key returns the same lease and launches nothing new. On capacity
or quota errors a quoted launch fails over to the next offers of the quote,
across clouds. Exit codes: 2 bad input, 3 over budget, 4 no such quote,
7 the launch failed in every cloud tried (or no broker answering: the
message says which).
"""


@app.command(help=LAUNCH_HELP)
def launch(
    quote_id: Optional[str] = typer.Option(None, "--quote-id", help="Stored quote to launch from."),
    offer: int = typer.Option(1, "--offer", min=1, max=100_000, help="Rank of the quote's offer to launch."),
    provider: Optional[str] = typer.Option(None, "--provider", help="The cloud, by its registered name (explicit launch)."),
    region: Optional[str] = typer.Option(None, "--region"),
    zone: str = typer.Option("", "--zone", help="Zone (default: the region's first)."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type"),
    market: str = typer.Option("on_demand", "--market", help="on_demand, spot or reserved."),
    count: int = typer.Option(1, "--count", min=1, max=1_000_000, help="Nodes."),
    idempotency_key: Optional[str] = typer.Option(None, "--idempotency-key", help="Client key (default: random)."),
    tenant: str = typer.Option("", "--tenant", help="Tenant charged (default: default)."),
    bootstrap: str = typer.Option("", "--bootstrap", help="Boot template: slurm, kubernetes, container or a configured name."),
    job_id: str = typer.Option("", "--job-id", help="Job to hand off right away."),
    max_lifetime: int = typer.Option(0, "--max-lifetime-s", min=0, max=TEN_YEARS_S, help="Release after this many seconds (0 = configured default)."),
    max_restarts: Optional[int] = typer.Option(None, "--max-restarts", min=0, max=1000, help="Requeues of the job after a loss before it is failed (default [lifecycle] max_restarts)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    from broker.client import ClientError
    from broker.convert import MARKET_TO_PB
    from broker.v1 import broker_pb2 as pb

    check_format(fmt)
    req = pb.LaunchRequest(idempotency_key=idempotency_key or f"cli-{uuid.uuid4()}", tenant=tenant,
                           bootstrap=bootstrap, max_lifetime_s=max_lifetime)
    if job_id:
        req.job.job_id = job_id
    if max_restarts is not None:  # its range: the option's own (0 to 1000)
        req.max_restarts = max_restarts
    if quote_id:
        if provider or region or instance_type:
            exit_usage("give either --quote-id or --provider/--region/--instance-type, not both.")
        req.quote_offer.quote_id, req.quote_offer.rank = quote_id, offer
    else:
        missing = [n for n, v in (("--provider", provider), ("--region", region), ("--instance-type", instance_type)) if not v]
        if missing:
            exit_usage(f"an explicit launch needs {', '.join(missing)} (or use --quote-id).")
        if market not in MARKET_TO_PB:
            exit_usage(f"--market must be on_demand, spot or reserved, got {market!r}.")
        req.offering.provider, req.offering.region, req.offering.zone = provider, region, zone
        req.offering.instance_type, req.offering.market, req.offering.count = instance_type, MARKET_TO_PB[market], count
    try:
        with _client(server) as c:
            lease = c.launch(req)
    except ClientError as e:
        _fail(e)
    _dump(lease, fmt)


@app.command(help="Release a lease: terminate its instances and wait until they are gone.\n\n  broker release l-mx6-1a2b")
def release(
    lease_id: str = typer.Argument(..., help="Lease to release."),
    reason: str = typer.Option("", "--reason"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    check_format(fmt)
    from broker.client import ClientError

    try:
        with _client(server) as c:
            lease = c.release(lease_id, reason)
    except ClientError as e:
        _fail(e)
    _dump(lease, fmt)


@app.command(help="Show one lease with its instances.\n\n  broker lease l-mx6-1a2b --format json")
def lease(
    lease_id: str = typer.Argument(...),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    check_format(fmt)
    from broker.client import ClientError

    try:
        with _client(server) as c:
            out = c.get_lease(lease_id)
    except ClientError as e:
        _fail(e)
    _dump(out, fmt)


@app.command(help="List leases, newest first, with provider, market, nodes, state, $/h and cost so far.\n\n"
                  "  broker leases --state running --format json")
def leases(
    state: Optional[list[str]] = typer.Option(None, "--state", help="Only this state (repeatable)."),
    tenant: str = typer.Option("", "--tenant"),
    limit: int = typer.Option(100, "--limit", help="At most this many, newest first; 0 = every one (read in pages)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    from broker.client import ClientError
    from broker.convert import STATE_TO_PB

    if not 0 <= limit <= 10_000_000:
        exit_usage(f"--limit must be zero (every lease) or more, at most 10,000,000, got {limit}.")
    for s in state or []:
        if s not in STATE_TO_PB:
            exit_usage(f"--state must be one of {', '.join(STATE_TO_PB)}, got {s!r}.")
    check_format(fmt)
    try:
        with _client(server) as c:
            out = c.list_leases(state or [], tenant, limit)
    except ClientError as e:
        _fail(e)
    _print_leases(out, fmt)


@app.command(help="Attach a job to a running lease (the nodes it runs on are the lease's).\n\n"
                  "  broker handoff l-mx6-1a2b --job-id 4211 --checkpoint-uri s3://ckpt/4211")
def handoff(
    lease_id: str = typer.Argument(...),
    job_id: str = typer.Option(..., "--job-id"),
    owner: str = typer.Option("", "--owner"),
    queue: str = typer.Option("", "--queue"),
    checkpoint_uri: str = typer.Option("", "--checkpoint-uri"),
    dataset_uri: str = typer.Option("", "--dataset-uri"),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    check_format(fmt)
    from broker.client import ClientError

    job = {"job_id": job_id, "owner": owner, "queue": queue, "checkpoint_uri": checkpoint_uri,
           "dataset_uri": dataset_uri}
    try:
        with _client(server) as c:
            out = c.handoff(lease_id, job)
    except ClientError as e:
        _fail(e)
    _dump(out, fmt)


@app.command(help="Stream lease events (state changes, interruptions, requeues, budget actions, "
                  "autoscaler decisions) as JSON lines, in the same JSON dialect as --format json, until "
                  "interrupted. An unknown --lease is an error at once.\n\n  broker watch\n\n  broker watch --lease l-mx6-1a2b --after 0")
def watch(
    lease_id: str = typer.Option("", "--lease", help="Only this lease."),
    after: Optional[int] = typer.Option(None, "--after", min=0, max=2 ** 62, help="Replay the events after this event_id (0 = from the first), then follow; default: only new events."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    from broker.client import ClientError
    from broker.convert import event_from_pb

    try:
        with _client(server) as c:
            for ev in c.watch(lease_id, after):
                print(json.dumps(event_from_pb(ev)), flush=True)
    except ClientError as e:
        _fail(e)


REPORT_HELP = """Report what a lease's job did: running, a checkpoint, or its end.

\b
  broker report-job l-mx6-1a2b --job-id train-1 --state succeeded --exit-code 0
  broker report-job l-mx6-1a2b --job-id train-1 --state running \\
      --checkpoint-uri s3://ckpt/train-1/step-9000 --progress 0.45

A node reports with its lease's own callback credential (BROKER_TOKEN, as its
boot script has it in BROKER_CALLBACK_TOKEN), good for this lease's reports
only; a tenant or operator token works too. A lease whose job ended is
released within one reconciler pass; a job requeued after a loss resumes from
its last checkpoint, on a replacement quoted for the work left. Prints what
the node does next: continue, checkpoint (the lease ends soon) or stop.
Exit codes: 2 bad input, 4 no such lease, 5 not allowed, 6 the job already
ended otherwise, or the lease runs another job.
"""


@app.command("report-job", help=REPORT_HELP)
def report_job(
    lease_id: str = typer.Argument(..., help="The lease the job runs on."),
    job_id: str = typer.Option(..., "--job-id", help="The job (the lease's, or attached by this report)."),
    state: str = typer.Option(..., "--state", help="running, succeeded, failed or cancelled."),
    exit_code: Optional[int] = typer.Option(None, "--exit-code", min=-(2 ** 31), max=2 ** 31 - 1, help="The job's exit status."),
    checkpoint_uri: str = typer.Option("", "--checkpoint-uri", help="Where its latest checkpoint is."),
    progress: Optional[float] = typer.Option(None, "--progress", help="Fraction done at that checkpoint, 0 to 1."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
) -> None:
    import math

    from broker.client import ClientError
    from broker.convert import JOB_STATE_TO_PB
    from broker.v1 import broker_pb2 as pb

    check_format(fmt)
    state = state.strip().lower()
    if state not in JOB_STATE_TO_PB:
        exit_usage(f"--state must be running, succeeded, failed or cancelled, got {state[:32]!r}.")
    if not job_id.strip():
        exit_usage("--job-id must not be empty.")
    if progress is not None and not (math.isfinite(progress) and 0 <= progress <= 1):
        exit_usage(f"--progress must be a fraction from 0 to 1, got {progress}.")
    req = pb.ReportJobRequest(lease_id=lease_id, job_id=job_id, state=JOB_STATE_TO_PB[state],
                              checkpoint_uri=checkpoint_uri, exit_code=exit_code, progress=progress)
    try:
        with _client(server) as c:
            out, action = c.report_job(req)
    except ClientError as e:
        _fail(e)
    if fmt == "json":
        print_json({"lease": out, "action": action})
        return
    _print_leases([out], "table")
    print(f"job {job_id}: {state}; next: {action}")
