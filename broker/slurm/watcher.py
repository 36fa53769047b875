"""The in-server half of the Slurm hand-off: the watcher that reads the queue through Slurm's
commands, and the burst target that lets the autoscaler's chosen jobs onto the burst partition.

Two halves, one configuration section (``[slurm]``):

* **In `broker serve`** (the autoscaler, :func:`slurm_source`): a :class:`SlurmSourceWatcher`
  reads the queue (``squeue``/``sinfo``); when the autoscaler decides to burst job X, the
  :class:`SlurmBurstTarget` runs ``scontrol update jobid=X partition=<its partitions>,<burst>``.
  Slurm may now place X on a CLOUD node of the burst partition, and powers that node up. A job
"""
from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import structlog

from broker.slurm.commands import CommandRunner, Scontrol, SlurmCommandError, SlurmHandoffError, default_bin
from broker.slurm.parse import (parse_sinfo_json, parse_sinfo_text,
                                parse_squeue_jobs_json, parse_squeue_text_jobs)
from broker.slurm.records import SINFO_FORMAT, SQUEUE_FORMAT, SQUEUE_STATES, SlurmJob, jobs_to_queue
from broker.slurm.settings import SlurmSettings, settings_from_config
from broker.watchers import ParseError
from broker.watchers.base import UnknownNodes
from policies.queue import QueueSnapshot

log = structlog.get_logger("broker.slurm")

_NO_JSON = re.compile(r"json|serializ|data_parser|openapi|unrecognized option|invalid option|"
                      r"unknown option", re.I)


@dataclass
class SlurmWatcher:
    """Reads a live Slurm through its commands and returns QueueSnapshots.

    ``squeue``/``sinfo``/``scontrol`` are command paths (default: found on PATH, else
    /usr/bin); ``env`` the environment for them (None: this process's, e.g. to pass
    ``SLURM_CONF``). JSON output is preferred; when a command refuses ``--json`` (no JSON plugin),
    the watcher falls back to the fixed text formats and remembers that per command.
    """

    squeue: str = field(default_factory=lambda: default_bin("squeue"))
    sinfo: str = field(default_factory=lambda: default_bin("sinfo"))
    scontrol: str = field(default_factory=lambda: default_bin("scontrol"))
    source: str = "slurm"
    env: Mapping[str, str] | None = None
    timeout: float = 30.0
    prefer_json: bool = True
    _json_ok: dict[str, bool] = field(default_factory=dict, init=False, repr=False)

    @property
    def runner(self) -> CommandRunner:
        return CommandRunner(self.env, self.timeout)

    def _query(self, cmd: str, json_args: list[str], text_args: list[str]) -> tuple[str, str]:
        """Run a command, JSON first; returns (format, output)."""
        runner = self.runner
        if self.prefer_json and self._json_ok.get(cmd, True):
            argv = [cmd, *json_args]
            r = runner.call(argv)
            if r.returncode == 0 and r.stdout.lstrip().startswith("{"):
                self._json_ok[cmd] = True
                return "json", r.stdout
            if r.returncode != 0 and not _NO_JSON.search((r.stderr or r.stdout).strip()):
                raise runner.failed(argv, r)
            self._json_ok[cmd] = False
        return "text", runner.run([cmd, *text_args])

    def squeue_output(self) -> tuple[str, str]:
        return self._query(self.squeue, ["--json"],
                           ["--noheader", f"--states={SQUEUE_STATES}", f"--Format={SQUEUE_FORMAT}"])

    def sinfo_output(self) -> tuple[str, str]:
        return self._query(self.sinfo, ["--json"],
                           ["--noheader", "--Node", f"--Format={SINFO_FORMAT}"])

    def snapshot(self, now: float | None = None) -> QueueSnapshot:
        now = time.time() if now is None else now
        qfmt, qout = self.squeue_output()
        nfmt, nout = self.sinfo_output()
        try:
            jobs = parse_squeue_jobs_json(qout) if qfmt == "json" else parse_squeue_text_jobs(qout)
        except ParseError as exc:
            raise exc.with_source(f"{self.squeue} output") from None
        try:
            nodes = parse_sinfo_json(nout) if nfmt == "json" else parse_sinfo_text(nout)
        except ParseError as exc:
            raise exc.with_source(f"{self.sinfo} output") from None
        pending, running, extra = jobs_to_queue(jobs, now)
        extra["formats"] = {"squeue": qfmt, "sinfo": nfmt}
        return QueueSnapshot(source=self.source, taken_at=now, pending=tuple(pending),
                             nodes=tuple(nodes), running=tuple(running), extra=extra)

    def job(self, job_id: str) -> SlurmJob | None:
        """One job's details through ``scontrol show job -o`` (None when Slurm does not know it)."""
        try:
            return Scontrol(self.scontrol, runner=self.runner).job(job_id)
        except ParseError as exc:
            raise exc.with_source(f"{self.scontrol} output") from None


@dataclass
class SlurmSourceWatcher(SlurmWatcher):
    """The Slurm watcher of the autoscaler. Pending jobs already allowed onto the burst partition
    wait for Slurm's cloud nodes, not for the broker, and jobs of no on-prem partition (when
    ``onprem_partitions`` are named) may not burst: both are left out of the pending queue."""

    burst_partition: str = "burst"
    onprem_partitions: tuple[str, ...] = ()

    def wants(self, partitions: str) -> bool:
        parts = set((partitions or "").split(","))
        if self.burst_partition in parts:
            return False
        return not self.onprem_partitions or bool(parts & set(self.onprem_partitions))

    def snapshot(self, now: float | None = None) -> QueueSnapshot:
        snap = super().snapshot(now)
        pending = tuple(j for j in snap.pending if self.wants(j.queue))
        if len(pending) == len(snap.pending):
            return snap
        return dataclasses.replace(snap, pending=pending)


class SlurmBurstTarget:
    """The autoscaler's BurstTarget for Slurm: add the burst partition to chosen pending jobs."""

    def __init__(self, settings: SlurmSettings, scontrol: Scontrol | None = None) -> None:
        self.settings = settings
        self.scontrol = scontrol or Scontrol(settings.scontrol, settings.env, settings.command_timeout_s)

    @property
    def offload_partition(self) -> str:
        return self.settings.offload_partition

    def offload(self, job_ids: list[str]) -> list[str]:
        """``scontrol update jobid=X partition=<offload_partition>`` for each job still pending;
        returns the ids moved. Raises :class:`SlurmHandoffError` naming every job that could not
        be moved (the others are)."""
        part = self.settings.offload_partition
        moved: list[str] = []
        errors: list[tuple[str, str]] = []
        for jid in job_ids:
            try:
                job = self.scontrol.job(jid)
                if job is None or not job.is_pending:
                    continue
                if job.partition.split(",") != [part]:
                    self.scontrol.set_partitions(jid, [part])
                    log.info("offloaded", job=jid, partition=part)
                moved.append(jid)
            except (SlurmCommandError, ValueError) as e:
                errors.append((jid, str(e)))
        if errors:
            raise SlurmHandoffError.of(errors)
        return moved

    def allow_burst(self, job_ids: list[str]) -> None:
        """``scontrol update jobid=X partition=<its partitions>,<burst>`` for each pending job.

        Idempotent: a job that already has the burst partition is left alone; one that is no
        longer pending is skipped. Raises :class:`SlurmHandoffError` naming every job that
        could not be handed over (the others are done).
        """
        s = self.settings
        errors: list[tuple[str, str]] = []
        for jid in job_ids:
            try:
                job = self.scontrol.job(jid)
                if job is None:
                    raise SlurmHandoffError("Slurm does not know it")
                if not job.is_pending:
                    log.info("burst_skipped", job=jid, state=job.state, why="no longer pending")
                    continue
                parts = [p for p in job.partition.split(",") if p]
                if s.burst_partition in parts:
                    continue
                if s.onprem_partitions and not set(parts) & set(s.onprem_partitions):
                    raise SlurmHandoffError(f"its partition {','.join(parts)} is not an on-prem partition "
                                            f"({','.join(s.onprem_partitions)})")
                self.scontrol.set_partitions(jid, parts + [s.burst_partition])
                log.info("burst_allowed", job=jid, partitions=parts + [s.burst_partition])
            except (SlurmHandoffError, SlurmCommandError, ValueError) as e:
                errors.append((jid, str(e)))
        if errors:
            raise SlurmHandoffError.of(errors)


@dataclass
class SlurmScheduler(SlurmSourceWatcher):
    """Slurm behind the scheduler interface (:mod:`broker.watchers.base`): the autoscaler's
    watcher, with Slurm's capabilities — the burst hand-off (the burst partition), the offload
    (``offload_partition``) and the drain of a cloud node's Slurm node on an interruption notice."""

    settings: SlurmSettings = field(default_factory=SlurmSettings)
    _target: SlurmBurstTarget | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_settings(cls, s: SlurmSettings) -> "SlurmScheduler":
        return cls(squeue=s.squeue, sinfo=s.sinfo, scontrol=s.scontrol, source=s.source, env=s.env,
                   timeout=s.command_timeout_s, burst_partition=s.burst_partition,
                   onprem_partitions=s.onprem_partitions, settings=s)

    @property
    def target(self) -> SlurmBurstTarget:
        if self._target is None:
            self._target = SlurmBurstTarget(self.settings, Scontrol(self.scontrol, self.env, self.timeout))
        return self._target

    @property
    def offload_queue(self) -> str:
        return self.settings.offload_partition

    def allow_burst(self, job_ids: list[str]) -> None:
        self.target.allow_burst(job_ids)

    def offload(self, job_ids: list[str]) -> list[str]:
        return self.target.offload(job_ids)

    def drain_and_requeue(self, nodes: Sequence[str], reason: str) -> list[str]:
        """``scontrol update nodename=… state=drain``, then ``scontrol requeue`` of the jobs
        running on them (Slurm resumes other cloud nodes for those). UnknownNodes when Slurm
        knows none of ``nodes``."""
        sc = self.target.scontrol
        try:
            sc.drain(nodes, reason)
        except SlurmCommandError as e:
            if _UNKNOWN_NODE.search(e.stderr):
                raise UnknownNodes(f"{self.source} has no node {', '.join(nodes)}") from None
            raise
        jobs = sc.running_on(nodes)
        sc.requeue(jobs)
        return jobs


_UNKNOWN_NODE = re.compile(r"invalid node name|node .* not found|unable to find node", re.I)


def slurm_source(cfg: SlurmSettings | Mapping[str, Any]) -> SlurmScheduler:
    """The Slurm scheduler for a ``[slurm]`` table (typed or raw)."""
    return SlurmScheduler.from_settings(settings_from_config(cfg))
