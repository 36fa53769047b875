"""Slurm → QueueSnapshot: parsers for squeue/sinfo/scontrol output and a watcher that runs them.

Sources, in the watcher's order of preference:

* ``squeue --json`` / ``sinfo --json`` (Slurm 22.05+, openapi v0.0.38 shape; the newer
  data_parser shapes of 23.02+ — lists for states, ``{"set","infinite","number"}`` numbers,
  ``gres/gpu`` TRES — are read too). ``squeue --json`` ignores filters and includes recently
  finished jobs, so the reading side keeps only pending and running ones.
* When the JSON plugin is missing (the command fails and says so), a fixed text format:
  ``squeue --noheader --states=... --Format=`` :data:`SQUEUE_FORMAT` and
  ``sinfo --noheader --Node --Format=`` :data:`SINFO_FORMAT`. ``--Format`` (not ``-o``) is used
  because ``-o`` has no letter for ``tres-per-job`` (``--gpus=N``) and cannot print the full node
  state with its flags. Every field ends in ``|``; the free-text fields (job name, comment, node
  reason) come last so a ``|`` inside them cannot shift the others.
* ``scontrol show job [-o]`` for one job's details (GRES/TRES) — :func:`parse_scontrol_job`.

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

import json
import math
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import hostlist

from broker.watchers import ParseError
from policies.queue import ClusterNode, JOB_KINDS, PendingJob, QueueSnapshot, RunningJob

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


class SlurmCommandError(RuntimeError):
    """A Slurm command could not be run or failed; the message names the command and its error."""

    def __init__(self, argv: Sequence[str], message: str, returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"`{' '.join(self.argv)}` {message}")


def _last_line(text: str) -> str:
    """The most specific line of a Slurm error (its last ``fatal``/``error`` line)."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


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

    @property
    def is_pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def is_running(self) -> bool:
        return self.state in RUNNING_STATES


@dataclass(frozen=True, slots=True)
class JobHints:
    kind: str = "training"
    interruptible: bool = False
    checkpoint_minutes: int = 0
    data_gb: float = 0.0
    gpu_mem_gb: int = 0
    runtime_s: int = 0
    gang: str = ""
    problems: tuple[str, ...] = ()


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


_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}
_KIND_ALIASES = {
    "train": "training", "training": "training", "pretrain": "training", "finetune": "training",
    "tune": "tuning", "tuning": "tuning", "hpo": "tuning", "sweep": "tuning",
    "eval": "eval", "evaluation": "eval", "bench": "eval",
    "infer": "inference", "inference": "inference", "serve": "inference", "serving": "inference",
}
_NAME_KIND = re.compile(r"^(eval|evaluation|tune|tuning|hpo|sweep|infer|inference|serve|serving|"
                        r"train|training)(?:[-_.:]|$)", re.I)
_HINTS = re.compile(r"broker:((?:[A-Za-z_]+=[^,\s;]*)(?:,[A-Za-z_]+=[^,\s;]*)*)")


def parse_job_hints(comment: str, name: str = "") -> JobHints:
    """Read the ``broker:k=v,...`` hints of a job's comment, falling back to its name for kind."""
    kind, problems = "", []
    values: dict[str, Any] = {}
    m = _HINTS.search(comment or "")
    if m:
        for pair in m.group(1).split(","):
            key, _, raw = pair.partition("=")
            key = key.lower()
            raw = raw.strip()
            try:
                if key == "kind":
                    k = _KIND_ALIASES.get(raw.lower())
                    if k is None:
                        raise ValueError(f"kind must be one of {', '.join(JOB_KINDS)}")
                    kind = k
                elif key == "interruptible":
                    if raw.lower() not in _TRUE | _FALSE:
                        raise ValueError("interruptible must be 1/0, true/false or yes/no")
                    values["interruptible"] = raw.lower() in _TRUE
                elif key in ("checkpoint", "gpu_mem", "runtime"):
                    if not raw.isdigit():
                        unit = "GB" if key == "gpu_mem" else "minutes"
                        raise ValueError(f"{key} must be a whole number of {unit}")
                    values[key] = int(raw)
                elif key == "data_gb":
                    try:
                        v = float(raw)
                    except ValueError:
                        v = -1.0
                    if not math.isfinite(v) or v < 0:
                        raise ValueError("data_gb must be a non-negative number")
                    values[key] = v
                elif key == "gang":
                    if not raw:
                        raise ValueError("gang needs a name")
                    values[key] = raw
                else:
                    raise ValueError("unknown hint")
            except ValueError as exc:
                problems.append(f"{pair!r}: {exc}")
    elif "broker:" in (comment or ""):
        problems.append(f"cannot read the broker hints in comment {comment!r}")
    if not kind:
        nm = _NAME_KIND.match(name or "")
        kind = _KIND_ALIASES[nm.group(1).lower()] if nm else "training"
    return JobHints(
        kind=kind,
        interruptible=values.get("interruptible", False),
        checkpoint_minutes=values.get("checkpoint", 0),
        data_gb=values.get("data_gb", 0.0),
        gpu_mem_gb=values.get("gpu_mem", 0),
        runtime_s=values.get("runtime", 0) * 60,
        gang=values.get("gang", ""),
        problems=tuple(problems),
    )


# ---------------------------------------------------------------------------------------------
# JSON helpers
def _json_number(value: Any) -> float | None:
    """v0.0.38 plain numbers / None, or 23.02+ ``{"set": bool, "infinite": bool, "number": n}``."""
    if isinstance(value, Mapping):
        if value.get("infinite"):
            return math.inf
        if not value.get("set", True):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return float(value)
    raise ValueError(f"expected a number, got {value!r}")


def _json_str(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _json_state(value: Any) -> tuple[str, list[str]]:
    """``"PENDING"`` or ``["PENDING", "REQUEUED"]`` → (base state, flags)."""
    if isinstance(value, list):
        states = [str(v).upper() for v in value]
        return (states[0] if states else ""), states[1:]
    return str(value or "").upper(), []


def _line_of(text: str, pattern: str) -> int | None:
    m = re.search(pattern, text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _load_json(text: str, key: str, what: str) -> tuple[dict, list]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not valid {what} JSON: {exc.msg} (column {exc.colno})",
                         line=exc.lineno) from None
    if not isinstance(doc, dict):
        raise ParseError(f"{what} JSON must be an object with a {key!r} list", line=1)
    errors = doc.get("errors") or []
    if errors:
        first = errors[0]
        msg = first.get("error") or first.get("description") if isinstance(first, dict) else first
        raise ParseError(f"{what} reported an error: {msg}", line=_line_of(text, r'"errors"'))
    items = doc.get(key)
    if not isinstance(items, list):
        raise ParseError(f"{what} JSON has no {key!r} list", line=1)
    return doc, items


def _job_from_json(j: Mapping[str, Any]) -> list[SlurmJob]:
    state, flags = _json_state(j.get("job_state"))
    job_id = _json_number(j.get("job_id"))
    if job_id is None:
        raise ValueError("job_id is missing")
    jid = str(int(job_id))
    node_count = int(_json_number(j.get("node_count")) or 0)
    tasks = int(_json_number(j.get("tasks")) or 0) or 1
    gpus, model = 0, ""
    for key, mult in (("tres_per_job", 1), ("tres_per_node", max(node_count, 1)),
                      ("tres_per_task", tasks), ("tres_per_socket", max(node_count, 1))):
        n, typ = parse_gpu_tres(_json_str(j.get(key)))
        if n:
            gpus, model = n * mult, typ
            break
    if not gpus and state in RUNNING_STATES:
        # allocated GRES of a running job: gres_detail ["gpu:a100:1(IDX:0)", ...] (one per node)
        for item in j.get("gres_detail") or []:
            n, typ = parse_node_gres(str(item))
            gpus += n
            model = model or typ
    limit = _json_number(j.get("time_limit"))  # minutes
    limit_s = 0 if limit is None or math.isinf(limit) else int(limit * 60)
    if limit_s >= UNLIMITED_S:
        limit_s = 0
    submit = _json_number(j.get("submit_time"))
    start = _json_number(j.get("start_time"))
    shared = j.get("shared")
    exclusive_field = j.get("exclusive")
    exclusive = (shared == "none" or (isinstance(shared, list) and "none" in shared)
                 or exclusive_field in (True, "true", "user", "mcs")
                 or (isinstance(exclusive_field, list) and bool(
                     {"true", "user", "mcs"} & {str(x) for x in exclusive_field})))
    reason = _json_str(j.get("state_reason"))
    reason = "" if reason in _NULLS else reason
    desc = _json_str(j.get("state_description"))
    if desc and reason and desc.startswith(reason):
        reason = desc
    nodes = expand_hostlist(_json_str(j.get("nodes"))) if state in RUNNING_STATES else ()
    het_id = int(_json_number(j.get("het_job_id")) or 0)
    if het_id:
        jid = f"{het_id}+{int(_json_number(j.get('het_job_offset')) or 0)}"
    base = SlurmJob(
        job_id=jid, state=state, name=_json_str(j.get("name")), reason=reason,
        partition=_json_str(j.get("partition")), user=_json_str(j.get("user_name")),
        submit_time=submit or None, start_time=start or None, time_limit_s=limit_s,
        node_count=node_count, gpus=gpus, gpu_model=model, exclusive=exclusive, nodes=nodes,
        comment=_json_str(j.get("comment")), extra={"flags": flags},
    )
    array_id = int(_json_number(j.get("array_job_id")) or 0)
    if array_id:
        task = _json_number(j.get("array_task_id"))
        task_str = _json_str(j.get("array_task_string"))
        if task is not None and not math.isinf(task):
            return [replace(base, job_id=f"{array_id}_{int(task)}")]
        if task_str:
            return [replace(base, job_id=f"{array_id}_{t}") for t in _array_tasks(task_str)]
    return [base]


def parse_squeue_jobs_json(text: str) -> list[SlurmJob]:
    """Every job record of ``squeue --json`` (all states), pending array records expanded."""
    _, items = _load_json(text, "jobs", "squeue")
    jobs: list[SlurmJob] = []
    for i, j in enumerate(items):
        if not isinstance(j, dict):
            raise ParseError(f"jobs[{i}] is not an object", line=None)
        try:
            jobs.extend(_job_from_json(j))
        except ValueError as exc:
            jid = j.get("job_id")
            line = _line_of(text, rf'"job_id"\s*:\s*{re.escape(json.dumps(jid))}\s*[,}}]')
            raise ParseError(f"job {jid} (jobs[{i}]): {exc}", line=line) from None
    return jobs


def parse_squeue_json(text: str, now: float) -> tuple[list[PendingJob], list[RunningJob]]:
    """``squeue --json`` → (pending, running); finished jobs are dropped."""
    return jobs_to_queue(parse_squeue_jobs_json(text), now)[:2]


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
                kind=hints.kind, exclusive=job.exclusive,
            ))
        else:
            running.append(RunningJob(
                job_id=job.job_id, gpus=job.gpus, user=job.user, queue=job.partition,
                nodes=job.nodes,
                runtime_s=max(0, int(now - job.start_time)) if job.start_time else 0,
            ))
    extra: dict = {}
    if warnings:
        extra["warnings"] = warnings
    if gangs:
        extra["gangs"] = gangs
    return pending, running, extra


# ---------------------------------------------------------------------------------------------
# nodes
_STATE_SUFFIX = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP",
                 "!": "POWER_DOWN", "%": "POWERING_DOWN", "$": "MAINTENANCE",
                 "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED", "-": "PLANNED"}
_BASE_STATES = {
    "idle": "idle", "allocated": "alloc", "alloc": "alloc", "mixed": "mix", "mix": "mix",
    "completing": "alloc", "comp": "alloc", "down": "down", "error": "down", "fail": "down",
    "failing": "down", "unknown": "down", "unk": "down", "future": "future", "futr": "future",
    "drained": "drain", "drain": "drain", "draining": "drain", "drng": "drain",
    "planned": "idle", "reserved": "idle", "resv": "idle", "maint": "idle", "inval": "down",
    "blocked": "down",
}


def node_state(state: str, flags: Iterable[str] = ()) -> str:
    """Slurm node state + flags → one of policies.queue.NODE_STATES (or "future": skip it).

    CLOUD beats everything (burst capacity is not on-prem capacity), then DRAIN/FAIL, then a
    node that does not respond or is down; POWERED_DOWN on an on-prem node keeps its base state.
    """
    raw = state.strip()
    flagset = {f.upper() for f in flags}
    while raw and raw[-1] in _STATE_SUFFIX:
        flagset.add(_STATE_SUFFIX[raw[-1]])
        raw = raw[:-1]
    parts = raw.lower().split("+")
    base, more = parts[0], parts[1:]
    flagset |= {p.upper() for p in more}
    if base not in _BASE_STATES:
        raise ValueError(f"unknown node state {state!r}")
    mapped = _BASE_STATES[base]
    if "CLOUD" in flagset:
        return "cloud"
    if mapped == "future":
        return "future"
    if mapped == "drain" or flagset & {"DRAIN", "DRAINED", "DRAINING", "FAIL"}:
        return "drain"
    if mapped == "down" or flagset & {"NOT_RESPONDING", "INVALID_REG", "DOWN"}:
        return "down"
    return mapped


def _node(name: str, state: str, gres: str, gres_used: str, partitions: Sequence[str],
          reason: str) -> ClusterNode | None:
    if state == "future":
        return None
    total, model = parse_node_gres(gres)
    used, used_model = parse_node_gres(gres_used)
    return ClusterNode(name=name, state=state, gpus_total=total, gpus_allocated=min(used, total)
                       if total else used, gpu_model=model or used_model,
                       partitions=tuple(p.rstrip("*") for p in partitions if p),
                       reason="" if reason.strip() in _NULLS else reason.strip())


def parse_sinfo_json(text: str) -> list[ClusterNode]:
    """``sinfo --json`` → nodes (FUTURE nodes are skipped)."""
    _, items = _load_json(text, "nodes", "sinfo")
    nodes: list[ClusterNode] = []
    for i, n in enumerate(items):
        if not isinstance(n, dict):
            raise ParseError(f"nodes[{i}] is not an object")
        name = _json_str(n.get("name") or n.get("hostname"))
        try:
            if not name:
                raise ValueError("the node has no name")
            state, flags = _json_state(n.get("state"))
            flags += [str(f).upper() for f in (n.get("state_flags") or [])]
            mapped = node_state(state, flags)
            parts = n.get("partitions") or []
            if isinstance(parts, str):
                parts = parts.split(",")
            node = _node(name, mapped, _json_str(n.get("gres")), _json_str(n.get("gres_used")),
                         [str(p) for p in parts], _json_str(n.get("reason")))
        except ValueError as exc:
            line = _line_of(text, rf'"name"\s*:\s*{re.escape(json.dumps(name))}') if name else None
            raise ParseError(f"node {name or '?'} (nodes[{i}]): {exc}", line=line) from None
        if node is not None:
            nodes.append(node)
    return nodes


# ---------------------------------------------------------------------------------------------
# text formats
_HEADER = {"StateComplete": "STATECOMPLETE", "GresUsed": "GRES_USED"}


def _text_rows(text: str, fields: Sequence[str], what: str) -> Iterable[tuple[int, list[str]]]:
    n = len(fields)
    header = [_HEADER.get(f, f.upper().replace("-", "_")) for f in fields]
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.rstrip("\n").split("|")
        if parts and parts[-1].strip() == "":
            parts = parts[:-1]  # the trailing "|" suffix of the last field
        if len(parts) < n:
            raise ParseError(f"expected {n} '|'-separated {what} fields "
                             f"({','.join(fields)}), found {len(parts)}", line=lineno)
        if len(parts) > n:  # a '|' inside the last (free-text) field
            parts = parts[:n - 1] + ["|".join(parts[n - 1:])]
        parts = [p.strip() for p in parts]
        if [p.upper().replace("-", "_") for p in parts[1:3]] == header[1:3]:
            continue  # a header line (output without --noheader)
        yield lineno, parts


def parse_squeue_text_jobs(text: str) -> list[SlurmJob]:
    """Jobs from ``squeue --noheader --Format=`` :data:`SQUEUE_FORMAT` output."""
    jobs: list[SlurmJob] = []
    for lineno, p in _text_rows(text, SQUEUE_FIELDS, "squeue"):
        (jid, state, reason, partition, user, submit, start, limit, nnodes, ntasks, per_job,
         per_node, per_task, oversub, nodelist, name, comment) = p
        try:
            if not re.fullmatch(r"\d+(?:_\[[\d,:%\-]+\]|_\d+|\+\d+)?", jid):
                raise ValueError(f"cannot read the job id {jid!r}")
            st = state.upper().split()[0] if state else ""
            if not re.fullmatch(r"[A-Z_]+", st):
                raise ValueError(f"cannot read the job state {state!r}")
            node_count = _count(nnodes) if nnodes not in _NULLS else 0
            if node_count is None:
                raise ValueError(f"cannot read the node count {nnodes!r}")
            tasks = _count(ntasks) or 1 if ntasks not in _NULLS else 1
            gpus, model = 0, ""
            for spec, mult in ((per_job, 1), (per_node, max(node_count, 1)), (per_task, tasks)):
                n, typ = parse_gpu_tres(spec)
                if n:
                    gpus, model = n * mult, typ
                    break
            running = st in RUNNING_STATES
            job = SlurmJob(
                job_id=jid, state=st, name=name, reason="" if reason in _NULLS else reason,
                partition=partition, user=user, submit_time=parse_local_time(submit),
                start_time=parse_local_time(start) if running else None,
                time_limit_s=parse_duration(limit), node_count=node_count, gpus=gpus,
                gpu_model=model, exclusive=oversub.upper() in ("NO", "EXCLUSIVE", "USER"),
                nodes=expand_hostlist(nodelist) if running else (),
                comment="" if comment in _NULLS else comment,
            )
        except ValueError as exc:
            raise ParseError(f"job {jid}: {exc}", line=lineno) from None
        m = re.fullmatch(r"(\d+)_\[(.+)\]", jid)
        if m:
            try:
                tasks_ids = _array_tasks(m.group(2))
            except ValueError as exc:
                raise ParseError(f"job {jid}: {exc}", line=lineno) from None
            jobs.extend(replace(job, job_id=f"{m.group(1)}_{t}") for t in tasks_ids)
        else:
            jobs.append(job)
    return jobs


def parse_squeue_text(text: str, now: float) -> tuple[list[PendingJob], list[RunningJob]]:
    """``squeue --noheader --Format=`` :data:`SQUEUE_FORMAT` → (pending, running)."""
    return jobs_to_queue(parse_squeue_text_jobs(text), now)[:2]


def parse_sinfo_text(text: str) -> list[ClusterNode]:
    """``sinfo --noheader --Node --Format=`` :data:`SINFO_FORMAT` → nodes.

    A node in several partitions appears once per partition; its rows are merged.
    """
    by_name: dict[str, ClusterNode] = {}
    for lineno, (names, state, gres, used, partition, reason) in _text_rows(
            text, SINFO_FIELDS, "sinfo"):
        try:
            mapped = node_state(state)
            hosts = expand_hostlist(names)
            if not hosts:
                raise ValueError("the row names no node")
            for host in hosts:
                node = _node(host, mapped, gres, used, [partition], reason)
                if node is None:
                    continue
                prev = by_name.get(host)
                if prev is not None:
                    node = replace(prev, partitions=tuple(dict.fromkeys(
                        prev.partitions + node.partitions)))
                by_name[host] = node
        except ValueError as exc:
            raise ParseError(f"node {names}: {exc}", line=lineno) from None
    return list(by_name.values())


# ---------------------------------------------------------------------------------------------
# scontrol show job
_KEY_SPLIT = re.compile(r"\s+(?=[A-Z][A-Za-z0-9_:/]*=)")


def _scontrol_records(text: str) -> Iterable[tuple[int, str]]:
    record: list[str] = []
    start = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            if record:
                yield start, " ".join(record)
                record = []
            continue
        if line.startswith("JobId="):
            if record:
                yield start, " ".join(record)
            record, start = [line.strip()], lineno
        elif line[0].isspace() and record:
            record.append(line.strip())
        elif line.strip() == "No jobs in the system":
            continue
        else:
            raise ParseError(f"expected a 'JobId=' record, found {line.strip()[:60]!r}",
                             line=lineno)
    if record:
        yield start, " ".join(record)


def parse_scontrol_fields(text: str) -> list[tuple[int, dict[str, str]]]:
    """``scontrol show job [-o] [-d]`` → (line, {Key: value}) per job record."""
    out = []
    for lineno, record in _scontrol_records(text):
        fields: dict[str, str] = {}
        for token in _KEY_SPLIT.split(record):
            key, sep, value = token.partition("=")
            if not sep:
                raise ParseError(f"cannot read {token[:60]!r} as Key=value", line=lineno)
            if key not in fields:  # -d repeats per-node keys (Nodes=, CPU_IDs=); keep the first
                fields[key] = value.strip()
        out.append((lineno, fields))
    return out


def parse_scontrol_job(text: str) -> list[SlurmJob]:
    """``scontrol show job [-o]`` (one or many records, one-line or multi-line) → jobs."""
    jobs = []
    for lineno, f in parse_scontrol_fields(text):
        jid = f.get("JobId", "")
        try:
            if not jid.isdigit():
                raise ValueError(f"cannot read the job id {jid!r}")
            task_ids: list[str] = []
            if f.get("HetJobId") and f.get("HetJobOffset"):
                jid = f"{f['HetJobId']}+{f['HetJobOffset']}"
            elif f.get("ArrayJobId") and f.get("ArrayTaskId"):
                if f["ArrayTaskId"].isdigit():
                    jid = f"{f['ArrayJobId']}_{f['ArrayTaskId']}"
                else:  # the pending remainder of an array: 1-3, 4-10%2, 1,3,5
                    task_ids = _array_tasks(f["ArrayTaskId"])
                    jid = f["ArrayJobId"]
            state = f.get("JobState", "").upper()
            nn = f.get("NumNodes", "0").split("-")[0]
            node_count = int(nn) if nn.isdigit() else 0
            tasks = int(f.get("NumTasks", "1")) if f.get("NumTasks", "").isdigit() else 1
            gpus, model = 0, ""
            for key, mult in (("TresPerJob", 1), ("TresPerNode", max(node_count, 1)),
                              ("TresPerTask", tasks), ("TresPerSocket", max(node_count, 1))):
                n, typ = parse_gpu_tres(f.get(key, ""))
                if n:
                    gpus, model = n * mult, typ
                    break
            if not gpus:
                # allocated TRES of a running job: TRES=cpu=1,node=1,gres/gpu=2 / gres/gpu:a100=2
                for item in f.get("TRES", "").split(","):
                    if item.startswith("gres/gpu"):
                        name, _, value = item.partition("=")
                        typ = name.split(":", 1)[1] if ":" in name else ""
                        if typ:
                            model = model or typ
                        elif value.isdigit():
                            gpus = int(value)
            user = re.sub(r"\(\d+\)$", "", f.get("UserId", ""))
            running = state in RUNNING_STATES
            job = SlurmJob(
                job_id=jid, state=state, name=f.get("JobName", ""),
                reason="" if f.get("Reason", "") in _NULLS else f.get("Reason", ""),
                partition=f.get("Partition", ""), user=user,
                submit_time=parse_local_time(f.get("SubmitTime", "")),
                start_time=parse_local_time(f.get("StartTime", "")) if running else None,
                time_limit_s=parse_duration(f.get("TimeLimit", "")), node_count=node_count,
                gpus=gpus, gpu_model=model,
                exclusive=f.get("OverSubscribe", "").upper() in ("NO", "USER", "MCS"),
                nodes=expand_hostlist(f.get("NodeList", "")) if running else (),
                comment="" if f.get("Comment", "") in _NULLS else f.get("Comment", ""),
                extra={"fields": f},
            )
            if task_ids:
                jobs.extend(replace(job, job_id=f"{jid}_{t}") for t in task_ids)
            else:
                jobs.append(job)
        except ValueError as exc:
            raise ParseError(f"job {jid or '?'}: {exc}", line=lineno) from None
    return jobs


# ---------------------------------------------------------------------------------------------
# format detection (for files)
def detect_format(text: str) -> str:
    """"json" when the text is a JSON document, else "text"."""
    return "json" if text.lstrip().startswith("{") else "text"


def parse_squeue(text: str, now: float) -> tuple[list[PendingJob], list[RunningJob], dict]:
    """``squeue`` output in either format → (pending, running, extra)."""
    jobs = (parse_squeue_jobs_json(text) if detect_format(text) == "json"
            else parse_squeue_text_jobs(text))
    return jobs_to_queue(jobs, now)


def parse_sinfo(text: str) -> list[ClusterNode]:
    """``sinfo`` output in either format → nodes."""
    return parse_sinfo_json(text) if detect_format(text) == "json" else parse_sinfo_text(text)


# ---------------------------------------------------------------------------------------------
# the watcher
_NO_JSON = re.compile(r"json|serializ|data_parser|openapi|unrecognized option|invalid option|"
                      r"unknown option", re.I)


def _default_bin(name: str) -> str:
    found = shutil.which(name)
    return found or f"/usr/bin/{name}"


@dataclass
class SlurmWatcher:
    """Reads a live Slurm through its commands and returns QueueSnapshots.

    ``squeue``/``sinfo``/``scontrol`` are command paths (default: found on PATH, else
    /usr/bin); ``env`` the environment for them (None: this process's, e.g. to pass
    ``SLURM_CONF``). JSON output is preferred; when a command refuses ``--json`` (no JSON plugin),
    the watcher falls back to the fixed text formats and remembers that per command.
    """

    squeue: str = field(default_factory=lambda: _default_bin("squeue"))
    sinfo: str = field(default_factory=lambda: _default_bin("sinfo"))
    scontrol: str = field(default_factory=lambda: _default_bin("scontrol"))
    source: str = "slurm"
    env: Mapping[str, str] | None = None
    timeout: float = 30.0
    prefer_json: bool = True
    _json_ok: dict[str, bool] = field(default_factory=dict, init=False, repr=False)

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        if not os.path.isabs(argv[0]) and shutil.which(argv[0]) is None:
            raise SlurmCommandError(argv, "failed: command not found")
        try:
            return subprocess.run(argv, env=dict(self.env) if self.env is not None else None,
                                  capture_output=True, text=True, timeout=self.timeout,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmCommandError(argv, "failed: command not found") from None
        except PermissionError:
            raise SlurmCommandError(argv, "failed: permission denied") from None
        except subprocess.TimeoutExpired:
            raise SlurmCommandError(argv, f"timed out after {self.timeout:.0f} s") from None

    def _query(self, cmd: str, json_args: list[str], text_args: list[str]) -> tuple[str, str]:
        """Run a command, JSON first; returns (format, output)."""
        if self.prefer_json and self._json_ok.get(cmd, True):
            r = self._run([cmd, *json_args])
            if r.returncode == 0 and r.stdout.lstrip().startswith("{"):
                self._json_ok[cmd] = True
                return "json", r.stdout
            err = (r.stderr or r.stdout).strip()
            if r.returncode != 0 and not _NO_JSON.search(err):
                raise SlurmCommandError([cmd, *json_args],
                                        f"exited {r.returncode}: {_last_line(err)}",
                                        r.returncode, err)
            self._json_ok[cmd] = False
        r = self._run([cmd, *text_args])
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            raise SlurmCommandError([cmd, *text_args], f"exited {r.returncode}: {_last_line(err)}",
                                    r.returncode, err)
        return "text", r.stdout

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
        argv = [self.scontrol, "show", "job", "-o", str(job_id)]
        r = self._run(argv)
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            if "Invalid job id" in err:
                return None
            raise SlurmCommandError(argv, f"exited {r.returncode}: {_last_line(err)}",
                                    r.returncode, err)
        try:
            jobs = parse_scontrol_job(r.stdout)
        except ParseError as exc:
            raise exc.with_source(f"{self.scontrol} output") from None
        return jobs[0] if jobs else None


__all__ = [
    "SINFO_FORMAT", "SQUEUE_FORMAT", "SQUEUE_STATES", "JobHints", "SlurmCommandError", "SlurmJob",
    "SlurmWatcher", "detect_format", "expand_hostlist", "jobs_to_queue", "node_state",
    "parse_duration", "parse_gpu_tres", "parse_job_hints", "parse_local_time", "parse_node_gres",
    "parse_scontrol_fields", "parse_scontrol_job", "parse_sinfo", "parse_sinfo_json",
    "parse_sinfo_text", "parse_squeue", "parse_squeue_jobs_json", "parse_squeue_json",
    "parse_squeue_text", "parse_squeue_text_jobs",
]
