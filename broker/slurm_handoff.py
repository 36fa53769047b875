"""The Slurm hand-off: the broker decides WHICH jobs burst, Slurm's power saving runs the nodes.

Two halves, one configuration section (``[slurm]``):

* **In `broker serve`** (the autoscaler, :func:`slurm_source`): a :class:`SlurmSourceWatcher`
  reads the queue (``squeue``/``sinfo``); when the autoscaler decides to burst job X, the
  :class:`SlurmBurstTarget` runs ``scontrol update jobid=X partition=<its partitions>,<burst>``.
  Slurm may now place X on a CLOUD node of the burst partition, and powers that node up. A job
  the autoscaler holds (a scheduling-bound queue) is never given the burst partition.
* **In Slurm's power-saving programs** (``broker slurm resume|suspend|resume-fail HOSTLIST``,
  run by slurmctld through deploy/slurm/*.sh): :func:`resume` reads ``SLURM_RESUME_FILE``,
  groups the nodes by job (a multi-node job's nodes are one gang lease; a node in no job is a
  lease of its own), quotes each group from its node shape on the broker server, launches offer 1
  of the quote with the Slurm node names (the lease fails over across the quote's other offers
  by itself), and points Slurm at the instances (``scontrol update nodename=N nodeaddr=IP
  nodehostname=N``). When a group cannot be launched its nodes are set DOWN with the reason
  (``reason="broker: …"``), so Slurm requeues their jobs at once instead of waiting for
  ResumeTimeout. :func:`suspend` releases the live leases whose instances carry the suspended
  node names; :func:`resume_fail` releases them too. Everything is logged as structlog JSON to a
  file, because slurmctld discards the programs' output.

Idempotency: the lease of a group is launched under the key ``slurm-<hostlist>-<digest>``, the
digest taken over the resume file (or, without one, the host list and the 10-minute window), so a
re-run of the same resume returns the same lease and launches nothing. A node that already has
a live lease is never launched again. Only a key whose lease has ended (released or failed: the
node was suspended, or the launch failed) is followed by a new one (``…-<digest>.2``), because
then Slurm really asks for the node again.

Configuration (``[slurm]``; every key optional except the shapes a resume needs)::

    [slurm]
    enabled = true                    # the autoscaler watches this Slurm and bursts through it
    cluster = "prod"                  # source name "slurm:prod" in decisions and snapshots
    squeue = "/usr/bin/squeue"        # absolute paths: the programs run with no PATH
    sinfo = "/usr/bin/sinfo"
    scontrol = "/usr/bin/scontrol"
    slurm_conf = ""                   # SLURM_CONF for those commands ("" = inherited)
    burst_partition = "burst"         # the partition of the CLOUD nodes
    onprem_partitions = []            # partitions whose jobs may burst ([] = any but burst);
                                      # onprem_partition = "gpu" is the one-partition spelling
    server = "127.0.0.1:50051"        # broker for resume/suspend (--server, $BROKER_SERVER win)
    set_node_addr = true              # scontrol update nodename=N nodeaddr=IP after a launch;
                                      # false when cloud nodes resolve by name (DNS, cloud_dns)
    tenant = "default"                # tenant charged for the cloud nodes
    bootstrap = "slurm"               # boot template for the instances ("" = none); rendered
                                      # by the server only when it has a [bootstrap] section
    log = "/var/log/broker/slurm.log" # default: $BROKER_HOME/slurm.log, else this path
    command_timeout_s = 30            # for each squeue/sinfo/scontrol call
    rpc_timeout_s = 600               # for each Launch (a launch may fail over across clouds)

    [slurm.shapes.burst]              # nodes named burst-1, burst-2, … (prefix, "-", number)
    gpu = "L4"                        # GPU model of one node (or min_gpu_memory_gb)
    gpus = 1                          # GPUs per node: must equal the node's Gres count
    min_gpu_memory_gb = 0
    hours = 1.0                       # quoted hours when the job has no time limit
    providers = []                    # restrict the offers (e.g. ["gcp"]); [] = any enabled
    regions = []

A node's shape is the ``[slurm.shapes.<prefix>]`` whose prefix its name starts with, followed by
digits or ``-``/``_`` and digits (the longest prefix wins). A node of no shape is not the
broker's: resume leaves it alone (and says so in the log); exclude such nodes from power saving
with ``SuspendExcNodes``/``SuspendExcParts``.
"""
from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import math
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import hostlist
import structlog

from broker.watchers.slurm import (SlurmCommandError, SlurmJob, SlurmWatcher, _last_line,
                                   parse_job_hints, parse_scontrol_job)
from policies.demand import Demand
from policies.queue import QueueSnapshot

log = structlog.get_logger("broker.slurm")

LIVE = ("requested", "provisioning", "running")
ENDED = ("released", "failed", "draining")
DEFAULT_LOG = "/var/log/broker/slurm.log"
KEY_WINDOW_S = 600  # without a resume file, a re-run within this window is the same resume


class SlurmHandoffError(RuntimeError):
    """The hand-off could not be done; the message says what and why."""


class ResumeFileError(ValueError):
    """SLURM_RESUME_FILE cannot be read or does not hold what Slurm writes there."""


# ---------------------------------------------------------------------------------------------
# configuration
@dataclass(frozen=True)
class Shape:
    """What one cloud node of a name prefix is: GPU model and count, and quoting defaults."""

    prefix: str
    gpu: str = ""
    gpus: int = 1
    min_gpu_memory_gb: int = 0
    hours: float = 1.0
    providers: tuple[str, ...] = ()
    regions: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmSettings:
    enabled: bool = False
    cluster: str = "default"
    squeue: str = "/usr/bin/squeue"
    sinfo: str = "/usr/bin/sinfo"
    scontrol: str = "/usr/bin/scontrol"
    slurm_conf: str = ""
    burst_partition: str = "burst"
    onprem_partitions: tuple[str, ...] = ()
    server: str = ""
    set_node_addr: bool = True
    tenant: str = "default"
    bootstrap: str = "slurm"
    log: str = ""
    command_timeout_s: float = 30.0
    rpc_timeout_s: float = 600.0
    shapes: Mapping[str, Shape] = field(default_factory=dict)

    @property
    def source(self) -> str:
        return f"slurm:{self.cluster}"

    @property
    def env(self) -> dict[str, str] | None:
        """Environment for the Slurm commands: this process's, with SLURM_CONF when configured."""
        if not self.slurm_conf:
            return None
        return {**os.environ, "SLURM_CONF": self.slurm_conf}

    def shape_for(self, node: str) -> Shape | None:
        best = None
        for prefix, shape in self.shapes.items():
            if re.fullmatch(re.escape(prefix) + r"[-_]?\d+", node) and (
                    best is None or len(prefix) > len(best.prefix)):
                best = shape
        return best

    def log_path(self, environ: Mapping[str, str] | None = None) -> str:
        environ = os.environ if environ is None else environ
        if self.log:
            return self.log
        if environ.get("BROKER_HOME"):
            return str(Path(environ["BROKER_HOME"]) / "slurm.log")
        return DEFAULT_LOG


_KEYS = {f.name for f in dataclasses.fields(SlurmSettings)} | {"onprem_partition"}
_SHAPE_KEYS = {f.name for f in dataclasses.fields(Shape)} - {"prefix"}


def settings_from_config(section: Mapping[str, Any]) -> SlurmSettings:
    """``[slurm]`` → :class:`SlurmSettings`; a bad key raises ConfigError naming it."""
    from broker.config import ConfigError

    def bad(key: str, msg: str) -> ConfigError:
        return ConfigError(f"config: slurm.{key} {msg}")

    for k in section:
        if k not in _KEYS:
            raise bad(k, f"is not a known key ({', '.join(sorted(_KEYS))})")
    out: dict[str, Any] = {}
    for k in ("enabled", "set_node_addr"):
        if k in section:
            if not isinstance(section[k], bool):
                raise bad(k, f"must be true or false, got {section[k]!r}")
            out[k] = section[k]
    for k in ("cluster", "squeue", "sinfo", "scontrol", "slurm_conf", "burst_partition", "server",
              "tenant", "bootstrap", "log"):
        if k in section:
            if not isinstance(section[k], str):
                raise bad(k, f"must be a string, got {section[k]!r}")
            out[k] = section[k].strip()
    for k in ("squeue", "sinfo", "scontrol"):
        if k in out and not os.path.isabs(out[k]):
            raise bad(k, f"must be an absolute path (Slurm runs the programs with no PATH), got {out[k]!r}")
    if "burst_partition" in out and not re.fullmatch(r"[A-Za-z0-9_.-]+", out["burst_partition"]):
        raise bad("burst_partition", f"must be one partition name, got {out['burst_partition']!r}")
    if "cluster" in out and not out["cluster"]:
        raise bad("cluster", "must not be empty")
    parts: list[str] = []
    if "onprem_partition" in section:
        v = section["onprem_partition"]
        if not isinstance(v, str):
            raise bad("onprem_partition", f"must be a string, got {v!r}")
        parts.append(v)
    if "onprem_partitions" in section:
        v = section["onprem_partitions"]
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise bad("onprem_partitions", f"must be a list of partition names, got {v!r}")
        parts.extend(v)
    parts = [p.strip() for p in parts if p.strip()]
    if parts:
        burst = out.get("burst_partition", SlurmSettings.burst_partition)
        if burst in parts:
            raise bad("onprem_partitions", f"must not name the burst partition {burst!r}")
        out["onprem_partitions"] = tuple(dict.fromkeys(parts))
    for k in ("command_timeout_s", "rpc_timeout_s"):
        if k in section:
            v = section[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise bad(k, f"must be a positive number, got {v!r}")
            out[k] = float(v)
    shapes = section.get("shapes", {})
    if not isinstance(shapes, Mapping):
        raise bad("shapes", "must be a table of [slurm.shapes.<node name prefix>] tables")
    parsed: dict[str, Shape] = {}
    for prefix, s in shapes.items():
        where = f"shapes.{prefix}"
        if not isinstance(s, Mapping):
            raise bad(where, "must be a table (gpu, gpus, min_gpu_memory_gb, hours, providers, regions)")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", prefix):
            raise bad(where, "must be a node name prefix (letters, digits, - and _)")
        for k in s:
            if k not in _SHAPE_KEYS:
                raise bad(f"{where}.{k}", f"is not a known key ({', '.join(sorted(_SHAPE_KEYS))})")
        gpu = s.get("gpu", "")
        if not isinstance(gpu, str):
            raise bad(f"{where}.gpu", f"must be a GPU model name, got {gpu!r}")
        ints = {}
        for k, lo in (("gpus", 1), ("min_gpu_memory_gb", 0)):
            v = s.get(k, 1 if k == "gpus" else 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise bad(f"{where}.{k}", f"must be a whole number of at least {lo}, got {v!r}")
            ints[k] = v
        hours = s.get("hours", 1.0)
        if isinstance(hours, bool) or not isinstance(hours, (int, float)) or not (
                math.isfinite(hours) and hours > 0):
            raise bad(f"{where}.hours", f"must be a positive number, got {hours!r}")
        if not gpu.strip() and not ints["min_gpu_memory_gb"]:
            raise bad(where, "needs gpu (a model such as \"L4\") or min_gpu_memory_gb")
        lists = {}
        for k in ("providers", "regions"):
            v = s.get(k, [])
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
                raise bad(f"{where}.{k}", f"must be a list of names, got {v!r}")
            lists[k] = tuple(x.strip() for x in v if x.strip())
        parsed[prefix] = Shape(prefix, gpu.strip().upper(), ints["gpus"], ints["min_gpu_memory_gb"],
                               float(hours), lists["providers"], lists["regions"])
    out["shapes"] = parsed
    return SlurmSettings(**out)


# ---------------------------------------------------------------------------------------------
# scontrol
class Scontrol:
    """``scontrol`` by its absolute path; every call has a timeout and stdin from /dev/null."""

    def __init__(self, path: str, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
        self.path = path
        self.env = dict(env) if env is not None else None
        self.timeout = timeout

    def run(self, *args: str) -> str:
        argv = [self.path, *args]
        try:
            r = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                               timeout=self.timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmCommandError(argv, "failed: command not found") from None
        except PermissionError:
            raise SlurmCommandError(argv, "failed: permission denied") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(argv, f"timed out after {self.timeout:.0f} s") from None
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            raise SlurmCommandError(argv, f"exited {r.returncode}: {_last_line(err)}", r.returncode, err)
        return r.stdout

    def job(self, job_id: str) -> SlurmJob | None:
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


def _reason(text: str) -> str:
    """A node reason: one line, printable, short enough for Slurm."""
    one = " ".join(str(text).split())
    return f"broker: {one}"[:240]


# ---------------------------------------------------------------------------------------------
# the autoscaler side
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

    def allow_burst(self, job_ids: list[str]) -> None:
        """``scontrol update jobid=X partition=<its partitions>,<burst>`` for each pending job.

        Idempotent: a job that already has the burst partition is left alone; one that is no
        longer pending is skipped. Raises :class:`SlurmHandoffError` naming every job that
        could not be handed over (the others are done).
        """
        s = self.settings
        errors = []
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
                errors.append(f"job {jid}: {e}")
        if errors:
            raise SlurmHandoffError("; ".join(errors))


def slurm_source(cfg: Mapping[str, Any]) -> tuple[str, SlurmSourceWatcher, SlurmBurstTarget]:
    """(source name, watcher, burst target) for ``[slurm] enabled = true`` (broker.autoscaler)."""
    s = settings_from_config(cfg)
    watcher = SlurmSourceWatcher(squeue=s.squeue, sinfo=s.sinfo, scontrol=s.scontrol, source=s.source,
                                 env=s.env, timeout=s.command_timeout_s, burst_partition=s.burst_partition,
                                 onprem_partitions=s.onprem_partitions)
    return s.source, watcher, SlurmBurstTarget(s)


# ---------------------------------------------------------------------------------------------
# the resume file and grouping
@dataclass(frozen=True)
class ResumeRequest:
    jobs: tuple[tuple[str, tuple[str, ...]], ...]  # (job id, its nodes being resumed)
    all_nodes: tuple[str, ...]
    raw: str = ""


def expand(text: str, what: str = "node list") -> list[str]:
    try:
        nodes = hostlist.expand_hostlist(text.strip())
    except hostlist.BadHostlist as e:
        raise ValueError(f"cannot read the {what} {text!r}: {e}") from None
    if not nodes or not all(nodes):
        raise ValueError(f"the {what} {text!r} names no node")
    return nodes


def parse_resume_file(text: str, where: str = "resume file") -> ResumeRequest:
    """Slurm's ``{"jobs":[{"job_id":11,"nodes":"burst-[1-2]"},…],"all_nodes":"burst-[1-3]"}``."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResumeFileError(f"{where} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, dict):
        raise ResumeFileError(f"{where} must hold a JSON object with \"jobs\" and \"all_nodes\"")
    jobs_doc = doc.get("jobs", [])
    if not isinstance(jobs_doc, list):
        raise ResumeFileError(f"{where}: \"jobs\" must be a list")
    jobs = []
    for i, j in enumerate(jobs_doc):
        if not isinstance(j, dict):
            raise ResumeFileError(f"{where}: jobs[{i}] must be an object with job_id and nodes")
        jid = j.get("job_id")
        if isinstance(jid, bool) or not isinstance(jid, (int, str)) or not str(jid).strip():
            raise ResumeFileError(f"{where}: jobs[{i}].job_id is missing or not a job id ({jid!r})")
        nodes = j.get("nodes")
        if not isinstance(nodes, str) or not nodes.strip():
            raise ResumeFileError(f"{where}: jobs[{i}].nodes is missing or not a host list ({nodes!r})")
        try:
            jobs.append((str(jid).strip(), tuple(expand(nodes, f"jobs[{i}].nodes"))))
        except ValueError as e:
            raise ResumeFileError(f"{where}: {e}") from None
    all_nodes: tuple[str, ...] = ()
    if doc.get("all_nodes") not in (None, ""):
        if not isinstance(doc["all_nodes"], str):
            raise ResumeFileError(f"{where}: \"all_nodes\" must be a host list")
        try:
            all_nodes = tuple(expand(doc["all_nodes"], "all_nodes"))
        except ValueError as e:
            raise ResumeFileError(f"{where}: {e}") from None
    return ResumeRequest(tuple(jobs), all_nodes, text)


def read_resume_file(path: str) -> ResumeRequest:
    """Read SLURM_RESUME_FILE (do it at once: it is a memfd of slurmctld's)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ResumeFileError(f"cannot read the resume file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ResumeFileError(f"the resume file {path} is not UTF-8 text") from None
    return parse_resume_file(text, f"resume file {path}")


@dataclass(frozen=True)
class Group:
    """Nodes launched as one lease, and the jobs that will run on them."""

    nodes: tuple[str, ...]
    job_ids: tuple[str, ...] = ()
    shape: Shape | None = None

    @property
    def hostlist(self) -> str:
        return hostlist.collect_hostlist(list(self.nodes))


def group_nodes(nodes: Sequence[str], request: ResumeRequest | None) -> list[Group]:
    """Nodes → groups: jobs that share a node are one group (one gang lease for all their nodes);
    a node in no job is a group of its own. Only ``nodes`` (the program's argument) count."""
    wanted = list(dict.fromkeys(nodes))
    index = {n: i for i, n in enumerate(wanted)}
    parent = list(range(len(wanted)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    jobs_of: dict[int, list[str]] = {}
    for jid, jnodes in (request.jobs if request else ()):
        idx = [index[n] for n in jnodes if n in index]
        if not idx:
            continue
        for i in idx[1:]:
            parent[find(i)] = find(idx[0])
        jobs_of.setdefault(idx[0], []).append(jid)
    members: dict[int, list[str]] = {}
    for n in wanted:
        members.setdefault(find(index[n]), []).append(n)
    job_ids: dict[int, list[str]] = {}
    for i, jids in jobs_of.items():
        job_ids.setdefault(find(i), []).extend(jids)
    return [Group(tuple(m), tuple(dict.fromkeys(job_ids.get(root, ()))))
            for root, m in sorted(members.items(), key=lambda kv: index[kv[1][0]])]


def split_by_shape(groups: Iterable[Group], settings: SlurmSettings) -> tuple[list[Group], list[str]]:
    """Give each group its shape (a group spanning shapes becomes one lease per shape);
    returns (groups, nodes of no shape)."""
    out, unknown = [], []
    for g in groups:
        by: dict[str, list[str]] = {}
        for n in g.nodes:
            sh = settings.shape_for(n)
            if sh is None:
                unknown.append(n)
            else:
                by.setdefault(sh.prefix, []).append(n)
        for prefix, ns in by.items():
            out.append(Group(tuple(ns), g.job_ids, settings.shapes[prefix]))
    return out, unknown


def demand_for(group: Group, jobs: Sequence[SlurmJob], tenant: str = "default") -> Demand:
    """The Demand of a group: the shape's GPUs × its nodes, for the jobs' time (their longest time
    limit, else their runtime hint, else the shape's hours); spot is allowed only when every job
    of the group says it is interruptible (comment ``broker:interruptible=1``)."""
    shape = group.shape
    if shape is None:
        raise SlurmHandoffError(f"nodes {group.hostlist} have no [slurm.shapes] entry")
    seconds, interruptible, checkpoint, data_gb, mem = 0, bool(jobs), 0, 0.0, shape.min_gpu_memory_gb
    for j in jobs:
        h = parse_job_hints(j.comment, j.name)
        seconds = max(seconds, j.time_limit_s or h.runtime_s)
        interruptible = interruptible and h.interruptible
        if h.checkpoint_minutes:
            checkpoint = min(checkpoint or h.checkpoint_minutes, h.checkpoint_minutes)
        data_gb += h.data_gb
        mem = max(mem, h.gpu_mem_gb)
    if len(jobs) < len(group.job_ids):
        interruptible = False  # a job we could not read may not take spot
    hours = seconds / 3600.0 if seconds else shape.hours
    n = len(group.nodes)
    return Demand(gpus=shape.gpus * n, hours=max(hours, 1 / 60), gpu_model=shape.gpu,
                  min_gpu_memory_gb=mem, nodes=n, data_in_gb=data_gb, interruptible=interruptible,
                  checkpoint_minutes=checkpoint if interruptible else 0, providers=shape.providers,
                  regions=shape.regions, tenant=tenant,
                  job_id=group.job_ids[0] if group.job_ids else "")


def resume_digest(nodes_arg: str, request: ResumeRequest | None, now: float) -> str:
    basis = request.raw if request is not None and request.raw else f"{int(now // KEY_WINDOW_S)}"
    return hashlib.sha256(f"{nodes_arg}\n{basis}".encode()).hexdigest()[:12]


def idempotency_key(group: Group, digest: str, attempt: int = 1) -> str:
    return f"slurm-{group.hostlist}-{digest}" + (f".{attempt}" if attempt > 1 else "")


def nodes_from_key(key: str) -> list[str]:
    """The node names of a key made by :func:`idempotency_key` ([] for any other key)."""
    if not key.startswith("slurm-") or "-" not in key[6:]:
        return []
    try:
        return hostlist.expand_hostlist(key[6:].rsplit("-", 1)[0])
    except hostlist.BadHostlist:
        return []


def lease_nodes(lease: Mapping[str, Any]) -> set[str]:
    """The Slurm node names a lease carries: its instances', else its key's (still launching)."""
    names = {i.get("node_name", "") for i in lease.get("instances", [])} - {""}
    return names or set(nodes_from_key(lease.get("idempotency_key", "")))


# ---------------------------------------------------------------------------------------------
# the programs
class BrokerApi(Protocol):
    def quote(self, demand: Demand, top: int = 0) -> dict[str, Any]: ...
    def launch(self, request: Any) -> dict[str, Any]: ...
    def list_leases(self, states: list[str] = (), tenant: str = "", limit: int = 0) -> list[dict[str, Any]]: ...
    def release(self, lease_id: str, reason: str = "") -> dict[str, Any]: ...


@dataclass
class Outcome:
    """What a program did, for the log and the exit code."""

    launched: list[dict] = field(default_factory=list)  # {"nodes", "lease_id", "jobs", ...}
    reused: list[dict] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"nodes", "error"}
    ignored: list[str] = field(default_factory=list)  # nodes that are not the broker's

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


def _live_by_node(broker: BrokerApi) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for lease in broker.list_leases(list(LIVE)):
        for n in lease_nodes(lease):
            out[n] = lease
    return out


def _launch_request(group: Group, quote_id: str, key: str, settings: SlurmSettings, job: SlurmJob | None):
    from broker.v1 import broker_pb2 as pb

    req = pb.LaunchRequest(idempotency_key=key, tenant=settings.tenant, bootstrap=settings.bootstrap,
                           node_names=list(group.nodes))
    req.quote_offer.quote_id, req.quote_offer.rank = quote_id, 1
    if group.job_ids:
        req.job.job_id = group.job_ids[0]
        if job is not None:
            req.job.owner, req.job.queue = job.user, job.partition
        req.job.env["SLURM_JOB_IDS"] = ",".join(group.job_ids)
    return req


def _launch_group(group: Group, settings: SlurmSettings, broker: BrokerApi, scontrol: Scontrol,
                  digest: str, jobs: Sequence[SlurmJob]) -> dict:
    lg = log.bind(nodes=group.hostlist, jobs=list(group.job_ids))
    demand = demand_for(group, jobs, settings.tenant)
    lg.info("quoting", gpus=demand.gpus, gpu_model=demand.gpu_model, node_count=demand.nodes,
            hours=round(demand.hours, 3), interruptible=demand.interruptible)
    q = broker.quote(demand)
    if not q["offers"]:
        reasons = sorted({e["reason"] for e in q["excluded"]})[:3]
        raise SlurmHandoffError(f"no cloud offer fits {demand.nodes} x {demand.gpus // demand.nodes} "
                                f"{demand.gpu_model or 'GPU'}: " + ("; ".join(reasons) or "nothing quoted"))
    lease = None
    for attempt in range(1, 6):
        key = idempotency_key(group, digest, attempt)
        lease = broker.launch(_launch_request(group, q["quote_id"], key, settings, jobs[0] if jobs else None))
        if lease["state"] not in ENDED:
            break
        lg.info("key_ended", key=key, lease=lease["lease_id"], state=lease["state"],
                why="that lease has ended: Slurm asks for the nodes again")
    else:
        raise SlurmHandoffError(f"five leases for {group.hostlist} have ended under this resume; giving up")
    lg = lg.bind(lease=lease["lease_id"], provider=lease["provider"])
    lg.info("launched", state=lease["state"], region=lease["region"], instance_type=lease["instance_type"],
            market=lease["market"], key=key, quote=q["quote_id"])
    try:
        if lease["state"] != "running":
            raise SlurmHandoffError(f"lease {lease['lease_id']} is {lease['state']}: {lease['state_reason']}")
        by_name = {i["node_name"]: i for i in lease["instances"]}
        missing = [n for n in group.nodes if n not in by_name]
        if missing:
            raise SlurmHandoffError(f"lease {lease['lease_id']} has no instance for {','.join(missing)}")
        if settings.set_node_addr:
            for n in group.nodes:
                ip = by_name[n].get("private_ip", "")
                if not ip:
                    raise SlurmHandoffError(f"instance {by_name[n]['instance_id']} of {n} has no private IP")
                scontrol.set_node_addr(n, ip, n)
                lg.info("node_addr_set", node=n, addr=ip)
    except Exception as e:
        try:
            broker.release(lease["lease_id"], f"slurm resume of {group.hostlist} failed: {e}")
            lg.info("released_after_failure")
        except Exception as e2:  # the resume-fail program and the reconciler get it later
            lg.error("release_failed", error=str(e2))
        raise
    return {"nodes": group.hostlist, "lease_id": lease["lease_id"], "jobs": list(group.job_ids),
            "provider": lease["provider"], "region": lease["region"],
            "instance_type": lease["instance_type"], "market": lease["market"]}


def resume(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi, *,
           request: ResumeRequest | None = None, scontrol: Scontrol | None = None,
           now: float | None = None, workers: int = 8) -> Outcome:
    """ResumeProgram: launch the nodes of ``nodes_arg`` (see the module doc)."""
    scontrol = scontrol or Scontrol(settings.scontrol, settings.env, settings.command_timeout_s)
    now = time.time() if now is None else now
    nodes = expand(nodes_arg)
    out = Outcome()
    if request is not None and request.all_nodes and set(request.all_nodes) != set(nodes):
        log.warning("resume_file_mismatch", all_nodes=hostlist.collect_hostlist(list(request.all_nodes)),
                    argument=nodes_arg, note="the argument decides")
    groups, unknown = split_by_shape(group_nodes(nodes, request), settings)
    if unknown:
        out.ignored = unknown
        log.error("nodes_without_shape", nodes=hostlist.collect_hostlist(unknown),
                  shapes=sorted(settings.shapes),
                  note="not the broker's: left to Slurm; add a [slurm.shapes] entry or exclude them "
                       "from power saving (SuspendExcNodes)")
    digest = resume_digest(nodes_arg, request, now)
    live: dict[str, dict] | None = None
    err = ""
    try:
        live = _live_by_node(broker)
    except Exception as e:
        err = f"cannot list the broker's leases: {_error_text(e)}"
    todo: list[Group] = []
    for g in groups:
        if live is None:
            out.failed.append({"nodes": g.hostlist, "error": err})
            continue
        have = [n for n in g.nodes if n in live]
        for n in have:
            lease = live[n]
            out.reused.append({"nodes": n, "lease_id": lease["lease_id"], "state": lease["state"]})
            log.info("already_leased", node=n, lease=lease["lease_id"], state=lease["state"])
        rest = tuple(n for n in g.nodes if n not in live)
        if rest:
            todo.append(dataclasses.replace(g, nodes=rest))

    def read_jobs(g: Group) -> list[SlurmJob]:
        jobs = []
        for jid in g.job_ids:
            try:
                j = scontrol.job(jid)
            except Exception as e:  # the shape's defaults do; the resume must not fail on this
                log.warning("job_unreadable", job=jid, error=str(e))
                continue
            if j is not None:
                jobs.append(j)
        return jobs

    def one(g: Group) -> tuple[Group, dict | None, str]:
        try:
            return g, _launch_group(g, settings, broker, scontrol, digest, read_jobs(g)), ""
        except Exception as e:  # every failure of a group ends in its nodes set DOWN
            return g, None, _error_text(e)

    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo))),
                                thread_name_prefix="resume") as pool:
            # each task runs in a copy of this context: the log's bound command/hostlist go along
            futures = [pool.submit(contextvars.copy_context().run, one, g) for g in todo]
            results = [f.result() for f in futures]
        for g, done, error in results:
            if done is not None:
                out.launched.append(done)
            else:
                out.failed.append({"nodes": g.hostlist, "error": error})
    down: dict[str, list[str]] = {}  # reason -> nodes: one scontrol call per distinct reason
    for f in out.failed:
        log.error("resume_failed", nodes=f["nodes"], error=f["error"])
        down.setdefault(_reason(f["error"]), []).extend(expand(f["nodes"]))
    for reason, failed_nodes in down.items():
        names = hostlist.collect_hostlist(failed_nodes)
        try:
            scontrol.mark_down(failed_nodes, reason)
            log.info("nodes_down", nodes=names, reason=reason)
        except Exception as e:
            log.error("mark_down_failed", nodes=names, error=str(e))
    return out


def _error_text(e: Exception) -> str:
    from broker.client import ClientError

    if isinstance(e, ClientError):
        return f"broker {e.code.name.lower()}: {e}"
    return str(e) or type(e).__name__


def suspend(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi, *,
            scontrol: Scontrol | None = None) -> Outcome:
    """SuspendProgram: release the live leases of these nodes. A gang lease whose other nodes
    Slurm still runs is kept until they are suspended too (their jobs must not lose nodes)."""
    scontrol = scontrol or Scontrol(settings.scontrol, settings.env, settings.command_timeout_s)
    nodes = set(expand(nodes_arg))
    out = Outcome()
    seen: set[str] = set()
    for lease in broker.list_leases(list(LIVE)):
        carried = lease_nodes(lease)
        hit = carried & nodes
        if not hit:
            continue
        seen |= hit
        others = sorted(carried - nodes)
        if others:
            try:
                states = scontrol.node_states(others)
            except Exception as e:
                states = None
                log.warning("node_states_unreadable", nodes=hostlist.collect_hostlist(others), error=str(e))
            up = [n for n in others if states is not None and n in states and not (
                states[n] & {"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"})]
            if states is None or up:
                out.kept.append({"lease_id": lease["lease_id"], "nodes": sorted(hit), "still_up": up or others})
                log.info("lease_kept", lease=lease["lease_id"], suspended=sorted(hit), still_up=up or others)
                continue
        _release(broker, lease, f"slurm suspended {hostlist.collect_hostlist(sorted(hit))}", out)
    for n in sorted(nodes - seen):
        log.info("no_lease", node=n, note="no live lease carries this node: nothing to release")
    return out


def resume_fail(nodes_arg: str, settings: SlurmSettings, broker: BrokerApi) -> Outcome:
    """ResumeFailProgram: the nodes did not come up in ResumeTimeout (Slurm has set them DOWN and
    requeued their jobs): release every live lease that carries one of them."""
    nodes = set(expand(nodes_arg))
    out = Outcome()
    seen: set[str] = set()
    for lease in broker.list_leases(list(LIVE)):
        hit = lease_nodes(lease) & nodes
        if hit:
            seen |= hit
            _release(broker, lease, f"slurm: {hostlist.collect_hostlist(sorted(hit))} did not come up "
                                    f"within ResumeTimeout", out)
    log.warning("resume_failed_nodes", nodes=nodes_arg, with_lease=sorted(seen), without_lease=sorted(nodes - seen))
    return out


def _release(broker: BrokerApi, lease: Mapping[str, Any], reason: str, out: Outcome) -> None:
    try:
        done = broker.release(lease["lease_id"], reason)
        out.released.append(lease["lease_id"])
        log.info("released", lease=lease["lease_id"], provider=lease.get("provider", ""),
                 nodes=sorted(lease_nodes(lease)), state=done.get("state", ""), reason=reason)
    except Exception as e:
        out.failed.append({"nodes": ",".join(sorted(lease_nodes(lease))), "lease_id": lease["lease_id"],
                           "error": _error_text(e)})
        log.error("release_failed", lease=lease["lease_id"], error=_error_text(e))


# ---------------------------------------------------------------------------------------------
# logging to a file (slurmctld discards the programs' output)
def configure_file_logging(path: str, level: str = "info") -> str:
    """structlog JSON lines appended to ``path``; falls back to stderr when it cannot be opened.
    Returns where the log goes."""
    import logging
    import sys

    target = path
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        stream = open(path, "a", buffering=1, encoding="utf-8")
    except OSError as e:
        stream = sys.stderr
        target = f"stderr (cannot open {path}: {e.strerror or e})"
    lvl = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
    return target


__all__ = [
    "Group", "Outcome", "ResumeFileError", "ResumeRequest", "Scontrol", "Shape", "SlurmBurstTarget",
    "SlurmHandoffError", "SlurmSettings", "SlurmSourceWatcher", "configure_file_logging", "demand_for",
    "expand", "group_nodes", "idempotency_key", "lease_nodes", "nodes_from_key", "parse_resume_file",
    "read_resume_file", "resume", "resume_digest", "resume_fail", "settings_from_config", "slurm_source",
    "split_by_shape", "suspend",
]
