"""Slurm command output → queue records: ``squeue``/``sinfo`` (``--json`` or a fixed text format)
and ``scontrol show job``.

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
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from broker.slurm.records import (
    RUNNING_STATES, SINFO_FIELDS, SQUEUE_FIELDS, UNLIMITED_S, _NULLS, SlurmJob, _array_tasks, _count,
    expand_hostlist, jobs_to_queue, parse_duration, parse_gpu_tres, parse_local_time,
    parse_node_gres,
)
from broker.watchers import ParseError
from policies.queue import ClusterNode, PendingJob, RunningJob

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
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, (int, float)):
        if not (math.isfinite(value) and abs(value) <= 2 ** 53):  # no count, id or time of Slurm's
            raise ValueError(f"expected a number Slurm writes, got {value!r}"[:120])
        return float(value)
    raise ValueError(f"expected a number, got {value!r}"[:120])


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
        comment=_json_str(j.get("comment")), extra={"flags": flags}, qos=_json_str(j.get("qos"))[:64],
        priority=_priority(_json_number(j.get("priority"))),
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


def _priority(v: float | None) -> int:
    """Slurm's job priority as a whole number (0: none; bounded, as the store's integers)."""
    if v is None or not math.isfinite(v) or v <= 0:
        return 0
    return int(min(v, 2**31 - 1))


def parse_squeue_jobs_json(text: str) -> list[SlurmJob]:
    """Every job record of ``squeue --json`` (all states), pending array records expanded."""
    _, items = _load_json(text, "jobs", "squeue")
    jobs: list[SlurmJob] = []
    for i, j in enumerate(items):
        if not isinstance(j, dict):
            raise ParseError(f"jobs[{i}] is not an object", line=None)
        try:
            jobs.extend(_job_from_json(j))
        except (ValueError, TypeError, AttributeError) as exc:  # a field of a shape Slurm never writes
            jid = j.get("job_id")
            line = _line_of(text, rf'"job_id"\s*:\s*{re.escape(json.dumps(jid))}\s*[,}}]')
            raise ParseError(f"job {jid} (jobs[{i}]): {exc}", line=line) from None
    return jobs


def parse_squeue_json(text: str, now: float) -> tuple[list[PendingJob], list[RunningJob]]:
    """``squeue --json`` → (pending, running); finished jobs are dropped."""
    return jobs_to_queue(parse_squeue_jobs_json(text), now)[:2]


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
            more, parts = n.get("state_flags") or [], n.get("partitions") or []
            if isinstance(parts, str):
                parts = parts.split(",")
            if not isinstance(more, list) or not isinstance(parts, list):
                raise ValueError("state_flags and partitions must be lists of names")
            flags += [str(f).upper() for f in more]
            mapped = node_state(state, flags)
            node = _node(name, mapped, _json_str(n.get("gres")), _json_str(n.get("gres_used")),
                         [str(p) for p in parts], _json_str(n.get("reason")))
        except (ValueError, TypeError, AttributeError) as exc:
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
                extra={"fields": f}, qos=f.get("QOS", "")[:64],
                priority=_priority(float(f["Priority"]) if f.get("Priority", "").isdigit() else None),
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


def _not_empty(text: str, what: str) -> None:
    """Saved output that holds nothing is a mistake (a failed command, a truncated copy), not an
    empty queue: an empty queue is JSON with its empty list, or the text with its header line."""
    if not text.strip():
        raise ParseError(f"the {what} output is empty; an empty queue is `{what} --json` output "
                         f"with an empty list, or the text format with its header line")


def parse_squeue(text: str, now: float) -> tuple[list[PendingJob], list[RunningJob], dict]:
    """Saved ``squeue`` output in either format → (pending, running, extra); empty text is an
    error (see :func:`_not_empty`)."""
    _not_empty(text, "squeue")
    jobs = (parse_squeue_jobs_json(text) if detect_format(text) == "json"
            else parse_squeue_text_jobs(text))
    return jobs_to_queue(jobs, now)


def parse_sinfo(text: str) -> list[ClusterNode]:
    """Saved ``sinfo`` output in either format → nodes; empty text is an error."""
    _not_empty(text, "sinfo")
    return parse_sinfo_json(text) if detect_format(text) == "json" else parse_sinfo_text(text)
