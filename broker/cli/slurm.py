"""`broker slurm resume | suspend | resume-fail | allow-burst`: Slurm's power-saving programs.

slurmctld runs them (through deploy/slurm/*.sh) with one host-list argument, no PATH, and its
output discarded: everything goes to a JSON log file instead (--log, [slurm] log,
$BROKER_HOME/slurm.log, else /var/log/broker/slurm.log).
"""
from __future__ import annotations

import json
import os
import signal
import sys
from typing import NoReturn, Optional

import typer

from broker.cli.app import DEFAULT_SERVER, app, exit_error, exit_refused, exit_usage

slurm_app = typer.Typer(
    name="slurm",
    help=("Slurm power saving through the broker: ResumeProgram, SuspendProgram and ResumeFailProgram "
          "for CLOUD nodes (see deploy/slurm/README.md)."),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.add_typer(slurm_app, name="slurm")

CONFIG_HELP = "TOML configuration file with the [slurm] section (env BROKER_CONFIG)."
SERVER_HELP = "Broker address host:port (default: $BROKER_SERVER, else [slurm] server, else 127.0.0.1:50051)."
LOG_HELP = "JSON log file (default: [slurm] log, else $BROKER_HOME/slurm.log, else /var/log/broker/slurm.log)."


def _setup(config: Optional[str], log_file: Optional[str], command: str, hostlist_arg: str):
    """Unblock signals (slurmctld's mask is inherited), load [slurm], open the log."""
    import structlog

    from broker import config as cfgmod
    from broker.slurm_node.programs import configure_file_logging
    from broker.slurm.settings import SlurmSettings

    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    except (AttributeError, OSError):
        pass
    problem = ""
    try:
        settings = cfgmod.load(config).slurm
    except cfgmod.ConfigError as e:
        settings, problem = SlurmSettings(), str(e)
    where = configure_file_logging(log_file or settings.log_path())
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(command=command, hostlist=hostlist_arg, pid=os.getpid())
    lg = structlog.get_logger("broker.slurm")
    if problem:
        lg.error("config_error", error=problem, config=config or os.environ.get("BROKER_CONFIG", ""))
        exit_usage(problem)
    lg.info("start", config=config or "", log=where, argv=sys.argv[1:])
    return settings, lg


def _client(server: Optional[str], settings):
    from broker.client import BrokerClient

    target = server or os.environ.get("BROKER_SERVER") or settings.server or DEFAULT_SERVER
    return BrokerClient(target, timeout=settings.rpc_timeout_s)


def _crashed(lg, program: str, e: Exception) -> NoReturn:
    """Never die without a log line (slurmctld shows nothing of what a program prints), nor
    without one sentence for a person at a terminal: a broker's refusal with its exit code (a
    bad --server is 2, no broker answering 7), anything else 1."""
    from broker.client import ClientError

    lg.exception(f"{program.replace('-', '_')}_crashed", error=str(e))
    if isinstance(e, ClientError):
        exit_refused(e)
    exit_error(f"slurm {program} failed: {str(e).rstrip('.')} (its log has the rest).", 1)


def _finish(lg, outcome, code: int | None = None) -> None:
    summary = {k: v for k, v in vars(outcome).items() if v}
    code = outcome.exit_code if code is None else code
    lg.info("done", exit_code=code, **summary)
    print(json.dumps({"exit_code": code, **summary}), flush=True)
    if code:
        raise typer.Exit(code)


RESUME_HELP = """ResumeProgram: launch cloud capacity for these Slurm nodes.

Reads $SLURM_RESUME_FILE at once (the jobs being started on the nodes), groups
the nodes by job (one gang lease per job), quotes each group from its node
shape ([slurm.shapes.<prefix>]) on the broker server, launches offer 1 with the
Slurm node names, and sets each node's address (scontrol update nodename=N
nodeaddr=IP) unless [slurm] set_node_addr = false. A group that cannot be
launched has its nodes set DOWN with reason "broker: ..." so Slurm requeues the
job. Re-running the same resume launches nothing new.

  broker slurm resume 'burst-[1-2]' --config /etc/broker/broker.toml

Exit codes: 0 done, 1 some nodes failed (set DOWN), 2 bad input or configuration.
"""


@slurm_app.command("resume", help=RESUME_HELP)
def resume_cmd(
    nodes: str = typer.Argument(..., help="Slurm host list, e.g. burst-[1-3]."),
    resume_file: Optional[str] = typer.Option(None, "--resume-file", envvar="SLURM_RESUME_FILE",
                                              help="Slurm's resume file (env SLURM_RESUME_FILE)."),
    config: Optional[str] = typer.Option(None, "--config", envvar="BROKER_CONFIG", help=CONFIG_HELP),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
    log_file: Optional[str] = typer.Option(None, "--log", help=LOG_HELP),
) -> None:
    # The resume file is a memfd of slurmctld's: read it before anything else.
    raw, read_error = None, ""
    if resume_file:
        from providers.files import SMALL_BYTES, read_bytes

        try:
            raw = read_bytes(resume_file, SMALL_BYTES)
        except OSError as e:
            read_error = f"cannot read the resume file {resume_file}: {e.strerror or e}"
    settings, lg = _setup(config, log_file, "resume", nodes)
    from broker.slurm.commands import Scontrol
    from broker.slurm_node.groups import ResumeFileError, expand, parse_resume_file
    from broker.slurm_node.programs import Outcome, node_reason, resume

    try:
        expand(nodes)
    except ValueError as e:
        lg.error("bad_hostlist", error=str(e))
        exit_usage(str(e))
    request = None
    try:
        if read_error:
            raise ResumeFileError(read_error)
        if raw is not None:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ResumeFileError(f"the resume file {resume_file} is not UTF-8 text") from None
            request = parse_resume_file(text, f"resume file {resume_file}")
            lg.info("resume_file", jobs=[{"job_id": j, "nodes": list(n)} for j, n in request.jobs])
    except ResumeFileError as e:
        lg.error("resume_file_error", error=str(e))
        try:
            Scontrol(settings.scontrol, settings.env, settings.command_timeout_s).mark_down(
                expand(nodes), node_reason(str(e)))
            lg.info("nodes_down", nodes=nodes)
        except Exception as e2:
            lg.error("mark_down_failed", error=str(e2))
        _finish(lg, Outcome(failed=[{"nodes": nodes, "error": str(e)}]), 2)
        return
    try:
        with _client(server, settings) as client:
            outcome = resume(nodes, settings, client, request=request)
    except Exception as e:
        _crashed(lg, "resume", e)
    _finish(lg, outcome)


@slurm_app.command("suspend", help="SuspendProgram: release the live leases whose instances carry these "
                                   "nodes (a gang lease waits until all its nodes are suspended).\n\n"
                                   "  broker slurm suspend 'burst-[1-2]' --config /etc/broker/broker.toml")
def suspend_cmd(
    nodes: str = typer.Argument(..., help="Slurm host list."),
    config: Optional[str] = typer.Option(None, "--config", envvar="BROKER_CONFIG", help=CONFIG_HELP),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
    log_file: Optional[str] = typer.Option(None, "--log", help=LOG_HELP),
) -> None:
    _release_nodes("suspend", nodes, config, server, log_file)


@slurm_app.command("resume-fail", help="ResumeFailProgram: these nodes did not come up within "
                                       "ResumeTimeout; release their leases and log it.\n\n"
                                       "  broker slurm resume-fail burst-3 --config /etc/broker/broker.toml")
def resume_fail_cmd(
    nodes: str = typer.Argument(..., help="Slurm host list."),
    config: Optional[str] = typer.Option(None, "--config", envvar="BROKER_CONFIG", help=CONFIG_HELP),
    server: Optional[str] = typer.Option(None, "--server", help=SERVER_HELP),
    log_file: Optional[str] = typer.Option(None, "--log", help=LOG_HELP),
) -> None:
    _release_nodes("resume-fail", nodes, config, server, log_file)


def _release_nodes(program: str, nodes: str, config: Optional[str], server: Optional[str],
                   log_file: Optional[str]) -> None:
    """suspend / resume-fail: release the leases of these nodes, logging everything."""
    settings, lg = _setup(config, log_file, program, nodes)
    from broker.slurm_node import programs
    from broker.slurm_node.groups import expand

    try:
        expand(nodes)
    except ValueError as e:
        lg.error("bad_hostlist", error=str(e))
        exit_usage(str(e))
    action = programs.suspend if program == "suspend" else programs.resume_fail
    try:
        with _client(server, settings) as client:
            outcome = action(nodes, settings, client)
    except Exception as e:
        _crashed(lg, program, e)
    _finish(lg, outcome)


@slurm_app.command("allow-burst", help="Do by hand what the autoscaler does when it bursts a job: add the "
                                       "burst partition to pending jobs (scontrol update jobid=X "
                                       "partition=<its>,<burst>).\n\n  broker slurm allow-burst 4211 4212")
def allow_burst_cmd(
    job_ids: list[str] = typer.Argument(..., help="Pending Slurm job ids."),
    config: Optional[str] = typer.Option(None, "--config", envvar="BROKER_CONFIG", help=CONFIG_HELP),
    log_file: Optional[str] = typer.Option(None, "--log", help=LOG_HELP),
) -> None:
    settings, lg = _setup(config, log_file, "allow-burst", ",".join(job_ids))
    from broker.slurm.commands import SlurmHandoffError
    from broker.slurm.watcher import SlurmBurstTarget

    try:
        SlurmBurstTarget(settings).allow_burst(job_ids)
    except SlurmHandoffError as e:
        lg.error("allow_burst_failed", error=str(e))
        sys.stderr.write(f"broker: {e}\n")
        raise typer.Exit(1) from None
    lg.info("done", jobs=job_ids, partition=settings.burst_partition)
