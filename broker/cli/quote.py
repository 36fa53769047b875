"""`broker quote`: price a GPU demand across every cloud, region and market."""
from __future__ import annotations

from typing import Optional

import typer

from broker.cli.app import app
from broker.quote_command import HELP, run


@app.command(help=HELP)
def quote(
    gpu: str = typer.Option(..., "--gpu", help="MODEL:COUNT, total GPUs (H100:8, A100:16, any:4 with --gpu-memory)."),
    hours: float = typer.Option(..., "--hours", help="Expected runtime in hours on that GPU (A100-hours with any:N)."),
    data_in_gb: float = typer.Option(0.0, "--data-in-gb", help="Dataset moved in, GB."),
    data_out_gb: float = typer.Option(0.0, "--data-out-gb", help="Results moved back out, GB."),
    data_location: str = typer.Option("onprem", "--data-location", help="Where the dataset lives: onprem or PROVIDER:REGION."),
    nodes: int = typer.Option(0, "--nodes", help="Node count (default: fewest nodes that hold the GPUs)."),
    gpu_memory: int = typer.Option(0, "--gpu-memory", help="Minimum memory per GPU, GB."),
    interruptible: bool = typer.Option(False, "--interruptible", help="The job checkpoints: spot capacity is allowed."),
    checkpoint_minutes: int = typer.Option(0, "--checkpoint-minutes", help="Minutes between checkpoints (default 60)."),
    providers: Optional[str] = typer.Option(None, "--providers", help="Comma list of clouds, e.g. aws,gcp (default: every one; a wrong name lists them)."),
    regions: Optional[str] = typer.Option(None, "--regions", help="Comma list of allowed regions."),
    residency: Optional[str] = typer.Option(None, "--residency", help="Data residency: us, eu, asia or region names."),
    min_sla: float = typer.Option(0.0, "--min-sla", help="Minimum published SLA, percent (spot has none)."),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="Finish by: ISO time or hours from now (36h)."),
    top: int = typer.Option(10, "--top", help="Offers to show (0 = all)."),
    fmt: str = typer.Option("table", "--format", "-o", help="table or json."),
    server: Optional[str] = typer.Option(None, "--server", help="Ask a running broker (host:port) instead of quoting in-process."),
    config: Optional[str] = typer.Option(None, "--config", help="TOML config (reservations, enabled providers).", envvar="BROKER_CONFIG"),
) -> None:
    run(gpu=gpu, hours=hours, data_in_gb=data_in_gb, data_out_gb=data_out_gb, data_location=data_location,
        nodes=nodes, gpu_memory=gpu_memory, interruptible=interruptible, checkpoint_minutes=checkpoint_minutes,
        providers=providers, regions=regions, residency=residency, min_sla=min_sla, deadline=deadline, top=top,
        fmt=fmt, server=server, config=config)
