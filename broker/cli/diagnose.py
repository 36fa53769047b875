"""`broker diagnose`: why does the queue wait — resource-bound or scheduling-bound?"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from broker.cli.app import app, check_format, exit_error, exit_usage, print_json
from broker.times import iso

if TYPE_CHECKING:  # heavy-ish imports stay inside the command
    from policies.diagnose import Diagnosis
    from policies.queue import QueueSnapshot



def _read(path: Path, what: str) -> str:
    from providers.files import read_text

    try:
        return read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        exit_usage(f"cannot read the {what} file {path}: {reason}.")


def _resolve_bin(value: str, option: str) -> str:
    import os
    import shutil

    if os.sep in value:
        if not (os.path.isfile(value) and os.access(value, os.X_OK)):
            exit_usage(f"{value} (given with {option}) is not an executable file.")
        return value
    found = shutil.which(value)
    if found is None:
        exit_usage(f"cannot find {value} on PATH; install the Slurm client commands or pass "
                   f"{option} PATH.")
    return found


def _read_history(path: Path) -> list[tuple[float, float]]:
    """CSV ``time,allocation_rate`` (epoch seconds; rate 0..1 or a percentage like 85%)."""
    out = []
    for lineno, line in enumerate(_read(path, "history").splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        parts = [p.strip() for p in s.split(",")]
        try:
            if len(parts) != 2:
                raise ValueError("expected two values: time,allocation_rate")
            t = float(parts[0])
            r = float(parts[1][:-1]) / 100 if parts[1].endswith("%") else float(parts[1])
            if not 0 <= r <= 1:
                raise ValueError(f"allocation rate {parts[1]} is outside 0..1")
        except ValueError as exc:
            if lineno == 1 and not parts[0].replace(".", "", 1).isdigit():
                continue  # a header line
            exit_usage(f"{path} line {lineno}: {str(exc).rstrip('.')}.")
        out.append((t, r))
    return out


def _gpu_samples(specs: list[str]) -> list:
    import os

    from broker.watchers import ParseError
    from broker.watchers.nvidia_smi import parse_nvidia_smi_csv

    samples = []
    for spec in specs:
        node, path = "", spec
        if "=" in spec and not os.path.exists(spec):
            node, path = spec.split("=", 1)
        text = _read(Path(path), "nvidia-smi")
        try:
            samples.extend(parse_nvidia_smi_csv(text, node=node))
        except ParseError as exc:
            exit_usage(f"{exc.with_source(path)}.")
    return samples


def _snapshot(*, squeue: Optional[Path], sinfo: Optional[Path], snapshot: Optional[Path],
              squeue_bin: str, sinfo_bin: str, scontrol_bin: str, source: str,
              now: float) -> "QueueSnapshot":
    from broker.watchers import ParseError

    if snapshot is not None:
        from broker.watchers.snapshot_json import loads

        text = _read(snapshot, "snapshot")
        try:
            return loads(text)
        except ParseError as exc:
            exit_usage(f"{exc.with_source(str(snapshot))}.")
    from broker.slurm.commands import SlurmCommandError
    from broker.slurm.parse import parse_sinfo, parse_squeue
    from broker.slurm.watcher import SlurmWatcher
    from policies.queue import QueueSnapshot

    if squeue is not None and sinfo is not None:
        qtext, ntext = _read(squeue, "squeue"), _read(sinfo, "sinfo")
        try:
            pending, running, extra = parse_squeue(qtext, now)
        except ParseError as exc:
            exit_usage(f"{exc.with_source(str(squeue))}.")
        try:
            nodes = parse_sinfo(ntext)
        except ParseError as exc:
            exit_usage(f"{exc.with_source(str(sinfo))}.")
        return QueueSnapshot(source=source or f"file:{squeue.name}", taken_at=now,
                             pending=tuple(pending), running=tuple(running), nodes=tuple(nodes),
                             extra=extra)
    watcher = SlurmWatcher(squeue=_resolve_bin(squeue_bin, "--squeue-bin"),
                           sinfo=_resolve_bin(sinfo_bin, "--sinfo-bin"),
                           scontrol=_resolve_bin(scontrol_bin, "--scontrol-bin"),
                           source=source or "slurm")
    try:
        return watcher.snapshot(now)
    except SlurmCommandError as exc:
        exit_error(f"{exc}.")
    except ParseError as exc:
        exit_error(f"cannot read Slurm's output: {exc}.")


def _short(items: tuple[str, ...] | list[str], limit: int = 8) -> str:
    items = list(items)
    if len(items) <= limit:
        return ", ".join(items)
    return ", ".join(items[:limit]) + f", … (+{len(items) - limit})"


def _print_table(diag: "Diagnosis", snap: "QueueSnapshot") -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    colour = {"healthy": "green", "resource-bound": "yellow", "scheduling-bound": "cyan",
              "mixed": "magenta"}[diag.verdict]
    console.print(f"[bold]Verdict:[/bold] [bold {colour}]{diag.verdict}[/bold {colour}]"
                  f"  ({snap.source})")
    util = "unknown (no GPU samples)" if diag.utilization is None else f"{diag.utilization:.0f} %"
    console.print(f"Allocation rate: {diag.allocation_rate:.1%} "
                  f"({diag.gpus_allocated} of {diag.gpus_total} on-prem GPUs, "
                  f"{diag.gpus_free} free)")
    console.print(f"Utilisation of allocated GPUs: {util}")
    console.print(f"Pending: {diag.pending_gpus} GPUs in {diag.pending_jobs} jobs")
    for s in diag.signals:
        console.print(f"  - {s}")
    if diag.causes:
        table = Table(title="Causes", show_lines=True, expand=True)
        table.add_column("cause", no_wrap=True)
        table.add_column("what", ratio=3)
        table.add_column("jobs", ratio=1)
        table.add_column("nodes", ratio=1)
        for c in diag.causes:
            table.add_row(c.kind, c.summary, _short(c.jobs), _short(c.nodes))
        console.print(table)
    if diag.actions:
        console.print("[bold]Actions[/bold]")
        for i, a in enumerate(diag.actions, 1):
            console.print(f"  {i}. {a}")


@app.command("diagnose")
def diagnose_command(
    squeue: Optional[Path] = typer.Option(
        None, "--squeue", help="squeue output file: `squeue --json` or the watcher's text format "
        "(broker.slurm.records.SQUEUE_FORMAT); needs --sinfo."),
    sinfo: Optional[Path] = typer.Option(
        None, "--sinfo", help="sinfo output file: `sinfo --json` or `sinfo -N` in the watcher's "
        "text format (SINFO_FORMAT); needs --squeue."),
    nvidia_smi: list[str] = typer.Option(
        [], "--nvidia-smi", help="[NODE=]FILE with `nvidia-smi --query-gpu=index,"
        "utilization.gpu,memory.used --format=csv` output (or a capture holding it); repeatable."),
    snapshot: Optional[Path] = typer.Option(
        None, "--snapshot", help="A QueueSnapshot JSON file instead of Slurm."),
    history: Optional[Path] = typer.Option(
        None, "--history", help="CSV of time,allocation_rate samples to judge persistence."),
    squeue_bin: str = typer.Option("squeue", "--squeue-bin", help="squeue command for live Slurm."),
    sinfo_bin: str = typer.Option("sinfo", "--sinfo-bin", help="sinfo command for live Slurm."),
    scontrol_bin: str = typer.Option("scontrol", "--scontrol-bin",
                                     help="scontrol command for live Slurm."),
    source: str = typer.Option("", "--source", help="Name of the queue, e.g. slurm:cluster-a."),
    now: Optional[float] = typer.Option(
        None, "--now", help="Epoch seconds to measure waits against (default: the clock)."),
    output: str = typer.Option("table", "--format", "-o", help="table or json."),
    save_snapshot: Optional[Path] = typer.Option(
        None, "--save-snapshot", help="Also write the snapshot that was diagnosed (JSON)."),
) -> None:
    """Diagnose a queue: resource-bound, scheduling-bound, mixed or healthy, with causes and
    actions. Reads live Slurm by default, or files (--squeue/--sinfo, --snapshot)."""
    import dataclasses
    import math
    import time

    from broker.fields import TS_MAX

    check_format(output)
    if snapshot is not None and (squeue is not None or sinfo is not None):
        exit_usage("--snapshot cannot be combined with --squeue/--sinfo.")
    if (squeue is None) != (sinfo is None):
        exit_usage("--squeue and --sinfo go together: give both files.")
    if now is not None and not (math.isfinite(now) and 0 <= now <= TS_MAX):
        exit_usage(f"--now must be epoch seconds from 0 to {TS_MAX:,} (the year 9999), got {now:g}.")
    when = time.time() if now is None else now
    hist = _read_history(history) if history is not None else []
    samples = _gpu_samples(nvidia_smi)
    snap = _snapshot(squeue=squeue, sinfo=sinfo, snapshot=snapshot, squeue_bin=squeue_bin,
                     sinfo_bin=sinfo_bin, scontrol_bin=scontrol_bin, source=source, now=when)
    if samples:
        snap = dataclasses.replace(snap, gpu_samples=snap.gpu_samples + tuple(samples))
    if save_snapshot is not None:
        from broker.watchers.snapshot_json import save_snapshot as save

        try:
            save(snap, save_snapshot)
        except OSError as exc:
            exit_usage(f"cannot write {save_snapshot}: {exc.strerror or exc}.")

    from policies.diagnose import diagnose

    try:
        diag = diagnose(snap, hist, now=when if snapshot is None or now is not None
                        else snap.taken_at)
    except ValueError as exc:
        exit_usage(f"{str(exc).rstrip('.')}.")
    if output == "json":
        doc = {"source": snap.source, "taken_at": iso(snap.taken_at), **diag.to_dict()}
        if snap.extra.get("warnings"):
            doc["warnings"] = list(snap.extra["warnings"])
        print_json(doc)
    else:
        for w in snap.extra.get("warnings") or []:
            typer.echo(f"broker: warning: {w}", err=True)
        _print_table(diag, snap)
