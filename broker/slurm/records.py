"""Slurm's job record and the small values in its output: GPU TRES/GRES, times, host lists,
array task ranges, and the broker's job hints.

Job hints (documented convention). A job's ``--comment`` may carry
``broker:kind=eval,interruptible=1,checkpoint=30,data_gb=200`` anywhere in it. Keys:

=============  ==============================================================================
kind           training | tuning | eval | inference
interruptible  1/0, true/false, yes/no — the job checkpoints and may be preempted or run on spot
checkpoint     checkpoint interval in minutes
data_gb        dataset size to move with the job, GB
gpu_mem        minimum GPU memory per GPU, GB
runtime        expected runtime in minutes (default: the time limit)
gang           name of a gang: jobs that only make progress together (see policies.diagnose)
=============  ==============================================================================

Without ``kind=`` the job name decides: a name starting with ``eval``, ``tune``/``tuning``/``hpo``/
``sweep``, ``infer``/``inference``/``serve`` (followed by ``-``, ``_``, ``.``, ``:`` or the end)
is that kind; anything else is training. A hint that cannot be read is skipped and reported in
``snapshot.extra["warnings"]``; it never fails the snapshot.

Times in the text formats are the local time of the machine that ran the command (Slurm prints no
zone); the JSON has epoch seconds. Time limits of a year or more (``UNLIMITED``, or the
``365-00:00:00`` Slurm shows for an infinite partition limit) count as no limit (0).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Iterable

import hostlist

from broker.watchers.hints import parse_job_hints
from policies.queue import PendingJob, RunningJob

# ---------------------------------------------------------------------------------------------
# formats the watcher passes (fixed; the text parsers read exactly these)
SQUEUE_FIELDS = (
    "JobArrayID", "State", "Reason", "Partition", "UserName", "SubmitTime", "StartTime", "TimeLimit",
    "NumNodes", "NumTasks", "tres-per-job", "tres-per-node", "tres-per-task", "OverSubscribe", "NodeList",
    "Name", "Comment",
)
SQUEUE_FORMAT = ",".join(f"{f}:|" for f in SQUEUE_FIELDS)
SINFO_FIELDS = ("NodeList", "StateComplete", "Gres", "GresUsed", "Partition", "Reason")
SINFO_FORMAT = ",".join(f"{f}:|" for f in SINFO_FIELDS)
SQUEUE_STATES = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED"

PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING",
                            "SIGNALING", "STAGE_OUT", "POWER_UP_NODE"})
UNLIMITED_S = 365 * 86400
MAX_ARRAY_TASKS = 100_000
_NULLS = {"", "(null)", "N/A", "n/a", "None", "none", "Unknown", "UNKNOWN", "NOT_SET", "INVALID"}


# ---------------------------------------------------------------------------------------------
# the intermediate job record every job parser produces
@dataclass(frozen=True, slots=True)
class SlurmJob:
    job_id: str
    state: str  # base state, upper case (PENDING, RUNNING, ...)
    name: str = ""
    reason: str = ""
    partition: str = ""
    user: str = ""
    submit_time: float | None = None
    start_time: float | None = None
    time_limit_s: int = 0  # 0 = none
    node_count: int = 0
    gpus: int = 0  # whole job
    gpu_model: str = ""
    exclusive: bool = False
    nodes: tuple[str, ...] = ()
    comment: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)
    qos: str = ""
    priority: int = 0

    @property
    def is_pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def is_running(self) -> bool:
        return self.state in RUNNING_STATES


# ---------------------------------------------------------------------------------------------
# small value parsers (shared by JSON and text)
def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses/brackets (``gpu:2(IDX:0,2)`` stays one item)."""
    items, depth, cur = [], 0, []
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


_COUNT = re.compile(r"^(\d+)([KMGTP]?)$", re.I)
_MULT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def _count(text: str) -> int | None:
    m = _COUNT.match(text.strip())
    if not m:
        return None
    return int(m.group(1)) * _MULT[m.group(2).upper()]


def parse_gpu_tres(spec: str) -> tuple[int, str]:
    """``gres:gpu:2``, ``gres:gpu:a100:2``, ``gres/gpu=2``, ``gpu:a100``, lists of them →
    (GPU count, GPU type or ""). Non-GPU items (``gres:mps:100``, ``license:x``) are ignored.

    Raises ValueError for a GPU item whose count cannot be read.
    """
    total, model = 0, ""
    if spec is None or str(spec).strip() in _NULLS:
        return 0, ""
    for item in _split_top(str(spec)):
        item = re.sub(r"\(.*\)$", "", item)  # (S:0-1), (IDX:0-1)
        for prefix in ("gres:", "gres/", "tres:", "tres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
                break
        parts = re.split(r"[:=]", item)
        if parts[0] != "gpu":
            continue
        rest = parts[1:]
        if not rest:
            n, typ = 1, ""
        elif len(rest) == 1:
            c = _count(rest[0])
            n, typ = (c, "") if c is not None else (1, rest[0])
        else:
            c = _count(rest[-1])
            if c is None:
                raise ValueError(f"cannot read the GPU count in {item!r}")
            n, typ = c, ":".join(rest[:-1])
        if typ == "no_consume":
            typ = ""
        total += n
        if typ and not model:
            model = typ
    return total, model


def parse_node_gres(spec: str) -> tuple[int, str]:
    """Node ``Gres``/``GresUsed``: ``gpu:4``, ``gpu:a100:4(S:0-1)``, ``gpu:a100:2(IDX:0-1)``,
    ``gpu:a100:2(S:0),gpu:v100:2(S:1)`` → (GPU count, type with the most GPUs or "")."""
    per_type: dict[str, int] = {}
    if spec is None or str(spec).strip() in _NULLS:
        return 0, ""
    for item in _split_top(str(spec)):
        n, typ = parse_gpu_tres(item)
        if n or item.split(":")[0] == "gpu":
            per_type[typ] = per_type.get(typ, 0) + n
    if not per_type:
        return 0, ""
    model = max(per_type, key=lambda t: (per_type[t], t != ""))
    return sum(per_type.values()), model


_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(text: str) -> int:
    """Slurm time: ``days-hh:mm:ss``, ``hh:mm:ss``, ``mm:ss``, ``days-hh``; UNLIMITED → 0."""
    t = (text or "").strip()
    if t in _NULLS or t.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT"):
        return 0
    m = _DURATION.match(t)
    if not m:
        raise ValueError(f"cannot read the time {t!r}")
    days, a, b, c = m.groups()
    if days is not None:  # days-hh[:mm[:ss]]
        secs = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # hh:mm:ss
        secs = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # mm:ss
        secs = int(a) * 60 + int(b)
    else:  # minutes
        secs = int(a) * 60
    return 0 if secs >= UNLIMITED_S else secs


def parse_local_time(text: str) -> float | None:
    """``2026-12-02T11:59:09`` (local time, as squeue/scontrol print it) → epoch seconds."""
    t = (text or "").strip()
    if t in _NULLS:
        return None
    try:
        return time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        raise ValueError(f"cannot read the date {t!r}") from None


def expand_hostlist(text: str) -> tuple[str, ...]:
    t = (text or "").strip()
    if t in _NULLS:
        return ()
    try:
        return tuple(hostlist.expand_hostlist(t))
    except hostlist.BadHostlist as exc:
        raise ValueError(f"cannot read the node list {t!r}: {exc}") from None


def _array_tasks(spec: str) -> list[str]:
    """``1-10:2%4`` / ``1,3,5-7`` → task ids (throttle ``%N`` dropped)."""
    spec = spec.split("%", 1)[0].strip("[]")
    tasks: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            raise ValueError(f"cannot read the array task list {spec!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3) or 1)
        if step <= 0 or hi < lo or len(tasks) + (hi - lo) // step + 1 > MAX_ARRAY_TASKS:
            raise ValueError(f"bad array task range {part!r}")
        tasks.extend(str(i) for i in range(lo, hi + 1, step))
    return tasks


# ---------------------------------------------------------------------------------------------
# SlurmJob → PendingJob / RunningJob
def jobs_to_queue(jobs: Iterable[SlurmJob], now: float
                  ) -> tuple[list[PendingJob], list[RunningJob], dict]:
    """Split jobs into pending/running queue records with their hints applied.

    The third value is the ``extra`` for a snapshot: ``warnings`` (unreadable hints) and
    ``gangs`` ({gang name: [job ids]}) when any job names one.
    """
    pending: list[PendingJob] = []
    running: list[RunningJob] = []
    warnings: list[str] = []
    gangs: dict[str, list[str]] = {}
    for job in jobs:
        if not (job.is_pending or job.is_running):
            continue
        hints = parse_job_hints(job.comment, job.name)
        warnings.extend(f"job {job.job_id}: {p}" for p in hints.problems)
        if hints.gang:
            gangs.setdefault(hints.gang, []).append(job.job_id)
        if job.is_pending:
            pending.append(PendingJob(
                job_id=job.job_id, gpus=job.gpus, user=job.user, queue=job.partition,
                gpu_model=job.gpu_model, min_gpu_memory_gb=hints.gpu_mem_gb,
                nodes=job.node_count, time_limit_s=job.time_limit_s,
                est_runtime_s=hints.runtime_s or job.time_limit_s,
                waited_s=max(0, int(now - job.submit_time)) if job.submit_time else 0,
                pending_reason=job.reason, interruptible=hints.interruptible,
                checkpoint_minutes=hints.checkpoint_minutes, data_gb=hints.data_gb,
                kind=hints.kind, exclusive=job.exclusive, qos=job.qos, priority=job.priority,
            ))
        else:
            running.append(RunningJob(
                job_id=job.job_id, gpus=job.gpus, user=job.user, queue=job.partition,
                nodes=job.nodes,
                runtime_s=max(0, int(now - job.start_time)) if job.start_time else 0,
                time_limit_s=job.time_limit_s, est_runtime_s=hints.runtime_s,
            ))
    extra: dict = {}
    if warnings:
        extra["warnings"] = warnings
    if gangs:
        extra["gangs"] = gangs
    return pending, running, extra
