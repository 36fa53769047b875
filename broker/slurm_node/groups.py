"""From the nodes Slurm resumes to leases: the resume file, grouping by job, each group's shape and
demand, and the idempotency key that makes a re-run of the same resume launch nothing.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import hostlist

from broker.slurm.commands import SlurmHandoffError
from broker.slurm.records import SlurmJob
from broker.watchers.hints import parse_job_hints
from broker.slurm.settings import Shape, SlurmSettings
from policies.demand import Demand

KEY_WINDOW_S = 600  # without a resume file, a re-run within this window is the same resume


class ResumeFileError(ValueError):
    """SLURM_RESUME_FILE cannot be read or does not hold what Slurm writes there."""


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
    from providers.files import SMALL_BYTES, read_text

    try:
        text = read_text(path, SMALL_BYTES)
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
