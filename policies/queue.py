"""QueueSnapshot: one model of a scheduler's queue for every source (Slurm, ReportQueue, traces).

Plain frozen dataclasses so policies stay pure and the simulator can build thousands cheaply.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

JOB_KINDS = ("training", "tuning", "eval", "inference")
NODE_STATES = ("idle", "alloc", "mix", "drain", "down", "cloud")
_GPUS = attrgetter("gpus")
# Pending reasons that more capacity does not fix (Slurm's names; other schedulers map onto them).
NON_CAPACITY_REASONS = (
    "Priority", "QOSMaxGRESPerUser", "QOSMaxJobsPerUserLimit", "QOSMaxCpuPerUserLimit",
    "AssocGrpGRES", "AssocMaxJobsLimit", "AssocGrpCpuLimit", "QOSGrpGRES", "Dependency",
    "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin", "ReqNodeNotAvail",
    "PartitionTimeLimit", "PartitionConfig", "QOSMaxWallDurationPerJobLimit",
)


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    gpus: int
    user: str = ""
    queue: str = ""  # partition / queue / virtual cluster
    gpu_model: str = ""
    min_gpu_memory_gb: int = 0
    nodes: int = 0  # 0 = scheduler's choice
    time_limit_s: int = 0
    est_runtime_s: int = 0  # expected runtime (falls back to time_limit_s)
    waited_s: int = 0
    pending_reason: str = ""
    interruptible: bool = False
    checkpoint_minutes: int = 0
    data_gb: float = 0.0
    kind: str = "training"
    exclusive: bool = False  # whole-node request
    job_class: str = ""  # the scheduler's or submitter's class label (policies.classes)
    qos: str = ""
    priority: int = 0  # the scheduler's numeric priority (0: it says none)

    @property
    def runtime_s(self) -> int:
        return self.est_runtime_s or self.time_limit_s


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: str
    gpus: int
    user: str = ""
    queue: str = ""
    nodes: tuple[str, ...] = ()
    runtime_s: int = 0  # how long it has run so far
    time_limit_s: int = 0  # 0: the scheduler reports none
    est_runtime_s: int = 0  # expected total runtime (falls back to time_limit_s)

    @property
    def remaining_s(self) -> int | None:
        """Expected seconds left (start + runtime or limit, less now); None: not reported."""
        total = self.est_runtime_s or self.time_limit_s
        return max(0, total - self.runtime_s) if total > 0 else None


@dataclass(frozen=True, slots=True)
class ClusterNode:
    name: str
    state: str  # one of NODE_STATES
    gpus_total: int
    gpus_allocated: int = 0
    gpu_model: str = ""
    partitions: tuple[str, ...] = ()
    reason: str = ""  # drain/down reason

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_allocated) if self.state in ("idle", "mix") else 0


@dataclass(frozen=True, slots=True)
class GpuSample:
    node: str
    index: int
    utilization_pct: float
    memory_used_mb: float = 0.0


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    source: str
    taken_at: float  # epoch seconds
    pending: tuple[PendingJob, ...] = ()
    nodes: tuple[ClusterNode, ...] = ()
    gpu_samples: tuple[GpuSample, ...] = ()
    running: tuple[RunningJob, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def pending_gpus(self) -> int:
        return sum(map(_GPUS, self.pending))

    @property
    def onprem_nodes(self) -> tuple[ClusterNode, ...]:
        return tuple(n for n in self.nodes if n.state != "cloud")

    @property
    def gpus_total(self) -> int:
        return sum(n.gpus_total for n in self.onprem_nodes)

    @property
    def gpus_allocated(self) -> int:
        return sum(n.gpus_allocated for n in self.onprem_nodes)
