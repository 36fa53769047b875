"""The diagnosis' vocabulary: the :class:`Verdict`, the :class:`CauseKind` of each finding, which
kinds more capacity fixes, and the concrete action for each. Defined once; the diagnosis, the
trigger, the simulator and the API all use these.
"""
from __future__ import annotations

from enum import StrEnum

from policies.queue import NON_CAPACITY_REASONS


class Verdict(StrEnum):
    """Why the queue waits, in one word (the values are the words the CLI and JSON print)."""

    HEALTHY = "healthy"
    RESOURCE_BOUND = "resource-bound"
    SCHEDULING_BOUND = "scheduling-bound"
    MIXED = "mixed"

    @classmethod
    def parse(cls, value: str) -> "Verdict":
        """A verdict from its word; ValueError naming the known ones otherwise."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown verdict {value!r}; known: "
                             f"{', '.join(v.value for v in cls)}") from None


class CauseKind(StrEnum):
    """What holds waiting GPUs (or wastes allocated ones)."""

    DRAINED_NODES = "drained-nodes"
    DOWN_NODES = "down-nodes"
    FRAGMENTATION = "fragmentation"
    RESERVED_CAPACITY = "reserved-capacity"
    IDLE_ALLOCATED = "idle-allocated"
    HALF_ALLOCATED_GANG = "half-allocated-gang"
    PRIORITY = "priority"
    LIMITS = "limits"
    DEPENDENCY = "dependency"
    BEGIN_TIME = "begin-time"
    HELD = "held"
    UNAVAILABLE_NODES = "unavailable-nodes"
    JOB_CONFIG = "job-config"
    NO_ONPREM_FIT = "no-onprem-fit"
    CAPACITY = "capacity"
    OFFLOADABLE_WORK = "offloadable-work"
    NOT_INTERRUPTIBLE = "not-interruptible"
    NO_ONPREM_GPUS = "no-onprem-gpus"


K = CauseKind
# the causes more capacity fixes: their jobs are what a burst may send out
CAPACITY_CAUSES = (K.CAPACITY, K.NO_ONPREM_FIT)

# reason (first word of Slurm's pending reason) → cause kind, for reasons capacity cannot fix
_REASON_KIND = {
    "Priority": K.PRIORITY,
    "Dependency": K.DEPENDENCY, "DependencyNeverSatisfied": K.DEPENDENCY,
    "BeginTime": K.BEGIN_TIME,
    "JobHeldUser": K.HELD, "JobHeldAdmin": K.HELD, "launch failed requeued held": K.HELD,
    "ReqNodeNotAvail": K.UNAVAILABLE_NODES,
    "PartitionTimeLimit": K.JOB_CONFIG, "PartitionConfig": K.JOB_CONFIG,
    "QOSMaxWallDurationPerJobLimit": K.JOB_CONFIG, "BadConstraints": K.JOB_CONFIG,
    "PartitionNodeLimit": K.JOB_CONFIG, "InvalidQOS": K.JOB_CONFIG, "InvalidAccount": K.JOB_CONFIG,
}


def reason_head(reason: str) -> str:
    """A Slurm pending reason without the detail Slurm adds after a comma
    (``ReqNodeNotAvail, UnavailableNodes:gpu-[1-2]`` → ``ReqNodeNotAvail``)."""
    return (reason or "").split(",", 1)[0].strip()


def reason_kind(reason: str) -> CauseKind:
    """Slurm pending reason → cause kind (CAPACITY for Resources, None and the unknown)."""
    head = reason_head(reason)
    if head in _REASON_KIND:
        return _REASON_KIND[head]
    if head.startswith(("QOS", "Assoc", "MaxGRES", "MaxCpu", "MaxNode", "MaxMem")):
        return K.LIMITS
    if head in NON_CAPACITY_REASONS:
        return K.JOB_CONFIG
    return K.CAPACITY


def unavailable_nodes(reason: str) -> set[str]:
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
    """``gpu-[1-3,5]`` → names; each further bracket group is expanded the same way
    (``rack[1-2]-gpu[1-2]`` → rack1-gpu1, rack1-gpu2, rack2-gpu1, rack2-gpu2)."""
    if "[" not in part:
        return [part]
    pre, _, rest = part.partition("[")
    body, _, post = rest.partition("]")
    tails = _expand_simple(post)
    names: list[str] = []
    for r in body.split(","):
        lo, _, hi = r.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                names.extend(f"{pre}{i:0{width}d}{tail}" for tail in tails)
    return names


ACTIONS: dict[CauseKind, str] = {
    K.DRAINED_NODES: "Repair the drained nodes and return them to service "
                     "(`scontrol update nodename=NODES state=resume`).",
    K.DOWN_NODES: "Bring the down nodes back (check slurmd, network, hardware), then resume them.",
    K.FRAGMENTATION: "Right-size requests (fewer GPUs per node, no --exclusive unless needed) or "
                     "pack small jobs onto fewer nodes (e.g. SelectTypeParameters with "
                     "CR_Pack_Nodes) so whole nodes free up.",
    K.RESERVED_CAPACITY: "Give jobs realistic --time limits so backfill can start them in the "
                         "gaps held for larger jobs; check their CPU/memory requests too.",
    K.IDLE_ALLOCATED: "Right-size GPU requests, share GPUs (MIG or time-slicing) for light jobs, "
                      "and move tuning/eval/inference off the main training queue.",
    K.HALF_ALLOCATED_GANG: "Gang-schedule these jobs (submit them as one job or heterogeneous "
                           "job), or stop the started part until the rest can run.",
    K.PRIORITY: "Free GPUs are kept for higher-priority work: set --time limits so backfill can "
                "use them, or review fair-share/priority weights.",
    K.LIMITS: "These wait on QOS/association limits: raise the limits or accept the wait; more "
              "capacity will not start them.",
    K.DEPENDENCY: "These wait on other jobs (dependencies); more capacity will not start them.",
    K.BEGIN_TIME: "These are scheduled to start later (--begin); nothing to fix.",
    K.HELD: "These are held: release them (`scontrol release JOBID`) or cancel them.",
    K.UNAVAILABLE_NODES: "These require nodes that are unavailable (reserved, drained or down): "
                         "relax the node list or bring the nodes back.",
    K.JOB_CONFIG: "These can never start as submitted (partition or QOS limits, constraints): "
                  "fix the request.",
    K.NO_ONPREM_FIT: "No on-prem node can hold these: split the job or burst it to a cloud "
                     "shape that fits.",
    K.CAPACITY: "Burst the capacity-bound jobs to the cloud: interruptible ones to spot, the "
                "rest on-demand.",
    K.OFFLOADABLE_WORK: "Move tuning/eval/inference off the main queue (own partition with MIG or "
                        "time-sliced GPUs, or burst them): they are short and easy to place.",
    K.NOT_INTERRUPTIBLE: "Add checkpointing and mark these interruptible "
                         "(comment broker:interruptible=1,checkpoint=MIN) so they can join a "
                         "preemptible queue or run on spot.",
    K.NO_ONPREM_GPUS: "There are no on-prem GPUs: burst, or fix the node inventory.",
}

# the order causes are listed (and their actions given) under each verdict
CAPACITY_FIRST = (K.CAPACITY, K.NO_ONPREM_FIT, K.NO_ONPREM_GPUS, K.OFFLOADABLE_WORK,
                  K.NOT_INTERRUPTIBLE)
FIXABLE = (K.DRAINED_NODES, K.DOWN_NODES, K.FRAGMENTATION, K.IDLE_ALLOCATED,
           K.HALF_ALLOCATED_GANG, K.RESERVED_CAPACITY, K.PRIORITY, K.UNAVAILABLE_NODES,
           K.LIMITS, K.JOB_CONFIG)
INFORMATIONAL = (K.DEPENDENCY, K.HELD, K.BEGIN_TIME)
ORDER: dict[Verdict, tuple[CauseKind, ...]] = {
    Verdict.RESOURCE_BOUND: CAPACITY_FIRST + FIXABLE + INFORMATIONAL,
    Verdict.MIXED: FIXABLE[:5] + CAPACITY_FIRST + FIXABLE[5:] + INFORMATIONAL,
    Verdict.SCHEDULING_BOUND: FIXABLE + CAPACITY_FIRST + INFORMATIONAL,
    Verdict.HEALTHY: FIXABLE + CAPACITY_FIRST + INFORMATIONAL,
}

__all__ = ["ACTIONS", "CAPACITY_CAUSES", "ORDER", "CauseKind", "Verdict", "reason_head", "reason_kind", "unavailable_nodes"]
