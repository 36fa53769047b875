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
from itertools import chain
from operator import attrgetter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from policies.causes import (ACTIONS, CAPACITY_CAUSES, FIXABLE, ORDER, CauseKind, Verdict,
                             reason_kind, unavailable_nodes)
from policies.placement import Placer, Shape
from policies.queue import ClusterNode, GpuSample, PendingJob, QueueSnapshot

K = CauseKind
_ID, _GPUS, _WAITED = attrgetter("job_id"), attrgetter("gpus"), attrgetter("waited_s")

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
    kind: CauseKind
    summary: str
    jobs: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    action: str = ""
    gpus: int = 0  # GPUs involved (waiting, lost or idle)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["jobs"], d["nodes"] = list(self.jobs), list(self.nodes)
        return d


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
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
    # every job more capacity would start (CAPACITY_CAUSES), not cut at max_listed: under a
    # mixed verdict only these may burst
    capacity_jobs: frozenset[str] = field(default_factory=frozenset, compare=False)

    def cause(self, kind: CauseKind | str) -> Cause | None:
        return next((c for c in self.causes if c.kind == kind), None)

    def scheduling_causes(self, limit: int = 3) -> str:
        """Why the queue is scheduling-bound and what fixes it, in one paragraph: the first
        signal, the causes more capacity would not fix (drained nodes and their reasons,
        fragmentation, idle allocations, whole-node requests, …) and their actions."""
        fixable = [c for c in self.causes if c.kind in FIXABLE][:limit]
        text = "; ".join([*self.signals[:1], *(c.summary for c in fixable)])
        fixes = " ".join(dict.fromkeys(c.action for c in fixable))
        return text + (f". Fix: {fixes}" if fixes else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "allocation_rate": round(self.allocation_rate, 4),
            # a fraction 0..1, as allocation_rate and every other utilisation in the JSON
            "utilization": None if self.utilization is None else round(self.utilization / 100.0, 4),
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
def _persistent(history: Sequence[tuple[float, float]], current: float, now: float,
                cfg: DiagnoseConfig, below: float) -> bool:
    recent = [r for t, r in history if now - cfg.window_s <= t <= now]
    values = recent + [current]
    return sum(1 for r in values if r < below) >= cfg.persistence * len(values)


def _names(items: Iterable[str], cfg: DiagnoseConfig) -> tuple[str, ...]:
    """The first ``max_listed`` distinct names (reading no further than needed)."""
    if cfg.max_listed <= 0:
        return tuple(dict.fromkeys(items))[: cfg.max_listed]
    seen: dict[str, None] = {}
    for name in items:
        seen[name] = None
        if len(seen) >= cfg.max_listed:
            break
    return tuple(seen)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _gang_groups(snapshot: QueueSnapshot) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name, members in (snapshot.extra.get("gangs") or {}).items():
        groups[str(name)] = [str(m) for m in members]
    for job_id in chain(map(_ID, snapshot.pending), map(_ID, snapshot.running)):
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
# the phases of a diagnosis, in order
@dataclass
class _Cluster:
    """The on-prem GPUs as the diagnosis counts them (CLOUD nodes are burst capacity)."""

    onprem: tuple[ClusterNode, ...]
    total: int
    allocated: int
    free: int

    @classmethod
    def of(cls, snapshot: QueueSnapshot) -> "_Cluster":
        onprem = tuple(snapshot.onprem_nodes)
        return cls(onprem, sum(n.gpus_total for n in onprem),
                   sum(min(n.gpus_allocated, n.gpus_total) for n in onprem),
                   sum(n.gpus_free for n in onprem))

    @property
    def rate(self) -> float:
        return self.allocated / self.total if self.total else 0.0

    def names(self, state: str) -> set[str]:
        return {n.name for n in self.onprem if n.state == state}


def _check_history(history: Sequence[tuple[float, float]]) -> None:
    for i, item in enumerate(history):
        if len(item) != 2:
            raise ValueError(f"history[{i}] must be a (time, allocation_rate) pair")
        t, r = item
        if not (isinstance(r, (int, float)) and 0 <= r <= 1 and math.isfinite(float(t))):
            raise ValueError(f"history[{i}]: allocation rate must be within 0..1, got {r!r}")


def _attribute(gpu_jobs: Sequence[PendingJob], cluster: _Cluster
               ) -> dict[CauseKind, list[PendingJob]]:
    """Explain each waiting GPU job once, longest wait first (see the module doc)."""
    placer = Placer(cluster.onprem)
    down_names, drain_names = cluster.names("down"), cluster.names("drain")
    kinds: dict[str, CauseKind] = {}  # pending reason -> kind: a few reasons, 100,000 jobs
    final: dict[Shape, CauseKind] = {}  # job shape -> its cause once nothing can place it
    out: dict[CauseKind, list[PendingJob]] = {}
    for job in gpu_jobs:
        kind = kinds.get(job.pending_reason)
        if kind is None:
            kind = kinds[job.pending_reason] = _reason_kind(job.pending_reason, drain_names,
                                                            down_names)
        if kind not in (K.CAPACITY, K.PRIORITY):
            out.setdefault(kind, []).append(job)
            continue
        shape = placer.shape(job)
        if (settled := final.get(shape)) is not None:  # refused everywhere: stays so
            out.setdefault(settled, []).append(job)
            continue
        plan = placer.place(job, shape, placer.now)
        if plan is not None:
            placer.now.take(plan, floor=False)
            placer.if_up.take(plan, floor=True)
            out.setdefault(K.PRIORITY if kind == K.PRIORITY else K.RESERVED_CAPACITY, []).append(job)
        elif placer.free_now(job) >= job.gpus:
            out.setdefault(K.FRAGMENTATION, []).append(job)
        elif (plan_up := placer.place(job, shape, placer.if_up)) is not None:
            placer.if_up.take(plan_up, floor=True)
            which = (K.DRAINED_NODES if any(p[0] in drain_names for p in plan_up)
                     else K.DOWN_NODES)
            out.setdefault(which, []).append(job)
        else:
            # the tallies only shrink: this shape will never fit now, on enough free GPUs, or
            # with the drained and down nodes back, for any later job either
            final[shape] = K.CAPACITY if placer.fits_empty(job, shape) else K.NO_ONPREM_FIT
            out.setdefault(final[shape], []).append(job)
    return out


def _reason_kind(reason: str, drain_names: set[str], down_names: set[str]) -> CauseKind:
    kind = reason_kind(reason)
    if kind == K.UNAVAILABLE_NODES:
        names = unavailable_nodes(reason)
        if names & drain_names:
            kind = K.DRAINED_NODES
        elif names & down_names:
            kind = K.DOWN_NODES
    return kind


class _Causes(list[Cause]):
    """The causes found so far; ``add`` names jobs and nodes up to ``max_listed``."""

    def __init__(self, cfg: DiagnoseConfig, attributed: Mapping[CauseKind, list[PendingJob]]):
        super().__init__()
        self.cfg = cfg
        self.attributed = attributed

    def add(self, kind: CauseKind, summary: str, jobs: Iterable[str] = (),
            nodes: Iterable[str] = (), gpus: int = 0) -> None:
        self.append(Cause(kind, summary, _names(jobs, self.cfg), _names(nodes, self.cfg),
                          ACTIONS[kind], gpus))

    def jobs_gpus(self, kind: CauseKind) -> tuple[list[PendingJob], int]:
        """The jobs attributed to ``kind`` and their GPUs (``add`` names only the first few:
        pass ``map(_ID, jobs)``, not a list of every id)."""
        js = self.attributed.get(kind, [])
        return js, sum(map(_GPUS, js))


def _node_causes(causes: _Causes, cluster: _Cluster) -> None:
    """Drained and down nodes: facts about the cluster whether or not a job is blocked."""
    for kind, state, word in ((K.DRAINED_NODES, "drain", "drained"),
                              (K.DOWN_NODES, "down", "down")):
        bad = [n for n in cluster.onprem if n.state == state and n.gpus_total > 0]
        if not bad:
            continue
        lost = sum(max(0, n.gpus_total - n.gpus_allocated) for n in bad)
        reasons = "; ".join(f"{n.name}: {n.reason}" for n in bad if n.reason)
        jobs, jg = causes.jobs_gpus(kind)
        summary = (f"{_plural(len(bad), 'node')} {word} with {_plural(lost, 'GPU')} out of service"
                   + (f" ({reasons})" if reasons else "")
                   + (f"; {_plural(len(jobs), 'waiting job')} ({jg} GPUs) would run with them"
                      if jobs else ""))
        causes.add(kind, summary, map(_ID, jobs), [n.name for n in bad], lost)


def _fragmentation_cause(causes: _Causes, cluster: _Cluster) -> None:
    js = causes.attributed.get(K.FRAGMENTATION)
    if not js:
        return
    excl = [j for j in js if j.exclusive]
    frag_nodes = [n.name for n in cluster.onprem if n.gpus_free > 0]
    kinds = []
    if excl:
        kinds.append(f"{_plural(len(excl), 'whole-node (--exclusive) request')}")
    if len(js) > len(excl):
        kinds.append(f"{_plural(len(js) - len(excl), 'multi-GPU request')}")
    causes.add(K.FRAGMENTATION,
               f"{' and '.join(kinds)} ({sum(j.gpus for j in js)} GPUs) wait while "
               f"{cluster.free} GPUs are free, scattered over {_plural(len(frag_nodes), 'node')} "
               "none of which can hold them alone",
               map(_ID, js), frag_nodes, sum(j.gpus for j in js))


_WAITING = (
    (K.RESERVED_CAPACITY, "waiting although free GPUs would hold them (kept for larger "
                          "or higher-priority jobs, or the nodes' CPUs/memory are taken)"),
    (K.PRIORITY, "waiting behind higher-priority jobs although free GPUs would hold them"),
    (K.LIMITS, "waiting on QOS/association limits"),
    (K.DEPENDENCY, "waiting on other jobs (dependencies)"),
    (K.BEGIN_TIME, "not to start yet (begin time)"),
    (K.HELD, "held"),
    (K.UNAVAILABLE_NODES, "requiring nodes that are not available"),
    (K.JOB_CONFIG, "unable to start as submitted"),
    (K.NO_ONPREM_FIT, "larger than any on-prem node can hold"),
    (K.CAPACITY, "waiting for GPUs: every GPU that could hold them is allocated"),
)


def _waiting_causes(causes: _Causes) -> None:
    for kind, text in _WAITING:
        jobs, g = causes.jobs_gpus(kind)
        if jobs:
            causes.add(kind, f"{_plural(len(jobs), 'job')} ({_plural(g, 'GPU')}) {text}",
                       map(_ID, jobs), (), g)


def _idle_cause(causes: _Causes, cluster: _Cluster, snapshot: QueueSnapshot,
                node_util: Mapping[str, float]) -> int:
    """Allocated GPUs that run idle; returns how many."""
    cfg = causes.cfg
    idle_nodes = [n for n in cluster.onprem
                  if n.name in node_util and node_util[n.name] < cfg.idle_utilization_pct]
    if not idle_nodes:
        return 0
    idle_gpus = sum(n.gpus_allocated for n in idle_nodes)
    names = {n.name for n in idle_nodes}
    jobs = [r.job_id for r in snapshot.running if r.gpus > 0 and set(r.nodes) & names]
    detail = ", ".join(f"{n.name} {node_util[n.name]:.0f} %" for n in idle_nodes)
    causes.add(K.IDLE_ALLOCATED,
               f"{_plural(idle_gpus, 'allocated GPU')} on {_plural(len(idle_nodes), 'node')} "
               f"run under {cfg.idle_utilization_pct:.0f} % utilisation ({detail})",
               jobs, [n.name for n in idle_nodes], idle_gpus)
    return idle_gpus


def _gang_causes(causes: _Causes, snapshot: QueueSnapshot) -> int:
    """Gangs with some members running and others waiting; returns the GPUs they hold."""
    running_by_id = {r.job_id: r for r in snapshot.running}
    pending_ids = set(map(_ID, snapshot.pending))
    held_gpus = 0
    for gang, members in sorted(_gang_groups(snapshot).items()):
        run = [m for m in members if m in running_by_id]
        wait = [m for m in members if m in pending_ids]
        if run and wait:
            g = sum(running_by_id[m].gpus for m in run)
            held_gpus += g
            nodes = [n for m in run for n in running_by_id[m].nodes]
            causes.add(K.HALF_ALLOCATED_GANG,
                       f"gang {gang}: {_plural(len(run), 'member')} run holding {_plural(g, 'GPU')} "
                       f"while {_plural(len(wait), 'member')} wait",
                       run + wait, nodes, g)
    return held_gpus


@dataclass
class _Tally:
    """The numbers the verdict is read from."""

    waiting_gpus: int
    cap_gpus: int
    oldest_s: int
    waste: int  # allocated GPUs idle or held by half-started gangs
    gpu_jobs: int

    @property
    def sched_gpus(self) -> int:
        return self.waiting_gpus - self.cap_gpus


def _verdict(t: _Tally, cluster: _Cluster, persist_low: bool, history: bool,
             cfg: DiagnoseConfig) -> tuple[Verdict, list[str]]:
    """The verdict and the signals that gave it (the field rule of the module doc)."""
    total, rate = cluster.total, cluster.rate
    queue_floor = max(cfg.min_queue_gpus, cfg.queue_gpu_fraction * total)
    if not (t.gpu_jobs and (t.waiting_gpus >= queue_floor or t.oldest_s >= cfg.long_wait_s)):
        return Verdict.HEALTHY, [
            f"{_plural(t.gpu_jobs, 'GPU job')} ({t.waiting_gpus} GPUs) wait, "
            f"under the long-queue mark of {math.ceil(queue_floor)} GPUs"
            + (f", longest {t.oldest_s // 60} min" if t.gpu_jobs else "")]
    if total == 0:
        return Verdict.RESOURCE_BOUND, [f"{t.waiting_gpus} GPUs wait and there are no on-prem GPUs"]
    signals: list[str] = []
    resource = rate >= cfg.high_allocation and t.cap_gpus > 0
    sched_share = t.sched_gpus > 0 and t.sched_gpus >= cfg.scheduling_share * t.waiting_gpus
    wasteful = t.waste >= max(1.0, cfg.queue_gpu_fraction * total)
    if resource:
        signals.append(f"allocation {rate:.0%} >= {cfg.high_allocation:.0%} and "
                       f"{_plural(t.cap_gpus, 'GPU')} of demand wait for capacity")
    if persist_low:
        signals.append(f"allocation {rate:.0%} " + ("persistently " if history else "")
                       + f"under {cfg.low_allocation:.0%} with {t.waiting_gpus} GPUs waiting")
    if sched_share:
        signals.append(f"{t.sched_gpus} of {t.waiting_gpus} waiting GPUs are held up by "
                       "scheduling, not capacity")
    if wasteful:
        signals.append(f"{_plural(t.waste, 'allocated GPU')} idle or held by half-started gangs")
    scheduling = persist_low or sched_share or wasteful
    if resource and scheduling:
        return Verdict.MIXED, signals
    if resource:
        return Verdict.RESOURCE_BOUND, signals
    if scheduling:
        return Verdict.SCHEDULING_BOUND, signals
    # allocation between the marks: the waiting GPUs tell
    if min(t.cap_gpus, t.sched_gpus) >= 0.25 * t.waiting_gpus:
        verdict = Verdict.MIXED
    else:
        verdict = (Verdict.RESOURCE_BOUND if t.cap_gpus >= t.sched_gpus
                   else Verdict.SCHEDULING_BOUND)
    signals.append(f"allocation {rate:.0%} is between {cfg.low_allocation:.0%} and "
                   f"{cfg.high_allocation:.0%}; {t.cap_gpus} waiting GPUs need capacity, "
                   f"{t.sched_gpus} wait on scheduling")
    return verdict, signals


def _work_causes(causes: _Causes) -> None:
    """Capacity-bound work that should not be on the main queue, or could be interruptible."""
    cap_jobs = [j for k in CAPACITY_CAUSES for j in causes.attributed.get(k, [])]
    light = [j for j in cap_jobs if j.kind in ("tuning", "eval", "inference")]
    if light:
        causes.add(K.OFFLOADABLE_WORK,
                   f"{_plural(len(light), 'tuning/eval/inference job')} "
                   f"({_plural(sum(j.gpus for j in light), 'GPU')}) in the training queue "
                   "waiting for capacity",
                   map(_ID, light), (), sum(j.gpus for j in light))
    stuck = [j for j in cap_jobs if j.kind == "training" and not j.interruptible]
    if stuck:
        causes.add(K.NOT_INTERRUPTIBLE,
                   f"{_plural(len(stuck), 'training job')} "
                   f"({_plural(sum(j.gpus for j in stuck), 'GPU')}) waiting for capacity "
                   "cannot be preempted or run on spot (no interruptible/checkpoint hint)",
                   map(_ID, stuck), (), sum(j.gpus for j in stuck))


_HEALTHY_WORTH_SAYING = (K.DRAINED_NODES, K.DOWN_NODES, K.IDLE_ALLOCATED, K.HALF_ALLOCATED_GANG)


def _rank(causes: Sequence[Cause], verdict: Verdict, t: _Tally, cfg: DiagnoseConfig
          ) -> tuple[tuple[Cause, ...], tuple[str, ...]]:
    """The causes in the order that matters under ``verdict``, and the actions to take."""
    order = ORDER[verdict]
    ranked = sorted(causes, key=lambda c: (order.index(c.kind) if c.kind in order else len(order),
                                           -c.gpus))
    actions: list[str] = []
    if verdict == Verdict.HEALTHY:
        actions.append("Nothing to do now: the queue is short.")
    elif verdict == Verdict.SCHEDULING_BOUND:
        if t.sched_gpus >= cfg.scheduling_share * t.waiting_gpus:
            actions.append("Fix scheduling before buying capacity: bursting would not start "
                           "most of the waiting GPUs.")
        else:
            actions.append("Use the GPUs already there before buying more: allocation is low "
                           "while the queue is long.")
    for c in ranked:
        if verdict == Verdict.HEALTHY and c.kind not in _HEALTHY_WORTH_SAYING:
            continue
        if c.kind in CAPACITY_CAUSES and verdict == Verdict.SCHEDULING_BOUND:
            continue
        if c.action not in actions:
            actions.append(c.action)
    return tuple(ranked), tuple(actions)


# ---------------------------------------------------------------------------------------------
def diagnose(snapshot: QueueSnapshot, history: Sequence[tuple[float, float]] = (), *,
             now: float, thresholds: DiagnoseConfig = DiagnoseConfig()) -> Diagnosis:
    """Tell why ``snapshot``'s queue waits; ``history`` is (time, allocation rate 0..1) samples."""
    cfg = thresholds
    _check_history(history)
    cluster = _Cluster.of(snapshot)
    utilization, node_util = _allocated_utilization(cluster.onprem, snapshot.gpu_samples)
    # longest wait first, then by id: two stable sorts with C-level keys (100,000 jobs)
    gpu_jobs = sorted([j for j in snapshot.pending if j.gpus > 0], key=_ID)
    gpu_jobs.sort(key=_WAITED, reverse=True)
    attributed = _attribute(gpu_jobs, cluster)

    causes = _Causes(cfg, attributed)
    _node_causes(causes, cluster)
    _fragmentation_cause(causes, cluster)
    _waiting_causes(causes)
    idle_gpus = _idle_cause(causes, cluster, snapshot, node_util)
    held_gpus = _gang_causes(causes, snapshot)

    capacity_jobs = [j for k in CAPACITY_CAUSES for j in attributed.get(k, [])]
    tally = _Tally(waiting_gpus=sum(map(_GPUS, gpu_jobs)),
                   cap_gpus=sum(map(_GPUS, capacity_jobs)),
                   oldest_s=max(map(_WAITED, gpu_jobs), default=0),
                   waste=idle_gpus + held_gpus, gpu_jobs=len(gpu_jobs))
    persist_low = _persistent(history, cluster.rate, now, cfg, cfg.low_allocation)
    verdict, signals = _verdict(tally, cluster, persist_low, bool(history), cfg)
    if verdict != Verdict.HEALTHY and cluster.total == 0:
        causes.add(K.NO_ONPREM_GPUS, "no on-prem node has GPUs", map(_ID, gpu_jobs),
                   (), tally.waiting_gpus)
    if verdict in (Verdict.RESOURCE_BOUND, Verdict.MIXED):
        _work_causes(causes)
    ranked, actions = _rank(causes, verdict, tally, cfg)
    return Diagnosis(
        verdict=verdict, allocation_rate=cluster.rate, utilization=utilization,
        pending_gpus=snapshot.pending_gpus, causes=ranked, actions=actions,
        gpus_total=cluster.total, gpus_allocated=cluster.allocated, gpus_free=cluster.free,
        pending_jobs=len(snapshot.pending), signals=tuple(signals),
        capacity_jobs=frozenset(map(_ID, capacity_jobs)),
    )


__all__ = ["CAPACITY_CAUSES", "Cause", "CauseKind", "DiagnoseConfig", "Diagnosis", "Verdict",
           "diagnose", "reason_kind"]
