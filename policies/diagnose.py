"""Why does the queue wait? Resource-bound, scheduling-bound, mixed, or healthy — and what to do.

Pure: a function of a :class:`~policies.queue.QueueSnapshot`, an allocation-rate history and
``now``; no clock, no I/O.

The field rule
--------------
* **scheduling-bound** — GPUs sit unused while jobs wait: allocation persistently under ~70 %
  with a long queue, or most waiting GPUs are held up by things more capacity would not fix
  (drained/down nodes, fragmentation, reasons like Dependency/QOS limits/held), or a sizeable
  share of the allocated GPUs is idle or held by half-started gangs.
* **resource-bound** — allocation high (>= ~90 %) and jobs wait that no free GPU could take.
* **mixed** — both signs at once (typically: allocation high, but many allocated GPUs idle).
* **healthy** — little waits.

What counts
-----------
* Allocation rate: allocated / total GPUs of the on-prem nodes (CLOUD nodes are burst capacity,
  not counted); drained and down nodes stay in the total — their GPUs are what the queue loses.
* Utilisation: mean ``utilization.gpu`` of *allocated* GPUs. Samples carry no allocation, so on
  a partly allocated node the busiest ``gpus_allocated`` samples are taken (an upper bound, so an
  "idle" finding is never an artefact of unallocated GPUs). None when there are no samples.
* A queue is *long* when the waiting GPU jobs ask for at least ``queue_gpu_fraction`` of the
  on-prem GPUs (and at least ``min_queue_gpus``), or one of them has waited ``long_wait_s``.
* Each waiting GPU job is explained once, in priority order (longest wait first), against a
  running tally of free GPUs so two jobs never claim the same GPU:
  its reason is one capacity cannot fix (``NON_CAPACITY_REASONS`` — Priority only when free GPUs
  would hold the job, otherwise it is just a place in a full queue) → that cause; else it fits
  the free GPUs now → ``reserved-capacity`` (the scheduler keeps them for others); else enough
  GPUs are free but scattered → ``fragmentation``; else it would fit if drained/down nodes were
  back → ``drained-nodes``/``down-nodes``; else no on-prem node could ever hold it →
  ``no-onprem-fit``; else → ``capacity``.
* "Persistently": of the history samples within ``window_s`` before ``now`` plus the current
  value, at least ``persistence`` of them are under ``low_allocation``. With no history the
  current value decides alone.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from policies.queue import NON_CAPACITY_REASONS, ClusterNode, GpuSample, PendingJob, QueueSnapshot

VERDICTS = ("healthy", "resource-bound", "scheduling-bound", "mixed")

# reason (first word of Slurm's pending reason) → cause kind, for reasons capacity cannot fix
_REASON_KIND = {
    "Priority": "priority",
    "Dependency": "dependency", "DependencyNeverSatisfied": "dependency",
    "BeginTime": "begin-time",
    "JobHeldUser": "held", "JobHeldAdmin": "held", "launch failed requeued held": "held",
    "ReqNodeNotAvail": "unavailable-nodes",
    "PartitionTimeLimit": "job-config", "PartitionConfig": "job-config",
    "QOSMaxWallDurationPerJobLimit": "job-config", "BadConstraints": "job-config",
    "PartitionNodeLimit": "job-config", "InvalidQOS": "job-config", "InvalidAccount": "job-config",
}
CAPACITY_CAUSES = ("capacity", "no-onprem-fit")

_ACTIONS = {
    "drained-nodes": "Repair the drained nodes and return them to service "
                     "(`scontrol update nodename=NODES state=resume`).",
    "down-nodes": "Bring the down nodes back (check slurmd, network, hardware), then resume them.",
    "fragmentation": "Right-size requests (fewer GPUs per node, no --exclusive unless needed) or "
                     "pack small jobs onto fewer nodes (e.g. SelectTypeParameters with "
                     "CR_Pack_Nodes) so whole nodes free up.",
    "reserved-capacity": "Give jobs realistic --time limits so backfill can start them in the "
                         "gaps held for larger jobs; check their CPU/memory requests too.",
    "idle-allocated": "Right-size GPU requests, share GPUs (MIG or time-slicing) for light jobs, "
                      "and move tuning/eval/inference off the main training queue.",
    "half-allocated-gang": "Gang-schedule these jobs (submit them as one job or heterogeneous "
                           "job), or stop the started part until the rest can run.",
    "priority": "Free GPUs are kept for higher-priority work: set --time limits so backfill can "
                "use them, or review fair-share/priority weights.",
    "limits": "These wait on QOS/association limits: raise the limits or accept the wait; more "
              "capacity will not start them.",
    "dependency": "These wait on other jobs (dependencies); more capacity will not start them.",
    "begin-time": "These are scheduled to start later (--begin); nothing to fix.",
    "held": "These are held: release them (`scontrol release JOBID`) or cancel them.",
    "unavailable-nodes": "These require nodes that are unavailable (reserved, drained or down): "
                         "relax the node list or bring the nodes back.",
    "job-config": "These can never start as submitted (partition or QOS limits, constraints): "
                  "fix the request.",
    "no-onprem-fit": "No on-prem node can hold these: split the job or burst it to a cloud "
                     "shape that fits.",
    "capacity": "Burst the capacity-bound jobs to the cloud: interruptible ones to spot, the "
                "rest on-demand.",
    "offloadable-work": "Move tuning/eval/inference off the main queue (own partition with MIG or "
                        "time-sliced GPUs, or burst them): they are short and easy to place.",
    "not-interruptible": "Add checkpointing and mark these interruptible "
                         "(comment broker:interruptible=1,checkpoint=MIN) so they can join a "
                         "preemptible queue or run on spot.",
    "no-onprem-gpus": "There are no on-prem GPUs: burst, or fix the node inventory.",
}


@dataclass(frozen=True)
class DiagnoseConfig:
    low_allocation: float = 0.70
    high_allocation: float = 0.90
    idle_utilization_pct: float = 30.0
    window_s: float = 3600.0
    persistence: float = 0.8
    long_wait_s: float = 900.0
    queue_gpu_fraction: float = 0.10
    min_queue_gpus: int = 1
    scheduling_share: float = 0.5
    max_listed: int = 50  # jobs/nodes named per cause (the count is always complete)

    def __post_init__(self) -> None:
        for name in ("low_allocation", "high_allocation", "persistence", "queue_gpu_fraction",
                     "scheduling_share"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v <= 1):
                raise ValueError(f"{name} must be between 0 and 1, got {v!r}")
        if self.low_allocation > self.high_allocation:
            raise ValueError("low_allocation must not exceed high_allocation")
        if not 0 <= self.idle_utilization_pct <= 100:
            raise ValueError("idle_utilization_pct must be between 0 and 100")
        if self.window_s < 0 or self.long_wait_s < 0 or self.min_queue_gpus < 0:
            raise ValueError("window_s, long_wait_s and min_queue_gpus must not be negative")


@dataclass(frozen=True)
class Cause:
    kind: str
    summary: str
    jobs: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    action: str = ""
    gpus: int = 0  # GPUs involved (waiting, lost or idle)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["jobs"], d["nodes"] = list(self.jobs), list(self.nodes)
        return d


@dataclass(frozen=True)
class Diagnosis:
    verdict: str
    allocation_rate: float
    utilization: float | None
    pending_gpus: int
    causes: tuple[Cause, ...] = ()
    actions: tuple[str, ...] = ()
    gpus_total: int = 0
    gpus_allocated: int = 0
    gpus_free: int = 0
    pending_jobs: int = 0
    signals: tuple[str, ...] = ()  # why this verdict, in plain words

    def cause(self, kind: str) -> Cause | None:
        return next((c for c in self.causes if c.kind == kind), None)

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "allocation_rate": round(self.allocation_rate, 4),
            "utilization": None if self.utilization is None else round(self.utilization, 2),
            "pending_gpus": self.pending_gpus,
            "pending_jobs": self.pending_jobs,
            "gpus_total": self.gpus_total,
            "gpus_allocated": self.gpus_allocated,
            "gpus_free": self.gpus_free,
            "signals": list(self.signals),
            "causes": [c.to_dict() for c in self.causes],
            "actions": list(self.actions),
        }


# ---------------------------------------------------------------------------------------------
def reason_kind(reason: str) -> str:
    """Slurm pending reason → cause kind ("capacity" for Resources, None and the unknown)."""
    head = (reason or "").split(",")[0].strip()
    if head in _REASON_KIND:
        return _REASON_KIND[head]
    if head.startswith(("QOS", "Assoc", "MaxGRES", "MaxCpu", "MaxNode", "MaxMem")):
        return "limits"
    if head in NON_CAPACITY_REASONS:
        return "job-config"
    return "capacity"


def _unavailable_nodes(reason: str) -> set[str]:
    """``ReqNodeNotAvail, UnavailableNodes:gpu-[2-3]`` → {gpu-2, gpu-3} (plain names only)."""
    _, sep, tail = (reason or "").partition("UnavailableNodes:")
    if not sep:
        return set()
    names: set[str] = set()
    for part in _split_hostlist(tail.strip()):
        names.update(_expand_simple(part))
    return names


def _split_hostlist(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in (*out, cur) if p]


def _expand_simple(part: str) -> list[str]:
    """``gpu-[1-3,5]`` → names (one bracket group; enough for reason strings, no I/O library)."""
    if "[" not in part:
        return [part]
    pre, _, rest = part.partition("[")
    body, _, post = rest.partition("]")
    names = []
    for r in body.split(","):
        lo, _, hi = r.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{pre}{i:0{width}d}{post}")
    return names


def _eligible(job: PendingJob, node: ClusterNode) -> bool:
    if node.gpus_total <= 0:
        return False
    if job.queue and node.partitions:
        if not set(job.queue.split(",")) & set(node.partitions):
            return False
    if job.gpu_model and node.gpu_model and job.gpu_model.lower() != node.gpu_model.lower():
        return False
    return True


def _place(job: PendingJob, free: dict[str, int], whole: dict[str, bool],
           nodes: Sequence[ClusterNode]) -> list[tuple[str, int]] | None:
    """Where the job would go on ``free`` GPUs (``whole``: node has nothing running), or None."""
    elig = [n for n in nodes if _eligible(job, n)]
    if job.nodes <= 0 and not job.exclusive:
        # scheduler's choice of node count: any spread
        if sum(free.get(n.name, 0) for n in elig) < job.gpus:
            return None
        left, plan = job.gpus, []
        for n in sorted(elig, key=lambda n: -free.get(n.name, 0)):
            take = min(left, free.get(n.name, 0))
            if take:
                plan.append((n.name, take))
                left -= take
            if not left:
                break
        return plan
    count = max(job.nodes, 1)
    per = math.ceil(job.gpus / count)
    if job.exclusive:
        cands = [n for n in elig if whole.get(n.name) and free.get(n.name, 0) >= per]
        take_all = True
    else:
        cands = [n for n in elig if free.get(n.name, 0) >= per]
        take_all = False
    if len(cands) < count:
        return None
    cands.sort(key=lambda n: free.get(n.name, 0))  # best fit first
    return [(n.name, free[n.name] if take_all else per) for n in cands[:count]]


def _persistent(history: Sequence[tuple[float, float]], current: float, now: float,
                cfg: DiagnoseConfig, below: float) -> bool:
    recent = [r for t, r in history if now - cfg.window_s <= t <= now]
    values = recent + [current]
    return sum(1 for r in values if r < below) >= cfg.persistence * len(values)


def _names(items: Iterable[str], cfg: DiagnoseConfig) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))[: cfg.max_listed]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _gang_groups(snapshot: QueueSnapshot) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, members in (snapshot.extra.get("gangs") or {}).items():
        groups[str(name)] = [str(m) for m in members]
    for job_id in [j.job_id for j in snapshot.pending] + [j.job_id for j in snapshot.running]:
        if "+" in job_id:  # Slurm heterogeneous job component
            groups.setdefault(f"het:{job_id.split('+')[0]}", []).append(job_id)
    return groups


def _allocated_utilization(nodes: Sequence[ClusterNode], samples: Sequence[GpuSample]
                           ) -> tuple[float | None, dict[str, float]]:
    by_node: dict[str, list[float]] = {}
    for s in samples:
        by_node.setdefault(s.node, []).append(s.utilization_pct)
    per_node: dict[str, float] = {}
    chosen: list[float] = []
    for n in nodes:
        vals = by_node.get(n.name)
        if not vals or n.gpus_allocated <= 0:
            continue
        top = sorted(vals, reverse=True)[: n.gpus_allocated]
        per_node[n.name] = sum(top) / len(top)
        chosen.extend(top)
    known = {n.name for n in nodes}
    unplaced = [v for name, vals in by_node.items() if name not in known for v in vals]
    if not chosen and unplaced:  # samples without a node we know: a cluster-wide mean
        chosen = unplaced
    return (sum(chosen) / len(chosen) if chosen else None), per_node


# ---------------------------------------------------------------------------------------------
def diagnose(snapshot: QueueSnapshot, history: Sequence[tuple[float, float]] = (), *,
             now: float, thresholds: DiagnoseConfig = DiagnoseConfig()) -> Diagnosis:
    """Tell why ``snapshot``'s queue waits; ``history`` is (time, allocation rate 0..1) samples."""
    cfg = thresholds
    for i, item in enumerate(history):
        if len(item) != 2:
            raise ValueError(f"history[{i}] must be a (time, allocation_rate) pair")
        t, r = item
        if not (isinstance(r, (int, float)) and 0 <= r <= 1 and math.isfinite(float(t))):
            raise ValueError(f"history[{i}]: allocation rate must be within 0..1, got {r!r}")

    onprem = snapshot.onprem_nodes
    total = sum(n.gpus_total for n in onprem)
    allocated = sum(min(n.gpus_allocated, n.gpus_total) for n in onprem)
    rate = allocated / total if total else 0.0
    gpus_free = sum(n.gpus_free for n in onprem)
    utilization, node_util = _allocated_utilization(onprem, snapshot.gpu_samples)

    gpu_jobs = sorted((j for j in snapshot.pending if j.gpus > 0),
                      key=lambda j: (-j.waited_s, j.job_id))
    free = {n.name: n.gpus_free for n in onprem}
    whole = {n.name: n.state == "idle" and n.gpus_allocated == 0 for n in onprem}
    # the same picture with drained/down nodes back in service (their unallocated GPUs free)
    free_if_up = dict(free)
    whole_if_up = dict(whole)
    for n in onprem:
        if n.state in ("drain", "down"):
            free_if_up[n.name] = max(0, n.gpus_total - n.gpus_allocated)
            whole_if_up[n.name] = n.gpus_allocated == 0
    empty = {n.name: n.gpus_total for n in onprem}
    all_whole = {n.name: True for n in onprem}
    down_names = {n.name for n in onprem if n.state == "down"}
    drain_names = {n.name for n in onprem if n.state == "drain"}

    attributed: dict[str, list[PendingJob]] = {}
    node_blocked: dict[str, list[str]] = {"drained-nodes": [], "down-nodes": []}
    for job in gpu_jobs:
        kind = reason_kind(job.pending_reason)
        if kind == "unavailable-nodes":
            names = _unavailable_nodes(job.pending_reason)
            if names & drain_names:
                node_blocked["drained-nodes"].append(job.job_id)
                attributed.setdefault("drained-nodes", []).append(job)
                continue
            if names & down_names:
                node_blocked["down-nodes"].append(job.job_id)
                attributed.setdefault("down-nodes", []).append(job)
                continue
        if kind not in ("capacity", "priority"):
            attributed.setdefault(kind, []).append(job)
            continue
        plan = _place(job, free, whole, onprem)
        if plan is not None:
            for name, g in plan:  # claim them, so later jobs do not count the same GPUs
                free[name] -= g
                whole[name] = False
                free_if_up[name] = max(0, free_if_up[name] - g)
                whole_if_up[name] = False
            attributed.setdefault("priority" if kind == "priority" else "reserved-capacity",
                                  []).append(job)
            continue
        elig_free = sum(free[n.name] for n in onprem if _eligible(job, n))
        if elig_free >= job.gpus:
            attributed.setdefault("fragmentation", []).append(job)
            continue
        plan_up = _place(job, free_if_up, whole_if_up, onprem)
        if plan_up is not None:
            for name, g in plan_up:
                free_if_up[name] -= g
                whole_if_up[name] = False
            which = "drained-nodes" if any(p[0] in drain_names for p in plan_up) else "down-nodes"
            node_blocked[which].append(job.job_id)
            attributed.setdefault(which, []).append(job)
            continue
        if _place(job, empty, all_whole, onprem) is None:
            attributed.setdefault("no-onprem-fit", []).append(job)
            continue
        attributed.setdefault("capacity", []).append(job)

    causes: list[Cause] = []

    def add(kind: str, summary: str, jobs: Iterable[str] = (), nodes: Iterable[str] = (),
            gpus: int = 0) -> None:
        causes.append(Cause(kind, summary, _names(jobs, cfg), _names(nodes, cfg),
                            _ACTIONS[kind], gpus))

    def jobs_gpus(kind: str) -> tuple[list[str], int]:
        js = attributed.get(kind, [])
        return [j.job_id for j in js], sum(j.gpus for j in js)

    # unavailable nodes first: they are facts about the cluster whether or not a job is blocked
    for kind, state, word in (("drained-nodes", "drain", "drained"), ("down-nodes", "down", "down")):
        bad = [n for n in onprem if n.state == state and n.gpus_total > 0]
        if not bad:
            continue
        lost = sum(max(0, n.gpus_total - n.gpus_allocated) for n in bad)
        reasons = "; ".join(f"{n.name}: {n.reason}" for n in bad if n.reason)
        jobs, jg = jobs_gpus(kind)
        summary = (f"{_plural(len(bad), 'node')} {word} with {_plural(lost, 'GPU')} out of service"
                   + (f" ({reasons})" if reasons else "")
                   + (f"; {_plural(len(jobs), 'waiting job')} ({jg} GPUs) would run with them"
                      if jobs else ""))
        add(kind, summary, jobs, [n.name for n in bad], lost)

    if "fragmentation" in attributed:
        js = attributed["fragmentation"]
        excl = [j for j in js if j.exclusive]
        frag_nodes = [n.name for n in onprem if n.gpus_free > 0]
        kinds = []
        if excl:
            kinds.append(f"{_plural(len(excl), 'whole-node (--exclusive) request')}")
        if len(js) > len(excl):
            kinds.append(f"{_plural(len(js) - len(excl), 'multi-GPU request')}")
        add("fragmentation",
            f"{' and '.join(kinds)} ({sum(j.gpus for j in js)} GPUs) wait while "
            f"{gpus_free} GPUs are free, scattered over {_plural(len(frag_nodes), 'node')} "
            "none of which can hold them alone",
            [j.job_id for j in js], frag_nodes, sum(j.gpus for j in js))

    for kind, text in (
            ("reserved-capacity", "waiting although free GPUs would hold them (kept for larger "
                                  "or higher-priority jobs, or the nodes' CPUs/memory are taken)"),
            ("priority", "waiting behind higher-priority jobs although free GPUs would hold them"),
            ("limits", "waiting on QOS/association limits"),
            ("dependency", "waiting on other jobs (dependencies)"),
            ("begin-time", "not to start yet (begin time)"),
            ("held", "held"),
            ("unavailable-nodes", "requiring nodes that are not available"),
            ("job-config", "unable to start as submitted"),
            ("no-onprem-fit", "larger than any on-prem node can hold"),
            ("capacity", "waiting for GPUs: every GPU that could hold them is allocated")):
        jobs, g = jobs_gpus(kind)
        if jobs:
            add(kind, f"{_plural(len(jobs), 'job')} ({_plural(g, 'GPU')}) {text}", jobs, (), g)

    # allocated but idle
    idle_nodes = [n for n in onprem
                  if n.name in node_util and node_util[n.name] < cfg.idle_utilization_pct]
    idle_gpus = sum(n.gpus_allocated for n in idle_nodes)
    if idle_nodes:
        names = {n.name for n in idle_nodes}
        jobs = [r.job_id for r in snapshot.running if r.gpus > 0 and set(r.nodes) & names]
        detail = ", ".join(f"{n.name} {node_util[n.name]:.0f} %" for n in idle_nodes)
        add("idle-allocated",
            f"{_plural(idle_gpus, 'allocated GPU')} on {_plural(len(idle_nodes), 'node')} "
            f"run under {cfg.idle_utilization_pct:.0f} % utilisation ({detail})",
            jobs, [n.name for n in idle_nodes], idle_gpus)

    # half-allocated gangs
    running_by_id = {r.job_id: r for r in snapshot.running}
    pending_ids = {j.job_id for j in snapshot.pending}
    held_gpus = 0
    for gang, members in sorted(_gang_groups(snapshot).items()):
        run = [m for m in members if m in running_by_id]
        wait = [m for m in members if m in pending_ids]
        if run and wait:
            g = sum(running_by_id[m].gpus for m in run)
            held_gpus += g
            nodes = [n for m in run for n in running_by_id[m].nodes]
            add("half-allocated-gang",
                f"gang {gang}: {_plural(len(run), 'member')} run holding {_plural(g, 'GPU')} "
                f"while {_plural(len(wait), 'member')} wait",
                run + wait, nodes, g)

    # ---------------------------------------------------------------- verdict
    waiting_gpus = sum(j.gpus for j in gpu_jobs)
    cap_gpus = sum(j.gpus for k in CAPACITY_CAUSES for j in attributed.get(k, []))
    sched_gpus = waiting_gpus - cap_gpus
    oldest = max((j.waited_s for j in gpu_jobs), default=0)
    queue_floor = max(cfg.min_queue_gpus, cfg.queue_gpu_fraction * total)
    long_queue = bool(gpu_jobs) and (waiting_gpus >= queue_floor or oldest >= cfg.long_wait_s)
    persist_low = _persistent(history, rate, now, cfg, cfg.low_allocation)
    waste = idle_gpus + held_gpus
    signals: list[str] = []

    if not long_queue:
        verdict = "healthy"
        signals.append(f"{_plural(len(gpu_jobs), 'GPU job')} ({waiting_gpus} GPUs) wait, "
                       f"under the long-queue mark of {math.ceil(queue_floor)} GPUs"
                       + (f", longest {oldest // 60} min" if gpu_jobs else ""))
    elif total == 0:
        verdict = "resource-bound"
        signals.append(f"{waiting_gpus} GPUs wait and there are no on-prem GPUs")
        add("no-onprem-gpus", "no on-prem node has GPUs", [j.job_id for j in gpu_jobs], (),
            waiting_gpus)
    else:
        resource = rate >= cfg.high_allocation and cap_gpus > 0
        scheduling = (persist_low
                      or (sched_gpus > 0 and sched_gpus >= cfg.scheduling_share * waiting_gpus)
                      or waste >= max(1.0, cfg.queue_gpu_fraction * total))
        if resource:
            signals.append(f"allocation {rate:.0%} >= {cfg.high_allocation:.0%} and "
                           f"{_plural(cap_gpus, 'GPU')} of demand wait for capacity")
        if persist_low:
            signals.append(f"allocation {rate:.0%} "
                           + ("persistently " if history else "")
                           + f"under {cfg.low_allocation:.0%} with {waiting_gpus} GPUs waiting")
        if sched_gpus > 0 and sched_gpus >= cfg.scheduling_share * waiting_gpus:
            signals.append(f"{sched_gpus} of {waiting_gpus} waiting GPUs are held up by "
                           "scheduling, not capacity")
        if waste >= max(1.0, cfg.queue_gpu_fraction * total):
            signals.append(f"{_plural(waste, 'allocated GPU')} idle or held by half-started gangs")
        if resource and scheduling:
            verdict = "mixed"
        elif resource:
            verdict = "resource-bound"
        elif scheduling:
            verdict = "scheduling-bound"
        else:
            # allocation between the marks: the waiting GPUs tell
            if min(cap_gpus, sched_gpus) >= 0.25 * waiting_gpus:
                verdict = "mixed"
            else:
                verdict = "resource-bound" if cap_gpus >= sched_gpus else "scheduling-bound"
            signals.append(f"allocation {rate:.0%} is between {cfg.low_allocation:.0%} and "
                           f"{cfg.high_allocation:.0%}; {cap_gpus} waiting GPUs need capacity, "
                           f"{sched_gpus} wait on scheduling")

    # work that should not be on the main queue / could be interruptible
    if verdict in ("resource-bound", "mixed"):
        cap_jobs = [j for k in CAPACITY_CAUSES for j in attributed.get(k, [])]
        light = [j for j in cap_jobs if j.kind in ("tuning", "eval", "inference")]
        if light:
            add("offloadable-work",
                f"{_plural(len(light), 'tuning/eval/inference job')} "
                f"({_plural(sum(j.gpus for j in light), 'GPU')}) in the training queue "
                "waiting for capacity",
                [j.job_id for j in light], (), sum(j.gpus for j in light))
        stuck = [j for j in cap_jobs if j.kind == "training" and not j.interruptible]
        if stuck:
            add("not-interruptible",
                f"{_plural(len(stuck), 'training job')} "
                f"({_plural(sum(j.gpus for j in stuck), 'GPU')}) waiting for capacity "
                "cannot be preempted or run on spot (no interruptible/checkpoint hint)",
                [j.job_id for j in stuck], (), sum(j.gpus for j in stuck))

    capacity_first = ("capacity", "no-onprem-fit", "no-onprem-gpus", "offloadable-work",
                      "not-interruptible")
    fixable = ("drained-nodes", "down-nodes", "fragmentation", "idle-allocated",
               "half-allocated-gang", "reserved-capacity", "priority", "unavailable-nodes",
               "limits", "job-config")
    informational = ("dependency", "held", "begin-time")
    order = {"resource-bound": capacity_first + fixable + informational,
             "mixed": fixable[:5] + capacity_first + fixable[5:] + informational,
             }.get(verdict, fixable + capacity_first + informational)
    ranked = sorted(causes, key=lambda c: (order.index(c.kind) if c.kind in order else len(order),
                                           -c.gpus))
    actions: list[str] = []
    if verdict == "healthy":
        actions.append("Nothing to do now: the queue is short.")
    elif verdict == "scheduling-bound":
        if sched_gpus >= cfg.scheduling_share * waiting_gpus:
            actions.append("Fix scheduling before buying capacity: bursting would not start "
                           "most of the waiting GPUs.")
        else:
            actions.append("Use the GPUs already there before buying more: allocation is low "
                           "while the queue is long.")
    for c in ranked:
        if verdict == "healthy" and c.kind not in ("drained-nodes", "down-nodes", "idle-allocated",
                                                   "half-allocated-gang"):
            continue
        if c.kind in CAPACITY_CAUSES and verdict == "scheduling-bound":
            continue
        if c.action not in actions:
            actions.append(c.action)
    return Diagnosis(
        verdict=verdict, allocation_rate=rate, utilization=utilization,
        pending_gpus=snapshot.pending_gpus, causes=tuple(ranked), actions=tuple(actions),
        gpus_total=total, gpus_allocated=allocated, gpus_free=gpus_free,
        pending_jobs=len(snapshot.pending), signals=tuple(signals),
    )


__all__ = ["CAPACITY_CAUSES", "VERDICTS", "Cause", "DiagnoseConfig", "Diagnosis", "diagnose",
           "reason_kind"]
