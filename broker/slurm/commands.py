"""Running Slurm's commands: ONE runner for the watcher (``squeue``/``sinfo``/``scontrol show``)
and the hand-off (``scontrol update``), and :class:`Scontrol`, the calls the hand-off makes.

Every call has a timeout and stdin from /dev/null; a command that cannot be started, times out
or exits non-zero raises :class:`SlurmCommandError` naming the command and its last error line.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Mapping, Sequence

import hostlist

from broker.slurm.parse import parse_scontrol_job
from broker.slurm.records import SlurmJob
from broker.watchers.base import HandoffError, SchedulerError


class SlurmHandoffError(HandoffError):
    """The hand-off could not be done; the message says what and why."""


class SlurmCommandError(SchedulerError):
    """A Slurm command could not be run or failed; the message names the command and its error."""

    def __init__(self, argv: Sequence[str], message: str, returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"`{' '.join(self.argv)}` {message}")


def last_line(text: str) -> str:
    """The most specific line of a Slurm error (its last ``fatal``/``error`` line)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def default_bin(name: str) -> str:
    """A Slurm command found on PATH, else its usual place in /usr/bin."""
    return shutil.which(name) or f"/usr/bin/{name}"


class CommandRunner:
    """Runs Slurm commands with one environment (None: this process's) and one timeout."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
        self.env = dict(env) if env is not None else None
        self.timeout = timeout

    def call(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` and return what it did, whatever its exit status."""
        argv = list(argv)
        if not os.path.isabs(argv[0]) and shutil.which(argv[0]) is None:
            raise SlurmCommandError(argv, "failed: command not found")
        try:
            return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                                  timeout=self.timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmCommandError(argv, "failed: command not found") from None
        except PermissionError:
            raise SlurmCommandError(argv, "failed: permission denied") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(argv, f"timed out after {self.timeout:.0f} s") from None

    @staticmethod
    def failed(argv: Sequence[str], r: subprocess.CompletedProcess[str]) -> SlurmCommandError:
        """The error for a command that exited non-zero."""
        err = (r.stderr or r.stdout).strip()
        return SlurmCommandError(argv, f"exited {r.returncode}: {last_line(err)}", r.returncode, err)

    def run(self, argv: Sequence[str]) -> str:
        """Run ``argv`` and return its output; a non-zero exit raises."""
        r = self.call(argv)
        if r.returncode != 0:
            raise self.failed(argv, r)
        return r.stdout


class Scontrol:
    """``scontrol`` by its absolute path, through a :class:`CommandRunner`."""

    def __init__(self, path: str, env: Mapping[str, str] | None = None, timeout: float = 30.0,
                 runner: CommandRunner | None = None) -> None:
        self.path = path
        self.runner = runner or CommandRunner(env, timeout)

    def run(self, *args: str) -> str:
        return self.runner.run([self.path, *args])

    def job(self, job_id: str) -> SlurmJob | None:
        """One job's details through ``scontrol show job -o`` (None when Slurm does not know it)."""
        try:
            out = self.run("show", "job", "-o", str(job_id))
        except SlurmCommandError as e:
            if "Invalid job id" in e.stderr:
                return None
            raise
        jobs = parse_scontrol_job(out)
        return jobs[0] if jobs else None

    def set_partitions(self, job_id: str, partitions: Sequence[str]) -> None:
        self.run("update", f"jobid={job_id}", f"partition={','.join(partitions)}")

    def set_node_addr(self, node: str, addr: str, hostname: str) -> None:
        self.run("update", f"nodename={node}", f"nodeaddr={addr}", f"nodehostname={hostname}")

    def mark_down(self, nodes: Sequence[str], reason: str) -> None:
        self.run("update", f"nodename={hostlist.collect_hostlist(list(nodes))}", "state=down",
                 f"reason={reason}")

    def drain(self, nodes: Sequence[str], reason: str) -> None:
        """No new jobs on ``nodes`` (the running ones go on until they end or are requeued)."""
        self.run("update", f"nodename={hostlist.collect_hostlist(list(nodes))}", "state=drain",
                 f"reason={reason}")

    def running_on(self, nodes: Sequence[str]) -> list[str]:
        """The ids of the jobs running (or starting) on any of ``nodes``."""
        names = set(nodes)
        return [j.job_id for j in parse_scontrol_job(self.run("show", "job", "-o"))
                if j.state in ("RUNNING", "CONFIGURING") and names & set(j.nodes)]

    def requeue(self, job_ids: Sequence[str]) -> None:
        """Requeue running jobs: each goes back to pending (to restart from its checkpoint)."""
        if job_ids:
            self.run("requeue", ",".join(job_ids))

    def node_states(self, nodes: Sequence[str]) -> dict[str, set[str]]:
        """{node: {base state and flags}} from ``scontrol show node -o`` (unknown nodes left out)."""
        try:
            out = self.run("show", "node", "-o", hostlist.collect_hostlist(list(nodes)))
        except SlurmCommandError as e:
            if "not found" in e.stderr.lower() or "invalid node name" in e.stderr.lower():
                return {}
            raise
        states: dict[str, set[str]] = {}
        for line in out.splitlines():
            m = re.search(r"(?:^|\s)NodeName=(\S+)", line)
            s = re.search(r"(?:^|\s)State=(\S+)", line)
            if m and s:
                states[m.group(1)] = {p.upper() for p in s.group(1).split("+")}
        return states
